//! The pure half of master health: what an `INFO` says, whether a master lost data or is
//! unsafe, whether the deployment is brand new, and what to do about a master's markers.
//! No I/O and no clock: table-tested here, used by the monitor ([`super`]).

use crate::protocol::Reply;
use std::time::Duration;

/// What one `INFO` said that matters for safety.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observation {
    pub run_id: String,
    pub uptime_secs: u64,
    pub role: String,
    pub maxmemory_policy: String,
    pub loading: bool,
    pub evicted_keys: u64,
    /// Calls of commands that drop data wholesale (`flushall`, `flushdb`, `swapdb`, `debug`).
    pub data_wipes: u64,
    /// The dataset was loaded from disk at startup (AOF on, or keys loaded from an RDB).
    pub loaded_from_disk: bool,
}

/// Reads an `INFO` reply (`field:value` lines).
pub fn parse_info(text: &str) -> Observation {
    let mut obs = Observation::default();
    for line in text.lines() {
        let Some((field, value)) = line.trim_end().split_once(':') else {
            continue;
        };
        let number = || value.parse::<u64>().unwrap_or(0);
        match field {
            "run_id" => obs.run_id = value.to_string(),
            "uptime_in_seconds" => obs.uptime_secs = number(),
            "role" => obs.role = value.to_string(),
            "maxmemory_policy" => obs.maxmemory_policy = value.to_string(),
            "loading" => obs.loading = value == "1",
            "evicted_keys" => obs.evicted_keys = number(),
            "aof_enabled" | "rdb_last_load_keys_loaded" => obs.loaded_from_disk |= number() > 0,
            "cmdstat_flushall" | "cmdstat_flushdb" | "cmdstat_swapdb" | "cmdstat_debug" => {
                let calls = value
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("calls="))
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
                obs.data_wipes = obs.data_wipes.saturating_add(calls);
            }
            _ => {}
        }
    }
    obs
}

/// The judgement on one observation, given the previous one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Judgement {
    /// The master may have forgotten keys since `prev`: quarantine it.
    pub lost: Option<String>,
    /// The master must not vote while this holds.
    pub unsafe_config: Option<String>,
}

/// Compares two observations of one master.
pub fn judge(prev: Option<&Observation>, now: &Observation) -> Judgement {
    let lost = prev.and_then(|p| {
        if p.run_id != now.run_id {
            Some(format!(
                "restarted (run_id {} -> {})",
                short(&p.run_id),
                short(&now.run_id)
            ))
        } else if now.uptime_secs < p.uptime_secs {
            Some("restarted (uptime went backwards)".to_string())
        } else if now.data_wipes > p.data_wipes {
            Some("data wiped (FLUSHALL/FLUSHDB/SWAPDB/DEBUG)".to_string())
        } else if now.evicted_keys > p.evicted_keys {
            Some(format!(
                "{} keys evicted",
                now.evicted_keys - p.evicted_keys
            ))
        } else {
            None
        }
    });
    let unsafe_config = if now.role != "master" {
        Some(format!("role is {}, not master", now.role))
    } else if now.maxmemory_policy != "noeviction" {
        Some(format!(
            "maxmemory-policy is {}, only noeviction keeps lock keys",
            now.maxmemory_policy
        ))
    } else if now.loading {
        Some("loading its dataset".to_string())
    } else {
        None
    };
    Judgement {
        lost,
        unsafe_config,
    }
}

fn short(run_id: &str) -> &str {
    run_id.get(..8).unwrap_or(run_id)
}

/// What this proxy concluded about the whole set of masters from its first look at each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deployment {
    /// No master was armed when this proxy first saw them all: nothing to protect yet.
    Fresh,
    /// Some master was armed: masters without the marker lost their data.
    Live,
}

/// Decides the deployment from whether each master was armed at first sight (`None`: not
/// seen yet). `None` while undecided: any armed master makes it live at once; fresh needs
/// every master seen unarmed (see the module header for why all of them).
pub fn decide_deployment(first_sight: &[Option<bool>]) -> Option<Deployment> {
    if first_sight.contains(&Some(true)) {
        Some(Deployment::Live)
    } else if first_sight.iter().all(|s| *s == Some(false)) {
        Some(Deployment::Fresh)
    } else {
        None
    }
}

/// What to do about the markers of one master after a poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkerStep {
    /// Armed and nothing lost: ready.
    Ready,
    /// Brand-new deployment: arm it, no quarantine.
    Arm,
    /// It lost data (the reason): quarantine on the master and re-arm, in one script.
    Quarantine(String),
    /// Unarmed and the deployment is undecided: wait for the other masters.
    Wait,
}

/// The step for a master whose marker is `armed`, given whether this proxy saw it armed
/// before, the deployment verdict and a loss the `INFO` judgement found.
pub fn marker_step(
    armed: bool,
    seen_armed_before: bool,
    deployment: Option<Deployment>,
    lost: Option<String>,
) -> MarkerStep {
    match (armed, lost) {
        (_, Some(reason)) => MarkerStep::Quarantine(reason),
        (true, None) => MarkerStep::Ready,
        (false, None) if seen_armed_before => {
            MarkerStep::Quarantine("lock marker gone (data wiped or restarted empty)".into())
        }
        (false, None) => match deployment {
            Some(Deployment::Live) => MarkerStep::Quarantine(
                "lock marker missing while other masters have it (lost its data)".into(),
            ),
            Some(Deployment::Fresh) => MarkerStep::Arm,
            None => MarkerStep::Wait,
        },
    }
}

/// A master first seen armed that loaded its dataset from disk less than `bound` ago may have
/// lost its last writes (AOF fsync policy, RDB snapshot age): how much of `bound` is left.
pub fn first_sight_wait(obs: &Observation, bound: Duration) -> Option<Duration> {
    let up = Duration::from_secs(obs.uptime_secs);
    (obs.loaded_from_disk && up < bound).then(|| bound - up)
}

/// `TIME`'s reply (`[seconds, microseconds]`) in ms since the epoch.
pub fn parse_time(items: &[Reply]) -> Option<u64> {
    let number = |r: &Reply| match r {
        Reply::Bulk(b) => std::str::from_utf8(b).ok()?.parse::<u64>().ok(),
        _ => None,
    };
    match items {
        [secs, micros] => number(secs)?
            .checked_mul(1000)?
            .checked_add(number(micros)? / 1000),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(run_id: &str, uptime: u64) -> Observation {
        Observation {
            run_id: run_id.into(),
            uptime_secs: uptime,
            role: "master".into(),
            maxmemory_policy: "noeviction".into(),
            ..Default::default()
        }
    }

    /// Fuzzing regressions: a master's absurd numbers give no reading instead of an overflow.
    #[test]
    fn absurd_numbers_do_not_overflow() {
        let bulk = |s: &str| Reply::bulk(s.to_string());
        assert_eq!(
            parse_time(&[bulk("1700000000"), bulk("250999")]),
            Some(1_700_000_000_250)
        );
        assert_eq!(parse_time(&[bulk(&u64::MAX.to_string()), bulk("0")]), None);
        let max = u64::MAX;
        let text =
            format!("cmdstat_flushall:calls={max},usec=1\r\ncmdstat_flushdb:calls={max}\r\n");
        assert_eq!(parse_info(&text).data_wipes, u64::MAX);
    }

    #[test]
    fn parses_the_fields_that_matter() {
        let text = "# Server\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n# Persistence\r\nloading:0\r\n# Stats\r\nevicted_keys:3\r\n# Replication\r\nrole:master\r\n# Memory\r\nmaxmemory_policy:noeviction\r\n# Commandstats\r\ncmdstat_flushall:calls=2,usec=4,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\ncmdstat_flushdb:calls=1,usec=1\r\ncmdstat_get:calls=9,usec=1\r\n";
        let o = parse_info(text);
        assert_eq!(o.run_id, "abc123");
        assert_eq!(o.uptime_secs, 42);
        assert_eq!(o.evicted_keys, 3);
        assert_eq!(o.role, "master");
        assert_eq!(o.maxmemory_policy, "noeviction");
        assert!(!o.loading);
        assert_eq!(o.data_wipes, 3);
    }

    #[test]
    fn judgements() {
        let base = obs("aaaaaaaaaa", 100);
        let lost = |j: Judgement| j.lost.is_some();
        assert_eq!(judge(None, &base), Judgement::default());
        assert_eq!(
            judge(Some(&base), &obs("aaaaaaaaaa", 101)),
            Judgement::default()
        );
        assert!(lost(judge(Some(&base), &obs("bbbbbbbbbb", 1))));
        assert!(lost(judge(Some(&base), &obs("aaaaaaaaaa", 5))));
        let wiped = Observation {
            data_wipes: 1,
            ..base.clone()
        };
        assert!(lost(judge(Some(&base), &wiped)));
        let evicted = Observation {
            evicted_keys: 2,
            ..base.clone()
        };
        assert_eq!(
            judge(Some(&base), &evicted).lost.as_deref(),
            Some("2 keys evicted")
        );
        let replica = Observation {
            role: "slave".into(),
            ..base.clone()
        };
        assert!(judge(Some(&base), &replica).unsafe_config.is_some());
        let lru = Observation {
            maxmemory_policy: "allkeys-lru".into(),
            ..base.clone()
        };
        assert!(judge(None, &lru)
            .unsafe_config
            .unwrap()
            .contains("allkeys-lru"));
        let loading = Observation {
            loading: true,
            ..base.clone()
        };
        assert!(judge(None, &loading).unsafe_config.is_some());
    }

    #[test]
    fn deployment_is_fresh_only_when_every_master_was_seen_unarmed() {
        use Deployment::*;
        let cases: &[(&[Option<bool>], Option<Deployment>)] = &[
            (&[Some(false), Some(false), Some(false)], Some(Fresh)),
            (&[Some(false), None, Some(false)], None),
            (&[Some(false), None, Some(true)], Some(Live)),
            (&[Some(true), Some(true), Some(true)], Some(Live)),
            (&[None, None, None], None),
        ];
        for (seen, expected) in cases {
            assert_eq!(decide_deployment(seen), *expected, "{seen:?}");
        }
    }

    #[test]
    fn marker_steps() {
        use Deployment::*;
        let q = |s: MarkerStep| matches!(s, MarkerStep::Quarantine(_));
        assert_eq!(marker_step(true, false, None, None), MarkerStep::Ready);
        assert_eq!(marker_step(true, true, Some(Live), None), MarkerStep::Ready);
        // unarmed: wiped if this proxy saw it armed, or if the deployment is live
        assert!(q(marker_step(false, true, Some(Fresh), None)));
        assert!(q(marker_step(false, false, Some(Live), None)));
        assert!(q(marker_step(false, true, None, None)));
        // a brand-new deployment is armed without quarantine; undecided waits
        assert_eq!(
            marker_step(false, false, Some(Fresh), None),
            MarkerStep::Arm
        );
        assert_eq!(marker_step(false, false, None, None), MarkerStep::Wait);
        // a loss seen by INFO quarantines even an armed master (restart with persistence)
        assert!(q(marker_step(
            true,
            true,
            Some(Live),
            Some("restarted".into())
        )));
    }

    #[test]
    fn recently_loaded_from_disk_waits_out_the_rest_of_the_bound() {
        let bound = Duration::from_secs(60);
        let mut o = obs("a", 10);
        assert_eq!(first_sight_wait(&o, bound), None);
        o.loaded_from_disk = true;
        assert_eq!(first_sight_wait(&o, bound), Some(Duration::from_secs(50)));
        o.uptime_secs = 61;
        assert_eq!(first_sight_wait(&o, bound), None);
        let text = "aof_enabled:0\r\nrdb_last_load_keys_loaded:3\r\n";
        assert!(parse_info(text).loaded_from_disk);
        assert!(!parse_info("aof_enabled:0\r\nrdb_last_load_keys_loaded:0\r\n").loaded_from_disk);
    }
}

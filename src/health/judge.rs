//! The pure half of master health: what an `INFO` says, whether a master lost data or is
//! unsafe, whether the deployment is brand new, and what to do about a master's markers.
//! No I/O and no clock: table-tested here, used by the monitor ([`super`]).

use super::loss::{self, Loss};
use crate::on_master::CLAIM_PREFIX;
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
    /// Calls of `FLUSHALL`, which may drop database 0's data wholesale while its marker
    /// survives. `FLUSHDB` and `SWAPDB` are not counted: they can only lose database 0's locks
    /// together with its marker, which every acquire checks.
    pub data_wipes: u64,
    /// Calls of `DEBUG`, whose `RELOAD` may replace the data in place, marker included (when
    /// the write witness shows it lost acknowledged writes, that is the cause named:
    /// [`loss::between_looks`]).
    pub debug_calls: u64,
    /// The dataset was loaded from disk at startup (AOF on, or keys loaded from an RDB).
    pub loaded_from_disk: bool,
    /// AOF on (`aof_enabled:1`), its last write succeeded, and `appendfsync always` (from
    /// `CONFIG GET`): every write was on disk before its reply ([`Observation::durable`]).
    pub aof_enabled: bool,
    pub aof_write_ok: bool,
    pub fsync_always: bool,
    /// Its replication history (`master_replid`), and the history it continued when promoted
    /// (`master_replid2`, all zeros if never: [`Observation::promoted`]).
    pub master_replid: String,
    pub master_replid2: String,
    /// How far its replication stream goes (`master_repl_offset`), and, when promoted, the
    /// first offset that is not its old primary's (`second_repl_offset`; `None`: -1).
    pub master_repl_offset: u64,
    pub second_repl_offset: Option<u64>,
    /// Replicas connected to it and in sync (`slave<n>:…,state=online,…`).
    pub online_replicas: u32,
    /// `enable-debug-command` (from `CONFIG GET`; empty if it could not be read): anything but
    /// `no` lets a client replace the dataset in place (`DEBUG RELOAD`), keeping its `run_id`.
    pub debug_command: String,
    /// Its write witness against what this proxy saw it acknowledge (read beside `INFO` on a
    /// single master; `None` on a cluster node).
    pub witness: Option<WitnessCheck>,
}

/// A master's write witness (`redlock-proxy:witness`) against the writes it acknowledged to
/// this proxy (docs/SAFETY.md, "Acknowledged writes"): what it holds, the highest value its
/// replies carried before the witness was read, and whether a lock write no witness value
/// covers (an extend, a lease script) was acknowledged since.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WitnessCheck {
    pub holds: u64,
    pub acknowledged: u64,
    pub uncovered: bool,
}

impl WitnessCheck {
    /// Every lock write it acknowledged is in its data: the witness it holds is at least the
    /// highest it answered (a call's writes and its count are one script: both or neither),
    /// and no acknowledged write lies beyond what that value covers.
    pub fn kept_every_acknowledged_write(&self) -> bool {
        self.holds >= self.acknowledged && !self.uncovered
    }
}

impl Observation {
    /// Whether a restart of the master in this configuration loses no acknowledged write:
    /// with `appendonly yes` and `appendfsync always`, Redis writes and fsyncs the AOF before
    /// it replies (redis.io, "Redis persistence"; the Redlock page's advice on fsync).
    pub fn durable(&self) -> bool {
        self.aof_enabled && self.aof_write_ok && self.fsync_always
    }

    /// It was promoted from replica to master at some time since it started
    /// (`master_replid2` is not all zeros: the replication id it had as a replica).
    pub fn promoted(&self) -> bool {
        self.master_replid2.bytes().any(|b| b != b'0')
    }
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
            "aof_enabled" => {
                obs.aof_enabled = number() > 0;
                obs.loaded_from_disk |= obs.aof_enabled;
            }
            "rdb_last_load_keys_loaded" => obs.loaded_from_disk |= number() > 0,
            "aof_last_write_status" => obs.aof_write_ok = value == "ok",
            "master_replid" => obs.master_replid = value.to_string(),
            "master_replid2" => obs.master_replid2 = value.to_string(),
            "master_repl_offset" => obs.master_repl_offset = number(),
            "second_repl_offset" => obs.second_repl_offset = value.parse::<u64>().ok(),
            _ if field.starts_with("slave") && value.contains("state=online") => {
                obs.online_replicas = obs.online_replicas.saturating_add(1);
            }
            "cmdstat_flushall" | "cmdstat_debug" => {
                let calls = value
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("calls="))
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
                match field {
                    "cmdstat_flushall" => obs.data_wipes = calls,
                    _ => obs.debug_calls = calls,
                }
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
    pub lost: Option<Loss>,
    /// The master must not vote while this holds.
    pub unsafe_config: Option<String>,
}

/// Judges an observation of one master against the previous one (the loss rules between two
/// looks: [`loss::between_looks`]) and on its own (an unsafe configuration). `last_primary`:
/// its last observation while a primary; `wait_replicas`: how many replicas confirm every vote
/// (`WAIT`, 0: off); `allow_debug_command`: the operator accepts masters whose data `DEBUG`
/// can replace in place.
pub fn judge(
    prev: Option<&Observation>,
    now: &Observation,
    last_primary: Option<&Observation>,
    wait_replicas: u32,
    allow_debug_command: bool,
) -> Judgement {
    let lost = prev.and_then(|p| loss::between_looks(p, now, last_primary, wait_replicas));
    let unsafe_config = if now.role != "master" {
        Some(format!("role is {}, not master", now.role))
    } else if now.maxmemory_policy != "noeviction" {
        Some(format!(
            "maxmemory-policy is {}, only noeviction keeps lock keys",
            now.maxmemory_policy
        ))
    } else if now.loading {
        Some("loading its dataset".to_string())
    } else if !allow_debug_command && !matches!(now.debug_command.as_str(), "no" | "") {
        Some(format!(
            "enable-debug-command is {}: DEBUG RELOAD can replace its data in place, losing locks no proxy can tell it lost (allow_debug_command = true accepts that)",
            now.debug_command
        ))
    } else if now.online_replicas < wait_replicas {
        Some(format!(
            "{} of the {wait_replicas} replicas wait_replicas needs are online: its writes cannot be confirmed",
            now.online_replicas
        ))
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

/// What this proxy concluded about the whole set of masters (see the module header of
/// [`super`] for the founding of a new deployment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deployment {
    /// This proxy founded the deployment: a quorum of masters carried its founding claim while
    /// none was armed outside a claim. It lifts its own claims; every other master joins
    /// through a quarantine.
    Fresh,
    /// Some master was armed outside a founding claim: the deployment was already running.
    Live,
}

/// A master's markers, as one look at them saw them (the status and claim scripts answer
/// `[get(armed), pttl(quarantine), get(quarantine)]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Markers {
    /// No `armed` marker: brand new, or it lost its data.
    Unarmed,
    /// Armed, with a founding claim (its tag) in the quarantine key: a proxy that is deciding
    /// whether the deployment is new claimed it while it was unarmed. It votes for nobody
    /// until the claim is lifted by its founder or expires.
    Claimed { tag: String, left_ms: i64 },
    /// Armed outside a claim; `quarantine_left_ms` > 0 while a loss quarantine lasts.
    /// `stamp`: the `run_id` of the process that armed it (`None`: `1`, from a proxy of an
    /// earlier version).
    Armed {
        quarantine_left_ms: i64,
        stamp: Option<String>,
    },
}

impl Markers {
    /// A cluster master's markers, every slot's taken together for the founding
    /// ([`founding_round`]): armed if any slot is armed outside a claim (the deployment is
    /// live), claimed by a tag if every slot carries that tag's claim, else unarmed if a slot is
    /// unarmed, else claimed by no single proxy. `None` if a slot gave no usable answer.
    pub fn combine(slots: impl IntoIterator<Item = Option<Markers>>) -> Option<Markers> {
        let (mut unarmed, mut tags, mut left) = (false, None::<String>, i64::MAX);
        let mut mixed = false;
        for slot in slots {
            match slot? {
                armed @ Markers::Armed { .. } => return Some(armed),
                Markers::Unarmed => unarmed = true,
                Markers::Claimed { tag, left_ms } => {
                    left = left.min(left_ms);
                    match &tags {
                        Some(seen) if *seen != tag => mixed = true,
                        Some(_) => {}
                        None => tags = Some(tag),
                    }
                }
            }
        }
        Some(match (unarmed, tags, mixed) {
            (true, _, _) => Markers::Unarmed,
            (false, Some(tag), false) => Markers::Claimed { tag, left_ms: left },
            (false, Some(_), true) => Markers::Claimed {
                tag: format!("{CLAIM_PREFIX}(several proxies)"),
                left_ms: left,
            },
            (false, None, _) => Markers::Unarmed,
        })
    }
}

/// The write witness a status reply carries as its fourth element (0 if none).
pub fn witness_of(status: &Reply) -> u64 {
    match status {
        Reply::Array(items) => match items.get(3) {
            Some(Reply::Bulk(value)) => std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            _ => 0,
        },
        _ => 0,
    }
}

/// What `armed` holds where a proxy of an earlier version armed the master (no stamp).
const UNSTAMPED: &[u8] = b"1";

impl Markers {
    pub fn parse(reply: &Reply) -> Option<Markers> {
        let Reply::Array(items) = reply else {
            return None;
        };
        match items.as_slice() {
            [Reply::Null, ..] => Some(Markers::Unarmed),
            [Reply::Bulk(_), Reply::Integer(left), Reply::Bulk(value), ..]
                if value.starts_with(CLAIM_PREFIX.as_bytes()) =>
            {
                Some(Markers::Claimed {
                    tag: String::from_utf8_lossy(value).into_owned(),
                    left_ms: *left,
                })
            }
            [Reply::Bulk(stamp), Reply::Integer(left), ..] => Some(Markers::Armed {
                quarantine_left_ms: *left,
                stamp: (stamp.as_ref() != UNSTAMPED)
                    .then(|| String::from_utf8_lossy(stamp).into_owned()),
            }),
            _ => None,
        }
    }
}

/// Where a founding attempt stands after one look at every master (`None`: no answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Founding {
    /// A master is armed outside a claim: the deployment is live.
    Live,
    /// A quorum of masters carries this proxy's claim, and none is armed outside a claim;
    /// `silent` masters did not answer.
    Quorum { silent: usize },
    /// Not yet: how many masters carry this proxy's claim, another proxy's, or did not answer.
    Short {
        mine: usize,
        others: usize,
        silent: usize,
    },
}

/// Judges one round of looks at every master for the founding proxy tagged `tag`.
pub fn founding_round(looks: &[Option<Markers>], tag: &str, quorum: usize) -> Founding {
    let (mut mine, mut others, mut silent) = (0, 0, 0);
    for look in looks {
        match look {
            Some(Markers::Armed { .. }) => return Founding::Live,
            Some(Markers::Claimed { tag: t, .. }) if t == tag => mine += 1,
            Some(Markers::Claimed { .. }) => others += 1,
            Some(Markers::Unarmed) => {}
            None => silent += 1,
        }
    }
    if mine >= quorum {
        Founding::Quorum { silent }
    } else {
        Founding::Short {
            mine,
            others,
            silent,
        }
    }
}

/// What to do about the markers of one master after a poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkerStep {
    /// Armed and nothing lost: ready.
    Ready,
    /// It carries this proxy's claim and this proxy founded the deployment: lift the claim
    /// (only if it is still ours), then it is ready.
    Lift,
    /// It lost data: quarantine on the master and re-arm, in one script.
    Quarantine(Loss),
    /// Not ready, no quarantine of its own: the deployment is undecided (the reason, for
    /// `INFO`).
    Wait(&'static str),
    /// A founding claim this proxy may not lift is on it: it votes for nobody (fenced, as a
    /// quarantined master is) until its founder lifts it or it expires.
    Claimed,
}

/// The step for a master whose markers are `markers`, given whether this proxy saw it armed
/// before, the deployment verdict, this proxy's founding tag and a loss the `INFO` judgement
/// found.
pub fn marker_step(
    markers: &Markers,
    seen_armed_before: bool,
    verdict: Option<Deployment>,
    tag: &str,
    lost: Option<Loss>,
) -> MarkerStep {
    if let Some(loss) = lost {
        return MarkerStep::Quarantine(loss);
    }
    match (markers, verdict) {
        (Markers::Armed { .. }, _) => MarkerStep::Ready,
        (Markers::Unarmed, _) if seen_armed_before => MarkerStep::Quarantine(Loss::marker_gone()),
        // Once the deployment is decided, an unarmed master joins through a quarantine:
        // whichever way it was decided, a lease may live on the others now.
        (Markers::Unarmed, Some(_)) => MarkerStep::Quarantine(Loss::unarmed_in_live_deployment()),
        (Markers::Unarmed, None) => MarkerStep::Wait("deciding whether the deployment is new"),
        (Markers::Claimed { tag: t, .. }, Some(Deployment::Fresh)) if t == tag => MarkerStep::Lift,
        // This proxy's own claim, once the deployment turned out live: nobody will lift it.
        (Markers::Claimed { tag: t, .. }, Some(Deployment::Live)) if t == tag => {
            MarkerStep::Quarantine(Loss::claimed_while_live())
        }
        (Markers::Claimed { .. }, _) => MarkerStep::Claimed,
    }
}

/// What an armed master's stamp says about the data it serves (docs/SAFETY.md, "Failovers").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StampCheck {
    /// Armed by the process that serves it.
    Own,
    /// To be re-stamped with the serving process's `run_id`, no quarantine: the marker has no
    /// stamp (an earlier version armed it), or its data was judged this process's own.
    Restamp,
    /// Armed by another process: the data came by replication or from disk.
    Foreign(Loss),
}

/// Judges an armed master's `stamp` against what it is now (`now`): whether this proxy's
/// previous look (`watched`) showed the stamped process and judged the change harmless
/// (`lost_since`: the loss it found, if any), and, failing that, whether the server ran longer
/// than `bound` without ever being promoted (any lease a restart before that lost has expired).
pub fn check_stamp(
    stamp: Option<&str>,
    now: &Observation,
    watched: Option<&str>,
    lost_since: bool,
    bound: Duration,
) -> StampCheck {
    let Some(stamp) = stamp else {
        return StampCheck::Restamp;
    };
    if stamp == now.run_id {
        return StampCheck::Own;
    }
    let watched_intact = watched == Some(stamp) && !lost_since;
    let aged_own = Duration::from_secs(now.uptime_secs) >= bound && !now.promoted();
    if watched_intact || aged_own {
        return StampCheck::Restamp;
    }
    StampCheck::Foreign(Loss::new(
        loss::Cause::Failover,
        format!(
            "armed by another redis-server process (run_id {}, now {}): a promoted replica or a restart no proxy watched",
            short(stamp),
            short(&now.run_id)
        ),
    ))
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

/// A primary in a safe configuration, as the tests of the rules start from.
#[cfg(test)]
pub(crate) fn test_primary(run_id: &str, uptime: u64) -> Observation {
    Observation {
        run_id: run_id.into(),
        uptime_secs: uptime,
        role: "master".into(),
        maxmemory_policy: "noeviction".into(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::test_primary as obs;
    use super::*;
    use crate::health::loss::{first_sight_wait, kept_every_confirmed_write};

    /// A cluster's slots taken together for the founding: armed wins, then a claim only if
    /// every slot carries the same one, then unarmed; a slot without an answer is none.
    #[test]
    fn a_clusters_slots_combine_into_one_masters_markers() {
        let armed = || Markers::Armed {
            quarantine_left_ms: 0,
            stamp: Some("n1".into()),
        };
        let claimed = |tag: &str, left_ms| Markers::Claimed {
            tag: tag.into(),
            left_ms,
        };
        let mixed = format!("{CLAIM_PREFIX}(several proxies)");
        let cases: Vec<(Vec<Option<Markers>>, Option<Markers>)> = vec![
            (vec![Some(Markers::Unarmed), Some(armed())], Some(armed())),
            (
                vec![
                    Some(claimed("founding:a", 9)),
                    Some(claimed("founding:a", 5)),
                ],
                Some(claimed("founding:a", 5)),
            ),
            (
                vec![Some(claimed("founding:a", 9)), Some(Markers::Unarmed)],
                Some(Markers::Unarmed),
            ),
            (
                vec![
                    Some(claimed("founding:a", 9)),
                    Some(claimed("founding:b", 7)),
                ],
                Some(claimed(&mixed, 7)),
            ),
            (
                vec![Some(Markers::Unarmed), Some(Markers::Unarmed)],
                Some(Markers::Unarmed),
            ),
            (vec![Some(claimed("founding:a", 9)), None], None),
            (vec![None, Some(armed())], None),
        ];
        for (slots, combined) in cases {
            assert_eq!(Markers::combine(slots.clone()), combined, "{slots:?}");
        }
        // The founding counts a mixed claim as another proxy's, never as this one's.
        let mixed_look = [Markers::combine([
            Some(claimed("founding:a", 1)),
            Some(claimed("founding:b", 1)),
        ])];
        assert_eq!(
            founding_round(&mixed_look, "founding:a", 1),
            Founding::Short {
                mine: 0,
                others: 1,
                silent: 0
            }
        );
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
        let text = "# Server\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n# Persistence\r\nloading:0\r\n# Stats\r\nevicted_keys:3\r\n# Replication\r\nrole:master\r\n# Memory\r\nmaxmemory_policy:noeviction\r\n# Commandstats\r\ncmdstat_flushall:calls=2,usec=4,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\ncmdstat_flushdb:calls=1,usec=1\r\ncmdstat_get:calls=9,usec=1\r\ncmdstat_debug:calls=4,usec=1\r\n";
        let o = parse_info(text);
        assert_eq!(o.run_id, "abc123");
        assert_eq!(o.uptime_secs, 42);
        assert_eq!(o.evicted_keys, 3);
        assert_eq!(o.role, "master");
        assert_eq!(o.maxmemory_policy, "noeviction");
        assert!(!o.loading);
        // FLUSHDB is not counted: it can only lose database 0's locks with its marker.
        assert_eq!(o.data_wipes, 2);
        assert_eq!(o.debug_calls, 4);
    }

    #[test]
    fn a_restart_with_every_write_fsynced_loses_nothing() {
        let durable = |run_id: &str, uptime| Observation {
            aof_enabled: true,
            aof_write_ok: true,
            fsync_always: true,
            loaded_from_disk: true,
            ..obs(run_id, uptime)
        };
        let before = durable("aaaaaaaaaa", 100);
        assert_eq!(
            judge(Some(&before), &durable("bbbbbbbbbb", 1), None, 0, false).lost,
            None
        );
        // Anything less than fsync-always AOF, before or after, may have lost the last writes.
        let weaker = [
            Observation {
                fsync_always: false,
                ..durable("bbbbbbbbbb", 1)
            },
            Observation {
                aof_write_ok: false,
                ..durable("bbbbbbbbbb", 1)
            },
            Observation {
                aof_enabled: false,
                ..durable("bbbbbbbbbb", 1)
            },
        ];
        for after in &weaker {
            assert!(
                judge(Some(&before), after, None, 0, false).lost.is_some(),
                "{after:?}"
            );
            assert!(
                judge(Some(after), &durable("cccccccccc", 1), None, 0, false)
                    .lost
                    .is_some(),
                "{after:?}"
            );
        }
        let text = "aof_enabled:1\r\naof_last_write_status:ok\r\n";
        let parsed = parse_info(text);
        assert!(parsed.aof_enabled && parsed.aof_write_ok && parsed.loaded_from_disk);
        assert!(!parsed.durable(), "appendfsync comes from CONFIG GET");
    }

    #[test]
    fn judgements() {
        let base = obs("aaaaaaaaaa", 100);
        let lost = |j: Judgement| j.lost.is_some();
        assert_eq!(judge(None, &base, None, 0, false), Judgement::default());
        assert_eq!(
            judge(Some(&base), &obs("aaaaaaaaaa", 101), None, 0, false),
            Judgement::default()
        );
        assert!(lost(judge(
            Some(&base),
            &obs("bbbbbbbbbb", 1),
            None,
            0,
            false
        )));
        assert!(lost(judge(
            Some(&base),
            &obs("aaaaaaaaaa", 5),
            None,
            0,
            false
        )));
        let wiped = Observation {
            data_wipes: 1,
            ..base.clone()
        };
        assert!(lost(judge(Some(&base), &wiped, None, 0, false)));
        let evicted = Observation {
            evicted_keys: 2,
            ..base.clone()
        };
        assert_eq!(
            judge(Some(&base), &evicted, None, 0, false)
                .lost
                .map(|l| l.detail),
            Some("2 keys evicted".to_string())
        );
        let replica = Observation {
            role: "slave".into(),
            ..base.clone()
        };
        assert!(judge(Some(&base), &replica, None, 0, false)
            .unsafe_config
            .is_some());
        assert_eq!(
            judge(Some(&replica), &base, None, 0, false)
                .lost
                .map(|l| l.detail),
            Some("promoted from slave to master".to_string())
        );
        let lru = Observation {
            maxmemory_policy: "allkeys-lru".into(),
            ..base.clone()
        };
        assert!(judge(None, &lru, None, 0, false)
            .unsafe_config
            .unwrap()
            .contains("allkeys-lru"));
        let loading = Observation {
            loading: true,
            ..base.clone()
        };
        assert!(judge(None, &loading, None, 0, false)
            .unsafe_config
            .is_some());
    }

    /// docs/SAFETY.md, "Confirmed writes": with every vote confirmed by `wait_replicas`
    /// replicas, a failover to a replica that had its primary's whole history up to the last
    /// look is no loss; anything less is.
    #[test]
    fn a_failover_keeps_the_confirmed_writes_only_to_a_replica_that_had_them() {
        let primary = Observation {
            master_replid: "1111".into(),
            master_replid2: "0000".into(),
            master_repl_offset: 5000,
            online_replicas: 1,
            ..obs("aaaaaaaaaa", 100)
        };
        let promoted = Observation {
            master_replid: "2222".into(),
            master_replid2: "1111".into(),
            second_repl_offset: Some(5001),
            online_replicas: 1,
            ..obs("bbbbbbbbbb", 90)
        };
        assert!(kept_every_confirmed_write(&primary, &promoted, 1));
        assert_eq!(
            judge(Some(&primary), &promoted, Some(&primary), 1, false).lost,
            None
        );
        // A planned failover: the proxy's last look found the old primary already demoted;
        // its last look at it as a primary decides.
        let demoted = Observation {
            role: "slave".into(),
            ..primary.clone()
        };
        assert_eq!(
            judge(Some(&demoted), &promoted, Some(&primary), 1, false).lost,
            None
        );
        assert!(judge(Some(&demoted), &promoted, None, 1, false)
            .lost
            .is_some());
        let cases: [(&str, Observation, Observation, u32); 6] = [
            ("wait_replicas off", primary.clone(), promoted.clone(), 0),
            (
                "it missed the end of the history the last look saw",
                primary.clone(),
                Observation {
                    second_repl_offset: Some(5000),
                    ..promoted.clone()
                },
                1,
            ),
            (
                "another history",
                primary.clone(),
                Observation {
                    master_replid2: "3333".into(),
                    ..promoted.clone()
                },
                1,
            ),
            (
                "more replicas online than confirm each vote",
                Observation {
                    online_replicas: 2,
                    ..primary.clone()
                },
                promoted.clone(),
                1,
            ),
            (
                "the last look was not at a primary",
                Observation {
                    role: "slave".into(),
                    ..primary.clone()
                },
                promoted.clone(),
                1,
            ),
            (
                "never promoted (a restart)",
                primary.clone(),
                Observation {
                    second_repl_offset: None,
                    master_replid2: "0000".into(),
                    ..promoted.clone()
                },
                1,
            ),
        ];
        for (case, before, after, wait_replicas) in cases {
            assert!(
                !kept_every_confirmed_write(&before, &after, wait_replicas),
                "{case}"
            );
            assert!(
                judge(Some(&before), &after, Some(&before), wait_replicas, false)
                    .lost
                    .is_some(),
                "{case}"
            );
        }
        // Fewer replicas online than must confirm: its votes cannot count.
        let alone = Observation {
            online_replicas: 0,
            ..primary.clone()
        };
        assert!(judge(None, &alone, None, 1, false)
            .unsafe_config
            .unwrap()
            .contains("0 of the 1"));
        assert_eq!(judge(None, &alone, None, 0, false).unsafe_config, None);
    }

    #[test]
    fn parses_the_replication_fields() {
        let text = "role:master\r\nconnected_slaves:2\r\nslave0:ip=127.0.0.1,port=7001,state=online,offset=90,lag=0\r\nslave1:ip=127.0.0.1,port=7002,state=wait_bgsave,offset=0,lag=0\r\nmaster_failover_state:no-failover\r\nmaster_replid:abcd\r\nmaster_replid2:ef01\r\nmaster_repl_offset:90\r\nsecond_repl_offset:41\r\n";
        let o = parse_info(text);
        assert_eq!(o.online_replicas, 1);
        assert_eq!(
            (o.master_replid.as_str(), o.master_replid2.as_str()),
            ("abcd", "ef01")
        );
        assert_eq!((o.master_repl_offset, o.second_repl_offset), (90, Some(41)));
        assert!(o.promoted());
        assert_eq!(
            parse_info("second_repl_offset:-1\r\n").second_repl_offset,
            None
        );
    }

    fn markers(armed: Option<&str>, pttl: i64, value: Option<&str>) -> Reply {
        let bulk = |v: Option<&str>| v.map_or(Reply::Null, |v| Reply::bulk(v.to_string()));
        Reply::Array(vec![bulk(armed), Reply::Integer(pttl), bulk(value)])
    }

    fn armed(quarantine_left_ms: i64, stamp: Option<&str>) -> Markers {
        Markers::Armed {
            quarantine_left_ms,
            stamp: stamp.map(str::to_string),
        }
    }

    #[test]
    fn markers_parse_from_the_status_reply() {
        let claim = "founding:ab";
        let run_id = "7c2d94e1a0b5";
        let cases = [
            (markers(None, -2, None), Some(Markers::Unarmed)),
            // Armed by an earlier version: no stamp.
            (markers(Some("1"), -2, None), Some(armed(-2, None))),
            (
                markers(Some(run_id), -2, None),
                Some(armed(-2, Some(run_id))),
            ),
            (
                markers(Some(run_id), 500, Some("1")),
                Some(armed(500, Some(run_id))),
            ),
            (
                markers(Some(run_id), 700, Some(claim)),
                Some(Markers::Claimed {
                    tag: claim.into(),
                    left_ms: 700,
                }),
            ),
            (Reply::Integer(1), None),
        ];
        for (reply, expected) in cases {
            assert_eq!(Markers::parse(&reply), expected, "{reply:?}");
        }
    }

    #[test]
    fn a_stamp_of_another_process_is_a_loss_unless_its_data_is_known_to_be_its_own() {
        let bound = Duration::from_secs(60);
        let server = |run_id: &str, uptime_secs, promoted: bool| Observation {
            master_replid2: if promoted { "2a0f" } else { "0000" }.into(),
            ..obs(run_id, uptime_secs)
        };
        let foreign = |c: StampCheck| matches!(c, StampCheck::Foreign(_));
        // (stamp, the server now, this proxy's previous look at it, a loss seen since): check.
        let cases = [
            // Armed by the serving process.
            (
                Some("aaa"),
                server("aaa", 5, false),
                None,
                false,
                StampCheck::Own,
            ),
            (
                Some("aaa"),
                server("aaa", 5, true),
                None,
                false,
                StampCheck::Own,
            ),
            // Armed by an earlier version: stamped now, judged as before.
            (
                None,
                server("bbb", 5, true),
                None,
                false,
                StampCheck::Restamp,
            ),
            // A restart this proxy watched and judged harmless (appendfsync always).
            (
                Some("aaa"),
                server("bbb", 5, false),
                Some("aaa"),
                false,
                StampCheck::Restamp,
            ),
            // Running longer than B and never promoted: whatever its restart lost has expired.
            (
                Some("aaa"),
                server("bbb", 60, false),
                None,
                false,
                StampCheck::Restamp,
            ),
        ];
        for (stamp, now, watched, lost, expected) in cases {
            let check = check_stamp(stamp, &now, watched, lost, bound);
            assert_eq!(check, expected, "{stamp:?} {now:?} {watched:?}");
        }
        // A restart this proxy watched and judged a loss: not vouched for.
        let check = check_stamp(
            Some("aaa"),
            &server("bbb", 5, false),
            Some("aaa"),
            true,
            bound,
        );
        assert!(foreign(check));
        // A promoted replica (however long it has run), or a restart less than B ago that no
        // proxy watched: its data came from another process.
        for now in [
            server("bbb", 5, true),
            server("bbb", 600, true),
            server("bbb", 59, false),
        ] {
            let check = check_stamp(Some("aaa"), &now, None, false, bound);
            assert!(foreign(check.clone()), "{now:?}: {check:?}");
        }
        // The previous look showed another process than the stamped one: not vouched for.
        let check = check_stamp(
            Some("aaa"),
            &server("bbb", 5, true),
            Some("ccc"),
            false,
            bound,
        );
        assert!(foreign(check));
        assert!(parse_info("master_replid2:2a0f\r\n").promoted());
        assert!(!parse_info("master_replid2:0000000000\r\n").promoted());
    }

    #[test]
    fn founding_needs_a_quorum_of_own_claims_and_no_armed_master() {
        let mine = || {
            Some(Markers::Claimed {
                tag: "founding:a".into(),
                left_ms: 1,
            })
        };
        let other = || {
            Some(Markers::Claimed {
                tag: "founding:b".into(),
                left_ms: 1,
            })
        };
        let live = || Some(armed(-2, None));
        let short = |mine, others, silent| Founding::Short {
            mine,
            others,
            silent,
        };
        let cases: Vec<(Vec<Option<Markers>>, Founding)> = vec![
            (vec![mine(), mine(), mine()], Founding::Quorum { silent: 0 }),
            // A master down: a quorum of claims is enough (it joins later, quarantined).
            (vec![mine(), None, mine()], Founding::Quorum { silent: 1 }),
            (
                vec![mine(), mine(), mine(), None, None],
                Founding::Quorum { silent: 2 },
            ),
            // Another proxy's claims do not count for this one.
            (vec![mine(), other(), None], short(1, 1, 1)),
            (vec![mine(), mine(), other(), other()], short(2, 2, 0)),
            (vec![Some(Markers::Unarmed), None, mine()], short(1, 0, 1)),
            // Any master armed outside a claim: the deployment is live, whatever the claims.
            (vec![mine(), mine(), live()], Founding::Live),
            (
                vec![mine(), mine(), Some(armed(900, Some("aaa")))],
                Founding::Live,
            ),
        ];
        for (looks, expected) in cases {
            assert_eq!(
                founding_round(&looks, "founding:a", 2.max(looks.len() / 2 + 1)),
                expected,
                "{looks:?}"
            );
        }
    }

    #[test]
    fn marker_steps() {
        use Deployment::*;
        let tag = "founding:a";
        let armed = armed(-2, Some("aaa"));
        let claimed = |t: &str| Markers::Claimed {
            tag: t.into(),
            left_ms: 100,
        };
        let q = |s: MarkerStep| matches!(s, MarkerStep::Quarantine(_));
        let wait = |s: MarkerStep| matches!(s, MarkerStep::Wait(_) | MarkerStep::Claimed);
        let step = |m: &Markers, seen, verdict| marker_step(m, seen, verdict, tag, None);
        assert_eq!(step(&armed, false, None), MarkerStep::Ready);
        assert_eq!(step(&armed, true, Some(Live)), MarkerStep::Ready);
        // Unarmed: wiped if this proxy saw it armed; once decided (either way), it joins
        // through a quarantine: the founding of the deployment is over.
        assert!(q(step(&Markers::Unarmed, true, Some(Fresh))));
        assert!(q(step(&Markers::Unarmed, true, None)));
        assert!(q(step(&Markers::Unarmed, false, Some(Live))));
        assert!(q(step(&Markers::Unarmed, false, Some(Fresh))));
        assert!(wait(step(&Markers::Unarmed, false, None)));
        // Claims: only the founder lifts its own, and only once it founded.
        assert_eq!(step(&claimed(tag), false, Some(Fresh)), MarkerStep::Lift);
        // Its own claim in a live deployment: nobody will lift it, a quarantine it is.
        assert!(q(step(&claimed(tag), false, Some(Live))));
        assert!(wait(step(&claimed(tag), false, None)));
        assert!(wait(step(&claimed("founding:b"), false, Some(Fresh))));
        // A loss seen by INFO quarantines whatever the markers say (restart with persistence).
        for m in [armed, claimed(tag), Markers::Unarmed] {
            assert!(q(marker_step(
                &m,
                true,
                Some(Fresh),
                tag,
                Some(Loss::new(loss::Cause::Restarted, "restarted"))
            )));
        }
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

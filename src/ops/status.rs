//! The status view: the facts an operator looks at first, as one [`Status`] (each master's
//! state and why, its votes and latency over the last minute, its clock reading; the
//! deployment verdict, the quorum, grants and refusals per second, the clients), served by
//! [`super::http`] as `/status.json` and as the page `/` (`status.html`, which renders that
//! JSON and refreshes it), and printed in a terminal by `redlock-proxy status` ([`Status::fetch`],
//! [`Status::to_text`]).
//!
//! Invariants:
//! - One source per fact: a master's state and counters are [`MasterFacts`], which `INFO
//!   masters` prints too; the state's one-line form ("down: connection refused") is made here
//!   ([`MasterStatus::shown`]) and only printed by the page and the terminal.
//! - Windowed numbers come from [`History`], one sample a second over the last minute (a
//!   zero sample at the proxy's start, so a younger proxy's numbers are "since start", and
//!   [`Status::window`] says which).

use crate::lock::AcquireResult;
use crate::masters::{deployment_label, AcquireVote, MasterFacts};
use crate::shared::Shared;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// How far back the votes and latencies of [`Status`] look.
pub const WINDOW: Duration = Duration::from_secs(60);
/// How far back the grants and refusals per second look.
const RATE_WINDOW: Duration = Duration::from_secs(10);

/// The page: `status.html` with the status at the time of the request in place of
/// [`PAGE_SLOT`], so that it shows the facts at once and refreshes them from `/status.json`.
const PAGE: &str = include_str!("status.html");
const PAGE_SLOT: &str = "/*STATUS*/null";

/// The counters a window is measured on, at one moment.
#[derive(Clone)]
struct Sample {
    at: Instant,
    acquires: [u64; AcquireResult::ALL.len()],
    masters: Vec<MasterSample>,
}

#[derive(Clone, Default)]
struct MasterSample {
    /// Acquire votes by [`AcquireVote`], late ones included.
    votes: [u64; 5],
    /// Replies within the node timeout, and their total time in microseconds.
    replies: u64,
    reply_micros: u64,
}

impl Sample {
    fn take(shared: &Shared) -> Sample {
        let locks = shared.acquire_stats();
        Sample {
            at: Instant::now(),
            acquires: AcquireResult::ALL.map(|r| locks.acquires(r)),
            masters: (shared.masters().voters().iter())
                .map(|v| MasterSample {
                    votes: AcquireVote::ALL.map(|kind| {
                        v.stats.acquire_votes(kind, false) + v.stats.acquire_votes(kind, true)
                    }),
                    replies: v.stats.replies.load(Ordering::Relaxed),
                    reply_micros: v.stats.reply_micros.load(Ordering::Relaxed),
                })
                .collect(),
        }
    }
}

/// The samples of the last [`WINDOW`], one a second ([`History::sample`]).
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    /// A history whose first sample is all zeros at the proxy's start.
    pub fn new(shared: &Shared) -> History {
        let zero = Sample {
            at: shared.started,
            acquires: [0; AcquireResult::ALL.len()],
            masters: vec![MasterSample::default(); shared.masters().voters().len()],
        };
        History {
            samples: Mutex::new(VecDeque::from([zero])),
        }
    }

    /// Records the counters now, and forgets samples older than the window.
    pub fn sample(&self, shared: &Shared) {
        let now = Sample::take(shared);
        let Ok(mut samples) = self.samples.lock() else {
            return;
        };
        // The oldest kept is the last one at least a window old: it starts the window.
        while samples
            .get(1)
            .is_some_and(|next| now.at.duration_since(next.at) >= WINDOW)
        {
            samples.pop_front();
        }
        samples.push_back(now);
    }

    /// The sample that starts a window of `length` ending at `now` (or the oldest).
    fn start_of(&self, now: Instant, length: Duration) -> Option<Sample> {
        let samples = self.samples.lock().ok()?;
        samples
            .iter()
            .rev()
            .find(|s| now.duration_since(s.at) >= length)
            .or_else(|| samples.front())
            .cloned()
    }
}

/// The facts of the status view.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Status {
    pub version: String,
    pub uptime_s: u64,
    /// `undecided`, `founded_by_this_proxy` or `live` ([`deployment_label`]).
    pub deployment: String,
    /// `/readyz`'s verdict: a quorum of masters may vote.
    pub ready: bool,
    /// `<n> of <N> masters usable, quorum <Q>`.
    pub summary: String,
    pub usable: usize,
    pub quorum: usize,
    pub clients: usize,
    pub grants_per_s: f64,
    /// Acquires not granted (contended, no quorum, expired, refused by rule) per second.
    pub refusals_per_s: f64,
    /// Over how many seconds the rates were measured.
    pub rate_window_s: f64,
    /// What the masters' votes and latencies cover: "over the last 60 s" or "since start (12 s)".
    pub window: String,
    pub masters: Vec<MasterStatus>,
}

/// One master in the status view.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MasterStatus {
    pub addr: String,
    /// The state's word: `up`, `down`, `connecting`, `quarantined`, `unsafe`, `auth_failed`
    /// (a cluster: `partial` too).
    pub state: String,
    /// Why, if the state says: "connection refused", "restarted without data".
    pub why: Option<String>,
    /// A quarantine's time left, in seconds, and its cause as the metric labels it.
    pub left_s: Option<u64>,
    #[serde(default)]
    pub cause: Option<String>,
    /// The state in one line: "down: connection refused", "quarantined: …, 41 s left".
    pub shown: String,
    /// Votes in acquires over the window, by kind (late ones included).
    pub votes: Votes,
    /// Replies over the window, and their mean time.
    pub replies: u64,
    pub latency_ms: Option<f64>,
    /// How old the last reading of its clock is, and how far off that reading may be.
    pub clock_age_ms: Option<u64>,
    pub clock_error_ms: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Votes {
    pub ok: u64,
    pub held: u64,
    pub timeout: u64,
    pub not_eligible: u64,
    pub error: u64,
}

impl MasterStatus {
    /// The state's word, why, and time left, from [`Voter::state`]'s `word (why; N ms left)`.
    fn state_parts(state: &str) -> (String, Option<String>, Option<u64>) {
        let Some((word, rest)) = state.split_once(" (") else {
            return (state.to_string(), None, None);
        };
        let why = rest.strip_suffix(')').unwrap_or(rest);
        let left = why.rsplit_once("; ").and_then(|(why, left)| {
            let ms: u64 = left.strip_suffix(" ms left")?.parse().ok()?;
            Some((why, ms.div_ceil(1000)))
        });
        match left {
            Some((why, left_s)) => (word.into(), Some(why.into()), Some(left_s)),
            None => (word.into(), Some(why.into()), None),
        }
    }

    fn shown(state: &str, why: Option<&str>, left_s: Option<u64>) -> String {
        match (why, left_s) {
            (None, _) => state.to_string(),
            (Some(why), None) => format!("{state}: {why}"),
            (Some(why), Some(left)) => format!("{state}: {why}, {left} s left"),
        }
    }
}

impl Status {
    /// The status now, its windows measured from `history`.
    pub fn now(shared: &Shared, history: &History) -> Status {
        let masters = shared.masters();
        let now = Sample::take(shared);
        let since = |length| history.start_of(now.at, length).unwrap_or(now.clone());
        let (window, rates) = (since(WINDOW), since(RATE_WINDOW));
        let rate_window = now.at.duration_since(rates.at).as_secs_f64();
        let per_second = |n: u64| match rate_window > 0.0 {
            true => n as f64 / rate_window,
            false => 0.0,
        };
        let acquired = |r: AcquireResult| now.acquires[r as usize] - rates.acquires[r as usize];
        let granted = acquired(AcquireResult::Granted);
        let refused: u64 = (AcquireResult::ALL.into_iter())
            .filter(|r| *r != AcquireResult::Granted)
            .map(acquired)
            .sum();
        let covered = now.at.duration_since(window.at);
        let window_text = match covered + Duration::from_secs(1) >= WINDOW {
            true => format!("over the last {} s", WINDOW.as_secs()),
            false => format!("since start ({} s)", covered.as_secs()),
        };
        let empty = MasterSample::default();
        let voters = masters.voters().iter().enumerate().map(|(i, voter)| {
            let facts = MasterFacts::of(voter);
            let (then, current) = (window.masters.get(i).unwrap_or(&empty), &now.masters[i]);
            let vote = |kind: AcquireVote| current.votes[kind as usize] - then.votes[kind as usize];
            let replies = current.replies - then.replies;
            let micros = current.reply_micros - then.reply_micros;
            let (state, why, left_s) = MasterStatus::state_parts(&facts.state);
            MasterStatus {
                shown: MasterStatus::shown(&state, why.as_deref(), left_s),
                addr: facts.addr,
                state,
                why,
                left_s,
                votes: Votes {
                    ok: vote(AcquireVote::Ok),
                    held: vote(AcquireVote::Held),
                    timeout: vote(AcquireVote::Timeout),
                    not_eligible: vote(AcquireVote::NotEligible),
                    error: vote(AcquireVote::Error),
                },
                replies,
                latency_ms: (replies > 0).then(|| micros as f64 / 1000.0 / replies as f64),
                clock_age_ms: facts.clock.map(|(age, _)| age.as_millis() as u64),
                clock_error_ms: facts.clock.map(|(_, error)| error.as_millis() as u64),
                cause: facts.quarantine_cause.map(str::to_string),
            }
        });
        Status {
            version: env!("CARGO_PKG_VERSION").into(),
            uptime_s: shared.started.elapsed().as_secs(),
            deployment: deployment_label(masters.deployment()).into(),
            ready: masters.usable() >= masters.quorum(),
            summary: masters.usable_summary(),
            usable: masters.usable(),
            quorum: masters.quorum(),
            clients: shared.clients.load(Ordering::Relaxed),
            grants_per_s: per_second(granted),
            refusals_per_s: per_second(refused),
            rate_window_s: rate_window,
            window: window_text,
            masters: voters.collect(),
        }
    }

    pub fn to_json(&self) -> String {
        // A struct of strings and numbers always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The page showing this status, then refreshing it.
    pub fn page(&self) -> String {
        // `</` could end the script element the JSON sits in.
        PAGE.replace(PAGE_SLOT, &self.to_json().replace("</", "<\\/"))
    }

    /// The status for a terminal.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "redlock-proxy {}, up {} s: {}; {}\ndeployment: {}\nclients: {}; acquires per second (last {:.0} s): {:.1} granted, {:.1} refused\nmasters (votes and reply latency {}):\n",
            self.version,
            self.uptime_s,
            if self.ready { "ready" } else { "NOT READY" },
            self.summary,
            self.deployment,
            self.clients,
            self.rate_window_s,
            self.grants_per_s,
            self.refusals_per_s,
            self.window,
        );
        let width = self.masters.iter().map(|m| m.addr.len()).max().unwrap_or(0);
        for (i, m) in self.masters.iter().enumerate() {
            let v = &m.votes;
            let latency = m
                .latency_ms
                .map_or_else(|| "-".into(), |ms| format!("{ms:.2} ms"));
            let clock = match (m.clock_age_ms, m.clock_error_ms) {
                (Some(age), Some(error)) => format!("clock read {age} ms ago, ±{error} ms"),
                _ => "clock not read".into(),
            };
            out.push_str(&format!(
                "  master{i} {:width$}  {}\n           votes ok {} held {} timeout {} not_eligible {} error {}; latency {latency}; {clock}\n",
                m.addr, m.shown, v.ok, v.held, v.timeout, v.not_eligible, v.error,
            ));
        }
        out
    }
}

impl Status {
    /// `GET http://{addr}/status.json` (the metrics endpoint of a running proxy), within 5 s.
    pub fn fetch(addr: &str) -> Result<Status, String> {
        let limit = Duration::from_secs(5);
        let socket = std::net::ToSocketAddrs::to_socket_addrs(addr)
            .map_err(|e| format!("{addr}: {e}"))?
            .next()
            .ok_or_else(|| format!("{addr}: no address"))?;
        let mut stream = std::net::TcpStream::connect_timeout(&socket, limit)
            .map_err(|e| format!("cannot reach the metrics endpoint at {addr}: {e}"))?;
        let io = |e: std::io::Error| format!("{addr}: {e}");
        stream.set_read_timeout(Some(limit)).map_err(io)?;
        stream.set_write_timeout(Some(limit)).map_err(io)?;
        let request =
            format!("GET /status.json HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).map_err(io)?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).map_err(io)?;
        let (head, body) = answer
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("{addr}: not an HTTP answer"))?;
        if !head.starts_with("HTTP/1.1 200") {
            let line = head.lines().next().unwrap_or_default();
            return Err(format!("{addr}/status.json answered {line}"));
        }
        serde_json::from_str(body).map_err(|e| format!("{addr}/status.json: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_is_split_into_its_word_why_and_time_left() {
        let cases = [
            ("up", ("up", None, None), "up"),
            (
                "down (connection refused)",
                ("down", Some("connection refused"), None),
                "down: connection refused",
            ),
            (
                "quarantined (restarted without data; 40200 ms left)",
                ("quarantined", Some("restarted without data"), Some(41)),
                "quarantined: restarted without data, 41 s left",
            ),
            (
                "auth_failed (NOAUTH Authentication required.)",
                ("auth_failed", Some("NOAUTH Authentication required."), None),
                "auth_failed: NOAUTH Authentication required.",
            ),
        ];
        for (state, (word, why, left), shown) in cases {
            let parts = MasterStatus::state_parts(state);
            assert_eq!(
                parts,
                (word.to_string(), why.map(String::from), left),
                "{state}"
            );
            assert_eq!(
                MasterStatus::shown(&parts.0, parts.1.as_deref(), parts.2),
                shown
            );
        }
    }
}

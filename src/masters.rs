//! The set of voting masters ([`Masters`]): one [`Voter`] per master (its transport link and
//! its health record), and the fan-out that asks every master at once and collects the
//! answers into a slot vector of [`Vote`]s.
//!
//! Invariants:
//! - Every fan-out sends the *same* request to every master at once (or a payload of its own
//!   to each, for the acquire) and records each master's answer in that master's slot; the
//!   caller's decision rule (pure, in [`crate::redlock`]) says when enough is known. Masters
//!   still pending at that point keep their place in their connection's FIFO, so a later
//!   command of the same client to that master is never overtaken by it.
//! - A master's answer counts only while its health record says it may vote on its current
//!   connection ([`Voter::eligible`]). An ineligible master still gets the request (a release
//!   must reach it too), but its vote is missing at once, or [`Vote::Fenced`] while it is
//!   quarantined.
//! - With `wait_replicas` = R, an eligible master's answer counts only once a `WAIT R` written
//!   after it on the same connection counted R replicas ([`Link::send_commands`];
//!   docs/SAFETY.md "Confirmed writes"); otherwise it is missing (unconfirmed).
//! - Every missing vote carries its reason, counted per master ([`VoteStats`], `INFO`).

use crate::config::Config;
use crate::dial::{Dial, PASSWORD_ENV};
use crate::health::{self, MasterHealth};
use crate::live::LiveDuration;
use crate::protocol::{Reply, ScriptCall};
use crate::redlock::{merge, merged, quorum, MergeRule, MissingReason, Vote};
use crate::secret::Secret;
use crate::tls::master_client_config;
use crate::transport::{Driver, Link, NoReply, Pending, SharedScript};
use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{watch, Semaphore};
use tokio::time::{sleep_until, Instant, Sleep};

/// Most fan-outs in progress at once. Enough to keep every master's connection busy (a fan-out
/// is one pipelined request per master), small enough that a backlog of this many is worked
/// off well within a node timeout.
pub const MAX_FANOUTS: usize = 256;

/// A request for one master in [`Masters::fan_out_each`].
#[derive(Clone)]
pub enum Ask {
    /// Commands, encoded.
    Commands(Bytes),
    /// A call of a script that the link merges with other callers' calls (and sends again
    /// with the body if the master answers `NOSCRIPT`).
    Script(Arc<SharedScript>, ScriptCall),
    /// Commands led by an `EVALSHA`, and the same with the body for a master that answers
    /// `NOSCRIPT` ([`Link::send_by_sha`]).
    BySha { by_sha: Bytes, by_body: Bytes },
}

/// Buckets for latencies from 100 µs to about 1.6 s, doubling: of the masters' replies here,
/// and of the acquires ([`crate::lock::LockStats`]), so that the two compare bucket by bucket.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0001, 2.0, 15)
}

/// How a master's votes went, for `INFO` and the metrics.
#[derive(Debug)]
pub struct VoteStats {
    pub replies: AtomicU64,
    pub not_eligible: AtomicU64,
    pub no_link: AtomicU64,
    pub timeout: AtomicU64,
    pub closed: AtomicU64,
    pub unconfirmed: AtomicU64,
    /// Its votes in acquires, by [`AcquireVote`].
    acquire_votes: [Counter; 5],
    /// Request to reply, in seconds, of the replies that came within the node timeout.
    pub reply_duration: Histogram,
}

impl Default for VoteStats {
    fn default() -> Self {
        VoteStats {
            replies: AtomicU64::default(),
            not_eligible: AtomicU64::default(),
            no_link: AtomicU64::default(),
            timeout: AtomicU64::default(),
            closed: AtomicU64::default(),
            unconfirmed: AtomicU64::default(),
            acquire_votes: Default::default(),
            reply_duration: Histogram::new(latency_buckets()),
        }
    }
}

/// A master's vote in one acquire, as the metrics label it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireVote {
    /// It set the key.
    Ok,
    /// The key is held there.
    Held,
    /// No answer within the node timeout.
    Timeout,
    /// It may not vote now (quarantined, unsafe, not yet judged on its connection).
    NotEligible,
    /// Any other answer or failure (an error reply, no connection).
    Error,
}

impl AcquireVote {
    pub const ALL: [AcquireVote; 5] = [
        AcquireVote::Ok,
        AcquireVote::Held,
        AcquireVote::Timeout,
        AcquireVote::NotEligible,
        AcquireVote::Error,
    ];

    pub fn label(self) -> &'static str {
        match self {
            AcquireVote::Ok => "ok",
            AcquireVote::Held => "held",
            AcquireVote::Timeout => "timeout",
            AcquireVote::NotEligible => "not_eligible",
            AcquireVote::Error => "error",
        }
    }

    /// The label of a vote at an acquire's decision (`None`: still pending then).
    fn of(vote: &Vote) -> Option<AcquireVote> {
        Some(match vote {
            Vote::Pending => return None,
            Vote::Replied(r) if *r == Reply::ok() => AcquireVote::Ok,
            Vote::Replied(Reply::Null) => AcquireVote::Held,
            Vote::Missing(MissingReason::Timeout) => AcquireVote::Timeout,
            Vote::Missing(MissingReason::NotEligible) | Vote::Fenced => AcquireVote::NotEligible,
            Vote::Replied(_) | Vote::Missing(_) => AcquireVote::Error,
        })
    }
}

impl VoteStats {
    fn count(&self, vote: &Vote) {
        let counter = match vote {
            Vote::Replied(_) => &self.replies,
            Vote::Missing(MissingReason::NotEligible) | Vote::Fenced => &self.not_eligible,
            Vote::Missing(MissingReason::NoLink) => &self.no_link,
            Vote::Missing(MissingReason::Timeout) => &self.timeout,
            Vote::Missing(MissingReason::Closed) => &self.closed,
            Vote::Missing(MissingReason::Unconfirmed) => &self.unconfirmed,
            Vote::Pending => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a master's vote at an acquire's decision (votes still pending are not counted).
    pub fn count_acquire_vote(&self, vote: &Vote) {
        if let Some(kind) = AcquireVote::of(vote) {
            self.acquire_votes[kind as usize].inc();
        }
    }

    pub fn acquire_votes(&self, kind: AcquireVote) -> u64 {
        self.acquire_votes[kind as usize].get()
    }

    /// Missing votes of every reason.
    pub fn missing(&self) -> u64 {
        [
            &self.not_eligible,
            &self.no_link,
            &self.timeout,
            &self.closed,
            &self.unconfirmed,
        ]
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .sum()
    }
}

/// One master as a voter: its link, and the health record that says whether its answers count.
#[derive(Debug)]
pub struct Voter {
    pub link: Arc<Link>,
    pub health: Arc<MasterHealth>,
    /// Common to every shard's voter for this master ([`Masters::connect_like`]).
    pub stats: Arc<VoteStats>,
}

impl Voter {
    /// May this master's votes count right now? Only on a connection the health monitor has
    /// judged, outside quarantine, and in a safe configuration.
    pub fn eligible(&self) -> bool {
        self.link.is_connected() && self.health.eligible(self.link.connect_count())
    }

    /// The deadline (ms in the master's clock) of a write sent at `sent`: the latest the
    /// master's clock can show when `node_timeout` runs out, or 1 (already past) before its
    /// first clock reading; `None` if its vote cannot count (it is then not asked). With one
    /// look at its health record. Acquires, extends and scripts that may write all carry it.
    pub fn write_deadline(
        &self,
        sent: Instant,
        node_timeout: Duration,
        drift_factor: f64,
    ) -> Option<u64> {
        if !self.link.is_connected() {
            return None;
        }
        let bound = self.health.clock_bound_if_eligible(
            self.link.connect_count(),
            sent + node_timeout,
            drift_factor,
        )?;
        Some(bound.unwrap_or(1))
    }

    /// `up`, `down`, `auth_failed (…)`, `connecting`, `quarantined (…)` or `unsafe (…)`, for
    /// `INFO`.
    pub fn state(&self) -> String {
        if !self.link.is_connected() {
            return match self.link.auth_refused() {
                Some(reason) => format!("auth_failed ({reason})"),
                None => "down".into(),
            };
        }
        self.health.state(self.link.connect_count())
    }

    /// Hands `request` to the link; `Err` is the vote at once when this master's answer
    /// cannot count (it is asked anyway: [`Voter::absent_vote`]). With `wait_replicas` (> 0)
    /// a vote counts only once a `WAIT` after it counted that many replicas
    /// ([`Link::send_commands`]).
    fn send(&self, request: Ask, replies: usize, wait_replicas: u32) -> Result<Pending, Vote> {
        let eligible = self.eligible();
        let confirm = (eligible && wait_replicas > 0).then_some(wait_replicas);
        // A script call whose script the master lost is sent again with the body by the link
        // itself ([`Link::send_script`]).
        let pending = match request {
            Ask::Commands(payload) => self.link.send_commands(payload, replies, confirm),
            Ask::Script(script, call) => self.link.send_script(script, call, confirm),
            Ask::BySha { by_sha, by_body } => {
                self.link.send_by_sha(by_sha, by_body, replies, confirm)
            }
        };
        if eligible {
            Ok(pending)
        } else {
            drop(pending);
            Err(self.absent_vote())
        }
    }

    /// The vote of an answer (or its absence) to a request sent at `asked`.
    fn vote_on(&self, answer: Result<Reply, NoReply>, asked: Instant) -> Vote {
        let vote = match answer {
            Ok(reply) => {
                let took = asked.elapsed().as_secs_f64();
                self.stats.reply_duration.observe(took);
                Vote::Replied(reply)
            }
            Err(why) => Vote::Missing(match why {
                NoReply::NoLink => MissingReason::NoLink,
                NoReply::Timeout => MissingReason::Timeout,
                NoReply::Closed => MissingReason::Closed,
                NoReply::Unconfirmed => MissingReason::Unconfirmed,
            }),
        };
        self.stats.count(&vote);
        vote
    }

    /// The vote of a master that is not asked, or whose answer cannot count: [`Vote::Fenced`]
    /// while quarantined, else missing (not eligible).
    pub fn absent_vote(&self) -> Vote {
        let vote = if self.health.fenced() {
            Vote::Fenced
        } else {
            Vote::Missing(MissingReason::NotEligible)
        };
        self.stats.count(&vote);
        vote
    }
}

/// The votes of a fan-out still to come, each within its node timeout, in the order they
/// come. One timer for all of them and no task or allocation per master: a fan-out's requests
/// all leave within microseconds of each other.
#[derive(Default)]
pub struct LateVotes {
    /// (master index, voter, its request's answer to come).
    waiting: Vec<(usize, Arc<Voter>, Pending)>,
    /// Wakes the fan-out at the earliest node timeout among `waiting`.
    timer: Option<Pin<Box<Sleep>>>,
}

impl LateVotes {
    /// The next vote to come as `(master index, vote)`; `None` once every vote is in.
    pub async fn next(&mut self) -> Option<(usize, Vote)> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<(usize, Vote)>> {
        loop {
            // Every answer still to come is polled (so each wakes this task), up to the first
            // that has come; an answer is taken once.
            let came =
                self.waiting
                    .iter_mut()
                    .enumerate()
                    .find_map(|(at, w)| match w.2.poll_answer(cx) {
                        Poll::Ready(answer) => Some((at, answer)),
                        Poll::Pending => None,
                    });
            if let Some((at, answer)) = came {
                let (i, voter, pending) = self.waiting.swap_remove(at);
                return Poll::Ready(Some((i, voter.vote_on(answer, pending.queued_at))));
            }
            let Some((at, earliest)) = (self.waiting.iter().map(|w| w.2.timeout_at()))
                .enumerate()
                .min_by_key(|(_, timeout_at)| *timeout_at)
            else {
                return Poll::Ready(None);
            };
            if Instant::now() >= earliest {
                let (i, voter, pending) = self.waiting.swap_remove(at);
                let asked = pending.queued_at;
                let vote = voter.vote_on(Err(pending.time_out()), asked);
                return Poll::Ready(Some((i, vote)));
            }
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(sleep_until(earliest)));
            if timer.deadline() != earliest {
                timer.as_mut().reset(earliest);
            }
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

/// How the masters are reached and trusted.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long one master may take to answer before its vote is missing (a reload may
    /// change it).
    pub node_timeout: LiveDuration,
    /// What the health monitors need (quarantine on or off, the lease bound, …).
    pub health: health::MonitorConfig,
}

/// All masters, voting as one body.
pub struct Masters {
    voters: Vec<Arc<Voter>>,
    settings: Settings,
    /// Bounds the fan-outs in progress (see [`MAX_FANOUTS`]).
    fanouts: Semaphore,
    stop: watch::Sender<bool>,
    /// Whether the masters were judged since start ([`Masters::started`]).
    startup: health::Startup,
}

impl Masters {
    /// Connects to, and watches, every master of `config.backends` (TCP or TLS, with their
    /// credentials: [`crate::dial`]). TLS material that cannot be loaded leaves the `rediss://`
    /// masters down, with the reason logged on every attempt's change (the binary refuses to
    /// start with it: [`Config::check_files`]).
    pub fn connect(config: &Config, health: health::MonitorConfig) -> Arc<Masters> {
        let settings = Settings {
            node_timeout: LiveDuration::new(config.node_timeout()),
            health,
        };
        let stats = config.backends.iter().map(|_| Arc::default()).collect();
        Masters::connect_with(config, settings, stats)
    }

    /// Another set of connections to the masters of `first`, for a shard on another thread
    /// ([`crate::shared::Shard`]): its own links and health monitors on the runtime this is
    /// called in, the same live settings (a reload changes both) and the same vote counters.
    pub fn connect_like(config: &Config, first: &Masters) -> Arc<Masters> {
        let stats = first.voters.iter().map(|v| v.stats.clone()).collect();
        Masters::connect_with(config, first.settings.clone(), stats)
    }

    fn connect_with(
        config: &Config,
        settings: Settings,
        stats: Vec<Arc<VoteStats>>,
    ) -> Arc<Masters> {
        let node_timeout = settings.node_timeout.clone();
        let links = dials(config)
            .into_iter()
            .zip(&config.backends)
            .map(|(dial, backend)| {
                Link::new(backend.to_string(), Box::new(dial), node_timeout.clone())
            })
            .collect();
        Masters::start(links, settings, stats)
    }

    /// Starts every link (spawns its driver) and its health monitor; `stats[i]` counts master
    /// `i`'s votes.
    pub fn start(
        links: Vec<(Arc<Link>, Driver)>,
        settings: Settings,
        stats: Vec<Arc<VoteStats>>,
    ) -> Arc<Masters> {
        let (stop, stop_rx) = watch::channel(false);
        let voters: Vec<Arc<Voter>> = links
            .into_iter()
            .zip(stats)
            .map(|((link, driver), stats)| {
                tokio::spawn(driver.run(stop_rx.clone()));
                Arc::new(Voter {
                    link,
                    health: Arc::default(),
                    stats,
                })
            })
            .collect();
        let watched: Vec<_> = voters
            .iter()
            .map(|v| (v.link.clone(), v.health.clone()))
            .collect();
        let startup = health::spawn_monitors(&watched, settings.health.clone(), stop_rx);
        Arc::new(Masters {
            voters,
            settings,
            fanouts: Semaphore::new(MAX_FANOUTS),
            stop,
            startup,
        })
    }

    /// Whether the proxy is past its start-up: the deployment is decided, and a quorum of
    /// masters may vote or every master was judged since or found unreachable; or it cannot
    /// be decided, fewer than a quorum of masters being reachable (a refusal then means "no
    /// quorum", as it does later). Stays true once true. Before, a refusal would only mean
    /// "not looked at yet" (docs/PROTOCOL.md).
    pub fn started(&self) -> bool {
        self.startup.started(|verdict| self.judged(verdict))
    }

    /// Waits for [`Masters::started`] at most `limit`; whether it started.
    pub async fn wait_started(&self, limit: Duration) -> bool {
        self.startup
            .wait_started(limit, |verdict| self.judged(verdict))
            .await
    }

    fn judged(&self, verdict: Option<health::Deployment>) -> bool {
        let unreachable = |v: &Arc<Voter>| !v.link.is_connected() && v.link.attempted();
        match verdict {
            Some(_) => {
                let eligible = self.voters.iter().filter(|v| v.eligible()).count();
                eligible >= self.quorum()
                    || self
                        .voters
                        .iter()
                        .all(|v| v.health.judged() || unreachable(v))
            }
            None => {
                self.voters.iter().all(|v| v.link.attempted())
                    && self.voters.iter().filter(|v| !unreachable(v)).count() < self.quorum()
            }
        }
    }

    /// The deployment verdict, once decided (for `INFO`).
    pub fn deployment(&self) -> Option<health::Deployment> {
        self.startup.verdict()
    }

    /// The voters, in the order of the configuration.
    pub fn voters(&self) -> &[Arc<Voter>] {
        &self.voters
    }

    /// How long one master may take to answer.
    pub fn node_timeout(&self) -> Duration {
        self.settings.node_timeout.get()
    }

    /// The node timeout every link reads (a reload may change it).
    pub fn live_node_timeout(&self) -> &LiveDuration {
        &self.settings.node_timeout
    }

    /// How often the masters are polled (a reload may change it).
    pub fn health_interval(&self) -> &LiveDuration {
        &self.settings.health.interval
    }

    /// How many replicas confirm every vote (0: off; docs/SAFETY.md "Confirmed writes").
    pub fn wait_replicas(&self) -> u32 {
        self.settings.health.wait_replicas
    }

    /// Whether masters that lost data are quarantined (and acquires check the markers).
    pub fn quarantine(&self) -> bool {
        self.settings.health.quarantine
    }

    /// How many masters may vote now.
    pub fn usable(&self) -> usize {
        self.voters.iter().filter(|v| v.eligible()).count()
    }

    /// `<n> of <N> masters usable, quorum <Q>` (`/readyz`, `NOQUORUM` of acquires, the log).
    pub fn usable_summary(&self) -> String {
        format!(
            "{} of {} masters usable, quorum {}",
            self.usable(),
            self.voters.len(),
            self.quorum()
        )
    }

    pub fn quorum(&self) -> usize {
        quorum(self.voters.len())
    }

    /// Stops every connection and monitor task.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// Sends each master its request (`ask(i)`, producing `replies` replies; `None`:
    /// nothing is sent there and its vote is [absent](Voter::absent_vote) at once) and
    /// collects the votes until `decided` says the outcome is known or every master has
    /// answered or timed out. A script call's `EVAL` retry after a `NOSCRIPT` goes out later
    /// than the client's next command may, which can only leave an acquire's value on that
    /// master until its clean-up (never a grant). Also returns the votes still pending at the decision, which arrive later (each within
    /// the node timeout), for the acquire's clean-up.
    pub async fn fan_out_each(
        &self,
        ask: impl Fn(usize) -> Option<Ask>,
        replies: usize,
        decided: impl Fn(&[Vote]) -> bool,
    ) -> (Vec<Vote>, LateVotes) {
        // Waiting here, before any master is asked, keeps the proxy's own backlog out of the
        // node timeout: under overload requests queue for a permit (and, beyond the per-client
        // bound, in the clients' sockets) instead of timing out on the masters' connections.
        // The semaphore is fair, so a client's requests still leave in its order: a permit is
        // free only while nobody waits (a released one goes to the first waiter), so taking a
        // free one at once overtakes nobody, and skips building and polling a waiter.
        let _permit = match self.fanouts.try_acquire() {
            Ok(permit) => Ok(permit),
            Err(_) => self.fanouts.acquire().await,
        };
        let mut votes = vec![Vote::Pending; self.voters.len()];
        let mut late = LateVotes::default();
        let wait_replicas = self.wait_replicas();
        for (i, voter) in self.voters.iter().enumerate() {
            match ask(i).map(|request| voter.send(request, replies, wait_replicas)) {
                None => votes[i] = voter.absent_vote(),
                Some(Err(vote)) => votes[i] = vote,
                Some(Ok(pending)) => late.waiting.push((i, voter.clone(), pending)),
            }
        }
        if !decided(&votes) {
            while let Some((i, vote)) = late.next().await {
                votes[i] = vote;
                if decided(&votes) {
                    break;
                }
            }
        }
        (votes, late)
    }

    /// One reply for all masters by the quorum rule `rule`, waiting only as long as needed.
    pub async fn quorum_reply(&self, payload: &Bytes, rule: MergeRule) -> Reply {
        self.quorum_reply_each(|_| Some(Ask::Commands(payload.clone())), rule)
            .await
    }

    /// [`Masters::quorum_reply`] on `ask(i)` ([`Masters::fan_out_each`]).
    pub async fn quorum_reply_each(
        &self,
        ask: impl Fn(usize) -> Option<Ask>,
        rule: MergeRule,
    ) -> Reply {
        let (votes, _late) = self
            .fan_out_each(ask, 1, |v| merge(v, rule).is_some())
            .await;
        merged(&votes, rule)
    }
}

/// How to reach each master of `config.backends`, in order (TCP or TLS, with its
/// credentials: [`crate::dial`]). TLS material that cannot be loaded leaves the `rediss://`
/// masters unreachable, with the reason on every attempt.
pub fn dials(config: &Config) -> Vec<Dial> {
    let env_password = std::env::var(PASSWORD_ENV).ok().map(Secret::new);
    let tls = match config.backends.iter().any(|b| b.tls) {
        true => Some(master_client_config(&config.master_tls()).map_err(|e| e.to_string())),
        false => None,
    };
    config
        .backends
        .iter()
        .map(|backend| Dial::new(backend, tls.as_ref(), env_password.as_ref()))
        .collect()
}

impl Drop for Masters {
    fn drop(&mut self) {
        self.stop();
    }
}

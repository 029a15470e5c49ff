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

use crate::admission::{Admission, Admitted};
use crate::backend::Backend;
use crate::cluster::{self, slots::SLOTS};
use crate::config::Config;
use crate::dial::{Dial, PASSWORD_ENV};
use crate::health::{self, MasterHealth};
use crate::health::{ClusterMaster, Place};
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
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant, Sleep};
use tokio_rustls::TlsConnector;

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
    /// Its votes in acquires, by [`AcquireVote`]: `[0]` those in at the decision, `[1]` those
    /// that came after it (a master a little slower than the quorum still votes every time).
    acquire_votes: [[Counter; 5]; 2],
    /// Request to reply, in seconds, of the replies that came within the node timeout.
    pub reply_duration: Histogram,
    /// Their total, in microseconds (the histogram's sum is not readable outside its
    /// exposition): the status view's mean latency over a window.
    pub reply_micros: AtomicU64,
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
            reply_micros: AtomicU64::default(),
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

    /// Counts a master's vote in an acquire, in at its decision or `late` (after it); a vote
    /// still pending is counted when it comes ([`LateVotes::count_acquire_votes`]).
    pub fn count_acquire_vote(&self, vote: &Vote, late: bool) {
        if let Some(kind) = AcquireVote::of(vote) {
            self.acquire_votes[usize::from(late)][kind as usize].inc();
        }
    }

    pub fn acquire_votes(&self, kind: AcquireVote, late: bool) -> u64 {
        self.acquire_votes[usize::from(late)][kind as usize].get()
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

/// The server of a master that serves one slot: its link and health record.
pub struct Server {
    pub link: Arc<Link>,
    pub health: Arc<MasterHealth>,
}

/// One master as a voter: where it is, and how its votes went.
#[derive(Debug)]
pub struct Voter {
    pub place: Place,
    /// Common to every shard's voter for this master ([`Masters::connect_like`]).
    pub stats: Arc<VoteStats>,
}

impl Voter {
    /// The master acknowledged a lock write outside the merged lock calls (an extend, a
    /// guarded write or script): no write witness covers it until the next merged call that
    /// takes a key answers (docs/SAFETY.md, "Acknowledged writes"). Cluster masters keep no
    /// witness.
    pub fn uncovered_write(&self) {
        if let Place::Single { link, .. } = &self.place {
            link.witness.uncovered_write();
        }
    }

    /// The master's name, for logs, `INFO` and the metrics.
    pub fn name(&self) -> &str {
        match &self.place {
            Place::Single { link, .. } => &link.addr,
            Place::Cluster(cluster) => &cluster.name,
        }
    }

    /// Its links: a single master's, or every node's of a cluster (for `INFO`).
    pub fn links(&self) -> Vec<Arc<Link>> {
        match &self.place {
            Place::Single { link, .. } => vec![link.clone()],
            Place::Cluster(cluster) => cluster
                .nodes()
                .into_iter()
                .map(|n| n.link.clone())
                .collect(),
        }
    }

    /// Quarantines begun, by cause (a cluster's: one per primary and cause at a time).
    pub fn quarantines(&self) -> Vec<(&'static str, u64)> {
        match &self.place {
            Place::Single { health, .. } => health.quarantines(),
            Place::Cluster(cluster) => cluster.quarantines(),
        }
    }

    /// The cluster this master is, if it is one.
    pub fn cluster(&self) -> Option<&Arc<ClusterMaster>> {
        match &self.place {
            Place::Single { .. } => None,
            Place::Cluster(cluster) => Some(cluster),
        }
    }

    /// The server that serves `slot` (a keyless request: slot 0's) now, if any.
    pub fn server(&self, slot: u16) -> Option<Server> {
        match &self.place {
            Place::Single { link, health } => Some(Server {
                link: link.clone(),
                health: health.clone(),
            }),
            Place::Cluster(cluster) => cluster.owner(slot).map(|node| Server {
                link: node.link.clone(),
                health: node.health.clone(),
            }),
        }
    }

    /// May this master's votes for `slot` count right now? Only on a connection the health
    /// monitor has judged, outside quarantine, and in a safe configuration; on a cluster, only
    /// through the slot's owner, which the keeper found armed the slot.
    pub fn eligible(&self, slot: u16) -> bool {
        self.with_server(slot, |link, health, ready| {
            ready && link.is_connected() && health.eligible(link.connect_count())
        })
        .unwrap_or(false)
    }

    /// The master's clock at local instant `when` (µs since the epoch; a cluster's: the
    /// latest of its primaries'), for proposing fencing tokens; `None` before a reading.
    pub fn clock_estimate_us(&self, when: Instant) -> Option<u64> {
        match &self.place {
            Place::Single { health, .. } => health.master_clock_estimate_us(when),
            Place::Cluster(cluster) => (cluster.each_node())
                .filter_map(|n| n.health.master_clock_estimate_us(when))
                .max(),
        }
    }

    /// The merged lock script this master runs: `single` (a single master's), or a cluster's
    /// ([`ClusterMaster::lock_script`]).
    pub fn lock_script(&self, single: &Arc<SharedScript>) -> Arc<SharedScript> {
        match &self.place {
            Place::Single { .. } => single.clone(),
            Place::Cluster(cluster) => cluster.lock_script(),
        }
    }

    /// Whether every slot may vote (a single master: whether it may).
    pub fn usable(&self) -> bool {
        match &self.place {
            Place::Single { .. } => self.eligible(0),
            Place::Cluster(cluster) => cluster.usable_slots() == SLOTS,
        }
    }

    /// Whether some connection to the master is up.
    pub fn reachable(&self) -> bool {
        match &self.place {
            Place::Single { link, .. } => link.is_connected(),
            Place::Cluster(cluster) => cluster.reachable(),
        }
    }

    /// Whether its first connection attempts are over.
    pub fn attempted(&self) -> bool {
        match &self.place {
            Place::Single { link, .. } => link.attempted(),
            Place::Cluster(cluster) => cluster.attempted(),
        }
    }

    /// Whether its health was judged since the deployment verdict.
    pub fn judged(&self) -> bool {
        match &self.place {
            Place::Single { health, .. } => health.judged(),
            Place::Cluster(cluster) => cluster.judged(),
        }
    }

    /// `slot` answered unarmed or quarantined: its monitor (or the cluster's keeper) looks at
    /// it again at once.
    pub fn recheck(&self, slot: u16) {
        match &self.place {
            Place::Single { health, .. } => health.recheck(),
            Place::Cluster(cluster) => cluster.recheck(slot),
        }
    }

    /// A vote on an acquire of a key of `slot` that came after the decision: counted as late,
    /// and `slot` rechecked if it answered unarmed or quarantined (`-1`, the lock script's
    /// marker refusal, which a write witness below the floor answers too).
    fn late_acquire_vote(&self, vote: &Vote, slot: u16) {
        if *vote == Vote::Replied(Reply::Integer(-1)) {
            self.recheck(slot);
        }
        self.stats.count_acquire_vote(vote, true);
    }

    /// The markers a script checks for `slot`: the master's, or on a cluster the slot's.
    pub fn markers(&self, slot: u16) -> [Bytes; 2] {
        cluster::keys::markers_on(self.cluster().is_some(), slot)
    }

    /// Where this master keeps the fencing token counter of `key`.
    pub fn token_key(&self, key: &[u8]) -> Bytes {
        cluster::keys::token_key_on(self.cluster().is_some(), key)
    }

    /// The deadline (ms in the master's clock) of a write for `slot` sent at `sent`: the latest
    /// the serving server's clock can show when `node_timeout` runs out, or 1 (already past)
    /// before its first clock reading; `None` if its vote cannot count (it is then not asked).
    /// With one look at its health record. Acquires, extends and scripts that may write all
    /// carry it.
    pub fn write_deadline(
        &self,
        slot: u16,
        sent: Instant,
        node_timeout: Duration,
        drift_factor: f64,
    ) -> Option<u64> {
        self.with_server(slot, |link, health, ready| {
            if !ready || !link.is_connected() {
                return None;
            }
            let bound = health.clock_bound_if_eligible(
                link.connect_count(),
                sent + node_timeout,
                drift_factor,
            )?;
            Some(bound.unwrap_or(1))
        })?
    }

    /// `f` on the link and health record of the server of `slot`, and whether the slot is
    /// ready on it (always, on a single master); `None` if no server serves it. No reference
    /// count is taken for a single master: this is on every request's path.
    fn with_server<R>(
        &self,
        slot: u16,
        f: impl FnOnce(&Arc<Link>, &MasterHealth, bool) -> R,
    ) -> Option<R> {
        match &self.place {
            Place::Single { link, health } => Some(f(link, health, true)),
            Place::Cluster(cluster) => cluster.with_owner(slot, |node| {
                f(&node.link, &node.health, cluster.slot_ready(slot, node))
            }),
        }
    }

    /// `up`, `down (…)`, `auth_failed (…)`, `connecting`, `quarantined (…)` or `unsafe (…)`, for
    /// `INFO`; a cluster's slots in brief.
    /// The cause of the quarantine a single master is in now (the metric's label); `None`
    /// for a cluster master (its quarantines are per slot).
    pub fn quarantine_cause(&self) -> Option<&'static str> {
        match &self.place {
            Place::Single { health, .. } => health.quarantine_cause(),
            Place::Cluster(_) => None,
        }
    }

    pub fn state(&self) -> String {
        let (link, health) = match &self.place {
            Place::Single { link, health } => (link, health),
            Place::Cluster(cluster) => return cluster.state(),
        };
        if !link.is_connected() {
            return match (link.auth_refused(), link.down_reason()) {
                (Some(reason), _) => format!("auth_failed ({reason})"),
                (None, Some(reason)) => format!("down ({reason})"),
                (None, None) => "down".into(),
            };
        }
        health.state(link.connect_count())
    }

    /// Hands `request` for `slot` to the server that serves it; `Err` is the vote at once when
    /// this master's answer cannot count (it is asked anyway where a server serves the slot:
    /// [`Voter::absent_vote`]). With `wait_replicas` (> 0) a vote counts only once a `WAIT`
    /// after it counted that many replicas ([`Link::send_commands`]).
    fn send(
        &self,
        slot: u16,
        request: Ask,
        replies: usize,
        wait_replicas: u32,
    ) -> Result<Pending, Vote> {
        let sent = self.with_server(slot, |link, health, ready| {
            let eligible = ready && link.is_connected() && health.eligible(link.connect_count());
            let confirm = (eligible && wait_replicas > 0).then_some(wait_replicas);
            // A script call whose script the master lost is sent again with the body by the
            // link itself ([`Link::send_script`]).
            let pending = match request {
                Ask::Commands(payload) => link.send_commands(payload, replies, confirm),
                Ask::Script(script, call) => link.send_script(script, call, confirm),
                Ask::BySha { by_sha, by_body } => {
                    link.send_by_sha(by_sha, by_body, replies, confirm)
                }
            };
            (pending, eligible)
        });
        let Some((pending, eligible)) = sent else {
            return Err(self.absent_vote(slot));
        };
        if eligible {
            Ok(pending)
        } else {
            drop(pending);
            Err(self.absent_vote(slot))
        }
    }

    /// The vote of an answer (or its absence) to a request sent at `asked`.
    fn vote_on(&self, answer: Result<Reply, NoReply>, asked: Instant) -> Vote {
        let vote = match answer {
            Ok(reply) => {
                let took = asked.elapsed();
                self.stats.reply_duration.observe(took.as_secs_f64());
                (self.stats.reply_micros).fetch_add(took.as_micros() as u64, Ordering::Relaxed);
                if let Some(cluster) = self.cluster() {
                    cluster.note_reply(&reply);
                }
                Vote::Replied(reply)
            }
            Err(why) => Vote::Missing(match why {
                NoReply::NoLink => MissingReason::NoLink,
                NoReply::Timeout | NoReply::Unresponsive => MissingReason::Timeout,
                NoReply::Closed => MissingReason::Closed,
                NoReply::Unconfirmed => MissingReason::Unconfirmed,
            }),
        };
        self.stats.count(&vote);
        vote
    }

    /// The vote of a master that is not asked, or whose answer cannot count: [`Vote::Fenced`]
    /// while quarantined (on a cluster: the slot), else missing (not eligible).
    pub fn absent_vote(&self, slot: u16) -> Vote {
        let fenced = match &self.place {
            Place::Single { health, .. } => health.fenced(),
            Place::Cluster(cluster) => cluster.slot_fenced(slot),
        };
        let vote = match fenced {
            true => Vote::Fenced,
            false => Vote::Missing(MissingReason::NotEligible),
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
    /// Whether each vote, as it comes, is counted as a late acquire vote of its master, and
    /// the slot of the acquire's key ([`LateVotes::count_acquire_votes`]).
    acquire: Option<u16>,
}

impl LateVotes {
    /// The next vote to come as `(master index, vote)`; `None` once every vote is in.
    pub async fn next(&mut self) -> Option<(usize, Vote)> {
        let (i, vote, voter) = std::future::poll_fn(|cx| self.poll_next(cx)).await?;
        if let Some(slot) = self.acquire {
            voter.late_acquire_vote(&vote, slot);
        }
        Some((i, vote))
    }

    /// Counts every vote still to come in its master's acquire votes, as late, whoever waits
    /// for it: a refusal's rollback does, and once a grant is delivered nobody does, so the
    /// votes dropped with it are then waited for on a task of their own (each within its node
    /// timeout). Without this a master that always answers just after the quorum would
    /// never show a vote. A late "unarmed or quarantined" (`-1`, also a write witness below
    /// the floor) has `slot` rechecked at once, as one that came in time has.
    pub fn count_acquire_votes(&mut self, slot: u16) {
        self.acquire = Some(slot);
    }

    /// The next vote, with its voter.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<(usize, Vote, Arc<Voter>)>> {
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
                let vote = voter.vote_on(answer, pending.queued_at);
                return Poll::Ready(Some((i, vote, voter)));
            }
            let Some((at, earliest)) = (self.waiting.iter().map(|w| w.2.timeout_at()))
                .enumerate()
                .min_by_key(|(_, timeout_at)| *timeout_at)
            else {
                return Poll::Ready(None);
            };
            if Instant::now() >= earliest {
                // A missing vote for this request only: its connection stays (slow is not dead).
                let (i, voter, pending) = self.waiting.swap_remove(at);
                let vote = voter.vote_on(Err(NoReply::Timeout), pending.queued_at);
                return Poll::Ready(Some((i, vote, voter)));
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

impl Drop for LateVotes {
    fn drop(&mut self) {
        let Some(slot) = self.acquire else { return };
        if self.waiting.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // Not counted through `next`: a runtime that is shutting down drops the task at once,
        // and its votes must not be handed to yet another task.
        let mut rest = LateVotes {
            waiting: std::mem::take(&mut self.waiting),
            timer: None,
            acquire: None,
        };
        runtime.spawn(async move {
            while let Some((_, vote, voter)) = std::future::poll_fn(|cx| rest.poll_next(cx)).await {
                voter.late_acquire_vote(&vote, slot);
            }
        });
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
    /// Bounds the fan-outs in progress, adaptively.
    pub admission: Admission,
    stop: watch::Sender<bool>,
    /// Whether the masters were judged since start ([`Masters::started`]).
    startup: health::Startup,
    /// When the links were made: the start of the start-up hold ([`STARTUP_HOLD`]).
    connected_at: Instant,
}

/// How long after the links are made a request that needs the masters judged waits for it
/// ([`Masters::wait_started`]): a founding that waits for a master that does not answer
/// takes about a second (its patience, ten health intervals), and an acquire answered with an
/// error in that second would only have had to wait.
pub const STARTUP_HOLD: Duration = Duration::from_secs(2);

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
        let (tls, env_password) = dial_material(config);
        let endpoints = config
            .backends
            .iter()
            .map(|backend| match backend.cluster {
                Some(_) => Endpoint::Cluster(backend.clone(), tls.clone(), env_password.clone()),
                None => {
                    let dial = Dial::new(backend, tls.as_ref(), env_password.as_ref())
                        .answering_within(node_timeout.clone());
                    let link = Link::new(backend.to_string(), Box::new(dial), node_timeout.clone());
                    Endpoint::Single(link)
                }
            })
            .collect();
        Masters::start_endpoints(endpoints, settings, stats)
    }

    /// Starts every link (spawns its driver) and its health monitor; `stats[i]` counts master
    /// `i`'s votes.
    #[cfg(test)]
    pub fn start(
        links: Vec<(Arc<Link>, Driver)>,
        settings: Settings,
        stats: Vec<Arc<VoteStats>>,
    ) -> Arc<Masters> {
        let endpoints = links.into_iter().map(Endpoint::Single).collect();
        Masters::start_endpoints(endpoints, settings, stats)
    }

    fn start_endpoints(
        endpoints: Vec<Endpoint>,
        settings: Settings,
        stats: Vec<Arc<VoteStats>>,
    ) -> Arc<Masters> {
        let (stop, stop_rx) = watch::channel(false);
        let voters: Vec<Arc<Voter>> = endpoints
            .into_iter()
            .zip(stats)
            .map(|(endpoint, stats)| {
                let place = match endpoint {
                    Endpoint::Single((link, driver)) => {
                        tokio::spawn(driver.run(stop_rx.clone()));
                        let health: Arc<MasterHealth> = Arc::default();
                        if settings.health.clock_per_call {
                            watch_call_clocks(&link, &health, settings.health.drift_factor);
                        }
                        Place::Single { link, health }
                    }
                    Endpoint::Cluster(backend, tls, env_password) => {
                        Place::Cluster(ClusterMaster::new(
                            &backend,
                            tls,
                            env_password,
                            settings.node_timeout.clone(),
                            stop_rx.clone(),
                        ))
                    }
                };
                Arc::new(Voter { place, stats })
            })
            .collect();
        let places: Vec<Place> = voters.iter().map(|v| v.place.clone()).collect();
        let startup = health::spawn_monitors(&places, settings.health.clone(), stop_rx);
        Arc::new(Masters {
            voters,
            settings,
            admission: Admission::default(),
            stop,
            startup,
            connected_at: Instant::now(),
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

    /// Waits for [`Masters::started`] until the start-up hold ([`STARTUP_HOLD`]) is over, or
    /// `limit` if that is later; whether it started.
    pub async fn wait_started(&self, limit: Duration) -> bool {
        let hold = (self.connected_at + STARTUP_HOLD).saturating_duration_since(Instant::now());
        self.startup
            .wait_started(limit.max(hold), |verdict| self.judged(verdict))
            .await
    }

    fn judged(&self, verdict: Option<health::Deployment>) -> bool {
        let unreachable = |v: &Arc<Voter>| !v.reachable() && v.attempted();
        match verdict {
            Some(_) => {
                self.usable() >= self.quorum()
                    || self.voters.iter().all(|v| v.judged() || unreachable(v))
            }
            None => {
                self.voters.iter().all(|v| v.attempted())
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

    /// How many masters may vote now (for every slot, on a cluster).
    pub fn usable(&self) -> usize {
        self.voters.iter().filter(|v| v.usable()).count()
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
        slot: u16,
        ask: impl Fn(usize) -> Option<Ask>,
        replies: usize,
        decided: impl Fn(&[Vote]) -> bool,
    ) -> (Vec<Vote>, LateVotes) {
        // Waiting here, before any master is asked, keeps the proxy's own backlog out of the
        // node timeout: under overload requests queue for admission (and, beyond the
        // per-client bound, in the clients' sockets) instead of timing out on the masters'
        // connections. Admission is fair, so a client's requests still leave in its order.
        let admitted = self.admission.admit().await;
        self.fan_out_admitted(&admitted, slot, ask, replies, decided)
            .await
    }

    /// [`Masters::fan_out_each`] for a fan-out already admitted (an acquire, whose wait for
    /// admission is bounded: [`Admission::admit_by`]).
    pub async fn fan_out_admitted(
        &self,
        admitted: &Admitted<'_>,
        slot: u16,
        ask: impl Fn(usize) -> Option<Ask>,
        replies: usize,
        decided: impl Fn(&[Vote]) -> bool,
    ) -> (Vec<Vote>, LateVotes) {
        let mut votes = vec![Vote::Pending; self.voters.len()];
        let mut late = LateVotes::default();
        let wait_replicas = self.wait_replicas();
        for (i, voter) in self.voters.iter().enumerate() {
            match ask(i).map(|request| voter.send(slot, request, replies, wait_replicas)) {
                None => votes[i] = voter.absent_vote(slot),
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
        (self.admission).decided(admitted.at, self.node_timeout());
        (votes, late)
    }

    /// One reply for all masters by the quorum rule `rule` (sent, on a cluster, to the server
    /// of `slot`), waiting only as long as needed.
    pub async fn quorum_reply(&self, slot: u16, payload: &Bytes, rule: MergeRule) -> Reply {
        self.quorum_reply_each(slot, |_| Some(Ask::Commands(payload.clone())), rule)
            .await
    }

    /// [`Masters::quorum_reply`] of each master's form of a request.
    pub async fn quorum_reply_forms(&self, slot: u16, forms: &Forms, rule: MergeRule) -> Reply {
        self.quorum_reply_each(slot, self.ask_forms(forms), rule)
            .await
    }

    /// The `ask` of a fan-out ([`Masters::fan_out_each`]) that sends master `i` its form of
    /// `forms`.
    pub fn ask_forms<'a>(&'a self, forms: &'a Forms) -> impl Fn(usize) -> Option<Ask> + 'a {
        |i| Some(Ask::Commands(forms.for_voter(&self.voters[i])))
    }

    /// [`Masters::quorum_reply`] on `ask(i)` ([`Masters::fan_out_each`]).
    pub async fn quorum_reply_each(
        &self,
        slot: u16,
        ask: impl Fn(usize) -> Option<Ask>,
        rule: MergeRule,
    ) -> Reply {
        let (votes, _late) = self
            .fan_out_each(slot, ask, 1, |v| merge(v, rule).is_some())
            .await;
        merged(&votes, rule)
    }

    /// Whether some master is a single server (not a Redis Cluster).
    pub fn any_single(&self) -> bool {
        self.voters.iter().any(|v| v.cluster().is_none())
    }

    /// Whether some master is a Redis Cluster.
    pub fn any_cluster(&self) -> bool {
        self.voters.iter().any(|v| v.cluster().is_some())
    }
}

/// A master to start: a link to one server, or a cluster with how to dial its nodes.
enum Endpoint {
    Single((Arc<Link>, Driver)),
    Cluster(Backend, MasterTls, Option<Secret>),
}

/// The TLS connector for `rediss://` and `clusters://` masters, if any (or why it could not be
/// built).
type MasterTls = Option<Result<TlsConnector, String>>;

/// Has `health` judge the master's clock as every merged lock call on `link` reads it
/// ([`MasterHealth::judge_call_clock`]): an acquire the master took while its clock ran ahead
/// of the clock rule is then no vote, and the master is judged at once.
fn watch_call_clocks(link: &Arc<Link>, health: &Arc<MasterHealth>, drift_factor: f64) {
    let (health, addr) = (health.clone(), link.addr.clone());
    link.call_clock
        .install(Box::new(move |master_us, written, read| {
            health.judge_call_clock(&addr, master_us, written, read, drift_factor)
        }));
}

/// What every master's dial shares: the TLS connector (TLS material that cannot be loaded
/// leaves the TLS masters unreachable, with the reason on every attempt) and the password
/// from the environment.
fn dial_material(config: &Config) -> (MasterTls, Option<Secret>) {
    let env_password = std::env::var(PASSWORD_ENV).ok().map(Secret::new);
    let tls = match config.backends.iter().any(|b| b.tls) {
        true => Some(master_client_config(&config.master_tls()).map_err(|e| e.to_string())),
        false => None,
    };
    (tls, env_password)
}

/// How to reach each master of `config.backends`, in order (TCP or TLS, with its
/// credentials: [`crate::dial`]); a cluster's first seed.
pub fn dials(config: &Config) -> Vec<Dial> {
    let (tls, env_password) = dial_material(config);
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

/// A request in the forms the kinds of master need: a single master's, and a cluster's where
/// some master is one (the proxy's keys and scripts differ: [`Voter::markers`],
/// [`Voter::token_key`]).
#[derive(Clone)]
pub struct Forms {
    single: Bytes,
    cluster: Option<Bytes>,
}

impl Forms {
    /// `build(false)`, and `build(true)` only if some master is a cluster.
    pub fn new(masters: &Masters, build: impl Fn(bool) -> Bytes) -> Forms {
        Forms {
            single: build(false),
            cluster: masters.any_cluster().then(|| build(true)),
        }
    }

    /// One form for every master (a request the same on a single master and a cluster's node).
    pub fn same(payload: Bytes) -> Forms {
        Forms {
            single: payload,
            cluster: None,
        }
    }

    /// The form for `voter`.
    pub fn for_voter(&self, voter: &Voter) -> Bytes {
        match (voter.cluster(), &self.cluster) {
            (Some(_), Some(cluster)) => cluster.clone(),
            _ => self.single.clone(),
        }
    }
}

/// The slot a request with no key goes to on a cluster (a single master has no slots).
pub const ANY_SLOT: u16 = 0;

/// The slot of a request's first key (`keys`), or [`ANY_SLOT`] without one. Where a master is a
/// cluster every key of a request shares one slot (checked when it is received).
pub fn slot_of<K: AsRef<[u8]>>(keys: &[K]) -> u16 {
    keys.first()
        .map_or(ANY_SLOT, |k| cluster::slots::key_slot(k.as_ref()))
}

/// How `INFO` and the status view name the deployment verdict.
pub fn deployment_label(verdict: Option<health::Deployment>) -> &'static str {
    match verdict {
        None => "undecided",
        Some(health::Deployment::Fresh) => "founded_by_this_proxy",
        Some(health::Deployment::Live) => "live",
    }
}

/// One master's facts as they are now: what `INFO masters` prints on its line, and what the
/// status view starts from.
pub struct MasterFacts {
    pub addr: String,
    /// [`Voter::state`]: `up`, `down (connection refused)`, `quarantined (…; 41000 ms left)`…
    pub state: String,
    pub replies: u64,
    pub missing: u64,
    pub not_eligible: u64,
    pub no_link: u64,
    pub timeout: u64,
    pub closed: u64,
    pub unconfirmed: u64,
    pub connects: u64,
    pub retired_connections: u64,
    pub pending_cleanups: u64,
    /// How old the last clock reading is, and how far off it may be.
    pub clock: Option<(Duration, Duration)>,
    /// The running quarantine's cause, as the metric labels it.
    pub quarantine_cause: Option<&'static str>,
}

impl MasterFacts {
    pub fn of(voter: &Voter) -> MasterFacts {
        let links = voter.links();
        let stats = &voter.stats;
        let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let sum = |of: fn(&Link) -> u64| links.iter().map(|l| of(l)).sum::<u64>();
        MasterFacts {
            addr: voter.name().to_string(),
            state: voter.state(),
            replies: count(&stats.replies),
            missing: stats.missing(),
            not_eligible: count(&stats.not_eligible),
            no_link: count(&stats.no_link),
            timeout: count(&stats.timeout),
            closed: count(&stats.closed),
            unconfirmed: count(&stats.unconfirmed),
            connects: sum(Link::connect_count),
            retired_connections: sum(Link::retired_count),
            pending_cleanups: sum(|l| l.pending_cleanups() as u64),
            clock: voter
                .server(ANY_SLOT)
                .and_then(|s| s.health.clock_reading()),
            quarantine_cause: voter.quarantine_cause(),
        }
    }
}

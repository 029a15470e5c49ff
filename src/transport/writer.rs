//! Write batching: a connection's writer task ([`write_loop`]) drains everything queued since
//! its last write into one buffer and writes it with one call (one syscall per burst across
//! all clients), merging the calls of a [`super::SharedScript`] as it goes
//! ([`super::merge`]).
//!
//! Invariants:
//! - A request is pushed on the in-flight list before its bytes are written, in the order of
//!   its bytes (the reader's FIFO matching relies on it).
//! - Lock operations are held only while [`IN_FLIGHT_BEFORE_HOLDING`] earlier requests on the
//!   connection are unanswered and nothing else is to be written; a held operation's node
//!   timeout counts from when it was queued, and one never written wrote nothing.
//! - Once the connection is aborted nothing more is written; requests queued but never written
//!   are dropped (their callers see their channel close), except clean-ups, which are kept for
//!   the next connection.
//! - Every write that holds requests asking for a confirmation ends with one `WAIT` for all of
//!   them (`WAIT` covers every write its connection sent before it): none is held back, since
//!   a write always flushes the held lock operations first.

use super::connection::{AwaitingReply, Outgoing, Payload, Pipe, Recipients, Unconfirmed};
use super::merge::{Caller, Merging};
use super::{Link, WriteHalf};
use crate::protocol::encode_command;
use bytes::BytesMut;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

/// Largest batch the writer gathers before writing.
const WRITE_BATCH: usize = 256 * 1024;
/// How many requests may be unanswered on a connection before the writer holds the lock
/// operations queued behind them, to merge them into one call ([`write_loop`]). With one, a
/// connection that is not loaded still waits a round trip for each call (−20 % throughput at 5
/// clients over 1 master); with two, it never waits, and under load the calls are as large.
const IN_FLIGHT_BEFORE_HOLDING: usize = 2;

/// Writes what is queued for this connection, as few writes as it can.
///
/// Lock operations ([`Payload::Script`]) are held while [`IN_FLIGHT_BEFORE_HOLDING`] earlier
/// requests on this connection are unanswered, and written as one merged call when an answer
/// comes (or when 64 are gathered, or anything else must be written). The master would run
/// them after those requests anyway, so holding them costs at most a reply's trip back; it
/// makes the merged calls as large as the load allows, and a call's fixed cost is most of what
/// a lone acquire costs a master (BENCHMARKS.md §10). Nothing waits on a connection that is
/// not loaded. A held operation's
/// node timeout counts from when it was queued (`queued_at`), so holding it can only make its
/// vote count less, never more; and a held acquire that is never written wrote nothing, so it
/// needs no clean-up (its caller sees the connection close).
pub(super) async fn write_loop(
    mut wr: WriteHalf,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    pipe: Arc<Pipe>,
    mut aborted: watch::Receiver<bool>,
    link: Arc<Link>,
) {
    let mut batch = Batch {
        buf: BytesMut::with_capacity(16 * 1024),
        merging: Merging::default(),
        unconfirmed: Vec::new(),
        confirm_replicas: 0,
        link: link.clone(),
    };
    loop {
        // Something to write, or (while calls are held) an answer that may release them.
        let first = tokio::select! {
            biased;
            _ = aborted.wait_for(|r| *r) => break,
            next = rx.recv() => match next {
                Some(next) => Some(next),
                None => break,
            },
            _ = pipe.answered.notified(), if !batch.merging.is_empty() => None,
        };
        if !batch.gather(first, &mut rx, &pipe.in_flight) {
            break;
        }
        if batch.buf.is_empty() {
            continue;
        }
        pipe.pushed.notify_one();
        let written = tokio::select! {
            written = write_noting_progress(&mut wr, &batch.buf, &pipe) => written,
            _ = aborted.wait_for(|r| *r) => false,
        };
        if !written {
            break;
        }
        batch.buf.clear();
    }
    // Requests queued but never written: callers see their channel close; clean-ups wait for
    // the next connection.
    rx.close();
    while let Ok(out) = rx.try_recv() {
        link.cleanups.keep_unwritten(&link.addr, out);
    }
}

/// Writes all of `buf`, noting progress at every part the master took after the socket's
/// buffer was full (a large request read slowly is progress: [`super::reader`]'s liveness
/// check). A write taken whole needs no note: a socket buffer takes bytes whether or not the
/// master reads them, and the requests in it count from their hand-over anyway. False if the
/// connection failed.
async fn write_noting_progress(wr: &mut WriteHalf, mut buf: &[u8], pipe: &Pipe) -> bool {
    let mut waited = false;
    while !buf.is_empty() {
        match wr.write(buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => {
                if waited {
                    pipe.drained.made(Instant::now());
                }
                waited = true;
                buf = &buf[n..];
            }
        }
    }
    true
}

/// The next write: its bytes, the script calls gathered to merge, and the requests in either
/// that wait for a confirmation.
struct Batch {
    buf: BytesMut,
    merging: Merging,
    unconfirmed: Vec<Unconfirmed>,
    /// The most replicas any of them asks for.
    confirm_replicas: u32,
    /// Its node timeout (a `WAIT` waits at most half of it, so that the requests it confirms
    /// still have time) and its write witness (the floor of the merged lock calls).
    link: Arc<Link>,
}

impl Batch {
    /// Encodes `first` and what else is queued on `rx` (up to [`WRITE_BATCH`] bytes), each
    /// in flight from now on, then the gathered script calls unless they are to be held.
    /// False if the in-flight list cannot be locked (the connection must close).
    fn gather(
        &mut self,
        first: Option<Outgoing>,
        rx: &mut mpsc::UnboundedReceiver<Outgoing>,
        in_flight: &Mutex<VecDeque<AwaitingReply>>,
    ) -> bool {
        let Ok(mut queue) = in_flight.lock() else {
            return false;
        };
        let mut next = first;
        while let Some(out) = next {
            self.put(out, &mut queue);
            next = if self.buf.len() < WRITE_BATCH {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        let hold = self.buf.is_empty()
            && queue.len() >= IN_FLIGHT_BEFORE_HOLDING
            && !self.merging.is_full();
        if !hold {
            self.merging
                .flush(&mut self.buf, &mut queue, &self.link.witness);
            if !self.unconfirmed.is_empty() {
                self.confirm(&mut queue);
            }
        }
        true
    }

    /// Ends the write with a `WAIT` for the requests in it that ask for a confirmation.
    fn confirm(&mut self, queue: &mut VecDeque<AwaitingReply>) {
        let replicas = std::mem::take(&mut self.confirm_replicas);
        // `WAIT … 0` would block for ever.
        let ms = (self.link.node_timeout.get().as_millis() / 2).max(1);
        let wait = encode_command(&["WAIT", &replicas.to_string(), &ms.to_string()]);
        let awaiting = AwaitingReply {
            replies: 1,
            got: Vec::with_capacity(1),
            to: Recipients::Confirm {
                replicas,
                requests: std::mem::take(&mut self.unconfirmed),
            },
            cleanup: None,
            by_body: None,
            confirm: None,
            queued_at: Instant::now(),
        };
        self.write_alone(&wait, awaiting, queue);
    }

    /// Adds one request: a script call to the gathered ones (flushing those first if it cannot
    /// join them), anything else to the buffer after them.
    fn put(&mut self, mut out: Outgoing, queue: &mut VecDeque<AwaitingReply>) {
        if let Some(replicas) = out.confirm {
            if let Some(caller) = out.reply.take() {
                // The reader delivers the answer here; the `WAIT` hands it to the caller.
                let (answer_to, answered) = oneshot::channel();
                out.reply = Some(answer_to);
                self.unconfirmed.push(Unconfirmed { answered, caller });
                self.confirm_replicas = self.confirm_replicas.max(replicas);
            }
        }
        match out.payload {
            Payload::Script {
                script,
                call,
                invoke_by_body,
            } => {
                if !self.merging.takes(&script, invoke_by_body) {
                    self.merging.flush(&mut self.buf, queue, &self.link.witness);
                }
                let caller = Caller {
                    reply: out.reply,
                    confirm: out.confirm,
                };
                self.merging
                    .push(script, call, invoke_by_body, caller, out.queued_at);
            }
            Payload::Commands(payload) => {
                let cleanup = out.cleanup_expires.map(|at| (payload.clone(), at));
                let awaiting =
                    AwaitingReply::one(out.replies, out.reply, out.queued_at, cleanup, None, None);
                self.write_alone(&payload, awaiting, queue);
            }
            Payload::BySha { by_sha, by_body } => {
                let by_body = Some(by_body);
                let awaiting = AwaitingReply::one(
                    out.replies,
                    out.reply,
                    out.queued_at,
                    None,
                    by_body,
                    out.confirm,
                );
                self.write_alone(&by_sha, awaiting, queue);
            }
        }
    }

    /// A request that is not merged: after the calls gathered so far, awaiting its own replies.
    fn write_alone(
        &mut self,
        bytes: &[u8],
        awaiting: AwaitingReply,
        queue: &mut VecDeque<AwaitingReply>,
    ) {
        self.merging.flush(&mut self.buf, queue, &self.link.witness);
        self.buf.extend_from_slice(bytes);
        queue.push_back(awaiting);
    }
}

#[cfg(test)]
mod tests {
    //! Deterministic: in-memory pipes to a scripted master, and tokio's paused clock.
    use super::super::tests::{connected, ping, LIMIT, NODE_TIMEOUT};
    use super::super::{Floor, Link, NoReply, Pending, SharedScript};
    use crate::fake_master::{command, until, FakeMaster};
    use crate::lock::lock_script;
    use crate::on_master::{ARMED_KEY, LOCK_SCRIPT, TOKEN_KEY_PREFIX, WITNESS_KEY};
    use crate::protocol::{CallBounds, Reply, ScriptCall};
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::watch;

    /// A link to `fake` that loaded the lock script, as the health monitor does.
    async fn loaded(fake: &Arc<FakeMaster>) -> (Arc<Link>, watch::Sender<bool>) {
        let (link, stop) = connected(fake).await;
        let load = command(&["SCRIPT", "LOAD", LOCK_SCRIPT.text()]);
        assert!(matches!(
            link.send(load, 1).wait().await,
            Ok(Reply::Bulk(_))
        ));
        (link, stop)
    }

    /// Releases of keys nobody holds (each answers 0), as the lock operations the links merge
    /// (the calls of one script, the same `Arc`, as the acquirer sends).
    fn releases(link: &Link, n: usize) -> Vec<Pending> {
        static SCRIPT: std::sync::LazyLock<Arc<SharedScript>> =
            std::sync::LazyLock::new(|| lock_script(Floor::Witness));
        let script = &*SCRIPT;
        (0..n)
            .map(|i| {
                let key = format!("k{i}");
                let call = ScriptCall::new(&[&[key.as_bytes()]], &[b"r", b"v"]);
                link.send_script(script.clone(), call, None)
            })
            .collect()
    }

    /// Stalls `fake` and leaves two requests written to it and unanswered.
    async fn two_unanswered(fake: &FakeMaster, link: &Link) -> [Pending; 2] {
        fake.stall();
        let pings = [link.send(ping(), 1), link.send(ping(), 1)];
        tokio::time::sleep(Duration::from_millis(1)).await;
        pings
    }

    #[tokio::test(start_paused = true)]
    async fn lock_operations_behind_two_unanswered_requests_wait_and_leave_as_one_call() {
        let fake = FakeMaster::new();
        let (link, _stop) = loaded(&fake).await;
        // Not loaded: a lone operation is written at once, as its own call.
        let alone = releases(&link, 1).pop().expect("one");
        assert_eq!(alone.wait().await, Ok(Reply::Integer(0)));
        assert_eq!(fake.acquires(), 1);
        let pings = two_unanswered(&fake, &link).await;
        // What comes now is held, even across the writer's turns, and leaves as one call once
        // an answer comes.
        let mut held = Vec::new();
        for _ in 0..5 {
            held.extend(releases(&link, 1));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(NODE_TIMEOUT / 4).await;
        fake.resume();
        for pending in pings {
            assert_eq!(pending.wait().await, Ok(Reply::simple("PONG")));
        }
        for pending in held {
            assert_eq!(pending.wait().await, Ok(Reply::Integer(0)));
        }
        assert_eq!(fake.acquires(), 2, "{:?}", fake.log());
    }

    /// The `WAIT`s the master ran.
    fn waits(fake: &FakeMaster) -> usize {
        fake.log()
            .iter()
            .filter(|(_, c)| c.starts_with("WAIT"))
            .count()
    }

    #[tokio::test(start_paused = true)]
    async fn requests_asking_for_a_confirmation_share_one_wait_after_their_write() {
        let fake = FakeMaster::new();
        let (link, _stop) = loaded(&fake).await;
        fake.set_replicas(1);
        // Queued together: one write, ended by one `WAIT` for the three that ask for it.
        let confirmed: Vec<Pending> = (0..3)
            .map(|_| link.send_commands(ping(), 1, Some(1)))
            .collect();
        let plain = link.send(ping(), 1);
        for pending in confirmed {
            assert_eq!(pending.wait().await, Ok(Reply::simple("PONG")));
        }
        assert_eq!(plain.wait().await, Ok(Reply::simple("PONG")));
        assert_eq!(waits(&fake), 1, "{:?}", fake.log());
        let log = fake.log();
        assert!(
            log.last().is_some_and(|(_, c)| c.starts_with("WAIT 1")),
            "{log:?}"
        );
        // Fewer replicas than asked for: the answer does not count; a request that asked for
        // no confirmation is answered as ever.
        fake.set_replicas(0);
        let confirmed = link.send_commands(ping(), 1, Some(1));
        let plain = link.send(ping(), 1);
        assert_eq!(confirmed.wait().await, Err(NoReply::Unconfirmed));
        assert_eq!(plain.wait().await, Ok(Reply::simple("PONG")));
        // Nothing asks: no `WAIT`.
        let before = waits(&fake);
        assert_eq!(link.send(ping(), 1).wait().await, Ok(Reply::simple("PONG")));
        assert_eq!(waits(&fake), before);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_operation_sent_again_with_the_body_waits_for_a_wait_of_its_own() {
        static SCRIPT: std::sync::LazyLock<Arc<SharedScript>> =
            std::sync::LazyLock::new(|| lock_script(Floor::Witness));
        let fake = FakeMaster::new();
        let (link, _stop) = loaded(&fake).await;
        fake.set_replicas(1);
        let release = || ScriptCall::new(&[&[b"k".as_slice()]], &[b"r", b"v"]);
        // `NOSCRIPT`: the call goes again with the body, after the `WAIT` that followed it,
        // which cannot vouch for it; a `WAIT` after the body's call does.
        fake.forget_scripts();
        let resent = link.send_script(SCRIPT.clone(), release(), Some(1));
        assert_eq!(resent.wait().await, Ok(Reply::Integer(0)));
        let log: Vec<String> = fake.log().into_iter().map(|(_, c)| c).collect();
        let commands: Vec<&str> = log
            .iter()
            .skip(1)
            .map(|c| c.split(' ').next().unwrap_or(""))
            .collect();
        assert_eq!(commands, ["EVALSHA", "WAIT", "EVAL", "WAIT"], "{log:?}");
        // Its confirmation is its own: without the replica, the body's call is unconfirmed.
        fake.forget_scripts();
        fake.set_replicas(0);
        let resent = link.send_script(SCRIPT.clone(), release(), Some(1));
        assert_eq!(resent.wait().await, Err(NoReply::Unconfirmed));
    }

    /// An acquire of `key` as the lock script takes it: record, value, PX; its bounds a far
    /// deadline, no earliest clock, the counter's PX.
    fn acquire_of(key: &str) -> ScriptCall {
        ScriptCall::with_bounds(
            &[&[key.as_bytes()]],
            &[b"0000000000000001:t", b"v", b"20000"],
            CallBounds {
                deadline: 99_999_999_999_999,
                earliest: 0,
                counter_life: 60_000,
            },
        )
    }

    /// Each merged lock call leads with the link's highest write witness: once the master's
    /// witness is behind it (its data replaced in place), no acquire takes a key (`-1`) and
    /// releases still run; with the floor off (the tests' negative control) the acquire takes
    /// it.
    #[tokio::test(start_paused = true)]
    async fn a_master_whose_witness_is_behind_the_floor_takes_no_key() {
        let fake = FakeMaster::new();
        let (link, _stop) = loaded(&fake).await;
        fake.set(ARMED_KEY, "1");
        let acquire = || acquire_of("k1");
        let script = lock_script(Floor::Witness);
        let granted = link.send_script(script.clone(), acquire(), None);
        assert_eq!(granted.wait().await, Ok(Reply::ok()));
        assert_eq!(link.witness.floor(), 1);
        // Data replaced in place: the lock, its counter and the witness gone.
        for gone in [WITNESS_KEY, "k1", &format!("{TOKEN_KEY_PREFIX}k1")] {
            fake.wipe_key(gone);
        }
        fake.set("k0", "v");
        let refused = link.send_script(script.clone(), acquire(), None);
        let release = ScriptCall::new(&[&[b"k0"]], &[b"r", b"v"]);
        let released = link.send_script(script, release, None);
        assert_eq!(refused.wait().await, Ok(Reply::Integer(-1)));
        assert_eq!(released.wait().await, Ok(Reply::Integer(1)));
        assert_eq!((fake.get("k1"), fake.get("k0")), (None, None));
        // The floor off: 0 leads, which every witness passes.
        let off = link.send_script(lock_script(Floor::Off), acquire(), None);
        assert_eq!(off.wait().await, Ok(Reply::ok()));
        assert_eq!(fake.get("k1").as_deref(), Some(b"v".as_slice()));
    }

    /// Each merged lock call's reply ends with the master's clock, which the link's
    /// [`super::super::CallClock`] judges (given the clock and when the call was written and
    /// answered) before the answers are handed over: while it says "ahead", the acquires the
    /// call took answer [`crate::redlock::CLOCK_AHEAD`] (no vote), other answers are as ever;
    /// callers never see the clock element.
    #[tokio::test(start_paused = true)]
    async fn a_lock_call_whose_clock_ran_ahead_grants_no_vote() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let fake = FakeMaster::new();
        let (link, _stop) = loaded(&fake).await;
        fake.set(ARMED_KEY, "1");
        let ahead = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(AtomicU64::new(0));
        let (judge_ahead, judge_seen) = (ahead.clone(), seen.clone());
        link.call_clock
            .install(Box::new(move |master_us, written, read| {
                assert!(written <= read);
                judge_seen.store(master_us, Ordering::Relaxed);
                judge_ahead.load(Ordering::Relaxed)
            }));
        let acquire = acquire_of;
        let script = lock_script(Floor::Witness);
        let granted = link.send_script(script.clone(), acquire("k1"), None);
        assert_eq!(granted.wait().await, Ok(Reply::ok()));
        assert!(seen.load(Ordering::Relaxed) > 1_000_000_000_000_000);
        ahead.store(true, Ordering::Relaxed);
        fake.set("k0", "v");
        let refused = link.send_script(script.clone(), acquire("k2"), None);
        let held = link.send_script(script.clone(), acquire("k1"), None);
        let released = link.send_script(script, ScriptCall::new(&[&[b"k0"]], &[b"r", b"v"]), None);
        assert_eq!(refused.wait().await, Ok(crate::redlock::CLOCK_AHEAD));
        // A refusal (here the token, not above k1's counter) is handed over as it is.
        let refusal = Reply::Array(vec![Reply::Integer(-4), Reply::Integer(1)]);
        assert_eq!(held.wait().await, Ok(refusal));
        assert_eq!(released.wait().await, Ok(Reply::Integer(1)));
        // The master took the key (the rollback undoes it) and counted its witness.
        assert_eq!(fake.get("k2").as_deref(), Some(b"v".as_slice()));
        assert_eq!(link.witness.floor(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn held_lock_operations_are_never_written_once_their_connection_is_retired() {
        let fake = FakeMaster::new();
        let (link, _stop) = loaded(&fake).await;
        let pings = two_unanswered(&fake, &link).await;
        let held = releases(&link, 3);
        for pending in pings {
            assert_eq!(pending.wait().await, Err(NoReply::Timeout));
        }
        for pending in held {
            assert!(pending.wait().await.is_err());
        }
        // Retired once no byte moved for the liveness window (the callers gave up long before).
        until(LIMIT, || link.retired_count() == 1).await;
        fake.resume();
        until(LIMIT, || link.connect_count() == 2 && link.is_connected()).await;
        assert_eq!(link.send(ping(), 1).wait().await, Ok(Reply::simple("PONG")));
        assert_eq!(fake.acquires(), 0, "{:?}", fake.log());
    }
}

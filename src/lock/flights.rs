//! Per-key single flight of acquires on this proxy: while one acquire of a key is out on the
//! masters, further acquires of that key queue; when it completes they go out as **one**
//! fan-out (the first one's value), and the others get null, which is what one Redis answers
//! to every `SET NX` but one. This bounds master work under hot-key polling (a PHP lock class
//! in common use polls every 5 ms) to one fan-out per round trip, however many pollers.
//!
//! Invariants:
//! - **Every acquire reaches the masters from its own client's connection**: the batch's
//!   fan-out is sent by the future of the batch's first member, polled by that member's
//!   connection, never by a task of its own. A connection polls its requests in order and
//!   every fan-out takes a permit from one fair semaphore before it sends, so an acquire that
//!   waited in a queue still reaches the masters after every earlier request of its client (a
//!   pipelined `GET k` before `SET k … NX` never sees the `SET`'s value). The same holds for
//!   a member that has to try for itself.
//! - **Linearizability**: a batch is sent only after all its members arrived, and each member
//!   is answered after the batch's votes are in, so each answer reflects master state from
//!   within that member's own request interval. Members are answered null only when the batch
//!   was granted, when a majority of masters reported the key held (null votes), or when no
//!   majority answered in time; a batch refused for any other reason (validity, errors) leaves
//!   every member to try for itself.
//! - **No key waits on a vanished client**: whoever leads (or was promoted to lead) hands the
//!   next batch on however its future ends, completed or dropped with its connection; members
//!   of a batch whose leader vanished try for themselves.

use super::acquire::{decide, Attempt};
use super::{AcquireResult, Acquirer};
use crate::error::ProxyError;
use crate::lease::Outcome;
use crate::protocol::Reply;
use bytes::Bytes;
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use futures::future::BoxFuture;
use std::sync::Arc;
use tokio::sync::oneshot;

/// How an acquire started.
pub enum Started {
    /// No acquire of the key was in flight: this one goes out at once. The future must be
    /// polled by the caller's connection (it reaches the masters in the client's order).
    Leading(BoxFuture<'static, Outcome>),
    /// Queued behind the acquire of the key in flight: it reaches the masters later than its
    /// place in the client's pipeline, so nothing later from that client may start before it.
    Queued(BoxFuture<'static, Outcome>),
}

/// What a queued acquire is told when its turn comes.
enum Turn {
    /// Lead the next batch: the flight of the key, with the batch's other members.
    Lead(Flight),
    /// The batch's refusal says nothing about the key: acquire on your own.
    TryYourself,
    /// Answered by the batch (with how the batch ended for this member).
    Done(Outcome, AcquireResult),
}

/// A queued acquire, as the flight sees it: where its turn goes.
type Member = oneshot::Sender<Turn>;

/// Key → the acquires queued behind the one in flight (present while one is in flight).
/// Hashed with foldhash, seeded per process: the map is looked up twice per acquire, and
/// SipHash cost about 300 instructions of that (BENCHMARKS.md §11); it holds only the keys
/// with an acquire in flight, bounded by the requests in flight.
#[derive(Default)]
pub(super) struct Flights {
    keys: DashMap<Bytes, Vec<Member>, foldhash::fast::RandomState>,
}

/// Starts an acquire of `attempt.key` ([`Acquirer::acquire`]): at once if none is in flight
/// (the caller leads), or queued behind the one in flight (the returned future waits for its
/// turn).
pub(super) fn start(acquirer: &Arc<Acquirer>, attempt: Attempt) -> Started {
    // The map's shard lock is held only inside this block, never across an await.
    let turn = match acquirer.flights.keys.entry(attempt.key.clone()) {
        Entry::Vacant(slot) => {
            slot.insert(Vec::new());
            None
        }
        Entry::Occupied(mut queue) => {
            let (member, turn) = oneshot::channel();
            queue.get_mut().push(member);
            Some(turn)
        }
    };
    let acquirer = acquirer.clone();
    match turn {
        None => {
            let flight = Flight::new(acquirer.clone(), attempt.key.clone(), Vec::new());
            Started::Leading(Box::pin(lead(acquirer, attempt, flight)))
        }
        Some(turn) => Started::Queued(Box::pin(async move {
            match turn.await {
                Ok(Turn::Lead(flight)) => lead(acquirer, attempt, flight).await,
                Ok(Turn::TryYourself) => decide(&acquirer, attempt).await.finish().await,
                Ok(Turn::Done(outcome, result)) => {
                    acquirer.stats.record(result, attempt.received_at);
                    outcome
                }
                Err(_) => Reply::from(ProxyError::AcquireAbandoned).into(),
            }
        })),
    }
}

/// Runs an acquire as the leader of its key's flight, for itself and the flight's members.
async fn lead(acquirer: Arc<Acquirer>, attempt: Attempt, mut flight: Flight) -> Outcome {
    let decided = decide(&acquirer, attempt).await;
    for member in std::mem::take(&mut flight.members) {
        // A member of a granted batch finds the key held by its leader.
        let result = match decided.result {
            AcquireResult::Granted => AcquireResult::Contended,
            other => other,
        };
        let turn = if decided.settled {
            Turn::Done(Reply::Null.into(), result)
        } else {
            Turn::TryYourself
        };
        let _ = member.send(turn);
    }
    // The next batch goes out as soon as this one is decided, not after its clean-up.
    drop(flight);
    decided.finish().await
}

/// Hands the key's queued acquires on as the next batch (its first live member leads), or
/// marks the key idle.
fn next_batch(acquirer: &Arc<Acquirer>, key: Bytes) {
    loop {
        let batch = match acquirer.flights.keys.entry(key.clone()) {
            Entry::Occupied(mut queue) if !queue.get().is_empty() => {
                std::mem::take(queue.get_mut())
            }
            Entry::Occupied(queue) => {
                queue.remove();
                return;
            }
            Entry::Vacant(_) => return,
        };
        let mut batch = batch.into_iter();
        while let Some(leader) = batch.next() {
            let flight = Flight::new(acquirer.clone(), key.clone(), batch.collect());
            match leader.send(Turn::Lead(flight)) {
                Ok(()) => return,
                // That client is gone: the next member leads.
                Err(turn) => batch = turn.into_members().into_iter(),
            }
        }
        // Every member had gone: the key is idle, or has new arrivals.
    }
}

impl Turn {
    /// The members of a flight that could not be handed over.
    fn into_members(self) -> Vec<Member> {
        match self {
            Turn::Lead(flight) => flight.disarm(),
            _ => Vec::new(),
        }
    }
}

/// The lead of a key's flight, and the members the leader answers for. However it ends (its
/// leader completed, its leader's future dropped with its client, or it was never received),
/// the members it still answers for try for themselves and the queued acquires of the key go
/// on, so a key never waits on a vanished leader.
struct Flight {
    acquirer: Arc<Acquirer>,
    /// `None` once disarmed.
    key: Option<Bytes>,
    members: Vec<Member>,
}

impl Flight {
    fn new(acquirer: Arc<Acquirer>, key: Bytes, members: Vec<Member>) -> Flight {
        Flight {
            acquirer,
            key: Some(key),
            members,
        }
    }

    /// Takes the members back without handing anything on.
    fn disarm(mut self) -> Vec<Member> {
        self.key = None;
        std::mem::take(&mut self.members)
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        for member in self.members.drain(..) {
            let _ = member.send(Turn::TryYourself);
        }
        next_batch(&self.acquirer, key);
    }
}

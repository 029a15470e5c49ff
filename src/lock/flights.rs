//! Per-key single flight of acquires on this proxy: while one acquire of a key is out on the
//! masters, further acquires of that key queue; when it completes they go out as **one**
//! fan-out (the first one's value), and the others get null, which is what one Redis answers
//! to every `SET NX` but one. This bounds master work under hot-key polling (a PHP lock class
//! in common use polls every 5 ms) to one fan-out per round trip, however many pollers.
//!
//! Linearizability: a batch is sent only after all its members arrived, and each member is
//! answered after the batch's votes are in, so each answer reflects master state from within
//! that member's own request interval. Followers are answered null only when the batch leader
//! was granted, when a majority of masters reported the key held (null votes), or when no
//! majority answered in time; a leader refused for any other reason (validity, errors)
//! leaves its followers to try themselves.

use super::acquire::{decide, Attempt};
use super::Acquirer;
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
    /// No acquire of the key was in flight: this one went out at once. The future must be
    /// polled by the caller (it reaches the masters in the client's request order).
    Leading(BoxFuture<'static, Outcome>),
    /// Queued behind the acquire of the key in flight: it reaches the masters later than its
    /// place in the client's pipeline, so nothing later from that client may start before it.
    Queued(BoxFuture<'static, Outcome>),
}

/// A queued acquire and where its outcome goes.
struct Waiter {
    attempt: Attempt,
    reply: oneshot::Sender<Outcome>,
}

/// Key → the acquires queued behind the one in flight (present while one is in flight).
#[derive(Default)]
pub(super) struct Flights {
    keys: DashMap<Bytes, Vec<Waiter>>,
}

impl Acquirer {
    /// Starts an acquire of `attempt.key`: at once if none is in flight (the caller leads),
    /// or queued behind the one in flight (the returned future waits for the batch).
    pub fn acquire(self: &Arc<Self>, attempt: Attempt) -> Started {
        // The map's shard lock is held only inside this block, never across an await.
        let queued = match self.flights.keys.entry(attempt.key.clone()) {
            Entry::Vacant(slot) => {
                slot.insert(Vec::new());
                Err(attempt)
            }
            Entry::Occupied(mut queue) => {
                let (reply, receiver) = oneshot::channel();
                queue.get_mut().push(Waiter { attempt, reply });
                Ok(receiver)
            }
        };
        match queued {
            Ok(receiver) => Started::Queued(Box::pin(async move {
                receiver
                    .await
                    .unwrap_or_else(|_| Reply::from(ProxyError::AcquireAbandoned).into())
            })),
            Err(attempt) => self.lead(attempt),
        }
    }

    /// Runs an acquire as the leader of its key's flight.
    fn lead(self: &Arc<Self>, attempt: Attempt) -> Started {
        let guard = FlightGuard {
            acquirer: self.clone(),
            key: attempt.key.clone(),
        };
        let acquirer = self.clone();
        // Polled by the client's connection, whose loop never blocks on the client's socket
        // (see `connection`), so the key's flight progresses whatever the client does. (A
        // task of its own would reach the masters out of the client's request order.)
        Started::Leading(Box::pin(async move {
            let decided = decide(&acquirer, attempt).await;
            // The queued acquires of the key go on as soon as this one is decided; its own
            // clean-up does not hold them up.
            drop(guard);
            decided.finish().await
        }))
    }

    /// After a flight of `key`: sends the queued acquires as the next batch, or marks the
    /// key idle.
    fn next_batch(self: Arc<Self>, key: Bytes) {
        let batch = match self.flights.keys.entry(key) {
            Entry::Occupied(mut queue) if !queue.get().is_empty() => {
                std::mem::take(queue.get_mut())
            }
            Entry::Occupied(queue) => {
                queue.remove();
                return;
            }
            Entry::Vacant(_) => return,
        };
        tokio::spawn(async move {
            let key = batch[0].attempt.key.clone();
            let mut batch = batch.into_iter();
            let Some(leader) = batch.next() else { return };
            let decided = decide(&self, leader.attempt).await;
            let mut decisions = Vec::new();
            if decided.settled {
                for follower in batch {
                    let _ = follower.reply.send(Reply::Null.into());
                }
            } else {
                // The leader's refusal says nothing about the key (timeouts, validity): every
                // follower tries for itself, all at once, so waiting does not grow with the
                // queue. Still one of them at most can be granted.
                let tries = batch.map(|follower| {
                    let acquirer = self.clone();
                    async move { (follower.reply, decide(&acquirer, follower.attempt).await) }
                });
                decisions = futures::future::join_all(tries).await;
            }
            decisions.push((leader.reply, decided));
            // The next batch goes out once this one is decided, not after its clean-ups.
            self.next_batch(key);
            let finishes = decisions.into_iter().map(|(reply, decided)| async move {
                let _ = reply.send(decided.finish().await);
            });
            futures::future::join_all(finishes).await;
        });
    }
}

/// Ends a flight however its leader ends (completed, or dropped with its client): the queued
/// acquires of the key then go out, so a key is never left waiting on a vanished leader.
struct FlightGuard {
    acquirer: Arc<Acquirer>,
    key: Bytes,
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_ok() {
            let key = std::mem::take(&mut self.key);
            self.acquirer.clone().next_batch(key);
        }
    }
}

//! What a request produces once its work is done ([`Outcome`]): a reply, or a [`Lease`], a
//! reply that promises a lock only until a deadline. The connection writes a lease's grant
//! only while its deadline has not passed (docs/SAFETY.md, "Why it holds"), and rolls it back
//! otherwise.

use crate::protocol::Reply;
use futures::future::BoxFuture;
#[cfg(test)]
use std::future::Future;
use tokio::time::Instant;

/// What a command produces.
pub enum Outcome {
    Reply(Reply),
    /// A lease (a lock acquire or extend) that is only valid until its deadline.
    Lease(Lease),
}

/// A reply that promises a lease: `granted` may be written only while
/// `Instant::now() < deadline`; otherwise the writer runs `rollback` (if any) and writes
/// `expired`.
pub struct Lease {
    pub deadline: Instant,
    pub granted: Granted,
    pub expired: Reply,
    pub rollback: Option<Box<dyn Rollback>>,
}

/// The undo of a grant the client was not given. A grant carries the plan, and the future is
/// built only if it runs (rarely): building and boxing it for every grant cost an allocation
/// and a copy of its state (BENCHMARKS.md §11).
pub trait Rollback: Send {
    fn run(self: Box<Self>) -> BoxFuture<'static, ()>;
}

/// The tests' rollbacks: any future.
#[cfg(test)]
impl<F: Future<Output = ()> + Send + 'static> Rollback for F {
    fn run(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(*self)
    }
}

/// What a grant answers.
pub enum Granted {
    Reply(Reply),
    /// `[token, validity_ms]`, the validity counted when the reply is encoded (`LOCK.ACQUIRE`).
    TokenAndValidity(u64),
    /// `validity_ms`, counted when the reply is encoded (`LOCK.EXTEND`).
    Validity,
}

impl Granted {
    /// The reply, encoded at `now`, for a lease valid until `deadline`.
    pub fn reply(self, now: Instant, deadline: Instant) -> Reply {
        let left = Reply::Integer(deadline.saturating_duration_since(now).as_millis() as i64);
        match self {
            Granted::Reply(reply) => reply,
            Granted::TokenAndValidity(token) => {
                Reply::Array(vec![Reply::Integer(token as i64), left])
            }
            Granted::Validity => left,
        }
    }
}

impl Lease {
    /// The reply to write now.
    pub async fn settle(self) -> Reply {
        let now = Instant::now();
        if now < self.deadline {
            return self.granted.reply(now, self.deadline);
        }
        if let Some(rollback) = self.rollback {
            rollback.run().await;
        }
        self.expired
    }
}

impl From<Reply> for Outcome {
    fn from(reply: Reply) -> Outcome {
        Outcome::Reply(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    fn lease(deadline: Instant, rolled_back: &Arc<AtomicBool>) -> Lease {
        let flag = rolled_back.clone();
        Lease {
            deadline,
            granted: Granted::Reply(Reply::ok()),
            expired: Reply::Null,
            rollback: Some(Box::new(async move {
                // A rollback takes time (its clean-ups' confirmations): the refusal waits.
                tokio::time::sleep(Duration::from_millis(5)).await;
                flag.store(true, Ordering::SeqCst);
            })),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_granted_until_its_deadline_and_rolled_back_from_it() {
        let deadline = Instant::now() + Duration::from_millis(100);
        let rolled_back = Arc::new(AtomicBool::new(false));
        tokio::time::sleep(Duration::from_millis(99)).await;
        assert_eq!(lease(deadline, &rolled_back).settle().await, Reply::ok());
        assert!(!rolled_back.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(lease(deadline, &rolled_back).settle().await, Reply::Null);
        assert!(
            rolled_back.load(Ordering::SeqCst),
            "refused before its rollback ran"
        );
    }
}

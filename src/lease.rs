//! What a request produces once its work is done ([`Outcome`]): a reply, or a [`Lease`], a
//! reply that promises a lock only until a deadline. The connection writes a lease's grant
//! only while its deadline has not passed (docs/SAFETY.md, "Why it holds"), and rolls it back
//! otherwise.

use crate::protocol::Reply;
use futures::future::BoxFuture;
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
    pub granted: Reply,
    pub expired: Reply,
    pub rollback: Option<BoxFuture<'static, ()>>,
}

impl Lease {
    /// The reply to write now.
    pub async fn settle(self) -> Reply {
        if Instant::now() < self.deadline {
            return self.granted;
        }
        if let Some(rollback) = self.rollback {
            rollback.await;
        }
        self.expired
    }
}

impl From<Reply> for Outcome {
    fn from(reply: Reply) -> Outcome {
        Outcome::Reply(reply)
    }
}

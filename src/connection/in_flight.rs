//! The requests of one connection between admission and reply ([`InFlight`]), in the order
//! they arrived, each in its [`Slot`].
//!
//! Invariants:
//! - Every request, local or fanned out, gets a slot, so replies leave in exactly the order
//!   requests arrived, whatever order they complete in.
//! - A barrier (a request that reaches the masters later than its place in the pipeline: an
//!   acquire queued behind another acquire of the same key) holds admission back: from its
//!   push until its reply is taken, [`InFlight::accepts`] refuses every further request, so
//!   nothing after it is dispatched before it is answered.
//! - Requests left when the connection ends are driven to completion in the background
//!   ([`abandon_in_flight`]), every lease among them rolled back, never left held until its
//!   TTL.

use crate::lease::{Lease, Outcome};
use crate::protocol::{Protocol, Reply};
use futures::future::BoxFuture;
use futures::stream::{FuturesOrdered, StreamExt};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A request's place in the reply order: answered already, or waiting on the masters.
pub(super) enum Slot {
    Ready(Option<(Protocol, Outcome)>),
    Pending(Protocol, BoxFuture<'static, Outcome>),
}

impl Slot {
    /// A request answered at once with `reply`.
    pub(super) fn ready(protocol: Protocol, reply: Reply) -> Slot {
        Slot::Ready(Some((protocol, Outcome::Reply(reply))))
    }
}

impl Future for Slot {
    type Output = (Protocol, Outcome);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Slot::Ready(done) => match done.take() {
                Some(out) => Poll::Ready(out),
                None => Poll::Pending,
            },
            Slot::Pending(protocol, fut) => fut.as_mut().poll(cx).map(|o| (*protocol, o)),
        }
    }
}

/// The requests in flight, in reply order: `head`, then `rest`. A lone request (the usual case
/// without pipelining) is `head`, polled directly with the connection's waker: no task
/// allocation, ready queue and per-request waker of a `FuturesOrdered`. `head` is set only
/// while `rest` is empty; a second request moves it to the front of `rest`.
#[derive(Default)]
pub(super) struct InFlight {
    head: Option<Slot>,
    rest: FuturesOrdered<Slot>,
    /// Requests pushed and answered (their replies taken) so far.
    pushed: u64,
    answered: u64,
    /// The push number (from 0) of the last barrier: pending until that many and one more
    /// replies were taken. Replies leave in order, so that is exactly when it is answered.
    barrier: Option<u64>,
}

impl InFlight {
    pub(super) fn len(&self) -> usize {
        usize::from(self.head.is_some()) + self.rest.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether one more request may be dispatched: fewer than `max` are in flight (the
    /// backpressure bound) and no barrier waits for its reply.
    pub(super) fn accepts(&self, max: usize) -> bool {
        !self.barrier_pending() && self.len() < max
    }

    /// Whether a barrier waits for its reply.
    pub(super) fn barrier_pending(&self) -> bool {
        self.barrier.is_some_and(|b| self.answered <= b)
    }

    pub(super) fn push(&mut self, slot: Slot) {
        self.pushed += 1;
        if self.is_empty() {
            self.head = Some(slot);
            return;
        }
        if let Some(head) = self.head.take() {
            self.rest.push_front(head);
        }
        self.rest.push_back(slot);
    }

    /// Pushes a barrier: nothing more is accepted until its reply is taken.
    pub(super) fn push_barrier(&mut self, slot: Slot) {
        self.barrier = Some(self.pushed);
        self.push(slot);
    }

    /// The next reply in order, once it is ready.
    pub(super) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<(Protocol, Outcome)>> {
        let next = match &mut self.head {
            Some(head) => {
                let done = std::task::ready!(Pin::new(head).poll(cx));
                self.head = None;
                Some(done)
            }
            None => std::task::ready!(self.rest.poll_next_unpin(cx)),
        };
        self.answered += u64::from(next.is_some());
        Poll::Ready(next)
    }

    pub(super) fn next(&mut self) -> impl Future<Output = Option<(Protocol, Outcome)>> + '_ {
        std::future::poll_fn(move |cx| self.poll_next(cx))
    }

    /// Every request still in flight, in order.
    pub(super) fn into_ordered(self) -> FuturesOrdered<Slot> {
        let mut rest = self.rest;
        if let Some(head) = self.head {
            rest.push_front(head);
        }
        rest
    }
}

/// Drives the requests of a closed connection to completion, so a lease granted to a client
/// that is gone is rolled back rather than left held until its TTL.
pub(super) async fn abandon_in_flight(mut in_flight: FuturesOrdered<Slot>) {
    while let Some((_, outcome)) = in_flight.next().await {
        if let Outcome::Lease(Lease {
            rollback: Some(rollback),
            ..
        }) = outcome
        {
            tokio::spawn(rollback.run());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    fn reply(text: &'static str) -> Outcome {
        Outcome::Reply(Reply::simple(text))
    }

    #[tokio::test]
    async fn replies_leave_in_request_order_whatever_order_they_complete_in() {
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let mut in_flight = InFlight::default();
        // Alone, the first request is the head; the next ones move it to the front of the rest.
        in_flight.push(Slot::Pending(
            Protocol::Resp2,
            Box::pin(async move {
                let _ = released.await;
                reply("first")
            }),
        ));
        in_flight.push(Slot::Ready(Some((Protocol::Resp2, reply("second")))));
        in_flight.push(Slot::Pending(
            Protocol::Resp2,
            Box::pin(async move { reply("third") }),
        ));
        assert_eq!(in_flight.len(), 3);
        assert!(
            in_flight.next().now_or_never().is_none(),
            "the first is not done"
        );
        release.send(()).unwrap();
        let mut order = Vec::new();
        while let Some((_, Outcome::Reply(Reply::Simple(text)))) = in_flight.next().await {
            order.push(text);
        }
        assert_eq!(order, ["first", "second", "third"]);
        assert!(in_flight.is_empty());
    }

    #[tokio::test]
    async fn a_barrier_refuses_further_requests_until_its_reply_is_taken() {
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let mut in_flight = InFlight::default();
        in_flight.push(Slot::ready(Protocol::Resp2, Reply::simple("before")));
        assert!(in_flight.accepts(8));
        in_flight.push_barrier(Slot::Pending(
            Protocol::Resp2,
            Box::pin(async move {
                let _ = released.await;
                reply("barrier")
            }),
        ));
        assert!(!in_flight.accepts(8), "the barrier is pending");
        assert!(in_flight.next().now_or_never().is_some(), "the first reply");
        assert!(
            !in_flight.accepts(8),
            "taking an earlier reply does not lift it"
        );
        assert!(in_flight.next().now_or_never().is_none());
        release.send(()).unwrap();
        assert!(in_flight.next().await.is_some());
        assert!(
            in_flight.accepts(8),
            "answered: requests are admitted again"
        );
        // The in-flight bound, apart from any barrier.
        in_flight.push(Slot::ready(Protocol::Resp2, Reply::ok()));
        assert!(!in_flight.accepts(1));
    }
}

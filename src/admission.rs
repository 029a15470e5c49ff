//! Admission of fan-outs ([`Admission`]): an adaptive limit on the fan-outs in progress, so
//! that the masters' connections carry no more than the proxy can turn around within a node
//! timeout, and the bounded wait of an acquire beyond it (issue 38).
//!
//! Invariants:
//! - At most [`Admission::limit`] fan-outs are in progress (each holds an [`Admitted`]); the
//!   limit stays within [`MIN_FANOUTS`, `MAX_FANOUTS`].
//! - The limit follows AIMD on how long admitted fan-outs take to be decided ([`next_limit`],
//!   pure): one decided within half a node timeout adds `1/limit`, one slower is congestion and
//!   takes 10 % off, at most once per half node timeout (one burst of slow fan-outs is one
//!   signal). One fan-out in [`SAMPLE_EVERY`] is timed (and weighs as many): two clock reads
//!   and a lock per fan-out cost the proxy 2–3 % of its instructions per request. Requests beyond the limit wait in the proxy, outside every node timeout (a node
//!   timeout counts from when a request is handed to a master's connection).
//! - Waiting for admission is fair (first come, first admitted). Only an acquire is ever
//!   refused ([`Admission::admit_by`]): at once when [`QUEUE_LIMITS`] times as many fan-outs
//!   already wait as the limit lets run (the queue is bounded, so its wait stays a few
//!   decisions long and its memory bounded), or past its own bound; it then asks no master and is told to retry (`TRYAGAIN`,
//!   docs/PROTOCOL.md §4). Releases, clean-ups and reads always wait their turn.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::{timeout_at, Instant};

/// Most fan-outs in progress at once: enough to keep every master's connection busy (a fan-out
/// is one pipelined request per master, merged with the others into a few script calls).
pub const MAX_FANOUTS: usize = 256;
/// Fewest fan-outs the limit allows: a congested proxy still serves this many at once.
pub const MIN_FANOUTS: usize = 16;
/// One fan-out in this many is timed for the limit.
pub const SAMPLE_EVERY: usize = 16;
/// How many limits' worth of fan-outs may wait before an acquire is refused at once: enough for
/// clients that pipeline deeply (50 connections × 16 requests are 800 at once, no overload),
/// few enough that the wait stays a few decisions long (2,048 waiting at 35,000 grants a second
/// is 60 ms) and its memory bounded.
pub const QUEUE_LIMITS: usize = 8;

/// How long an acquire of a lock of `ttl` may wait for admission: a quarter of its TTL, at
/// most a second. Admitted later, it would leave its client less than three quarters of the
/// lease, or be refused as expired, a null that reads as "held"; told to retry instead, the
/// client loses nothing (no master was asked).
pub fn admission_wait(ttl: Duration) -> Duration {
    (ttl / 4).min(Duration::from_secs(1))
}

/// The limit after a fan-out admitted under `limit` was decided in `took`; `growth` carries
/// the fractional additive increase between calls. `may_decrease`: no decrease was made in
/// the last half node timeout.
pub fn next_limit(
    limit: usize,
    growth: &mut usize,
    took: Duration,
    node_timeout: Duration,
    may_decrease: bool,
) -> usize {
    if took > node_timeout / 2 {
        if !may_decrease {
            return limit;
        }
        *growth = 0;
        return (limit - limit / 10).max(MIN_FANOUTS);
    }
    *growth += SAMPLE_EVERY;
    if *growth >= limit {
        *growth = 0;
        return (limit + 1).min(MAX_FANOUTS);
    }
    limit
}

/// The fan-outs in progress and their adaptive limit.
#[derive(Debug)]
pub struct Admission {
    permits: Semaphore,
    /// The limit: permits in circulation (free or held), less `owed`.
    limit: AtomicUsize,
    /// Permits to take out of circulation as they come back (a decrease while they were held).
    owed: AtomicUsize,
    /// Fan-outs waiting for a place.
    waiting: AtomicUsize,
    /// Fan-outs admitted: every [`SAMPLE_EVERY`]th is timed.
    admitted: AtomicUsize,
    /// The additive increase so far, and when the limit last decreased.
    state: Mutex<(usize, Option<Instant>)>,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            permits: Semaphore::new(MAX_FANOUTS),
            limit: AtomicUsize::new(MAX_FANOUTS),
            owed: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            admitted: AtomicUsize::new(0),
            state: Mutex::new((0, None)),
        }
    }
}

/// One fan-out counted as waiting while this lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn count(waiting: &'a AtomicUsize) -> Waiting<'a> {
        waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One fan-out's admission, held while it is in progress.
#[derive(Debug)]
pub struct Admitted<'a> {
    permit: Option<SemaphorePermit<'a>>,
    admission: &'a Admission,
    /// When it was admitted, if it is timed: the decision's time counts from here.
    pub at: Option<Instant>,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        // A decrease made while this permit was out takes it out of circulation now.
        let owed = &self.admission.owed;
        if owed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
        {
            permit.forget();
        }
    }
}

impl Admission {
    /// The current limit on fan-outs in progress.
    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Waits for a place, however long it takes.
    pub async fn admit(&self) -> Admitted<'_> {
        // A place is free only while nobody waits (the semaphore is fair), so taking a free one
        // at once overtakes nobody, and skips building and polling a waiter.
        let permit = match self.permits.try_acquire() {
            Ok(permit) => Ok(permit),
            Err(_) => {
                let _waiting = Waiting::count(&self.waiting);
                self.permits.acquire().await
            }
        };
        self.admitted(permit.ok())
    }

    /// Waits for a place until `by`; `None` if none came by then, or at once if
    /// [`QUEUE_LIMITS`] times as many fan-outs already wait as the limit lets run.
    pub async fn admit_by(&self, by: Instant) -> Option<Admitted<'_>> {
        let permit = match self.permits.try_acquire() {
            Ok(permit) => permit,
            Err(_) if self.waiting.load(Ordering::Relaxed) >= QUEUE_LIMITS * self.limit() => {
                return None
            }
            Err(_) => {
                let _waiting = Waiting::count(&self.waiting);
                timeout_at(by, self.permits.acquire()).await.ok()?.ok()?
            }
        };
        Some(self.admitted(Some(permit)))
    }

    fn admitted<'a>(&'a self, permit: Option<SemaphorePermit<'a>>) -> Admitted<'a> {
        Admitted {
            permit,
            admission: self,
            at: (self.admitted.fetch_add(1, Ordering::Relaxed))
                .is_multiple_of(SAMPLE_EVERY)
                .then(Instant::now),
        }
    }

    /// A fan-out admitted at `admitted` (if timed) was decided now: the limit follows
    /// ([`next_limit`]).
    pub fn decided(&self, admitted: Option<Instant>, node_timeout: Duration) {
        let Some(admitted) = admitted else {
            return;
        };
        let now = Instant::now();
        let took = now.duration_since(admitted);
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        let (growth, last_decrease) = &mut *state;
        let may_decrease =
            last_decrease.is_none_or(|at| now.duration_since(at) >= node_timeout / 2);
        let limit = self.limit();
        let next = next_limit(limit, growth, took, node_timeout, may_decrease);
        if next < limit {
            *last_decrease = Some(now);
            let cut = limit - next;
            let forgotten = self.permits.forget_permits(cut);
            self.owed.fetch_add(cut - forgotten, Ordering::Relaxed);
        } else if next > limit {
            // Owed permits are cancelled first: they are still in circulation.
            let repaid = self
                .owed
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok();
            if !repaid {
                self.permits.add_permits(1);
            }
        }
        self.limit.store(next, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE_TIMEOUT: Duration = Duration::from_millis(50);

    #[test]
    fn the_limit_grows_by_one_per_limit_fast_fan_outs_and_shrinks_a_tenth_on_a_slow_one() {
        let fast = Duration::from_millis(5);
        let slow = Duration::from_millis(26);
        // (limit, growth before, took, may decrease) → (limit, growth after); each timed
        // fan-out weighs SAMPLE_EVERY.
        let cases = [
            ((100, 0, fast, true), (100, SAMPLE_EVERY)),
            ((100, 100 - SAMPLE_EVERY, fast, true), (101, 0)),
            ((MAX_FANOUTS, MAX_FANOUTS - 1, fast, true), (MAX_FANOUTS, 0)),
            ((100, 50, slow, true), (90, 0)),
            ((100, 50, slow, false), (100, 50)),
            ((MIN_FANOUTS, 3, slow, true), (MIN_FANOUTS, 0)),
            ((17, 0, slow, true), (MIN_FANOUTS, 0)),
            // Exactly half a node timeout is still on time.
            ((100, 0, NODE_TIMEOUT / 2, true), (100, SAMPLE_EVERY)),
        ];
        for ((limit, growth, took, may_decrease), expected) in cases {
            let mut g = growth;
            let next = next_limit(limit, &mut g, took, NODE_TIMEOUT, may_decrease);
            assert_eq!(
                (next, g),
                expected,
                "{limit} {growth} {took:?} {may_decrease}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_decrease_takes_held_permits_out_as_they_return_and_an_increase_repays_them_first() {
        let admission = Admission::default();
        let held: Vec<_> =
            futures::future::join_all((0..MAX_FANOUTS).map(|_| admission.admit())).await;
        let start = Instant::now();
        tokio::time::advance(NODE_TIMEOUT).await;
        admission.decided(Some(start), NODE_TIMEOUT);
        let limit = admission.limit();
        assert_eq!(limit, MAX_FANOUTS - MAX_FANOUTS / 10);
        drop(held);
        assert_eq!(admission.permits.available_permits(), limit);
        // With permits owed, an increase cancels a debt instead of adding a permit.
        admission.owed.store(1, Ordering::Relaxed);
        for _ in 0..limit.div_ceil(SAMPLE_EVERY) {
            admission.decided(Some(Instant::now()), NODE_TIMEOUT);
        }
        assert_eq!(admission.limit(), limit + 1);
        assert_eq!(admission.permits.available_permits(), limit);
        assert_eq!(admission.owed.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_acquire_waits_for_a_place_until_its_bound_only() {
        let admission = Admission::default();
        let _all: Vec<_> =
            futures::future::join_all((0..MAX_FANOUTS).map(|_| admission.admit())).await;
        let by = Instant::now() + Duration::from_millis(100);
        assert!(admission.admit_by(by).await.is_none());
        assert_eq!(Instant::now(), by);
    }

    #[tokio::test(start_paused = true)]
    async fn an_acquire_is_refused_at_once_when_the_queue_is_full() {
        let admission = Admission::default();
        let _all: Vec<_> =
            futures::future::join_all((0..MAX_FANOUTS).map(|_| admission.admit())).await;
        let by = Instant::now() + Duration::from_secs(1);
        // QUEUE_LIMITS limits' worth of acquires wait; the next one is refused without waiting.
        let full = QUEUE_LIMITS * MAX_FANOUTS;
        let mut queued = futures::future::join_all((0..full).map(|_| admission.admit_by(by)));
        assert!(futures::poll!(&mut queued).is_pending());
        assert_eq!(admission.waiting.load(Ordering::Relaxed), full);
        let asked = Instant::now();
        assert!(admission.admit_by(by).await.is_none());
        assert_eq!(asked.elapsed(), Duration::ZERO);
    }
}

//! Which copies of a published message reach the proxy's subscribers ([`Dedup`]): pure, no
//! I/O, the clock passed in.
//!
//! A publish through the proxy (a client's `PUBLISH`, or `redis.call('publish', …)` in a
//! script, which runs on every master) reaches each master once, and each master delivers
//! its copy on the proxy's subscription there: N copies of one publish. The proxy delivers the
//! first copy at once (a wake-up must not wait for a quorum) and drops the others.
//!
//! Copies carry nothing that names their publish, so they are told apart by counting: per
//! message (its topic and bytes), how many copies each master delivered (`seen[m]`), how many
//! the proxy passed on (`delivered`), and when it passed on the last [`RECENT`] of them. A
//! master's k-th copy is a new publish when `k > delivered`: with every master delivering
//! every publish, in order, the copies of publish k are each master's k-th. When
//! `k <= delivered`, it is a copy of publish k if that was passed on within `window`; if it
//! was passed on longer ago (or too many publishes ago to know), the master is behind (it
//! missed publishes while it or its link was down) and this copy is a new publish: the
//! master's count catches up with the others.
//!
//! Invariants:
//! - With every master delivering every publish within `window` of the first copy, each
//!   publish is passed on exactly once.
//! - A copy is dropped only as the copy of a publish passed on within `window` before it:
//!   a master that was down delays nothing and loses nothing.
//! - A master whose connection was lost starts level with what was passed on
//!   ([`Dedup::resync`]): the publishes it missed are not counted against its later copies.
//! - Bounded: a message's counts are forgotten once no copy of it came for `window`; a copy
//!   later than that (a master paused longer than the window) is passed on again, a
//!   duplicate. At most [`MAX_TRACKED`] messages are tracked; past it the oldest are
//!   forgotten first.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash};
use std::time::Duration;
use tokio::time::Instant;

/// The most messages whose copies are counted at once.
pub const MAX_TRACKED: usize = 100_000;
/// How many of a message's latest publishes remember when they were passed on: copies of an
/// older one are judged late (see the module header).
const RECENT: usize = 64;

/// One message's copies.
struct Counts {
    /// Copies passed on to subscribers.
    delivered: u32,
    /// Copies each master delivered.
    seen: Vec<u32>,
    /// When the last (up to [`RECENT`]) copies passed on were: `passed[i]` is copy
    /// `delivered - passed.len() + 1 + i`.
    passed: VecDeque<Instant>,
    /// When the last copy came.
    last: Instant,
}

impl Counts {
    /// Master `master`'s next copy, at `now`: whether it is a new publish.
    fn admit(&mut self, master: usize, now: Instant, window: Duration) -> bool {
        let Some(seen) = self.seen.get_mut(master) else {
            return true;
        };
        *seen += 1;
        if *seen <= self.delivered {
            // Copy `seen` was passed on `behind` publishes ago: a copy of it if that is known
            // and recent, else the master is catching up.
            let behind = (self.delivered - *seen) as usize;
            let passed_at = self
                .passed
                .len()
                .checked_sub(behind + 1)
                .map(|i| self.passed[i]);
            if passed_at.is_some_and(|at| now.saturating_duration_since(at) <= window) {
                return false;
            }
            *seen = self.delivered + 1;
        }
        self.delivered = *seen;
        if self.passed.len() == RECENT {
            self.passed.pop_front();
        }
        self.passed.push_back(now);
        true
    }
}

/// The copy counts of the messages seen within the window (see the module header).
pub struct Dedup {
    masters: usize,
    window: Duration,
    hasher: foldhash::quality::RandomState,
    counts: HashMap<u64, Counts>,
    /// Messages in the order they were first counted, with when to look at them again.
    expiry: VecDeque<(Instant, u64)>,
}

impl Dedup {
    /// Counts for `masters` masters, forgetting a message `window` after its last copy.
    pub fn new(masters: usize, window: Duration) -> Dedup {
        Dedup {
            masters,
            window,
            hasher: Default::default(),
            counts: HashMap::new(),
            expiry: VecDeque::new(),
        }
    }

    /// Master `master` delivered a copy of `message` (its topic and bytes) at `now`: whether
    /// to pass it on. Messages are told apart by a 64-bit keyed hash of `message`.
    pub fn admit(&mut self, master: usize, message: impl Hash, now: Instant) -> bool {
        self.forget_before(now);
        let id = self.hasher.hash_one(message);
        let counts = match self.counts.get_mut(&id) {
            Some(counts) => counts,
            None => {
                if self.counts.len() >= MAX_TRACKED {
                    self.forget_oldest();
                }
                self.expiry.push_back((now + self.window, id));
                self.counts.entry(id).or_insert(Counts {
                    delivered: 0,
                    seen: vec![0; self.masters],
                    passed: VecDeque::new(),
                    last: now,
                })
            }
        };
        counts.last = now;
        counts.admit(master, now, self.window)
    }

    /// Master `master`'s subscriptions start again (its connection was lost): what it
    /// delivered before is behind it, and what it missed meanwhile it will never deliver, so
    /// its counts start level with what was passed on. Erring this way, a publish in flight
    /// at that moment may be passed on twice, never dropped.
    pub fn resync(&mut self, master: usize) {
        for counts in self.counts.values_mut() {
            if let Some(seen) = counts.seen.get_mut(master) {
                *seen = counts.delivered;
            }
        }
    }

    /// Messages counted now.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.counts.len()
    }

    /// Forgets the messages with no copy for `window` before `now`; the others get their
    /// next look at `last + window`.
    fn forget_before(&mut self, now: Instant) {
        while let Some(&(at, id)) = self.expiry.front() {
            if at > now {
                break;
            }
            self.expiry.pop_front();
            match self.counts.get(&id) {
                Some(counts) if counts.last + self.window > now => {
                    self.expiry.push_back((counts.last + self.window, id));
                }
                _ => {
                    self.counts.remove(&id);
                }
            }
        }
    }

    /// Forgets the message counted first (the table is full).
    fn forget_oldest(&mut self) {
        if let Some((_, id)) = self.expiry.pop_front() {
            self.counts.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_millis(500);

    /// A copy: (master, message, ms after the start).
    type Copy = (usize, &'static str, u64);

    /// Feeds `copies` and returns the pass-on decisions.
    fn run(masters: usize, copies: &[Copy]) -> Vec<bool> {
        let start = Instant::now();
        let mut dedup = Dedup::new(masters, WINDOW);
        copies
            .iter()
            .map(|&(m, msg, ms)| dedup.admit(m, msg, start + Duration::from_millis(ms)))
            .collect()
    }

    #[test]
    fn copies_of_publishes_are_passed_on_once_each() {
        let cases: &[(&str, usize, &[Copy], &[bool])] = &[
            (
                "one publish, three masters",
                3,
                &[(0, "a", 0), (1, "a", 1), (2, "a", 2)],
                &[true, false, false],
            ),
            (
                "the first copy wins, whichever master sends it",
                3,
                &[(2, "a", 0), (0, "a", 1), (1, "a", 1)],
                &[true, false, false],
            ),
            (
                "two publishes of the same bytes, copies interleaved",
                3,
                &[
                    (0, "a", 0),
                    (0, "a", 1),
                    (1, "a", 2),
                    (2, "a", 2),
                    (1, "a", 3),
                    (2, "a", 3),
                ],
                &[true, true, false, false, false, false],
            ),
            (
                "different messages are independent",
                2,
                &[(0, "a", 0), (0, "b", 0), (1, "b", 1), (1, "a", 1)],
                &[true, true, false, false],
            ),
            (
                "a master that missed a publish delays nothing once another is first",
                3,
                // Master 2 missed the first publish; the second is delivered by 0 first.
                &[
                    (0, "a", 0),
                    (1, "a", 0),
                    (0, "a", 10),
                    (2, "a", 11),
                    (1, "a", 12),
                ],
                &[true, false, true, false, false],
            ),
            (
                "a master that missed a publish long ago catches up on its next copy",
                3,
                // Master 2 missed the first two publishes (at 0 and 300); the third comes at
                // 700, master 2 first: its first copy is not a copy of a publish 700 ms old.
                &[
                    (0, "a", 0),
                    (1, "a", 0),
                    (0, "a", 300),
                    (1, "a", 300),
                    (2, "a", 700),
                    (0, "a", 701),
                    (1, "a", 702),
                ],
                &[true, false, true, false, true, false, false],
            ),
            (
                "a copy within the window of its publish is a copy",
                3,
                &[(0, "a", 0), (1, "a", 0), (2, "a", 100)],
                &[true, false, false],
            ),
            (
                "after the window a copy is new again",
                2,
                &[(0, "a", 0), (1, "a", 501)],
                &[true, true],
            ),
            (
                "copies within the window of the last keep the count alive",
                2,
                &[(0, "a", 0), (0, "a", 400), (1, "a", 450), (1, "a", 800)],
                &[true, true, false, false],
            ),
        ];
        for (name, masters, copies, expected) in cases {
            assert_eq!(&run(*masters, copies), expected, "{name}");
        }
    }

    #[test]
    fn a_master_that_reconnects_counts_level_with_the_others() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut dedup = Dedup::new(3, WINDOW);
        // Master 2 misses two publishes while its link is down.
        for (m, ms) in [(0, 0), (1, 0), (0, 10), (1, 10)] {
            dedup.admit(m, "a", at(ms));
        }
        dedup.resync(2);
        // The next publish: master 2's copy is a copy of it, whoever comes first.
        assert!(dedup.admit(0, "a", at(20)));
        assert!(!dedup.admit(2, "a", at(21)));
        assert!(!dedup.admit(1, "a", at(22)));
        assert!(dedup.admit(2, "a", at(30)));
        assert!(!dedup.admit(0, "a", at(31)));
    }

    #[test]
    fn the_table_stays_bounded() {
        let start = Instant::now();
        let mut dedup = Dedup::new(2, WINDOW);
        for i in 0..MAX_TRACKED + 10 {
            assert!(dedup.admit(0, i, start));
        }
        assert_eq!(dedup.tracked(), MAX_TRACKED);
        // The oldest were forgotten: their copies pass again (a duplicate, never a loss).
        assert!(dedup.admit(1, 0usize, start));
        // The window empties it.
        dedup.admit(0, "late", start + WINDOW * 2);
        assert_eq!(dedup.tracked(), 1);
    }
}

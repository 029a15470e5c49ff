//! Which copies of a published message reach the proxy's subscribers ([`Dedup`]): pure, no
//! I/O, the clock passed in.
//!
//! A publish through the proxy (a client's `PUBLISH`, or `redis.call('publish', …)` in a
//! script, which runs on every master) reaches each master once, and each master delivers
//! its copy on the proxy's subscription there: N copies of one publish. The proxy delivers the
//! first copy at once (a wake-up must not wait for a quorum) and drops the others.
//!
//! Copies carry nothing that names their publish, so they are matched by content and time:
//! per message (its topic and bytes), the deliveries of the last `window`, each with the
//! masters whose copy it has **claimed**. A copy from master m claims the oldest recent
//! delivery m has not claimed yet, and is dropped; if there is none, it is a new publish: it is
//! delivered, claimed by m. Copies of one publish arrive within milliseconds of each other;
//! two publishes of the same bytes (a lock channel's unlock message) are matched in order,
//! each master's first copy to the first delivery, its second to the second.
//!
//! Invariants:
//! - With every master delivering every publish within `window` of its first copy, each
//!   publish is passed on exactly once.
//! - A copy is dropped only as the copy of a delivery of the same bytes less than `window`
//!   before it that its master has not matched yet. A master's copies are never held against
//!   what it missed beyond that window, so a master that was down or cut off delays nothing
//!   once the window has passed. Within the window, the one loss possible: the same bytes
//!   published twice, and every master whose copy of the second publish reaches the proxy
//!   missed the first (docs/PROTOCOL.md §13).
//! - A copy later than `window` (a master paused that long) is delivered again: a duplicate.
//! - Bounded: a message is forgotten once its last delivery is older than `window`; at most
//!   [`MAX_TRACKED`] messages, the oldest forgotten first, and at most [`RECENT`] deliveries
//!   each (past it the oldest is forgotten: its late copies become duplicates).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash};
use std::time::Duration;
use tokio::time::Instant;

/// The most messages whose copies are matched at once.
pub const MAX_TRACKED: usize = 100_000;
/// The most recent deliveries of one message kept for matching.
const RECENT: usize = 256;

/// One delivery of a message: when, and the masters whose copy it has claimed (one bit each).
struct Delivery {
    at: Instant,
    claimed: u64,
}

/// The recent deliveries of the messages seen within the window (see the module header).
pub struct Dedup {
    window: Duration,
    hasher: foldhash::quality::RandomState,
    deliveries: HashMap<u64, VecDeque<Delivery>>,
    /// Messages in the order they were first tracked, with when to look at them again.
    expiry: VecDeque<(Instant, u64)>,
}

impl Dedup {
    /// Matching copies within `window` of their delivery.
    pub fn new(window: Duration) -> Dedup {
        Dedup {
            window,
            hasher: Default::default(),
            deliveries: HashMap::new(),
            expiry: VecDeque::new(),
        }
    }

    /// Master `master` (below 64) delivered a copy of `message` (its topic and bytes) at
    /// `now`: whether to pass it on. Messages are told apart by a 64-bit keyed hash.
    pub fn admit(&mut self, master: usize, message: impl Hash, now: Instant) -> bool {
        self.forget_before(now);
        let id = self.hasher.hash_one(message);
        let bit = 1u64 << master;
        if !self.deliveries.contains_key(&id) {
            if self.deliveries.len() >= MAX_TRACKED {
                self.forget_oldest();
            }
            self.expiry.push_back((now + self.window, id));
        }
        let recent = self.deliveries.entry(id).or_default();
        while recent.front().is_some_and(|d| d.at + self.window <= now) {
            recent.pop_front();
        }
        if let Some(delivery) = recent.iter_mut().find(|d| d.claimed & bit == 0) {
            delivery.claimed |= bit;
            return false;
        }
        if recent.len() == RECENT {
            recent.pop_front();
        }
        recent.push_back(Delivery {
            at: now,
            claimed: bit,
        });
        true
    }

    /// Messages tracked now.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.deliveries.len()
    }

    /// Forgets the messages whose last delivery is `window` old; the others get their next
    /// look when their last delivery will be.
    fn forget_before(&mut self, now: Instant) {
        while let Some(&(at, id)) = self.expiry.front() {
            if at > now {
                break;
            }
            self.expiry.pop_front();
            let last = self
                .deliveries
                .get(&id)
                .and_then(|recent| recent.back())
                .map(|d| d.at);
            match last {
                Some(last) if last + self.window > now => {
                    self.expiry.push_back((last + self.window, id));
                }
                _ => {
                    self.deliveries.remove(&id);
                }
            }
        }
    }

    /// Forgets the message tracked first (the table is full).
    fn forget_oldest(&mut self) {
        if let Some((_, id)) = self.expiry.pop_front() {
            self.deliveries.remove(&id);
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
    fn run(copies: &[Copy]) -> Vec<bool> {
        let start = Instant::now();
        let mut dedup = Dedup::new(WINDOW);
        copies
            .iter()
            .map(|&(m, msg, ms)| dedup.admit(m, msg, start + Duration::from_millis(ms)))
            .collect()
    }

    #[test]
    fn copies_of_publishes_are_passed_on_once_each() {
        let cases: &[(&str, &[Copy], &[bool])] = &[
            (
                "one publish, three masters",
                &[(0, "a", 0), (1, "a", 1), (2, "a", 2)],
                &[true, false, false],
            ),
            (
                "the first copy wins, whichever master sends it",
                &[(2, "a", 0), (0, "a", 1), (1, "a", 1)],
                &[true, false, false],
            ),
            (
                "two publishes of the same bytes, copies interleaved",
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
                &[(0, "a", 0), (0, "b", 0), (1, "b", 1), (1, "a", 1)],
                &[true, true, false, false],
            ),
            (
                "a master that missed a publish: its next copy is matched to it, the others' are new",
                // Master 2 missed the first publish; the second is delivered by 2 first.
                &[(0, "a", 0), (1, "a", 0), (2, "a", 10), (0, "a", 11), (1, "a", 12)],
                &[true, false, false, true, false],
            ),
            (
                "publishes seen by different masters, further apart than the window",
                &[(0, "a", 0), (1, "a", 0), (2, "a", 600), (3, "a", 601), (0, "a", 1200)],
                &[true, false, true, false, true],
            ),
            (
                "after the window a late copy is delivered again",
                &[(0, "a", 0), (1, "a", 501)],
                &[true, true],
            ),
            (
                "a copy within the window of its delivery is a copy",
                &[(0, "a", 0), (0, "a", 400), (1, "a", 450), (1, "a", 800)],
                &[true, true, false, false],
            ),
        ];
        for (name, copies, expected) in cases {
            assert_eq!(&run(copies), expected, "{name}");
        }
    }

    #[test]
    fn the_table_stays_bounded() {
        let start = Instant::now();
        let mut dedup = Dedup::new(WINDOW);
        for i in 0..MAX_TRACKED + 10 {
            assert!(dedup.admit(0, i, start));
        }
        assert_eq!(dedup.tracked(), MAX_TRACKED);
        // The oldest were forgotten: their copies pass again (a duplicate, never a loss).
        assert!(dedup.admit(1, 0usize, start));
        // The window empties it.
        dedup.admit(0, "late", start + WINDOW * 2);
        assert_eq!(dedup.tracked(), 1);
        // One message's deliveries are bounded too.
        for _ in 0..RECENT + 10 {
            assert!(dedup.admit(0, "burst", start + WINDOW * 2));
        }
        assert_eq!(
            dedup.deliveries.values().map(VecDeque::len).max(),
            Some(RECENT)
        );
    }
}

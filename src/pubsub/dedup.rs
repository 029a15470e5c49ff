//! Which copies of a published message reach the proxy's subscribers, and when ([`Dedup`]):
//! pure, no I/O, the clock passed in.
//!
//! A publish through the proxy (a client's `PUBLISH`, or `redis.call('publish', …)` in a
//! script, which runs on every master) reaches each master once, and each master delivers
//! its copy on the proxy's subscription there: N copies of one publish. The proxy passes the
//! message on once copies from a **quorum** of masters came, and drops the other copies.
//!
//! Why a quorum and not the first copy: a lock's release publishes its message from the
//! release script, on each master as that master runs it. A waiter woken by the first copy
//! retries at once, and its retry can reach the other masters before the release does: the
//! two travel on different connections (two proxies, two `--threads` shards, or a release
//! whose fan-out was held up between two masters by the scheduler). A majority still holding
//! the lock refuses the retry with the holder's whole PTTL, and Redisson's waiter then sleeps
//! that long: a lost wake-up (seen in `tests/redisson.rs` beside CPU hogs). Once a quorum of
//! masters published, a quorum ran the release, and the retry finds the lock free there.
//! A message that fewer than a quorum deliver (a publish that reached only some masters, or
//! masters down) is passed on `window` after its first copy ([`Dedup::due`]): later, not lost.
//!
//! Copies carry nothing that names their publish, so they are matched by content and time:
//! per message (its topic and bytes), its recent deliveries, each with the masters whose copy
//! it has **claimed**. A copy from master m claims the oldest recent delivery m has not
//! claimed yet; if there is none, it begins a new delivery, claimed by m. Copies of one
//! publish arrive within milliseconds of each other; two publishes of the same bytes (a lock
//! channel's unlock message) are matched in order, each master's first copy to the first
//! delivery, its second to the second.
//!
//! Invariants:
//! - A delivery is passed on once: by the copy that brings its claims to a quorum, or by
//!   [`Dedup::due`] once `window` has passed since it began, whichever comes first. A
//!   delivery the table forgot meanwhile is still passed on when due (a late copy may then
//!   pass it again: a duplicate, never a loss).
//! - With every master delivering every publish within `window` of its first copy, each
//!   publish is passed on exactly once, when its quorum-th copy comes.
//! - A copy is matched only to a delivery of the same bytes that still waits, or was passed
//!   on less than `window` after it began, and that its master has not claimed. A master's
//!   copies are never held against what it missed beyond that, so a master that was down or
//!   cut off delays nothing once the window has passed. Within the window, the one loss
//!   possible: the same bytes published twice, and every master whose copy of the second
//!   publish reaches the proxy missed the first (docs/PROTOCOL.md §13).
//! - A copy later than `window` after its delivery was passed on (a master paused that long)
//!   begins a new one: a duplicate.
//! - Bounded: a message is forgotten once its last delivery is older than `window`; at most
//!   [`MAX_TRACKED`] messages, the oldest forgotten first, and at most [`RECENT`] deliveries
//!   each (past it the oldest is forgotten: its late copies become duplicates). At most
//!   [`MAX_TRACKED`] deliveries wait for their quorum; past it a new one is passed on at once.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash};
use std::time::Duration;
use tokio::time::Instant;

/// The most messages whose copies are matched at once, and the most deliveries waiting.
pub const MAX_TRACKED: usize = 100_000;
/// The most recent deliveries of one message kept for matching.
const RECENT: usize = 256;

/// One delivery of a message: when it began, its number, the masters whose copy it has
/// claimed (one bit each), and whether it was passed on.
struct Delivery {
    at: Instant,
    seq: u64,
    claimed: u64,
    passed: bool,
}

/// A delivery waiting for its quorum: passed on at `due` unless its quorum came first.
struct Waiting<M> {
    due: Instant,
    id: u64,
    seq: u64,
    message: M,
}

/// What to do with a copy ([`Dedup::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Pass the message on now: this copy brought its delivery to a quorum.
    Pass,
    /// A new delivery began with this copy: it waits for a quorum, or until it is due.
    Wait,
    /// A copy of a delivery that waits for more copies or was passed on already.
    Drop,
}

/// The recent deliveries of the messages seen within the window (see the module header).
pub struct Dedup<M> {
    window: Duration,
    quorum: u32,
    hasher: foldhash::quality::RandomState,
    deliveries: HashMap<u64, VecDeque<Delivery>>,
    /// Messages in the order they were first tracked, with when to look at them again.
    expiry: VecDeque<(Instant, u64)>,
    /// Deliveries in the order they began, until passed on by their quorum or when due.
    waiting: VecDeque<Waiting<M>>,
    next_seq: u64,
}

impl<M: Hash + Clone> Dedup<M> {
    /// Copies from `quorum` masters pass a message on; copies are matched, and a delivery
    /// short of its quorum waits, within `window`.
    pub fn new(window: Duration, quorum: usize) -> Dedup<M> {
        Dedup {
            window,
            quorum: quorum as u32,
            hasher: Default::default(),
            deliveries: HashMap::new(),
            expiry: VecDeque::new(),
            waiting: VecDeque::new(),
            next_seq: 0,
        }
    }

    /// Master `master` (below 64) delivered a copy of `message` (its topic and bytes) at
    /// `now`. Messages are told apart by a 64-bit keyed hash.
    pub fn admit(&mut self, master: usize, message: &M, now: Instant) -> Verdict {
        self.forget_before(now);
        let id = self.hasher.hash_one(message);
        let bit = 1u64 << master;
        if !self.deliveries.contains_key(&id) {
            if self.deliveries.len() >= MAX_TRACKED {
                self.forget_oldest();
            }
            self.expiry.push_back((now + self.window, id));
        }
        let window = self.window;
        let over = |d: &Delivery| d.passed && d.at + window <= now;
        let recent = self.deliveries.entry(id).or_default();
        while recent.front().is_some_and(over) {
            recent.pop_front();
        }
        if let Some(delivery) = recent.iter_mut().find(|d| d.claimed & bit == 0 && !over(d)) {
            delivery.claimed |= bit;
            if delivery.passed || delivery.claimed.count_ones() < self.quorum {
                return Verdict::Drop;
            }
            delivery.passed = true;
            return Verdict::Pass;
        }
        if recent.len() == RECENT {
            recent.pop_front();
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let at_once = self.quorum <= 1 || self.waiting.len() >= MAX_TRACKED;
        recent.push_back(Delivery {
            at: now,
            seq,
            claimed: bit,
            passed: at_once,
        });
        if at_once {
            return Verdict::Pass;
        }
        self.waiting.push_back(Waiting {
            due: now + window,
            id,
            seq,
            message: message.clone(),
        });
        Verdict::Wait
    }

    /// The messages whose delivery is due at `now` without its quorum, each marked passed on.
    pub fn due(&mut self, now: Instant) -> Vec<M> {
        let mut out = Vec::new();
        while self.waiting.front().is_some_and(|w| w.due <= now) {
            let Some(waiting) = self.waiting.pop_front() else {
                break;
            };
            if let Some(delivery) = self.delivery(waiting.id, waiting.seq) {
                if delivery.passed {
                    continue;
                }
                delivery.passed = true;
            }
            out.push(waiting.message);
        }
        out
    }

    /// When the next waiting delivery is due, if one waits (those passed on by their quorum
    /// are let go first).
    pub fn next_due(&mut self) -> Option<Instant> {
        while let Some(waiting) = self.waiting.front() {
            let (id, seq, due) = (waiting.id, waiting.seq, waiting.due);
            if !self.delivery(id, seq).is_some_and(|d| d.passed) {
                return Some(due);
            }
            self.waiting.pop_front();
        }
        None
    }

    /// Whether a delivery waits to be passed on when due (possibly one its quorum passed on
    /// meanwhile, until [`Dedup::due`] or [`Dedup::next_due`] lets it go).
    pub fn waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Delivery `seq` of message `id`, unless forgotten.
    fn delivery(&mut self, id: u64, seq: u64) -> Option<&mut Delivery> {
        let recent = self.deliveries.get_mut(&id)?;
        recent.iter_mut().find(|d| d.seq == seq)
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

    /// Feeds `copies` to a table needing `quorum` copies, the due deliveries passed on before
    /// each (as the hub's timer does), and returns what happened: `pass`, `wait`, `drop` for
    /// each copy, `due <message>` for each delivery passed on when due.
    fn run(quorum: usize, copies: &[Copy]) -> Vec<String> {
        let start = Instant::now();
        let mut dedup = Dedup::new(WINDOW, quorum);
        let mut log = Vec::new();
        for &(master, message, ms) in copies {
            let now = start + Duration::from_millis(ms);
            log.extend(dedup.due(now).into_iter().map(|m| format!("due {m}")));
            let verdict = dedup.admit(master, &message, now);
            log.push(format!("{verdict:?}").to_lowercase());
        }
        log
    }

    #[test]
    fn copies_of_publishes_are_passed_on_once_each_at_their_quorum() {
        let cases: &[(&str, &[Copy], &[&str])] = &[
            (
                "one publish, three masters",
                &[(0, "a", 0), (1, "a", 1), (2, "a", 2)],
                &["wait", "pass", "drop"],
            ),
            (
                "the quorum-th copy passes it on, whichever masters send them",
                &[(2, "a", 0), (0, "a", 1), (1, "a", 1)],
                &["wait", "pass", "drop"],
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
                &["wait", "wait", "pass", "drop", "pass", "drop"],
            ),
            (
                "different messages are independent",
                &[(0, "a", 0), (0, "b", 0), (1, "b", 1), (1, "a", 1)],
                &["wait", "wait", "pass", "pass"],
            ),
            (
                "a master that missed a publish: its next copy is matched to it",
                // Master 2 missed the first publish; its copy of the second claims the first.
                &[(0, "a", 0), (1, "a", 0), (2, "a", 10), (0, "a", 11), (1, "a", 12)],
                &["wait", "pass", "drop", "wait", "pass"],
            ),
            (
                "publishes seen by different masters, further apart than the window",
                &[(0, "a", 0), (1, "a", 0), (2, "a", 600), (3, "a", 601), (0, "a", 1200)],
                &["wait", "pass", "wait", "pass", "wait"],
            ),
            (
                "short of its quorum, a delivery is passed on when due; a later copy begins another",
                &[(0, "a", 0), (1, "a", 501)],
                &["wait", "due a", "wait"],
            ),
            (
                "a copy within the window of its delivery is a copy",
                &[(0, "a", 0), (0, "a", 400), (1, "a", 450), (1, "a", 800)],
                &["wait", "wait", "pass", "pass"],
            ),
            (
                "passed on by its quorum, a delivery is not passed on again when due",
                &[(0, "a", 0), (1, "a", 10), (2, "a", 20), (0, "b", 600)],
                &["wait", "pass", "drop", "wait"],
            ),
        ];
        for (name, copies, expected) in cases {
            assert_eq!(&run(2, copies), expected, "{name}");
        }
        // One master (a quorum of one): every first copy passes at once.
        assert_eq!(run(1, &[(0, "a", 0), (0, "a", 1)]), ["pass", "pass"]);
    }

    #[test]
    fn the_next_due_delivery_is_the_oldest_still_waiting() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut dedup = Dedup::new(WINDOW, 2);
        assert_eq!(dedup.next_due(), None);
        assert!(!dedup.waiting());
        assert_eq!(dedup.admit(0, &"a", at(0)), Verdict::Wait);
        assert!(dedup.waiting());
        assert_eq!(dedup.admit(0, &"b", at(10)), Verdict::Wait);
        assert_eq!(dedup.next_due(), Some(at(500)));
        // `a` reached its quorum: `b` is the next one due.
        assert_eq!(dedup.admit(1, &"a", at(20)), Verdict::Pass);
        assert_eq!(dedup.next_due(), Some(at(510)));
        assert!(dedup.due(at(509)).is_empty());
        assert_eq!(dedup.due(at(510)), ["b"]);
        assert_eq!(dedup.next_due(), None);
        assert!(!dedup.waiting());
        assert!(dedup.due(at(2000)).is_empty());
    }

    #[test]
    fn the_table_stays_bounded() {
        let start = Instant::now();
        let mut dedup = Dedup::new(WINDOW, 1);
        for i in 0..MAX_TRACKED + 10 {
            assert_eq!(dedup.admit(0, &i, start), Verdict::Pass);
        }
        assert_eq!(dedup.tracked(), MAX_TRACKED);
        // The oldest were forgotten: their copies pass again (a duplicate, never a loss).
        assert_eq!(dedup.admit(1, &0, start), Verdict::Pass);
        // The window empties it.
        dedup.admit(0, &usize::MAX, start + WINDOW * 2);
        assert_eq!(dedup.tracked(), 1);
        // One message's deliveries are bounded too.
        for _ in 0..RECENT + 10 {
            assert_eq!(dedup.admit(0, &7, start + WINDOW * 2), Verdict::Pass);
        }
        assert_eq!(
            dedup.deliveries.values().map(VecDeque::len).max(),
            Some(RECENT)
        );
        // So are the deliveries waiting for their quorum: past the bound, at once; and a
        // waiting delivery the table forgot is still passed on when due.
        let mut dedup = Dedup::new(WINDOW, 2);
        for i in 0..MAX_TRACKED {
            assert_eq!(dedup.admit(0, &i, start), Verdict::Wait);
        }
        assert_eq!(dedup.admit(0, &MAX_TRACKED, start), Verdict::Pass);
        assert_eq!(dedup.due(start + WINDOW).len(), MAX_TRACKED);
        assert_eq!(dedup.next_due(), None);
    }
}

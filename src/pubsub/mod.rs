//! Pub/sub through the proxy ([`Hub`]): the proxy's clients subscribe to the proxy, and the
//! proxy subscribes on every master, once per topic, for what its clients subscribed to.
//!
//! - One subscriber connection per master ([`link`]), shared by every client of the proxy: a
//!   topic costs the masters one subscription per proxy, whatever the number of subscribers.
//! - A message reaches a client once a quorum of masters delivered it (the publish ran on a
//!   quorum: a lock waiter woken by a release's message finds the lock released on a quorum),
//!   or a node timeout after its first copy when fewer do; the other copies are dropped
//!   ([`dedup`]): one message per publish, not N.
//! - A subscription is confirmed to the client once a quorum of masters confirmed it (or
//!   [`CONFIRM_WAIT`] passed without): a publish answered after that by a quorum of masters
//!   shares a master with it, so it reaches the subscriber (docs/PROTOCOL.md §13).
//!
//! Invariants:
//! - The masters' subscriptions follow the topics that have subscribers here: a topic's first
//!   subscriber subscribes it on every master, its last one leaving unsubscribes it; a link
//!   that reconnects subscribes every topic again.
//! - A topic's `confirmed` masters are those whose latest subscribe command for it was
//!   answered on the link's current connection ([`link`]): a lost connection clears them.
//! - Bounded: a client's undelivered messages are bounded ([`INBOX_MESSAGES`]); past it the
//!   client is marked overflowed and its session closes it (Redis' `client-output-buffer-limit
//!   pubsub`); a link's commands while its master is down are dropped, the topics being
//!   re-subscribed from the table when it returns.

mod dedup;
mod link;

use crate::auth::glob_match;
use crate::live::LiveDuration;
use crate::protocol::Reply;
use crate::redlock::quorum;
use crate::transport::Connect;
use bytes::Bytes;
use dedup::{Dedup, Verdict};
use link::LinkCommand;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

/// Most messages waiting for one client before it is closed.
pub const INBOX_MESSAGES: usize = 16 * 1024;
/// The least a subscribe waits for a quorum of masters to confirm it (the node timeout if
/// longer): a loaded master confirms later than it answers a vote, and a subscription
/// answered before it is active can miss the message its subscriber waits for.
pub const CONFIRM_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The three pub/sub namespaces: channels, patterns over channels, shard channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Channel,
    Pattern,
    Shard,
}

impl Kind {
    /// The name `INFO` and the metrics give this kind.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Channel => "channel",
            Kind::Pattern => "pattern",
            Kind::Shard => "shardchannel",
        }
    }

    /// The command that subscribes this kind, and the name of its confirmations.
    fn subscribe(self) -> &'static str {
        match self {
            Kind::Channel => "subscribe",
            Kind::Pattern => "psubscribe",
            Kind::Shard => "ssubscribe",
        }
    }

    fn unsubscribe(self) -> &'static str {
        match self {
            Kind::Channel => "unsubscribe",
            Kind::Pattern => "punsubscribe",
            Kind::Shard => "sunsubscribe",
        }
    }

    /// The kind and direction of a confirmation a master sends (`subscribe`, `punsubscribe`…).
    fn of_confirmation(name: &[u8]) -> Option<(Kind, bool)> {
        [Kind::Channel, Kind::Pattern, Kind::Shard]
            .into_iter()
            .find_map(|kind| {
                if name.eq_ignore_ascii_case(kind.subscribe().as_bytes()) {
                    Some((kind, true))
                } else if name.eq_ignore_ascii_case(kind.unsubscribe().as_bytes()) {
                    Some((kind, false))
                } else {
                    None
                }
            })
    }

    /// A confirmation as Redis sends it: `[subscribe, name, count]` (`name` null when an
    /// unsubscribe-all found nothing to leave).
    pub fn confirmation(self, subscribed: bool, name: Option<Bytes>, count: usize) -> Reply {
        let what = if subscribed {
            self.subscribe()
        } else {
            self.unsubscribe()
        };
        Reply::Push(vec![
            Reply::bulk(what),
            name.map_or(Reply::Null, Reply::Bulk),
            Reply::Integer(count as i64),
        ])
    }
}

/// A message for a subscriber: on `channel`, matched by `pattern` for a pattern subscriber.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Message {
    pub kind: Kind,
    pub pattern: Option<Bytes>,
    pub channel: Bytes,
    pub payload: Bytes,
}

impl Message {
    /// The push a redis-server sends: `message`, `pmessage` (with the pattern) or `smessage`.
    pub fn reply(&self) -> Reply {
        let bulk = |b: &Bytes| Reply::Bulk(b.clone());
        let mut items = Vec::with_capacity(4);
        match (self.kind, &self.pattern) {
            (Kind::Pattern, Some(pattern)) => {
                items.push(Reply::bulk("pmessage"));
                items.push(bulk(pattern));
            }
            (Kind::Shard, _) => items.push(Reply::bulk("smessage")),
            _ => items.push(Reply::bulk("message")),
        }
        items.push(bulk(&self.channel));
        items.push(bulk(&self.payload));
        Reply::Push(items)
    }

    /// The topic it is delivered under: the pattern of a pattern message, else the channel.
    fn topic(&self) -> (Kind, Bytes) {
        match (self.kind, &self.pattern) {
            (Kind::Pattern, Some(pattern)) => (Kind::Pattern, pattern.clone()),
            _ => (self.kind, self.channel.clone()),
        }
    }
}

/// Where the hub delivers one subscriber's messages (cloned into every topic it subscribes).
#[derive(Clone)]
pub struct Subscriber {
    /// The client's id (or a waiter's, from [`WAITER_IDS`]): one entry per id and topic.
    id: u64,
    sink: Sink,
}

/// How a subscriber takes its messages.
#[derive(Clone)]
enum Sink {
    /// A client: the messages themselves, and whether some were dropped because it did not
    /// take them.
    Client {
        tx: mpsc::Sender<Message>,
        overflowed: Arc<AtomicBool>,
    },
    /// A blocked pop ([`Hub::waiter`]): woken, without the message, by a keyspace event that
    /// may add elements to its key ([`adds_elements`]), and when a master confirms its
    /// registration again after a reconnection (what changed there meanwhile was not
    /// notified). A permit, not a queue: a few bytes per waiter.
    Waiter(Arc<Notify>),
}

/// Waiters' ids: above every client id.
const WAITER_IDS: u64 = 1 << 63;

/// Keyspace events (the payload of a `__keyspace@…__:<key>` message) after which the key may
/// hold elements it did not: a blocked pop tries again only then, not after pops and deletes
/// (a pop's own notification must not wake the other waiters of the key).
const ADDS_ELEMENTS: &[&[u8]] = &[
    b"lpush",
    b"rpush",
    b"linsert",
    b"rename_to",
    b"copy_to",
    b"move_to",
    b"restore",
    b"sortstore",
];

/// Whether a keyspace event may have added elements to its key.
fn adds_elements(event: &[u8]) -> bool {
    ADDS_ELEMENTS.contains(&event)
}

impl Subscriber {
    /// The client's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    fn is_client(&self) -> bool {
        matches!(self.sink, Sink::Client { .. })
    }

    /// Hands over `message`; false if the subscriber is gone.
    fn deliver(&self, message: &Message) -> bool {
        match &self.sink {
            Sink::Client { tx, overflowed } => match tx.try_send(message.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    overflowed.store(true, Ordering::Relaxed);
                    true
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            },
            Sink::Waiter(wake) => {
                if adds_elements(&message.payload) {
                    wake.notify_one();
                }
                true
            }
        }
    }
}

/// One client's messages, as its session reads them.
pub struct Inbox {
    pub subscriber: Subscriber,
    rx: mpsc::Receiver<Message>,
    overflowed: Arc<AtomicBool>,
}

impl Inbox {
    /// An inbox for client `id`.
    pub fn new(id: u64) -> Inbox {
        let (tx, rx) = mpsc::channel(INBOX_MESSAGES);
        let overflowed = Arc::<AtomicBool>::default();
        let sink = Sink::Client {
            tx,
            overflowed: overflowed.clone(),
        };
        Inbox {
            subscriber: Subscriber { id, sink },
            rx,
            overflowed,
        }
    }

    /// The next message (never ends: the inbox holds a sender itself).
    pub async fn next(&mut self) -> Message {
        match self.rx.recv().await {
            Some(message) => message,
            None => std::future::pending().await,
        }
    }

    /// A message already waiting, if any.
    pub fn try_next(&mut self) -> Option<Message> {
        self.rx.try_recv().ok()
    }

    /// Whether messages were dropped because the client did not take them.
    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Relaxed)
    }
}

/// A blocked pop's wake-ups: what it registers in the hub, and what it waits on.
pub struct Wakeups {
    pub subscriber: Subscriber,
    wake: Arc<Notify>,
}

impl Wakeups {
    /// The next wake-up; one that came while nobody waited is kept (one, however many came).
    pub async fn next(&self) {
        self.wake.notified().await
    }
}

/// One topic with subscribers here.
struct Topic {
    subscribers: HashMap<u64, Subscriber>,
    /// The masters where the subscription is active, one bit each.
    confirmed: watch::Sender<u64>,
}

/// The topics and the copies counted (one lock: every change is a few map operations).
struct Table {
    topics: HashMap<(Kind, Bytes), Topic>,
    /// Topics this proxy left, per master (one bit each) until that master confirms the
    /// unsubscribe or its connection ends: a `PUBLISH` reaching the master first (it goes on
    /// another connection) still counts this proxy's subscription there, so
    /// [`Hub::receivers`] counts it as this proxy's own.
    leaving: HashMap<(Kind, Bytes), u64>,
    dedup: Dedup<Message>,
}

/// What the hub counts, for `INFO` and the metrics.
#[derive(Default)]
pub struct PubSubStats {
    /// Messages passed on to subscribers, and copies that passed nothing on (copies of a
    /// message passed on by others, or short of their quorum).
    pub delivered: AtomicU64,
    pub duplicates: AtomicU64,
    /// Blocked pops waiting now (`INFO`'s `blocked_clients`).
    pub blocked: AtomicU64,
}

/// The proxy's pub/sub: its clients' subscriptions and its subscriber links to the masters.
pub struct Hub {
    pub stats: PubSubStats,
    table: Mutex<Table>,
    links: Vec<mpsc::UnboundedSender<LinkCommand>>,
    quorum: usize,
    node_timeout: LiveDuration,
    stop: watch::Sender<bool>,
    /// Wakes the task that passes on messages short of their quorum when they are due: a
    /// delivery began waiting while none did.
    due_changed: Arc<Notify>,
    /// The next waiter's id.
    next_waiter: AtomicU64,
}

impl Hub {
    /// Starts a subscriber link to each master of `connects` (on the runtime this is called
    /// in). Copies of one publish are matched within the node timeout.
    pub fn start(connects: Vec<Box<dyn Connect>>, node_timeout: LiveDuration) -> Arc<Hub> {
        assert!(connects.len() <= 64, "confirmations are one bit per master");
        let masters = connects.len();
        let (stop, stopped) = watch::channel(false);
        let mut receivers = Vec::with_capacity(masters);
        let mut links = Vec::with_capacity(masters);
        for _ in 0..masters {
            let (tx, rx) = mpsc::unbounded_channel();
            links.push(tx);
            receivers.push(rx);
        }
        let hub = Arc::new(Hub {
            table: Mutex::new(Table {
                topics: HashMap::new(),
                leaving: HashMap::new(),
                // A master answering later than the node timeout is missing from votes: a
                // message waits that long for a quorum's copies, late copies are delivered
                // again (duplicates), and a short window keeps two publishes of the same
                // bytes apart (see `dedup`).
                dedup: Dedup::new(node_timeout.get(), quorum(masters)),
            }),
            links,
            quorum: quorum(masters),
            node_timeout,
            stop,
            due_changed: Arc::default(),
            next_waiter: AtomicU64::new(WAITER_IDS),
            stats: PubSubStats::default(),
        });
        for (master, (connect, commands)) in connects.into_iter().zip(receivers).enumerate() {
            let link = link::SubscriberLink::new(Arc::downgrade(&hub), master, connect);
            tokio::spawn(link.run(commands, stopped.clone()));
        }
        let due_changed = hub.due_changed.clone();
        tokio::spawn(pass_on_when_due(Arc::downgrade(&hub), due_changed, stopped));
        hub
    }

    /// Closes every subscriber link.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// The wake-ups of a waiter (a blocked `BLPOP`), to subscribe its keys' keyspace
    /// channels with ([`Sink::Waiter`]).
    pub fn waiter(&self) -> Wakeups {
        let wake = Arc::new(Notify::new());
        let id = self.next_waiter.fetch_add(1, Ordering::Relaxed);
        Wakeups {
            subscriber: Subscriber {
                id,
                sink: Sink::Waiter(wake.clone()),
            },
            wake,
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Subscribes `subscriber` to `(kind, name)`; resolves once the subscription is active on
    /// a quorum of masters, or after [`CONFIRM_WAIT`] (or the node timeout, if longer) without
    /// (then it becomes active as masters return).
    pub fn subscribe(
        &self,
        kind: Kind,
        name: Bytes,
        subscriber: &Subscriber,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut table = self.table();
        let topic = table.topics.entry((kind, name.clone())).or_insert_with(|| {
            for link in &self.links {
                let _ = link.send(LinkCommand::subscribe(kind, name.clone()));
            }
            Topic {
                subscribers: HashMap::new(),
                confirmed: watch::channel(0).0,
            }
        });
        topic.subscribers.insert(subscriber.id, subscriber.clone());
        let mut confirmed = topic.confirmed.subscribe();
        let wait = self.node_timeout.get().max(CONFIRM_WAIT);
        let (quorum, deadline) = (self.quorum, Instant::now() + wait);
        async move {
            let enough = |bits: &u64| bits.count_ones() as usize >= quorum;
            let _ = tokio::time::timeout_at(deadline, confirmed.wait_for(enough)).await;
        }
    }

    /// Takes client `id` off `(kind, name)`; the topic's last subscriber unsubscribes it on
    /// the masters.
    pub fn unsubscribe(&self, kind: Kind, name: &Bytes, id: u64) {
        let mut table = self.table();
        let key = (kind, name.clone());
        let Some(topic) = table.topics.get_mut(&key) else {
            return;
        };
        topic.subscribers.remove(&id);
        if topic.subscribers.is_empty() {
            table.topics.remove(&key);
            // One bit per master (below 64, as everywhere in the hub).
            let every_master = u64::MAX >> (64 - self.links.len().clamp(1, 64));
            *table.leaving.entry(key).or_default() |= every_master;
            for link in &self.links {
                let _ = link.send(LinkCommand::unsubscribe(kind, name.clone()));
            }
        }
    }

    /// Who receives a publish on `channel` (`Kind::Channel`) or shard channel
    /// (`Kind::Shard`): the subscribers here (with `patterns`, a pattern subscriber once per
    /// matching pattern, as Redis counts a publish's receivers; without, the channel's own, as
    /// `PUBSUB NUMSUB`), and on each master how many of its receivers are this proxy's own
    /// subscriptions.
    pub fn receivers(&self, kind: Kind, channel: &[u8], patterns: bool) -> (usize, Vec<i64>) {
        let table = self.table();
        let channel = (kind, Bytes::copy_from_slice(channel));
        let counted = |key: &(Kind, Bytes)| {
            *key == channel
                || (patterns
                    && kind == Kind::Channel
                    && key.0 == Kind::Pattern
                    && glob_match(&key.1, &channel.1))
        };
        // Clients only: a blocked pop's registration receives nothing a client sees.
        let local = (table.topics.iter().filter(|(key, _)| counted(key)))
            .map(|(_, topic)| topic.subscribers.values().filter(|s| s.is_client()).count())
            .sum();
        // Per topic, the masters where this proxy's subscription may be counted: confirmed,
        // or left but not yet confirmed gone.
        let mut masters: HashMap<&(Kind, Bytes), u64> = HashMap::new();
        for (key, topic) in table.topics.iter().filter(|(key, _)| counted(key)) {
            *masters.entry(key).or_default() |= *topic.confirmed.borrow();
        }
        for (key, bits) in table.leaving.iter().filter(|(key, _)| counted(key)) {
            *masters.entry(key).or_default() |= bits;
        }
        let own = (0..self.links.len())
            .map(|master| {
                let on = |bits: &u64| bits & (1 << master) != 0;
                masters.values().filter(|bits| on(bits)).count() as i64
            })
            .collect();
        (local, own)
    }

    /// How many channels, patterns and shard channels have a client subscribed here (Redis'
    /// `pubsub_channels`, `pubsub_patterns`, `pubsub_shardchannels`).
    pub fn subscriptions(&self) -> [(Kind, usize); 3] {
        let table = self.table();
        [Kind::Channel, Kind::Pattern, Kind::Shard].map(|kind| {
            let clients = |topic: &Topic| topic.subscribers.values().any(Subscriber::is_client);
            let n = table
                .topics
                .iter()
                .filter(|((k, _), topic)| *k == kind && clients(topic))
                .count();
            (kind, n)
        })
    }

    /// The topics with subscribers, for master `master`'s link that (re)connects: a new
    /// connection holds none of the subscriptions this proxy left.
    fn topics(&self, master: usize) -> Vec<(Kind, Bytes)> {
        let mut table = self.table();
        forget_leaving(&mut table.leaving, master);
        table.topics.keys().cloned().collect()
    }

    /// Master `master` confirmed it left `(kind, name)` (the last command sent for it there).
    fn left(&self, master: usize, kind: Kind, name: Bytes) {
        let mut table = self.table();
        let key = (kind, name);
        let gone = table.leaving.get_mut(&key).is_some_and(|bits| {
            *bits &= !(1 << master);
            *bits == 0
        });
        if gone {
            table.leaving.remove(&key);
        }
    }

    /// Master `master` confirmed its subscription to `(kind, name)`; the waiters on it are
    /// woken if it was not active there.
    fn confirm(&self, master: usize, kind: Kind, name: Bytes) {
        let table = self.table();
        let Some(topic) = table.topics.get(&(kind, name.clone())) else {
            return;
        };
        let bit = 1 << master;
        if !topic.confirmed.send_if_modified(|bits| {
            let new = *bits & bit == 0;
            *bits |= bit;
            new
        }) {
            return;
        }
        for subscriber in topic.subscribers.values() {
            if let Sink::Waiter(wake) = &subscriber.sink {
                wake.notify_one();
            }
        }
    }

    /// Master `master`'s subscriber connection ended: none of its subscriptions is active.
    fn lost(&self, master: usize) {
        let mut table = self.table();
        for topic in table.topics.values() {
            topic.confirmed.send_modify(|bits| *bits &= !(1 << master));
        }
        forget_leaving(&mut table.leaving, master);
    }

    /// Master `master` delivered `message`: the copy that brings a publish to a quorum of
    /// masters passes it on to every subscriber of its topic.
    fn deliver(&self, master: usize, message: Message) {
        let mut table = self.table();
        let Table { topics, dedup, .. } = &mut *table;
        let Some(topic) = topics.get_mut(&message.topic()) else {
            return;
        };
        // Deliveries become due in the order they began: the timer sleeps until the first
        // one waiting, and needs waking only when none was.
        let timer_idle = !dedup.waiting();
        match dedup.admit(master, &message, Instant::now()) {
            Verdict::Pass => self.pass_on(topic, &message),
            verdict => {
                self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
                if verdict == Verdict::Wait && timer_idle {
                    self.due_changed.notify_one();
                }
            }
        }
    }

    /// Passes on the messages due without their quorum; when the next one will be due.
    fn pass_on_due(&self) -> Option<Instant> {
        let mut table = self.table();
        let Table { topics, dedup, .. } = &mut *table;
        for message in dedup.due(Instant::now()) {
            if let Some(topic) = topics.get_mut(&message.topic()) {
                self.pass_on(topic, &message);
            }
        }
        dedup.next_due()
    }

    /// Hands `message` to every subscriber of `topic`.
    fn pass_on(&self, topic: &mut Topic, message: &Message) {
        self.stats.delivered.fetch_add(1, Ordering::Relaxed);
        topic
            .subscribers
            .retain(|_, subscriber| subscriber.deliver(message));
    }
}

/// Passes on each message short of its quorum when it is due ([`Hub::pass_on_due`]), until
/// `stop` or the hub is gone.
async fn pass_on_when_due(
    hub: std::sync::Weak<Hub>,
    due_changed: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let Some(next) = hub.upgrade().map(|hub| hub.pass_on_due()) else {
            return;
        };
        let until_due = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = until_due => {}
            _ = due_changed.notified() => {}
            _ = stop.changed() => return,
        }
    }
}

/// Master `master` holds none of the subscriptions in `leaving` any more.
fn forget_leaving(leaving: &mut HashMap<(Kind, Bytes), u64>, master: usize) {
    leaving.retain(|_, bits| {
        *bits &= !(1 << master);
        *bits != 0
    });
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{Connect, ReadHalf, WriteHalf};
    use futures::future::BoxFuture;
    use std::time::Duration;

    /// A master that is never reached: the links stay down, the test drives the hub.
    struct Unreachable;

    impl Connect for Unreachable {
        fn connect(&self) -> BoxFuture<'static, std::io::Result<(ReadHalf, WriteHalf)>> {
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test]
    async fn a_left_subscription_counts_as_own_until_its_master_confirms_it_gone() {
        let connects: Vec<Box<dyn Connect>> = (0..3).map(|_| Box::new(Unreachable) as _).collect();
        let hub = Hub::start(connects, LiveDuration::new(Duration::from_millis(50)));
        let (a, p) = (Bytes::from_static(b"a"), Bytes::from_static(b"[ab]"));
        let inbox = Inbox::new(7);
        drop(hub.subscribe(Kind::Channel, a.clone(), &inbox.subscriber));
        drop(hub.subscribe(Kind::Pattern, p.clone(), &inbox.subscriber));
        for master in 0..3 {
            hub.confirm(master, Kind::Channel, a.clone());
        }
        hub.confirm(0, Kind::Pattern, p.clone());
        // The channel and the pattern: two receivers here; master 0 counts both of ours.
        assert_eq!(hub.receivers(Kind::Channel, b"a", true), (2, vec![2, 1, 1]));
        hub.unsubscribe(Kind::Channel, &a, 7);
        // Left, but no master confirmed it: a publish reaching them first still counts it.
        assert_eq!(hub.receivers(Kind::Channel, b"a", true), (1, vec![2, 1, 1]));
        hub.left(0, Kind::Channel, a.clone());
        hub.lost(1);
        assert_eq!(hub.receivers(Kind::Channel, b"a", true), (1, vec![1, 0, 1]));
        // A new connection to master 2 holds nothing this proxy left.
        assert_eq!(hub.topics(2), vec![(Kind::Pattern, p.clone())]);
        assert_eq!(hub.receivers(Kind::Channel, b"a", true), (1, vec![1, 0, 0]));
        // A left pattern counts the same way, for every channel it matches.
        hub.unsubscribe(Kind::Pattern, &p, 7);
        assert_eq!(hub.receivers(Kind::Channel, b"b", true), (0, vec![1, 1, 1]));
        assert_eq!(
            hub.receivers(Kind::Channel, b"b", false),
            (0, vec![0, 0, 0])
        );
        hub.stop();
    }

    #[test]
    fn only_events_that_may_add_elements_wake_a_blocked_pop() {
        for event in [
            "lpush",
            "rpush",
            "linsert",
            "rename_to",
            "copy_to",
            "restore",
        ] {
            assert!(adds_elements(event.as_bytes()), "{event}");
        }
        for event in [
            "lpop", "rpop", "del", "expire", "expired", "ltrim", "lrem", "lset", "",
        ] {
            assert!(!adds_elements(event.as_bytes()), "{event}");
        }
    }
}

//! One master's subscriber connection ([`SubscriberLink`]): a connection in RESP2 subscribed
//! mode that carries the hub's subscribe and unsubscribe commands to the master and the
//! master's messages and confirmations back.
//!
//! Invariants:
//! - On every (re)connection the link subscribes every topic of the hub's table; commands
//!   queued while it was down are dropped first (the table is the truth), so its queue stays
//!   bounded by what happens during one connection.
//! - A subscription counts as active (the hub's `confirm`) only when the master confirmed the
//!   *latest* command sent for that topic on this connection: an old subscribe confirmed
//!   after a newer unsubscribe was sent confirms nothing. Redis answers each channel of a
//!   (un)subscribe with one confirmation, in order, so confirmations are matched to commands
//!   by position, and must name the command's verb and topic: one that does not (a stream
//!   that lost bytes) ends the connection, which is then made again.
//! - A connection that answers nothing is not trusted: a `PING` goes out every
//!   [`PING_EVERY`], and a command or ping unanswered for [`ANSWER_WITHIN`] ends the
//!   connection (a silent partition would otherwise keep subscriptions that deliver nothing
//!   counted as active).
//! - A lost connection (closed, or a reply that breaks the protocol) clears the master's
//!   confirmations in the hub before the link reconnects, with a backoff doubling from
//!   [`BACKOFF_MIN`] to [`BACKOFF_MAX`]; so does a connection that cannot be made, a master
//!   refusing the credentials among them ([`crate::dial`]).
//! - Before subscribing, each connection makes sure the master notifies list changes on its
//!   keyspace channels (`notify-keyspace-events` gains `K` and `l` if it lacks them, and
//!   keeps what it had): blocked `BLPOP`s wait on them. A master that refuses `CONFIG` is
//!   logged once and served anyway (its list changes then wake nobody).

use super::{Hub, Kind, Message};
use crate::protocol::{decode_reply, encode_command, Reply};
use crate::transport::{Connect, ReadHalf, WriteHalf};
use bytes::{Bytes, BytesMut};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How often an idle subscriber connection is pinged.
const PING_EVERY: Duration = Duration::from_secs(1);
/// How long a command or ping may stay unanswered before the connection is dropped.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// Read buffer headroom asked for before each read.
const READ_CHUNK: usize = 16 * 1024;

/// A change of the hub's table for one master.
#[derive(Debug)]
pub(super) struct LinkCommand {
    kind: Kind,
    name: Bytes,
    subscribe: bool,
}

impl LinkCommand {
    pub(super) fn subscribe(kind: Kind, name: Bytes) -> LinkCommand {
        LinkCommand {
            kind,
            name,
            subscribe: true,
        }
    }

    pub(super) fn unsubscribe(kind: Kind, name: Bytes) -> LinkCommand {
        LinkCommand {
            kind,
            name,
            subscribe: false,
        }
    }
}

/// What was sent on the current connection and waits for its answer.
enum Sent {
    /// A (un)subscribe of one topic; `seq` orders the commands sent for it.
    Command {
        kind: Kind,
        name: Bytes,
        subscribe: bool,
        seq: u64,
    },
    Ping,
}

/// The answer did not match what was sent: the connection cannot be trusted.
struct OutOfStep;

/// The link of master `master` to the hub.
pub(super) struct SubscriberLink {
    hub: Weak<Hub>,
    master: usize,
    connect: Box<dyn Connect>,
    /// Whether a refusal of `CONFIG` was logged already.
    config_refusal_logged: bool,
}

/// Why a connection ended.
enum End {
    Stopped,
    Lost,
}

impl SubscriberLink {
    pub(super) fn new(hub: Weak<Hub>, master: usize, connect: Box<dyn Connect>) -> Self {
        SubscriberLink {
            hub,
            master,
            connect,
            config_refusal_logged: false,
        }
    }

    /// Connects, serves the connection until it ends, reconnects; until `stop` or the hub is
    /// gone.
    pub(super) async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<LinkCommand>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut backoff = BACKOFF_MIN;
        while !*stop.borrow() {
            let connected = tokio::select! {
                connected = self.connect.connect() => connected,
                _ = stop.changed() => return,
            };
            if let Ok((rd, wr)) = connected {
                backoff = BACKOFF_MIN;
                match self.serve(rd, wr, &mut commands, &mut stop).await {
                    End::Stopped => return,
                    End::Lost => {
                        let Some(hub) = self.hub.upgrade() else {
                            return;
                        };
                        hub.lost(self.master);
                    }
                }
            }
            // While down, what is asked of this master is dropped: the table is re-read on
            // the next connection.
            let down = tokio::time::sleep(backoff);
            tokio::pin!(down);
            loop {
                tokio::select! {
                    _ = &mut down => break,
                    command = commands.recv() => if command.is_none() { return },
                    _ = stop.changed() => return,
                }
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// One connection: subscribes the table, then relays commands and messages until it ends.
    async fn serve(
        &mut self,
        mut rd: ReadHalf,
        mut wr: WriteHalf,
        commands: &mut mpsc::UnboundedReceiver<LinkCommand>,
        stop: &mut watch::Receiver<bool>,
    ) -> End {
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        match enable_list_notifications(&mut rd, &mut wr, &mut buf).await {
            Ok(Ok(())) => {}
            Ok(Err(refused)) => {
                if !std::mem::replace(&mut self.config_refusal_logged, true) {
                    tracing::warn!(
                        master = self.master,
                        error = %refused,
                        "cannot turn on keyspace notifications of lists: a BLPOP through the proxy is not woken by this master's pushes"
                    );
                }
            }
            Err(()) => return End::Lost,
        }
        while commands.try_recv().is_ok() {}
        let Some(topics) = self.hub.upgrade().map(|hub| hub.topics(self.master)) else {
            return End::Stopped;
        };
        let mut state = Connection::default();
        let mut out = BytesMut::new();
        for (kind, name) in topics {
            state.send(LinkCommand::subscribe(kind, name), &mut out);
        }
        let moved = self.connect.changed();
        tokio::pin!(moved);
        let mut ping = tokio::time::interval(PING_EVERY);
        loop {
            if !out.is_empty() {
                if wr.write_all(&out).await.is_err() {
                    return End::Lost;
                }
                out.clear();
            }
            tokio::select! {
                _ = stop.changed() => return End::Stopped,
                _ = &mut moved => return End::Lost,
                command = commands.recv() => match command {
                    Some(command) => state.send(command, &mut out),
                    None => return End::Stopped,
                },
                _ = ping.tick() => {
                    if state.overdue() {
                        tracing::warn!(master = self.master, "subscriber connection unanswered: reconnecting");
                        return End::Lost;
                    }
                    state.ping(&mut out);
                }
                read = read_more(&mut rd, &mut buf) => {
                    if !read {
                        return End::Lost;
                    }
                    let Some(hub) = self.hub.upgrade() else {
                        return End::Stopped;
                    };
                    loop {
                        let handled = match decode_reply(&mut buf) {
                            Ok(Some(reply)) => state.received(&hub, self.master, reply),
                            Ok(None) => break,
                            Err(_) => Err(OutOfStep),
                        };
                        if handled.is_err() {
                            tracing::warn!(master = self.master, "subscriber connection out of step: reconnecting");
                            return End::Lost;
                        }
                    }
                }
            }
        }
    }
}

/// What one connection sent and waits for.
#[derive(Default)]
struct Connection {
    next_seq: u64,
    /// Commands and pings sent, in order, each waiting for its answer, with when it was sent.
    sent: VecDeque<(Sent, Instant)>,
    /// The last command sent per topic (its `seq`), while unconfirmed or subscribed.
    latest: HashMap<(Kind, Bytes), u64>,
}

impl Connection {
    fn send(&mut self, command: LinkCommand, out: &mut BytesMut) {
        let verb = if command.subscribe {
            command.kind.subscribe()
        } else {
            command.kind.unsubscribe()
        };
        out.extend_from_slice(&encode_command(&[verb.as_bytes(), &command.name]));
        self.next_seq += 1;
        self.latest
            .insert((command.kind, command.name.clone()), self.next_seq);
        let sent = Sent::Command {
            kind: command.kind,
            name: command.name,
            subscribe: command.subscribe,
            seq: self.next_seq,
        };
        self.sent.push_back((sent, Instant::now()));
    }

    fn ping(&mut self, out: &mut BytesMut) {
        out.extend_from_slice(&encode_command(&["PING"]));
        self.sent.push_back((Sent::Ping, Instant::now()));
    }

    /// Whether the oldest unanswered command or ping is older than [`ANSWER_WITHIN`].
    fn overdue(&self) -> bool {
        self.sent
            .front()
            .is_some_and(|(_, at)| at.elapsed() > ANSWER_WITHIN)
    }

    /// A reply from the master: a message for the hub, or the answer to the oldest command or
    /// ping sent.
    fn received(&mut self, hub: &Arc<Hub>, master: usize, reply: Reply) -> Result<(), OutOfStep> {
        let items = match reply {
            Reply::Array(items) => items,
            // `+PONG`: a ping answered before anything was subscribed.
            Reply::Simple(pong) if pong.eq_ignore_ascii_case(b"pong") => {
                return self.answered(|sent| matches!(sent, Sent::Ping)).map(drop)
            }
            Reply::Error(text) => {
                // A command the master refused (an ACL without the channel): not active.
                tracing::warn!(master, error = %String::from_utf8_lossy(&text), "a master refused a subscription");
                return self
                    .answered(|sent| matches!(sent, Sent::Command { .. }))
                    .map(drop);
            }
            _ => return Err(OutOfStep),
        };
        let mut items = items.into_iter().map(|item| match item {
            Reply::Bulk(bytes) => Some(bytes),
            _ => None,
        });
        let what = items.next().flatten().unwrap_or_default();
        let mut next = || items.next().flatten().unwrap_or_default();
        let message = |kind, pattern, channel, payload| Message {
            kind,
            pattern,
            channel,
            payload,
        };
        match what.as_ref() {
            b"message" => hub.deliver(master, message(Kind::Channel, None, next(), next())),
            b"pmessage" => {
                let pattern = next();
                hub.deliver(
                    master,
                    message(Kind::Pattern, Some(pattern), next(), next()),
                )
            }
            b"smessage" => hub.deliver(master, message(Kind::Shard, None, next(), next())),
            b"pong" => return self.answered(|sent| matches!(sent, Sent::Ping)).map(drop),
            _ => return self.confirmed(hub, master, &what, &next()),
        }
        Ok(())
    }

    /// Takes the oldest entry sent, which must be what `matches` says the reply answers.
    fn answered(&mut self, matches: impl Fn(&Sent) -> bool) -> Result<Sent, OutOfStep> {
        match self.sent.pop_front() {
            Some((sent, _)) if matches(&sent) => Ok(sent),
            _ => Err(OutOfStep),
        }
    }

    /// The master confirmed `what` (`subscribe`, `punsubscribe`, …) of `topic`: the answer to
    /// the oldest command sent, which must be that one.
    fn confirmed(
        &mut self,
        hub: &Arc<Hub>,
        master: usize,
        what: &[u8],
        topic: &[u8],
    ) -> Result<(), OutOfStep> {
        let confirms = Kind::of_confirmation(what).ok_or(OutOfStep)?;
        let sent = self.answered(|sent| match sent {
            Sent::Command {
                kind,
                name,
                subscribe,
                ..
            } => (*kind, *subscribe) == confirms && name.as_ref() == topic,
            Sent::Ping => false,
        })?;
        let Sent::Command {
            kind,
            name,
            subscribe,
            seq,
        } = sent
        else {
            return Err(OutOfStep);
        };
        let key = (kind, name);
        if self.latest.get(&key) != Some(&seq) {
            return Ok(());
        }
        if subscribe {
            hub.confirm(master, key.0, key.1);
        } else {
            self.latest.remove(&key);
            hub.left(master, key.0, key.1);
        }
        Ok(())
    }
}

/// Adds `K` (keyspace channels) and `l` (list commands) to the master's
/// `notify-keyspace-events`, keeping its other flags. `Err(())`: the connection failed;
/// `Ok(Err(text))`: the master refused (its error).
async fn enable_list_notifications(
    rd: &mut ReadHalf,
    wr: &mut WriteHalf,
    buf: &mut BytesMut,
) -> Result<Result<(), String>, ()> {
    let get = request(rd, wr, buf, &["CONFIG", "GET", "notify-keyspace-events"]).await?;
    let current = match get {
        Reply::Array(items) => match items.get(1) {
            Some(Reply::Bulk(flags)) => String::from_utf8_lossy(flags).into_owned(),
            _ => String::new(),
        },
        Reply::Error(text) => return Ok(Err(String::from_utf8_lossy(&text).into_owned())),
        other => return Ok(Err(format!("unexpected answer to CONFIG GET: {other:?}"))),
    };
    let Some(flags) = with_list_notifications(&current) else {
        return Ok(Ok(()));
    };
    match request(
        rd,
        wr,
        buf,
        &["CONFIG", "SET", "notify-keyspace-events", &flags],
    )
    .await?
    {
        Reply::Error(text) => Ok(Err(String::from_utf8_lossy(&text).into_owned())),
        _ => Ok(Ok(())),
    }
}

/// `notify-keyspace-events` flags that notify list changes on keyspace channels, if `current`
/// does not: `current` plus `K` and `l` (`A` includes `l`).
fn with_list_notifications(current: &str) -> Option<String> {
    let keyspace = current.contains('K');
    let lists = current.contains('l') || current.contains('A');
    if keyspace && lists {
        return None;
    }
    let mut flags = current.to_string();
    if !keyspace {
        flags.push('K');
    }
    if !lists {
        flags.push('l');
    }
    Some(flags)
}

/// Sends one command and reads its reply (before the connection subscribes anything).
async fn request(
    rd: &mut ReadHalf,
    wr: &mut WriteHalf,
    buf: &mut BytesMut,
    args: &[&str],
) -> Result<Reply, ()> {
    wr.write_all(&encode_command(args)).await.map_err(drop)?;
    loop {
        if let Some(reply) = decode_reply(buf).map_err(drop)? {
            return Ok(reply);
        }
        if !read_more(rd, buf).await {
            return Err(());
        }
    }
}

/// Reads more bytes; false at end of stream or on error.
async fn read_more(rd: &mut ReadHalf, buf: &mut BytesMut) -> bool {
    buf.reserve(READ_CHUNK);
    matches!(rd.read_buf(buf).await, Ok(n) if n > 0)
}

#[cfg(test)]
mod tests {
    use super::with_list_notifications;

    #[test]
    fn list_notifications_are_added_to_the_flags_set() {
        let cases = [
            ("", Some("Kl")),
            ("E", Some("EKl")),
            ("Kl", None),
            ("KEA", None),
            ("AK", None),
            ("Ex", Some("ExKl")),
            ("K", Some("Kl")),
            ("l", Some("lK")),
            ("gE", Some("gEKl")),
        ];
        for (current, wanted) in cases {
            assert_eq!(
                with_list_notifications(current).as_deref(),
                wanted,
                "{current}"
            );
        }
    }
}

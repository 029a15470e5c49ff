//! Pub/sub commands: `SUBSCRIBE`, `PSUBSCRIBE`, `SSUBSCRIBE` and their `UNSUBSCRIBE`s (a
//! client's [`Subscriptions`], kept in the proxy's hub: [`crate::pubsub`]), `PUBLISH` and
//! `SPUBLISH` (fanned out), `PUBSUB` (the masters' view, with this proxy's own subscriptions
//! counted as its clients).
//!
//! Invariants:
//! - Replies are a redis-server's: one confirmation per channel with the client's count of
//!   subscriptions (channels and patterns together; shard channels apart), pushes in RESP3,
//!   arrays in RESP2's subscribed mode.
//! - A subscribe is answered once every channel it added is active on a quorum of masters
//!   (or [`crate::pubsub::CONFIRM_WAIT`] passed), and nothing the client sent after it starts
//!   before: a waiter that subscribes and then tries its lock cannot miss the release's
//!   message.
//! - Receiver counts (`PUBLISH`'s reply, `PUBSUB NUMSUB`) are this proxy's subscribers plus,
//!   from the master that counts most, the receivers that are not this proxy's own
//!   subscriptions: another proxy counts once per topic it subscribed for its clients.

use super::{Action, Ctx, Session};
use crate::error::ProxyError;
use crate::lease::Outcome;
use crate::masters::{Ask, ANY_SLOT};
use crate::protocol::{encode_command, Reply, Request};
use crate::pubsub::{Hub, Inbox, Kind};
use crate::redlock::{merged, quorum, MergeRule, Vote};
use bytes::Bytes;
use std::collections::{BTreeSet, HashSet};
use std::fmt;

/// A client's subscriptions, and the inbox its messages arrive in once it has subscribed.
#[derive(Default)]
pub struct Subscriptions {
    channels: HashSet<Bytes>,
    patterns: HashSet<Bytes>,
    shard_channels: HashSet<Bytes>,
    pub inbox: Option<Inbox>,
}

impl fmt::Debug for Subscriptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscriptions")
            .field("channels", &self.channels.len())
            .field("patterns", &self.patterns.len())
            .field("shard_channels", &self.shard_channels.len())
            .finish()
    }
}

impl Subscriptions {
    fn of(&mut self, kind: Kind) -> &mut HashSet<Bytes> {
        match kind {
            Kind::Channel => &mut self.channels,
            Kind::Pattern => &mut self.patterns,
            Kind::Shard => &mut self.shard_channels,
        }
    }

    /// The count a confirmation of `kind` reports (Redis: channels and patterns together,
    /// shard channels apart).
    fn count(&self, kind: Kind) -> usize {
        match kind {
            Kind::Shard => self.shard_channels.len(),
            _ => self.channels.len() + self.patterns.len(),
        }
    }

    /// Channels, patterns and shard channels, as `CLIENT LIST` counts them.
    fn counts(&self) -> [usize; 3] {
        [
            self.channels.len(),
            self.patterns.len(),
            self.shard_channels.len(),
        ]
    }

    /// Whether the client is subscribed to anything (RESP2: subscribed mode).
    pub fn active(&self) -> bool {
        !(self.channels.is_empty() && self.patterns.is_empty() && self.shard_channels.is_empty())
    }

    /// Leaves every subscription (the connection ends, or `RESET`).
    pub fn leave_all(&mut self, hub: &Hub) {
        let Some(inbox) = &self.inbox else {
            return;
        };
        let id = inbox.subscriber.id();
        for kind in [Kind::Channel, Kind::Pattern, Kind::Shard] {
            for name in self.of(kind).drain() {
                hub.unsubscribe(kind, &name, id);
            }
        }
    }
}

/// The kind a (un)subscribe or publish command works on.
fn kind_of(command: &[u8]) -> Kind {
    let is = |name: &[u8]| command.eq_ignore_ascii_case(name);
    if is(b"psubscribe") || is(b"punsubscribe") {
        Kind::Pattern
    } else if is(b"ssubscribe") || is(b"sunsubscribe") || is(b"spublish") {
        Kind::Shard
    } else {
        Kind::Channel
    }
}

/// `SUBSCRIBE` / `PSUBSCRIBE` / `SSUBSCRIBE channel…`.
pub fn subscribe(ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    let kind = kind_of(&request.args[0]);
    let hub = &ctx.shared.pubsub;
    let subscriptions = &mut session.pubsub;
    let subscriber = subscriptions
        .inbox
        .get_or_insert_with(|| Inbox::new(session.client.id))
        .subscriber
        .clone();
    let mut confirmations = Vec::with_capacity(request.args.len() - 1);
    let mut active = Vec::new();
    for name in &request.args[1..] {
        if subscriptions.of(kind).insert(name.clone()) {
            active.push(hub.subscribe(kind, name.clone(), &subscriber));
        }
        let count = subscriptions.count(kind);
        confirmations.push(kind.confirmation(true, Some(name.clone()), count));
    }
    session.client.set_subscriptions(subscriptions.counts());
    Action::Barrier(Box::pin(async move {
        futures::future::join_all(active).await;
        Outcome::Reply(Reply::Frames(confirmations))
    }))
}

/// `UNSUBSCRIBE` / `PUNSUBSCRIBE` / `SUNSUBSCRIBE [channel…]`: the channels named, or every
/// one of that kind.
pub fn unsubscribe(ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    let kind = kind_of(&request.args[0]);
    let hub = &ctx.shared.pubsub;
    let subscriptions = &mut session.pubsub;
    let id = session.client.id;
    let names: Vec<Bytes> = match request.args.len() {
        1 => subscriptions.of(kind).iter().cloned().collect(),
        _ => request.args[1..].to_vec(),
    };
    if names.is_empty() {
        let count = subscriptions.count(kind);
        return Action::Ready(kind.confirmation(false, None, count));
    }
    let confirmations = names
        .into_iter()
        .map(|name| {
            if subscriptions.of(kind).remove(&name) {
                hub.unsubscribe(kind, &name, id);
            }
            let count = subscriptions.count(kind);
            kind.confirmation(false, Some(name), count)
        })
        .collect();
    session.client.set_subscriptions(subscriptions.counts());
    Action::Ready(Reply::Frames(confirmations))
}

/// `PUBLISH` / `SPUBLISH channel message`: sent to every master; answered once a quorum
/// did, with the number of receivers.
pub fn publish(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let kind = kind_of(&request.args[0]);
    let channel = request.args[1].clone();
    let hub = ctx.shared.pubsub.clone();
    let masters = ctx.masters();
    let payload = super::payload(request);
    Action::Defer(Box::pin(async move {
        // A master counts this proxy's subscriptions as they stood when it ran the publish,
        // somewhere between these two looks: a leave (or a join) that master confirms in
        // between is still (already) counted there. Per master, the larger of the two is
        // taken as this proxy's own (a CI run under load answered 2 where Redis answers 1).
        let (_, before) = hub.receivers(kind, &channel, true);
        let votes = replies_of_quorum(&masters, payload).await;
        let (local, after) = hub.receivers(kind, &channel, true);
        let own: Vec<i64> = before.iter().zip(&after).map(|(b, a)| *b.max(a)).collect();
        let reply = match remote_receivers(&votes, |i, n| n - own[i]) {
            Some(remote) => Reply::Integer(local as i64 + remote),
            None => merged(&votes, MergeRule::Known),
        };
        Outcome::Reply(reply)
    }))
}

/// Sends `payload` to every master; the votes once a quorum replied (or all are in).
async fn replies_of_quorum(masters: &crate::masters::Masters, payload: Bytes) -> Vec<Vote> {
    let q = quorum(masters.voters().len());
    let replied = |votes: &[Vote]| {
        votes
            .iter()
            .filter(|v| matches!(v, Vote::Replied(_)))
            .count()
            >= q
    };
    let (votes, _late) = masters
        .fan_out_each(
            ANY_SLOT,
            |_| Some(Ask::Commands(payload.clone())),
            1,
            replied,
        )
        .await;
    votes
}

/// With a quorum of integer replies, the most receivers a master counts beyond this proxy's
/// own subscriptions (`beyond(master, count)`), never below 0.
fn remote_receivers(votes: &[Vote], beyond: impl Fn(usize, i64) -> i64) -> Option<i64> {
    let counts: Vec<(usize, i64)> = votes
        .iter()
        .enumerate()
        .filter_map(|(i, vote)| match vote {
            Vote::Replied(Reply::Integer(n)) => Some((i, *n)),
            _ => None,
        })
        .collect();
    (counts.len() >= quorum(votes.len())).then(|| {
        counts
            .into_iter()
            .map(|(i, n)| beyond(i, n).max(0))
            .max()
            .unwrap_or(0)
    })
}

/// `PUBSUB CHANNELS|SHARDCHANNELS [pattern]`, `NUMSUB|SHARDNUMSUB [channel…]`, `NUMPAT`.
pub fn pubsub(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let sub = request.args[1].to_ascii_lowercase();
    let arity_ok = match sub.as_slice() {
        b"channels" | b"shardchannels" => request.args.len() <= 3,
        b"numpat" => request.args.len() == 2,
        b"numsub" | b"shardnumsub" => true,
        _ => {
            return Action::error(ProxyError::unknown_subcommand(&request.args[1], "PUBSUB"));
        }
    };
    if !arity_ok {
        return Action::error(ProxyError::subcommand_arity("pubsub", &sub));
    }
    let kind = match sub.starts_with(b"shard") {
        true => Kind::Shard,
        false => Kind::Channel,
    };
    let hub = ctx.shared.pubsub.clone();
    let masters = ctx.masters();
    let payload = encode_command(&request.args);
    Action::Defer(Box::pin(async move {
        let votes = replies_of_quorum(&masters, payload).await;
        let reply = match sub.as_slice() {
            b"numsub" | b"shardnumsub" => numsub(&hub, kind, &request.args[2..], &votes),
            b"numpat" => remote_receivers(&votes, |_, n| n).map(Reply::Integer),
            _ => channels(&votes),
        };
        let reply = reply.unwrap_or_else(|| merged(&votes, MergeRule::Known));
        Outcome::Reply(reply)
    }))
}

/// The channels any master of a quorum reports (each proxy subscribes there for its clients).
fn channels(votes: &[Vote]) -> Option<Reply> {
    let lists: Vec<&Vec<Reply>> = votes
        .iter()
        .filter_map(|vote| match vote {
            Vote::Replied(Reply::Array(items)) => Some(items),
            _ => None,
        })
        .collect();
    if lists.len() < quorum(votes.len()) {
        return None;
    }
    let union: BTreeSet<&Bytes> = lists
        .into_iter()
        .flatten()
        .filter_map(|item| match item {
            Reply::Bulk(name) => Some(name),
            _ => None,
        })
        .collect();
    Some(Reply::Array(
        union.into_iter().cloned().map(Reply::Bulk).collect(),
    ))
}

/// `NUMSUB`: per channel, this proxy's subscribers plus the receivers another master counts
/// beyond this proxy's own subscription.
fn numsub(hub: &Hub, kind: Kind, channels: &[Bytes], votes: &[Vote]) -> Option<Reply> {
    let flat: Vec<(usize, &Vec<Reply>)> = votes
        .iter()
        .enumerate()
        .filter_map(|(i, vote)| match vote {
            Vote::Replied(Reply::Array(items)) if items.len() == channels.len() * 2 => {
                Some((i, items))
            }
            _ => None,
        })
        .collect();
    if flat.len() < quorum(votes.len()) {
        return None;
    }
    let mut reply = Vec::with_capacity(channels.len() * 2);
    for (c, channel) in channels.iter().enumerate() {
        let (local, own) = hub.receivers(kind, channel, false);
        let remote = flat
            .iter()
            .filter_map(|(i, items)| match items[c * 2 + 1] {
                Reply::Integer(n) => Some((n - own[*i]).max(0)),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        reply.push(Reply::Bulk(channel.clone()));
        reply.push(Reply::Integer(local as i64 + remote));
    }
    Some(Reply::Array(reply))
}

//! Lists as wake-up signals (python-redis-lock's waiter blocks in `BLPOP lock-signal:<name>`,
//! its release pushes one element there): `LPUSH`/`RPUSH` fanned out and guarded like any
//! write that creates a key; `LPOP`/`RPOP`/`LMOVE` answered by the **first** master that pops
//! something; `BLPOP`/`BRPOP`/`BLMOVE` blocked in the proxy, not on the masters.
//!
//! Invariants:
//! - A pop runs on every master (each pops its own head: the same element when the lists were
//!   written through the proxy) and is answered as soon as one master popped, without waiting
//!   for a quorum: a wake-up must not wait for the slowest master. Lists through the proxy
//!   are signals, not queues: two waiters racing may both be woken by one push (each got the
//!   element from a different master first), never neither (docs/PROTOCOL.md §14).
//! - A blocked pop holds no master connection: it is one registration per key in the hub
//!   (the key's keyspace channel), woken when a master notifies a change of the key or
//!   confirms the registration again after a reconnection, and retried then.
//! - Its timeout is Redis': seconds as a float, 0 = forever, counted from when the request was
//!   read; on timeout a null array, whatever the masters (the wait for its registration's
//!   confirmations, long with a majority down, included). It ends without popping when the
//!   connection ends, at any point of its wait.
//! - Nothing after a blocked pop is dispatched before it is answered (a barrier), as a
//!   blocked Redis client runs nothing else.

use super::{guarded_write_at, payload, with_guard, Action, Ctx, Session};
use crate::client_registry::ClientHandle;
use crate::error::ProxyError;
use crate::lease::Outcome;
use crate::masters::{slot_of, Forms, Masters};
use crate::protocol::{encode_command, Reply, Request};
use crate::pubsub::{Hub, Kind, Wakeups};
use crate::redlock::{merged, MergeRule, Vote};
use bytes::Bytes;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The keyspace channel of a key in DB 0 (the only one).
const KEYSPACE: &[u8] = b"__keyspace@0__:";

/// `LPUSH` / `RPUSH key element…`: can create the key, so guarded (the lease bound) like
/// `HSET`.
pub fn push(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    guarded_write_at(ctx, request, 1, |reply| reply)
}

/// `LPOP` / `RPOP key [count]`: the first master's non-empty pop.
pub fn pop(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let counted = request.args.len() > 2;
    let masters = ctx.masters();
    let slot = slot_of(&request.args[1..2]);
    let forms = Forms::same(payload(request));
    Action::Defer(Box::pin(async move {
        let reply = match first_pop(&masters, slot, &forms, 1).await {
            Popped::Value(reply) => reply,
            // Redis 7 answers a missing list a null array when a count was given.
            Popped::Nothing(Reply::Null) if counted => Reply::NullArray,
            Popped::Nothing(reply) => reply,
        };
        Outcome::Reply(reply)
    }))
}

/// `LMOVE source destination LEFT|RIGHT LEFT|RIGHT`: the first master's move; the destination
/// is guarded.
pub fn lmove(ctx: &Ctx<'_>, _session: &mut Session, request: Request) -> Action {
    let masters = ctx.masters();
    let slot = slot_of(&request.args[1..2]);
    let forms = guarded(ctx, &request.args);
    Action::Defer(Box::pin(async move {
        let reply = match first_pop(&masters, slot, &forms, 2).await {
            Popped::Value(reply) | Popped::Nothing(reply) => reply,
        };
        Outcome::Reply(reply)
    }))
}

/// `args` (a command whose destination is `args[2]`) followed by the guard over it (a
/// cluster's guard also notifies the destination).
fn guarded(ctx: &Ctx<'_>, args: &[Bytes]) -> Forms {
    with_guard(ctx, &encode_command(args), &args[2])
}

/// `BLPOP` / `BRPOP key… timeout`.
pub fn blocking_pop(ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    let args = &request.args;
    let timeout = match parse_timeout(&args[args.len() - 1]) {
        Ok(timeout) => timeout,
        Err(err) => return Action::error(err),
    };
    let keys = args[1..args.len() - 1].to_vec();
    let side = match args[0].eq_ignore_ascii_case(b"blpop") {
        true => "LEFT",
        false => "RIGHT",
    };
    let numkeys = keys.len().to_string();
    let mut lmpop: Vec<&[u8]> = vec![b"LMPOP", numkeys.as_bytes()];
    lmpop.extend(keys.iter().map(|k| k.as_ref()));
    lmpop.push(side.as_bytes());
    let attempt = Attempt {
        slot: slot_of(&keys),
        forms: Forms::same(encode_command(&lmpop)),
        replies: 1,
        // `LMPOP` answers `[key, [element]]`; `BLPOP`, `[key, element]`.
        shape: |reply| match reply {
            Reply::Array(mut pair) if pair.len() == 2 => match pair.pop() {
                Some(Reply::Array(mut elements)) if elements.len() == 1 => {
                    pair.extend(elements.pop());
                    Reply::Array(pair)
                }
                other => Reply::Array(pair.into_iter().chain(other).collect()),
            },
            other => other,
        },
    };
    block(ctx, session, keys, timeout, attempt)
}

/// `BLMOVE source destination LEFT|RIGHT LEFT|RIGHT timeout`.
pub fn blocking_move(ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    let timeout = match parse_timeout(&request.args[5]) {
        Ok(timeout) => timeout,
        Err(err) => return Action::error(err),
    };
    let mut lmove = request.args[..5].to_vec();
    lmove[0] = Bytes::from_static(b"LMOVE");
    let attempt = Attempt {
        slot: slot_of(&lmove[1..2]),
        forms: guarded(ctx, &lmove),
        replies: 2,
        shape: |reply| reply,
    };
    block(
        ctx,
        session,
        vec![request.args[1].clone()],
        timeout,
        attempt,
    )
}

/// A blocking command's timeout as Redis 7.0 reads it (`getTimeoutFromObjectOrReply`, in
/// seconds): `None` for 0 (forever). Quirks kept: milliseconds are truncated (`0.0001` is 0,
/// forever), and a value past the range of a 64-bit integer (`1e300`, `inf`) converts to its
/// minimum, so it is "negative"; a huge one below that waits as good as forever.
fn parse_timeout(arg: &[u8]) -> Result<Option<Duration>, ProxyError> {
    let seconds: f64 = std::str::from_utf8(arg)
        .ok()
        .filter(|text| !text.starts_with(|c: char| c.is_ascii_whitespace()))
        .and_then(|text| text.parse().ok())
        .filter(|value: &f64| !value.is_nan())
        .ok_or(ProxyError::TimeoutNotFloat)?;
    let ms = (seconds * 1000.0).trunc();
    // x86's conversion of an out-of-range double is the minimum integer.
    if ms < 0.0 || ms >= i64::MAX as f64 {
        return Err(ProxyError::TimeoutNegative);
    }
    Ok((ms > 0.0).then(|| Duration::from_millis(ms as u64)))
}

/// One non-blocking try of a blocked command on every master.
struct Attempt {
    /// The slot of its keys (on a cluster master, the node that serves them).
    slot: u16,
    forms: Forms,
    /// Replies per master (2 with a guard after the command).
    replies: usize,
    /// The client's reply from the first master's pop.
    shape: fn(Reply) -> Reply,
}

/// Blocks until an attempt pops, the timeout passes (a null array) or the connection ends.
fn block(
    ctx: &Ctx<'_>,
    session: &mut Session,
    keys: Vec<Bytes>,
    timeout: Option<Duration>,
    attempt: Attempt,
) -> Action {
    let waiter = Waiter {
        client: session.client.clone(),
        hub: ctx.shared.pubsub.clone(),
        masters: ctx.masters(),
        // A timeout past what the clock can count is forever.
        deadline: timeout.and_then(|t| ctx.received_at.checked_add(t)),
        ended: session.ended_signal(),
    };
    Action::Barrier(Box::pin(async move {
        Outcome::Reply(waiter.wait(keys, attempt).await)
    }))
}

/// What a blocked pop waits with.
struct Waiter {
    /// The blocked client, shown `flags=b` in `CLIENT LIST` while it waits.
    client: Arc<ClientHandle>,
    hub: Arc<Hub>,
    masters: Arc<Masters>,
    deadline: Option<Instant>,
    /// Set when the client's connection ends.
    ended: watch::Receiver<bool>,
}

/// A waiter's registrations in the hub, taken back however the wait ends.
struct Registration<'a> {
    client: &'a ClientHandle,
    hub: &'a Hub,
    channels: Vec<Bytes>,
    wakeups: Wakeups,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.hub.stats.blocked.fetch_sub(1, Ordering::Relaxed);
        self.client.set_blocked(false);
        let id = self.wakeups.subscriber.id();
        for channel in &self.channels {
            self.hub.unsubscribe(Kind::Channel, channel, id);
        }
    }
}

impl Waiter {
    async fn wait(mut self, keys: Vec<Bytes>, attempt: Attempt) -> Reply {
        let wakeups = self.hub.waiter();
        let channels: Vec<Bytes> = keys
            .iter()
            .map(|key| [KEYSPACE, key.as_ref()].concat().into())
            .collect();
        let subscribed: Vec<_> = channels
            .iter()
            .map(|channel| {
                self.hub
                    .subscribe(Kind::Channel, channel.clone(), &wakeups.subscriber)
            })
            .collect();
        self.hub.stats.blocked.fetch_add(1, Ordering::Relaxed);
        self.client.set_blocked(true);
        let registration = Registration {
            client: &self.client,
            hub: &self.hub,
            channels,
            wakeups,
        };
        // Registered before the first try: a push after the try is notified. The wait for
        // the masters' confirmations (up to the hub's, with a majority down: 2 s or the node
        // timeout) never outlasts the client's timeout, which then gets its one try, nor its
        // connection.
        tokio::select! {
            _ = futures::future::join_all(subscribed) => {}
            _ = super::sleep_until_some(self.deadline) => {}
            _ = self.ended.wait_for(|ended| *ended) => return Reply::NullArray,
        }
        // A wake-up kept from before a try costs one more try, never a missed one.
        loop {
            // Boxed: only a try needs the fan-out's state, and a waiter waits far longer than
            // it tries (a thousand waiters keep only their small waiting state).
            let pop = first_pop(&self.masters, attempt.slot, &attempt.forms, attempt.replies);
            match Box::pin(pop).await {
                Popped::Value(reply) => return (attempt.shape)(reply),
                Popped::Nothing(reply) if reply.is_error() && !is_no_quorum(&reply) => {
                    return reply
                }
                Popped::Nothing(_) => {}
            }
            tokio::select! {
                _ = registration.wakeups.next() => {}
                _ = super::sleep_until_some(self.deadline) => return Reply::NullArray,
                _ = self.ended.wait_for(|ended| *ended) => return Reply::NullArray,
            }
        }
    }
}

/// Whether `reply` is the proxy's no-quorum error: a blocked pop keeps waiting through it
/// (masters down delay a wake-up, as a Redis that is down would).
fn is_no_quorum(reply: &Reply) -> bool {
    reply.is_error_code("NOQUORUM")
}

/// What a pop on every master found.
enum Popped {
    /// A master popped: its reply (the command's, without the guard's).
    Value(Reply),
    /// None popped: the merged reply (null, or an error Q masters gave).
    Nothing(Reply),
}

/// Sends each master its form of a request for `slot` and answers with the first reply that
/// popped something.
async fn first_pop(masters: &Masters, slot: u16, forms: &Forms, replies: usize) -> Popped {
    let command = |vote: &Vote| -> Option<Reply> {
        match vote {
            Vote::Replied(Reply::Array(pair)) if replies == 2 => pair.first().cloned(),
            Vote::Replied(reply) if replies == 1 => Some(reply.clone()),
            _ => None,
        }
    };
    let popped = |reply: &Reply| match reply {
        Reply::Bulk(_) => true,
        Reply::Array(items) => !items.is_empty(),
        _ => false,
    };
    let (votes, _late) = masters
        .fan_out_each(slot, masters.ask_forms(forms), replies, |votes| {
            votes.iter().filter_map(command).any(|r| popped(&r))
        })
        .await;
    if let Some(value) = votes.iter().filter_map(command).find(popped) {
        return Popped::Value(value);
    }
    let commands: Vec<Vote> = votes
        .iter()
        .map(|vote| match (vote, command(vote)) {
            (Vote::Replied(_), Some(reply)) => Vote::Replied(reply),
            (other, _) => other.clone(),
        })
        .collect();
    Popped::Nothing(merged(&commands, MergeRule::Known))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_read_as_redis_reads_them() {
        let ms = |n| Ok(Some(Duration::from_millis(n)));
        let cases = [
            ("0", Ok(None)),
            ("0.0", Ok(None)),
            ("1", ms(1000)),
            ("0.5", ms(500)),
            ("0.0001", Ok(None)),
            ("0.0019", ms(1)),
            ("1e1", ms(10_000)),
            ("-1", Err(ProxyError::TimeoutNegative)),
            ("-0.001", Err(ProxyError::TimeoutNegative)),
            ("-0.0001", Ok(None)),
            ("x", Err(ProxyError::TimeoutNotFloat)),
            (" 1", Err(ProxyError::TimeoutNotFloat)),
            ("", Err(ProxyError::TimeoutNotFloat)),
            ("nan", Err(ProxyError::TimeoutNotFloat)),
            ("inf", Err(ProxyError::TimeoutNegative)),
            ("1e300", Err(ProxyError::TimeoutNegative)),
            ("9223371000000000", ms(9_223_371_000_000_000_000)),
        ];
        for (arg, expected) in cases {
            assert_eq!(parse_timeout(arg.as_bytes()), expected, "{arg}");
        }
    }
}

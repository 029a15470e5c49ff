//! The command table: every command the proxy knows, its arity, how it is served (answered
//! locally, fanned out to the masters, or refused) and its handler. Arity checks, unknown-command
//! errors and refusals come from this one place, with Redis' own wording.
//!
//! Families: [`set`] (`SET`, the acquire), [`fencing`] (`LOCK.*`), [`scripts`] (`EVAL`,
//! `EVALSHA`, `SCRIPT`), [`keys`] (plain key commands under the quorum reply rule),
//! [`sorted_sets`] (`ZADD`, `ZREM`, … for semaphores over sorted sets), [`hashes`] (`HSET`,
//! `HINCRBY`, … for locks kept as hashes), [`handshake`] (connection commands answered by the
//! proxy itself), [`clients`] (`CLIENT`), [`introspection`] (`INFO`, `COMMAND`), [`pubsub`]
//! (`SUBSCRIBE`, `PUBLISH`, …), [`lists`] (`LPUSH`, `BLPOP`, … as wake-up signals),
//! [`conditional`] (Redis 8.4's `DELEX` and `DIGEST`, Valkey's `DELIFEQ`).
//!
//! Invariant: no family uses another (`tests/layers.rs` checks it). What several share is
//! here: the fan-out under the quorum rule, the guarded write, and one entry per lock
//! operation ([`acquire`], [`release`], …) over [`crate::lock::Acquirer`], which every spelling
//! of that operation (a command, a client library's script, a Redis 8.4 option) calls.

pub mod clients;
pub mod conditional;
pub mod fencing;
pub mod handshake;
pub mod hashes;
pub mod introspection;
pub mod keys;
pub mod lists;
pub mod pubsub;
pub mod scripts;
pub mod set;
pub mod sorted_sets;

use crate::auth::{KeyPatterns, User};
use crate::client_registry::ClientHandle;
use crate::cluster::slots::key_slot;
use crate::condition::{Condition, OnMasters};
use crate::error::ProxyError;
use crate::lease::Outcome;
use crate::lock::guard::{guard_command, guarded};
use crate::lock::{Acquirer, Attempt, Started};
use crate::masters::{Forms, Masters};
use crate::on_master::CONDITIONAL_SCRIPT;
use crate::protocol::{encode_command, Protocol, Reply, Request};
use crate::redlock::MergeRule;
use crate::shared::{Shard, Shared};
use crate::stats::ServerStats;
use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use std::sync::Arc;
use tokio::time::Instant;

/// Per-connection state that commands read and change.
#[derive(Debug)]
pub struct Session {
    /// This client in the registry behind `CLIENT LIST` / `CLIENT KILL`: its id and
    /// addresses.
    pub client: Arc<ClientHandle>,
    pub protocol: Protocol,
    pub name: Option<Bytes>,
    pub lib_name: Option<Bytes>,
    pub lib_ver: Option<Bytes>,
    /// Who the client is; `None` until it authenticates (Redis' `authRequired`).
    pub user: Option<Arc<User>>,
    /// The generation of the user table `user` was resolved in (see [`Shared::users`]).
    pub users_generation: u64,
    /// What the client subscribed to, and its messages.
    pub pubsub: pubsub::Subscriptions,
    /// Longest argument sent on to the masters (`max_value_bytes` when it connected): the cap
    /// the connection's parser reads past, named in the refusal of a longer one.
    max_value_bytes: u64,
    /// Set once the connection ends: a blocked command stops waiting. Made by the first
    /// blocking command (most connections never block: no allocation for them).
    ended: Option<tokio::sync::watch::Sender<bool>>,
}

impl Session {
    /// A new connection's session: authenticated as `default` unless that needs a password;
    /// `max_value_bytes` from the configuration the connection started with.
    pub fn new(shared: &Shared, client: Arc<ClientHandle>, max_value_bytes: u64) -> Session {
        let (users, users_generation) = shared.users();
        Session {
            client,
            protocol: Protocol::Resp2,
            name: None,
            lib_name: None,
            lib_ver: None,
            user: users.initial(),
            users_generation,
            pubsub: pubsub::Subscriptions::default(),
            max_value_bytes,
            ended: None,
        }
    }
}

impl Session {
    /// What a blocking command watches to stop when the connection ends.
    pub fn ended_signal(&mut self) -> tokio::sync::watch::Receiver<bool> {
        self.ended
            .get_or_insert_with(|| tokio::sync::watch::Sender::new(false))
            .subscribe()
    }

    /// The connection ends: blocking commands stop waiting.
    pub fn end(&self) {
        if let Some(ended) = &self.ended {
            ended.send_replace(true);
        }
    }
}

/// How a request is served.
pub enum Action {
    /// Answered at once (local commands, argument errors).
    Ready(Reply),
    /// Answered, then the connection closes (`QUIT`).
    Close(Reply),
    /// Needs the masters.
    Defer(BoxFuture<'static, Outcome>),
    /// Needs the masters, and no later request of this connection may start before it
    /// completes (it will reach the masters later than its place in the pipeline).
    Barrier(BoxFuture<'static, Outcome>),
}

/// Everything a handler may use besides the session.
pub struct Ctx<'a> {
    pub shared: &'a Arc<Shared>,
    /// The shard serving this client: its masters and acquire service.
    pub shard: &'a Shard,
    /// When the request's bytes were read off the client socket (monotonic): the start of the
    /// validity clock.
    pub received_at: Instant,
}

impl Ctx<'_> {
    pub fn masters(&self) -> Arc<Masters> {
        self.shard.masters.clone()
    }
}

impl Action {
    /// Answered at once with `err`.
    pub fn error(err: ProxyError) -> Action {
        Action::Ready(err.into())
    }
}

type Handler = fn(&Ctx<'_>, &mut Session, Request) -> Action;

/// How a command is served.
pub enum Kind {
    Handled(Handler),
    /// Refused through the proxy, with the reason shown to the client.
    Refused(&'static str),
}

/// One row of the command table (the shape Redis' `COMMAND` reports).
pub struct Spec {
    /// Lower-case, as Redis reports it in `COMMAND` and in arity errors.
    pub name: &'static str,
    /// Redis convention: `n` exactly n arguments including the name, `-n` at least n.
    pub arity: i32,
    pub flags: &'static [&'static str],
    pub first_key: i64,
    pub last_key: i64,
    pub step: i64,
    /// Scripts (`EVAL`…): the argument giving the number of keys that follow it (0: none).
    pub numkeys_at: usize,
    pub kind: Kind,
}

const fn spec(
    name: &'static str,
    arity: i32,
    flags: &'static [&'static str],
    keys: (i64, i64, i64),
    handler: Handler,
) -> Spec {
    Spec {
        name,
        arity,
        flags,
        first_key: keys.0,
        last_key: keys.1,
        step: keys.2,
        numkeys_at: 0,
        kind: Kind::Handled(handler),
    }
}

/// A script command: `<name> <script> numkeys key… arg…` (movable keys, as Redis reports).
const fn script(name: &'static str, handler: Handler) -> Spec {
    Spec {
        numkeys_at: 2,
        ..spec(name, -3, SCRIPT, NO_KEYS, handler)
    }
}

const fn refused(name: &'static str, reason: &'static str) -> Spec {
    Spec {
        name,
        arity: -1,
        flags: &[],
        first_key: 0,
        last_key: 0,
        step: 0,
        numkeys_at: 0,
        kind: Kind::Refused(reason),
    }
}

const NO_KEYS: (i64, i64, i64) = (0, 0, 0);
const ONE_KEY: (i64, i64, i64) = (1, 1, 1);
const ALL_KEYS: (i64, i64, i64) = (1, -1, 1);
const WRITE: &[&str] = &["write"];
const READ: &[&str] = &["readonly", "fast"];
const LOCAL: &[&str] = &["fast", "loading", "stale"];
/// Served before authentication (Redis' `CMD_NO_AUTH`).
const NO_AUTH: &[&str] = &["fast", "loading", "stale", "no_auth"];
const PUBSUB: &[&str] = &["pubsub", "noscript", "loading", "stale"];
const BLOCKING: &[&str] = &["write", "noscript", "blocking"];
const BLOCKING_MOVE: &[&str] = &["write", "denyoom", "noscript", "blocking"];
const PUBLISH: &[&str] = &["pubsub", "loading", "stale", "fast", "may_replicate"];
/// What a RESP2 client in subscribed mode may send (`server.c processCommand`).
const SUBSCRIBED_MODE: &[&str] = &[
    "subscribe",
    "psubscribe",
    "ssubscribe",
    "unsubscribe",
    "punsubscribe",
    "sunsubscribe",
    "ping",
    "quit",
    "reset",
];
const SCRIPT: &[&str] = &[
    "noscript",
    "stale",
    "skip_monitor",
    "may_replicate",
    "no_mandatory_keys",
    "movablekeys",
];

const NOT_MAJORITY_SAFE: &str = "it cannot be made majority-safe across independent masters";
const NO_TRANSACTIONS: &str = "transactions cannot be atomic across independent masters";
const ADMIN: &str = "administrative commands must go to each master directly";

/// The command table.
pub static COMMANDS: &[Spec] = &[
    spec("set", -3, &["write", "denyoom"], ONE_KEY, set::set),
    spec("get", 2, READ, ONE_KEY, keys::forward),
    spec("exists", -2, READ, ALL_KEYS, keys::forward),
    spec("del", -2, WRITE, ALL_KEYS, keys::forward),
    spec("unlink", -2, &["write", "fast"], ALL_KEYS, keys::forward),
    spec("pttl", 2, READ, ONE_KEY, keys::ttl),
    spec("ttl", 2, READ, ONE_KEY, keys::ttl),
    spec("pexpire", -3, &["write", "fast"], ONE_KEY, keys::expire),
    spec("expire", -3, &["write", "fast"], ONE_KEY, keys::expire),
    spec("type", 2, READ, ONE_KEY, keys::forward),
    spec("strlen", 2, READ, ONE_KEY, keys::forward),
    spec("delex", -2, &["write", "fast"], ONE_KEY, conditional::delex),
    spec(
        "delifeq",
        3,
        &["write", "fast"],
        ONE_KEY,
        conditional::delifeq,
    ),
    spec("digest", 2, READ, ONE_KEY, conditional::digest),
    spec(
        "zadd",
        -4,
        &["write", "denyoom", "fast"],
        ONE_KEY,
        sorted_sets::zadd,
    ),
    spec("zrem", -3, &["write", "fast"], ONE_KEY, keys::forward),
    spec("zremrangebyscore", 4, WRITE, ONE_KEY, keys::forward),
    spec("zcard", 2, READ, ONE_KEY, keys::forward),
    spec("zscore", 3, READ, ONE_KEY, sorted_sets::zscore),
    spec("zrank", 3, READ, ONE_KEY, keys::forward),
    spec("zrange", -4, &["readonly"], ONE_KEY, sorted_sets::zrange),
    spec(
        "hset",
        -4,
        &["write", "denyoom", "fast"],
        ONE_KEY,
        hashes::write,
    ),
    spec(
        "hincrby",
        4,
        &["write", "denyoom", "fast"],
        ONE_KEY,
        hashes::write,
    ),
    spec("hdel", -3, &["write", "fast"], ONE_KEY, keys::forward),
    spec("hget", 3, READ, ONE_KEY, keys::forward),
    spec("hexists", 3, READ, ONE_KEY, keys::forward),
    spec("hlen", 2, READ, ONE_KEY, keys::forward),
    spec("hgetall", 2, &["readonly"], ONE_KEY, hashes::hgetall),
    spec(
        "lpush",
        -3,
        &["write", "denyoom", "fast"],
        ONE_KEY,
        lists::push,
    ),
    spec(
        "rpush",
        -3,
        &["write", "denyoom", "fast"],
        ONE_KEY,
        lists::push,
    ),
    spec("lpop", -2, &["write", "fast"], ONE_KEY, lists::pop),
    spec("rpop", -2, &["write", "fast"], ONE_KEY, lists::pop),
    spec("lmove", 5, &["write", "denyoom"], (1, 2, 1), lists::lmove),
    spec("llen", 2, READ, ONE_KEY, keys::forward),
    spec("lrange", 4, &["readonly"], ONE_KEY, keys::forward),
    spec("blpop", -3, BLOCKING, (1, -2, 1), lists::blocking_pop),
    spec("brpop", -3, BLOCKING, (1, -2, 1), lists::blocking_pop),
    spec("blmove", 6, BLOCKING_MOVE, (1, 2, 1), lists::blocking_move),
    script("eval", scripts::eval),
    script("eval_ro", scripts::eval),
    script("evalsha", scripts::evalsha),
    script("evalsha_ro", scripts::evalsha),
    spec("script", -2, &["noscript"], NO_KEYS, scripts::script),
    spec("ping", -1, LOCAL, NO_KEYS, handshake::ping),
    spec("echo", 2, LOCAL, NO_KEYS, handshake::echo),
    spec("select", 2, LOCAL, NO_KEYS, handshake::select),
    spec("hello", -1, NO_AUTH, NO_KEYS, handshake::hello),
    spec("auth", -2, NO_AUTH, NO_KEYS, handshake::auth),
    spec("acl", -2, LOCAL, NO_KEYS, handshake::acl),
    spec("client", -2, LOCAL, NO_KEYS, clients::client),
    spec("info", -1, LOCAL, NO_KEYS, introspection::info),
    spec("command", -1, LOCAL, NO_KEYS, introspection::describe),
    spec("quit", -1, NO_AUTH, NO_KEYS, handshake::quit),
    spec("reset", 1, NO_AUTH, NO_KEYS, handshake::reset),
    spec("setnx", 3, WRITE, ONE_KEY, set::setnx),
    spec("lock.acquire", 4, WRITE, ONE_KEY, fencing::lock_acquire),
    spec("lock.token", 3, READ, ONE_KEY, fencing::lock_token),
    spec("lock.release", 3, WRITE, ONE_KEY, fencing::lock_release),
    spec("lock.extend", 4, WRITE, ONE_KEY, fencing::lock_extend),
    refused(
        "persist",
        "a lock without expiry cannot be made safe; use PEXPIRE",
    ),
    refused("flushall", NOT_MAJORITY_SAFE),
    refused("flushdb", NOT_MAJORITY_SAFE),
    refused("keys", NOT_MAJORITY_SAFE),
    refused("scan", NOT_MAJORITY_SAFE),
    refused("randomkey", NOT_MAJORITY_SAFE),
    refused("dbsize", NOT_MAJORITY_SAFE),
    refused("rename", NOT_MAJORITY_SAFE),
    refused("renamenx", NOT_MAJORITY_SAFE),
    refused("move", NOT_MAJORITY_SAFE),
    refused("swapdb", NOT_MAJORITY_SAFE),
    refused("multi", NO_TRANSACTIONS),
    refused("exec", NO_TRANSACTIONS),
    refused("discard", NO_TRANSACTIONS),
    refused("watch", NO_TRANSACTIONS),
    refused("unwatch", NO_TRANSACTIONS),
    spec("subscribe", -2, PUBSUB, NO_KEYS, pubsub::subscribe),
    spec("psubscribe", -2, PUBSUB, NO_KEYS, pubsub::subscribe),
    spec("ssubscribe", -2, PUBSUB, NO_KEYS, pubsub::subscribe),
    spec("unsubscribe", -1, PUBSUB, NO_KEYS, pubsub::unsubscribe),
    spec("punsubscribe", -1, PUBSUB, NO_KEYS, pubsub::unsubscribe),
    spec("sunsubscribe", -1, PUBSUB, NO_KEYS, pubsub::unsubscribe),
    spec("publish", 3, PUBLISH, NO_KEYS, pubsub::publish),
    spec("spublish", 3, PUBLISH, NO_KEYS, pubsub::publish),
    spec("pubsub", -2, PUBSUB, NO_KEYS, pubsub::pubsub),
    refused("monitor", ADMIN),
    refused("config", ADMIN),
    refused("debug", ADMIN),
    refused("shutdown", ADMIN),
    refused("save", ADMIN),
    refused("bgsave", ADMIN),
    refused("bgrewriteaof", ADMIN),
    refused("replicaof", ADMIN),
    refused("slaveof", ADMIN),
    refused("failover", ADMIN),
    refused("module", ADMIN),
    refused("function", ADMIN),
    refused("fcall", ADMIN),
];

impl Spec {
    /// The key arguments of a request for this command: by first key, last key and step, or
    /// for scripts the `numkeys` keys after it (none if `numkeys` is not valid: the handler
    /// answers that error, as Redis' `evalGetKeys`).
    fn keys<'a>(&self, args: &'a [Bytes]) -> &'a [Bytes] {
        if self.numkeys_at > 0 {
            let count = args
                .get(self.numkeys_at)
                .and_then(|n| crate::protocol::parse_strict_i64(n))
                .and_then(|n| usize::try_from(n).ok())
                .filter(|n| *n < args.len() - self.numkeys_at)
                .unwrap_or(0);
            return &args[self.numkeys_at + 1..self.numkeys_at + 1 + count];
        }
        let n = args.len() as i64;
        let last = if self.last_key < 0 {
            n + self.last_key
        } else {
            self.last_key
        };
        if self.first_key <= 0 || last < self.first_key {
            return &[];
        }
        &args[self.first_key as usize..=last.min(n - 1) as usize]
    }
}

/// [`crate::on_master::RESERVED_PREFIX`]: keys no client command or script may touch.
pub const RESERVED_PREFIX: &[u8] = crate::on_master::RESERVED_PREFIX.as_bytes();

/// Whether a client key falls under [`RESERVED_PREFIX`].
pub fn is_reserved_key(key: &Bytes) -> bool {
    key.starts_with(RESERVED_PREFIX)
}

/// Looks a command name up, case-insensitively.
pub fn lookup(name: &[u8]) -> Option<&'static Spec> {
    slot_of(name).map(|slot| &COMMANDS[slot])
}

/// The row of the command table of a command name, case-insensitively.
pub fn slot_of(name: &[u8]) -> Option<usize> {
    COMMANDS
        .iter()
        .position(|s| s.name.as_bytes().eq_ignore_ascii_case(name))
}

/// The subcommands served, as Redis 7 names them in `CLIENT LIST` (`cmd=client|list`).
const SUBCOMMANDS: &[&str] = &[
    "acl|whoami",
    "client|getname",
    "client|id",
    "client|info",
    "client|kill",
    "client|list",
    "client|setinfo",
    "client|setname",
    "command|count",
    "command|docs",
    "command|info",
    "command|list",
    "script|exists",
    "script|flush",
    "script|help",
    "script|kill",
    "script|load",
];

/// What `CLIENT LIST` shows as a request's command, for [`shown_name`]: the row of the table,
/// or for a served subcommand its place in [`SUBCOMMANDS`] after the table.
fn shown_command(slot: usize, args: &[Bytes]) -> usize {
    let name = COMMANDS[slot].name;
    if !matches!(name, "acl" | "client" | "command" | "script") {
        return slot;
    }
    let served = |sub: &Bytes| {
        SUBCOMMANDS.iter().position(|shown| {
            shown.split_once('|').is_some_and(|(container, known)| {
                container == name && known.as_bytes().eq_ignore_ascii_case(sub)
            })
        })
    };
    args.get(1)
        .and_then(served)
        .map_or(slot, |i| COMMANDS.len() + i)
}

/// The name `CLIENT LIST` shows for a [`shown_command`].
pub fn shown_name(shown: usize) -> &'static str {
    match COMMANDS.get(shown) {
        Some(spec) => spec.name,
        None => SUBCOMMANDS[shown - COMMANDS.len()],
    }
}

/// Serves one request, counted per command and noted as the client's last.
pub fn dispatch(ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    let slot = request.args.first().and_then(|name| slot_of(name));
    ctx.shared.stats.count_command(slot);
    let shown = slot.map(|slot| shown_command(slot, &request.args));
    session.client.touch(shown, ctx.received_at);
    // The parser read past an argument over `max_value_bytes` (its bytes are gone): refused
    // whatever the command, as Redis answers a bulk over `proto-max-bulk-len` for any.
    if let Some(len) = request.oversized {
        return Action::error(ProxyError::ArgumentTooLong {
            len,
            cap: session.max_value_bytes,
        });
    }
    let Some(spec) = slot.map(|slot| &COMMANDS[slot]) else {
        return Action::error(ProxyError::unknown_command(&request.args));
    };
    let action = serve(ctx, session, spec, request);
    // Commands that rename the client, change its protocol or its user show in `CLIENT LIST`.
    if matches!(spec.name, "client" | "hello" | "reset" | "auth") {
        session.client.set_names(
            &session.name,
            (&session.lib_name, &session.lib_ver),
            session.protocol,
            session.user.as_ref().map(|u| u.name.as_str()),
        );
    }
    action
}

fn serve(ctx: &Ctx<'_>, session: &mut Session, spec: &'static Spec, request: Request) -> Action {
    match spec.kind {
        Kind::Refused(reason) => Action::error(ProxyError::Refused {
            command: spec.name.to_ascii_uppercase(),
            reason,
        }),
        Kind::Handled(handler) => {
            let n = request.args.len() as i32;
            let arity_ok = if spec.arity >= 0 {
                n == spec.arity
            } else {
                n >= -spec.arity
            };
            if !arity_ok {
                return Action::error(ProxyError::WrongArity(spec.name.into()));
            }
            let keys = spec.keys(&request.args);
            if let Err(denied) = check_access(ctx.shared, session, spec, keys) {
                return denied;
            }
            if keys.iter().any(is_reserved_key) {
                return Action::error(ProxyError::ReservedKey);
            }
            if ctx.shared.masters().any_cluster() {
                if let Err(refused) = cluster_checks(keys) {
                    return Action::error(refused);
                }
            }
            if session.protocol == Protocol::Resp2
                && session.pubsub.active()
                && !SUBSCRIBED_MODE.contains(&spec.name)
            {
                return Action::error(ProxyError::SubscribedContext(spec.name.into()));
            }
            handler(ctx, session, request)
        }
    }
}

/// Whether the session may run `spec` on `keys`: authenticated (or a `no_auth` command), its
/// user still enabled after a reload, and every key within the user's patterns.
fn check_access(
    shared: &Shared,
    session: &mut Session,
    spec: &Spec,
    keys: &[Bytes],
) -> Result<(), Action> {
    if shared.users_generation() != session.users_generation {
        // The user table was reloaded: the session follows its user's new definition, and
        // ends if the user was removed or disabled (Redis kills the clients of a deleted user).
        let (users, generation) = shared.users();
        session.users_generation = generation;
        if let Some(user) = session.user.take() {
            session.user = users.current(&user.name);
            if session.user.is_none() {
                return Err(Action::Close(
                    ProxyError::UserRevoked(user.name.clone()).into(),
                ));
            }
        }
    }
    let Some(user) = &session.user else {
        if spec.flags.contains(&"no_auth") {
            return Ok(());
        }
        return Err(Action::error(ProxyError::NoAuth));
    };
    if let KeyPatterns::Some(_) = &user.keys {
        if !keys.iter().all(|key| user.keys.allows(key)) {
            return Err(Action::error(ProxyError::NoPermKeys));
        }
    }
    Ok(())
}

/// Where a master is a Redis Cluster: a command's keys must share one slot (every master's
/// keys of a command live on one node).
fn cluster_checks(keys: &[Bytes]) -> Result<(), ProxyError> {
    match keys.split_first() {
        Some((first, rest)) => {
            let slot = key_slot(first);
            match rest.iter().all(|k| key_slot(k) == slot) {
                true => Ok(()),
                false => Err(ProxyError::CrossSlot),
            }
        }
        None => Ok(()),
    }
}

/// Sleeps until `deadline`, or forever without one. Lazy: a branch of the loop's `select!`
/// that is disabled builds no timer (`select!` evaluates every branch's future).
pub async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Parses an integer argument the way Redis does (`getLongLongFromObject`).
pub fn parse_int(arg: &[u8]) -> Result<i64, ProxyError> {
    crate::protocol::parse_strict_i64(arg).ok_or(ProxyError::NotAnInteger)
}

/// Redis allows only printable ASCII without spaces in client names and library info.
pub fn printable(text: &[u8]) -> bool {
    text.iter().all(|c| (b'!'..=b'~').contains(c))
}

/// A client name as Redis accepts it (`CLIENT SETNAME`, `HELLO … SETNAME`).
pub fn check_client_name(name: &[u8]) -> Result<(), ProxyError> {
    if !printable(name) {
        return Err(ProxyError::ClientName);
    }
    Ok(())
}

/// The Redis version the proxy presents itself as (the protocol level it implements).
pub const REDIS_VERSION: &str = "7.0.15";

// The helpers below are what command modules share: no command module uses another, so a
// new spelling of an operation is a row of the table and a handler over these.

/// An acquire refused by rule before it reaches the masters: counted, then answered `err`.
pub fn refuse_acquire(ctx: &Ctx<'_>, err: ProxyError) -> Action {
    ctx.shard.acquirer.stats.refused_by_rule();
    Action::error(err)
}

/// The Redlock acquire `attempt` ([`crate::lock::Acquirer::acquire`]): `SET … NX PX`,
/// `LOCK.ACQUIRE` and node-redlock's acquire script.
pub fn acquire(ctx: &Ctx<'_>, attempt: Attempt) -> Action {
    match ctx.shard.acquirer.acquire(attempt) {
        Started::Leading(acquire) => Action::Defer(acquire),
        // Nothing later from this client may reach the masters before this acquire has
        // (a pipelined `DEL` must not overtake its `SET`): a barrier.
        Started::Queued(acquire) => Action::Barrier(acquire),
    }
}

/// The release of `key` if it holds `value` on every master ([`LockOps::release`]).
pub fn release(ctx: &Ctx<'_>, key: Bytes, value: Bytes) -> Action {
    let ops = LockOps::of(ctx);
    Action::Defer(Box::pin(async move {
        Outcome::Reply(ops.release(&key, &value).await)
    }))
}

/// What a lock operation decided after the request's handler returned needs of its context
/// (a Redis 8.4 condition is resolved against the masters' answers first).
#[derive(Clone)]
pub struct LockOps {
    pub acquirer: Arc<Acquirer>,
    stats: Arc<ServerStats>,
    /// When the request was read: the start of its validity clock.
    pub received_at: Instant,
}

impl LockOps {
    pub fn of(ctx: &Ctx<'_>) -> LockOps {
        LockOps {
            acquirer: ctx.shard.acquirer.clone(),
            stats: ctx.shared.stats.clone(),
            received_at: ctx.received_at,
        }
    }

    /// The release of `key` if it holds `value`, on every master, answered by the release rule
    /// ([`crate::lock::Acquirer::release`]) and counted: `LOCK.RELEASE`, the compare-and-delete
    /// script of every client library, node-redlock's release, `DELEX … IFEQ`, `DELIFEQ`.
    pub async fn release(&self, key: &Bytes, value: &Bytes) -> Reply {
        let reply = self.acquirer.release(key, value).await;
        self.stats.count_if_release(MergeRule::Release, &reply);
        reply
    }

    /// The value a majority holds at `key` (`GET` under the quorum rule), or the reply to
    /// answer instead (`WRONGTYPE`, `NOQUORUM`).
    pub async fn value(&self, key: &Bytes) -> Result<Option<Bytes>, Reply> {
        let get = encode_command(&[b"GET".as_ref(), key]);
        let masters = self.acquirer.masters();
        match masters
            .quorum_reply(key_slot(key), &get, MergeRule::Known)
            .await
        {
            Reply::Bulk(value) => Ok(Some(value)),
            Reply::Null => Ok(None),
            other => Err(other),
        }
    }

    /// `condition` as the masters can check it, with the value a majority holds where it had
    /// to be read (a digest condition: [`crate::condition`]), or the reply to answer instead.
    pub async fn resolve(
        &self,
        key: &Bytes,
        condition: &Condition,
    ) -> Result<(Option<Bytes>, OnMasters), Reply> {
        let current = match condition.needs_value() {
            true => self.value(key).await?,
            false => None,
        };
        let on_masters = condition.resolve(current.as_ref());
        Ok((current, on_masters))
    }

    /// A conditional write that is not a lock operation ([`CONDITIONAL_SCRIPT`] with `args`
    /// after the key) on every master, under the quorum rule.
    pub async fn conditional(&self, key: &Bytes, args: &[&[u8]]) -> Reply {
        let script = CONDITIONAL_SCRIPT.text().as_bytes();
        let mut call: Vec<&[u8]> = vec![b"EVAL", script, b"1", key];
        call.extend(args);
        let masters = self.acquirer.masters();
        let payload = encode_command(&call);
        masters
            .quorum_reply(key_slot(key), &payload, MergeRule::Known)
            .await
    }
}

/// How a reply read in RESP2 becomes Redis 7's reply to a RESP3 client.
pub type Shape = fn(Reply) -> Reply;

/// A flat `a, b, a, b, …` array (as the masters answer in RESP2) as its pairs, for the RESP3
/// shapes built from them; any other reply comes back as it is.
pub fn pairs(reply: Reply) -> Result<Vec<(Reply, Reply)>, Reply> {
    match reply {
        Reply::Array(flat) if flat.len() % 2 == 0 => {
            let mut pairs = Vec::with_capacity(flat.len() / 2);
            let mut items = flat.into_iter();
            while let (Some(a), Some(b)) = (items.next(), items.next()) {
                pairs.push((a, b));
            }
            Ok(pairs)
        }
        other => Err(other),
    }
}

/// The bytes to send the masters: the request as it was received, or re-encoded (inline).
pub fn payload(request: Request) -> Bytes {
    request.raw.unwrap_or_else(|| encode_command(&request.args))
}

/// The slot of a forwarded command: that of its key, which every command forwarded here has
/// first (`args[1]`) if it has one (a command of keys of several slots is refused where a
/// master is a cluster: [`dispatch`]).
pub fn request_slot(request: &Request) -> u16 {
    crate::masters::slot_of(request.args.get(1..2).unwrap_or_default())
}

/// Sends `request` to every master as it was received and answers by the quorum rule.
pub fn forward_request(masters: Arc<Masters>, request: Request) -> Action {
    let slot = request_slot(&request);
    let payload = payload(request);
    Action::Defer(Box::pin(async move {
        Outcome::Reply(masters.quorum_reply(slot, &payload, MergeRule::Known).await)
    }))
}

/// `shape` for a RESP3 session when `applies`, else the reply as the masters gave it.
pub fn resp3(session: &Session, applies: bool, shape: Shape) -> Shape {
    match (session.protocol, applies) {
        (Protocol::Resp3, true) => shape,
        _ => |reply| reply,
    }
}

/// Fans `request` out under the quorum rule and shapes the merged reply.
pub fn shaped(ctx: &Ctx<'_>, request: Request, shape: Shape) -> Action {
    match forward_request(ctx.masters(), request) {
        Action::Defer(reply) => Action::Defer(Box::pin(async move {
            match reply.await {
                Outcome::Reply(reply) => Outcome::Reply(shape(reply)),
                other => other,
            }
        })),
        other => other,
    }
}

/// A command that can create its key (`args[1]`), sent to every master followed in the same
/// pipeline by the script guard over that key ([`guard_command`]): a key without expiry, or
/// with one longer than the lease bound, gets the bound; a shorter TTL is kept. The merged
/// reply (quorum rule, counting only the masters the guard vouched for) is the command's own,
/// shaped.
pub fn guarded_write(ctx: &Ctx<'_>, request: Request, shape: Shape) -> Action {
    guarded_write_at(ctx, request, 1, shape)
}

/// [`guarded_write`] for a command whose key is `args[key]`.
pub fn guarded_write_at(ctx: &Ctx<'_>, request: Request, key: usize, shape: Shape) -> Action {
    let masters = ctx.masters();
    let guarded_key = request.args[key].clone();
    let slot = crate::masters::slot_of(&[&guarded_key]);
    let both = with_guard(ctx, &payload(request), &guarded_key);
    Action::Defer(Box::pin(async move {
        let ask = masters.ask_forms(&both);
        let reply = guarded(&masters, slot, ask, MergeRule::Known).await.reply;
        Outcome::Reply(shape(reply))
    }))
}

/// `command` (encoded) followed, in the same pipeline, by the script guard over `key`
/// ([`guard_command`]), in each master's form (a cluster's guard checks the slot's markers).
pub fn with_guard(ctx: &Ctx<'_>, command: &[u8], key: &Bytes) -> Forms {
    let policy = &ctx.shared.policy;
    Forms::new(&ctx.masters(), |cluster| {
        let mut both = BytesMut::from(command);
        both.extend_from_slice(&guard_command(std::slice::from_ref(key), policy, cluster));
        both.freeze()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_unique_and_lower_case() {
        for (i, s) in COMMANDS.iter().enumerate() {
            assert_eq!(s.name, s.name.to_ascii_lowercase());
            assert!(
                COMMANDS[i + 1..].iter().all(|o| o.name != s.name),
                "{}",
                s.name
            );
        }
        assert!(lookup(b"SeT").is_some());
        // `Spec::keys` takes key ranges as one slice: every step is 1 (or 0 without keys).
        assert!(COMMANDS.iter().all(|s| s.step <= 1), "a key step above 1");
        assert!(lookup(b"nope").is_none());
    }
}

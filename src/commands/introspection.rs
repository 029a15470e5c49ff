//! Commands that describe the proxy: `INFO` (Redis' format and sections where they apply:
//! `server`, `clients`, `persistence`, `stats`, `replication`, plus a `masters` section on the
//! state and votes of each master) and `COMMAND` (the command table in Redis' shapes, so
//! redis-cli's hints and clients' command discovery work).

use super::{Action, Ctx, Session, COMMANDS, REDIS_VERSION};
use crate::error::ProxyError;
use crate::lock::AcquireResult;
use crate::masters::Voter;
use crate::masters::{deployment_label, MasterFacts};
use crate::protocol::{Reply, Request};
use crate::shared::Shared;
use crate::stats::ReleaseResult;
use bytes::Bytes;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

/// `INFO [section …]`: Redis' format (`# Section` then `field:value` lines); no section,
/// `default`, `all` or `everything` give every section. ioredis' ready check needs a string
/// reply with `loading:0`; the `masters` section shows each master's state and votes.
pub fn info(ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    let wanted: Vec<String> = request.args[1..]
        .iter()
        .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
        .collect();
    let show = |section: &str| {
        wanted.is_empty()
            || wanted
                .iter()
                .any(|w| w == section || w == "all" || w == "default" || w == "everything")
    };
    let shared = ctx.shared;
    let mut out = String::new();
    if show("server") {
        server_section(&mut out, shared, session.client.local.port());
    }
    if show("clients") {
        let _ = write!(
            out,
            "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\nblocked_clients:{}\r\n\r\n",
            shared.clients.load(Ordering::Relaxed),
            shared.live_config().maxclients,
            shared.pubsub.stats.blocked.load(Ordering::Relaxed),
        );
    }
    if show("persistence") {
        out.push_str("# Persistence\r\nloading:0\r\n\r\n");
    }
    if show("stats") {
        stats_section(&mut out, shared);
    }
    if show("replication") {
        out.push_str("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n\r\n");
    }
    if show("masters") {
        masters_section(&mut out, shared);
    }
    // As in Redis, not a default section: only named, or with `all` / `everything`.
    let named = |section: &str| {
        wanted
            .iter()
            .any(|w| w == section || w == "all" || w == "everything")
    };
    if named("commandstats") {
        commandstats_section(&mut out, shared);
    }
    if out.ends_with("\r\n\r\n") {
        out.truncate(out.len() - 2);
    }
    Action::Ready(Reply::Verbatim(Bytes::from(out)))
}

/// Appends INFO's `server` section; `port` is the one the client connected to.
fn server_section(out: &mut String, shared: &Shared, port: u16) {
    let uptime = shared.started.elapsed().as_secs();
    let _ = write!(
        out,
        "# Server\r\nredis_version:{REDIS_VERSION}\r\nredlock_proxy_version:{}\r\nredis_mode:standalone\r\narch_bits:64\r\nprocess_id:{}\r\ntcp_port:{port}\r\nuptime_in_seconds:{uptime}\r\nuptime_in_days:{}\r\n",
        env!("CARGO_PKG_VERSION"),
        std::process::id(),
        uptime / 86_400,
    );
    if let Some(addr) = shared.metrics_addr.get() {
        let _ = write!(out, "metrics_addr:{addr}\r\n");
    }
    out.push_str("\r\n");
}

/// Appends INFO's `stats` section: Redis' counters, then acquires and releases by result.
fn stats_section(out: &mut String, shared: &Shared) {
    let (stats, locks) = (&shared.stats, shared.acquire_stats());
    let _ = write!(
        out,
        "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\ninstantaneous_ops_per_sec:{}\r\nrejected_connections:{}\r\n",
        stats.connections_received.get(),
        stats.total_commands(),
        stats.ops_per_sec(),
        stats.rejected_connections.get(),
    );
    let acquires = AcquireResult::ALL.map(|r| ("acquires", r.label(), locks.acquires(r)));
    let releases = ReleaseResult::ALL.map(|r| ("releases", r.label(), stats.releases(r)));
    for (what, result, n) in acquires.into_iter().chain(releases) {
        let _ = write!(out, "{what}_{result}:{n}\r\n");
    }
    let _ = write!(
        out,
        "rollbacks:{}\r\nlate_cleanups:{}\r\nadmission_limit:{}\r\n",
        locks.rollbacks.get(),
        locks.late_cleanups.get(),
        shared.masters().admission.limit()
    );
    // Redis' `pubsub_channels`, `pubsub_patterns`, `pubsub_shardchannels` (of this proxy's
    // clients), then the messages passed on and the masters' copies dropped.
    for (kind, n) in shared.pubsub.subscriptions() {
        let _ = write!(out, "pubsub_{}s:{n}\r\n", kind.label());
    }
    let pubsub = &shared.pubsub.stats;
    let _ = write!(
        out,
        "pubsub_messages_delivered:{}\r\npubsub_copies_dropped:{}\r\n\r\n",
        pubsub.delivered.load(Ordering::Relaxed),
        pubsub.duplicates.load(Ordering::Relaxed)
    );
}

/// Appends INFO's `commandstats` section: Redis' `cmdstat_<name>:calls=<n>` line for each row
/// of the command table that was called (the proxy does not time commands per row).
fn commandstats_section(out: &mut String, shared: &Shared) {
    out.push_str("# Commandstats\r\n");
    for (slot, spec) in COMMANDS.iter().enumerate() {
        let calls = shared.stats.commands_of(Some(slot));
        if calls > 0 {
            let _ = write!(out, "cmdstat_{}:calls={calls}\r\n", spec.name);
        }
    }
    out.push_str("\r\n");
}

/// Appends INFO's `masters` section: the quorum and lock policy, then one line per master.
fn masters_section(out: &mut String, shared: &Shared) {
    let masters = shared.masters();
    let policy = &shared.policy;
    let _ = write!(
        out,
        "# Masters\r\nmasters:{}\r\nquorum:{}\r\nnode_timeout_ms:{}\r\ndrift_factor:{}\r\nmax_lock_ttl_ms:{}\r\nquarantine_ms:{}\r\nwait_replicas:{}\r\ndeployment:{}\r\n",
        masters.voters().len(),
        masters.quorum(),
        masters.node_timeout().as_millis(),
        policy.drift_factor,
        policy.max_lock_ttl_ms,
        policy.lease_bound().as_millis(),
        masters.wait_replicas(),
        deployment_label(masters.deployment()),
    );
    for (i, voter) in masters.voters().iter().enumerate() {
        master_line(out, i, voter);
    }
    out.push_str("\r\n");
}

/// Appends the `master{i}` line: the master's address, state, votes and connections.
fn master_line(out: &mut String, i: usize, voter: &Voter) {
    let f = MasterFacts::of(voter);
    let _ = write!(
        out,
        "master{i}:addr={},state={},replies={},missing={},missing_not_eligible={},missing_no_link={},missing_timeout={},missing_closed={},missing_unconfirmed={},connects={},retired_connections={},pending_cleanups={},clock_age_ms={},clock_error_ms={},quarantine_cause={}\r\n",
        f.addr,
        f.state,
        f.replies,
        f.missing,
        f.not_eligible,
        f.no_link,
        f.timeout,
        f.closed,
        f.unconfirmed,
        f.connects,
        f.retired_connections,
        f.pending_cleanups,
        f.clock.map_or(-1, |(age, _)| age.as_millis() as i64),
        f.clock.map_or(-1, |(_, error)| error.as_millis() as i64),
        f.quarantine_cause.unwrap_or("-"),
    );
}

fn command_entry(spec: &super::Spec) -> Reply {
    Reply::Array(vec![
        Reply::bulk(spec.name),
        Reply::Integer(spec.arity.into()),
        Reply::Array(spec.flags.iter().map(|f| Reply::simple(f)).collect()),
        Reply::Integer(spec.first_key),
        Reply::Integer(spec.last_key),
        Reply::Integer(spec.step),
    ])
}

fn served() -> impl Iterator<Item = &'static super::Spec> {
    COMMANDS
        .iter()
        .filter(|s| matches!(s.kind, super::Kind::Handled(_)))
}

/// `COMMAND`, `COMMAND COUNT|INFO|DOCS|LIST`: describes the commands the proxy serves.
pub fn describe(_ctx: &Ctx<'_>, _s: &mut Session, request: Request) -> Action {
    let args = &request.args;
    let Some(sub) = args.get(1).map(|a| a.to_ascii_uppercase()) else {
        return Action::Ready(Reply::Array(served().map(command_entry).collect()));
    };
    let reply = match sub.as_slice() {
        b"COUNT" => Reply::Integer(served().count() as i64),
        b"LIST" => Reply::Array(served().map(|s| Reply::bulk(s.name)).collect()),
        b"INFO" => Reply::Array(
            args[2..]
                .iter()
                .map(|name| super::lookup(name).map_or(Reply::Null, command_entry))
                .collect(),
        ),
        b"DOCS" => {
            let names: Vec<&super::Spec> = if args.len() > 2 {
                args[2..].iter().filter_map(|n| super::lookup(n)).collect()
            } else {
                served().collect()
            };
            Reply::Map(
                names
                    .into_iter()
                    .map(|s| {
                        (
                            Reply::bulk(s.name),
                            Reply::Map(vec![
                                (Reply::bulk("summary"), Reply::bulk(summary(s))),
                                (Reply::bulk("since"), Reply::bulk(since(s))),
                                (Reply::bulk("group"), Reply::bulk(group(s))),
                            ]),
                        )
                    })
                    .collect(),
            )
        }
        _ => ProxyError::unknown_subcommand(&args[1], "COMMAND").into(),
    };
    Action::Ready(reply)
}

/// The version that brought the command, as Redis' (and Valkey's) `COMMAND DOCS` say it.
fn since(spec: &super::Spec) -> &'static str {
    match spec.name {
        "delex" | "digest" => "8.4.0",
        "delifeq" => "9.0.0",
        _ => "1.0.0",
    }
}

fn group(spec: &super::Spec) -> &'static str {
    match spec.name {
        "delex" | "digest" | "delifeq" => "string",
        _ => "generic",
    }
}

fn summary(spec: &super::Spec) -> &'static str {
    match spec.kind {
        super::Kind::Refused(_) => "Refused by redlock-proxy",
        super::Kind::Handled(_) => match spec.name {
            "set" => "Acquire a lock (NX with PX/EX), extend or hand it over (IFEQ with PX/EX) by Redlock majority, or write to every master",
            "delex" => "Release a lock (IFEQ, IFDEQ, IFDNE: compare-and-delete on every master), or delete conditionally; reply 1 or 0",
            "delifeq" => "Release a lock if value holds it (compare-and-delete); reply 1 or 0",
            "digest" => "The XXH3 digest of the value a majority holds, as 16 hex digits",
            "eval" | "evalsha" | "eval_ro" | "evalsha_ro" => {
                "Run a script on every master; reply by quorum"
            }
            "script" => "Manage the script cache of the proxy and the masters",
            "get" | "exists" | "pttl" | "ttl" | "type" | "strlen" | "zcard" | "zscore"
            | "zrank" | "zrange" | "hget" | "hexists" | "hlen" | "hgetall" => {
                "Read from every master; reply by quorum"
            }
            "del" | "unlink" | "pexpire" | "expire" | "zrem" | "zremrangebyscore" | "hdel" => {
                "Write to every master; reply by quorum"
            }
            "zadd" | "hset" | "hincrby" => {
                "Write to every master, the key capped at the lease bound; reply by quorum"
            }
            "lock.acquire" => {
                "Acquire a lock by Redlock majority; reply [fencing token, validity ms] or null"
            }
            "lock.token" => "The fencing token of the grant that value holds on key, or null",
            "lock.release" => "Release a lock if value holds it (compare-and-delete); reply 1 or 0",
            "lock.extend" => {
                "Extend a lock value holds by Redlock majority; reply validity ms or null"
            }
            _ => "Answered by the proxy",
        },
    }
}

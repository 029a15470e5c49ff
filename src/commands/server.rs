//! Connection and handshake commands answered by the proxy itself: `PING`, `ECHO`, `SELECT`,
//! `HELLO`, `AUTH`, `CLIENT`, `INFO`, `COMMAND`, `QUIT`, `RESET`.
//!
//! These are what unmodified clients send before any lock command (redis-py and node-redis 6
//! `HELLO 3`, ioredis' `INFO` ready check, `CLIENT SETINFO`, redis-cli's `COMMAND DOCS`); each
//! gets the reply shape Redis 7 gives, so no client notices it is not talking to one Redis.

use super::{not_an_integer, unknown_subcommand, wrong_arity, Action, Ctx, Session, COMMANDS};
use crate::protocol::{Protocol, Reply, Request};
use bytes::Bytes;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

/// The Redis version the proxy presents itself as (the protocol level it implements).
pub const REDIS_VERSION: &str = "7.0.15";

pub fn ping(_ctx: &Ctx<'_>, _s: &mut Session, request: Request) -> Action {
    Action::Ready(match request.args.len() {
        1 => Reply::simple("PONG"),
        2 => Reply::Bulk(request.args[1].clone()),
        _ => wrong_arity("ping"),
    })
}

pub fn echo(_ctx: &Ctx<'_>, _s: &mut Session, request: Request) -> Action {
    Action::Ready(Reply::Bulk(request.args[1].clone()))
}

/// Only DB 0 exists: locks must live in the same keyspace on every master.
pub fn select(_ctx: &Ctx<'_>, _s: &mut Session, request: Request) -> Action {
    Action::Ready(match super::parse_int(&request.args[1]) {
        None => not_an_integer(),
        Some(0) => Reply::ok(),
        Some(db) => Reply::error(format!(
            "ERR SELECT {db} is refused by redlock-proxy: locks live in DB 0 on every master"
        )),
    })
}

/// No password is configured on the proxy, so Redis' own answer for that case.
pub fn auth(_ctx: &Ctx<'_>, _s: &mut Session, request: Request) -> Action {
    Action::Ready(if request.args.len() > 3 {
        super::syntax_error()
    } else {
        Reply::error("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?")
    })
}

/// `HELLO [protover [AUTH user pass] [SETNAME name]]`: switches the protocol and answers the
/// server map Redis 7 gives (redis-py checks `proto` in it).
pub fn hello(_ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    let args = &request.args;
    let mut protocol = session.protocol;
    if let Some(ver) = args.get(1) {
        protocol = match super::parse_int(ver) {
            None => {
                return Action::Ready(Reply::error(
                    "ERR Protocol version is not an integer or out of range",
                ))
            }
            Some(2) => Protocol::Resp2,
            Some(3) => Protocol::Resp3,
            Some(_) => return Action::Ready(Reply::error("NOPROTO unsupported protocol version")),
        };
    }
    let mut name = None;
    let mut i = 2;
    while i < args.len() {
        let opt = args[i].to_ascii_uppercase();
        match opt.as_slice() {
            // The default user has no password on the proxy: any credentials are accepted,
            // as Redis does for a `nopass` default user.
            b"AUTH" if i + 2 < args.len() => i += 3,
            b"SETNAME" if i + 1 < args.len() => {
                if let Err(reply) = check_client_name(&args[i + 1]) {
                    return Action::Ready(reply);
                }
                name = Some(args[i + 1].clone());
                i += 2;
            }
            _ => {
                return Action::Ready(Reply::error(format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(&args[i])
                )))
            }
        }
    }
    session.protocol = protocol;
    if name.is_some() {
        session.name = name;
    }
    let proto = match protocol {
        Protocol::Resp2 => 2,
        Protocol::Resp3 => 3,
    };
    Action::Ready(Reply::Map(vec![
        (Reply::bulk("server"), Reply::bulk("redis")),
        (Reply::bulk("version"), Reply::bulk(REDIS_VERSION)),
        (Reply::bulk("proto"), Reply::Integer(proto)),
        (Reply::bulk("id"), Reply::Integer(session.id as i64)),
        (Reply::bulk("mode"), Reply::bulk("standalone")),
        (Reply::bulk("role"), Reply::bulk("master")),
        (Reply::bulk("modules"), Reply::Array(vec![])),
    ]))
}

fn check_client_name(name: &[u8]) -> Result<(), Reply> {
    if name.iter().any(|&c| !(b'!'..=b'~').contains(&c)) {
        return Err(Reply::error(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    Ok(())
}

fn client_info_line(session: &Session) -> String {
    let text = |b: &Option<Bytes>| {
        b.as_ref()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    };
    let resp = match session.protocol {
        Protocol::Resp2 => 2,
        Protocol::Resp3 => 3,
    };
    format!(
        "id={} addr={} laddr={} fd=0 name={} db=0 resp={} lib-name={} lib-ver={}\n",
        session.id,
        session.peer,
        session.local,
        text(&session.name),
        resp,
        text(&session.lib_name),
        text(&session.lib_ver)
    )
}

/// `CLIENT ID|SETNAME|GETNAME|SETINFO|INFO|LIST|HELP`; other subcommands get Redis'
/// unknown-subcommand error (clients ignore it, e.g. `CLIENT MAINT_NOTIFICATIONS`).
pub fn client(_ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    let args = &request.args;
    let sub = args[1].to_ascii_uppercase();
    let reply = match (sub.as_slice(), args.len()) {
        (b"ID", 2) => Reply::Integer(session.id as i64),
        (b"GETNAME", 2) => session.name.clone().map_or(Reply::Null, Reply::Bulk),
        (b"SETNAME", 3) => match check_client_name(&args[2]) {
            Ok(()) => {
                session.name = (!args[2].is_empty()).then(|| args[2].clone());
                Reply::ok()
            }
            Err(reply) => reply,
        },
        (b"SETINFO", 4) => {
            let attr = args[2].to_ascii_uppercase();
            match attr.as_slice() {
                b"LIB-NAME" | b"LIB-VER"
                    if args[3].iter().any(|&c| !(b'!'..=b'~').contains(&c)) =>
                {
                    Reply::error(format!(
                        "ERR {} cannot contain spaces, newlines or special characters.",
                        String::from_utf8_lossy(&attr)
                    ))
                }
                b"LIB-NAME" => {
                    session.lib_name = Some(args[3].clone());
                    Reply::ok()
                }
                b"LIB-VER" => {
                    session.lib_ver = Some(args[3].clone());
                    Reply::ok()
                }
                _ => Reply::error(format!(
                    "ERR Unrecognized option '{}'",
                    String::from_utf8_lossy(&args[2])
                )),
            }
        }
        (b"INFO", 2) => Reply::Verbatim(Bytes::from(client_info_line(session))),
        (b"LIST", 2) => Reply::Verbatim(Bytes::from(client_info_line(session))),
        (b"ID" | b"GETNAME" | b"SETNAME" | b"SETINFO" | b"INFO" | b"LIST", _) => {
            Reply::error(format!(
                "ERR wrong number of arguments for 'client|{}' command",
                String::from_utf8_lossy(&sub).to_ascii_lowercase()
            ))
        }
        _ => unknown_subcommand(&args[1], "CLIENT"),
    };
    Action::Ready(reply)
}

/// `INFO [section …]`: Redis' format (`# Section` then `field:value` lines). ioredis' ready
/// check needs a string reply with `loading:0`; the `masters` section shows each master's
/// state and votes.
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
    let cluster = &shared.cluster;
    let mut out = String::new();
    if show("server") {
        let _ = write!(
            out,
            "# Server\r\nredis_version:{REDIS_VERSION}\r\nredlock_proxy_version:{}\r\nredis_mode:standalone\r\narch_bits:64\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            std::process::id(),
            session.local.port(),
            shared.started.elapsed().as_secs()
        );
    }
    if show("clients") {
        let _ = write!(
            out,
            "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\n\r\n",
            shared.clients.load(Ordering::Relaxed),
            shared.config.maxclients
        );
    }
    if show("persistence") {
        out.push_str("# Persistence\r\nloading:0\r\n\r\n");
    }
    if show("masters") {
        let _ = write!(
            out,
            "# Masters\r\nmasters:{}\r\nquorum:{}\r\nnode_timeout_ms:{}\r\ndrift_factor:{}\r\nmax_lock_ttl_ms:{}\r\nquarantine_ms:{}\r\n",
            cluster.masters.len(),
            cluster.quorum(),
            cluster.node_timeout.as_millis(),
            cluster.drift_factor,
            cluster.max_lock_ttl_ms,
            cluster.lease_bound().as_millis(),
        );
        for (i, m) in cluster.masters.iter().enumerate() {
            let clock = m.health.clock_reading();
            let _ = write!(
                out,
                "master{i}:addr={},state={},replies={},missing={},connects={},retired_connections={},pending_cleanups={},clock_age_ms={},clock_error_ms={}\r\n",
                m.addr,
                m.state(),
                m.stats.replies.load(Ordering::Relaxed),
                m.stats.missing.load(Ordering::Relaxed),
                m.stats.connects.load(Ordering::Relaxed),
                m.stats.retired.load(Ordering::Relaxed),
                m.pending_undo_count(),
                clock.map_or(-1, |(age, _)| age.as_millis() as i64),
                clock.map_or(-1, |(_, error)| error.as_millis() as i64),
            );
        }
        out.push_str("\r\n");
    }
    if out.ends_with("\r\n\r\n") {
        out.truncate(out.len() - 2);
    }
    Action::Ready(Reply::Verbatim(Bytes::from(out)))
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
pub fn command(_ctx: &Ctx<'_>, _s: &mut Session, request: Request) -> Action {
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
                                (Reply::bulk("since"), Reply::bulk("1.0.0")),
                                (Reply::bulk("group"), Reply::bulk("generic")),
                            ]),
                        )
                    })
                    .collect(),
            )
        }
        _ => unknown_subcommand(&args[1], "COMMAND"),
    };
    Action::Ready(reply)
}

fn summary(spec: &super::Spec) -> &'static str {
    match spec.kind {
        super::Kind::Refused(_) => "Refused by redlock-proxy",
        super::Kind::Handled(_) => match spec.name {
            "set" => "Acquire a lock (NX with PX/EX) by Redlock majority, or write to every master",
            "eval" | "evalsha" | "eval_ro" | "evalsha_ro" => {
                "Run a script on every master; reply by quorum"
            }
            "script" => "Manage the script cache of the proxy and the masters",
            "get" | "exists" | "pttl" | "ttl" | "type" | "strlen" => {
                "Read from every master; reply by quorum"
            }
            "del" | "unlink" | "pexpire" | "expire" => "Write to every master; reply by quorum",
            _ => "Answered by the proxy",
        },
    }
}

pub fn quit(_ctx: &Ctx<'_>, _s: &mut Session, _request: Request) -> Action {
    Action::Close(Reply::ok())
}

/// `RESET`: back to RESP2, no name, as a new connection.
pub fn reset(_ctx: &Ctx<'_>, session: &mut Session, _request: Request) -> Action {
    session.protocol = Protocol::Resp2;
    session.name = None;
    Action::Ready(Reply::simple("RESET"))
}

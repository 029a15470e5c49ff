//! Connection and handshake commands answered by the proxy itself: `PING`, `ECHO`, `SELECT`,
//! `HELLO`, `AUTH`, `ACL WHOAMI`, `QUIT`, `RESET` (`CLIENT` is [`super::clients`]'s).
//!
//! These are what unmodified clients send before any lock command (redis-py and node-redis 6
//! `HELLO 3`, ioredis' `INFO` ready check, `CLIENT SETINFO`, redis-cli's `COMMAND DOCS`); each
//! gets the reply shape Redis 7 gives, so no client notices it is not talking to one Redis.

use super::{check_client_name, Action, Ctx, Session, REDIS_VERSION};
use crate::auth::DEFAULT_USER;
use crate::error::ProxyError;
use crate::protocol::{Protocol, Reply, Request};

pub fn ping(_ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    let message = match request.args.len() {
        1 => None,
        2 => Some(request.args[1].clone()),
        _ => return Action::error(ProxyError::WrongArity("ping".into())),
    };
    // A RESP2 client in subscribed mode reads arrays only: Redis answers `[pong, message]`.
    if session.protocol == Protocol::Resp2 && session.pubsub.active() {
        let message = Reply::Bulk(message.unwrap_or_default());
        return Action::Ready(Reply::Array(vec![Reply::bulk("pong"), message]));
    }
    Action::Ready(message.map_or(Reply::simple("PONG"), Reply::Bulk))
}

pub fn echo(_ctx: &Ctx<'_>, _s: &mut Session, request: Request) -> Action {
    Action::Ready(Reply::Bulk(request.args[1].clone()))
}

/// Only DB 0 exists: locks must live in the same keyspace on every master.
pub fn select(_ctx: &Ctx<'_>, _s: &mut Session, request: Request) -> Action {
    Action::Ready(match super::parse_int(&request.args[1]) {
        Err(err) => err.into(),
        Ok(0) => Reply::ok(),
        Ok(db) => ProxyError::SelectNonZero(db).into(),
    })
}

/// Checks `user`/`password` against the users; on success the session becomes that user.
/// A failed attempt leaves the session as it was (Redis), and is logged without the password.
fn authenticate(
    ctx: &Ctx<'_>,
    session: &mut Session,
    user: &[u8],
    password: &[u8],
) -> Result<(), ProxyError> {
    let (users, generation) = ctx.shared.users();
    match users.authenticate(user, password) {
        Some(user) => {
            session.user = Some(user);
            session.users_generation = generation;
            Ok(())
        }
        None => {
            tracing::warn!(
                client = session.client.id,
                peer = %session.client.peer,
                user = %String::from_utf8_lossy(user),
                "authentication failed"
            );
            Err(ProxyError::WrongPass)
        }
    }
}

/// `AUTH [username] password`. `AUTH password` is for the `default` user, and when that user
/// has no password Redis' own answer for that case.
pub fn auth(ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    let args = &request.args;
    let result = match args.len() {
        2 if !ctx.shared.users().0.default_has_password() => Err(ProxyError::NoPassword),
        2 => authenticate(ctx, session, DEFAULT_USER.as_bytes(), &args[1]),
        3 => authenticate(ctx, session, &args[1], &args[2]),
        _ => Err(ProxyError::Syntax),
    };
    Action::Ready(result.map_or_else(Reply::from, |()| Reply::ok()))
}

/// `ACL WHOAMI`; the other subcommands manage users, which live in the configuration file.
pub fn acl(_ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    let args = &request.args;
    let sub = args[1].to_ascii_uppercase();
    Action::Ready(match (sub.as_slice(), args.len()) {
        (b"WHOAMI", 2) => session
            .user
            .as_ref()
            .map_or(ProxyError::NoAuth.into(), |u| Reply::bulk(u.name.clone())),
        (b"WHOAMI", _) => ProxyError::subcommand_arity("acl", &sub).into(),
        (
            b"CAT" | b"DELUSER" | b"DRYRUN" | b"GENPASS" | b"GETUSER" | b"LIST" | b"LOAD" | b"LOG"
            | b"SAVE" | b"SETUSER" | b"USERS" | b"HELP",
            _,
        ) => ProxyError::AclRefused(String::from_utf8_lossy(&sub).into_owned()).into(),
        _ => ProxyError::unknown_subcommand(&args[1], "ACL").into(),
    })
}

/// `HELLO [protover [AUTH user pass] [SETNAME name]]`: authenticates, switches the protocol
/// and answers the server map Redis 7 gives (redis-py checks `proto` in it). Redis' order:
/// version, options, credentials, then a client still not authenticated is refused.
pub fn hello(ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    let args = &request.args;
    let mut protocol = session.protocol;
    if let Some(ver) = args.get(1) {
        protocol = match super::parse_int(ver) {
            Err(_) => return Action::error(ProxyError::ProtocolVersion),
            Ok(2) => Protocol::Resp2,
            Ok(3) => Protocol::Resp3,
            Ok(_) => return Action::error(ProxyError::NoProto),
        };
    }
    let mut name = None;
    let mut credentials = None;
    let mut i = 2;
    while i < args.len() {
        let opt = args[i].to_ascii_uppercase();
        match opt.as_slice() {
            b"AUTH" if i + 2 < args.len() => {
                credentials = Some((&args[i + 1], &args[i + 2]));
                i += 3;
            }
            b"SETNAME" if i + 1 < args.len() => {
                if let Err(err) = check_client_name(&args[i + 1]) {
                    return Action::error(err);
                }
                name = Some(args[i + 1].clone());
                i += 2;
            }
            _ => {
                let option = String::from_utf8_lossy(&args[i]).into_owned();
                return Action::error(ProxyError::HelloOption(option));
            }
        }
    }
    if let Some((user, password)) = credentials {
        if let Err(err) = authenticate(ctx, session, user, password) {
            return Action::error(err);
        }
    }
    if session.user.is_none() {
        return Action::error(ProxyError::HelloNoAuth);
    }
    session.protocol = protocol;
    if name.is_some() {
        session.name = name;
    }
    Action::Ready(hello_map(protocol, session.client.id))
}

/// HELLO's reply: the server map Redis 7 gives, with the client's protocol and id.
fn hello_map(protocol: Protocol, client_id: u64) -> Reply {
    let proto = match protocol {
        Protocol::Resp2 => 2,
        Protocol::Resp3 => 3,
    };
    Reply::Map(vec![
        (Reply::bulk("server"), Reply::bulk("redis")),
        (Reply::bulk("version"), Reply::bulk(REDIS_VERSION)),
        (Reply::bulk("proto"), Reply::Integer(proto)),
        (Reply::bulk("id"), Reply::Integer(client_id as i64)),
        (Reply::bulk("mode"), Reply::bulk("standalone")),
        (Reply::bulk("role"), Reply::bulk("master")),
        (Reply::bulk("modules"), Reply::Array(vec![])),
    ])
}

pub fn quit(_ctx: &Ctx<'_>, _s: &mut Session, _request: Request) -> Action {
    Action::Close(Reply::ok())
}

/// `RESET`: back to RESP2, no name, the `default` user (unauthenticated if it needs a
/// password), as a new connection.
pub fn reset(ctx: &Ctx<'_>, session: &mut Session, _request: Request) -> Action {
    let (users, generation) = ctx.shared.users();
    session.pubsub.leave_all(&ctx.shared.pubsub);
    session.client.set_subscriptions([0; 3]);
    session.protocol = Protocol::Resp2;
    session.name = None;
    session.user = users.initial();
    session.users_generation = generation;
    Action::Ready(Reply::simple("RESET"))
}

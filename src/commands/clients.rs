//! `CLIENT`: `ID`, `GETNAME`, `SETNAME`, `SETINFO` on the session, and `LIST`, `INFO`, `KILL`
//! over the registry of connected clients ([`crate::client_registry::Clients`]), in Redis'
//! formats: one `field=value` line per client, and Redis' old (`CLIENT KILL ip:port`) and filter (`CLIENT KILL ID n | ADDR ip:port | …`) forms.

use super::{check_client_name, printable, Action, Ctx, Session};
use crate::client_registry::ClientHandle;
use crate::error::ProxyError;
use crate::protocol::{Reply, Request};
use bytes::Bytes;
use std::fmt::Write as _;
use std::sync::Arc;
use tokio::time::Instant;

/// `CLIENT ID|SETNAME|GETNAME|SETINFO|INFO|LIST|KILL`; other subcommands get Redis'
/// unknown-subcommand error (clients ignore it, e.g. `CLIENT MAINT_NOTIFICATIONS`).
pub fn client(ctx: &Ctx<'_>, session: &mut Session, request: Request) -> Action {
    let args = &request.args;
    let sub = args[1].to_ascii_uppercase();
    let reply = match (sub.as_slice(), args.len()) {
        (b"ID", 2) => Reply::Integer(session.client.id as i64),
        (b"GETNAME", 2) => session.name.clone().map_or(Reply::Null, Reply::Bulk),
        (b"SETNAME", 3) => match check_client_name(&args[2]) {
            Ok(()) => {
                session.name = (!args[2].is_empty()).then(|| args[2].clone());
                Reply::ok()
            }
            Err(err) => err.into(),
        },
        (b"SETINFO", 4) => {
            let attr = args[2].to_ascii_uppercase();
            match attr.as_slice() {
                b"LIB-NAME" | b"LIB-VER" if !printable(&args[3]) => {
                    ProxyError::ClientInfo(String::from_utf8_lossy(&attr).into_owned()).into()
                }
                b"LIB-NAME" => {
                    session.lib_name = Some(args[3].clone());
                    Reply::ok()
                }
                b"LIB-VER" => {
                    session.lib_ver = Some(args[3].clone());
                    Reply::ok()
                }
                _ => ProxyError::UnrecognizedOption(String::from_utf8_lossy(&args[2]).into_owned())
                    .into(),
            }
        }
        (b"INFO", 2) => info(session),
        (b"LIST", _) => list(ctx, args),
        (b"KILL", n) if n >= 3 => return kill(ctx, session, args),
        (b"ID" | b"GETNAME" | b"SETNAME" | b"SETINFO" | b"INFO" | b"KILL", _) => {
            ProxyError::subcommand_arity("client", &sub).into()
        }
        _ => ProxyError::unknown_subcommand(&args[1], "CLIENT").into(),
    };
    Action::Ready(reply)
}

/// A client's line in Redis' `CLIENT LIST` format (fields the proxy does not have, such as
/// memory and buffer sizes, are 0; db 0; flags `P` subscribed, `b` blocked, else `N`).
fn line(client: &ClientHandle, now: Instant, out: &mut String) {
    let names = client.names();
    let text = |b: &Option<Bytes>| {
        b.as_ref()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    };
    let (idle, last) = client.idle_and_last(now);
    let cmd = last.map_or("NULL", super::shown_name);
    let _ = writeln!(
        out,
        "id={} addr={} laddr={} fd=0 name={} age={} idle={idle} flags={} db=0 sub={} psub={} ssub={} multi=-1 watch=0 qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={cmd} user={} redir=-1 resp={} lib-name={} lib-ver={}",
        client.id,
        client.peer,
        client.local,
        text(&names.name),
        now.saturating_duration_since(client.created).as_secs(),
        names.flags(),
        names.subscriptions[0],
        names.subscriptions[1],
        names.subscriptions[2],
        names.user,
        names.resp,
        text(&names.lib_name),
        text(&names.lib_ver),
    );
}

/// `CLIENT INFO`: this client's line.
pub fn info(session: &Session) -> Reply {
    let mut out = String::new();
    line(&session.client, Instant::now(), &mut out);
    Reply::Verbatim(Bytes::from(out))
}

/// `CLIENT LIST [TYPE normal|master|replica|pubsub] [ID id …]`.
pub fn list(ctx: &Ctx<'_>, args: &[Bytes]) -> Reply {
    let mut ids: Option<Vec<u64>> = None;
    let mut kind: Option<&'static str> = None;
    let mut i = 2;
    while i < args.len() {
        let opt = args[i].to_ascii_uppercase();
        match opt.as_slice() {
            b"TYPE" if i + 1 < args.len() => {
                let wanted = args[i + 1].to_ascii_lowercase();
                kind = match wanted.as_slice() {
                    b"normal" => Some("normal"),
                    b"pubsub" => Some("pubsub"),
                    // No master or replica connects to the proxy.
                    b"master" | b"replica" | b"slave" => Some("none"),
                    _ => {
                        let shown = String::from_utf8_lossy(&args[i + 1]).into_owned();
                        return ProxyError::UnknownClientType(shown).into();
                    }
                };
                i += 2;
            }
            b"ID" if i + 1 < args.len() => {
                let mut wanted = Vec::new();
                for arg in &args[i + 1..] {
                    match super::parse_int(arg) {
                        Ok(id) if id > 0 => wanted.push(id as u64),
                        _ => return ProxyError::InvalidClientId.into(),
                    }
                }
                ids = Some(wanted);
                i = args.len();
            }
            _ => return ProxyError::Syntax.into(),
        }
    }
    let now = Instant::now();
    let mut out = String::new();
    for client in ctx.shared.registry.list() {
        let listed = ids.as_ref().is_none_or(|ids| ids.contains(&client.id))
            && kind.is_none_or(|kind| kind == client.names().kind());
        if listed {
            line(&client, now, &mut out);
        }
    }
    Reply::Verbatim(Bytes::from(out))
}

/// Which clients a `CLIENT KILL` names.
#[derive(Debug, Default)]
struct KillFilter {
    id: Option<u64>,
    addr: Option<String>,
    laddr: Option<String>,
    max_age: Option<u64>,
    user: Option<String>,
    /// `normal` or `pubsub`; `none` for the types no client of the proxy has.
    kind: Option<&'static str>,
    skip_me: bool,
}

impl KillFilter {
    fn parse(args: &[Bytes]) -> Result<KillFilter, ProxyError> {
        let mut filter = KillFilter {
            skip_me: true,
            ..KillFilter::default()
        };
        for pair in args.chunks(2) {
            let [name, value] = pair else {
                return Err(ProxyError::Syntax);
            };
            let text = String::from_utf8_lossy(value).into_owned();
            match name.to_ascii_uppercase().as_slice() {
                b"ID" => match super::parse_int(value) {
                    Ok(id) if id > 0 => filter.id = Some(id as u64),
                    _ => return Err(ProxyError::InvalidClientId),
                },
                b"ADDR" => filter.addr = Some(text),
                b"LADDR" => filter.laddr = Some(text),
                b"MAXAGE" => match super::parse_int(value) {
                    Ok(age) if age >= 0 => filter.max_age = Some(age as u64),
                    _ => return Err(ProxyError::NotAnInteger),
                },
                b"TYPE" => {
                    filter.kind = Some(match text.to_ascii_lowercase().as_str() {
                        "normal" => "normal",
                        "pubsub" => "pubsub",
                        "master" | "replica" | "slave" => "none",
                        _ => return Err(ProxyError::UnknownClientType(text)),
                    })
                }
                b"USER" => filter.user = Some(text),
                b"SKIPME" => match text.to_ascii_lowercase().as_str() {
                    "yes" => filter.skip_me = true,
                    "no" => filter.skip_me = false,
                    _ => return Err(ProxyError::Syntax),
                },
                _ => return Err(ProxyError::Syntax),
            }
        }
        Ok(filter)
    }

    fn matches(&self, client: &ClientHandle, me: u64, now: Instant) -> bool {
        let skipped = self.skip_me && client.id == me;
        !skipped
            && self.kind.is_none_or(|kind| kind == client.names().kind())
            && self.id.is_none_or(|id| id == client.id)
            && self
                .addr
                .as_ref()
                .is_none_or(|a| *a == client.peer.to_string())
            && self
                .laddr
                .as_ref()
                .is_none_or(|a| *a == client.local.to_string())
            && self.user.as_ref().is_none_or(|u| *u == client.names().user)
            && self
                .max_age
                .is_none_or(|age| now.saturating_duration_since(client.created).as_secs() >= age)
    }
}

/// `CLIENT KILL ip:port` (reply `OK` or `No such client`) or `CLIENT KILL <filter value> …`
/// (reply how many were killed). A client that kills itself gets the reply, then is closed.
pub fn kill(ctx: &Ctx<'_>, session: &Session, args: &[Bytes]) -> Action {
    let now = Instant::now();
    let old_form = args.len() == 3;
    let filter = if old_form {
        KillFilter {
            addr: Some(String::from_utf8_lossy(&args[2]).into_owned()),
            ..KillFilter::default()
        }
    } else {
        match KillFilter::parse(&args[2..]) {
            Ok(filter) => filter,
            Err(err) => return Action::error(err),
        }
    };
    let victims: Vec<Arc<ClientHandle>> = ctx
        .shared
        .registry
        .list()
        .into_iter()
        .filter(|c| filter.matches(c, session.client.id, now))
        .collect();
    let mut killed_me = false;
    for victim in &victims {
        if victim.id == session.client.id {
            killed_me = true;
        } else {
            victim.kill();
        }
    }
    let reply = match (old_form, victims.len()) {
        (true, 0) => ProxyError::NoSuchClient.into(),
        (true, _) => Reply::ok(),
        (false, n) => Reply::Integer(n as i64),
    };
    if killed_me {
        Action::Close(reply)
    } else {
        Action::Ready(reply)
    }
}

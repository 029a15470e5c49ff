//! Every error reply the proxy makes itself, in one place: the code and text a client sees.
//!
//! Invariants:
//! - Where Redis has a text for the same condition, the text is Redis' own, byte for byte
//!   (`server.c`, `t_string.c`, `eval.c`, `networking.c`), so client libraries that match on
//!   it (`NOSCRIPT`, arity errors) behave as with one Redis.
//! - The proxy's own refusals share one phrasing, `ERR <what> is refused by redlock-proxy:
//!   <reason>`, and say what to do instead where there is something to do
//!   (docs/PROTOCOL.md, "Errors").
//! - Errors of the masters themselves (`WRONGTYPE`, `BUSY`, a script's error) are not here:
//!   they are replies, passed through by the quorum rule.

use crate::protocol::{ParseError, Reply};
use thiserror::Error;

/// Most characters of a client-supplied name or argument quoted back in an error, as Redis.
const QUOTED_MAX: usize = 128;

/// An error reply of the proxy.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProxyError {
    // Redis' own texts.
    /// `server.c processCommand`; build with [`ProxyError::unknown_command`].
    #[error("ERR unknown command '{name}', with args beginning with: {args}")]
    UnknownCommand { name: String, args: String },
    /// `addReplySubcommandSyntaxError`; build with [`ProxyError::unknown_subcommand`].
    #[error("ERR unknown subcommand '{sub}'. Try {command} HELP.")]
    UnknownSubcommand { sub: String, command: &'static str },
    /// The command's full name in lower case (`set`, `script|load`), as `c->cmd->fullname`.
    #[error("ERR wrong number of arguments for '{0}' command")]
    WrongArity(String),
    #[error("ERR value is not an integer or out of range")]
    NotAnInteger,
    #[error("ERR syntax error")]
    Syntax,
    /// `t_string.c`: an expiry that is not positive or overflows.
    #[error("ERR invalid expire time in '{0}' command")]
    InvalidExpireTime(&'static str),
    #[error("NOSCRIPT No matching script. Please use EVAL.")]
    NoScript,
    #[error("ERR Number of keys can't be negative")]
    NegativeNumkeys,
    #[error("ERR Number of keys can't be greater than number of args")]
    TooManyNumkeys,
    #[error("ERR Protocol version is not an integer or out of range")]
    ProtocolVersion,
    #[error("NOPROTO unsupported protocol version")]
    NoProto,
    #[error("ERR Syntax error in HELLO option '{0}'")]
    HelloOption(String),
    #[error("ERR Client names cannot contain spaces, newlines or special characters.")]
    ClientName,
    /// `CLIENT SETINFO LIB-NAME|LIB-VER` with a forbidden character (the attribute, upper case).
    #[error("ERR {0} cannot contain spaces, newlines or special characters.")]
    ClientInfo(String),
    #[error("ERR Unrecognized option '{0}'")]
    UnrecognizedOption(String),
    /// No password is configured on the proxy: Redis' answer for that case.
    #[error("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?")]
    NoPassword,
    #[error("ERR max number of clients reached")]
    MaxClients,
    #[error("NOAUTH Authentication required.")]
    NoAuth,
    /// `HELLO` without `AUTH` from a client that is not authenticated (7.0's text).
    #[error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time")]
    HelloNoAuth,
    #[error("WRONGPASS invalid username-password pair or user is disabled.")]
    WrongPass,
    /// A key outside the user's patterns (`acl.c`, the text of Redis 7.0).
    #[error("NOPERM this user has no permissions to access one of the keys used as arguments")]
    NoPermKeys,
    /// A request that breaks the protocol (the parser's own Redis texts).
    #[error("ERR {0}")]
    Protocol(#[from] ParseError),

    // The proxy's own refusals.
    /// A command of the refused part of the table (`MULTI`, `FLUSHALL`, …).
    #[error("ERR '{command}' is refused by redlock-proxy: {reason}")]
    Refused {
        command: String,
        reason: &'static str,
    },
    /// The session's user was removed or disabled by a configuration reload.
    #[error("ERR user '{0}' was removed or disabled by a configuration reload: connection closed")]
    UserRevoked(String),
    /// An `ACL` subcommand other than `WHOAMI`: users live in the proxy's configuration.
    #[error("ERR 'ACL {0}' is refused by redlock-proxy: users are defined in its configuration file (reloaded on SIGHUP)")]
    AclRefused(String),
    #[error("ERR keys starting with 'redlock-proxy:' are refused by redlock-proxy: they hold its own state on the masters")]
    ReservedKey,
    /// A TTL above `max_lock_ttl_ms` (the quarantine of a master that lost data lasts the cap
    /// plus drift: a longer lease could outlive it; docs/SAFETY.md).
    #[error(
        "ERR lock TTL {ttl_ms} ms is refused by redlock-proxy: above max_lock_ttl_ms ({cap_ms} ms)"
    )]
    TtlAboveCap { ttl_ms: u64, cap_ms: u64 },
    #[error("ERR SET NX GET is refused by redlock-proxy: an acquire answers OK or null")]
    SetNxGet,
    #[error("ERR SET NX with EXAT/PXAT is refused by redlock-proxy: use PX <milliseconds> so the lock's validity can be checked")]
    SetNxAbsoluteExpiry,
    #[error("ERR SET NX without PX/EX is refused by redlock-proxy: a lock without expiry cannot be made safe; add PX <milliseconds>")]
    SetNxWithoutExpiry,
    #[error("ERR SETNX is refused by redlock-proxy: a lock without expiry cannot be made safe; use SET key value NX PX <milliseconds>")]
    Setnx,
    #[error("ERR SELECT {0} is refused by redlock-proxy: locks live in DB 0 on every master")]
    SelectNonZero(i64),

    // Outcomes that are not what the client asked for.
    /// No majority of masters agreed on a reply (docs/PROTOCOL.md, the quorum reply rule).
    #[error("NOQUORUM fewer than {quorum} of {masters} masters agreed")]
    NoQuorum { quorum: usize, masters: usize },
    /// A script set a TTL above the cap; the guard capped the key.
    #[error("ERR script set a TTL above max_lock_ttl_ms ({0} ms) of redlock-proxy; the key's TTL was capped, do not rely on the longer lease")]
    ScriptTtlCapped(u64),
    /// A lease script succeeded on a majority, but too late to promise the lease.
    #[error("ERR lease validity expired before a majority answered (redlock-proxy); the lock is not held")]
    LeaseExpired,
    #[error("ERR acquire abandoned (redlock-proxy shutting down)")]
    AcquireAbandoned,
}

impl ProxyError {
    /// Redis' unknown-command error: the name as sent, then up to 128 characters of
    /// arguments, each quoted and followed by a space.
    pub fn unknown_command(args: &[bytes::Bytes]) -> ProxyError {
        let mut shown = String::new();
        for arg in args.iter().skip(1) {
            if shown.len() >= QUOTED_MAX {
                break;
            }
            let room = QUOTED_MAX - shown.len();
            let cut: String = String::from_utf8_lossy(arg).chars().take(room).collect();
            shown.push_str(&format!("'{cut}' "));
        }
        ProxyError::UnknownCommand {
            name: quoted(args.first().map_or(&[][..], |a| a)),
            args: shown,
        }
    }

    /// Redis' unknown-subcommand error for `command` (upper case, as in `Try CLIENT HELP.`).
    pub fn unknown_subcommand(sub: &[u8], command: &'static str) -> ProxyError {
        ProxyError::UnknownSubcommand {
            sub: quoted(sub),
            command,
        }
    }

    /// The arity error of a subcommand: `'<command>|<sub>'`, both lower case.
    pub fn subcommand_arity(command: &str, sub: &[u8]) -> ProxyError {
        let sub = String::from_utf8_lossy(sub).to_ascii_lowercase();
        ProxyError::WrongArity(format!("{command}|{sub}"))
    }
}

/// A client-supplied name as Redis quotes it back: lossy UTF-8, at most 128 characters.
fn quoted(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw)
        .chars()
        .take(QUOTED_MAX)
        .collect()
}

impl From<ProxyError> for Reply {
    fn from(err: ProxyError) -> Reply {
        Reply::error(err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn args(v: &[&str]) -> Vec<Bytes> {
        v.iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect()
    }

    #[test]
    fn texts_match_redis() {
        let cases = [
            (
                ProxyError::unknown_command(&args(&["FOO"])),
                "ERR unknown command 'FOO', with args beginning with: ",
            ),
            (
                ProxyError::unknown_command(&args(&["foo", "bar", "baz"])),
                "ERR unknown command 'foo', with args beginning with: 'bar' 'baz' ",
            ),
            (
                ProxyError::unknown_subcommand(b"nope", "CLIENT"),
                "ERR unknown subcommand 'nope'. Try CLIENT HELP.",
            ),
            (
                ProxyError::subcommand_arity("script", b"LOAD"),
                "ERR wrong number of arguments for 'script|load' command",
            ),
            (
                ProxyError::NoScript,
                "NOSCRIPT No matching script. Please use EVAL.",
            ),
            (
                ProxyError::Protocol(ParseError::InvalidBulkLength),
                "ERR Protocol error: invalid bulk length",
            ),
        ];
        for (err, text) in cases {
            assert_eq!(err.to_string(), text);
            assert_eq!(Reply::from(err), Reply::error(text));
        }
    }

    #[test]
    fn quoted_arguments_stop_after_128_characters() {
        let long = "x".repeat(300);
        let text = ProxyError::unknown_command(&args(&["FOO", &long, "next"])).to_string();
        assert!(text.ends_with(&format!("'{}' ", "x".repeat(128))), "{text}");
        assert!(!text.contains("next"));
    }

    #[test]
    fn refusals_share_one_phrasing() {
        let refusals = [
            ProxyError::Refused {
                command: "MULTI".into(),
                reason: "r",
            },
            ProxyError::ReservedKey,
            ProxyError::TtlAboveCap {
                ttl_ms: 2,
                cap_ms: 1,
            },
            ProxyError::SetNxGet,
            ProxyError::SetNxAbsoluteExpiry,
            ProxyError::SetNxWithoutExpiry,
            ProxyError::Setnx,
            ProxyError::SelectNonZero(1),
        ];
        for err in refusals {
            assert!(
                err.to_string().contains(" refused by redlock-proxy: "),
                "{err}"
            );
        }
    }
}

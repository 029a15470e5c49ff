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
use bytes::Bytes;
use thiserror::Error;

/// Most bytes of a client-supplied name or argument quoted back in an error, as Redis.
const QUOTED_MAX: usize = 128;

/// An error reply of the proxy.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProxyError {
    // Redis' own texts.
    /// `server.c processCommand`; build with [`ProxyError::unknown_command`]. The whole
    /// error line, as raw bytes: Redis quotes the client's bytes back, UTF-8 or not.
    #[error("{}", String::from_utf8_lossy(.0))]
    UnknownCommand(Bytes),
    /// `addReplySubcommandSyntaxError`; build with [`ProxyError::unknown_subcommand`]. Raw
    /// bytes, as [`ProxyError::UnknownCommand`].
    #[error("{}", String::from_utf8_lossy(.0))]
    UnknownSubcommand(Bytes),
    /// The command's full name in lower case (`set`, `script|load`), as `c->cmd->fullname`.
    #[error("ERR wrong number of arguments for '{0}' command")]
    WrongArity(String),
    #[error("ERR value is not an integer or out of range")]
    NotAnInteger,
    /// `timeout.c getTimeoutFromObjectOrReply`: a blocking command's timeout.
    #[error("ERR timeout is not a float or out of range")]
    TimeoutNotFloat,
    #[error("ERR timeout is negative")]
    TimeoutNegative,
    /// `server.c processCommand`: a RESP2 client in subscribed mode sent another command (its
    /// full name, lower case).
    #[error("ERR Can't execute '{0}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context")]
    SubscribedContext(String),
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
    #[error("ERR Unknown client type '{0}'")]
    UnknownClientType(String),
    #[error("ERR client-id should be greater than 0")]
    InvalidClientId,
    #[error("ERR No such client")]
    NoSuchClient,
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
    /// Keys of more than one slot where a master is a Redis Cluster (Redis Cluster's own text).
    #[error("CROSSSLOT Keys in request don't hash to the same slot")]
    CrossSlot,
    /// A script that could get around the key checks of its `redis.call`s
    /// ([`crate::script_keys`]).
    #[error("ERR scripts using _G, getfenv, setfenv, rawget, rawset, load, loadstring, loadfile, dofile, debug or __done are refused by redlock-proxy: they could touch keys it cannot check")]
    ScriptReachesGlobals,
    /// A TTL above `max_lock_ttl_ms` (the quarantine of a master that lost data lasts the cap
    /// plus drift: a longer lease could outlive it; docs/SAFETY.md).
    #[error(
        "ERR lock TTL {ttl_ms} ms is refused by redlock-proxy: above max_lock_ttl_ms ({cap_ms} ms)"
    )]
    TtlAboveCap { ttl_ms: u64, cap_ms: u64 },
    /// An argument longer than `max_value_bytes`: sent on, it would hold every request behind
    /// it on each master's connection while it crosses (issue 38: a 10 MB value).
    #[error("ERR string exceeds maximum allowed size (max_value_bytes {cap} of redlock-proxy): an argument of {len} bytes")]
    ArgumentTooLong { len: usize, cap: u64 },
    /// An acquire not admitted within its bound (`crate::admission`): no master was asked.
    #[error("TRYAGAIN redlock-proxy is over its admission limit ({0} acquires in progress): no master was asked; retry")]
    Overloaded(usize),
    #[error("ERR SET NX GET is refused by redlock-proxy: an acquire answers OK or null")]
    SetNxGet,
    #[error("ERR SET NX with EXAT/PXAT is refused by redlock-proxy: use PX <milliseconds> so the lock's validity can be checked")]
    SetNxAbsoluteExpiry,
    #[error("ERR SET NX without PX/EX is refused by redlock-proxy: a lock without expiry cannot be made safe; add PX <milliseconds>")]
    SetNxWithoutExpiry,
    /// `SET … IFEQ|IFDEQ` without an expiry: Redis drops the key's TTL, which would leave a
    /// held lock without expiry.
    #[error("ERR SET IFEQ/IFDEQ without PX/EX/EXAT/PXAT/KEEPTTL is refused by redlock-proxy: it would leave the lock without expiry; add PX <milliseconds> or KEEPTTL")]
    SetIfEqWithoutExpiry,
    #[error("ERR SETNX is refused by redlock-proxy: a lock without expiry cannot be made safe; use SET key value NX PX <milliseconds>")]
    Setnx,
    #[error("ERR SELECT {0} is refused by redlock-proxy: locks live in DB 0 on every master")]
    SelectNonZero(i64),

    // Outcomes that are not what the client asked for.
    /// No majority of masters agreed on a reply (docs/PROTOCOL.md, the quorum reply rule).
    #[error("NOQUORUM fewer than {quorum} of {masters} masters agreed")]
    NoQuorum { quorum: usize, masters: usize },
    /// An acquire without a quorum of usable masters, with `no_quorum_reply = "error"`
    /// (the text is [`crate::masters::Masters::usable_summary`]).
    #[error("NOQUORUM {0}")]
    AcquireNoQuorum(String),
    /// A script set a TTL above the cap; the guard capped the key.
    #[error("ERR script set a TTL above max_lock_ttl_ms ({0} ms) of redlock-proxy; the key's TTL was capped, do not rely on the longer lease")]
    ScriptTtlCapped(u64),
    /// A script left a key without expiry; the guard gave it the lease bound.
    #[error("ERR script left a key without expiry, which redlock-proxy does not keep: its TTL was set to max_lock_ttl_ms ({0} ms); set PX or PEXPIRE in the script")]
    ScriptNoExpiry(u64),
    /// A lease script succeeded on a majority, but too late to promise the lease.
    #[error("ERR lease validity expired before a majority answered (redlock-proxy); the lock is not held")]
    LeaseExpired,
    /// `RFencedLock`'s acquire was granted, but no fencing token was taken by a majority (the
    /// masters refused the offer: another proxy's counter was ahead); rolled back.
    #[error("ERR the masters refused this acquire's fencing token, another proxy's was ahead (redlock-proxy); the lock is not held, retry")]
    FencedTokenRefused,
    /// An acquire right after start, before the masters were judged (the deployment
    /// undecided, or fewer than a quorum looked at) within the start-up hold
    /// ([`crate::masters::STARTUP_HOLD`]). `LOADING`, as redis-server answers while it loads
    /// its dataset: clients already read it as "retry later" (never as "held").
    #[error(
        "LOADING redlock-proxy is starting: the masters are not judged yet (see INFO masters); retry"
    )]
    Starting,
    #[error("ERR acquire abandoned (redlock-proxy shutting down)")]
    AcquireAbandoned,
}

impl ProxyError {
    /// Redis' unknown-command error: the name as sent, then arguments, each quoted and
    /// followed by a space, while that list is under 128 bytes, each cut to fit it
    /// (`'%.*s' ` with `128 - sdslen(args)`).
    pub fn unknown_command(args: &[Bytes]) -> ProxyError {
        let mut text = b"ERR unknown command '".to_vec();
        text.extend_from_slice(c_string(args.first().map_or(&[][..], |a| a), QUOTED_MAX));
        text.extend_from_slice(b"', with args beginning with: ");
        let list_start = text.len();
        for arg in args.iter().skip(1) {
            let listed = text.len() - list_start;
            if listed >= QUOTED_MAX {
                break;
            }
            text.push(b'\'');
            text.extend_from_slice(c_string(arg, QUOTED_MAX - listed));
            text.extend_from_slice(b"' ");
        }
        ProxyError::UnknownCommand(Bytes::from(text))
    }

    /// Redis' unknown-subcommand error for `command` (upper case, as in `Try CLIENT HELP.`).
    pub fn unknown_subcommand(sub: &[u8], command: &'static str) -> ProxyError {
        let mut text = b"ERR unknown subcommand '".to_vec();
        text.extend_from_slice(c_string(sub, QUOTED_MAX));
        text.extend_from_slice(format!("'. Try {command} HELP.").as_bytes());
        ProxyError::UnknownSubcommand(Bytes::from(text))
    }

    /// The arity error of a subcommand: `'<command>|<sub>'`, both lower case.
    pub fn subcommand_arity(command: &str, sub: &[u8]) -> ProxyError {
        let sub = String::from_utf8_lossy(sub).to_ascii_lowercase();
        ProxyError::WrongArity(format!("{command}|{sub}"))
    }
}

/// A client's bytes as Redis' `%.<max>s` prints them: up to the first NUL (the differential
/// test found Redis stopping there), at most `max` bytes.
fn c_string(raw: &[u8], max: usize) -> &[u8] {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    &raw[..end.min(max)]
}

impl From<ProxyError> for Reply {
    fn from(err: ProxyError) -> Reply {
        match err {
            ProxyError::UnknownCommand(text) | ProxyError::UnknownSubcommand(text) => {
                Reply::Error(text)
            }
            other => Reply::error(other.to_string()),
        }
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

    /// Differential-test regression: Redis quotes a client's bytes as C strings, raw.
    #[test]
    fn quoted_bytes_stop_at_nul_and_stay_raw() {
        let args = [
            Bytes::from_static(b"NO\0SUCH"),
            Bytes::from_static(b"\xff\xfe\0hidden"),
            Bytes::from_static(b"\0"),
        ];
        assert_eq!(
            Reply::from(ProxyError::unknown_command(&args)),
            Reply::Error(Bytes::from_static(
                b"ERR unknown command 'NO', with args beginning with: '\xff\xfe' '' "
            ))
        );
        assert_eq!(
            Reply::from(ProxyError::unknown_subcommand(b"a\0b", "CLIENT")),
            Reply::error("ERR unknown subcommand 'a'. Try CLIENT HELP.")
        );
        // Multi-byte characters count as bytes: the cut may split one, as in Redis.
        let long = Bytes::from(format!("a{}", "é".repeat(100)));
        let text = ProxyError::unknown_command(&[Bytes::from_static(b"X"), long]);
        let Reply::Error(text) = Reply::from(text) else {
            unreachable!()
        };
        assert!(text.ends_with(&[0xa9, 0xc3, b'\'', b' ']), "{text:?}");
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
            ProxyError::SetIfEqWithoutExpiry,
            ProxyError::Setnx,
            ProxyError::SelectNonZero(1),
            ProxyError::ScriptReachesGlobals,
        ];
        for err in refusals {
            assert!(
                err.to_string().contains(" refused by redlock-proxy: "),
                "{err}"
            );
        }
    }
}

//! The master side of the wire: commands encoded for the masters, and their replies decoded
//! (with `redis-protocol`, RESP2, which is what a fresh connection to Redis speaks) into the
//! same [`Reply`] type the proxy answers clients with.

use super::reply::{bulk, bulk_of_parts, header};
use super::Reply;
use bytes::{Bytes, BytesMut};
use redis_protocol::resp2::{decode::decode_bytes_mut, types::BytesFrame};

/// Encodes a command as a RESP array of bulk strings, the form every master accepts.
pub fn encode_command<A: AsRef<[u8]>>(args: &[A]) -> Bytes {
    // Sized once (each header takes at most 16 bytes with its CRLFs): no regrowth and copy
    // for every argument appended.
    let capacity = 16 + args.iter().map(|a| a.as_ref().len() + 16).sum::<usize>();
    let mut out = BytesMut::with_capacity(capacity);
    header(&mut out, b'*', args.len());
    for arg in args {
        bulk(&mut out, b'$', arg.as_ref());
    }
    out.freeze()
}

/// One caller's share of a script call that several callers make together
/// ([`encode_script_call`]): its keys and its arguments, encoded once as bulk strings, and
/// possibly its [`CallBounds`], which are not among its arguments: the merged call passes one
/// set for all its calls, in its lead. The deadline of the bounds differs per master
/// ([`ScriptCall::with_deadline`]); the rest is encoded once for every master.
#[derive(Debug, Clone)]
pub struct ScriptCall {
    /// The keys' bulks, then the arguments' bulks.
    bulks: Bytes,
    /// Where the arguments start in `bulks`.
    args_at: usize,
    bounds: Option<CallBounds>,
    keys: usize,
    args: usize,
}

/// The numbers an acquire of the lock script is judged against that the calls merged beside
/// it share: sent once per merged call, in its lead, as the strictest of its acquires' ([`CallBounds::and`]):
/// each acquire is then judged at least as strictly as by its own (docs/SAFETY.md, "Merged
/// calls decide nothing together"). A number passed per acquire cost a master about 1,700
/// instructions (its bulk parsed, a Lua string made), one converted to a number 1,000 more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallBounds {
    /// The latest master clock (ms) at which the write may happen (0: none may).
    pub deadline: u64,
    /// The earliest master clock (ms) at which the token may be taken.
    pub earliest: u64,
    /// How long (ms) the token counter lives once written.
    pub counter_life: u64,
}

impl CallBounds {
    /// Bounds at least as strict as both: the earlier deadline, the later earliest clock, the
    /// longer counter life.
    pub fn and(self, other: CallBounds) -> CallBounds {
        CallBounds {
            deadline: self.deadline.min(other.deadline),
            earliest: self.earliest.max(other.earliest),
            counter_life: self.counter_life.max(other.counter_life),
        }
    }

    /// The bounds of the calls that have some (zeros if none has: no acquire may write).
    pub fn of<'a>(calls: impl Iterator<Item = &'a ScriptCall>) -> CallBounds {
        calls
            .filter_map(|c| c.bounds)
            .reduce(CallBounds::and)
            .unwrap_or_default()
    }

    /// In the order the lock scripts read them.
    pub fn lead(self) -> [u64; 3] {
        [self.deadline, self.earliest, self.counter_life]
    }
}

impl ScriptCall {
    /// A call with `keys` (each given as the pieces it is the concatenation of, so that a key
    /// such as a token counter is written without being built first) and `args`.
    pub fn new(keys: &[&[&[u8]]], args: &[&[u8]]) -> ScriptCall {
        let key_bytes: usize = keys.iter().flat_map(|k| k.iter()).map(|p| p.len()).sum();
        let arg_bytes: usize = args.iter().map(|a| a.len()).sum();
        // Each bulk's header and CRLFs take at most 16 bytes: sized once, never regrown.
        let mut bulks =
            BytesMut::with_capacity(key_bytes + arg_bytes + 16 * (keys.len() + args.len()));
        for key in keys {
            bulk_of_parts(&mut bulks, key);
        }
        let args_at = bulks.len();
        for arg in args {
            bulk(&mut bulks, b'$', arg);
        }
        ScriptCall {
            bulks: bulks.freeze(),
            args_at,
            bounds: None,
            keys: keys.len(),
            args: args.len(),
        }
    }

    /// A call with `bounds`, passed in the merged call's lead ([`CallBounds::of`]).
    pub fn with_bounds(keys: &[&[&[u8]]], args: &[&[u8]], bounds: CallBounds) -> ScriptCall {
        ScriptCall {
            bounds: Some(bounds),
            ..ScriptCall::new(keys, args)
        }
    }

    /// This call with `deadline` as its bounds' deadline, sharing the rest (no copy).
    pub fn with_deadline(&self, deadline: u64) -> ScriptCall {
        ScriptCall {
            bounds: self.bounds.map(|b| CallBounds { deadline, ..b }),
            ..self.clone()
        }
    }

    fn encode_keys(&self, out: &mut BytesMut) {
        out.extend_from_slice(&self.bulks[..self.args_at]);
    }

    fn encode_args(&self, out: &mut BytesMut) {
        out.extend_from_slice(&self.bulks[self.args_at..]);
    }
}

/// How a script is called: by its SHA1, or with its body (for a master that answered
/// `NOSCRIPT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invoke<'a> {
    Sha(&'a str),
    Body(&'a str),
}

/// Encodes into `out` one call of a script for several callers: `EVALSHA sha` (or `EVAL
/// body`), the number of keys, every call's keys, then `lead` (arguments for the whole call)
/// and every call's arguments, so the script finds call `i`'s keys and arguments at fixed
/// strides after the lead.
pub fn encode_script_call<'a>(
    out: &mut BytesMut,
    invoke: Invoke<'_>,
    names: Names,
    lead: &[u64],
    calls: impl Iterator<Item = &'a ScriptCall> + Clone,
) {
    let keys = calls.clone().map(|c| c.keys).sum::<usize>();
    let args = lead.len() + calls.clone().map(|c| c.args).sum::<usize>();
    let counted = matches!(names, Names::Counted);
    header(out, b'*', 3 + keys + args + usize::from(counted));
    match invoke {
        Invoke::Sha(sha) => {
            bulk(out, b'$', b"EVALSHA");
            bulk(out, b'$', sha.as_bytes());
        }
        Invoke::Body(body) => {
            bulk(out, b'$', b"EVAL");
            bulk(out, b'$', body.as_bytes());
        }
    }
    match counted {
        // `0` declared keys, then their number as the first argument.
        true => {
            bulk(out, b'$', b"0");
            bulk(out, b'$', itoa::Buffer::new().format(keys).as_bytes());
        }
        false => bulk(out, b'$', itoa::Buffer::new().format(keys).as_bytes()),
    }
    for call in calls.clone() {
        call.encode_keys(out);
    }
    for n in lead {
        bulk(out, b'$', itoa::Buffer::new().format(*n).as_bytes());
    }
    for call in calls {
        call.encode_args(out);
    }
}

/// How a merged script call passes the names of the keys it touches.
#[derive(Debug, Clone, Copy)]
pub enum Names {
    /// As declared keys (`KEYS`), each call's in turn.
    Declared,
    /// In the arguments, led by their number (`0` declared keys): for a Redis Cluster node's
    /// call whose keys span slots, which the node refuses as declared keys (`CROSSSLOT`).
    Counted,
}

/// A master's reply stream broke the protocol: the connection cannot be trusted further.
#[derive(Debug, thiserror::Error)]
#[error("undecodable reply from master: {0}")]
pub struct BadReply(String);

/// Takes the first complete reply off `buf`, if there is one.
pub fn decode_reply(buf: &mut BytesMut) -> Result<Option<Reply>, BadReply> {
    match decode_bytes_mut(buf) {
        Ok(Some((frame, _, _))) => Ok(Some(to_reply(frame))),
        Ok(None) => Ok(None),
        Err(err) => Err(BadReply(err.to_string())),
    }
}

fn to_reply(frame: BytesFrame) -> Reply {
    match frame {
        BytesFrame::SimpleString(s) => Reply::Simple(s),
        BytesFrame::Error(e) => Reply::Error(e.into_inner()),
        BytesFrame::Integer(i) => Reply::Integer(i),
        BytesFrame::BulkString(b) => Reply::Bulk(b),
        BytesFrame::Array(items) => Reply::Array(items.into_iter().map(to_reply).collect()),
        BytesFrame::Null => Reply::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_encode_and_replies_decode() {
        assert_eq!(
            encode_command(&["SET", "k", ""]).as_ref(),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"
        );
        let mut buf = BytesMut::from(&b"+OK\r\n*2\r\n:1\r\n$-1\r\n-ERR x\r\n$3\r\nab"[..]);
        assert_eq!(decode_reply(&mut buf).unwrap(), Some(Reply::ok()));
        assert_eq!(
            decode_reply(&mut buf).unwrap(),
            Some(Reply::Array(vec![Reply::Integer(1), Reply::Null]))
        );
        assert_eq!(decode_reply(&mut buf).unwrap(), Some(Reply::error("ERR x")));
        assert_eq!(decode_reply(&mut buf).unwrap(), None);
        let mut bad = BytesMut::from(&b"?what\r\n"[..]);
        assert!(decode_reply(&mut bad).is_err());
    }

    #[test]
    fn calls_of_one_script_merge_into_one_command() {
        let a = ScriptCall::new(&[&[b"a"], &[b"t", b"a"]], &[b"1", b"x\r\n"]);
        let b = ScriptCall::new(&[&[b"b"], &[b"tb"]], &[b"2", b""]);
        let mut out = BytesMut::new();
        encode_script_call(
            &mut out,
            Invoke::Sha("f00"),
            Names::Declared,
            &[],
            [&a, &b].into_iter(),
        );
        assert_eq!(
            out.freeze(),
            encode_command(&["EVALSHA", "f00", "4", "a", "ta", "b", "tb", "1", "x\r\n", "2", ""])
        );
        // A lead: one argument for the whole call, before every call's arguments.
        let mut out = BytesMut::new();
        encode_script_call(
            &mut out,
            Invoke::Sha("f00"),
            Names::Declared,
            &[42],
            [&a, &b].into_iter(),
        );
        assert_eq!(
            out.freeze(),
            encode_command(&[
                "EVALSHA", "f00", "4", "a", "ta", "b", "tb", "42", "1", "x\r\n", "2", ""
            ])
        );
        let mut out = BytesMut::new();
        encode_script_call(
            &mut out,
            Invoke::Body("return 1"),
            Names::Declared,
            &[],
            [&a].into_iter(),
        );
        assert_eq!(
            out.freeze(),
            encode_command(&["EVAL", "return 1", "2", "a", "ta", "1", "x\r\n"])
        );
        // A cluster node's call: no declared key, the names counted in the arguments.
        let mut out = BytesMut::new();
        encode_script_call(
            &mut out,
            Invoke::Sha("f00"),
            Names::Counted,
            &[],
            [&a, &b].into_iter(),
        );
        assert_eq!(
            out.freeze(),
            encode_command(&[
                "EVALSHA", "f00", "0", "4", "a", "ta", "b", "tb", "1", "x\r\n", "2", ""
            ])
        );
        // Bounds are not arguments: the merged call leads with the strictest of its calls'.
        let template = ScriptCall::with_bounds(
            &[&[b"c"]],
            &[b"p", b"q"],
            CallBounds {
                deadline: 0,
                earliest: 5,
                counter_life: 60,
            },
        );
        let (first, second) = (template.with_deadline(7), template.with_deadline(1_000_000));
        let third = ScriptCall::with_bounds(
            &[&[b"d"]],
            &[b"r"],
            CallBounds {
                deadline: 9,
                earliest: 6,
                counter_life: 50,
            },
        );
        let calls = [&first, &b, &second, &third];
        let bounds = CallBounds::of(calls.into_iter());
        assert_eq!(
            bounds,
            CallBounds {
                deadline: 7,
                earliest: 6,
                counter_life: 60
            }
        );
        let mut out = BytesMut::new();
        encode_script_call(
            &mut out,
            Invoke::Sha("f00"),
            Names::Declared,
            &[&[1][..], &bounds.lead()[..]].concat(),
            calls.into_iter(),
        );
        assert_eq!(
            out.freeze(),
            encode_command(&[
                "EVALSHA", "f00", "5", "c", "b", "tb", "c", "d", "1", "7", "6", "60", "p", "q",
                "2", "", "p", "q", "r"
            ])
        );
        // No call with bounds: zeros, which let no acquire write.
        assert_eq!(CallBounds::of([&a, &b].into_iter()), CallBounds::default());
    }
}

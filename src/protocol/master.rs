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
/// possibly one number among the arguments that differs per master
/// ([`ScriptCall::with_number`]): the rest is encoded once for every master.
#[derive(Debug, Clone)]
pub struct ScriptCall {
    /// The keys' bulks, then the arguments' bulks (without the number).
    bulks: Bytes,
    /// Where the arguments start in `bulks`.
    args_at: usize,
    /// Where the number's bulk goes in `bulks`, and the number.
    number: Option<(usize, u64)>,
    keys: usize,
    args: usize,
}

impl ScriptCall {
    /// A call with `keys` (each given as the pieces it is the concatenation of, so that a key
    /// such as a token counter is written without being built first) and `args`.
    pub fn new(keys: &[&[&[u8]]], args: &[&[u8]]) -> ScriptCall {
        ScriptCall::around_number(keys, args, None)
    }

    /// A call whose arguments are `before`, a number, then `after`; the number is 0 until
    /// [`ScriptCall::with_number`].
    pub fn with_number_between(keys: &[&[&[u8]]], before: &[&[u8]], after: &[&[u8]]) -> ScriptCall {
        ScriptCall::around_number(keys, before, Some(after))
    }

    fn around_number(keys: &[&[&[u8]]], before: &[&[u8]], after: Option<&[&[u8]]>) -> ScriptCall {
        let rest = after.unwrap_or_default();
        // Each bulk's header and CRLFs take at most 16 bytes: sized once, never regrown.
        let key_bytes: usize = keys.iter().flat_map(|k| k.iter()).map(|p| p.len()).sum();
        let arg_bytes: usize = before.iter().chain(rest).map(|a| a.len()).sum();
        let bulk_count = keys.len() + before.len() + rest.len();
        let mut bulks = BytesMut::with_capacity(key_bytes + arg_bytes + 16 * bulk_count);
        for key in keys {
            bulk_of_parts(&mut bulks, key);
        }
        let args_at = bulks.len();
        for arg in before {
            bulk(&mut bulks, b'$', arg);
        }
        let number = after.is_some().then_some((bulks.len(), 0));
        for arg in rest {
            bulk(&mut bulks, b'$', arg);
        }
        ScriptCall {
            bulks: bulks.freeze(),
            args_at,
            number,
            keys: keys.len(),
            args: before.len() + after.map_or(0, |after| after.len() + 1),
        }
    }

    /// This call with `n` as its number, sharing the rest (no copy).
    pub fn with_number(&self, n: u64) -> ScriptCall {
        ScriptCall {
            number: self.number.map(|(at, _)| (at, n)),
            ..self.clone()
        }
    }

    fn encode_keys(&self, out: &mut BytesMut) {
        out.extend_from_slice(&self.bulks[..self.args_at]);
    }

    fn encode_args(&self, out: &mut BytesMut) {
        match self.number {
            None => out.extend_from_slice(&self.bulks[self.args_at..]),
            Some((at, n)) => {
                out.extend_from_slice(&self.bulks[self.args_at..at]);
                bulk(out, b'$', itoa::Buffer::new().format(n).as_bytes());
                out.extend_from_slice(&self.bulks[at..]);
            }
        }
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
/// body`), the number of keys, `shared_keys`, every call's keys, then `lead` if given (one
/// argument for the whole call) and every call's arguments, so the script finds call `i`'s
/// keys and arguments at fixed strides after the shared keys and the lead.
pub fn encode_script_call<'a>(
    out: &mut BytesMut,
    invoke: Invoke<'_>,
    names: Names<'_>,
    lead: Option<u64>,
    calls: impl Iterator<Item = &'a ScriptCall> + Clone,
) {
    let shared_keys = match names {
        Names::Declared(shared) => shared,
        Names::Counted => &[],
    };
    let keys = shared_keys.len() + calls.clone().map(|c| c.keys).sum::<usize>();
    let args = usize::from(lead.is_some()) + calls.clone().map(|c| c.args).sum::<usize>();
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
    for key in shared_keys {
        bulk(out, b'$', key);
    }
    for call in calls.clone() {
        call.encode_keys(out);
    }
    if let Some(lead) = lead {
        bulk(out, b'$', itoa::Buffer::new().format(lead).as_bytes());
    }
    for call in calls {
        call.encode_args(out);
    }
}

/// How a merged script call passes the names of the keys it touches.
#[derive(Debug, Clone, Copy)]
pub enum Names<'a> {
    /// As declared keys (`KEYS`): these shared ones, then each call's.
    Declared(&'a [Bytes]),
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
        let shared = [Bytes::from_static(b"m")];
        let a = ScriptCall::new(&[&[b"a"], &[b"t", b"a"]], &[b"1", b"x\r\n"]);
        let b = ScriptCall::new(&[&[b"b"], &[b"tb"]], &[b"2", b""]);
        let mut out = BytesMut::new();
        encode_script_call(
            &mut out,
            Invoke::Sha("f00"),
            Names::Declared(&shared),
            None,
            [&a, &b].into_iter(),
        );
        assert_eq!(
            out.freeze(),
            encode_command(&[
                "EVALSHA", "f00", "5", "m", "a", "ta", "b", "tb", "1", "x\r\n", "2", ""
            ])
        );
        // A lead: one argument for the whole call, before every call's arguments.
        let mut out = BytesMut::new();
        encode_script_call(
            &mut out,
            Invoke::Sha("f00"),
            Names::Declared(&shared),
            Some(42),
            [&a, &b].into_iter(),
        );
        assert_eq!(
            out.freeze(),
            encode_command(&[
                "EVALSHA", "f00", "5", "m", "a", "ta", "b", "tb", "42", "1", "x\r\n", "2", ""
            ])
        );
        let mut out = BytesMut::new();
        encode_script_call(
            &mut out,
            Invoke::Body("return 1"),
            Names::Declared(&[]),
            None,
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
            None,
            [&a, &b].into_iter(),
        );
        assert_eq!(
            out.freeze(),
            encode_command(&[
                "EVALSHA", "f00", "0", "4", "a", "ta", "b", "tb", "1", "x\r\n", "2", ""
            ])
        );
        // One template, a number per master: the rest is shared, the number in its place.
        let template = ScriptCall::with_number_between(&[&[b"c"]], &[b"p", b"q"], &[b"z"]);
        let (first, second) = (template.with_number(7), template.with_number(1_000_000));
        let mut out = BytesMut::new();
        encode_script_call(
            &mut out,
            Invoke::Sha("f00"),
            Names::Declared(&[]),
            None,
            [&first, &b].into_iter(),
        );
        assert_eq!(
            out.freeze(),
            encode_command(&["EVALSHA", "f00", "3", "c", "b", "tb", "p", "q", "7", "z", "2", ""])
        );
        let mut out = BytesMut::new();
        encode_script_call(
            &mut out,
            Invoke::Sha("f00"),
            Names::Declared(&[]),
            None,
            [&second].into_iter(),
        );
        assert_eq!(
            out.freeze(),
            encode_command(&["EVALSHA", "f00", "1", "c", "p", "q", "1000000", "z"])
        );
        let trailing = ScriptCall::with_number_between(&[], &[b"p"], &[]).with_number(3);
        let mut out = BytesMut::new();
        encode_script_call(
            &mut out,
            Invoke::Sha("f00"),
            Names::Declared(&[]),
            None,
            [&trailing].into_iter(),
        );
        assert_eq!(
            out.freeze(),
            encode_command(&["EVALSHA", "f00", "0", "p", "3"])
        );
    }
}

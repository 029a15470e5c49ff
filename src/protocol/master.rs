//! The master side of the wire: commands encoded for the masters, and their replies decoded
//! (with `redis-protocol`, RESP2, which is what a fresh connection to Redis speaks) into the
//! same [`Reply`] type the proxy answers clients with.

use super::reply::{bulk, header};
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

/// The `EVAL` of `body` with the keys and arguments of `evalsha`, an `EVALSHA` as
/// [`encode_command`] writes it: what a master that answered `NOSCRIPT` is sent instead.
/// Built only then, so that a script call does not encode the script's body every time.
/// `None` if `evalsha` is not such an `EVALSHA`.
pub fn evalsha_as_eval(evalsha: &[u8], body: &[u8]) -> Option<Bytes> {
    let (count, rest) = split_header(evalsha, b'*')?;
    let rest = rest.strip_prefix(b"$7\r\nEVALSHA\r\n".as_slice())?;
    let (sha_len, rest) = split_header(rest, b'$')?;
    let keys_and_args = rest.get(sha_len + 2..)?;
    let mut out = BytesMut::with_capacity(body.len() + keys_and_args.len() + 48);
    header(&mut out, b'*', count);
    bulk(&mut out, b'$', b"EVAL");
    bulk(&mut out, b'$', body);
    out.extend_from_slice(keys_and_args);
    Some(out.freeze())
}

/// `<prefix><n>\r\n` at the start of `buf`: `n` and what follows.
fn split_header(buf: &[u8], prefix: u8) -> Option<(usize, &[u8])> {
    let rest = buf.strip_prefix(&[prefix])?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    let n = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
    Some((n, &rest[end + 2..]))
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
    fn an_evalsha_becomes_the_eval_of_the_body() {
        let body = "return {KEYS[1], ARGV[1]}";
        let sha = crate::script_cache::script_sha(body.as_bytes());
        let evalsha = encode_command(&["EVALSHA", &sha, "1", "k", "v\r\n"]);
        assert_eq!(
            evalsha_as_eval(&evalsha, body.as_bytes()),
            Some(encode_command(&["EVAL", body, "1", "k", "v\r\n"]))
        );
        let no_args = encode_command(&["EVALSHA", &sha, "0"]);
        assert_eq!(
            evalsha_as_eval(&no_args, body.as_bytes()),
            Some(encode_command(&["EVAL", body, "0"]))
        );
        for other in [
            encode_command(&["EVAL", body, "0"]),
            encode_command(&["EVALSHA"]),
            Bytes::from_static(b"*3\r\n$7\r\nEVALSHA\r\n$40\r\nabc"),
            Bytes::new(),
        ] {
            assert_eq!(evalsha_as_eval(&other, body.as_bytes()), None, "{other:?}");
        }
    }
}

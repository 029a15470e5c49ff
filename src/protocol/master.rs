//! The master side of the wire: commands encoded for the masters, and their replies decoded
//! (with `redis-protocol`, RESP2, which is what a fresh connection to Redis speaks) into the
//! same [`Reply`] type the proxy answers clients with.

use super::reply::{bulk, header};
use super::Reply;
use bytes::{Bytes, BytesMut};
use redis_protocol::resp2::{decode::decode_bytes_mut, types::BytesFrame};

/// Encodes a command as a RESP array of bulk strings, the form every master accepts.
pub fn encode_command<A: AsRef<[u8]>>(args: &[A]) -> Bytes {
    let mut out = BytesMut::new();
    header(&mut out, b'*', args.len());
    for arg in args {
        bulk(&mut out, b'$', arg.as_ref());
    }
    out.freeze()
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
}

//! Entry points for the fuzz targets (`fuzz/`) and the property tests: the pure code the
//! proxy runs on bytes a peer controls — the client request parser, the decoder of the
//! masters' replies and what is made of those replies (quorum merge, TTL answers, `TIME` and
//! `INFO` readings), and the recogniser of clients' lock scripts.
//!
//! Not an API: hidden from the docs, re-exports only, may change with the modules behind it.

pub use crate::health::judge::{judge, parse_info, parse_time};
pub use crate::lease_script::{is_compare_and_delete, may_write, recognise, LeaseShape};
pub use crate::protocol::request::{DEFAULT_MAX_BULK_LEN, INLINE_MAX_SIZE};
pub use crate::protocol::{
    decode_reply, encode_command, ParseError, Protocol, Reply, Request, RequestParser,
};
pub use crate::redlock::{
    acquire_decision, conservative_ttl, merge, quorum, token_floor, AcquireDecision, MergeRule,
    Vote,
};

/// The client request parser with the limits a default configuration has.
pub fn request_parser() -> RequestParser {
    RequestParser::new(DEFAULT_MAX_BULK_LEN)
}

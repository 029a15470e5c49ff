//! The wire protocol on both sides: client requests (RESP multibulk and inline, with Redis'
//! own limits and error texts), replies to clients (RESP2 or RESP3, chosen per request), and
//! commands to masters with their replies ([`master`]), all in one [`Reply`] type, so a reply
//! from a master and a reply made by the proxy are the same thing.
//!
//! Depends on nothing else in the crate.

pub mod master;
pub mod reply;
pub mod request;

pub use master::{
    decode_reply, encode_command, encode_script_call, CallBounds, Invoke, Names, ScriptCall,
};
pub use reply::{Protocol, Reply};
pub use request::{parse_strict_i64, ParseError, Request, RequestParser};

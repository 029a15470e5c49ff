//! The client-facing wire protocol: request parsing (RESP multibulk and inline, with Redis'
//! own limits and error texts) and reply encoding (RESP2 or RESP3, chosen per request).
//!
//! Backend replies are decoded by `redis-protocol` in [`crate::backend`] and converted into the
//! same [`Reply`] type, so a reply from a master and a reply made by the proxy are one type.

pub mod reply;
pub mod request;

pub use reply::{Protocol, Reply};
pub use request::{ParseError, Request, RequestParser};

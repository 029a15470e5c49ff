//! Masters that are Redis Clusters (issue 26; docs/design/cluster-masters.md): hash slots
//! ([`slots`]), the proxy's own keys per slot ([`keys`]), the slot map and the redirections a
//! cluster answers ([`map`]).

pub mod keys;
pub mod map;
pub mod slots;

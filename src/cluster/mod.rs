//! Masters that are Redis Clusters (issue 26; docs/design/cluster-masters.md): hash slots
//! ([`slots`]), the slot map and the redirections a cluster answers ([`map`]).

pub mod map;
pub mod slots;

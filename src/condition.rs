//! The conditions of Redis 8.4's `SET … IFEQ|IFNE|IFDEQ|IFDNE` and `DELEX`, and its `DIGEST`:
//! pure parsing and the XXH3 digest, no I/O.
//!
//! Redis 7 masters have no XXH3 in Lua, so a digest condition is resolved on the proxy against
//! the value a majority holds ([`Condition::resolve`]) and reaches the masters as a condition on
//! that *value*: every master-side write stays conditioned on the exact value the digest was
//! checked against, so the check and the write cannot be split by a concurrent change (a value
//! changed in between makes the write a no-op, answered as a condition that did not hold).
//!
//! Invariant: [`digest`] is Redis 8.4's `DIGEST` text: the XXH3 64-bit hash (seed 0) as 16
//! lower-case hex digits, zero-padded.

use bytes::Bytes;

/// One of the four conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// The key holds this value.
    Eq(Bytes),
    /// The key is missing or holds another value.
    Ne(Bytes),
    /// The key holds a value of this digest.
    DigestEq(Bytes),
    /// The key is missing or holds a value of another digest.
    DigestNe(Bytes),
}

/// What a condition comes to on the masters, once resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnMasters {
    /// Act where the key holds this value.
    Holds(Bytes),
    /// Act where the key is missing or holds another value than this one.
    Differs(Bytes),
    /// Act where the key is missing.
    Missing,
    /// The condition does not hold: nothing to do.
    Never,
}

/// Redis 8.4's digest of `value` (see the module's invariant).
pub fn digest(value: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(value))
}

impl Condition {
    /// The condition named by `token` (any case) with `arg`, if `token` is one.
    pub fn parse(token: &[u8], arg: &Bytes) -> Option<Condition> {
        let make = match token.to_ascii_uppercase().as_slice() {
            b"IFEQ" => Condition::Eq,
            b"IFNE" => Condition::Ne,
            b"IFDEQ" => Condition::DigestEq,
            b"IFDNE" => Condition::DigestNe,
            _ => return None,
        };
        Some(make(arg.clone()))
    }

    /// Whether the proxy must read the majority's value first ([`Condition::resolve`]).
    pub fn needs_value(&self) -> bool {
        matches!(self, Condition::DigestEq(_) | Condition::DigestNe(_))
    }

    /// The condition as the masters can check it, given the value a majority holds
    /// (`current`; only read for the digest forms). Digests compare as hex text in any case.
    pub fn resolve(&self, current: Option<&Bytes>) -> OnMasters {
        let same =
            |wanted: &Bytes, value: &Bytes| digest(value).as_bytes().eq_ignore_ascii_case(wanted);
        match (self, current) {
            (Condition::Eq(value), _) => OnMasters::Holds(value.clone()),
            (Condition::Ne(value), _) => OnMasters::Differs(value.clone()),
            (Condition::DigestEq(wanted), Some(value)) if same(wanted, value) => {
                OnMasters::Holds(value.clone())
            }
            (Condition::DigestEq(_), _) => OnMasters::Never,
            (Condition::DigestNe(_), None) => OnMasters::Missing,
            (Condition::DigestNe(wanted), Some(value)) if same(wanted, value) => OnMasters::Never,
            (Condition::DigestNe(_), Some(value)) => OnMasters::Holds(value.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_redis_8_4_s() {
        // The example of Redis 8.4's DIGEST page (redis.io/docs/latest/commands/digest/).
        assert_eq!(digest(b"Hello world"), "b6acb9d84a38ff74");
        // Zero-padded to 16 digits, as redis-py's tests expect of every value, the empty one too.
        assert_eq!(digest(b"").len(), 16);
    }

    #[test]
    fn digest_conditions_resolve_to_value_conditions() {
        let v = Bytes::from_static(b"Hello world");
        let d = Bytes::from_static(b"B6ACB9D84A38FF74");
        let other = Bytes::from_static(b"0000000000000000");
        let holds = OnMasters::Holds(v.clone());
        assert_eq!(Condition::DigestEq(d.clone()).resolve(Some(&v)), holds);
        assert_eq!(
            Condition::DigestEq(other.clone()).resolve(Some(&v)),
            OnMasters::Never
        );
        assert_eq!(
            Condition::DigestEq(d.clone()).resolve(None),
            OnMasters::Never
        );
        assert_eq!(
            Condition::DigestNe(d.clone()).resolve(Some(&v)),
            OnMasters::Never
        );
        assert_eq!(Condition::DigestNe(other).resolve(Some(&v)), holds);
        assert_eq!(Condition::DigestNe(d).resolve(None), OnMasters::Missing);
        let parsed = Condition::parse(b"ifne", &v);
        assert_eq!(parsed.map(|c| c.resolve(None)), Some(OnMasters::Differs(v)));
        assert_eq!(Condition::parse(b"NX", &Bytes::new()), None);
    }
}

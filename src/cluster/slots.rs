//! Redis Cluster's hash slots, computed by the proxy (docs/design/cluster-masters.md, fact 7):
//! a key's slot ([`key_slot`]: CRC16-XMODEM of its hash tag, or of the whole key, modulo
//! 16384) and, per slot, the shortest alphanumeric tag that hashes to it ([`slot_tag`]), so the
//! proxy's own keys for a slot (`redlock-proxy:armed:{T}`, …) live in that slot.
//!
//! Pure, no I/O. Invariant: `key_slot(format!("…{{{}}}…", slot_tag(s)))` is `s` for every slot
//! (table-tested here, and against `CLUSTER KEYSLOT` of a real cluster in `tests/cluster.rs`).

use std::sync::LazyLock;

/// Slots of a Redis Cluster.
pub const SLOTS: usize = 16384;

/// CRC16-XMODEM (polynomial 0x1021, initial value 0, no reflection), as Redis Cluster uses.
fn crc16(bytes: &[u8]) -> u16 {
    static TABLE: LazyLock<[u16; 256]> = LazyLock::new(|| {
        let mut table = [0u16; 256];
        for (i, entry) in table.iter_mut().enumerate() {
            let mut crc = (i as u16) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
            *entry = crc;
        }
        table
    });
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

/// The part of `key` that is hashed: between the first `{` and the first `}` after it, if that
/// is not empty; else the whole key (the Redis Cluster specification, "Hash tags").
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The slot of `key`.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) & (SLOTS as u16 - 1)
}

/// The shortest string of `[0-9A-Za-z]` (1 to 3 characters; the first such in that order)
/// whose slot is `slot`: the hash tag of the proxy's own keys for that slot.
pub fn slot_tag(slot: u16) -> &'static str {
    static TAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
        const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
        let mut tags: Vec<Option<String>> = vec![None; SLOTS];
        let mut missing = SLOTS;
        let mut candidate = Vec::with_capacity(3);
        'lengths: for len in 1..=3u32 {
            for n in 0..ALPHABET.len().pow(len) {
                candidate.clear();
                let mut rest = n;
                for _ in 0..len {
                    candidate.push(ALPHABET[rest % ALPHABET.len()]);
                    rest /= ALPHABET.len();
                }
                // The first character varies slowest: candidates in lexicographic order.
                candidate.reverse();
                let tag = &mut tags[usize::from(key_slot(&candidate))];
                if tag.is_none() {
                    *tag = Some(String::from_utf8_lossy(&candidate).into_owned());
                    missing -= 1;
                    if missing == 0 {
                        break 'lengths;
                    }
                }
            }
        }
        // Every slot has a tag of at most 3 characters (checked by the tests below).
        tags.into_iter().map(Option::unwrap_or_default).collect()
    });
    &TAGS[usize::from(slot) % SLOTS]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots from the design notes' run of `CLUSTER KEYSLOT` on redis-server 7.0.15.
    #[test]
    fn slots_match_what_redis_cluster_computes() {
        let cases: &[(&str, u16)] = &[
            ("a", 15495),
            ("b", 3300),
            ("{a}x", 15495),
            ("{a}y", 15495),
            ("{}", 15257),
            ("{}a", 10875),
            ("a{}", 6082),
            ("a{b}c", 3300),
            ("}{", 12793),
            ("}{x}", 16287),
            ("x{a}{b}", 15495),
            ("foo{", 7673),
            ("{foo}", 12182),
            ("foo", 12182),
            ("redlock-proxy:armed", 6919),
            ("redlock-proxy:quarantine", 12048),
            ("redlock-proxy:token:foo", 917),
            ("redlock-proxy:token:{foo}", 12182),
            ("bar", 5061),
            ("123456789", 12739),
        ];
        for (key, slot) in cases {
            assert_eq!(key_slot(key.as_bytes()), *slot, "{key}");
        }
    }

    #[test]
    fn every_slot_has_a_short_tag_that_hashes_to_it() {
        for slot in 0..SLOTS as u16 {
            let tag = slot_tag(slot);
            assert!((1..=3).contains(&tag.len()), "slot {slot}: {tag:?}");
            assert!(tag.bytes().all(|b| b.is_ascii_alphanumeric()), "{tag:?}");
            let key = format!("redlock-proxy:armed:{{{tag}}}");
            assert_eq!(key_slot(key.as_bytes()), slot, "{key}");
        }
        // As the design notes list them (computed there independently, in Python).
        let listed = [
            (0, "06S"),
            (3300, "b"),
            (5460, "1OV"),
            (12182, "9Le"),
            (16383, "6ZJ"),
        ];
        for (slot, tag) in listed {
            assert_eq!(slot_tag(slot), tag, "slot {slot}");
        }
    }
}

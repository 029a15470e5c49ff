//! The lock-script recogniser on arbitrary script bodies: never panics, and its three answers
//! agree with each other (a script with a lease shape sets an expiry; the classic
//! compare-and-delete release does not).
#![no_main]

use libfuzzer_sys::fuzz_target;
use redlock_proxy::fuzzing::{is_compare_and_delete, may_set_expiry, recognise};

fuzz_target!(|body: &[u8]| {
    let sets_expiry = may_set_expiry(body);
    if let Some(shape) = recognise(body) {
        assert!(shape.argv >= 1, "ARGV is 1-based: {shape:?}");
        assert!(matches!(shape.unit_ms, 1 | 1000), "{shape:?}");
        assert!(sets_expiry, "a lease script sets an expiry");
    }
    if is_compare_and_delete(body) {
        assert!(!sets_expiry, "a compare-and-delete sets no expiry");
        assert!(recognise(body).is_none());
    }
});

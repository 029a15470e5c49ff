//! The lock-script recogniser on arbitrary script bodies: never panics, and its three answers
//! agree with each other (a script with a lease shape writes, and so does the classic
//! compare-and-delete release, which deletes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use redlock_proxy::fuzzing::{is_compare_and_delete, may_write, recognise};

fuzz_target!(|body: &[u8]| {
    let writes = may_write(body);
    if let Some(shape) = recognise(body) {
        assert!(shape.argv >= 1, "ARGV is 1-based: {shape:?}");
        assert!(matches!(shape.unit_ms, 1 | 1000), "{shape:?}");
        assert!(writes, "a lease script writes");
    }
    if is_compare_and_delete(body) {
        assert!(writes, "a compare-and-delete deletes");
        assert!(recognise(body).is_none());
    }
});

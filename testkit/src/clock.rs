//! The clock nemesis: a redis-server whose wall clock a test steps or speeds up while its
//! monotonic clock stays real, as an NTP step, a VM resumed after a pause or a fast oscillator
//! would. Redis expires keys and answers `TIME` by the wall clock, so a step or a fast rate
//! expires every lock on that master early.
//!
//! The shim (`clock/shim.c`, `LD_PRELOAD`) is compiled once per test process with the C
//! compiler the Rust toolchain links with (`cc`); each [`FakeClock`] is a control file the shim
//! reads (at most once per ms), replaced whole on every change so no read sees half of it.

use redlock_proxy::LocalMaster;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SHIM_SOURCE: &str = include_str!("clock/shim.c");

/// The compiled shim, built on first use (panics with the compiler's message if it fails).
pub fn shim() -> &'static Path {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("redlock-clock-shim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("shim directory");
        let (source, library) = (dir.join("shim.c"), dir.join("shim.so"));
        std::fs::write(&source, SHIM_SOURCE).expect("shim source");
        let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = std::process::Command::new(&compiler)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&library)
            .arg(&source)
            .output()
            .unwrap_or_else(|err| panic!("{compiler} (to build the clock shim): {err}"));
        assert!(
            out.status.success(),
            "clock shim: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        library
    })
}

fn real_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// One master's wall clock: shown = real + offset + (real − anchor)·(rate − 1) past the anchor.
pub struct FakeClock {
    file: PathBuf,
    anchor_ns: i64,
    offset_ns: i64,
    rate: f64,
}

impl FakeClock {
    /// A clock that shows real time until told otherwise.
    pub fn new() -> FakeClock {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let file = std::env::temp_dir().join(format!(
            "redlock-clock-{}-{n}-{:x}",
            std::process::id(),
            real_ns()
        ));
        let clock = FakeClock {
            file,
            anchor_ns: 0,
            offset_ns: 0,
            rate: 1.0,
        };
        clock.write();
        clock
    }

    /// The environment a redis-server runs this clock with.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), shim().display().to_string()),
            ("REDLOCK_CLOCK_FILE".into(), self.file.display().to_string()),
        ]
    }

    /// A master on a free loopback port with this clock (no persistence, as every test
    /// master).
    pub fn start_master(&self) -> LocalMaster {
        LocalMaster::start_with_env(None, &[], self.env()).expect("redis-server with clock shim")
    }

    /// How far ahead of real time the clock shows now.
    fn ahead_ns(&self, real: i64) -> i64 {
        let past = (real - self.anchor_ns).max(0) as f64;
        self.offset_ns + (past * (self.rate - 1.0)) as i64
    }

    /// Steps the clock forward by `by` at once.
    pub fn step_forward(&mut self, by: Duration) {
        self.rebase(self.rate);
        self.offset_ns += by.as_nanos() as i64;
        self.write();
    }

    /// From now on the clock runs at `rate` times real time, without a jump.
    pub fn set_rate(&mut self, rate: f64) {
        self.rebase(rate);
        self.write();
    }

    /// Back to real time at once (a backward step, as NTP correcting the clock would make).
    pub fn reset(&mut self) {
        self.anchor_ns = 0;
        self.offset_ns = 0;
        self.rate = 1.0;
        self.write();
    }

    fn rebase(&mut self, rate: f64) {
        let now = real_ns();
        self.offset_ns = self.ahead_ns(now);
        self.anchor_ns = now;
        self.rate = rate;
    }

    fn write(&self) {
        let text = format!("{} {} {}\n", self.anchor_ns, self.offset_ns, self.rate);
        let staged = self.file.with_extension("new");
        std::fs::write(&staged, text).expect("clock file");
        std::fs::rename(&staged, &self.file).expect("clock file");
    }
}

impl Default for FakeClock {
    fn default() -> Self {
        FakeClock::new()
    }
}

impl Drop for FakeClock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

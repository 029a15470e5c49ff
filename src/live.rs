//! A duration a reload may change while the proxy runs ([`LiveDuration`]): the node timeout
//! and the health poll interval. Every holder of a clone reads the current value; a change
//! takes effect from each reader's next use (requests already waiting keep the timeout they
//! started with).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A shared duration, kept in µs.
#[derive(Debug, Clone)]
pub struct LiveDuration(Arc<AtomicU64>);

impl LiveDuration {
    pub fn new(value: Duration) -> LiveDuration {
        LiveDuration(Arc::new(AtomicU64::new(value.as_micros() as u64)))
    }

    pub fn get(&self) -> Duration {
        Duration::from_micros(self.0.load(Ordering::Relaxed))
    }

    pub fn set(&self, value: Duration) {
        self.0.store(value.as_micros() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_clone_sees_a_change() {
        let timeout = LiveDuration::new(Duration::from_millis(50));
        let held = timeout.clone();
        timeout.set(Duration::from_millis(200));
        assert_eq!(held.get(), Duration::from_millis(200));
    }
}

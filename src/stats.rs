//! What the proxy counts about its clients and commands ([`ServerStats`]). Read by `INFO` and
//! by the metrics endpoint ([`crate::ops`]); knows nothing of either.
//!
//! Invariant: the hot path only does relaxed atomic increments and stores: every counter a
//! request touches is resolved when the proxy starts (one per row of the command table), never
//! looked up by name or allocated per request.

use crate::protocol::Reply;
use crate::redlock::MergeRule;
use prometheus_client::metrics::counter::Counter;
use std::sync::{Mutex, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// How a release (`LOCK.RELEASE`, the compare-and-delete script) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseResult {
    /// A majority deleted the value.
    Released,
    /// The value was not held (expired, or another holder's).
    NotHeld,
    /// No quorum, or an error reply.
    Error,
}

impl ReleaseResult {
    pub const ALL: [ReleaseResult; 3] = [
        ReleaseResult::Released,
        ReleaseResult::NotHeld,
        ReleaseResult::Error,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ReleaseResult::Released => "released",
            ReleaseResult::NotHeld => "not_held",
            ReleaseResult::Error => "error",
        }
    }

    /// The result a merged release reply stands for (`1` released, `0` not held).
    pub fn of(reply: &Reply) -> ReleaseResult {
        match reply {
            Reply::Integer(n) if *n > 0 => ReleaseResult::Released,
            Reply::Integer(0) => ReleaseResult::NotHeld,
            _ => ReleaseResult::Error,
        }
    }
}

/// How many samples `instantaneous_ops_per_sec` averages, one per [`OPS_SAMPLE_EVERY`] (as
/// Redis: 16 samples, 100 ms apart).
const OPS_SAMPLES: usize = 16;
const OPS_SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Counters of the whole server.
#[derive(Debug)]
pub struct ServerStats {
    /// Connections accepted (Redis' `total_connections_received`).
    pub connections_received: Counter,
    /// Connections refused at `maxclients` (Redis' `rejected_connections`).
    pub rejected_connections: Counter,
    /// One counter per row of the command table, then one for unknown commands.
    commands: Box<[Counter]>,
    releases: [Counter; 3],
    /// Commands processed per second over the last [`OPS_SAMPLES`] samples.
    ops: Mutex<OpsMeter>,
}

impl ServerStats {
    /// Counters for a command table of `commands` rows.
    pub fn new(commands: usize) -> ServerStats {
        ServerStats {
            connections_received: Counter::default(),
            rejected_connections: Counter::default(),
            commands: (0..=commands).map(|_| Counter::default()).collect(),
            releases: Default::default(),
            ops: Mutex::new(OpsMeter::default()),
        }
    }

    /// Counts one command: row `slot` of the command table (`None`: unknown command).
    pub fn count_command(&self, slot: Option<usize>) {
        let last = self.commands.len() - 1;
        self.commands[slot.unwrap_or(last).min(last)].inc();
    }

    /// How many commands of row `slot` (`None`: unknown) were processed.
    pub fn commands_of(&self, slot: Option<usize>) -> u64 {
        let last = self.commands.len() - 1;
        self.commands[slot.unwrap_or(last).min(last)].get()
    }

    /// Every command processed (Redis' `total_commands_processed`).
    pub fn total_commands(&self) -> u64 {
        self.commands.iter().map(Counter::get).sum()
    }

    /// Counts a merged reply by the quorum rule `rule`: a release's if it is one.
    pub fn count_if_release(&self, rule: MergeRule, reply: &Reply) {
        if rule == MergeRule::Release {
            self.releases[ReleaseResult::of(reply) as usize].inc();
        }
    }

    pub fn releases(&self, result: ReleaseResult) -> u64 {
        self.releases[result as usize].get()
    }

    /// Commands per second, averaged like Redis' `instantaneous_ops_per_sec`.
    pub fn ops_per_sec(&self) -> u64 {
        self.ops.lock().map_or(0, |m| m.per_sec())
    }

    /// Samples the command total every 100 ms while `stats` lives.
    pub fn spawn_sampler(stats: Weak<ServerStats>) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(OPS_SAMPLE_EVERY);
            loop {
                tick.tick().await;
                let Some(stats) = stats.upgrade() else { return };
                let total = stats.total_commands();
                if let Ok(mut meter) = stats.ops.lock() {
                    meter.sample(Instant::now(), total);
                };
            }
        });
    }
}

/// The last samples of the command total, and their rates.
#[derive(Debug, Default)]
struct OpsMeter {
    last: Option<(Instant, u64)>,
    rates: [u64; OPS_SAMPLES],
    next: usize,
}

impl OpsMeter {
    fn sample(&mut self, now: Instant, total: u64) {
        if let Some((at, before)) = self.last {
            let elapsed = now.saturating_duration_since(at).as_secs_f64();
            if elapsed > 0.0 {
                self.rates[self.next] = (total.saturating_sub(before) as f64 / elapsed) as u64;
                self.next = (self.next + 1) % OPS_SAMPLES;
            }
        }
        self.last = Some((now, total));
    }

    fn per_sec(&self) -> u64 {
        self.rates.iter().sum::<u64>() / OPS_SAMPLES as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_per_sec_averages_the_last_samples() {
        let mut meter = OpsMeter::default();
        let start = Instant::now();
        for i in 0..=OPS_SAMPLES as u64 {
            meter.sample(start + OPS_SAMPLE_EVERY * i as u32, i * 100);
        }
        // 100 commands per 100 ms.
        assert_eq!(meter.per_sec(), 1000);
    }
}

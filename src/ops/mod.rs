//! Operations: what an operator sees and changes without reading logs.
//! - [`metrics`]: the Prometheus exposition of the counters every layer keeps next to what it
//!   counts ([`crate::stats`], [`crate::lock::LockStats`], [`crate::masters::VoteStats`], the
//!   health records), read at scrape time by one collector;
//! - [`http`]: the HTTP endpoint (`/metrics`, `/healthz`, `/readyz`, the status view);
//! - [`status`]: the status view's facts (`/status.json`, the page, `redlock-proxy status`);
//! - [`reload`]: applying a re-read configuration to a running proxy (SIGHUP), and the hooks
//!   other parts register for what they re-read.
//!
//! Beside the server (layer 9): reads [`Shared`](crate::shared::Shared), never written to by
//! the layers below.

pub mod http;
pub mod metrics;
pub mod reload;
pub mod status;

use crate::shared::Shared;

/// Whether a quorum of masters may vote now; otherwise why not (for `/readyz`). Either way,
/// each master that may not vote, with its state and why ("down (connection refused)").
pub fn readiness(shared: &Shared) -> Result<String, String> {
    let masters = shared.masters();
    let summary = masters.usable_summary();
    let ready = masters.usable() >= masters.quorum();
    let mut text = match ready {
        true => format!("ready: {summary}\n"),
        false => format!("not ready: {summary}\n"),
    };
    for (i, voter) in masters.voters().iter().enumerate() {
        if !voter.usable() {
            text.push_str(&format!("master{i} {}: {}\n", voter.name(), voter.state()));
        }
    }
    match ready {
        true => Ok(text),
        false => Err(text),
    }
}

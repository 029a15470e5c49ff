//! The Prometheus exposition: one [`Collector`] that reads, at scrape time, the counters each
//! layer keeps next to what it counts, and encodes them with `prometheus-client`.
//!
//! Invariants:
//! - Nothing here runs on a request's path: requests only bump pre-resolved atomic counters
//!   and histograms; labels are built here, per scrape.
//! - Labels are low-cardinality and fixed: results, vote kinds, master states, quarantine
//!   causes, command names of the table, and the masters' addresses. Never a key or a value.
//! - [`METRIC_NAMES`] lists every name exported (as it appears in the exposition), so that
//!   alert rules and dashboards can be checked against it.
//! - Two formats ([`Format`]): OpenMetrics, which `prometheus-client` writes, for a scraper that
//!   asks for it (Prometheus does), and by default the Prometheus text format 0.0.4, which
//!   every other tool reads (`promtool check metrics` among them: OpenMetrics' `info` type
//!   and its counter families named without `_total` are errors there), made from the same
//!   exposition ([`to_prometheus_text`]).

use crate::commands::COMMANDS;
use crate::health::QUARANTINE_CAUSES;
use crate::lock::AcquireResult;
use crate::masters::AcquireVote;
use crate::shared::Shared;
use crate::stats::ReleaseResult;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Every metric the proxy exports, as named in the exposition (histograms by their base
/// name: `_bucket`, `_sum` and `_count` follow it).
pub const METRIC_NAMES: &[&str] = &[
    "redlock_proxy_acquires_total",
    "redlock_proxy_acquire_duration_seconds",
    "redlock_proxy_releases_total",
    "redlock_proxy_rollbacks_total",
    "redlock_proxy_late_cleanups_total",
    "redlock_proxy_master_up",
    "redlock_proxy_master_state",
    "redlock_proxy_master_quarantines_total",
    "redlock_proxy_master_reply_duration_seconds",
    "redlock_proxy_master_votes_total",
    "redlock_proxy_connected_clients",
    "redlock_proxy_connections_received_total",
    "redlock_proxy_rejected_connections_total",
    "redlock_proxy_commands_total",
    "redlock_proxy_build_info",
    "redlock_proxy_quorum",
    "redlock_proxy_usable_masters",
    "redlock_proxy_pubsub_messages_total",
    "redlock_proxy_pubsub_subscriptions",
    "redlock_proxy_blocked_clients",
];

/// The states `redlock_proxy_master_state` has one series for.
const MASTER_STATES: [&str; 5] = ["up", "connecting", "down", "quarantined", "unsafe"];

/// A registry holding the proxy's collector.
pub fn registry(shared: Arc<Shared>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ProxyCollector { shared }));
    registry
}

/// The formats of the exposition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format, version 0.0.4.
    Text,
    /// OpenMetrics 1.0.0 text.
    OpenMetrics,
}

impl Format {
    /// Its HTTP `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// The format for a scrape's `Accept` header, chosen as Prometheus' client libraries
    /// choose (client_golang's `expfmt.NegotiateIncludingOpenMetrics`): its media ranges by
    /// preference (`q`, then their order), the first that is OpenMetrics (version 1.0.0 or
    /// none) or the text format (`text/plain`, version 0.0.4 or none) decides; the text
    /// format when none does (no header, `*/*`, only protobuf).
    pub fn negotiate(accept: Option<&str>) -> Format {
        let mut ranges: Vec<(f64, &str, Option<&str>)> = accept
            .unwrap_or_default()
            .split(',')
            .filter_map(|range| {
                let mut parts = range.split(';').map(str::trim);
                let media = parts.next().filter(|m| !m.is_empty())?;
                let (mut q, mut version) = (1.0, None);
                for (name, value) in parts.filter_map(|p| p.split_once('=')) {
                    let value = value.trim().trim_matches('"');
                    match name.trim() {
                        "q" => q = value.parse().unwrap_or(0.0),
                        "version" => version = Some(value),
                        _ => {}
                    }
                }
                // `q=0`: not acceptable.
                (q > 0.0).then_some((q, media, version))
            })
            .collect();
        // Stable: ranges of equal preference keep the client's order.
        ranges.sort_by(|a, b| b.0.total_cmp(&a.0));
        ranges
            .into_iter()
            .find_map(|(_, media, version)| {
                if media.eq_ignore_ascii_case("application/openmetrics-text")
                    && matches!(version, None | Some("1.0.0"))
                {
                    Some(Format::OpenMetrics)
                } else if media.eq_ignore_ascii_case("text/plain")
                    && matches!(version, None | Some("0.0.4"))
                {
                    Some(Format::Text)
                } else {
                    None
                }
            })
            .unwrap_or(Format::Text)
    }
}

/// The exposition of `registry` in `format`.
pub fn encode(registry: &Registry, format: Format) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    match format {
        Format::OpenMetrics => out,
        Format::Text => to_prometheus_text(&out),
    }
}

/// The Prometheus text format (0.0.4) of an OpenMetrics exposition as `prometheus-client`
/// writes it. The samples, their labels and escaping are the same in both; what differs is
/// the families' metadata:
/// - a counter family is named as its samples are, with `_total` (OpenMetrics names it
///   without);
/// - an `info` family (a type the text format lacks) is a gauge named as its samples, with
///   `_info`, valued 1;
/// - `# UNIT` and `# EOF` lines do not exist in the text format.
///
/// Nothing here writes what has no text form (exemplars, `_created` samples, state sets).
fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // A family's HELP line comes before its TYPE line, which says how to rename it.
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest.split_once(' ').map_or("", |(_, text)| text));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), kind),
                "info" => (format!("{name}_info"), "gauge"),
                "unknown" => (name.to_string(), "untyped"),
                _ => (name.to_string(), kind),
            };
            if let Some(help) = help.take() {
                out.push_str(&format!("# HELP {name} {help}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
        } else if !line.starts_with("# UNIT ") && line != "# EOF" {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Reads the proxy's counters at scrape time.
struct ProxyCollector {
    shared: Arc<Shared>,
}

impl fmt::Debug for ProxyCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProxyCollector")
    }
}

/// Encodes one metric family `name` with one series per `(label value, metric)`.
fn family<'a, M: EncodeMetric + 'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    series: impl IntoIterator<Item = (Vec<(&'static str, String)>, M)>,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, metric) in series {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn label(name: &'static str, value: impl Into<String>) -> Vec<(&'static str, String)> {
    vec![(name, value.into())]
}

/// The state label of a master state as `INFO` shows it (`quarantined (…)` → `quarantined`).
fn state_label(state: &str) -> &'static str {
    MASTER_STATES
        .iter()
        .find(|s| state.starts_with(**s))
        .copied()
        .unwrap_or("down")
}

impl Collector for ProxyCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let shared = &self.shared;
        let (stats, locks, masters) = (&shared.stats, shared.acquire_stats(), shared.masters());
        let counter = |n: u64| ConstCounter::new(n);
        let gauge = |n: i64| ConstGauge::new(n);
        let e = &mut encoder;
        family(
            e,
            "redlock_proxy_acquires",
            "Lock acquires by result: granted, contended (a majority said held), no_quorum (too few masters answered), expired (validity ran out), refused (by rule).",
            MetricType::Counter,
            AcquireResult::ALL
                .map(|r| (label("result", r.label()), counter(locks.acquires(r)))),
        )?;
        locks.acquire_duration.encode(e.encode_descriptor(
            "redlock_proxy_acquire_duration_seconds",
            "Acquires from the read of the request to the decision.",
            None,
            MetricType::Histogram,
        )?)?;
        family(
            e,
            "redlock_proxy_releases",
            "Releases (LOCK.RELEASE and the compare-and-delete script) by result.",
            MetricType::Counter,
            ReleaseResult::ALL.map(|r| (label("result", r.label()), counter(stats.releases(r)))),
        )?;
        let single = [
            (
                "redlock_proxy_rollbacks",
                "Clean-ups of refused or ungiven acquires.",
                locks.rollbacks.get(),
            ),
            (
                "redlock_proxy_late_cleanups",
                "Clean-ups resent once a silent master is surely past an acquire's deadline.",
                locks.late_cleanups.get(),
            ),
            (
                "redlock_proxy_connections_received",
                "Client connections accepted.",
                stats.connections_received.get(),
            ),
            (
                "redlock_proxy_rejected_connections",
                "Client connections refused at maxclients.",
                stats.rejected_connections.get(),
            ),
        ];
        for (name, help, value) in single {
            counter(value).encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)?;
        }
        let voters = masters.voters();
        let master = |i: usize| voters[i].name().to_string();
        let states: Vec<String> = voters.iter().map(|v| v.state()).collect();
        family(
            e,
            "redlock_proxy_master_up",
            "1 while the master may vote, else 0.",
            MetricType::Gauge,
            voters
                .iter()
                .enumerate()
                .map(|(i, v)| (label("master", master(i)), gauge(v.usable().into()))),
        )?;
        family(
            e,
            "redlock_proxy_master_state",
            "1 for the master's current state (up, connecting, down, quarantined, unsafe), 0 for the others.",
            MetricType::Gauge,
            states.iter().enumerate().flat_map(|(i, state)| {
                let now = state_label(state);
                MASTER_STATES.map(|s| {
                    let labels = vec![("master", master(i)), ("state", s.to_string())];
                    (labels, gauge((s == now).into()))
                })
            }),
        )?;
        family(
            e,
            "redlock_proxy_master_quarantines",
            "Quarantines begun, by cause.",
            MetricType::Counter,
            voters.iter().enumerate().flat_map(|(i, v)| {
                let counts = v.quarantines();
                QUARANTINE_CAUSES.map(|cause| {
                    let n = counts
                        .iter()
                        .find(|(c, _)| *c == cause)
                        .map_or(0, |(_, n)| *n);
                    let labels = vec![("master", master(i)), ("reason", cause.to_string())];
                    (labels, counter(n))
                })
            }),
        )?;
        family(
            e,
            "redlock_proxy_master_reply_duration_seconds",
            "Request to reply on the master's connection (replies within the node timeout).",
            MetricType::Histogram,
            voters
                .iter()
                .enumerate()
                .map(|(i, v)| (label("master", master(i)), v.stats.reply_duration.clone())),
        )?;
        family(
            e,
            "redlock_proxy_master_votes",
            "The master's votes in acquires: ok, held, timeout, not_eligible, error; late=\"true\" for those that came after the decision.",
            MetricType::Counter,
            voters.iter().enumerate().flat_map(|(i, v)| {
                [false, true].into_iter().flat_map(move |late| {
                    AcquireVote::ALL.map(|kind| {
                        let labels = vec![
                            ("master", master(i)),
                            ("vote", kind.label().to_string()),
                            ("late", late.to_string()),
                        ];
                        (labels, counter(v.stats.acquire_votes(kind, late)))
                    })
                })
            }),
        )?;
        let usable = voters.iter().filter(|v| v.usable()).count();
        let gauges = [
            (
                "redlock_proxy_connected_clients",
                "Client connections served now.",
                shared.clients.load(Ordering::Relaxed),
            ),
            (
                "redlock_proxy_quorum",
                "Masters a decision needs.",
                masters.quorum(),
            ),
            (
                "redlock_proxy_usable_masters",
                "Masters that may vote now.",
                usable,
            ),
            (
                "redlock_proxy_blocked_clients",
                "Blocked pops (BLPOP, BRPOP, BLMOVE) waiting now.",
                shared.pubsub.stats.blocked.load(Ordering::Relaxed) as usize,
            ),
        ];
        for (name, help, value) in gauges {
            gauge(value as i64).encode(e.encode_descriptor(
                name,
                help,
                None,
                MetricType::Gauge,
            )?)?;
        }
        let pubsub = &shared.pubsub.stats;
        family(
            e,
            "redlock_proxy_pubsub_messages",
            "Pub/sub messages from the masters: passed on once a quorum of masters delivered them, or a node timeout after the first copy (delivered), and the copies that passed nothing on (duplicate).",
            MetricType::Counter,
            [
                ("delivered", &pubsub.delivered),
                ("duplicate", &pubsub.duplicates),
            ]
            .map(|(copy, n)| (label("copy", copy), counter(n.load(Ordering::Relaxed)))),
        )?;
        family(
            e,
            "redlock_proxy_pubsub_subscriptions",
            "Channels, patterns and shard channels this proxy's clients are subscribed to.",
            MetricType::Gauge,
            shared
                .pubsub
                .subscriptions()
                .map(|(kind, n)| (label("kind", kind.label()), gauge(n as i64))),
        )?;
        family(
            e,
            "redlock_proxy_commands",
            "Commands processed, by command (unknown: not in the command table).",
            MetricType::Counter,
            COMMANDS
                .iter()
                .enumerate()
                .map(|(slot, spec)| (Some(slot), spec.name))
                .chain([(None, "unknown")])
                .map(|(slot, name)| (label("command", name), counter(stats.commands_of(slot)))),
        )?;
        Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]).encode(e.encode_descriptor(
            "redlock_proxy_build",
            "The proxy's version.",
            None,
            MetricType::Info,
        )?)?;
        Ok(())
    }
}

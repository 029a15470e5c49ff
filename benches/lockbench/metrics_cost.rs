//! `metrics`: what the metrics cost in throughput (issue 13). Lock cycles through the proxy
//! over 5 masters, 50 connections, depth 1, alternately without metrics and with them
//! (`--metrics`, scraped every second: harsher than Prometheus' default 15 s), for
//! `BENCH_ROUNDS` interleaved rounds; the last scrape taken under load goes into the report.
//! The cells without metrics run `BENCH_BASELINE_BIN` if given (a build without the metrics
//! code: the counters themselves are always kept, for `INFO`), else this build without
//! `--metrics`.

use crate::cycles::run_cycle_cell;
use crate::settings::{Settings, Target};
use crate::stats::CycleResult;
use redlock_proxy::LocalCluster;
use redlock_testkit::http::get;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::watch;

/// Connections of each cell.
pub const CONNS: usize = 50;
/// How often the endpoint is scraped while the load runs.
const SCRAPE_EVERY: Duration = Duration::from_secs(1);

/// One round: the cell without metrics, then the cell with them.
pub struct Round {
    pub off: CycleResult,
    pub on: CycleResult,
    /// Scrapes answered during the cell with metrics.
    pub scrapes: usize,
}

pub struct MetricsCost {
    pub rounds: Vec<Round>,
    /// The last scrape taken under load.
    pub scrape: Option<String>,
}

/// A free loopback address for the endpoint (the port is released just before the proxy
/// binds it; nothing else on this machine races for it during a benchmark).
fn free_addr() -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}

/// Scrapes `addr` every [`SCRAPE_EVERY`] until `stop`; the number of answers and the last.
async fn scrape_until(
    addr: SocketAddr,
    mut stop: watch::Receiver<bool>,
) -> (usize, Option<String>) {
    let (mut answered, mut last) = (0, None);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(SCRAPE_EVERY) => {}
            _ = stop.changed() => return (answered, last),
        }
        if let Ok((200, body)) = get(addr, "/metrics").await {
            answered += 1;
            last = Some(body);
        }
    }
}

pub async fn run(
    settings: &Settings,
    masters: &LocalCluster,
    hz: f64,
) -> std::io::Result<MetricsCost> {
    let mut cost = MetricsCost {
        rounds: Vec::new(),
        scrape: None,
    };
    let mut without_metrics = settings.clone();
    if let Some(bin) = &settings.baseline_bin {
        without_metrics.proxy_bin = bin.clone();
    }
    for _ in 0..settings.rounds {
        let off = run_cycle_cell(&without_metrics, masters, Target::Proxy(5), CONNS, 1, hz).await;
        let addr = free_addr()?;
        let mut with_metrics = settings.clone();
        with_metrics
            .proxy_args
            .extend(["--metrics".to_string(), addr.to_string()]);
        let (stop, stopped) = watch::channel(false);
        let scraper = tokio::spawn(scrape_until(addr, stopped));
        let mut on = run_cycle_cell(&with_metrics, masters, Target::Proxy(5), CONNS, 1, hz).await;
        on.scenario = format!("{} + metrics", on.scenario);
        stop.send_replace(true);
        let (scrapes, last) = scraper.await.unwrap_or((0, None));
        if last.is_some() {
            cost.scrape = last;
        }
        cost.rounds.push(Round { off, on, scrapes });
    }
    Ok(cost)
}

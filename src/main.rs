//! The `redlock-proxy` binary: flags (docs/PROTOCOL.md §2), logging, `--local` masters, then
//! [`redlock_proxy::run`] until SIGINT/SIGTERM.

use clap::Parser;

/// mimalloc: per-thread free lists and no consolidation passes; glibc malloc took ~15 % of the
/// proxy's CPU in a profile of the acquire path (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use redlock_proxy::{Config, LocalCluster, LogFormat};
use std::path::PathBuf;
use std::process::ExitCode;

/// A Redis-compatible proxy that turns SET NX PX and lock scripts into Redlock majority
/// operations over N independent Redis masters.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// TOML configuration file (examples in configs/); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Listen address [default: 127.0.0.1].
    #[arg(long)]
    bind: Option<String>,
    /// Listen port; 0 picks a free one and prints it [default: 7379].
    #[arg(long)]
    port: Option<u16>,
    /// One independent Redis master HOST:PORT; repeat for each master.
    #[arg(long = "backend", value_name = "HOST:PORT")]
    backends: Vec<String>,
    /// Start N local redis-server masters on free loopback ports and use them.
    #[arg(long, value_name = "N")]
    local: Option<usize>,
    /// How long one master may take to answer before its vote counts as "no" [default: 50].
    #[arg(long, value_name = "MS")]
    node_timeout_ms: Option<u64>,
    /// Clock drift allowance: drift = TTL × F + 2 ms [default: 0.01].
    #[arg(long, value_name = "F")]
    drift_factor: Option<f64>,
    /// Longest TTL forwarded (acquires, extends, scripts); a master that lost data is
    /// quarantined this long plus drift. Use the same value on every proxy [default: 60000].
    #[arg(long, value_name = "MS")]
    max_lock_ttl_ms: Option<u64>,
    /// Log format [default: text].
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
    /// Password of the `default` user: clients must AUTH (Redis' requirepass). Prefer the
    /// environment variable or the config file to a flag, which `ps` shows.
    #[arg(long, env = "REDLOCK_PROXY_REQUIREPASS", hide_env_values = true)]
    requirepass: Option<String>,
    /// Most client connections at once [default: 10000].
    #[arg(long, value_name = "N")]
    maxclients: Option<usize>,
    /// Close clients idle this many seconds; 0 never [default: 0].
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u64>,
    /// Request bytes one client may have buffered before it is closed [default: 1 GB].
    #[arg(long, value_name = "BYTES")]
    client_query_buffer_limit: Option<u64>,
    /// Worker threads; 1 runs everything on one thread, which is fastest when the proxy
    /// shares a small machine with its masters [default: 1].
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
}

impl Cli {
    fn into_config(self) -> Result<Config, redlock_proxy::ConfigError> {
        let mut config = match &self.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        if let Some(v) = self.bind {
            config.bind = v;
        }
        if let Some(v) = self.port {
            config.port = v;
        }
        if !self.backends.is_empty() {
            config.backends = self.backends;
        }
        if self.local.is_some() {
            config.local = self.local;
        }
        if let Some(v) = self.node_timeout_ms {
            config.node_timeout_ms = v;
        }
        if let Some(v) = self.drift_factor {
            config.drift_factor = v;
        }
        if let Some(v) = self.max_lock_ttl_ms {
            config.max_lock_ttl_ms = v;
        }
        if let Some(v) = self.log_format {
            config.log_format = v;
        }
        if let Some(v) = self.threads {
            config.threads = v;
        }
        if let Some(v) = self.requirepass {
            config.requirepass = Some(redlock_proxy::Secret::new(v));
        }
        if let Some(v) = self.maxclients {
            config.maxclients = v;
        }
        if let Some(v) = self.timeout {
            config.timeout = v;
        }
        if let Some(v) = self.client_query_buffer_limit {
            config.client_query_buffer_limit = v;
        }
        config.validate()?;
        Ok(config)
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing a SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

fn main() -> ExitCode {
    let config = match Cli::parse().into_config() {
        Ok(config) => config,
        Err(err) => {
            eprintln!("redlock-proxy: {err}");
            return ExitCode::from(2);
        }
    };
    init_logging(config.log_format);
    let runtime = if config.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.threads)
            .enable_all()
            .build()
    };
    match runtime {
        Ok(runtime) => runtime.block_on(serve(config)),
        Err(err) => {
            eprintln!("redlock-proxy: cannot start the runtime: {err}");
            ExitCode::from(1)
        }
    }
}

async fn serve(mut config: Config) -> ExitCode {
    // Local masters live as long as this binding: dropping it stops them.
    let _local = match config.local {
        Some(n) => match LocalCluster::start(n) {
            Ok(local) => {
                config.backends = local.addrs();
                Some(local)
            }
            Err(err) => {
                eprintln!("redlock-proxy: {err}");
                return ExitCode::from(1);
            }
        },
        None => None,
    };
    let listener = match tokio::net::TcpListener::bind((config.bind.as_str(), config.port)).await {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!(
                "redlock-proxy: cannot listen on {}:{}: {err}",
                config.bind, config.port
            );
            return ExitCode::from(1);
        }
    };
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(
        listen = %addr,
        masters = %config.backends.join(","),
        quorum = config.backends.len() / 2 + 1,
        "redlock-proxy listening on {addr} with {} masters",
        config.backends.len()
    );
    redlock_proxy::run(config, listener, shutdown_signal()).await;
    tracing::info!("redlock-proxy stopped");
    ExitCode::SUCCESS
}

//! The `redlock-proxy` binary: flags (docs/PROTOCOL.md §2), logging, `--local` masters,
//! `--check-config`, then [`redlock_proxy::run_with`] until SIGINT/SIGTERM, reloading the
//! configuration on SIGHUP.

use clap::Parser;
use redlock_proxy::{Config, LocalCluster, LogFormat, Reload, Reloader};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter};

/// A Redis-compatible proxy that turns SET NX PX and lock scripts into Redlock majority
/// operations over N independent Redis masters.
#[derive(Debug, Clone, Parser)]
#[command(version, about)]
struct Cli {
    /// Check the configuration file FILE (and the flags given with it), print the verdict and
    /// exit: 0 if it is valid, 1 if not (like `nginx -t`).
    #[arg(long, value_name = "FILE")]
    check_config: Option<PathBuf>,
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
    /// Worker threads; 1 runs everything on one thread, which is fastest when the proxy
    /// shares a small machine with its masters [default: 1].
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Serve /metrics, /healthz and /readyz over HTTP on ADDR:PORT [default: off].
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<String>,
}

impl Cli {
    /// The configuration: the file (`--config`, or `--check-config`'s), the flags on top,
    /// validated. Called again on every reload.
    fn to_config(&self) -> Result<Config, redlock_proxy::ConfigError> {
        let config = match self.check_config.as_ref().or(self.config.as_ref()) {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        self.clone().apply_flags(config)
    }

    fn apply_flags(self, mut config: Config) -> Result<Config, redlock_proxy::ConfigError> {
        if self.metrics.is_some() {
            config.metrics = self.metrics;
        }
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
        config.validate()?;
        Ok(config)
    }
}

/// Starts logging (`RUST_LOG` if set, else the configuration's `log_level`); returns the
/// reload hook that applies a new `log_level`.
fn init_logging(config: &Config) -> redlock_proxy::ReloadHook {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&config.log_level));
    let (filter, handle) = reload::Layer::new(filter);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let registry = tracing_subscriber::registry().with(filter);
    match config.log_format {
        LogFormat::Text => registry
            .with(tracing_subscriber::fmt::layer().with_ansi(ansi))
            .init(),
        LogFormat::Json => registry
            .with(tracing_subscriber::fmt::layer().json())
            .init(),
    }
    Box::new(move |config: &Config| {
        let filter = EnvFilter::try_new(&config.log_level).map_err(|e| e.to_string())?;
        handle.reload(filter).map_err(|e| e.to_string())
    })
}

/// `--check-config`: the verdict on stdout (valid) or stderr (invalid), and the exit code.
fn check_config(cli: &Cli, path: &std::path::Path) -> ExitCode {
    match cli.to_config() {
        Ok(_) => {
            println!(
                "redlock-proxy: configuration file {} test is successful",
                path.display()
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("redlock-proxy: {err}");
            eprintln!(
                "redlock-proxy: configuration file {} test failed",
                path.display()
            );
            ExitCode::from(1)
        }
    }
}

/// Asks for a reload on every SIGHUP.
fn reload_on_sighup() -> tokio::sync::mpsc::Receiver<()> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    #[cfg(unix)]
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot install a SIGHUP handler: no live reload");
            return;
        };
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading the configuration");
            // A reload already pending covers this one.
            let _ = tx.try_send(());
        }
    });
    #[cfg(not(unix))]
    drop(tx);
    rx
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
    let cli = Cli::parse();
    if let Some(path) = &cli.check_config {
        return check_config(&cli, path);
    }
    let config = match cli.to_config() {
        Ok(config) => config,
        Err(err) => {
            eprintln!("redlock-proxy: {err}");
            return ExitCode::from(2);
        }
    };
    let reloader = Arc::new(Reloader::default());
    reloader.on_reload("log_level", init_logging(&config));
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
        Ok(runtime) => runtime.block_on(serve(config, cli, reloader)),
        Err(err) => {
            eprintln!("redlock-proxy: cannot start the runtime: {err}");
            ExitCode::from(1)
        }
    }
}

async fn serve(mut config: Config, cli: Cli, hooks: Arc<Reloader>) -> ExitCode {
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
    let reload = Reload {
        read: Box::new(move || cli.to_config()),
        requests: reload_on_sighup(),
        hooks,
    };
    if let Err(err) =
        redlock_proxy::run_with(config, listener, shutdown_signal(), Some(reload)).await
    {
        eprintln!("redlock-proxy: metrics endpoint cannot listen on {err}");
        return ExitCode::from(1);
    }
    tracing::info!("redlock-proxy stopped");
    ExitCode::SUCCESS
}

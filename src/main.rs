//! The `redlock-proxy` binary: flags (docs/PROTOCOL.md §2), logging, `--local` masters, the
//! listeners, then [`redlock_proxy::run`] until SIGINT/SIGTERM; SIGHUP re-reads the TLS
//! certificate files.

use clap::Parser;

/// mimalloc: per-thread free lists and no consolidation passes; glibc malloc took ~15 % of the
/// proxy's CPU in a profile of the acquire path (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use redlock_proxy::{Backend, ClientCerts, Config, Listeners, LocalCluster, LogFormat};
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
    /// Listen port; 0 picks a free one and prints it (with --tls-port: 0 = TLS only)
    /// [default: 7379].
    #[arg(long)]
    port: Option<u16>,
    /// TLS listen port (0 picks a free one); needs --tls-cert-file and --tls-key-file.
    #[arg(long)]
    tls_port: Option<u16>,
    /// The TLS listener's certificate chain (PEM); re-read on SIGHUP.
    #[arg(long, value_name = "FILE")]
    tls_cert_file: Option<PathBuf>,
    /// The TLS listener's private key (PEM); re-read on SIGHUP.
    #[arg(long, value_name = "FILE")]
    tls_key_file: Option<PathBuf>,
    /// CA of the clients' certificates (PEM); re-read on SIGHUP.
    #[arg(long, value_name = "FILE")]
    tls_ca_cert_file: Option<PathBuf>,
    /// Whether TLS clients must present a certificate signed by the CA [default: yes].
    #[arg(long, value_enum)]
    tls_auth_clients: Option<ClientCerts>,
    /// One independent Redis master: HOST:PORT, redis://[USER:PASSWORD@]HOST:PORT or
    /// rediss://… (TLS); repeat for each master. A password not in the URL comes from
    /// $REDLOCK_PROXY_BACKEND_PASSWORD.
    #[arg(long = "backend", value_name = "ADDRESS")]
    backends: Vec<String>,
    /// CA that signs the certificates of rediss:// masters (PEM).
    #[arg(long, value_name = "FILE")]
    backend_tls_ca_cert_file: Option<PathBuf>,
    /// Certificate the proxy presents to rediss:// masters (mutual TLS; PEM).
    #[arg(long, value_name = "FILE")]
    backend_tls_cert_file: Option<PathBuf>,
    /// Key of --backend-tls-cert-file (PEM).
    #[arg(long, value_name = "FILE")]
    backend_tls_key_file: Option<PathBuf>,
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
            // Parsed here rather than by clap: clap's error would quote a password.
            config.backends = self
                .backends
                .iter()
                .map(|b| b.parse::<Backend>())
                .collect::<Result<_, _>>()
                .map_err(|err| redlock_proxy::ConfigError::Invalid(err.to_string()))?;
        }
        if self.tls_port.is_some() {
            config.tls_port = self.tls_port;
        }
        let files = [
            (self.tls_cert_file, &mut config.tls_cert_file),
            (self.tls_key_file, &mut config.tls_key_file),
            (self.tls_ca_cert_file, &mut config.tls_ca_cert_file),
            (
                self.backend_tls_ca_cert_file,
                &mut config.backend_tls_ca_cert_file,
            ),
            (
                self.backend_tls_cert_file,
                &mut config.backend_tls_cert_file,
            ),
            (self.backend_tls_key_file, &mut config.backend_tls_key_file),
        ];
        for (flag, setting) in files {
            if flag.is_some() {
                *setting = flag;
            }
        }
        if let Some(v) = self.tls_auth_clients {
            config.tls_auth_clients = v;
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
        config.check_files()?;
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

/// Re-reads the TLS certificate files on every SIGHUP (a bad file keeps the old ones; the
/// handle logs why).
async fn reload_on_sighup(acceptor: redlock_proxy::TlsAcceptorHandle) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hangup) = signal(SignalKind::hangup()) else {
            tracing::warn!(
                "cannot install a SIGHUP handler: TLS certificates will not be reloaded"
            );
            return;
        };
        while hangup.recv().await.is_some() {
            let _ = acceptor.reload();
        }
    }
    #[cfg(not(unix))]
    let _ = acceptor;
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
                config.backends = local
                    .masters
                    .iter()
                    .map(|m| Backend::plain("127.0.0.1", m.port))
                    .collect();
                Some(local)
            }
            Err(err) => {
                eprintln!("redlock-proxy: {err}");
                return ExitCode::from(1);
            }
        },
        None => None,
    };
    let listeners = match Listeners::bind(&config).await {
        Ok(listeners) => listeners,
        Err(err) => {
            eprintln!("redlock-proxy: {err}");
            return ExitCode::from(1);
        }
    };
    let shown = |addr: Option<std::net::SocketAddr>| addr.map(|a| a.to_string());
    let (plain, tls) = (shown(listeners.plain_addr()), shown(listeners.tls_addr()));
    // The first address is the one tools read from this line (the plain one, if any).
    let addr = match (&plain, &tls) {
        (Some(plain), Some(tls)) => format!("{plain} (TLS on {tls})"),
        (Some(plain), None) => plain.clone(),
        (None, Some(tls)) => format!("{tls} (TLS only)"),
        (None, None) => String::new(),
    };
    let masters: Vec<String> = config.backends.iter().map(Backend::to_string).collect();
    tracing::info!(
        listen = %addr,
        masters = %masters.join(","),
        quorum = config.backends.len() / 2 + 1,
        "redlock-proxy listening on {addr} with {} masters",
        config.backends.len()
    );
    if let Some(acceptor) = listeners.tls_acceptor() {
        tokio::spawn(reload_on_sighup(acceptor));
    }
    redlock_proxy::run(config, listeners, shutdown_signal()).await;
    tracing::info!("redlock-proxy stopped");
    ExitCode::SUCCESS
}

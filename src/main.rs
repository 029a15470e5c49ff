//! The `redlock-proxy` binary: flags (docs/PROTOCOL.md §2), logging, `--local` masters,
//! `--check-config`, the listeners, then [`redlock_proxy::run_with`] until SIGINT/SIGTERM,
//! reloading the configuration (and the TLS certificate files) on SIGHUP; and `redlock-proxy
//! status`, which prints a running proxy's status view ([`redlock_proxy::Status`]).

use clap::Parser;
use redlock_proxy::{
    Backend, ClientCerts, Config, Listeners, LocalCluster, LogFormat, NoQuorumReply, Reload,
    Reloader,
};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter};

/// mimalloc: per-thread free lists and no consolidation passes; glibc malloc took ~15 % of the
/// proxy's CPU in a profile of the acquire path (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A Redis-compatible proxy that turns SET NX PX and lock scripts into Redlock majority
/// operations over N independent Redis masters.
#[derive(Debug, Clone, Parser)]
#[command(version, about)]
struct Cli {
    /// Check the configuration file FILE (and the flags given with it), print the verdict and
    /// exit: 0 if it is valid, 1 if not (like `nginx -t`).
    #[arg(long, value_name = "FILE")]
    check_config: Option<PathBuf>,
    /// With --check-config: check the file's syntax and values only, without reading the TLS
    /// files it names (a template checked on a machine that does not have them).
    #[arg(long, requires = "check_config")]
    syntax_only: bool,
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
    /// One independent Redis master: HOST:PORT, redis://[USER:PASSWORD@]HOST:PORT, rediss://…
    /// (TLS), sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]/NAME (the primary the
    /// sentinels name for group NAME) or cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…] (a
    /// Redis Cluster found from these seed nodes; clusters://… with TLS); repeat for each
    /// master, an odd number of them. A password not in the URL comes from
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
    /// Clock drift allowance: drift = ceil(TTL × F) + 2 ms [default: 0.01].
    #[arg(long, value_name = "F")]
    drift_factor: Option<f64>,
    /// Longest TTL forwarded (acquires, extends, scripts); a master that lost data is
    /// quarantined this long plus drift. Use the same value on every proxy [default: 60000].
    #[arg(long, value_name = "MS")]
    max_lock_ttl_ms: Option<u64>,
    /// A master's vote counts once WAIT confirms this many replicas have the write; a
    /// failover to a replica that had it is then no loss. Use the number of replicas of each
    /// primary, the same on every proxy; 0 is off [default: 0].
    #[arg(long, value_name = "R")]
    wait_replicas: Option<u32>,
    /// What an acquire answers when fewer than a quorum of masters answer: null (as for a
    /// held lock; lock libraries' wait loops ride it out) or the error `NOQUORUM <n> of <N>
    /// masters usable, quorum <Q>` [default: null].
    #[arg(long, value_enum)]
    no_quorum_reply: Option<NoQuorumReply>,
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
    /// Threads, each serving its share of the clients with its own connections to the
    /// masters (a shard); 1 runs everything on one thread [default: 1].
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Serve /metrics, /healthz, /readyz and the status page (/, /status.json) over HTTP on
    /// ADDR:PORT [default: off].
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Clone, clap::Subcommand)]
enum Command {
    /// Print a running proxy's status (each master's state and why, votes and latency over
    /// the last minute, the deployment, quorum, acquires per second, clients) from its
    /// metrics endpoint's /status.json, then exit: 0 if a quorum of masters may vote, 1 if
    /// not, 2 if the proxy does not answer.
    Status {
        /// The proxy's metrics endpoint (its --metrics).
        #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9379")]
        metrics: String,
    },
}

/// `redlock-proxy status`: the status on stdout, or why there is none on stderr.
fn print_status(metrics: &str) -> ExitCode {
    match redlock_proxy::Status::fetch(metrics) {
        Ok(status) => {
            print!("{}", status.to_text());
            ExitCode::from(u8::from(!status.ready))
        }
        Err(err) => {
            eprintln!("redlock-proxy: {err}");
            ExitCode::from(2)
        }
    }
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
        if let Some(v) = self.wait_replicas {
            config.wait_replicas = v;
        }
        if let Some(v) = self.no_quorum_reply {
            config.no_quorum_reply = v;
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
        if !self.syntax_only {
            config.check_files()?;
        }
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
    // With shards, each logs what it sees of the masters (its own founding among them): the
    // thread's name (`main` for the first shard, `redlock-proxy-shard-<i>`) says which.
    let shards = config.threads > 1;
    match config.log_format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(ansi)
                    .with_thread_names(shards),
            )
            .init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_thread_names(shards),
            )
            .init(),
    }
    Box::new(move |config: &Config| {
        let filter = EnvFilter::try_new(&config.log_level).map_err(|e| e.to_string())?;
        handle.reload(filter).map_err(|e| e.to_string())
    })
}

/// `--check-config`: the verdict on stdout (valid) or stderr (invalid), and the exit code; when
/// only the files it names fail (a template's TLS files), says so and how to check the rest.
fn check_config(cli: &Cli, path: &std::path::Path) -> ExitCode {
    match cli.to_config() {
        Ok(config) => {
            for warning in config.warnings() {
                eprintln!("redlock-proxy: warning: {warning}");
            }
            let what = match cli.syntax_only {
                true => "syntax test (the files it names not read)",
                false => "test",
            };
            println!(
                "redlock-proxy: configuration file {} {what} is successful",
                path.display()
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("redlock-proxy: {err}");
            let syntax = Cli {
                syntax_only: true,
                ..cli.clone()
            };
            if !cli.syntax_only && syntax.to_config().is_ok() {
                eprintln!(
                    "redlock-proxy: its syntax and values are valid, only the files it names are not: --check-config FILE --syntax-only checks a template without them"
                );
            }
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

/// Installs the SIGINT and SIGTERM handlers now (before anything that takes time, such as
/// starting local masters: a signal then ends the proxy cleanly, never by its default
/// action); the future resolves at the first of them. Needs the runtime entered.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        Ok(async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

fn main() -> ExitCode {
    // The runtime and the signal handlers come first: a SIGTERM at any later moment of the
    // start-up (local masters starting, listeners binding) ends the proxy cleanly.
    // The proxy's first shard runs here; `threads` > 1 starts the others on threads of their
    // own, each with a single-threaded runtime (`server`).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("redlock-proxy: cannot start the runtime: {err}");
            return ExitCode::from(1);
        }
    };
    let installed = {
        let _entered = runtime.enter();
        shutdown_signal()
    };
    let shutdown = match installed {
        Ok(shutdown) => shutdown,
        Err(err) => {
            eprintln!("redlock-proxy: cannot install the SIGINT/SIGTERM handlers: {err}");
            return ExitCode::from(1);
        }
    };
    let cli = Cli::parse();
    if let Some(Command::Status { metrics }) = &cli.command {
        return print_status(metrics);
    }
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
    runtime.block_on(serve(config, cli, reloader, shutdown))
}

async fn serve(
    mut config: Config,
    cli: Cli,
    hooks: Arc<Reloader>,
    shutdown: impl std::future::Future<Output = ()>,
) -> ExitCode {
    let mut shutdown = std::pin::pin!(shutdown);
    // Local masters live as long as this binding: dropping it stops them. They are started
    // from this (the main) thread, which lives as long as the process: tied to it by the
    // kernel, they also die if the proxy is killed with SIGKILL.
    let _local = match config.local {
        Some(n) => match LocalCluster::start_tied(n) {
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
    // A signal during the start of the local masters ends the proxy here, cleanly.
    if futures::poll!(shutdown.as_mut()).is_ready() {
        tracing::info!("redlock-proxy stopped during start-up");
        return ExitCode::SUCCESS;
    }
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
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    let masters: Vec<String> = config.backends.iter().map(Backend::to_string).collect();
    tracing::info!(
        listen = %addr,
        masters = %masters.join(","),
        quorum = config.backends.len() / 2 + 1,
        "redlock-proxy listening on {addr} with {} master{}",
        config.backends.len(),
        if config.backends.len() == 1 { "" } else { "s" }
    );
    if let Some(acceptor) = listeners.tls_acceptor() {
        // The certificate files are re-read from the paths the proxy started with (a bad
        // file keeps the certificate in use; the handle logs why).
        hooks.on_reload(
            "tls certificates",
            Box::new(move |_| acceptor.reload().map_err(|err| err.to_string())),
        );
    }
    let reload = Reload {
        read: Box::new(move || cli.to_config()),
        requests: reload_on_sighup(),
        hooks,
    };
    if let Err(err) = redlock_proxy::run_with(config, listeners, shutdown, Some(reload)).await {
        eprintln!("redlock-proxy: metrics endpoint cannot listen on {err}");
        return ExitCode::from(1);
    }
    tracing::info!("redlock-proxy stopped");
    ExitCode::SUCCESS
}

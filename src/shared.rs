//! The state every connection shares ([`Shared`]): the configuration (as started, and the
//! settings a reload may change), the shards (each thread's voting masters and acquire service:
//! [`Shard`]), the script cache, the client counters and registry. Depends only on the layers
//! below it (config, masters, lock, script cache, stats), never on commands or connections.

use crate::auth::Users;
use crate::client_registry::Clients;
use crate::config::Config;
use crate::health;
use crate::lock::{self, AcquireResult, Acquirer, LockStats};
use crate::masters::{self, Masters};
use crate::pubsub::Hub;
use crate::redlock::Policy;
use crate::script_cache::ScriptCache;
use crate::stats::ServerStats;
use crate::transport::Connect;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock, Weak};
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// One thread's share of the proxy (`threads`): its own connection to every master, their
/// health monitors, and its own acquire service, all on that thread's runtime. A client is
/// served from start to end by one shard, so a request and its masters' replies never cross
/// threads: throughput grows with threads the way it grows with proxies, with nothing locked or
/// handed over per request. Shards are independent voters like separate proxies, which the
/// safety argument already covers (markers and quarantine live on the masters, each shard's
/// token proposals carry their own instance name); their vote and acquire counters are common.
pub struct Shard {
    pub masters: Arc<Masters>,
    pub acquirer: Arc<Acquirer>,
}

/// State shared by every connection.
pub struct Shared {
    /// The configuration the proxy started with (what only a restart changes is read here).
    pub config: Config,
    /// The configuration as last reloaded: limits read when a connection starts.
    live: RwLock<Arc<Config>>,
    /// One permit per client connection (`maxclients`, resized by a reload).
    pub client_slots: Arc<Semaphore>,
    pub policy: Policy,
    /// At least one; the first runs on the runtime that started the proxy.
    pub shards: Vec<Shard>,
    pub scripts: ScriptCache,
    pub started: Instant,
    /// Connections being served now.
    pub clients: AtomicUsize,
    next_client_id: AtomicU64,
    /// The users (replaced whole by a reload) and how many times they were replaced: a
    /// session compares that generation (one atomic load per command) and re-reads its user
    /// only when it moved.
    users: RwLock<Arc<Users>>,
    users_generation: AtomicU64,
    /// Connection and command counters (`INFO stats`, metrics).
    pub stats: Arc<ServerStats>,
    /// The connected clients (`CLIENT LIST`, `CLIENT KILL`).
    pub registry: Arc<Clients>,
    /// Where the metrics endpoint listens, once it does (`INFO server`).
    pub metrics_addr: OnceLock<std::net::SocketAddr>,
    /// Pub/sub: every client's subscriptions, one subscriber link per master for them all.
    pub pubsub: Arc<Hub>,
}

impl Shared {
    /// Connects to the masters of `config` and starts watching them, once on this runtime and
    /// once on each of `more_shards`; counts commands for a command table of `commands` rows.
    pub fn start(config: Config, commands: usize, more_shards: &[Handle]) -> Arc<Shared> {
        let policy = Policy {
            drift_factor: config.drift_factor,
            max_lock_ttl_ms: config.max_lock_ttl_ms,
        };
        let masters = Masters::connect(
            &config,
            health::MonitorConfig {
                interval: crate::live::LiveDuration::new(Duration::from_millis(
                    config.health_interval_ms,
                )),
                quarantine: config.quarantine,
                lease_bound: policy.lease_bound(),
                preload: Acquirer::preload(),
                wait_replicas: config.wait_replicas,
                drift_factor: config.drift_factor,
                allow_debug_command: config.allow_debug_command,
                clock_per_call: config.clock_per_call,
            },
        );
        let acquire_stats: Arc<LockStats> = Arc::default();
        let shard = |masters: Arc<Masters>| Shard {
            acquirer: Acquirer::new(
                masters.clone(),
                policy,
                lock::Options {
                    token_clock: config.token_clock,
                    witness_floor: config.witness_floor,
                    no_quorum_reply: config.no_quorum_reply,
                },
                acquire_stats.clone(),
            ),
            masters,
        };
        let mut shards = vec![shard(masters)];
        for runtime in more_shards {
            // Links and monitors are spawned on the runtime entered here.
            let _entered = runtime.enter();
            shards.push(shard(Masters::connect_like(&config, &shards[0].masters)));
        }
        let users = config.users().unwrap_or_else(|err| {
            // `Config::validate` refuses such a configuration; a caller that skipped it gets a
            // proxy nobody can authenticate to, never one open to all.
            tracing::error!(error = %err, "invalid users: every client is refused");
            Users::nobody()
        });
        let stats = Arc::new(ServerStats::new(commands));
        ServerStats::spawn_sampler(Arc::downgrade(&stats));
        spawn_quorum_watch(
            Arc::downgrade(&shards[0].masters),
            acquire_stats.clone(),
            Duration::from_millis(config.health_interval_ms),
        );
        let connects = masters::dials(&config)
            .into_iter()
            .map(|dial| Box::new(dial) as Box<dyn Connect>)
            .collect();
        let pubsub = Hub::start(connects, shards[0].masters.live_node_timeout().clone());
        Arc::new(Shared {
            pubsub,
            live: RwLock::new(Arc::new(config.clone())),
            client_slots: Arc::new(Semaphore::new(config.maxclients)),
            stats,
            registry: Arc::default(),
            metrics_addr: OnceLock::new(),
            shards,
            policy,
            config,
            scripts: ScriptCache::default(),
            started: Instant::now(),
            clients: AtomicUsize::new(0),
            next_client_id: AtomicU64::new(0),
            users: RwLock::new(Arc::new(users)),
            users_generation: AtomicU64::new(0),
        })
    }

    /// The first shard's masters: what `INFO`, the metrics and `/readyz` report (every shard
    /// connects to the same masters; the vote counters are common to all).
    pub fn masters(&self) -> &Arc<Masters> {
        &self.shards[0].masters
    }

    /// Counts of every shard's acquires.
    pub fn acquire_stats(&self) -> &Arc<LockStats> {
        &self.shards[0].acquirer.stats
    }

    /// Stops every shard's connections and monitors.
    pub fn stop_masters(&self) {
        for shard in &self.shards {
            shard.masters.stop();
        }
        self.pubsub.stop();
    }

    /// The users now, and their generation.
    pub fn users(&self) -> (Arc<Users>, u64) {
        let users = self.users.read().unwrap_or_else(|p| p.into_inner());
        (users.clone(), self.users_generation.load(Ordering::Acquire))
    }

    /// The generation of the users (see [`Shared::users`]).
    pub fn users_generation(&self) -> u64 {
        self.users_generation.load(Ordering::Acquire)
    }

    /// Replaces the users (a reload): sessions pick the change up at their next command.
    pub fn replace_users(&self, users: Users) {
        let mut current = self.users.write().unwrap_or_else(|p| p.into_inner());
        *current = Arc::new(users);
        self.users_generation.fetch_add(1, Ordering::Release);
    }

    /// The configuration as last reloaded.
    pub fn live_config(&self) -> Arc<Config> {
        match self.live.read() {
            Ok(live) => live.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Makes `config` the configuration new connections read.
    pub fn set_live_config(&self, config: Config) {
        let config = Arc::new(config);
        match self.live.write() {
            Ok(mut live) => *live = config,
            Err(poisoned) => *poisoned.into_inner() = config,
        }
    }

    /// A new client id (`CLIENT ID`), from 1.
    pub fn next_client_id(&self) -> u64 {
        self.next_client_id.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// Tells the quorum log ([`LockStats::note_quorum`]) that acquires may be granted again as soon
/// as a quorum of masters may vote (looked at `every` health interval), so that "acquires
/// resume" is logged when the quorum comes back, not at the next acquire, which may come much
/// later. A look that finds a quorum counts as a decision that found one; ends with the
/// masters.
fn spawn_quorum_watch(masters: Weak<Masters>, stats: Arc<LockStats>, every: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(masters) = masters.upgrade() else {
                return;
            };
            if masters.usable() >= masters.quorum() {
                stats.note_quorum(AcquireResult::Granted, || masters.usable_summary());
            }
        }
    });
}

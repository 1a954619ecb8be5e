//! The one handle to process-wide state that every step of the query path receives: the live
//! configuration, the userlist, the pools, the cancel registry, TLS settings, counters and the
//! shutdown signals. There are no globals; tests run several instances in one process.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::Userlist;
use crate::cancel::CancelRegistry;
use crate::config::Config;
use crate::metrics::Histogram;
use crate::pool::Pools;
use crate::registry::ClientRegistry;
use crate::stats::Stats;
use crate::tls::{ClientTls, UpstreamTls};

/// Reads the configuration again from where it came from (file, environment, flags), for
/// `RELOAD` in the admin console; the binary installs one, tests may.
pub type Reloader = std::sync::Arc<dyn Fn() -> Result<Config, String> + Send + Sync>;

/// Switches the process's log filter to a configuration's `log_level`; the binary installs
/// one (the filter is the binary's), run only once a reloaded configuration was accepted.
pub type LogApplier = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

/// Process-wide state shared by all sessions.
pub struct Shared {
    config: ArcSwap<Config>,
    /// Bumped after each reload, so a session notices one with a plain load instead of an
    /// `ArcSwap` guard per request.
    config_generation: AtomicU64,
    userlist: ArcSwap<Userlist>,
    client_tls: ArcSwap<Option<ClientTls>>,
    /// TLS client configuration for upstream connections (fixed at start: the upstream URL is).
    pub upstream_tls: Option<UpstreamTls>,
    /// Server connection pools per (database, user).
    pub pools: Pools,
    /// Maps the cancel keys pgmemo hands out to the server sessions they stand for.
    pub cancels: CancelRegistry,
    /// Counters for the admin console and metrics.
    pub stats: Stats,
    /// The query-result cache.
    pub cache: crate::cache::Cache,
    /// Upstream time of cache misses, for the metrics endpoint's latency histogram: totals
    /// alone hide the slow tail that caching is meant to cut.
    pub upstream_time: Histogram,
    /// The replication feeds (one per database) and their status, for `SHOW REPLICATION`.
    pub feeds: crate::invalidate::Feeds,
    /// Clients logged in now, for `SHOW CLIENTS`.
    pub clients: ClientRegistry,
    reloader: std::sync::Mutex<Option<Reloader>>,
    log_applier: std::sync::Mutex<Option<LogApplier>>,
    /// Every client task, so shutdown can wait for them.
    pub sessions: TaskTracker,
    /// Cancelled when pgmemo stops accepting: idle sessions close, busy ones finish.
    pub stop_accepting: CancellationToken,
    /// Cancelled when the shutdown grace period is over: every session closes now.
    pub terminate_sessions: CancellationToken,
    client_slots: AtomicUsize,
    /// A random secret of this process that salts the SCRAM exchanges of userlist logins
    /// (see `ScramSecret::mock`): without it nobody can tell an unknown user's salt from a
    /// known one's.
    pub auth_seed: [u8; 32],
}

impl Shared {
    /// Builds the state for a validated configuration; fails on unreadable TLS or auth files.
    pub fn new(config: Config) -> Result<Arc<Shared>, String> {
        let mut auth_seed = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut auth_seed);
        let userlist = Userlist::load_for(&config, &auth_seed)?;
        let client_tls = ClientTls::from_config(&config)?;
        let upstream_tls = UpstreamTls::from_url(&config.upstream)?;
        let cache = crate::cache::Cache::new(config.cache_size.0 as u64);
        Ok(Arc::new(Shared {
            auth_seed,
            config: ArcSwap::from_pointee(config),
            config_generation: AtomicU64::new(0),
            userlist: ArcSwap::from_pointee(userlist),
            client_tls: ArcSwap::from_pointee(client_tls),
            upstream_tls,
            pools: Pools::default(),
            cancels: CancelRegistry::default(),
            stats: Stats::default(),
            cache,
            upstream_time: Histogram::default(),
            feeds: crate::invalidate::Feeds::default(),
            clients: ClientRegistry::default(),
            reloader: std::sync::Mutex::new(None),
            log_applier: std::sync::Mutex::new(None),
            sessions: TaskTracker::new(),
            stop_accepting: CancellationToken::new(),
            terminate_sessions: CancellationToken::new(),
            client_slots: AtomicUsize::new(0),
        }))
    }

    /// The configuration now in force (cheap: an atomic load).
    pub fn config(&self) -> arc_swap::Guard<Arc<Config>> {
        self.config.load()
    }

    /// Changes whenever the configuration is reloaded: read it before `config()`, and a later
    /// equal reading means that configuration is still the one in force.
    pub fn config_generation(&self) -> u64 {
        self.config_generation.load(Ordering::Acquire)
    }

    /// The userlist now in force.
    pub fn userlist(&self) -> Arc<Userlist> {
        self.userlist.load_full()
    }

    /// The TLS acceptor for clients, if a certificate is configured.
    pub fn client_tls(&self) -> Arc<Option<ClientTls>> {
        self.client_tls.load_full()
    }

    /// Applies a reloaded configuration. Settings that need a restart keep their old value and
    /// are named in a warning.
    pub fn reload(&self, mut new: Config) -> Result<(), String> {
        let old = self.config.load_full();
        let mut kept = Vec::new();
        // The listeners, the pool mode and the feed are set up, the store sized and the
        // runtime built once, at start.
        macro_rules! keep {
            ($($field:ident),*) => {$(
                if new.$field != old.$field {
                    kept.push(stringify!($field));
                    new.$field = Clone::clone(&old.$field);
                }
            )*};
        }
        keep!(
            listen,
            unix_socket_dir,
            upstream,
            pool_mode,
            metrics_listen,
            invalidation,
            replication_publication,
            shutdown_timeout,
            cache_size,
            worker_threads
        );
        let userlist = Userlist::load_for(&new, &self.auth_seed)?;
        let client_tls = ClientTls::from_config(&new)?;
        if !kept.is_empty() {
            tracing::warn!(settings = ?kept, "these settings need a restart; keeping the running values");
        }
        // Which tables may be cached is decided when a statement is planned, and plans are
        // memoized: new lists need new plans, and results stored under the old ones go.
        let lists_changed = new.cache_include_tables != old.cache_include_tables
            || new.cache_exclude_tables != old.cache_exclude_tables;
        // A TTL is fixed on an entry when it is stored: entries stored under the old TTLs go,
        // so that a TTL set (or shortened) to bound staleness binds every result from now on.
        let ttls_changed =
            new.cache_ttl != old.cache_ttl || new.cache_table_ttl != old.cache_table_ttl;
        let log_level = new.log_level.clone();
        self.userlist.store(Arc::new(userlist));
        self.client_tls.store(Arc::new(client_tls));
        self.config.store(Arc::new(new));
        self.config_generation.fetch_add(1, Ordering::Release);
        if lists_changed {
            self.cache.purge_all();
            tracing::info!("cache_include_tables or cache_exclude_tables changed: cache emptied");
        } else if ttls_changed {
            self.cache.purge_all();
            tracing::info!("cache_ttl or cache_table_ttl changed: cache emptied");
        }
        let applier = self
            .log_applier
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(apply) = applier {
            apply(&log_level);
        }
        tracing::info!("configuration reloaded");
        Ok(())
    }

    /// Installs what applies `log_level` after a reload was accepted (a refused one changes
    /// nothing, the log filter included).
    pub fn set_log_applier(&self, applier: LogApplier) {
        *self.log_applier.lock().unwrap_or_else(|e| e.into_inner()) = Some(applier);
    }

    /// Installs the function `RELOAD` uses to read the configuration again.
    pub fn set_reloader(&self, reloader: Reloader) {
        *self.reloader.lock().unwrap_or_else(|e| e.into_inner()) = Some(reloader);
    }

    /// `RELOAD`: reads the configuration again and applies it, as SIGHUP does.
    pub fn reload_from_source(&self) -> Result<(), String> {
        let reloader = self
            .reloader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or("this pgmemo has no configuration source to reload from")?;
        self.reload(reloader()?)
    }

    /// Counts a new client against `max_client_conn`; `None` means the limit is reached.
    pub fn admit_client(self: &Arc<Self>) -> Option<ClientSlot> {
        let max = self.config().max_client_conn;
        let prev = self.client_slots.fetch_add(1, Ordering::AcqRel);
        if prev >= max {
            self.client_slots.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(ClientSlot {
            shared: self.clone(),
        })
    }

    /// Clients connected now.
    pub fn client_count(&self) -> usize {
        self.client_slots.load(Ordering::Acquire)
    }
}

/// One admitted client; releases its place on drop.
pub struct ClientSlot {
    shared: Arc<Shared>,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.shared.client_slots.fetch_sub(1, Ordering::AcqRel);
    }
}

//! The `pgmemo` binary: before the query path starts. It parses the command line, loads the
//! configuration (`pgmemo::config`), sets up logging, starts the proxy (`pgmemo::server`) and
//! turns Unix signals into reloads (SIGHUP) and a graceful shutdown (SIGTERM, SIGINT).

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use pgmemo::config::{self, ConfigSources, UpstreamUrl};
use pgmemo::{Pgmemo, PgmemoHandle};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// Every cache miss allocates its entry (key, response, bookkeeping) and keeps it; glibc's
/// allocator took its slow path for most of those allocations while the cache grows. mimalloc
/// serves them from per-size free lists.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// When set, this log filter wins over `log_level` (also across reloads), like `RUST_LOG`.
const LOG_ENV: &str = "PGMEMO_LOG";

/// Exit status when pgmemo cannot start.
const EXIT_STARTUP: u8 = 2;

/// Command-line flags. Each flag given overrides the same key from the file and from
/// `PGMEMO_<KEY>` variables; see docs/configuration.md for every setting.
#[derive(Debug, Parser)]
#[command(
    name = "pgmemo",
    version,
    about = "PostgreSQL connection pooler and query cache"
)]
struct Cli {
    /// TOML configuration file.
    #[arg(long, env = "PGMEMO_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address clients connect to [default: 127.0.0.1:6432].
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Also listen on a Unix-domain socket in this directory [default: off].
    #[arg(long, value_name = "DIR")]
    unix_socket_dir: Option<PathBuf>,
    /// PostgreSQL server, postgres://[USER[:PASSWORD]@]HOST[:PORT][/DB][?sslmode=..]
    /// [default: postgres://127.0.0.1:5432].
    #[arg(long, value_name = "URL", value_parser = parse_upstream)]
    upstream: Option<String>,
    /// How server connections are shared [default: session].
    #[arg(long, value_name = "MODE", value_parser = ["session", "transaction"])]
    pool_mode: Option<String>,
    /// Server connections per (database, user) [default: 20].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pool_size: Option<u32>,
    /// Transaction pooling: texts each server connection keeps prepared for clients that send
    /// them as the unnamed statement, 0 = off [default: 0].
    #[arg(long, value_name = "N")]
    max_promoted_statements: Option<u32>,
    /// How clients authenticate [default: upstream].
    #[arg(long, value_name = "TYPE", value_parser = ["upstream", "trust", "md5", "scram-sha-256"])]
    auth_type: Option<String>,
    /// Userlist file (`"user" "secret"` per line).
    #[arg(long, value_name = "FILE")]
    auth_file: Option<PathBuf>,
    /// Threads serving clients, 0 = one per CPU core [default: 0].
    #[arg(long, value_name = "N")]
    worker_threads: Option<u32>,
    /// Log filter such as `info` or `pgmemo=debug` [default: info].
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics [default: off].
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Serve repeated reads from memory [default: on].
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    cache: Option<String>,
    /// How writes made elsewhere are seen: replication stream, proxy only, or TTL
    /// [default: auto].
    #[arg(long, value_name = "MODE", value_parser = ["auto", "replication", "proxy", "ttl"])]
    invalidation: Option<String>,
    /// Validate the configuration, print it as TOML (passwords masked) and exit: 0 if valid,
    /// 1 if not.
    #[arg(long)]
    check: bool,
}

impl Cli {
    /// The flags that were given, as configuration keys (the highest-precedence source).
    fn overrides(&self) -> toml::Table {
        let mut t = toml::Table::new();
        let mut set = |key: &str, value: Option<toml::Value>| {
            if let Some(v) = value {
                t.insert(key.to_owned(), v);
            }
        };
        set("listen", self.listen.map(|a| a.to_string().into()));
        set("upstream", self.upstream.clone().map(Into::into));
        set(
            "unix_socket_dir",
            self.unix_socket_dir
                .as_ref()
                .map(|p| p.to_string_lossy().into_owned().into()),
        );
        set(
            "metrics_listen",
            self.metrics_listen.map(|a| a.to_string().into()),
        );
        set("pool_mode", self.pool_mode.clone().map(Into::into));
        set("pool_size", self.pool_size.map(|n| i64::from(n).into()));
        set(
            "max_promoted_statements",
            self.max_promoted_statements.map(|n| i64::from(n).into()),
        );
        set("auth_type", self.auth_type.clone().map(Into::into));
        set(
            "auth_file",
            self.auth_file
                .as_ref()
                .map(|p| p.to_string_lossy().into_owned().into()),
        );
        set("log_level", self.log_level.clone().map(Into::into));
        set("cache", self.cache.clone().map(Into::into));
        set("invalidation", self.invalidation.clone().map(Into::into));
        set(
            "worker_threads",
            self.worker_threads.map(|n| i64::from(n).into()),
        );
        t
    }
}

/// Rejects a malformed `--upstream` at the command line, with clap's usage message.
fn parse_upstream(s: &str) -> Result<String, String> {
    UpstreamUrl::parse(s).map(|_| s.to_owned())
}

/// Swaps the log filter on SIGHUP.
type LogHandle = reload::Handle<EnvFilter, Registry>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let sources = ConfigSources::from_process(cli.config.clone(), cli.overrides());
    if cli.check {
        return check(&sources);
    }
    let started = config::load(&sources)
        .map_err(flat)
        .and_then(|config| Ok((runtime(config.worker_threads)?, config)))
        .and_then(|(rt, config)| rt.block_on(run(sources, config)));
    match started {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pgmemo: {e:#}");
            ExitCode::from(EXIT_STARTUP)
        }
    }
}

/// The tokio runtime: `worker_threads` threads (one per core when 0). Every client is a task;
/// fewer threads than cores cost less CPU per message when pgmemo shares the machine with its
/// clients or the server, more scale further.
fn runtime(worker_threads: usize) -> Result<tokio::runtime::Runtime> {
    // One thread: tokio's single-threaded scheduler, which skips the work-stealing machinery
    // (cheaper per wake-up); more: the multi-threaded one.
    let mut builder = if worker_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if worker_threads > 0 {
            b.worker_threads(worker_threads);
        }
        b.thread_name("pgmemo-worker");
        b
    };
    builder
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

/// `--check`: load and validate, print the result.
fn check(sources: &ConfigSources) -> ExitCode {
    match config::load(sources) {
        Ok(config) => {
            print!("{}", config.to_toml_redacted());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pgmemo: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Starts pgmemo and serves until a shutdown signal. Errors before serving are startup errors.
async fn run(sources: ConfigSources, config: pgmemo::Config) -> Result<()> {
    let log = init_logging(&config.log_level)?;
    let mut hup = listen_for(SignalKind::hangup())?;
    let mut term = listen_for(SignalKind::terminate())?;
    let mut int = listen_for(SignalKind::interrupt())?;
    let handle = Pgmemo::start(config).await.map_err(flat)?;
    handle.set_reloader(admin_reloader(sources.clone()));
    let filter = log.clone();
    handle.set_log_applier(std::sync::Arc::new(move |level: &str| {
        apply_log_level(level, &filter)
    }));
    let stop = handle.stop_token();
    loop {
        tokio::select! {
            _ = hup.recv() => reload(&sources, &handle),
            _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); break; }
            _ = int.recv() => { tracing::info!("SIGINT: shutting down"); break; }
            _ = stop.cancelled() => { tracing::info!("shutdown requested"); break; }
        }
    }
    tokio::select! {
        _ = handle.shutdown() => Ok(()),
        _ = term.recv() => force_exit(),
        _ = int.recv() => force_exit(),
    }
}

/// Our error enums already include their cause in their message; keep `{:#}` from repeating it.
fn flat(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// A second SIGTERM/SIGINT during a graceful shutdown: stop waiting for sessions.
fn force_exit() -> ! {
    tracing::warn!("second signal during shutdown: exiting now");
    std::process::exit(1)
}

fn listen_for(kind: SignalKind) -> Result<Signal> {
    signal(kind)
        .with_context(|| format!("cannot install handler for signal {}", kind.as_raw_value()))
}

/// SIGHUP: load the same sources again; a bad configuration is logged and the running one kept
/// (the log filter too: it follows only an accepted configuration).
fn reload(sources: &ConfigSources, handle: &PgmemoHandle) {
    tracing::info!("SIGHUP: reloading configuration");
    let result = config::load(sources)
        .map_err(|e| e.to_string())
        .and_then(|new| handle.reload(new));
    if let Err(e) = result {
        tracing::error!("keeping the running configuration: {e}");
    }
}

/// What the admin console's `RELOAD` runs: the same sources as SIGHUP.
fn admin_reloader(sources: ConfigSources) -> pgmemo::shared::Reloader {
    std::sync::Arc::new(move || {
        tracing::info!("RELOAD from the admin console");
        config::load(&sources).map_err(|e| e.to_string())
    })
}

/// Switches the log filter to `log_level`, unless `PGMEMO_LOG` pins it.
fn apply_log_level(level: &str, log: &LogHandle) {
    if log_env().is_none() {
        match EnvFilter::try_new(level) {
            Ok(filter) => {
                if let Err(e) = log.reload(filter) {
                    tracing::error!("cannot change the log filter: {e}");
                }
            }
            Err(e) => tracing::error!("log_level {level:?}: {e}"),
        }
    }
}

/// The `PGMEMO_LOG` filter, if set and non-empty.
fn log_env() -> Option<String> {
    std::env::var(LOG_ENV).ok().filter(|s| !s.trim().is_empty())
}

/// Installs the global subscriber with a filter that SIGHUP can replace.
fn init_logging(log_level: &str) -> Result<LogHandle> {
    let filter = match log_env() {
        Some(spec) => {
            EnvFilter::try_new(&spec).with_context(|| format!("invalid {LOG_ENV}={spec:?}"))?
        }
        None => EnvFilter::try_new(log_level)
            .with_context(|| format!("invalid log_level {log_level:?}"))?,
    };
    let (filter, handle) = reload::Layer::new(filter);
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .try_init()
        .context("cannot initialise logging")?;
    Ok(handle)
}

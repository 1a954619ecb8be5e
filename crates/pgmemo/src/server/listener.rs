//! The listening sockets (clients, and metrics when `metrics_listen` is set), the accept loop
//! and the handle the binary and the tests hold.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::shared::Shared;

/// Why pgmemo could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot listen for metrics on {addr}: {source}")]
    MetricsListen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// Entry point: starts a pgmemo instance in the current tokio runtime.
pub struct Pgmemo;

/// A running pgmemo instance. Tests run several in one process; the binary runs one.
pub struct PgmemoHandle {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    accept_task: tokio::task::JoinHandle<()>,
    /// The metrics endpoint's bound address and server task, when `metrics_listen` is set.
    metrics: Option<(SocketAddr, tokio::task::JoinHandle<()>)>,
}

impl Pgmemo {
    /// Binds the listeners and starts accepting clients (and scrapers, with
    /// `metrics_listen`). Both addresses may use port 0; the bound ones are
    /// [`PgmemoHandle::local_addr`] and [`PgmemoHandle::metrics_addr`].
    pub async fn start(config: Config) -> Result<PgmemoHandle, StartError> {
        let shared = Shared::new(config).map_err(StartError::Config)?;
        let addr = shared.config().listen;
        let (listener, local_addr) = bind(addr)
            .await
            .map_err(|source| StartError::Listen { addr, source })?;
        let metrics_listener = match shared.config().metrics_listen {
            Some(addr) => Some(
                bind(addr)
                    .await
                    .map_err(|source| StartError::MetricsListen { addr, source })?,
            ),
            None => None,
        };
        tracing::info!(%local_addr, upstream = %shared.config().upstream.redacted(), "pgmemo listening");
        let accept_task = tokio::spawn(accept_loop(listener, shared.clone()));
        let metrics = metrics_listener.map(|(listener, addr)| {
            tracing::info!(%addr, "metrics at http://{addr}/metrics");
            let task = tokio::spawn(crate::metrics::serve(listener, shared.clone()));
            (addr, task)
        });
        tokio::spawn(janitor(shared.clone()));
        crate::invalidate::start(&shared);
        Ok(PgmemoHandle {
            local_addr,
            shared,
            accept_task,
            metrics,
        })
    }
}

/// A listener on `addr` and the address it got (the real port when `addr` asks for port 0).
async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let local_addr = listener.local_addr()?;
    Ok((listener, local_addr))
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let stop = shared.stop_accepting.clone();
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((socket, peer)) => {
                let shared = shared.clone();
                shared
                    .sessions
                    .spawn(crate::client::run(socket, peer, shared.clone()));
            }
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// Closes idle server connections past `server_idle_timeout` / `server_lifetime` or whose
/// server went away, once a second, until shutdown.
async fn janitor(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shared.stop_accepting.cancelled() => return,
            _ = tick.tick() => {}
        }
        let settings = crate::client::pool_settings(&shared.config());
        shared.pools.close_expired(&settings).await;
    }
}

impl PgmemoHandle {
    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Where the Prometheus endpoint listens, if `metrics_listen` is set.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|(addr, _)| *addr)
    }

    /// The shared state, for tests and the admin console.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Installs what the admin console's `RELOAD` runs to read the configuration again.
    pub fn set_reloader(&self, reloader: crate::shared::Reloader) {
        self.shared.set_reloader(reloader);
    }

    /// Applies a new configuration; settings marked "restart" in docs/configuration.md keep
    /// their old values (a warning names each one that differs).
    pub fn reload(&self, config: Config) -> Result<(), String> {
        self.shared.reload(config)
    }

    /// Graceful shutdown: stop accepting, close sessions that are between transactions, give
    /// the others `shutdown_timeout` to finish, then close everything.
    pub async fn shutdown(self) {
        let shared = self.shared;
        shared.stop_accepting.cancel();
        let _ = self.accept_task.await;
        if let Some((_, metrics_task)) = self.metrics {
            let _ = metrics_task.await;
        }
        shared.sessions.close();
        let timeout = shared.config().shutdown_timeout.0;
        if tokio::time::timeout(timeout, shared.sessions.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                remaining = shared.sessions.len(),
                "shutdown timeout: closing remaining sessions"
            );
            shared.terminate_sessions.cancel();
            shared.sessions.wait().await;
        }
        shared.feeds.stopped().await;
        shared.pools.close_all().await;
        tracing::info!("pgmemo stopped");
    }

    /// Resolves when shutdown was requested from elsewhere (never, unless `shutdown` runs).
    pub fn stop_token(&self) -> CancellationToken {
        self.shared.stop_accepting.clone()
    }
}

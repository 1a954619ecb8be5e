//! The listening sockets (clients over TCP and, with `unix_socket_dir`, a Unix-domain socket;
//! metrics when `metrics_listen` is set), the accept loop and the handle the binary and the
//! tests hold.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::net::{FastSocket, Peer};
use crate::shared::Shared;

/// How long sessions told to end at the shutdown timeout get to close before shutdown
/// stops waiting for them.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Why pgmemo could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot listen on Unix-domain socket {}: {source}", path.display())]
    UnixListen {
        path: PathBuf,
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
    /// The Unix-domain socket's path, with `unix_socket_dir`; removed at shutdown.
    unix_socket: Option<PathBuf>,
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
        let unix = match shared.config().unix_socket_dir.clone() {
            Some(dir) => {
                let path = crate::net::unix_socket_path(&dir, local_addr.port());
                let listener = bind_unix(&path).map_err(|source| StartError::UnixListen {
                    path: path.clone(),
                    source,
                })?;
                tracing::info!(path = %path.display(), "pgmemo listening on a Unix-domain socket");
                Some((listener, path))
            }
            None => None,
        };
        let (unix_listener, unix_socket) = match unix {
            Some((l, p)) => (Some(l), Some(p)),
            None => (None, None),
        };
        let metrics_listener = match shared.config().metrics_listen {
            Some(addr) => Some(
                bind(addr)
                    .await
                    .map_err(|source| StartError::MetricsListen { addr, source })?,
            ),
            None => None,
        };
        tracing::info!(%local_addr, upstream = %shared.config().upstream.redacted(), "pgmemo listening");
        // Before the first client: the feed decides whether databases start with their gate
        // down, which must hold for the first one used too.
        crate::invalidate::start(&shared);
        let accept_task = tokio::spawn(accept_loop(listener, unix_listener, shared.clone()));
        let metrics = metrics_listener.map(|(listener, addr)| {
            tracing::info!(%addr, "metrics at http://{addr}/metrics");
            let task = tokio::spawn(crate::metrics::serve(listener, shared.clone()));
            (addr, task)
        });
        tokio::spawn(janitor(shared.clone()));
        Ok(PgmemoHandle {
            local_addr,
            unix_socket,
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

/// A Unix-domain socket listening at `path`, open to every local user like PostgreSQL's
/// (mode 0777: who may log in is for authentication to decide). A socket file left by a
/// process that is gone is replaced; one that still answers is not.
fn bind_unix(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way",
            ));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "another server is listening on it",
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777))?;
    Ok(listener)
}

/// The next client of the Unix-domain socket, or never when there is none.
async fn accept_unix(listener: Option<&UnixListener>) -> std::io::Result<(FastSocket, Peer)> {
    match listener {
        Some(l) => {
            let (socket, _) = l.accept().await?;
            Ok((FastSocket::from_tokio_unix(socket)?, Peer::Unix))
        }
        None => std::future::pending().await,
    }
}

async fn accept_tcp(
    listener: &TcpListener,
    shared: &Shared,
) -> std::io::Result<(FastSocket, Peer)> {
    let (socket, addr) = listener.accept().await?;
    // A client that already reset its connection fails these; it is dropped at its first
    // read, not counted as an accept failure (which backs off).
    let _ = socket.set_nodelay(true);
    let _ = shared.config().tcp_keepalive().apply(&socket);
    Ok((FastSocket::from_tokio(socket)?, Peer::Tcp(addr)))
}

async fn accept_loop(listener: TcpListener, unix: Option<UnixListener>, shared: Arc<Shared>) {
    let stop = shared.stop_accepting.clone();
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = accept_tcp(&listener, &shared) => accepted,
            accepted = accept_unix(unix.as_ref()) => accepted,
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

    /// The path of pgmemo's Unix-domain socket, with `unix_socket_dir`.
    pub fn unix_socket_path(&self) -> Option<&Path> {
        self.unix_socket.as_deref()
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

    /// Installs what switches the log filter when a reload is accepted.
    pub fn set_log_applier(&self, applier: crate::shared::LogApplier) {
        self.shared.set_log_applier(applier);
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
        if let Some(path) = &self.unix_socket {
            let _ = std::fs::remove_file(path);
        }
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
            // A session writing to a client that does not read cannot notice; the process
            // exiting closes its sockets.
            if tokio::time::timeout(CLOSE_GRACE, shared.sessions.wait())
                .await
                .is_err()
            {
                tracing::warn!(
                    remaining = shared.sessions.len(),
                    "sessions blocked writing to clients that do not read: left to the exit"
                );
            }
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

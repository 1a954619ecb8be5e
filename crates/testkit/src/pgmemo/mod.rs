//! pgmemo under test: [`spawn_pgmemo`] runs it inside the test process (fast, inspectable via
//! its handle), [`PgmemoProcess`] runs the real binary (signals, memory use, exit codes).
//!
//! Either way it listens on its own free port on 127.0.0.1, so tests can run many instances
//! side by side.

mod process;

use std::net::{Ipv4Addr, SocketAddr};

use tokio_postgres::Client;

pub use process::PgmemoProcess;

/// A pgmemo running in this process, started by [`spawn_pgmemo`].
pub struct PgmemoInstance {
    handle: ::pgmemo::PgmemoHandle,
}

/// A configuration that proxies to the PostgreSQL server on 127.0.0.1:`upstream_port` and
/// listens on a port the kernel picks; everything else is pgmemo's default. Tests change the
/// fields they are about and pass it to [`spawn_pgmemo`].
pub fn pgmemo_config_for(upstream_port: u16) -> ::pgmemo::Config {
    let upstream = format!("postgres://127.0.0.1:{upstream_port}");
    ::pgmemo::Config {
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        upstream: ::pgmemo::config::UpstreamUrl::parse(&upstream)
            .unwrap_or_else(|e| panic!("testkit: bad upstream URL {upstream}: {e}")),
        ..::pgmemo::Config::default()
    }
}

/// Starts pgmemo in the current tokio runtime.
///
/// `config.listen` is replaced by 127.0.0.1:0 (a port the kernel picks) unless the test chose a
/// specific port: one that is neither 0 nor the default 6432, which parallel tests would fight
/// over.
pub async fn spawn_pgmemo(mut config: ::pgmemo::Config) -> anyhow::Result<PgmemoInstance> {
    let default_listen = ::pgmemo::Config::default().listen;
    if config.listen.port() == 0 || config.listen == default_listen {
        config.listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    }
    let handle = ::pgmemo::Pgmemo::start(config).await?;
    Ok(PgmemoInstance { handle })
}

impl PgmemoInstance {
    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.handle.local_addr()
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr().port()
    }

    /// `postgres://user@127.0.0.1:port/db` through pgmemo.
    pub fn url(&self, user: &str, db: &str) -> String {
        crate::client::url(&self.addr().ip().to_string(), self.port(), user, db)
    }

    /// Like [`url`](Self::url) with a password, for tests of client authentication.
    pub fn url_with_password(&self, user: &str, password: &str, db: &str) -> String {
        crate::client::url_with_password(
            &self.addr().ip().to_string(),
            self.port(),
            user,
            password,
            db,
        )
    }

    /// A client connected through pgmemo; panics with the reason if the connection fails.
    pub async fn client(&self, user: &str, db: &str) -> Client {
        self.try_client(user, db)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// A client through pgmemo, or the connection error, for tests about refused logins.
    pub async fn try_client(&self, user: &str, db: &str) -> anyhow::Result<Client> {
        crate::client::connect(&self.url(user, db)).await
    }

    /// pgmemo's own handle: shared state, stats, reload.
    pub fn handle(&self) -> &::pgmemo::PgmemoHandle {
        &self.handle
    }

    /// pgmemo's process-wide counters (protocol errors, rejected clients, dirty server closes,
    /// cancel requests, ...), which tests read to see what happened behind the scenes.
    pub fn stats(&self) -> &::pgmemo::stats::Stats {
        &self.handle.shared().stats
    }

    /// Graceful shutdown, as on SIGTERM; returns when pgmemo has stopped.
    pub async fn shutdown(self) {
        self.handle.shutdown().await;
    }
}

//! Real PostgreSQL servers for integration tests: [`TempPostgres`], a throwaway cluster per
//! test, and [`LocalPostgres`], the shared server preinstalled on 127.0.0.1:5432.
//!
//! pgmemo's tests put pgmemo between a client and one of these; tests that stop, restart or
//! reconfigure the server (failover, auth methods, logical replication) need their own cluster.

mod builder;
mod command;
mod local;
mod sweep;

use std::path::{Path, PathBuf};

use tempfile::TempDir;
use tokio_postgres::Client;

pub use builder::TempPostgresBuilder;
pub use command::{chown_to_postgres, pg_bin};
pub use local::{local_url, LocalPostgres};

use command::{pg_command, run};

/// A PostgreSQL cluster in its own temp directory, listening on its own port on 127.0.0.1,
/// reachable as superuser `postgres` (trust by default). Dropping it shuts the server down
/// immediately and deletes the directory.
#[derive(Debug)]
pub struct TempPostgres {
    dir: TempDir,
    port: u16,
}

impl TempPostgres {
    /// Starts describing a cluster; finish with [`TempPostgresBuilder::start`].
    pub fn builder() -> TempPostgresBuilder {
        TempPostgresBuilder::default()
    }

    /// A cluster with testkit's defaults only.
    pub async fn start() -> anyhow::Result<TempPostgres> {
        Self::builder().start().await
    }

    /// The TCP port; stays the same across [`stop`](Self::stop) and
    /// [`start_again`](Self::start_again), so URLs handed out earlier keep working.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address the server listens on: always `127.0.0.1`.
    pub fn host(&self) -> &'static str {
        "127.0.0.1"
    }

    /// `postgres://user@127.0.0.1:port/db`, e.g. to build a pgmemo upstream.
    pub fn url(&self, user: &str, db: &str) -> String {
        crate::client::url(self.host(), self.port, user, db)
    }

    /// Like [`url`](Self::url) with a password, for rules that ask for one.
    pub fn url_with_password(&self, user: &str, password: &str, db: &str) -> String {
        crate::client::url_with_password(self.host(), self.port, user, password, db)
    }

    /// A connected client over TCP; panics (with the reason) if the connection fails, because
    /// tests that expect failure use [`try_client`](Self::try_client).
    pub async fn client(&self, user: &str, db: &str) -> Client {
        self.try_client(user, db)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// A client over TCP, or the connection error, for tests about refused logins.
    pub async fn try_client(&self, user: &str, db: &str) -> anyhow::Result<Client> {
        crate::client::connect(&self.url(user, db)).await
    }

    /// Runs `sql` (any number of statements) with psql as superuser in database `postgres` and
    /// returns the unaligned, header-less output. Panics with psql's stderr on any error: it is
    /// for test setup, where an error is a bug in the test.
    pub async fn psql(&self, sql: &str) -> String {
        self.psql_in("postgres", sql).await
    }

    /// Like [`psql`](Self::psql) in database `db`.
    pub async fn psql_in(&self, db: &str, sql: &str) -> String {
        let mut cmd = pg_command("psql", self.dir.path());
        cmd.args([
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-U",
            "postgres",
            "-h",
        ])
        .arg(self.socket_dir())
        .args(["-p", &self.port.to_string(), "-d", db, "-f", "-"]);
        match run(cmd, Some(sql), "psql").await {
            Ok(out) => out.trim_end_matches('\n').to_owned(),
            Err(e) => panic!("psql failed for SQL:\n{sql}\n{e:#}"),
        }
    }

    /// Fast shutdown (`pg_ctl -m fast stop`): clients are disconnected, nothing is lost. Used to
    /// test how pgmemo behaves while the server is down.
    pub async fn stop(&self) -> anyhow::Result<()> {
        let mut cmd = pg_command("pg_ctl", self.dir.path());
        cmd.args(["-w", "-t", "60", "-m", "fast", "-D"])
            .arg(self.data_dir())
            .arg("stop");
        run(cmd, None, "pg_ctl stop").await.map(drop)
    }

    /// Starts the server again after [`stop`](Self::stop), on the same port and with the same
    /// configuration. Fails if the port was taken meanwhile.
    pub async fn start_again(&self) -> anyhow::Result<()> {
        let mut cmd = pg_command("pg_ctl", self.dir.path());
        cmd.args(["-w", "-t", "60", "-D"])
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.log_path())
            .arg("start");
        run(cmd, None, "pg_ctl start").await.map(drop)
    }

    /// [`stop`](Self::stop) then [`start_again`](Self::start_again): every connection to the
    /// server is cut, e.g. to test pgmemo's reconnects.
    pub async fn restart(&self) -> anyhow::Result<()> {
        self.stop().await?;
        self.start_again().await
    }

    /// The data directory (PGDATA), e.g. to edit configuration files before a restart.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The temp directory holding the data directory, the log and the Unix socket; removed on
    /// drop.
    pub fn root_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Directory of the server's Unix socket (its `unix_socket_directories`).
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server log so far (empty if nothing was written yet), to explain a failing test.
    pub fn log_contents(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// PID of the running postmaster, `None` while stopped.
    pub fn postmaster_pid(&self) -> Option<u32> {
        sweep::postmaster_pid(&self.data_dir())
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("log")
    }
}

impl Drop for TempPostgres {
    /// Immediate shutdown (no checkpoint: the data is thrown away anyway); the `TempDir` field
    /// then removes the directory.
    fn drop(&mut self) {
        sweep::kill_postmaster(&self.data_dir());
    }
}

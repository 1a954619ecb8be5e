//! The PostgreSQL server preinstalled on the test machine (127.0.0.1:5432, superuser
//! `postgres`, trust authentication, databases `postgres` and `test`).
//!
//! Cheaper than a [`super::TempPostgres`] for tests that only read and write their own tables;
//! tests that stop or reconfigure the server must not use it, since it is shared by all tests.

use tokio_postgres::Client;

/// The shared local server; a unit type so tests can call the same methods they call on a
/// `TempPostgres` (`port`, `host`, `url`, `client`).
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalPostgres;

impl LocalPostgres {
    /// Where it listens.
    pub const HOST: &'static str = "127.0.0.1";
    /// Its TCP port.
    pub const PORT: u16 = 5432;
    /// A superuser that logs in without a password.
    pub const SUPERUSER: &'static str = "postgres";

    /// [`Self::PORT`], for symmetry with `TempPostgres::port`.
    pub fn port(&self) -> u16 {
        Self::PORT
    }

    /// [`Self::HOST`], for symmetry with `TempPostgres::host`.
    pub fn host(&self) -> &'static str {
        Self::HOST
    }

    /// `postgres://user@127.0.0.1:5432/db`.
    pub fn url(&self, user: &str, db: &str) -> String {
        crate::client::url(Self::HOST, Self::PORT, user, db)
    }

    /// A connected client; panics with the reason if the server is not there.
    pub async fn client(&self, user: &str, db: &str) -> Client {
        self.try_client(user, db)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// A client or the connection error.
    pub async fn try_client(&self, user: &str, db: &str) -> anyhow::Result<Client> {
        crate::client::connect(&self.url(user, db)).await
    }
}

/// URL of database `db` on the local server as superuser `postgres`.
pub fn local_url(db: &str) -> String {
    LocalPostgres.url(LocalPostgres::SUPERUSER, db)
}

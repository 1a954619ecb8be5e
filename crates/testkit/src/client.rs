//! Connecting a `tokio_postgres` client the way every test does: plain TCP, connection task
//! spawned, failures reported with the URL that failed.
//!
//! Shared by [`crate::TempPostgres`], [`crate::LocalPostgres`] and the pgmemo helpers so that a
//! test talks to PostgreSQL directly or through pgmemo with the same two lines.

use anyhow::Context as _;
use tokio_postgres::{Client, NoTls};

/// `postgres://user@host:port/db`, the URL shape all testkit servers hand out.
pub fn url(host: &str, port: u16, user: &str, db: &str) -> String {
    format!("postgres://{user}@{host}:{port}/{db}")
}

/// Like [`url`] with a password, for clusters whose pg_hba.conf asks for one.
pub fn url_with_password(host: &str, port: u16, user: &str, password: &str, db: &str) -> String {
    format!("postgres://{user}:{password}@{host}:{port}/{db}")
}

/// Connects without TLS and drives the connection on a spawned task, so the caller only keeps
/// the `Client`. The task ends when the client is dropped or the server closes the connection.
pub async fn connect(url: &str) -> anyhow::Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    tokio::spawn(async move {
        // Errors here mean the server went away; the test sees them on its next query.
        let _ = connection.await;
    });
    Ok(client)
}

/// The PID of the server process behind `client` (through pgmemo: of the server connection
/// it holds now), for tests that follow a connection through the pool.
pub async fn backend_pid(client: &Client) -> i32 {
    client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pg_backend_pid()")
        .get(0)
}

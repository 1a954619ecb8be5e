//! Connecting a `tokio_postgres` client the way every test does: plain TCP, connection task
//! spawned, failures reported with the URL that failed; and reading what such a client gets
//! back (rows as text, SQLSTATEs).
//!
//! Shared by [`crate::TempPostgres`], [`crate::LocalPostgres`] and the pgmemo helpers so that a
//! test talks to PostgreSQL directly or through pgmemo with the same two lines.

use anyhow::Context as _;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

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

/// A client whose connection task the test keeps instead of [`connect`]'s detached one: aborting
/// the task drops the socket without a Terminate message (a client that crashed), and awaiting
/// it yields the error that ended the connection (e.g. the FATAL pgmemo sent). Panics if the
/// login fails.
pub async fn connect_watched(url: &str) -> (Client, JoinHandle<Result<(), tokio_postgres::Error>>) {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e:?}"));
    (client, tokio::spawn(connection))
}

/// Every row of a simple query's answer, each value as text (`None` for NULL), so that tests
/// compare whole results with one `assert_eq!`.
pub fn rows(messages: &[SimpleQueryMessage]) -> Vec<Vec<Option<String>>> {
    messages
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_owned)).collect())
            }
            _ => None,
        })
        .collect()
}

/// The SQLSTATE of an error the server (or pgmemo) sent, as text (`"57014"`); `None` for errors
/// without one (I/O, a closed connection). Tests assert on codes this way.
pub fn sqlstate(e: &tokio_postgres::Error) -> Option<&str> {
    e.code().map(|c| c.code())
}

/// Whether exactly one session with `application_name` is running a `pg_sleep` statement right
/// now, as `direct` (a connection to the same server) sees in `pg_stat_activity`; `false` if the
/// probe fails. Tests about cancelling wait for this before they cancel. The session must be
/// sleeping: `active` alone also shows while the statement's Parse is processed, and a cancel
/// arriving between the Parse and the Execute is ignored.
pub async fn pg_sleep_running(direct: &Client, application_name: &str) -> bool {
    direct
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
             AND state = 'active' AND query LIKE 'SELECT pg_sleep%' \
             AND wait_event = 'PgSleep'",
            &[&application_name],
        )
        .await
        .is_ok_and(|r| r.get::<_, i64>(0) == 1)
}

/// Whether some session is running exactly the statement `query` right now, as `direct` (a
/// connection to the same server) sees in `pg_stat_activity`; `false` if the probe fails.
pub async fn query_running(direct: &Client, query: &str) -> bool {
    direct
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query = $1",
            &[&query],
        )
        .await
        .is_ok_and(|r| r.get::<_, i64>(0) >= 1)
}

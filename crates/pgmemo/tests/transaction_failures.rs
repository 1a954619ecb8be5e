//! Transaction pooling under failures: servers terminated while pooled or mid-transaction,
//! clients that vanish half-way, `idle_transaction_timeout` and cancels around transaction
//! boundaries. What a client sees must be a PostgreSQL-style error (never a hang, never
//! another client's answer), and no server may go back to the pool dirty.

mod txn_support;

use std::time::Duration;

use pgmemo::config::Seconds;
use testkit::{connect_watched, sqlstate, within, LocalPostgres};
use txn_support::{
    backend_pid, msg, side_by_side, txn_pgmemo, value, Raw, DB, TEST_DEADLINE, USER,
};

/// `idle_transaction_timeout` is about a client that is idle inside its transaction: a
/// statement it sends there and that runs for longer than the timeout is busy, not idle.
#[tokio::test]
async fn a_long_statement_after_an_idle_moment_in_a_transaction_is_not_idle() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| {
            c.idle_transaction_timeout = Seconds(Duration::from_secs(1));
        })
        .await;
        let a = pgmemo.client(USER, DB).await;
        a.batch_execute("BEGIN").await.unwrap();
        // Idle inside the transaction for a moment (well within the timeout), then busy for
        // longer than the timeout.
        a.simple_query("SELECT pg_sleep(0.5)").await.unwrap();
        let long = a.simple_query("SELECT pg_sleep(1.5)").await;
        assert!(
            long.is_ok(),
            "a running statement was taken for idleness: {long:?}"
        );
        a.batch_execute("COMMIT").await.unwrap();
        pgmemo.shutdown().await;
    })
    .await
}

/// A pooled server terminated while idle (`pg_terminate_backend` from elsewhere) is not lent
/// again: the client's next transaction gets another server and never the FATAL of the dead one.
#[tokio::test]
async fn a_server_terminated_while_pooled_is_not_lent_again() {
    within(TEST_DEADLINE, async {
        let direct = LocalPostgres.client(USER, DB).await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let a = pgmemo.client(USER, DB).await;
        let pid = backend_pid(&a).await;
        direct
            .query_one("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap();
        testkit::assert_eventually(txn_support::SOON, "the backend is gone", || async {
            direct
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                    &[&pid],
                )
                .await
                .is_ok_and(|r| r.get::<_, i64>(0) == 0)
        })
        .await;
        let next = a.simple_query("SELECT pg_backend_pid()").await;
        let next = next.unwrap_or_else(|e| panic!("the dead server was lent: {e:?}"));
        let _ = next;
        assert_eq!(value(&a, "SELECT 1").await, "1");
        pgmemo.shutdown().await;
    })
    .await
}

/// A server terminated while its client is inside a transaction: the client gets the server's
/// FATAL once (as from PostgreSQL directly) and its session ends; other clients go on.
#[tokio::test]
async fn a_server_terminated_mid_transaction_ends_only_its_clients_session() {
    within(TEST_DEADLINE, async {
        let direct = LocalPostgres.client(USER, DB).await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |_| {}).await;
        let (a, a_conn) = connect_watched(&pgmemo.url(USER, DB)).await;
        let b = pgmemo.client(USER, DB).await;
        a.batch_execute("BEGIN").await.unwrap();
        let pid = backend_pid(&a).await;
        direct
            .query_one("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap();
        let ended = tokio::time::timeout(txn_support::SOON, a_conn)
            .await
            .expect("A's connection was not closed")
            .unwrap();
        let e = ended.expect_err("A's connection ended without an error");
        assert_eq!(sqlstate(&e), Some("57P01"), "{e:?}");
        assert!(a.simple_query("SELECT 1").await.is_err());
        assert_eq!(value(&b, "SELECT 2").await, "2");
        let c = pgmemo.client(USER, DB).await;
        assert_eq!(value(&c, "SELECT 3").await, "3");
        pgmemo.shutdown().await;
    })
    .await
}

/// What a raw client inside a transaction reads until its connection closes when its backend
/// is terminated from elsewhere, on `port`.
async fn terminated_in_transaction(port: u16) -> Vec<String> {
    let direct = LocalPostgres.client(USER, DB).await;
    let mut a = Raw::login(port).await;
    a.exchange(&[msg::query("BEGIN")]).await;
    let pid = a.exchange(&[msg::query("SELECT pg_backend_pid()")]).await;
    let pid: i32 = pid[1]
        .trim_start_matches("DataRow [")
        .trim_end_matches(']')
        .parse()
        .unwrap();
    direct
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    a.until_closed().await
}

/// The client of a server terminated mid-transaction reads what a direct client reads: the
/// server's FATAL, once, then the end of the connection.
#[tokio::test]
async fn a_terminated_server_s_fatal_reaches_its_client_once() {
    within(TEST_DEADLINE, async {
        let direct = terminated_in_transaction(LocalPostgres::PORT).await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let proxied = terminated_in_transaction(pgmemo.port()).await;
        assert_eq!(direct, proxied, "{}", side_by_side(&direct, &proxied));
        pgmemo.shutdown().await;
    })
    .await
}

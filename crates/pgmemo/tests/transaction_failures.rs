//! Transaction pooling under failures: servers terminated while pooled or mid-transaction,
//! clients that vanish half-way, `idle_transaction_timeout` and cancels around transaction
//! boundaries. What a client sees must be a PostgreSQL-style error (never a hang, never
//! another client's answer), and no server may go back to the pool dirty.

mod txn_support;

use std::time::Duration;

use pgmemo::config::Seconds;
use testkit::{connect_watched, sqlstate, within, LocalPostgres, TempPostgres};
use txn_support::{
    backend_pid, create_table, drop_table, msg, side_by_side, txn_pgmemo, value, Raw, DB,
    TEST_DEADLINE, USER,
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

/// An upstream restart: the client inside a transaction gets the server's FATAL and its
/// session ends; a client between transactions loses nothing (its next transaction gets a
/// new server, never a dead one), and while the server is down a request gets a clean error.
#[tokio::test]
async fn an_upstream_restart_ends_only_sessions_inside_a_transaction() {
    within(TEST_DEADLINE, async {
        let pg = TempPostgres::start().await.expect("starting PostgreSQL");
        let pgmemo = txn_pgmemo(pg.port(), 2, |_| {}).await;
        let url = pgmemo.url(USER, "postgres");
        let between = pgmemo.client(USER, "postgres").await;
        let (inside, inside_conn) = connect_watched(&url).await;
        let down = pgmemo.client(USER, "postgres").await;
        assert_eq!(value(&between, "SELECT 1").await, "1");
        inside.batch_execute("BEGIN").await.unwrap();
        let before = backend_pid(&inside).await;

        pg.stop().await.unwrap();
        let ended = tokio::time::timeout(txn_support::SOON, inside_conn)
            .await
            .expect("the session inside a transaction was not closed")
            .unwrap();
        let e = ended.expect_err("closed without an error");
        assert_eq!(sqlstate(&e), Some("57P01"), "{e:?}");
        // Down: a clean error, at once.
        let e = down
            .simple_query("SELECT 1")
            .await
            .expect_err("the server is down");
        assert_eq!(sqlstate(&e), Some("08006"), "{e:?}");

        pg.start_again().await.unwrap();
        assert_eq!(value(&between, "SELECT 2").await, "2");
        assert_ne!(backend_pid(&between).await, before);
        let after = pgmemo.client(USER, "postgres").await;
        assert_eq!(value(&after, "SELECT 3").await, "3");
        pgmemo.shutdown().await;
    })
    .await
}

/// A client that vanishes mid-COPY, or with an extended-protocol batch sent without its Sync,
/// leaves nothing on the server it had: what it wrote is not committed and the next client
/// finds no transaction open.
#[tokio::test]
async fn a_client_gone_mid_copy_or_mid_batch_leaves_nothing_behind() {
    within(TEST_DEADLINE, async {
        let t = create_table("txn_gone_mid", "(v text)").await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let b = pgmemo.client(USER, DB).await;
        let count =
            format!("SELECT count(*) || ' ' || (txid_current_if_assigned() IS NULL) FROM {t}");

        let mut a = Raw::login(pgmemo.port()).await;
        a.send(&[msg::query(&format!("COPY {t} FROM STDIN"))]).await;
        a.until(b'G').await;
        a.send(&[msg::copy_data(b"copied\n")]).await;
        drop(a);
        assert_eq!(value(&b, &count).await, "0 true", "after a COPY cut short");

        let mut a = Raw::login(pgmemo.port()).await;
        let insert = format!("INSERT INTO {t} VALUES ($1)");
        a.send(&[
            msg::parse("", &insert, &[]),
            msg::bind("", "", &[Some("synced")]),
            msg::execute("", 0),
            msg::sync(),
            msg::parse("", &insert, &[]),
            msg::bind("", "", &[Some("unsynced")]),
            msg::execute("", 0),
            msg::flush(),
        ])
        .await;
        a.until(b'Z').await;
        a.until(b'C').await;
        drop(a);
        assert_eq!(
            value(&b, &count).await,
            "1 true",
            "after a batch without Sync"
        );
        assert_eq!(
            value(&b, &format!("SELECT string_agg(v, ',') FROM {t}")).await,
            "synced"
        );

        // Half a message after a whole one.
        let mut a = Raw::login(pgmemo.port()).await;
        let mut half = msg::query(&format!("INSERT INTO {t} VALUES ('half')"));
        half.truncate(half.len() / 2);
        a.send(&[msg::query("BEGIN"), half]).await;
        a.until(b'Z').await;
        drop(a);
        assert_eq!(value(&b, &count).await, "1 true", "after half a message");
        pgmemo.shutdown().await;
        drop_table(&t).await;
    })
    .await
}

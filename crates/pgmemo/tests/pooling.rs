//! Session pooling end to end: reuse of server connections, clean resets, clients that vanish
//! mid-transaction or mid-query, a full pool (timeout and FIFO order), an upstream that restarts
//! or goes away, graceful shutdown, idle/lifetime expiry, and SIGHUP/SIGTERM on the binary.
//!
//! Tests that only need a database of their own use the shared local server (with tables named
//! after the test and the process ID); tests that stop or restart PostgreSQL get a
//! `TempPostgres` cluster.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::backend_pid;

use pgmemo::config::Seconds;
use pgmemo::pool::ServerState;
use pgmemo::Config;
use testkit::{
    assert_eventually, connect_watched, eventually_some, pgmemo_config_for, spawn_pgmemo, sqlstate,
    LocalPostgres, PgmemoInstance, PgmemoProcess, TempPostgres,
};
use tokio_postgres::{Client, NoTls};

/// Database on the shared local server.
const DB: &str = "test";
const USER: &str = "postgres";

/// Generous bound for anything that should happen "at once" on a busy CI machine.
const SOON: Duration = Duration::from_secs(10);

fn seconds(d: Duration) -> Seconds {
    Seconds(d)
}

/// pgmemo in front of the local server with `pool_size` and whatever `tweak` changes.
async fn local_pgmemo(pool_size: usize, tweak: impl FnOnce(&mut Config)) -> PgmemoInstance {
    pgmemo_for(LocalPostgres::PORT, pool_size, tweak).await
}

async fn pgmemo_for(
    port: u16,
    pool_size: usize,
    tweak: impl FnOnce(&mut Config),
) -> PgmemoInstance {
    let mut config = Config {
        pool_size,
        ..pgmemo_config_for(port)
    };
    tweak(&mut config);
    spawn_pgmemo(config).await.expect("pgmemo starts")
}

/// A table name unique to this test process and `what`.
fn table(what: &str) -> String {
    format!("pooling_{what}_{}", std::process::id())
}

/// The error of a connection attempt that must fail, within `SOON`.
async fn connect_error(url: &str) -> tokio_postgres::Error {
    let attempt = tokio::time::timeout(SOON, tokio_postgres::connect(url, NoTls))
        .await
        .unwrap_or_else(|_| panic!("connecting to {url} hung"));
    match attempt {
        Ok(_) => panic!("connecting to {url} succeeded, expected an error"),
        Err(e) => e,
    }
}

/// Whether a backend with this PID is still connected to the server `direct` talks to.
async fn backend_exists(direct: &Client, pid: i32) -> bool {
    direct
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .map(|r| r.get::<_, i64>(0) == 1)
        .unwrap_or(false)
}

/// Asserts that a session carries nothing over from a previous client: no transaction, no
/// SET / SET LOCAL values, no temp table, no prepared statement, no advisory lock, no LISTEN.
async fn assert_clean_session(client: &Client, temp_table: &str, defaults: &Defaults) {
    let row = client
        .query_one(
            "SELECT txid_current_if_assigned() IS NULL, \
                    current_setting('application_name'), \
                    coalesce(current_setting('myapp.x', true), ''), \
                    current_setting('statement_timeout'), \
                    to_regclass('pg_temp.' || $1::text) IS NULL, \
                    (SELECT count(*) FROM pg_prepared_statements WHERE name = 'p'), \
                    (SELECT count(*) FROM pg_locks \
                       WHERE locktype = 'advisory' AND pid = pg_backend_pid()), \
                    (SELECT count(*) FROM pg_listening_channels())",
            &[&temp_table],
        )
        .await
        .expect("state query");
    assert!(row.get::<_, bool>(0), "a transaction is still open");
    assert_eq!(row.get::<_, String>(1), defaults.application_name);
    assert_eq!(row.get::<_, String>(2), "", "myapp.x survived");
    assert_eq!(row.get::<_, String>(3), defaults.statement_timeout);
    assert!(row.get::<_, bool>(4), "temp table {temp_table} survived");
    assert_eq!(row.get::<_, i64>(5), 0, "prepared statement p survived");
    assert_eq!(row.get::<_, i64>(6), 0, "advisory lock survived");
    assert_eq!(row.get::<_, i64>(7), 0, "LISTEN survived");
    // In autocommit, a simple query's transaction starts with the statement; inside an old
    // transaction now() would be that transaction's start.
    let same = client
        .simple_query("SELECT now() = statement_timestamp()")
        .await
        .expect("now() query");
    let same = same.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
        _ => None,
    });
    assert_eq!(
        same.as_deref(),
        Some("t"),
        "now() belongs to an older transaction"
    );
    // A new transaction starts normally (no "already a transaction in progress").
    client.batch_execute("BEGIN; COMMIT").await.expect("BEGIN");
}

/// What a fresh session shows, read on a direct connection to the same server.
struct Defaults {
    application_name: String,
    statement_timeout: String,
}

async fn defaults_of(direct: &Client) -> Defaults {
    let row = direct
        .query_one(
            "SELECT current_setting('application_name'), current_setting('statement_timeout')",
            &[],
        )
        .await
        .unwrap();
    Defaults {
        application_name: row.get(0),
        statement_timeout: row.get(1),
    }
}

#[tokio::test]
async fn session_pooling_reuses_server_connections() {
    let pgmemo = local_pgmemo(1, |_| {}).await;
    let a = pgmemo.client(USER, DB).await;
    let pid = backend_pid(&a).await;
    drop(a);

    // The reset runs in the background after A leaves; B then gets the same backend.
    assert_eventually(SOON, "B gets A's server connection", || async {
        let b = pgmemo.client(USER, DB).await;
        backend_pid(&b).await == pid
    })
    .await;
    pgmemo.shutdown().await;
}

/// A cancel read while A's query ran reaches PostgreSQL only after A's query ended and A
/// left (the gate holds it): the server must not serve B before that, or the cancel stops
/// B's query.
#[tokio::test]
async fn a_cancel_still_on_its_way_never_stops_the_next_sessions_query() {
    let mut gate = testkit::CancelGate::start(LocalPostgres::PORT).await;
    let pgmemo = pgmemo_for(gate.port(), 1, |_| {}).await;
    let app = testkit::unique("late_cancel");
    let url = format!("{}?application_name={app}", pgmemo.url(USER, DB));
    let (a, _a_conn) = connect_watched(&url).await;
    let direct = LocalPostgres.client(USER, DB).await;
    let token = a.cancel_token();
    let a_running = tokio::spawn(async move {
        let r = a.query("SELECT pg_sleep(1)", &[]).await.map(|_| ());
        drop(a);
        r
    });
    assert_eventually(SOON, "A's query runs", || {
        testkit::pg_sleep_running(&direct, &app)
    })
    .await;
    let cancelling = tokio::spawn(async move { token.cancel_query(NoTls).await });
    gate.cancel_arrived().await;
    a_running
        .await
        .unwrap()
        .expect("A's cancel is still at the gate: its query ends normally");

    // Without the cancel on its way, A's server is idle again within moments of A leaving;
    // with it, it stays A's until the cancel is delivered, and this gives up after 2 s (there
    // is no event to await then).
    let pool = pgmemo.handle().shared().pools.all()[0].clone();
    testkit::eventually(Duration::from_secs(2), || {
        let pool = &pool;
        async move { pool.counts().0 == 1 }
    })
    .await;

    // The same startup parameters, so B is given A's server.
    let b_url = url.clone();
    let b_running = tokio::spawn(async move {
        let b = testkit::connect(&b_url).await.expect("B logs in");
        b.query_one("SELECT pg_sleep(0.5)::text", &[])
            .await
            .map(|_| ())
    });
    let shared = pgmemo.handle().shared().clone();
    assert_eventually(SOON, "B runs or waits for the server A holds", || {
        let (direct, pool, shared) = (&direct, &pool, &shared);
        async move {
            let held = shared
                .pools
                .servers
                .snapshot()
                .iter()
                .all(|r| r.state == ServerState::Active);
            (pool.waiting() >= 1 && held)
                || testkit::query_running(direct, "SELECT pg_sleep(0.5)::text").await
        }
    })
    .await;
    gate.release();
    cancelling.await.unwrap().expect("the cancel is forwarded");
    b_running
        .await
        .unwrap()
        .expect("A's late cancel must not stop B's query");
    pgmemo.shutdown().await;
}

/// An idle connection whose health check (`server_check_query`, run when it was idle longer
/// than `server_check_delay`) fails is closed, not lent: the next client gets a new backend
/// and its login still works. An empty check query turns the check off.
#[tokio::test]
async fn a_failing_health_check_closes_the_idle_connection() {
    for (query, reused) in [("SELECT 1/0", false), ("", true)] {
        let pgmemo = local_pgmemo(1, |c| {
            c.server_check_query = query.to_owned();
            c.server_check_delay = seconds(Duration::ZERO);
        })
        .await;
        let a = pgmemo.client(USER, DB).await;
        let pid = backend_pid(&a).await;
        drop(a);
        // The connection is idle again once its reset has run.
        assert_eventually(SOON, "A's server connection is idle", || async {
            pgmemo.handle().shared().pools.all()[0].counts().0 == 1
        })
        .await;
        let b = pgmemo.client(USER, DB).await;
        assert_eq!(
            backend_pid(&b).await == pid,
            reused,
            "check query {query:?}: reused {reused}"
        );
        pgmemo.shutdown().await;
    }
}

#[tokio::test]
async fn reset_leaves_no_trace_of_the_previous_client() {
    let direct = LocalPostgres.client(USER, DB).await;
    let defaults = defaults_of(&direct).await;
    let temp = table("reset_tmp");
    let pgmemo = local_pgmemo(1, |_| {}).await;

    let a = pgmemo.client(USER, DB).await;
    let pid = backend_pid(&a).await;
    a.batch_execute(&format!(
        "SET application_name = 'dirty'; SET myapp.x = '1'; SET statement_timeout = '4321s'; \
         CREATE TEMP TABLE {temp} (a int); PREPARE p AS SELECT 1; \
         SELECT pg_advisory_lock(4242); LISTEN pooling_reset_channel"
    ))
    .await
    .unwrap();
    // Sanity: the state is really there before A leaves.
    let row = a
        .query_one(
            "SELECT current_setting('application_name'), current_setting('myapp.x', true)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "dirty");
    assert_eq!(row.get::<_, Option<String>>(1).as_deref(), Some("1"));
    drop(a);

    let b = eventually_some(SOON, || async {
        let b = pgmemo.client(USER, DB).await;
        (backend_pid(&b).await == pid).then_some(b)
    })
    .await
    .expect("B gets A's server connection");
    assert_clean_session(&b, &temp, &defaults).await;
    // The names A used are free again.
    b.batch_execute(&format!(
        "PREPARE p AS SELECT 2; CREATE TEMP TABLE {temp} (b text)"
    ))
    .await
    .unwrap();
    drop(b);
    pgmemo.shutdown().await;
}

#[tokio::test]
async fn client_killed_mid_transaction_is_rolled_back() {
    let direct = LocalPostgres.client(USER, DB).await;
    let defaults = defaults_of(&direct).await;
    let t = table("killed_tx");
    direct
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (v text)"
        ))
        .await
        .unwrap();
    let pgmemo = local_pgmemo(1, |_| {}).await;
    let url = pgmemo.url(USER, DB);

    let (a, a_conn) = connect_watched(&url).await;
    let pid = backend_pid(&a).await;
    a.batch_execute(&format!(
        "BEGIN; INSERT INTO {t} VALUES ('from A'); SET LOCAL statement_timeout = '4321s'"
    ))
    .await
    .unwrap();
    // The client process dies: its socket closes without a Terminate message.
    a_conn.abort();
    let _ = a_conn.await;
    drop(a);

    let b = eventually_some(SOON, || async {
        let b = pgmemo.client(USER, DB).await;
        (backend_pid(&b).await == pid).then_some(b)
    })
    .await
    .expect("B gets A's server connection, rolled back");
    assert_clean_session(&b, "no_such_temp_table", &defaults).await;
    assert_eq!(count(&b, &t).await, 0, "A's row is visible through pgmemo");
    assert_eq!(count(&direct, &t).await, 0, "A's row was committed");
    drop(b);
    pgmemo.shutdown().await;
    direct
        .batch_execute(&format!("DROP TABLE {t}"))
        .await
        .unwrap();
}

async fn count(client: &Client, table: &str) -> i64 {
    client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn client_killed_mid_query_does_not_leave_a_dirty_server() {
    let direct = LocalPostgres.client(USER, DB).await;
    let defaults = defaults_of(&direct).await;
    let pgmemo = local_pgmemo(1, |_| {}).await;
    let url = pgmemo.url(USER, DB);

    let (a, a_conn) = connect_watched(&url).await;
    let pid = backend_pid(&a).await;
    a.batch_execute("SET application_name = 'killed mid query'")
        .await
        .unwrap();
    let sleeper = tokio::spawn(async move { a.simple_query("SELECT pg_sleep(5)").await });
    assert_eventually(SOON, "A's pg_sleep is running", || async {
        direct
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE pid = $1 AND state = 'active' AND query LIKE '%pg_sleep%'",
                &[&pid],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 1
    })
    .await;
    let killed = Instant::now();
    a_conn.abort();
    let _ = a_conn.await;
    let _ = sleeper.await;

    // B must not wait for the 5 s sleep to end, and must not get A's busy backend.
    let b = tokio::time::timeout(Duration::from_secs(4), pgmemo.client(USER, DB))
        .await
        .expect("B waited for A's query to finish");
    let b_pid = backend_pid(&b).await;
    assert!(
        killed.elapsed() < Duration::from_secs(4),
        "B took {:?}",
        killed.elapsed()
    );
    assert_ne!(b_pid, pid, "B got the backend still running A's query");
    assert_clean_session(&b, "no_such_temp_table", &defaults).await;
    drop(b);
    pgmemo.shutdown().await;
}

#[tokio::test]
async fn full_pool_times_out_with_53300_then_admits_the_next_client() {
    let pgmemo = local_pgmemo(1, |c| {
        c.query_wait_timeout = seconds(Duration::from_millis(500));
    })
    .await;
    let url = pgmemo.url(USER, DB);
    let a = pgmemo.client(USER, DB).await;
    backend_pid(&a).await;

    let started = Instant::now();
    let e = connect_error(&url).await;
    let waited = started.elapsed();
    assert_eq!(sqlstate(&e), Some("53300"), "{e:?}");
    let message = e.as_db_error().map(|d| d.message().to_owned()).unwrap();
    assert!(message.contains("query_wait_timeout"), "{message}");
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_secs(2),
        "B waited {waited:?}"
    );

    drop(a);
    assert_eventually(SOON, "C gets in after A left", || async {
        match pgmemo.try_client(USER, DB).await {
            Ok(c) => c.simple_query("SELECT 1").await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    pgmemo.shutdown().await;
}

#[tokio::test]
async fn waiting_clients_are_served_in_arrival_order() {
    let pgmemo = local_pgmemo(1, |_| {}).await;
    let url = pgmemo.url(USER, DB);
    let a = pgmemo.client(USER, DB).await;
    backend_pid(&a).await;

    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 1..=3 {
        let url = url.clone();
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let client = testkit::connect(&url).await.unwrap();
            order.lock().unwrap().push(i);
            client.simple_query("SELECT 1").await.unwrap();
            // Dropping the client gives the server connection to the next in line.
        }));
        // B(i) is queued once pgmemo admitted it (A plus i waiters); only then does B(i+1)
        // start to connect, so arrival order is well defined.
        let shared = pgmemo.handle().shared().clone();
        assert_eventually(SOON, "the waiter is admitted", || {
            let shared = shared.clone();
            async move { shared.client_count() == 1 + i }
        })
        .await;
    }
    assert!(
        order.lock().unwrap().is_empty(),
        "someone got in while A held the pool"
    );
    drop(a);
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("waiter finishes")
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![1, 2, 3]);
    pgmemo.shutdown().await;
}

/// Clients that close their connection while queued for a pool place leave the queue at once:
/// they keep neither their `max_client_conn` slots nor their turn until `query_wait_timeout`
/// (when a server would be taken or opened for nobody), and the place goes to the next real
/// client as soon as it is free.
#[tokio::test]
async fn clients_that_leave_while_queued_free_their_slots_at_once() {
    use tokio::io::AsyncWriteExt;
    let pgmemo = local_pgmemo(1, |c| {
        c.max_client_conn = 3;
        c.query_wait_timeout = seconds(Duration::from_secs(30));
    })
    .await;
    let shared = pgmemo.handle().shared().clone();
    let a = pgmemo.client(USER, DB).await;
    backend_pid(&a).await;
    let pool = shared.pools.all()[0].clone();

    let mut leaving = Vec::new();
    for _ in 0..2 {
        let mut socket = tokio::net::TcpStream::connect(pgmemo.addr()).await.unwrap();
        let startup = wire::startup::StartupMessage::encode([("user", USER), ("database", DB)]);
        socket.write_all(&startup).await.unwrap();
        leaving.push(socket);
    }
    assert_eventually(SOON, "both clients are queued", || async {
        pool.waiting() == 2
    })
    .await;
    drop(leaving);
    assert_eventually(
        Duration::from_secs(2),
        "the clients that left free their places in the queue and their slots",
        || async { pool.waiting() == 0 && shared.client_count() == 1 },
    )
    .await;

    // Their slots are free: a client of another pool is admitted (max_client_conn = 3).
    let other = pgmemo.client(USER, "postgres").await;
    other.simple_query("SELECT 1").await.unwrap();
    // And a client queued now gets A's server as soon as A leaves.
    let url = pgmemo.url(USER, DB);
    let b = tokio::spawn(async move {
        let client = testkit::connect(&url).await.expect("B logs in");
        client.simple_query("SELECT 1").await.map(|_| ())
    });
    assert_eventually(SOON, "B is queued", || async { pool.waiting() == 1 }).await;
    let released = Instant::now();
    drop(a);
    tokio::time::timeout(SOON, b)
        .await
        .expect("B is served once A left")
        .unwrap()
        .expect("B's query");
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "B waited {:?} after A left",
        released.elapsed()
    );
    // No server was opened for the clients that left: A's and the other pool's only.
    assert_eq!(
        pgmemo
            .stats()
            .server_connects
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    pgmemo.shutdown().await;
}

#[tokio::test]
async fn upstream_restart_fails_the_session_then_new_sessions_work() {
    let pg = TempPostgres::start().await.unwrap();
    let pgmemo = pgmemo_for(pg.port(), 2, |_| {}).await;

    // One connection idle in the pool, one in use by a session.
    let idle = pgmemo.client(USER, "postgres").await;
    backend_pid(&idle).await;
    let session = pgmemo.client(USER, "postgres").await;
    backend_pid(&session).await;
    drop(idle);
    let shared = pgmemo.handle().shared().clone();
    assert_eventually(SOON, "one connection idle in the pool", || {
        let shared = shared.clone();
        async move { shared.pools.all().iter().any(|p| p.counts().0 == 1) }
    })
    .await;

    pg.restart().await.unwrap();

    let next = tokio::time::timeout(SOON, session.simple_query("SELECT 1"))
        .await
        .expect("the in-session query hung after the restart");
    assert!(
        next.is_err(),
        "the query succeeded on a dead server session"
    );

    assert_eventually(SOON, "new sessions work after the restart", || async {
        match pgmemo.try_client(USER, "postgres").await {
            Ok(c) => c.simple_query("SELECT 1").await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    // Nothing stale is left in the pool: every new session works at the first attempt.
    for _ in 0..3 {
        let c = pgmemo.client(USER, "postgres").await;
        c.simple_query("SELECT 1").await.unwrap();
    }
    pgmemo.shutdown().await;
}

#[tokio::test]
async fn upstream_down_gives_08006_quickly_and_recovers() {
    let pg = TempPostgres::start().await.unwrap();
    let pgmemo = pgmemo_for(pg.port(), 2, |_| {}).await;
    let url = pgmemo.url(USER, "postgres");
    let c = pgmemo.client(USER, "postgres").await;
    backend_pid(&c).await;
    drop(c);

    pg.stop().await.unwrap();
    let started = Instant::now();
    let e = connect_error(&url).await;
    assert_eq!(sqlstate(&e), Some("08006"), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the error took {:?}",
        started.elapsed()
    );

    pg.start_again().await.unwrap();
    assert_eventually(SOON, "new clients work once the server is back", || async {
        match pgmemo.try_client(USER, "postgres").await {
            Ok(c) => c.simple_query("SELECT 1").await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    // Same instance throughout: it counted the failed connect and keeps serving.
    let failures = pgmemo
        .stats()
        .server_connect_failures
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(failures >= 1);
    let c = pgmemo.client(USER, "postgres").await;
    c.simple_query("SELECT 1").await.unwrap();
    drop(c);
    pgmemo.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_closes_idle_sessions_and_lets_transactions_finish() {
    let direct = LocalPostgres.client(USER, DB).await;
    let t = table("shutdown");
    direct
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (v text)"
        ))
        .await
        .unwrap();
    let pgmemo = local_pgmemo(4, |c| {
        c.shutdown_timeout = seconds(Duration::from_secs(20));
    })
    .await;
    let url = pgmemo.url(USER, DB);

    let (idle, idle_conn) = connect_watched(&url).await;
    // Simple protocol only: a dropped prepared statement would send a Close in the background,
    // and a request in flight at shutdown would take the FATAL as its answer.
    idle.batch_execute("SELECT 1").await.unwrap();
    let (busy, busy_conn) = connect_watched(&url).await;
    busy.batch_execute(&format!("BEGIN; INSERT INTO {t} VALUES ('before')"))
        .await
        .unwrap();

    let shutdown_started = Instant::now();
    let shutdown = tokio::spawn(pgmemo.shutdown());

    // The idle session is closed with 57P01.
    let ended = tokio::time::timeout(SOON, idle_conn)
        .await
        .expect("the idle session was not closed")
        .unwrap();
    let e = ended.expect_err("the idle session ended without an error");
    assert_eq!(sqlstate(&e), Some("57P01"), "{e:?}");
    assert!(idle.simple_query("SELECT 1").await.is_err());

    // No new connections.
    assert_eventually(SOON, "new connections are refused", || async {
        tokio::time::timeout(SOON, tokio_postgres::connect(&url, NoTls))
            .await
            .map(|r| r.is_err())
            .unwrap_or(false)
    })
    .await;

    // The session in a transaction finishes it...
    busy.batch_execute(&format!("INSERT INTO {t} VALUES ('during')"))
        .await
        .unwrap();
    busy.batch_execute("COMMIT").await.unwrap();
    // ...and is closed right after.
    let ended = tokio::time::timeout(SOON, busy_conn)
        .await
        .expect("the session was not closed after COMMIT")
        .unwrap();
    let e = ended.expect_err("the session ended without an error");
    assert_eq!(sqlstate(&e), Some("57P01"), "{e:?}");

    tokio::time::timeout(SOON, shutdown)
        .await
        .expect("shutdown did not complete")
        .unwrap();
    assert!(
        shutdown_started.elapsed() < Duration::from_secs(15),
        "shutdown waited for shutdown_timeout: {:?}",
        shutdown_started.elapsed()
    );
    let rows = direct
        .query_one(&format!("SELECT count(*) FROM {t}"), &[])
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(rows, 2, "the transaction was not committed");
    direct
        .batch_execute(&format!("DROP TABLE {t}"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_timeout_ends_transactions_that_do_not_finish() {
    let direct = LocalPostgres.client(USER, DB).await;
    let t = table("shutdown_timeout");
    direct
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (v text)"
        ))
        .await
        .unwrap();
    let pgmemo = local_pgmemo(2, |c| {
        c.shutdown_timeout = seconds(Duration::from_secs(1));
    })
    .await;
    let (busy, busy_conn) = connect_watched(&pgmemo.url(USER, DB)).await;
    busy.batch_execute(&format!(
        "BEGIN; INSERT INTO {t} VALUES ('never committed')"
    ))
    .await
    .unwrap();

    let started = Instant::now();
    tokio::time::timeout(SOON, pgmemo.shutdown())
        .await
        .expect("shutdown did not complete after shutdown_timeout");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "shutdown did not wait for the transaction: {:?}",
        started.elapsed()
    );
    let ended = tokio::time::timeout(SOON, busy_conn)
        .await
        .expect("the session was not closed")
        .unwrap();
    assert_eq!(
        ended.as_ref().err().and_then(sqlstate),
        Some("57P01"),
        "{ended:?}"
    );
    assert_eventually(
        SOON,
        "the unfinished transaction is rolled back",
        || async {
            direct
            .query_one(&format!("SELECT count(*) FROM {t}"), &[])
            .await
            .map(|r| r.get::<_, i64>(0) == 0)
            .unwrap_or(false)
            // A's transaction is gone too: nobody holds a lock on the table.
            && direct
                .query_one(
                    &format!("SELECT count(*) FROM pg_locks WHERE relation = '{t}'::regclass"),
                    &[],
                )
                .await
                .map(|r| r.get::<_, i64>(0) == 0)
                .unwrap_or(false)
        },
    )
    .await;
    direct
        .batch_execute(&format!("DROP TABLE {t}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn idle_server_connections_expire_after_server_idle_timeout() {
    let direct = LocalPostgres.client(USER, DB).await;
    let pgmemo = local_pgmemo(2, |c| {
        c.server_idle_timeout = seconds(Duration::from_secs(1));
    })
    .await;
    let a = pgmemo.client(USER, DB).await;
    let pid = backend_pid(&a).await;
    drop(a);
    let shared = pgmemo.handle().shared().clone();
    assert_eventually(SOON, "the connection is idle in the pool", || {
        let shared = shared.clone();
        async move { shared.pools.all().iter().any(|p| p.counts() == (1, 1)) }
    })
    .await;
    assert!(backend_exists(&direct, pid).await);
    assert_eventually(SOON, "the idle backend is closed", || async {
        !backend_exists(&direct, pid).await
    })
    .await;
    assert!(shared.pools.all().iter().all(|p| p.counts() == (0, 0)));
    pgmemo.shutdown().await;
}

#[tokio::test]
async fn server_lifetime_closes_old_connections_once_idle() {
    let direct = LocalPostgres.client(USER, DB).await;
    let pgmemo = local_pgmemo(2, |c| {
        c.server_lifetime = seconds(Duration::from_secs(1));
    })
    .await;
    let a = pgmemo.client(USER, DB).await;
    let pid = backend_pid(&a).await;
    // Busy past the lifetime: a connection in use is never cut.
    a.simple_query("SELECT pg_sleep(1.3)").await.unwrap();
    assert_eq!(backend_pid(&a).await, pid);
    drop(a);
    assert_eventually(SOON, "the old backend is closed once idle", || async {
        !backend_exists(&direct, pid).await
    })
    .await;
    // The next client gets a new connection.
    let b = pgmemo.client(USER, DB).await;
    assert_ne!(backend_pid(&b).await, pid);
    drop(b);
    pgmemo.shutdown().await;
}

fn write_config(path: &Path, max_client_conn: usize, pool_size: usize) {
    std::fs::write(
        path,
        format!(
            "upstream = \"postgres://127.0.0.1:{}\"\n\
             max_client_conn = {max_client_conn}\n\
             pool_size = {pool_size}\n\
             query_wait_timeout = \"500ms\"\n\
             shutdown_timeout = \"2s\"\n",
            LocalPostgres::PORT
        ),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_limits_and_sigterm_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pgmemo.toml");
    write_config(&config, 1, 1);
    let mut process = PgmemoProcess::spawn(
        Path::new(env!("CARGO_BIN_EXE_pgmemo")),
        &["--config".to_owned(), config.to_string_lossy().into_owned()],
    )
    .await
    .unwrap();
    let url = process.url(USER, DB);

    // The readiness probe may still occupy the only client slot for a moment.
    let first = eventually_some(SOON, || async {
        let c = testkit::connect(&url).await.ok()?;
        c.simple_query("SELECT 1").await.ok().map(|_| c)
    })
    .await
    .expect("the first client gets in");

    // max_client_conn = 1: a second client is refused.
    let e = connect_error(&url).await;
    assert_eq!(sqlstate(&e), Some("53300"), "{e:?}");
    let message = e.as_db_error().map(|d| d.message().to_owned());
    assert!(
        message
            .as_deref()
            .unwrap_or("")
            .contains("too many clients"),
        "{e:?}"
    );

    // max_client_conn = 5: admitted, but pool_size = 1 makes it wait and time out.
    write_config(&config, 5, 1);
    process.signal(libc::SIGHUP).unwrap();
    assert_eventually(
        SOON,
        "the second client is admitted, then waits",
        || async {
            match tokio_postgres::connect(&url, NoTls).await {
                Err(e) => e
                    .as_db_error()
                    .is_some_and(|d| d.message().contains("query_wait_timeout")),
                Ok(_) => false,
            }
        },
    )
    .await;

    // pool_size = 2: it gets a server connection.
    write_config(&config, 5, 2);
    process.signal(libc::SIGHUP).unwrap();
    let second = eventually_some(SOON, || async {
        let c = testkit::connect(&url).await.ok()?;
        c.simple_query("SELECT 1").await.ok().map(|_| c)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the second client never got in; stderr:\n{}",
            process.stderr_contents()
        )
    });
    let log = process.stderr_contents();
    assert!(log.contains("configuration reloaded"), "{log}");

    // SIGTERM with two idle sessions and a client that never sent a startup packet: a clean
    // exit once shutdown_timeout (2 s) is over.
    let silent = tokio::net::TcpStream::connect(process.addr())
        .await
        .unwrap();
    process.signal(libc::SIGTERM).unwrap();
    let status = process
        .wait_exit(Duration::from_secs(8))
        .await
        .unwrap_or_else(|| {
            panic!(
                "no exit after SIGTERM; stderr:\n{}",
                process.stderr_contents()
            )
        });
    assert!(
        status.success(),
        "{status}; stderr:\n{}",
        process.stderr_contents()
    );
    assert!(first.simple_query("SELECT 1").await.is_err());
    assert!(second.simple_query("SELECT 1").await.is_err());
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_is_not_held_up_by_a_client_that_never_logs_in() {
    let pgmemo = local_pgmemo(1, |c| {
        c.shutdown_timeout = seconds(Duration::from_secs(1));
    })
    .await;
    // A client that connects and never sends its startup packet (a TCP health check, a
    // stuck client): it has no transaction to finish.
    let silent = tokio::net::TcpStream::connect(pgmemo.addr()).await.unwrap();
    let shared = pgmemo.handle().shared().clone();
    assert_eventually(SOON, "the silent client is admitted", || {
        let shared = shared.clone();
        async move { shared.client_count() == 1 }
    })
    .await;
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(8), pgmemo.shutdown())
        .await
        .unwrap_or_else(|_| panic!("shutdown still waits after {:?}", started.elapsed()));
    drop(silent);
}

#[tokio::test]
async fn a_reloaded_smaller_pool_size_holds_once_busy_leases_end() {
    let pgmemo = local_pgmemo(2, |c| {
        c.query_wait_timeout = seconds(Duration::from_millis(500));
    })
    .await;
    let url = pgmemo.url(USER, DB);
    let a = pgmemo.client(USER, DB).await;
    let b = pgmemo.client(USER, DB).await;
    backend_pid(&a).await;
    backend_pid(&b).await;

    // Shrink while both places are in use.
    let mut config = (**pgmemo.handle().shared().config()).clone();
    config.pool_size = 1;
    pgmemo.handle().reload(config).unwrap();
    drop(a);
    drop(b);

    // Once the busy leases ended, the pool has one place: a second session times out.
    let first = eventually_some(SOON, || async {
        let c = pgmemo.try_client(USER, DB).await.ok()?;
        c.simple_query("SELECT 1").await.ok().map(|_| c)
    })
    .await
    .expect("a client gets in after the reload");
    let e = connect_error(&url).await;
    assert_eq!(sqlstate(&e), Some("53300"), "{e:?}");

    // Growing again, with a lease in use, gives exactly the new size: three sessions at once,
    // not a fourth.
    let mut config = (**pgmemo.handle().shared().config()).clone();
    config.pool_size = 3;
    pgmemo.handle().reload(config).unwrap();
    let second = pgmemo.client(USER, DB).await;
    let third = pgmemo.client(USER, DB).await;
    let e = connect_error(&url).await;
    assert_eq!(sqlstate(&e), Some("53300"), "{e:?}");
    for c in [&first, &second, &third] {
        c.simple_query("SELECT 1").await.unwrap();
    }
    drop((first, second, third));
    pgmemo.shutdown().await;
}

/// A reload that shrinks `pool_size` closes the connections over the new size: idle ones at
/// the pool's next login, busy ones when their clients give them back (in both pooling
/// modes), instead of keeping them open until `server_idle_timeout`.
#[tokio::test]
async fn a_reloaded_smaller_pool_size_closes_the_connections_over_it() {
    use pgmemo::config::PoolMode;
    let direct = LocalPostgres.client(USER, DB).await;
    for mode in [PoolMode::Session, PoolMode::Transaction] {
        let pgmemo = local_pgmemo(4, |c| {
            c.pool_mode = mode;
            c.query_wait_timeout = seconds(Duration::from_millis(500));
        })
        .await;
        let pool_counts = || pgmemo.handle().shared().pools.all()[0].counts();
        // Four servers, two of them left idle and two held by clients in a transaction.
        let mut clients = Vec::new();
        let mut pids = Vec::new();
        for _ in 0..4 {
            let c = pgmemo.client(USER, DB).await;
            c.batch_execute("BEGIN").await.unwrap();
            pids.push(backend_pid(&c).await);
            clients.push(c);
        }
        let busy: Vec<Client> = clients.drain(2..).collect();
        for c in &clients {
            c.batch_execute("COMMIT").await.unwrap();
        }
        drop(clients);
        assert_eventually(SOON, "two servers idle", || async {
            pool_counts() == (2, 4)
        })
        .await;

        let mut config = (**pgmemo.handle().shared().config()).clone();
        config.pool_size = 1;
        pgmemo.handle().reload(config).unwrap();
        // A login applies the new size: both idle servers are over it. (In session pooling
        // the login then waits for a place, which the two busy clients hold, and times out.)
        let newcomer = pgmemo.try_client(USER, DB).await;
        assert_eventually(SOON, "the idle servers closed", || async {
            !backend_exists(&direct, pids[0]).await && !backend_exists(&direct, pids[1]).await
        })
        .await;
        drop(newcomer);
        // The busy ones: the first given back is over the size, the second is kept.
        for c in &busy {
            c.batch_execute("COMMIT").await.unwrap();
        }
        drop(busy);
        assert_eventually(SOON, "one server left, idle", || async {
            pool_counts() == (1, 1)
        })
        .await;
        assert_eventually(SOON, "its backend the only one left", || async {
            let left = [
                backend_exists(&direct, pids[2]).await,
                backend_exists(&direct, pids[3]).await,
            ];
            left.iter().filter(|&&b| b).count() == 1
        })
        .await;
        pgmemo.shutdown().await;
    }
}

/// An upstream that accepts connections and then says nothing does not hold a client's login
/// longer than `server_connect_timeout` (which covers the server's answers to the startup
/// message, not only the TCP connect): the client gets a connection error (08006).
#[tokio::test]
async fn a_silent_upstream_fails_logins_after_server_connect_timeout() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    // Accepts and keeps every connection open without a word.
    let held = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            sockets.push(s);
        }
    });
    let pgmemo = pgmemo_for(port, 2, |c| {
        c.server_connect_timeout = seconds(Duration::from_millis(500));
    })
    .await;
    let started = Instant::now();
    let e = connect_error(&pgmemo.url(USER, DB)).await;
    let waited = started.elapsed();
    assert_eq!(sqlstate(&e), Some("08006"), "{e:?}");
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    held.abort();
}

/// A server connection given back with bytes the server sent that nobody consumed (a client
/// gone while its answer was being written to it) is closed, whichever way it goes back: the
/// next client would get those bytes as the answer to its own first request, or, after a
/// reset, the reset's answer.
#[tokio::test]
async fn a_connection_with_unconsumed_server_bytes_is_not_pooled() {
    use pgmemo::pool::{PoolKey, Pools, ReleaseState, ServerConn, ServerCredential};
    use wire::backend::TransactionStatus;
    let key = PoolKey {
        host: "127.0.0.1".into(),
        port: LocalPostgres::PORT,
        database: DB.into(),
        user: USER.into(),
        alias: DB.into(),
    };
    let pools = Pools::default();
    let pool = pools.get(&key, 1, 0);
    let settings = pgmemo::pool::PoolSettings {
        server_lifetime: Duration::from_secs(3600),
        server_idle_timeout: Duration::from_secs(600),
        server_check_delay: Duration::from_secs(30),
        server_check_query: "SELECT 1".into(),
        server_check_timeout: Duration::from_secs(5),
        server_reset_query: "DISCARD ALL".into(),
    };
    for transaction_pooling in [true, false] {
        let mut lease = pool.acquire(SOON).await.unwrap();
        lease.reserve_new();
        let startup = [
            ("user".to_owned(), USER.to_owned()),
            ("database".to_owned(), DB.to_owned()),
        ];
        let keepalive = pgmemo::net::TcpKeepalive::default();
        let mut conn = ServerConn::open(
            "127.0.0.1",
            LocalPostgres::PORT,
            None,
            &startup,
            0,
            &keepalive,
        )
        .await
        .unwrap();
        conn.authenticate(USER, &ServerCredential::None)
            .await
            .unwrap();
        conn.finish_startup().await.unwrap();
        // An answer read from the socket but not relayed.
        conn.read_buf
            .extend_from_slice(b"C\0\0\0\x0dSELECT 1\0Z\0\0\0\x05I");
        assert_eq!(pool.counts(), (0, 1));
        if transaction_pooling {
            lease.return_idle(conn, true);
        } else {
            lease.release(
                conn,
                ReleaseState::Boundary(TransactionStatus::Idle),
                settings.clone(),
            );
        }
        let what = format!("closed, not pooled (transaction pooling: {transaction_pooling})");
        assert_eventually(SOON, &what, || async { pool.counts() == (0, 0) }).await;
    }
}

/// A client that stops reading in the middle of a large result blocks its session in a
/// write that no signal can interrupt; shutdown still ends shortly after `shutdown_timeout`
/// instead of waiting for that client for ever. Both pool modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_for_a_client_that_stopped_reading() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for mode in [
        pgmemo::config::PoolMode::Session,
        pgmemo::config::PoolMode::Transaction,
    ] {
        let pgmemo = local_pgmemo(2, |c| {
            c.pool_mode = mode;
            c.shutdown_timeout = seconds(Duration::from_secs(1));
        })
        .await;
        let mut socket = tokio::net::TcpStream::connect(pgmemo.addr()).await.unwrap();
        let startup = wire::startup::StartupMessage::encode([("user", USER), ("database", DB)]);
        socket.write_all(&startup).await.unwrap();
        // Read the login answer up to its ReadyForQuery, then ask for ~200 MB and read
        // nothing more.
        let mut seen = Vec::new();
        while !seen.ends_with(b"Z\0\0\0\x05I") {
            let mut chunk = [0u8; 4096];
            let n = socket.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed during login");
            seen.extend_from_slice(&chunk[..n]);
        }
        let sql = "SELECT repeat('x', 1000) FROM generate_series(1, 200000)";
        socket.write_all(&wire::frontend::query(sql)).await.unwrap();
        // The server waits for pgmemo to take more: pgmemo's writes to the client block.
        let direct = LocalPostgres.client(USER, DB).await;
        assert_eventually(SOON, "the result fills every buffer", || async {
            direct
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT repeat(''x'', 1000)%' AND wait_event = 'ClientWrite'",
                    &[],
                )
                .await
                .map(|r| r.get::<_, i64>(0) == 1)
                .unwrap_or(false)
        })
        .await;
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(8), pgmemo.shutdown())
            .await
            .unwrap_or_else(|_| panic!("{mode:?}: shutdown waits for a client that does not read"));
        assert!(started.elapsed() >= Duration::from_millis(900), "{mode:?}");
        drop(socket);
    }
}

/// Sends `signal` to a process by PID (`kill -SIG pid`).
fn signal_process(pid: i32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Resumes a stopped backend however the test ends.
struct Stopped(i32);

impl Drop for Stopped {
    fn drop(&mut self) {
        signal_process(self.0, "CONT");
    }
}

/// A pooled connection whose backend hangs (here stopped with SIGSTOP: the socket stays
/// open and silent, as behind a network partition) fails its health check after
/// `server_connect_timeout` instead of holding the client until TCP gives up; the client's
/// query runs on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_check_without_answer_closes_the_connection_in_time() {
    let pgmemo = local_pgmemo(1, |c| {
        c.pool_mode = pgmemo::config::PoolMode::Transaction;
        c.server_check_delay = seconds(Duration::ZERO);
        c.server_connect_timeout = seconds(Duration::from_secs(1));
    })
    .await;
    let c = pgmemo.client(USER, DB).await;
    let pid = backend_pid(&c).await;
    let _stopped = Stopped(pid);
    signal_process(pid, "STOP");
    let started = Instant::now();
    let other = tokio::time::timeout(SOON, backend_pid(&c))
        .await
        .expect("the health check of a hung server never gave up");
    assert_ne!(other, pid, "a new connection serves the query");
    assert!(started.elapsed() >= Duration::from_millis(900));
}

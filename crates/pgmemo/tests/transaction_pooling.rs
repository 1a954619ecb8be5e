//! Transaction pooling (`pool_mode = "transaction"`) end to end with tokio-postgres (the raw
//! protocol, psql, pgbench and the Python drivers are in `transaction_drivers.rs`): a client
//! holds a server connection only from the first message of a transaction (or autocommit
//! statement) to ReadyForQuery Idle, yet keeps its own prepared statements (protocol and SQL
//! level), its own session settings, and clear errors for the session-only features
//! transaction pooling cannot offer.
//!
//! Most tests use `pool_size` 1 or 2 so that clients provably share (or are moved between)
//! server connections; `pg_backend_pid()` shows which backend served a statement. Tests run
//! against the shared local server with uniquely named objects, except the many-clients test,
//! which gets a cluster with a small `max_connections` of its own.

mod txn_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use pgmemo::config::{Seconds, Switch};
use testkit::{
    connect_watched, pg_sleep_running, rows, sqlstate, unique, within, LocalPostgres, TempPostgres,
};
use tokio_postgres::{Client, NoTls, Statement};
use txn_support::{
    backend_pid, connect_with, create_table, create_tenants, db_message, drop_table, drop_tenants,
    evicting_pgmemo, query_error, txn_pgmemo, value, DB, SOON, TEST_DEADLINE, USER,
};

/// What a fresh session on the local server shows for a setting.
async fn default_setting(name: &str) -> String {
    let direct = LocalPostgres.client(USER, DB).await;
    value(&direct, &format!("SHOW {name}")).await
}

/// Opens a transaction and returns the backend it holds.
async fn hold(client: &Client) -> i32 {
    client.batch_execute("BEGIN").await.unwrap();
    backend_pid(client).await
}

/// A client gets the server it had last whenever that one is idle, even when another server
/// was returned more recently (which it would get otherwise).
#[tokio::test]
async fn a_client_gets_its_last_server_back_when_it_is_idle() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |_| {}).await;
        let a = pgmemo.client(USER, DB).await;
        let c = pgmemo.client(USER, DB).await;
        let first = backend_pid(&a).await;
        // C holds the only idle server, so A's next statement opens the second one.
        assert_eq!(hold(&c).await, first);
        let own = backend_pid(&a).await;
        assert_ne!(own, first);
        // C gives its server back after A: that one is now the most recently returned.
        c.batch_execute("COMMIT").await.unwrap();
        for _ in 0..3 {
            assert_eq!(
                backend_pid(&a).await,
                own,
                "A was moved off its idle server"
            );
        }
        pgmemo.shutdown().await;
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Prepared statements with tokio-postgres.

#[tokio::test]
async fn a_statement_prepared_on_one_server_runs_on_another() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |_| {}).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        let c = pgmemo.client(USER, DB).await;
        let st = a
            .prepare("SELECT $1::int + 1, pg_backend_pid()")
            .await
            .unwrap();
        let run = |n: i32| {
            let (a, st) = (&a, &st);
            async move {
                let row = a.query_one(st, &[&n]).await.unwrap();
                assert_eq!(row.get::<_, i32>(0), n + 1);
                row.get::<_, i32>(1)
            }
        };

        // B holds one server: A's statement runs on the other.
        let held_by_b = hold(&b).await;
        let first = run(1).await;
        assert_ne!(first, held_by_b, "A ran on the server B holds");
        // C takes the server A just used, B gives its own back: A must move there.
        assert_eq!(hold(&c).await, first, "C did not get the only free server");
        b.batch_execute("COMMIT").await.unwrap();
        let second = run(2).await;
        assert_eq!(second, held_by_b, "A did not move to the other server");
        c.batch_execute("COMMIT").await.unwrap();

        // A statement prepared while the other server is held, then run on each server.
        let held_by_c = hold(&c).await;
        let st2 = a.prepare("SELECT $1::text || '!'").await.unwrap();
        assert_ne!(hold(&b).await, held_by_c, "B did not get the free server");
        c.batch_execute("COMMIT").await.unwrap();
        let got: String = a.query_one(&st2, &[&"moved"]).await.unwrap().get(0);
        assert_eq!(got, "moved!");
        assert_eq!(run(3).await, held_by_c);
        b.batch_execute("COMMIT").await.unwrap();
        for n in 4..10 {
            run(n).await;
            let got: String = a.query_one(&st2, &[&"again"]).await.unwrap().get(0);
            assert_eq!(got, "again!");
        }
        pgmemo.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn pipelined_requests_of_two_clients_share_one_server() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        let sa = a.prepare("SELECT $1::int * 2").await.unwrap();
        let sb = b.prepare("SELECT $1::int * 3").await.unwrap();
        // tokio-postgres sends concurrent requests of one client without waiting (pipelining).
        let (a, b, sa, sb) = (&a, &b, &sa, &sb);
        let runs_a = (0..50).map(|i: i32| async move {
            let row = a.query_one(sa, &[&i]).await.unwrap();
            assert_eq!(row.get::<_, i32>(0), i * 2);
        });
        let runs_b = (0..50).map(|i: i32| async move {
            let row = b.query_one(sb, &[&i]).await.unwrap();
            assert_eq!(row.get::<_, i32>(0), i * 3);
        });
        futures_util::future::join(
            futures_util::future::join_all(runs_a),
            futures_util::future::join_all(runs_b),
        )
        .await;
        pgmemo.shutdown().await;
    })
    .await
}

async fn get(client: &Client, st: &Statement) -> Result<String, tokio_postgres::Error> {
    client.query_one(st, &[]).await.map(|r| r.get(0))
}

#[tokio::test]
async fn deallocate_all_and_discard_all_act_on_the_client_only() {
    within(TEST_DEADLINE, async {
        let default_timeout = default_setting("statement_timeout").await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        let text = |c: &'static str| format!("SELECT '{c}'::text");
        let a_own = a.prepare(&text("a")).await.unwrap();
        let a_shared = a.prepare(&text("shared")).await.unwrap();
        let b_own = b.prepare(&text("b")).await.unwrap();
        let b_shared = b.prepare(&text("shared")).await.unwrap();

        a.batch_execute("DEALLOCATE ALL").await.unwrap();
        for st in [&a_own, &a_shared] {
            let e = get(&a, st).await.unwrap_err();
            assert_eq!(sqlstate(&e), Some("26000"), "{e:?}");
            assert!(db_message(&e).contains("does not exist"), "{e:?}");
        }
        assert_eq!(get(&b, &b_own).await.unwrap(), "b");
        assert_eq!(get(&b, &b_shared).await.unwrap(), "shared");
        let a_new = a.prepare(&text("shared")).await.unwrap();
        assert_eq!(get(&a, &a_new).await.unwrap(), "shared");

        // DISCARD ALL: statements and settings of A, not of B.
        a.batch_execute("SET statement_timeout = '5s'")
            .await
            .unwrap();
        b.batch_execute("SET statement_timeout = '7s'")
            .await
            .unwrap();
        assert_eq!(value(&a, "SHOW statement_timeout").await, "5s");
        // Refused inside a transaction block, which leaves everything as it was.
        a.batch_execute("BEGIN").await.unwrap();
        let e = query_error(&a, "DISCARD ALL").await;
        assert_eq!(sqlstate(&e), Some("25001"), "{e:?}");
        a.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(get(&a, &a_new).await.unwrap(), "shared");
        assert_eq!(value(&a, "SHOW statement_timeout").await, "5s");

        a.batch_execute("DISCARD ALL").await.unwrap();
        let e = get(&a, &a_new).await.unwrap_err();
        assert_eq!(sqlstate(&e), Some("26000"), "{e:?}");
        assert_eq!(
            value(&a, "SHOW statement_timeout").await,
            default_timeout,
            "DISCARD ALL kept A's setting"
        );
        assert_eq!(value(&b, "SHOW statement_timeout").await, "7s");
        assert_eq!(get(&b, &b_own).await.unwrap(), "b");
        assert_eq!(get(&b, &b_shared).await.unwrap(), "shared");
        pgmemo.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn sql_prepare_execute_deallocate_are_per_client() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        a.batch_execute("PREPARE q AS SELECT 'from a'::text")
            .await
            .unwrap();
        b.batch_execute("PREPARE q AS SELECT 'from b'::text")
            .await
            .unwrap();
        for _ in 0..3 {
            assert_eq!(value(&a, "EXECUTE q").await, "from a");
            assert_eq!(value(&b, "EXECUTE q").await, "from b");
        }
        let e = query_error(&a, "PREPARE q AS SELECT 1").await;
        assert_eq!(sqlstate(&e), Some("42P05"), "{e:?}");
        assert_eq!(db_message(&e), "prepared statement \"q\" already exists");
        assert_eq!(value(&a, "EXECUTE q").await, "from a");

        a.batch_execute("DEALLOCATE q").await.unwrap();
        let e = query_error(&a, "EXECUTE q").await;
        assert_eq!(sqlstate(&e), Some("26000"), "{e:?}");
        assert_eq!(db_message(&e), "prepared statement \"q\" does not exist");
        assert_eq!(value(&b, "EXECUTE q").await, "from b");

        // Parameters, several statements in one query, a transaction, folded identifiers.
        let got = a
            .simple_query("PREPARE q(int) AS SELECT $1 * 2; EXECUTE q(21)")
            .await
            .unwrap();
        assert_eq!(rows(&got), vec![vec![Some("42".to_owned())]]);
        let got = a.simple_query("BEGIN; EXECUTE q(5); COMMIT").await.unwrap();
        assert_eq!(rows(&got), vec![vec![Some("10".to_owned())]]);
        a.batch_execute("PREPARE Folded AS SELECT 'folded'")
            .await
            .unwrap();
        assert_eq!(value(&a, "EXECUTE folded").await, "folded");
        b.batch_execute("DEALLOCATE PREPARE q").await.unwrap();
        assert_eq!(value(&a, "EXECUTE q(1)").await, "2");
        let e = query_error(&b, "EXECUTE folded").await;
        assert_eq!(sqlstate(&e), Some("26000"), "{e:?}");
        pgmemo.shutdown().await;
    })
    .await
}

/// Errors pgmemo has the server raise in place of PostgreSQL's (an unknown or duplicate
/// name, in a simple query or as the unnamed statement of the extended protocol) read as
/// PostgreSQL's: same SQLSTATE and message, and no PL/pgSQL context line.
#[tokio::test]
async fn raised_errors_carry_no_context_of_pgmemos_own() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let direct = testkit::connect(&testkit::url("127.0.0.1", LocalPostgres::PORT, USER, DB))
            .await
            .unwrap();
        let proxied = pgmemo.client(USER, DB).await;
        for client in [&direct, &proxied] {
            client.batch_execute("PREPARE q AS SELECT 1").await.unwrap();
        }
        let fields = |e: tokio_postgres::Error| {
            let db = e.as_db_error().expect("a server error").clone();
            (
                db.code().code().to_owned(),
                db.message().to_owned(),
                db.where_().map(str::to_owned),
            )
        };
        for sql in ["EXECUTE nope", "DEALLOCATE nope", "PREPARE q AS SELECT 2"] {
            let mut seen = Vec::new();
            for client in [&direct, &proxied] {
                let by_query = client.simple_query(sql).await.map(|_| ()).unwrap_err();
                let unnamed = client.query_typed(sql, &[]).await.map(|_| ()).unwrap_err();
                seen.push((fields(by_query), fields(unnamed)));
            }
            assert_eq!(seen[0], seen[1], "{sql}: direct, then through pgmemo");
            assert_eq!(seen[1].0 .2, None, "{sql}: {:?}", seen[1]);
        }
        pgmemo.shutdown().await;
    })
    .await
}

/// `EXPLAIN EXECUTE` and `CREATE TABLE ... AS EXECUTE` run the client's own statement of
/// that name, as `EXECUTE` does, on whichever server they get.
#[tokio::test]
async fn explain_and_create_table_as_execute_run_the_clients_statement() {
    for cache in [Switch::Off, Switch::On] {
        explain_and_create_table_as_execute(cache).await;
    }
}

async fn explain_and_create_table_as_execute(cache: Switch) {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |c| c.cache = cache).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        a.batch_execute("PREPARE q(int) AS SELECT 'from a'::text AS v, $1 AS n")
            .await
            .unwrap();
        b.batch_execute("PREPARE q AS SELECT 'from b'::text AS v")
            .await
            .unwrap();
        let explained = |rows: Vec<tokio_postgres::SimpleQueryMessage>| -> String {
            rows.into_iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        let a_plan = explained(
            a.simple_query("EXPLAIN (VERBOSE, COSTS off) EXECUTE q(7)")
                .await
                .unwrap(),
        );
        assert!(a_plan.contains("from a"), "{a_plan}");
        // B's own statement, also on the server A prepared its statement on.
        hold(&a).await;
        let b_plan = explained(
            b.simple_query("EXPLAIN (VERBOSE, COSTS off) EXECUTE \"q\"")
                .await
                .unwrap(),
        );
        assert!(b_plan.contains("from b"), "{b_plan}");
        a.batch_execute("COMMIT").await.unwrap();

        let table = unique("txn_ctas_execute");
        a.batch_execute(&format!("CREATE TABLE {table} AS EXECUTE q(7)"))
            .await
            .unwrap();
        assert_eq!(
            value(&b, &format!("SELECT v || ' ' || n FROM {table}")).await,
            "from a 7"
        );
        drop_table(&table).await;
        // A name the client never prepared: PostgreSQL's own error.
        let e = query_error(&b, "EXPLAIN EXECUTE nothing").await;
        assert_eq!(sqlstate(&e), Some("26000"), "{e:?}");
        assert!(db_message(&e).contains("\"nothing\""), "{e:?}");
    })
    .await;
}

/// A statement prepared with SQL that calls `set_config` changes settings when it is
/// executed, which nothing in the `EXECUTE` says: the server is reset before another
/// client uses it.
#[tokio::test]
async fn settings_changed_by_an_executed_statement_do_not_leak() {
    for cache in [Switch::Off, Switch::On] {
        settings_changed_by_an_executed_statement(cache).await;
    }
}

async fn settings_changed_by_an_executed_statement(cache: Switch) {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| c.cache = cache).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        let path = value(&b, "SHOW search_path").await;
        a.batch_execute(
            "PREPARE setter AS SELECT pg_catalog.set_config('search_path', 'pg_catalog', false)",
        )
        .await
        .unwrap();
        a.batch_execute("EXECUTE setter").await.unwrap();
        assert_eq!(
            value(&b, "SHOW search_path").await,
            path,
            "B got A's search_path"
        );
    })
    .await;
}

/// A DO block that changes a setting, commits and then fails keeps the change on the server,
/// though its statement reports only the error: the server is reset before another client
/// uses it, in the simple and in the extended protocol.
#[tokio::test]
async fn settings_committed_by_a_statement_that_then_fails_do_not_leak() {
    for cache in [Switch::Off, Switch::On] {
        settings_committed_before_an_error(cache).await;
    }
}

async fn settings_committed_before_an_error(cache: Switch) {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| c.cache = cache).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        let work_mem = value(&b, "SHOW work_mem").await;
        let block = "DO $$BEGIN PERFORM pg_catalog.set_config('work_mem', '1234kB', false); \
                     COMMIT; RAISE EXCEPTION 'after the commit'; END$$";
        let simple = a.batch_execute(block).await.unwrap_err();
        assert!(
            format!("{simple:?}").contains("after the commit"),
            "{simple:?}"
        );
        assert_eq!(
            value(&b, "SHOW work_mem").await,
            work_mem,
            "B got A's work_mem (simple protocol, cache {cache:?})"
        );
        let extended = a.execute(block, &[]).await.unwrap_err();
        assert!(
            format!("{extended:?}").contains("after the commit"),
            "{extended:?}"
        );
        assert_eq!(
            value(&b, "SHOW work_mem").await,
            work_mem,
            "B got A's work_mem (extended protocol, cache {cache:?})"
        );
    })
    .await;
}

/// PREPARE TRANSACTION settles the transaction's settings as COMMIT does: the session keeps
/// them. After a ROLLBACK TO SAVEPOINT (or an error) earlier in the transaction, pgmemo used
/// to drop them, leaving a server it took for in step with the next client.
#[tokio::test]
async fn settings_kept_by_prepare_transaction_stay_with_their_client() {
    within(TEST_DEADLINE, async {
        let pg = testkit::TempPostgres::builder()
            .conf("max_prepared_transactions = 2")
            .start()
            .await
            .expect("cluster starts");
        let pgmemo = txn_pgmemo(pg.port(), 1, |c| c.cache = Switch::Off).await;
        let a = pgmemo.client(USER, "postgres").await;
        let b = pgmemo.client(USER, "postgres").await;
        let work_mem = value(&b, "SHOW work_mem").await;
        a.batch_execute(
            "BEGIN; SAVEPOINT s; ROLLBACK TO s; SET work_mem TO '1234kB'; \
             PREPARE TRANSACTION 'kept'",
        )
        .await
        .unwrap();
        assert_eq!(
            value(&b, "SHOW work_mem").await,
            work_mem,
            "B got A's work_mem"
        );
        assert_eq!(value(&a, "SHOW work_mem").await, "1234kB", "A lost its own");
        a.batch_execute("ROLLBACK PREPARED 'kept'").await.unwrap();
    })
    .await;
}

/// A FunctionCall message runs a function by OID, which pgmemo cannot read: the server is
/// reset before another client uses it, whatever the function changed.
#[tokio::test]
async fn settings_changed_through_a_function_call_message_do_not_leak() {
    use txn_support::{msg, Raw};
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| c.cache = Switch::Off).await;
        let b = pgmemo.client(USER, DB).await;
        let path = value(&b, "SHOW search_path").await;
        let mut a = Raw::login(pgmemo.port()).await;
        // set_config(text, text, boolean) is OID 2078.
        let got = a
            .exchange(&[msg::function_call(
                2078,
                &["search_path", "pg_catalog", "false"],
            )])
            .await;
        assert!(
            got.iter().any(|l| l.starts_with("FunctionCallResponse")),
            "{got:?}"
        );
        assert_eq!(
            value(&b, "SHOW search_path").await,
            path,
            "B got A's search_path"
        );
    })
    .await;
}

#[tokio::test]
async fn max_prepared_statements_bounds_each_server_and_statements_still_run() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| {
            c.max_prepared_statements = 2;
        })
        .await;
        let a = pgmemo.client(USER, DB).await;
        let mut statements = Vec::new();
        for i in 0..5 {
            let sql = format!("SELECT $1::int + {i}");
            statements.push(a.prepare(&sql).await.unwrap());
        }
        for round in 0..3 {
            for (i, st) in statements.iter().enumerate() {
                let got: i32 = a.query_one(st, &[&round]).await.unwrap().get(0);
                assert_eq!(got, round + i as i32);
            }
        }
        let on_server: i64 = value(&a, "SELECT count(*) FROM pg_prepared_statements")
            .await
            .parse()
            .unwrap();
        assert!(on_server <= 2, "the server holds {on_server} statements");
        pgmemo.shutdown().await;
    })
    .await
}

/// How many statements pgmemo has prepared on the server that runs `client`'s next query.
async fn pgmemo_statements(client: &Client) -> i64 {
    value(
        client,
        "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'pgmemo%'",
    )
    .await
    .parse()
    .unwrap()
}

/// The first column of the one row `statement` returns.
async fn first_int(client: &Client, statement: &Statement) -> i32 {
    client.query_one(statement, &[]).await.unwrap().get(0)
}

/// A schema per tenant: clients that prepared a statement under the same settings and then
/// switch `search_path` per request keep sharing one server statement, which the server
/// analyses again whenever the path resolves to other schemas (as PostgreSQL does with each
/// client's own), so every client reads its own tenant's table. A client that changes another
/// analysis setting (TimeZone) gets a copy of its own (`PreparedStatement::drifted_from`).
#[tokio::test]
async fn clients_that_only_switch_search_path_keep_sharing_a_statement() {
    within(TEST_DEADLINE, async {
        let tenants = create_tenants("t", "x").await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        let sql = "SELECT x FROM t";
        for client in [&a, &b] {
            client
                .batch_execute(&format!("SET search_path = {}", tenants[0]))
                .await
                .unwrap();
        }
        let on_a = a.prepare(sql).await.unwrap();
        let on_b = b.prepare(sql).await.unwrap();
        for round in 0..2 {
            for (client, st, tenant) in [(&a, &on_a, 1), (&b, &on_b, 0), (&a, &on_a, 0)] {
                client
                    .batch_execute(&format!("SET search_path = {}", tenants[tenant]))
                    .await
                    .unwrap();
                assert_eq!(first_int(client, st).await, tenant as i32, "round {round}");
            }
        }
        assert_eq!(
            pgmemo_statements(&a).await,
            1,
            "one statement shared by A and B"
        );
        a.batch_execute("SET TimeZone = 'Asia/Tokyo'")
            .await
            .unwrap();
        assert_eq!(first_int(&a, &on_a).await, 0);
        assert_eq!(first_int(&b, &on_b).await, 0);
        assert_eq!(pgmemo_statements(&a).await, 2, "A runs a copy of its own");
        pgmemo.shutdown().await;
        drop_tenants(&tenants).await;
    })
    .await
}

/// PostgreSQL reads a statement's literals once, when it prepares it, and keeps that reading
/// after a `SET TimeZone`: a statement pgmemo prepares again on a server that lacks it (here
/// evicted by `max_prepared_statements`) after such a `SET` must read its literals as when the
/// client prepared it, for a protocol-level and an SQL-level statement alike, while the
/// client's session keeps its new setting.
#[tokio::test]
async fn a_statement_prepared_again_reads_its_literals_under_the_settings_it_was_prepared_with() {
    prepared_again_under_its_settings(Switch::Off).await;
    prepared_again_under_its_settings(Switch::On).await;
}

async fn prepared_again_under_its_settings(cache: Switch) {
    within(TEST_DEADLINE, async {
        let pgmemo = evicting_pgmemo(cache).await;
        let direct = LocalPostgres.client(USER, DB).await;
        let through = pgmemo.client(USER, DB).await;
        let literal = "SELECT extract(epoch FROM '2024-01-01 00:00'::timestamptz)::int8";
        let (utc, new_york) = (1_704_067_200_i64, 1_704_085_200_i64);
        for (client, via) in [(&direct, "directly"), (&through, "through pgmemo")] {
            client.batch_execute("SET TimeZone = 'UTC'").await.unwrap();
            let st = client.prepare(literal).await.unwrap();
            client
                .batch_execute(&format!("PREPARE lit AS {literal}"))
                .await
                .unwrap();
            client
                .batch_execute("SET TimeZone = 'America/New_York'")
                .await
                .unwrap();
            let other = client.prepare("SELECT 2").await.unwrap();
            client.query_one(&other, &[]).await.unwrap();
            let got: i64 = client.query_one(&st, &[]).await.unwrap().get(0);
            assert_eq!(got, utc, "protocol-level statement {via}");
            client.query_one(&other, &[]).await.unwrap();
            assert_eq!(
                value(client, "EXECUTE lit").await,
                utc.to_string(),
                "SQL-level statement {via}"
            );
            assert_eq!(
                value(client, "SHOW TimeZone").await,
                "America/New_York",
                "{via}"
            );
            let now: i64 = client.query_one(literal, &[]).await.unwrap().get(0);
            assert_eq!(now, new_york, "a statement parsed now {via}");
            let got: i64 = client.query_one(&st, &[]).await.unwrap().get(0);
            assert_eq!(got, utc, "protocol-level statement again {via}");
            // Inside a transaction block, and with a Query in the same block after it.
            client.batch_execute("BEGIN").await.unwrap();
            client.query_one(&other, &[]).await.unwrap();
            let got: i64 = client.query_one(&st, &[]).await.unwrap().get(0);
            assert_eq!(got, utc, "protocol-level statement in a block {via}");
            assert_eq!(
                value(client, "SHOW TimeZone").await,
                "America/New_York",
                "in a block {via}"
            );
            client.batch_execute("COMMIT").await.unwrap();
        }
        assert_next_client_has_the_default_time_zone(&pgmemo).await;
        pgmemo.shutdown().await;
    })
    .await
}

/// Nothing pgmemo set around preparing a statement again stays on the server: the next
/// client finds the server's default TimeZone.
async fn assert_next_client_has_the_default_time_zone(pgmemo: &testkit::PgmemoInstance) {
    let next = pgmemo.client(USER, DB).await;
    assert_eq!(
        value(&next, "SHOW TimeZone").await,
        default_setting("TimeZone").await
    );
}

/// When a statement pgmemo prepares again under its first settings cannot be prepared (its
/// table is gone), the client gets PostgreSQL's error, in a block or not, and keeps its own
/// settings; the next client gets none of them.
#[tokio::test]
async fn a_statement_that_cannot_be_prepared_again_leaves_the_clients_settings_alone() {
    within(TEST_DEADLINE, async {
        let pgmemo = evicting_pgmemo(Switch::Off).await;
        let direct = LocalPostgres.client(USER, DB).await;
        let through = pgmemo.client(USER, DB).await;
        for (client, via) in [(&direct, "directly"), (&through, "through pgmemo")] {
            let t = create_table("gone", "(x int)").await;
            client.batch_execute("SET TimeZone = 'UTC'").await.unwrap();
            let st = client
                .prepare(&format!("SELECT x, '2024-01-01'::timestamptz FROM {t}"))
                .await
                .unwrap();
            client
                .batch_execute("SET TimeZone = 'America/New_York'")
                .await
                .unwrap();
            drop_table(&t).await;
            let other = client.prepare("SELECT 2").await.unwrap();
            client.query_one(&other, &[]).await.unwrap();
            client.batch_execute("BEGIN").await.unwrap();
            let e = client.query(&st, &[]).await.unwrap_err();
            assert_eq!(sqlstate(&e), Some("42P01"), "in a block {via}: {e:?}");
            client.batch_execute("ROLLBACK").await.unwrap();
            let e = client.query(&st, &[]).await.unwrap_err();
            assert_eq!(sqlstate(&e), Some("42P01"), "{via}: {e:?}");
            assert_eq!(
                value(client, "SHOW TimeZone").await,
                "America/New_York",
                "{via}"
            );
        }
        assert_next_client_has_the_default_time_zone(&pgmemo).await;
        pgmemo.shutdown().await;
    })
    .await
}

/// `DO` and `CALL` run code that may `SET` (persisting once the transaction commits), which
/// pgmemo cannot follow: the server they ran on is reset before its next use, so the setting
/// never reaches the next client.
#[tokio::test]
async fn settings_changed_inside_do_or_call_do_not_leak_to_other_clients() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| c.cache = Switch::Off).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        let app_name = value(&a, "SHOW application_name").await;
        b.batch_execute("DO $$BEGIN SET application_name = 'from_do'; END$$")
            .await
            .unwrap();
        assert_eq!(value(&a, "SHOW application_name").await, app_name);
        let proc = unique("txn_proc");
        b.batch_execute(&format!(
            "CREATE PROCEDURE {proc}() LANGUAGE plpgsql AS $$BEGIN SET TimeZone = 'Asia/Tokyo'; END$$"
        ))
        .await
        .unwrap();
        let zone = value(&a, "SHOW TimeZone").await;
        b.batch_execute(&format!("CALL {proc}()")).await.unwrap();
        assert_eq!(value(&a, "SHOW TimeZone").await, zone);
        b.batch_execute(&format!("DROP PROCEDURE {proc}"))
            .await
            .unwrap();

        // Nor do the advisory locks and temporary tables such code leaves behind.
        let key: i64 = 7_000_000 + i64::from(std::process::id());
        let temp = unique("txn_do_temp");
        b.batch_execute(&format!(
            "DO $$BEGIN PERFORM pg_advisory_lock({key}); CREATE TEMP TABLE {temp} (x int); END$$"
        ))
        .await
        .unwrap();
        assert_eq!(
            value(&a, &format!("SELECT to_regclass('{temp}') IS NULL")).await,
            "t",
            "the temporary table was dropped before the next client"
        );
        let direct = LocalPostgres.client(USER, DB).await;
        assert_eq!(
            value(&direct, &format!("SELECT pg_try_advisory_lock({key})")).await,
            "t",
            "the advisory lock was released"
        );
        direct
            .batch_execute(&format!("SELECT pg_advisory_unlock({key})"))
            .await
            .unwrap();
    })
    .await;
}

/// A function called from a query can change settings for the session (`set_config(...,
/// false)`, or `SET` through `EXECUTE`), and nothing in the query's text says so. The server
/// reports the reported settings' new values (ParameterStatus): pgmemo resets that server
/// before another client uses it, and keeps the values the client was told of as its own, so
/// they follow it to other servers as its `SET`s would. A rolled-back change is dropped.
#[tokio::test]
async fn settings_changed_by_a_function_in_a_query_stay_with_their_client() {
    within(TEST_DEADLINE, async {
        // The cache off: only what the server reports can tell pgmemo.
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| c.cache = Switch::Off).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        let setter = unique("txn_setter");
        a.batch_execute(&format!(
            "CREATE FUNCTION {setter}(zone text, app text) RETURNS int LANGUAGE plpgsql AS $$\
             BEGIN PERFORM set_config('TimeZone', zone, false); \
             EXECUTE format('SET application_name = %L', app); RETURN 1; END$$"
        ))
        .await
        .unwrap();
        let zone = value(&b, "SHOW TimeZone").await;
        let app = value(&b, "SHOW application_name").await;

        value(&a, &format!("SELECT {setter}('Asia/Tokyo', 'from_fn')")).await;
        assert_eq!(value(&b, "SHOW TimeZone").await, zone, "B got A's TimeZone");
        assert_eq!(value(&b, "SHOW application_name").await, app);
        assert_eq!(value(&a, "SHOW TimeZone").await, "Asia/Tokyo");
        assert_eq!(value(&a, "SHOW application_name").await, "from_fn");

        // In a block: the change holds for the rest of the block (its SET LOCALs too), and a
        // rollback takes it back.
        a.batch_execute(&format!(
            "BEGIN; SET LOCAL DateStyle = 'SQL, DMY'; SELECT {setter}('Europe/Paris', 'in_block')"
        ))
        .await
        .unwrap();
        assert_eq!(
            value(
                &a,
                "SELECT current_setting('TimeZone') || ' ' || current_setting('DateStyle')"
            )
            .await,
            "Europe/Paris SQL, DMY"
        );
        a.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(value(&b, "SHOW TimeZone").await, zone);
        assert_eq!(value(&a, "SHOW TimeZone").await, "Asia/Tokyo");
        assert_eq!(value(&a, "SHOW application_name").await, "from_fn");

        // The same through the extended protocol.
        let st = a
            .prepare(&format!("SELECT {setter}($1, $2)"))
            .await
            .unwrap();
        a.query(&st, &[&"America/Lima", &"extended"]).await.unwrap();
        assert_eq!(value(&b, "SHOW TimeZone").await, zone);
        assert_eq!(value(&a, "SHOW TimeZone").await, "America/Lima");

        a.batch_execute(&format!("DROP FUNCTION {setter}"))
            .await
            .unwrap();
        pgmemo.shutdown().await;
    })
    .await;
}

/// With the cache on, pgmemo knows from the catalog which statements call volatile
/// user-defined functions, which may change settings the server does not report
/// (`search_path` before PostgreSQL 18): the server is reset before another client uses it.
#[tokio::test]
async fn unreported_settings_changed_by_a_function_do_not_leak_with_the_cache_on() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        let setter = unique("txn_path_setter");
        a.batch_execute(&format!(
            "CREATE FUNCTION {setter}() RETURNS int LANGUAGE plpgsql AS $$\
             BEGIN PERFORM set_config('search_path', 'txn_nowhere', false); \
             PERFORM set_config('work_mem', '7MB', false); RETURN 1; END$$"
        ))
        .await
        .unwrap();
        let path = value(&b, "SHOW search_path").await;
        let work_mem = value(&b, "SHOW work_mem").await;
        value(&a, &format!("SELECT {setter}()")).await;
        assert_eq!(value(&b, "SHOW search_path").await, path);
        assert_eq!(value(&b, "SHOW work_mem").await, work_mem);
        a.batch_execute(&format!("DROP FUNCTION public.{setter}"))
            .await
            .unwrap();
        pgmemo.shutdown().await;
    })
    .await;
}

/// `SET ROLE` run by code pgmemo cannot see into (here a `DO` block) outlives `RESET ALL`:
/// the reset of that server also returns it to the user it logged in as.
#[tokio::test]
async fn a_role_set_by_hidden_code_does_not_reach_the_next_client() {
    within(TEST_DEADLINE, async {
        let role = unique("txn_hidden_role");
        let direct = LocalPostgres.client(USER, DB).await;
        direct
            .batch_execute(&format!("CREATE ROLE {role}"))
            .await
            .unwrap();
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| c.cache = Switch::Off).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        a.batch_execute(&format!(
            "DO $$BEGIN EXECUTE 'SET ROLE {role}'; EXECUTE 'SET SESSION AUTHORIZATION {role}'; END$$"
        ))
        .await
        .unwrap();
        assert_eq!(
            value(&b, "SELECT current_user || ' ' || session_user").await,
            format!("{USER} {USER}")
        );
        pgmemo.shutdown().await;
        direct
            .batch_execute(&format!("DROP ROLE {role}"))
            .await
            .unwrap();
    })
    .await;
}

/// Another client can drop every statement pgmemo prepared on a server it shares
/// (`DEALLOCATE ALL` inside `DO` reaches the server as is): the next execution on that server
/// prepares the statement again and runs, instead of failing with "does not exist".
#[tokio::test]
async fn a_statement_dropped_behind_pgmemos_back_is_prepared_again() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| c.cache = Switch::Off).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        let st = a.prepare("SELECT $1::int * 2").await.unwrap();
        assert_eq!(
            a.query_one(&st, &[&21i32]).await.unwrap().get::<_, i32>(0),
            42
        );
        b.batch_execute("DO $$BEGIN EXECUTE 'DEALLOCATE ALL'; END$$")
            .await
            .unwrap();
        let again = a.query_one(&st, &[&4i32]).await;
        assert_eq!(
            again
                .map(|r| r.get::<_, i32>(0))
                .map_err(|e| db_message(&e)),
            Ok(8)
        );
        // Inside a transaction block the statement fails once (the block is aborted, as
        // PostgreSQL would abort it) and runs again after it.
        a.query_one(&st, &[&1i32]).await.unwrap();
        b.batch_execute("DO $$BEGIN EXECUTE 'DEALLOCATE ALL'; END$$")
            .await
            .unwrap();
        a.batch_execute("BEGIN").await.unwrap();
        let in_block = a.query_one(&st, &[&5i32]).await;
        assert!(
            db_message(&in_block.unwrap_err()).contains("does not exist"),
            "the first use in the block reports the lost statement"
        );
        a.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(
            a.query_one(&st, &[&5i32]).await.unwrap().get::<_, i32>(0),
            10
        );
    })
    .await;
}

#[tokio::test]
async fn a_column_added_between_executions_shows_up_without_an_error() {
    within(TEST_DEADLINE, async {
        let t = create_table("txn_alter", "(id int, v text)").await;
        let direct = LocalPostgres.client(USER, DB).await;
        direct
            .batch_execute(&format!("INSERT INTO {t} VALUES (1, 'one')"))
            .await
            .unwrap();
        // The cache is off: the second ALTER TABLE is made directly, which pgmemo sees only
        // through the replication feed (not running here); this test is about plans.
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| c.cache = Switch::Off).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        let select = format!("SELECT * FROM {t}");
        let st = a.prepare(&select).await.unwrap();
        let row = a.query_one(&st, &[]).await.unwrap();
        assert_eq!(row.len(), 2);

        a.batch_execute(&format!("ALTER TABLE {t} ADD COLUMN c int DEFAULT 7"))
            .await
            .unwrap();
        // B prepares the same text on the same (only) server: the new shape.
        let row = b
            .query_one(&select, &[])
            .await
            .unwrap_or_else(|e| panic!("B after ALTER TABLE: {e:?}"));
        assert_eq!(row.len(), 3);
        assert_eq!(row.get::<_, i32>(2), 7);
        // A prepares again and gets the new shape too.
        for _ in 0..2 {
            let row = a
                .query_one(&select, &[])
                .await
                .unwrap_or_else(|e| panic!("A after ALTER TABLE: {e:?}"));
            assert_eq!(row.len(), 3);
            assert_eq!(row.get::<_, i32>(2), 7);
        }
        // Once more after a second change made directly.
        direct
            .batch_execute(&format!("ALTER TABLE {t} ADD COLUMN d text DEFAULT 'x'"))
            .await
            .unwrap();
        for client in [&a, &b] {
            let row = client.query_one(&select, &[]).await.unwrap();
            assert_eq!(row.len(), 4);
        }
        pgmemo.shutdown().await;
        drop_table(&t).await;
    })
    .await
}

/// The number of columns of the first row a simple query returns.
async fn columns(client: &Client, sql: &str) -> usize {
    let got = client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    rows(&got).first().map_or(0, Vec::len)
}

/// [`a_column_added_between_executions_shows_up_without_an_error`] with SQL-level statements:
/// a `PREPARE` after the change (by another client, or
/// by the same one after `DEALLOCATE`) gets the statement pgmemo prepared on the server before
/// it, whose plan is stale there, yet its `EXECUTE` shows the new columns, as after a
/// `PREPARE` on PostgreSQL. So does one after another client dropped pgmemo's statements
/// behind its back (`DEALLOCATE ALL` inside `DO`); inside a transaction block that one fails
/// once, as the Bind of a protocol-level statement does, and so does an `EXECUTE` after other
/// statements of its Query.
#[tokio::test]
async fn a_column_added_before_an_sql_prepare_shows_up_in_its_execute() {
    within(TEST_DEADLINE, async {
        let t = create_table("txn_alter_sql", "(id int, v text)").await;
        let direct = LocalPostgres.client(USER, DB).await;
        direct
            .batch_execute(&format!("INSERT INTO {t} VALUES (1, 'one')"))
            .await
            .unwrap();
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| c.cache = Switch::Off).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        let prepare = |name: &str| format!("PREPARE {name} AS SELECT * FROM {t}");
        a.batch_execute(&prepare("p")).await.unwrap();
        assert_eq!(columns(&a, "EXECUTE p").await, 2);

        a.batch_execute(&format!("ALTER TABLE {t} ADD COLUMN c int DEFAULT 7"))
            .await
            .unwrap();
        b.batch_execute(&prepare("q")).await.unwrap();
        assert_eq!(columns(&b, "EXECUTE q").await, 3, "B after ALTER TABLE");
        direct
            .batch_execute(&format!("ALTER TABLE {t} ADD COLUMN d text DEFAULT 'x'"))
            .await
            .unwrap();
        a.batch_execute("DEALLOCATE p").await.unwrap();
        a.batch_execute(&prepare("p")).await.unwrap();
        assert_eq!(columns(&a, "EXECUTE p").await, 4, "A prepared again");
        // An EXECUTE after other statements of its Query is not sent again (those ran): it may
        // fail, once.
        direct
            .batch_execute(&format!("ALTER TABLE {t} ADD COLUMN e int"))
            .await
            .unwrap();
        let again = format!("DEALLOCATE q; {}; EXECUTE q", prepare("q"));
        if let Err(e) = b.simple_query(&again).await {
            assert_eq!(sqlstate(&e), Some("0A000"), "{e:?}");
        }
        assert_eq!(columns(&b, "EXECUTE q").await, 5, "B prepared again");
        a.batch_execute(&format!("DEALLOCATE p; {}", prepare("p")))
            .await
            .unwrap();

        b.batch_execute("DO $$BEGIN EXECUTE 'DEALLOCATE ALL'; END$$")
            .await
            .unwrap();
        assert_eq!(columns(&a, "EXECUTE p").await, 5, "after DEALLOCATE ALL");
        b.batch_execute("DO $$BEGIN EXECUTE 'DEALLOCATE ALL'; END$$")
            .await
            .unwrap();
        a.batch_execute("BEGIN").await.unwrap();
        let e = query_error(&a, "EXECUTE p").await;
        assert!(db_message(&e).contains("does not exist"), "{e:?}");
        a.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(columns(&a, "EXECUTE p").await, 5, "after the block");
        pgmemo.shutdown().await;
        drop_table(&t).await;
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Session settings.

#[tokio::test]
async fn settings_stay_with_their_client_on_a_shared_server() {
    within(TEST_DEADLINE, async {
        let default_tz = default_setting("TimeZone").await;
        let default_path = default_setting("search_path").await;
        let default_timeout = default_setting("statement_timeout").await;
        let default_lock_timeout = default_setting("lock_timeout").await;
        let default_work_mem = default_setting("work_mem").await;
        let schema = unique("txn_schema");
        let direct = LocalPostgres.client(USER, DB).await;
        direct
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .unwrap();
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;

        a.batch_execute("SET TimeZone = 'Asia/Tokyo'")
            .await
            .unwrap();
        a.batch_execute(&format!("SET search_path = {schema}, public"))
            .await
            .unwrap();
        let expected_path = format!("{schema}, public");
        assert_eq!(value(&a, "SHOW TimeZone").await, "Asia/Tokyo");
        assert_eq!(backend_pid(&a).await, backend_pid(&b).await, "one server");
        assert_eq!(value(&b, "SHOW TimeZone").await, default_tz);
        assert_eq!(value(&b, "SHOW search_path").await, default_path);
        assert_eq!(value(&a, "SHOW TimeZone").await, "Asia/Tokyo");
        assert_eq!(value(&a, "SHOW search_path").await, expected_path);
        assert_eq!(value(&a, "SELECT current_schema()").await, schema);

        // Extended protocol SETs count too; B's own values do not reach A.
        a.execute("SET lock_timeout = '9s'", &[]).await.unwrap();
        b.batch_execute("SET TimeZone = 'America/New_York'")
            .await
            .unwrap();
        assert_eq!(value(&a, "SHOW lock_timeout").await, "9s");
        assert_eq!(value(&b, "SHOW lock_timeout").await, default_lock_timeout);
        assert_eq!(value(&a, "SHOW TimeZone").await, "Asia/Tokyo");
        assert_eq!(value(&b, "SHOW TimeZone").await, "America/New_York");

        a.batch_execute("RESET TimeZone").await.unwrap();
        assert_eq!(value(&a, "SHOW TimeZone").await, default_tz);
        assert_eq!(value(&a, "SHOW search_path").await, expected_path);
        assert_eq!(value(&b, "SHOW TimeZone").await, "America/New_York");
        a.batch_execute("RESET ALL").await.unwrap();
        assert_eq!(value(&a, "SHOW search_path").await, default_path);
        assert_eq!(value(&a, "SHOW lock_timeout").await, default_lock_timeout);
        assert_eq!(value(&b, "SHOW TimeZone").await, "America/New_York");

        // Transactions: rolled back SETs and SET LOCAL do not stay, committed SETs do.
        a.batch_execute("BEGIN; SET statement_timeout = '3s'; ROLLBACK")
            .await
            .unwrap();
        assert_eq!(value(&a, "SHOW statement_timeout").await, default_timeout);
        a.batch_execute("BEGIN; SET LOCAL statement_timeout = '4s'")
            .await
            .unwrap();
        assert_eq!(value(&a, "SHOW statement_timeout").await, "4s");
        a.batch_execute("COMMIT").await.unwrap();
        assert_eq!(value(&a, "SHOW statement_timeout").await, default_timeout);
        a.batch_execute("BEGIN; SET statement_timeout = '6s'; COMMIT")
            .await
            .unwrap();
        assert_eq!(value(&a, "SHOW statement_timeout").await, "6s");
        assert_eq!(value(&b, "SHOW statement_timeout").await, default_timeout);
        a.batch_execute("SET work_mem = '7MB'; SELECT 1")
            .await
            .unwrap();
        assert_eq!(value(&a, "SHOW work_mem").await, "7MB");
        assert_eq!(value(&b, "SHOW work_mem").await, default_work_mem);
        pgmemo.shutdown().await;
        direct
            .batch_execute(&format!("DROP SCHEMA {schema}"))
            .await
            .unwrap();
    })
    .await
}

/// "TimeZone search_path" as the client sees them, and the backend that answered.
async fn settings_and_pid(client: &Client) -> (String, i32) {
    let v = value(
        client,
        "SELECT current_setting('TimeZone') || ' ' || current_setting('search_path') \
         || ' ' || pg_backend_pid()",
    )
    .await;
    let (settings, pid) = v.rsplit_once(' ').unwrap();
    (settings.to_owned(), pid.parse().unwrap())
}

#[tokio::test]
async fn settings_follow_their_client_to_another_server() {
    within(TEST_DEADLINE, async {
        let default_tz = default_setting("TimeZone").await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |_| {}).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        let c = pgmemo.client(USER, DB).await;
        a.batch_execute("SET TimeZone = 'Asia/Tokyo'; SET search_path = txn_elsewhere, public")
            .await
            .unwrap();
        let mine = "Asia/Tokyo txn_elsewhere, public".to_owned();

        let held_by_b = hold(&b).await;
        let (settings, first) = settings_and_pid(&a).await;
        assert_eq!(settings, mine);
        assert_ne!(first, held_by_b);
        assert_eq!(hold(&c).await, first, "C did not get the free server");
        assert_eq!(
            value(&c, "SHOW TimeZone").await,
            default_tz,
            "C got A's TimeZone"
        );
        b.batch_execute("COMMIT").await.unwrap();
        let (settings, second) = settings_and_pid(&a).await;
        assert_eq!(second, held_by_b, "A did not move to the other server");
        assert_eq!(settings, mine);
        c.batch_execute("COMMIT").await.unwrap();
        for client in [&b, &c] {
            assert_eq!(value(client, "SHOW TimeZone").await, default_tz);
        }
        pgmemo.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn startup_parameters_stay_with_their_client() {
    within(TEST_DEADLINE, async {
        let default_path = default_setting("search_path").await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let url = pgmemo.url(USER, DB);
        let a = connect_with(&url, |c| {
            c.application_name("txn_app_a");
        })
        .await;
        let b = connect_with(&url, |c| {
            c.application_name("txn_app_b");
        })
        .await;
        let c = connect_with(&url, |c| {
            c.options("-c search_path=txn_opt_schema");
        })
        .await;
        assert_eq!(backend_pid(&a).await, backend_pid(&b).await, "one server");
        for _ in 0..2 {
            assert_eq!(value(&a, "SHOW application_name").await, "txn_app_a");
            assert_eq!(value(&b, "SHOW application_name").await, "txn_app_b");
            assert_eq!(value(&c, "SHOW search_path").await, "txn_opt_schema");
            assert_eq!(value(&a, "SHOW search_path").await, default_path);
        }
        b.batch_execute("SET application_name = 'txn_app_b2'")
            .await
            .unwrap();
        assert_eq!(value(&a, "SHOW application_name").await, "txn_app_a");
        assert_eq!(value(&b, "SHOW application_name").await, "txn_app_b2");
        // RESET goes back to the value given at connect time, as on a direct connection.
        b.batch_execute("RESET application_name").await.unwrap();
        assert_eq!(value(&b, "SHOW application_name").await, "txn_app_b");
        c.batch_execute("RESET ALL").await.unwrap();
        assert_eq!(value(&c, "SHOW search_path").await, "txn_opt_schema");
        // Also inside the transaction that resets (the server's own defaults are not the
        // client's), and for the other clients after it.
        b.batch_execute("SET application_name = 'txn_app_b3'")
            .await
            .unwrap();
        assert_eq!(
            value(&b, "RESET application_name; SHOW application_name").await,
            "txn_app_b"
        );
        assert_eq!(
            value(
                &c,
                "BEGIN; SET search_path = elsewhere; RESET ALL; SHOW search_path"
            )
            .await,
            "txn_opt_schema"
        );
        c.batch_execute("COMMIT").await.unwrap();
        assert_eq!(
            value(&b, "SET application_name TO DEFAULT; SHOW application_name").await,
            "txn_app_b"
        );
        // The extended protocol: the statement is rewritten in its Parse.
        b.batch_execute("SET application_name = 'txn_app_b4'")
            .await
            .unwrap();
        b.execute("RESET application_name", &[]).await.unwrap();
        assert_eq!(value(&b, "SHOW application_name").await, "txn_app_b");
        for _ in 0..2 {
            assert_eq!(value(&a, "SHOW application_name").await, "txn_app_a");
            assert_eq!(value(&a, "SHOW search_path").await, default_path);
            assert_eq!(value(&b, "SHOW application_name").await, "txn_app_b");
            assert_eq!(value(&c, "SHOW search_path").await, "txn_opt_schema");
        }
        pgmemo.shutdown().await;
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Session-only features, broken clients, timeouts, many clients.

/// Asserts a 0A000 error that names transaction pooling, then that the session still works
/// and is not inside a transaction.
async fn assert_refused(client: &Client, e: tokio_postgres::Error, what: &str) {
    assert_eq!(sqlstate(&e), Some("0A000"), "{what}: {e:?}");
    let message = db_message(&e).to_lowercase();
    assert!(message.contains("transaction"), "{what}: {message}");
    assert_eq!(value(client, "SELECT 1").await, "1", "after {what}");
    client
        .batch_execute("BEGIN; COMMIT")
        .await
        .unwrap_or_else(|e| panic!("after {what}: {e:?}"));
}

#[tokio::test]
async fn session_only_features_get_a_clear_error() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        let key: i64 = 7_000_000 + i64::from(std::process::id());
        for sql in [
            "LISTEN txn_channel".to_owned(),
            "DECLARE txn_cursor CURSOR WITH HOLD FOR SELECT 1".to_owned(),
            "CREATE TEMP TABLE txn_tt (a int)".to_owned(),
            "CREATE TEMPORARY TABLE txn_tt (a int)".to_owned(),
            format!("SELECT pg_advisory_lock({key})"),
            // Prepared for later: refused when prepared.
            format!("PREPARE txn_locker AS SELECT pg_advisory_lock({key})"),
            // Other objects of the temporary schema, and a search_path that creates there.
            "CREATE FUNCTION pg_temp.txn_f() RETURNS int LANGUAGE sql AS 'SELECT 1'".to_owned(),
            "CREATE DOMAIN pg_temp.txn_d AS int".to_owned(),
            "SET search_path = public, pg_temp".to_owned(),
            "SET LOCAL search_path TO pg_temp".to_owned(),
            "SET ROLE postgres".to_owned(),
            "SET SESSION AUTHORIZATION postgres".to_owned(),
        ] {
            let e = query_error(&a, &sql).await;
            assert_refused(&a, e, &sql).await;
        }
        // Through the extended protocol too (migration tools lock this way).
        let e = a
            .query_one("SELECT pg_advisory_lock($1)", &[&key])
            .await
            .unwrap_err();
        assert_refused(&a, e, "pg_advisory_lock($1)").await;

        // Their transaction-scoped counterparts work.
        let got = a
            .simple_query(
                "BEGIN; CREATE TEMP TABLE txn_tt2 (a int) ON COMMIT DROP; \
                 INSERT INTO txn_tt2 VALUES (1), (2); SELECT count(*) FROM txn_tt2; COMMIT",
            )
            .await
            .unwrap();
        assert_eq!(rows(&got), vec![vec![Some("2".to_owned())]]);
        let got = a
            .simple_query(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock({key}); \
                 DECLARE c CURSOR FOR SELECT generate_series(1, 3); FETCH 2 FROM c; COMMIT"
            ))
            .await
            .unwrap();
        assert_eq!(
            rows(&got),
            vec![
                vec![Some(String::new())],
                vec![Some("1".to_owned())],
                vec![Some("2".to_owned())]
            ]
        );
        a.batch_execute("NOTIFY txn_channel, 'allowed'")
            .await
            .unwrap();

        // Nothing of the refused commands reached the (only) server.
        assert_eq!(backend_pid(&a).await, backend_pid(&b).await, "one server");
        let leftovers = value(
            &b,
            &format!(
                "SELECT (SELECT count(*) FROM pg_listening_channels()) || ' ' || \
                 (SELECT count(*) FROM pg_cursors) || ' ' || \
                 (to_regclass('pg_temp.txn_tt') IS NULL) || ' ' || current_user || ' ' || \
                 (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = {})",
                key as u32
            ),
        )
        .await;
        assert_eq!(leftovers, "0 0 true postgres 0");
        pgmemo.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn a_client_killed_mid_transaction_leaves_nothing_behind() {
    within(TEST_DEADLINE, async {
        let default_timeout = default_setting("statement_timeout").await;
        let default_work_mem = default_setting("work_mem").await;
        let default_lock_timeout = default_setting("lock_timeout").await;
        let t = create_table("txn_killed", "(v text)").await;
        let direct = LocalPostgres.client(USER, DB).await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let (a, a_conn) = connect_watched(&pgmemo.url(USER, DB)).await;
        let b = pgmemo.client(USER, DB).await;
        a.batch_execute("SET work_mem = '7MB'").await.unwrap();
        a.batch_execute(&format!(
            "BEGIN; INSERT INTO {t} VALUES ('from A'); SET statement_timeout = '4321s'; \
             SET LOCAL lock_timeout = '77s'"
        ))
        .await
        .unwrap();
        // The client process dies: its socket closes without a Terminate message.
        a_conn.abort();
        let _ = a_conn.await;
        drop(a);

        // B's statement waits for the server and then finds it clean.
        let state = value(
            &b,
            "SELECT (txid_current_if_assigned() IS NULL) || ' ' || \
             current_setting('statement_timeout') || ' ' || current_setting('work_mem') || ' ' || \
             current_setting('lock_timeout')",
        )
        .await;
        assert_eq!(
            state,
            format!("true {default_timeout} {default_work_mem} {default_lock_timeout}"),
            "B sees A's transaction or settings"
        );
        assert_eq!(
            value(&b, "SELECT now() = statement_timestamp()").await,
            "t",
            "now() belongs to an older transaction"
        );
        b.batch_execute("BEGIN; COMMIT").await.unwrap();
        let count = format!("SELECT count(*) FROM {t}");
        assert_eq!(value(&b, &count).await, "0");
        assert_eq!(value(&direct, &count).await, "0", "A's row was committed");
        pgmemo.shutdown().await;
        drop_table(&t).await;
    })
    .await
}

/// While a statement runs, pgmemo still watches its client: a client that dies then gives
/// its place back at once (the busy server is closed, not pooled), so the next client neither
/// waits for the statement to end nor inherits the busy backend.
#[tokio::test]
async fn a_client_killed_mid_statement_frees_its_place_at_once() {
    within(TEST_DEADLINE, async {
        let direct = LocalPostgres.client(USER, DB).await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let (a, a_conn) = connect_watched(&pgmemo.url(USER, DB)).await;
        let tag = unique("killed_mid_statement");
        let sleep = format!("SELECT pg_sleep(5), '{tag}'");
        let sleeper = tokio::spawn(async move { a.simple_query(&sleep).await });
        testkit::assert_eventually(SOON, "A's statement is running", || async {
            let running: i64 = direct
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE state = 'active' AND query LIKE '%' || $1 || '%' \
                     AND pid <> pg_backend_pid()",
                    &[&tag],
                )
                .await
                .unwrap()
                .get(0);
            running == 1
        })
        .await;
        let busy: i32 = direct
            .query_one(
                "SELECT pid FROM pg_stat_activity WHERE state = 'active' \
                 AND query LIKE '%' || $1 || '%' AND pid <> pg_backend_pid()",
                &[&tag],
            )
            .await
            .unwrap()
            .get(0);
        let killed = Instant::now();
        a_conn.abort();
        let _ = a_conn.await;
        let _ = sleeper.await;

        let b = pgmemo.client(USER, DB).await;
        let b_pid = backend_pid(&b).await;
        assert!(
            killed.elapsed() < Duration::from_secs(4),
            "B waited {:?} for A's statement",
            killed.elapsed()
        );
        assert_ne!(b_pid, busy, "B got the backend still running A's statement");
        pgmemo.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn idle_transaction_timeout_disconnects_the_idle_client_and_frees_the_server() {
    within(TEST_DEADLINE, async {
        let t = create_table("txn_idle", "(v text)").await;
        let direct = LocalPostgres.client(USER, DB).await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| {
            c.idle_transaction_timeout = Seconds(Duration::from_secs(1));
        })
        .await;
        let (a, a_conn) = connect_watched(&pgmemo.url(USER, DB)).await;
        let b = pgmemo.client(USER, DB).await;
        let idle_outside = pgmemo.client(USER, DB).await;
        // Busy inside a transaction for longer than the timeout is not idle.
        b.batch_execute("BEGIN; SELECT pg_sleep(1.5); SELECT 1; COMMIT")
            .await
            .unwrap();

        a.batch_execute(&format!("BEGIN; INSERT INTO {t} VALUES ('from A')"))
            .await
            .unwrap();
        let began = Instant::now();
        // B waits for the only server, which A holds until the timeout ends A's session.
        assert_eq!(value(&b, "SELECT 'served'").await, "served");
        let waited = began.elapsed();
        assert!(
            waited >= Duration::from_millis(800) && waited < Duration::from_secs(8),
            "B waited {waited:?}"
        );
        let ended = tokio::time::timeout(SOON, a_conn)
            .await
            .expect("A's connection was not closed")
            .unwrap();
        let e = ended.expect_err("A's connection ended without an error");
        assert_eq!(sqlstate(&e), Some("25P03"), "{e:?}");
        let detail = e.as_db_error().and_then(|d| d.detail()).unwrap_or("");
        let said = format!("{} {detail}", db_message(&e));
        assert!(
            said.contains("idle_transaction_timeout") || said.contains("idle-in-transaction"),
            "{e:?}"
        );
        assert!(a.simple_query("SELECT 1").await.is_err());
        assert_eq!(
            value(&b, "SELECT txid_current_if_assigned() IS NULL").await,
            "t"
        );
        let count = format!("SELECT count(*) FROM {t}");
        assert_eq!(value(&direct, &count).await, "0", "A's row was committed");
        // A client idle outside a transaction all along is not affected.
        assert_eq!(value(&idle_outside, "SELECT 2").await, "2");
        pgmemo.shutdown().await;
        drop_table(&t).await;
    })
    .await
}

#[tokio::test]
async fn a_client_waiting_longer_than_query_wait_timeout_gets_an_error() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| {
            c.query_wait_timeout = Seconds(Duration::from_secs(1));
        })
        .await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        let held = hold(&a).await;
        let began = Instant::now();
        let e = query_error(&b, "SELECT 1").await;
        let waited = began.elapsed();
        assert!(matches!(sqlstate(&e), Some("08P01" | "53300")), "{e:?}");
        assert!(db_message(&e).contains("query_wait_timeout"), "{e:?}");
        assert!(
            waited >= Duration::from_millis(800) && waited < Duration::from_secs(5),
            "B waited {waited:?}"
        );
        // A's transaction is unharmed; once it ends, other clients are served.
        assert_eq!(backend_pid(&a).await, held);
        a.batch_execute("COMMIT").await.unwrap();
        let c = pgmemo.client(USER, DB).await;
        assert_eq!(value(&c, "SELECT 3").await, "3");
        pgmemo.shutdown().await;
    })
    .await
}

/// A logged-in client queued for a server (every place taken by open transactions) that closes
/// its connection leaves the queue at once: it keeps neither its turn nor its
/// `max_client_conn` slot until `query_wait_timeout`, and its request never takes a server
/// for nobody once a place is free.
#[tokio::test]
async fn a_client_that_leaves_while_queued_for_a_server_leaves_the_queue() {
    within(TEST_DEADLINE, async {
        let t = create_table("txn_left_queue", "(n int)").await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| {
            c.query_wait_timeout = Seconds(Duration::from_secs(60));
        })
        .await;
        let shared = pgmemo.handle().shared().clone();
        let a = pgmemo.client(USER, DB).await;
        let mut leaving = Vec::new();
        for _ in 0..2 {
            leaving.push(txn_support::Raw::login(pgmemo.port()).await);
        }
        hold(&a).await;
        let pool = shared.pools.all()[0].clone();
        for raw in &mut leaving {
            raw.send(&[txn_support::msg::query(&format!(
                "INSERT INTO {t} VALUES (1)"
            ))])
            .await;
        }
        testkit::assert_eventually(SOON, "both clients are queued", || async {
            pool.waiting() == 2
        })
        .await;
        drop(leaving);
        testkit::assert_eventually(
            Duration::from_secs(5),
            "the clients that left leave the queue and free their slots",
            || async { pool.waiting() == 0 && shared.client_count() == 1 },
        )
        .await;
        // Their requests were never sent: A's server, free again, serves nobody else.
        a.batch_execute("COMMIT").await.unwrap();
        assert_eq!(value(&a, &format!("SELECT count(*) FROM {t}")).await, "0");
        pgmemo.shutdown().await;
        drop_table(&t).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_clients_share_eight_server_connections() {
    within(Duration::from_secs(180), async {
        // A cluster of its own whose max_connections leaves no room for a connection per
        // client: 200 clients only fit if they really share the pool.
        let pg = TempPostgres::builder()
            .conf("max_connections = 20")
            .start()
            .await
            .unwrap();
        pg.psql("CREATE TABLE hits (client int, n int)").await;
        let pgmemo = txn_pgmemo(pg.port(), 8, |c| {
            c.query_wait_timeout = Seconds(Duration::from_secs(60));
        })
        .await;
        let url = pgmemo.url(USER, "postgres");
        let clients = futures_util::future::join_all((0..200).map(|_| testkit::connect(&url)))
            .await
            .into_iter()
            .collect::<anyhow::Result<Vec<_>>>()
            .unwrap_or_else(|e| panic!("{e:#}"));
        let runs = clients.iter().enumerate().map(|(i, client)| async move {
            let mut pids = Vec::new();
            for n in 0..3 {
                let got = client
                    .simple_query(&format!(
                        "BEGIN; INSERT INTO hits VALUES ({i}, {n}); \
                         SELECT pg_backend_pid() || ' ' || count(*) FROM hits WHERE client = {i}; \
                         COMMIT"
                    ))
                    .await
                    .unwrap_or_else(|e| panic!("client {i}: {e:?}"));
                let row = rows(&got).remove(0).remove(0).unwrap();
                let (pid, count) = row.split_once(' ').unwrap();
                assert_eq!(count, (n + 1).to_string(), "client {i}");
                pids.push(pid.parse::<i32>().unwrap());
            }
            let got: i64 = client
                .query_one("SELECT $1::int8 * 2", &[&(i as i64)])
                .await
                .unwrap()
                .get(0);
            assert_eq!(got, i as i64 * 2);
            pids
        });
        let pids: BTreeSet<i32> = futures_util::future::join_all(runs)
            .await
            .into_iter()
            .flatten()
            .collect();
        assert!(
            !pids.is_empty() && pids.len() <= 8,
            "{} backends served",
            pids.len()
        );
        assert_eq!(pg.psql("SELECT count(*) FROM hits").await, "600");
        for pool in pgmemo.handle().shared().pools.all() {
            assert!(pool.counts().1 <= 8, "{:?}", pool.counts());
        }
        drop(clients);
        pgmemo.shutdown().await;
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// COPY.

#[tokio::test]
async fn copy_in_and_out_work_between_other_clients_transactions() {
    use futures_util::{SinkExt, StreamExt};
    within(TEST_DEADLINE, async {
        let t = unique("txn_copy");
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        a.batch_execute(&format!("CREATE TABLE {t} (id int, v text)"))
            .await
            .unwrap();
        let rows_in = 20_000;
        let sink = a.copy_in(&format!("COPY {t} FROM STDIN")).await.unwrap();
        futures_util::pin_mut!(sink);
        let mut data = String::new();
        for i in 0..rows_in {
            data.push_str(&format!("{i}\trow {i}\n"));
        }
        sink.send(bytes::Bytes::from(data)).await.unwrap();
        assert_eq!(sink.finish().await.unwrap(), rows_in as u64);
        // Another client uses the only server in between.
        assert_eq!(value(&b, "SELECT 1").await, "1");
        let stream = a
            .copy_out(&format!("COPY (SELECT * FROM {t} ORDER BY id) TO STDOUT"))
            .await
            .unwrap();
        futures_util::pin_mut!(stream);
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            out.extend_from_slice(&chunk.unwrap());
        }
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), rows_in);
        assert_eq!(text.lines().nth(7), Some("7\trow 7"));
        // A failed COPY leaves the session (and the server for B) usable.
        let sink = a.copy_in(&format!("COPY {t} FROM STDIN")).await.unwrap();
        futures_util::pin_mut!(sink);
        sink.send(bytes::Bytes::from_static(b"not a number\tx\n"))
            .await
            .unwrap();
        assert!(sink.finish().await.is_err());
        assert_eq!(value(&b, "SELECT 2").await, "2");
        assert_eq!(
            value(&a, &format!("SELECT count(*) FROM {t}")).await,
            rows_in.to_string()
        );
        a.batch_execute(&format!("DROP TABLE {t}")).await.unwrap();
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Pool management.

/// `(pool_size, server_total)` of the (test, postgres) pool from the admin console.
async fn pool_figures(admin: &Client) -> (String, usize) {
    let row = pool_row(admin).await;
    (
        row[3].clone().unwrap(),
        row[5].as_deref().unwrap().parse().unwrap(),
    )
}

/// The `SHOW POOLS` row of the test client's pool.
async fn pool_row(admin: &Client) -> Vec<Option<String>> {
    rows(&admin.simple_query("SHOW POOLS").await.unwrap())
        .into_iter()
        .find(|r| r[0].as_deref() == Some(DB) && r[1].as_deref() == Some(USER))
        .expect("the pool of the test's client")
}

#[tokio::test]
async fn min_pool_size_keeps_servers_open_and_users_have_their_own_pool_size() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 4, |c| {
            c.min_pool_size = 2;
            c.users.insert(
                USER.to_owned(),
                pgmemo::config::UserConfig { pool_size: Some(3) },
            );
        })
        .await;
        let client = pgmemo.client(USER, DB).await;
        assert_eq!(value(&client, "SELECT 1").await, "1");
        let admin = pgmemo.client(USER, "pgmemo").await;
        let ready = testkit::eventually(SOON, || async { pool_figures(&admin).await.1 >= 2 }).await;
        let (size, total) = pool_figures(&admin).await;
        assert!(
            ready,
            "min_pool_size 2 not reached: {total} server connections"
        );
        assert_eq!(size, "3", "the [users] override sets the pool size");
        assert!(total <= 3);
        // The spare connections serve clients like any other.
        let others: Vec<Client> =
            futures_util::future::join_all((0..3).map(|_| pgmemo.client(USER, DB))).await;
        for c in &others {
            c.batch_execute("BEGIN").await.unwrap();
        }
        let pids: BTreeSet<i32> = futures_util::future::join_all(others.iter().map(backend_pid))
            .await
            .into_iter()
            .collect();
        assert_eq!(pids.len(), 3, "three transactions on three servers");
        for c in &others {
            c.batch_execute("COMMIT").await.unwrap();
        }
        assert!(pool_figures(&admin).await.1 <= 3);
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Cancel.

#[tokio::test]
async fn cancel_reaches_the_clients_current_server_and_never_another_clients_query() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let app = unique("txn_cancel");
        let url = format!("{}?application_name={app}", pgmemo.url(USER, DB));
        let a = testkit::connect(&url).await.unwrap();
        let b = pgmemo.client(USER, DB).await;
        let direct = LocalPostgres.client(USER, DB).await;
        let token = a.cancel_token();
        let running = tokio::spawn(async move {
            let r = a.query("SELECT pg_sleep(10)", &[]).await;
            (r.map(|_| ()), Instant::now(), a)
        });
        let active = testkit::eventually(SOON, || pg_sleep_running(&direct, &app)).await;
        assert!(active, "pg_sleep never ran");
        let cancelled_at = Instant::now();
        token.cancel_query(tokio_postgres::NoTls).await.unwrap();
        let (result, failed_at, a) = running.await.unwrap();
        let err = result.expect_err("the query was cancelled");
        assert_eq!(sqlstate(&err), Some("57014"), "{err}");
        assert!(failed_at.duration_since(cancelled_at) < Duration::from_secs(1));

        // A is between transactions now; B runs on the same (only) server. A's cancel must not
        // reach B's query.
        let b_running = tokio::spawn(async move {
            let r = b.query("SELECT pg_sleep(0.5)", &[]).await;
            (r.map(|_| ()), b)
        });
        let b_active = testkit::eventually(SOON, || {
            testkit::query_running(&direct, "SELECT pg_sleep(0.5)")
        })
        .await;
        assert!(b_active, "B's query never ran");
        token.cancel_query(tokio_postgres::NoTls).await.unwrap();
        let (b_result, _b) = b_running.await.unwrap();
        b_result.expect("a detached client's cancel reaches nobody");
        assert_eq!(value(&a, "SELECT 1").await, "1");
    })
    .await;
}

/// A client queued for the (only) server cancels its statement: PostgreSQL would have been
/// running it, so the client gets "canceling statement due to user request" at once, without
/// waiting for a server, and the statement never runs. Simple and extended protocol, and a
/// request pipelined behind the cancelled one still runs. A cancel while the client is idle
/// stops nothing, not even its next statement.
#[tokio::test]
async fn a_cancel_while_queued_for_a_server_answers_the_statement_at_once() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let holder = pgmemo.client(USER, DB).await;
        let admin = pgmemo.client(USER, "pgmemo").await;
        let direct = LocalPostgres.client(USER, DB).await;
        let table = create_table("txn_queued_cancel", "(n int)").await;
        let b = std::sync::Arc::new(pgmemo.client(USER, DB).await);
        let token = b.cancel_token();
        let held = hold(&holder).await;
        let queued = || async { pool_waiting(&admin).await >= 1 };

        // Extended protocol (tokio-postgres prepares first: the Parse is what waits).
        let insert = format!("INSERT INTO {table} SELECT 1 FROM pg_sleep(30)");
        let running = tokio::spawn({
            let (b, insert) = (b.clone(), insert.clone());
            async move { b.execute(insert.as_str(), &[]).await }
        });
        assert!(testkit::eventually(SOON, queued).await, "B never queued");
        token.cancel_query(NoTls).await.unwrap();
        let err = tokio::time::timeout(Duration::from_secs(10), running)
            .await
            .expect("the cancel waited for a server")
            .unwrap()
            .expect_err("the statement was cancelled");
        assert_eq!(sqlstate(&err), Some("57014"), "{err}");

        // Simple protocol, with a request pipelined behind it.
        let running = tokio::spawn({
            let (b, insert) = (b.clone(), insert.clone());
            async move {
                let cancelled = b.simple_query(&insert);
                let behind = b.query_one("SELECT 2::int", &[]);
                let (cancelled, behind) = tokio::join!(cancelled, behind);
                (cancelled.map(|_| ()), behind.map(|r| r.get::<_, i32>(0)))
            }
        });
        assert!(testkit::eventually(SOON, queued).await, "B never queued");
        token.cancel_query(NoTls).await.unwrap();
        // The request behind it queues in turn, while the server is still held.
        assert!(
            testkit::eventually(SOON, queued).await,
            "B's next request never queued"
        );
        holder.batch_execute("COMMIT").await.unwrap();
        let (cancelled, behind) = running.await.unwrap();
        let err = cancelled.expect_err("the statement was cancelled");
        assert_eq!(sqlstate(&err), Some("57014"), "{err}");
        assert_eq!(
            behind.unwrap(),
            2,
            "the request behind the cancelled one runs"
        );
        let count = value(&direct, &format!("SELECT count(*) FROM {table}")).await;
        assert_eq!(count, "0", "a cancelled statement never ran");
        assert_eq!(backend_pid(&b).await, held, "B's session goes on");

        // Idle now: a cancel has nothing to stop, and is not kept for the next statement.
        token.cancel_query(NoTls).await.unwrap();
        b.query("SELECT pg_sleep(0.2)", &[])
            .await
            .expect("a cancel sent while idle stops no later statement");
        drop_table(&table).await;
    })
    .await;
}

/// A FunctionCall (libpq's `PQfn`) queued for the (only) server is answered as cancelled
/// like a simple Query: the error and ReadyForQuery at once, and the function never runs.
#[tokio::test]
async fn a_function_call_queued_for_a_server_is_answered_as_cancelled() {
    use txn_support::{msg, Raw};
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let holder = pgmemo.client(USER, DB).await;
        let admin = pgmemo.client(USER, "pgmemo").await;
        let direct = LocalPostgres.client(USER, DB).await;
        // A function with an effect no rollback undoes: a sequence's nextval.
        let seq = testkit::unique("txn_fn_cancel");
        direct
            .batch_execute(&format!(
                "CREATE SEQUENCE {seq}; CREATE FUNCTION {seq}() RETURNS bigint \
                 LANGUAGE sql AS 'SELECT nextval(''{seq}'')'"
            ))
            .await
            .unwrap();
        let oid: u32 = value(&direct, &format!("SELECT '{seq}'::regproc::oid"))
            .await
            .parse()
            .unwrap();
        let mut a = Raw::login(pgmemo.port()).await;
        hold(&holder).await;
        a.send(&[msg::function_call(oid, &[])]).await;
        assert!(
            testkit::eventually(SOON, || async { pool_waiting(&admin).await >= 1 }).await,
            "the FunctionCall never queued"
        );
        a.cancel().await;
        // Answered while the server is still held: nothing waits for it.
        let answer = a.until(b'Z').await;
        assert_eq!(answer.len(), 2, "{answer:?}");
        assert!(answer[0].contains("57014"), "{answer:?}");
        holder.batch_execute("COMMIT").await.unwrap();
        let called = value(&direct, &format!("SELECT is_called::text FROM {seq}")).await;
        assert_eq!(called, "false", "the cancelled function never ran");
        let answer = a.exchange(&[msg::function_call(oid, &[])]).await;
        assert_eq!(
            answer,
            ["FunctionCallResponse 1", "ReadyForQuery I"],
            "the session goes on, and the function runs for the first time"
        );
        direct
            .batch_execute(&format!("DROP FUNCTION {seq}(); DROP SEQUENCE {seq}"))
            .await
            .unwrap();
    })
    .await;
}

/// Cancels at every stage (queued for a server, waiting to be sent, running, idle) from
/// many clients over a pool far smaller than them: every statement either completes or fails
/// with 57014, each session stays in step (its next statement gets its own answer), and the
/// pool ends with nobody waiting and no server beyond its size.
#[tokio::test]
async fn cancels_at_any_moment_under_pool_pressure_leave_every_session_in_step() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |_| {}).await;
        let admin = pgmemo.client(USER, "pgmemo").await;
        let mut tasks = Vec::new();
        for i in 0..16i32 {
            let client = std::sync::Arc::new(pgmemo.client(USER, DB).await);
            tasks.push(tokio::spawn(async move {
                let token = client.cancel_token();
                let mut cancelled = 0;
                for round in 0..12i32 {
                    let c = client.clone();
                    let running = tokio::spawn(async move {
                        if (i + round) % 2 == 0 {
                            c.simple_query("SELECT pg_sleep(0.01)").await.map(|_| ())
                        } else {
                            c.query("SELECT pg_sleep(0.01), $1::int", &[&round])
                                .await
                                .map(|_| ())
                        }
                    });
                    if (i * 7 + round) % 3 == 0 {
                        // Now or a moment later: queued, sent, running or already done.
                        for _ in 0..(i + round) % 4 {
                            tokio::task::yield_now().await;
                        }
                        token.cancel_query(NoTls).await.unwrap();
                    }
                    if let Err(e) = running.await.unwrap() {
                        assert_eq!(sqlstate(&e), Some("57014"), "{e}");
                        cancelled += 1;
                    }
                    let own: i32 = client
                        .query_one("SELECT $1::int + 1000", &[&round])
                        .await
                        .expect("the session is in step after a cancel")
                        .get(0);
                    assert_eq!(own, round + 1000);
                }
                cancelled
            }));
        }
        let mut cancelled = 0;
        for t in tasks {
            cancelled += t.await.unwrap();
        }
        assert!(
            cancelled > 0,
            "no statement was cancelled: the test tested nothing"
        );
        assert_eq!(pool_waiting(&admin).await, 0);
        assert!(
            pool_figures(&admin).await.1 <= 2,
            "no server beyond the pool"
        );
    })
    .await;
}

#[tokio::test]
async fn a_cancel_still_on_its_way_never_stops_the_next_clients_query() {
    within(TEST_DEADLINE, async {
        // Every cancel waits at the gate until released: A's cancel is read while A's query
        // runs, and reaches PostgreSQL only after that query ended and B asked for the
        // (only) server.
        let mut gate = testkit::CancelGate::start(LocalPostgres::PORT).await;
        let pgmemo = txn_pgmemo(gate.port(), 1, |c| c.cache = Switch::Off).await;
        let app = unique("txn_late_cancel");
        let url = format!("{}?application_name={app}", pgmemo.url(USER, DB));
        let a = testkit::connect(&url).await.unwrap();
        let b = pgmemo.client(USER, DB).await;
        let admin = pgmemo.client(USER, "pgmemo").await;
        let direct = LocalPostgres.client(USER, DB).await;
        let token = a.cancel_token();
        let a_running =
            tokio::spawn(async move { a.query("SELECT pg_sleep(1)", &[]).await.map(|_| ()) });
        let active = testkit::eventually(SOON, || pg_sleep_running(&direct, &app)).await;
        assert!(active, "A's query never ran");
        let cancelling = tokio::spawn(async move { token.cancel_query(NoTls).await });
        gate.cancel_arrived().await;
        a_running
            .await
            .unwrap()
            .expect("A's cancel is still at the gate: its query ends normally");

        let b_running = tokio::spawn(async move {
            b.query_one("SELECT pg_sleep(0.5)::text", &[])
                .await
                .map(|_| ())
        });
        // B either runs already (the server went back to the pool with the cancel still on its
        // way) or waits for the server: then the cancel goes through.
        let b_started = testkit::eventually(SOON, || {
            let (direct, admin) = (&direct, &admin);
            async move {
                testkit::query_running(direct, "SELECT pg_sleep(0.5)::text").await
                    || pool_waiting(admin).await >= 1
            }
        })
        .await;
        assert!(b_started, "B neither ran nor waited");
        gate.release();
        cancelling.await.unwrap().expect("the cancel is forwarded");
        b_running
            .await
            .unwrap()
            .expect("A's late cancel must not stop B's query");
    })
    .await;
}

/// Clients queued for a place in the test's pool (`SHOW POOLS`).
async fn pool_waiting(admin: &Client) -> usize {
    pool_row(admin).await[7]
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

/// An error raised by a Sync itself (the implicit transaction's commit failing on a deferred
/// constraint) skips nothing: the batch pipelined after it runs and is answered, on the
/// same server, as PostgreSQL does.
#[tokio::test]
async fn an_error_at_sync_leaves_the_next_pipelined_batch_alone() {
    within(TEST_DEADLINE, async {
        let parent = create_table("txn_dparent", "(id int PRIMARY KEY)").await;
        let child = create_table(
            "txn_dchild",
            &format!("(pid int REFERENCES {parent} DEFERRABLE INITIALLY DEFERRED)"),
        )
        .await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| c.cache = Switch::Off).await;
        let c = pgmemo.client(USER, DB).await;
        let insert = c
            .prepare(&format!("INSERT INTO {child} VALUES (99)"))
            .await
            .unwrap();
        let select = c.prepare("SELECT 42").await.unwrap();
        let (inserted, selected) = tokio::time::timeout(SOON, async {
            tokio::join!(c.execute(&insert, &[]), c.query_one(&select, &[]))
        })
        .await
        .expect("both pipelined batches are answered");
        let e = inserted.expect_err("the deferred foreign key fails at commit");
        assert_eq!(sqlstate(&e), Some("23503"), "{e}");
        assert_eq!(selected.expect("the next batch runs").get::<_, i32>(0), 42);
        assert_eq!(value(&c, "SELECT 1").await, "1");
        drop_table(&child).await;
        drop_table(&parent).await;
    })
    .await;
}

/// pgmemo prepares a client's statement on a server that lacks it just before its use; when
/// the server skips that (the client's block is already aborted), the server still lacks it
/// and the next use prepares it again, instead of naming a statement that does not exist.
#[tokio::test]
async fn a_statement_pgmemo_failed_to_prepare_is_prepared_again() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |c| c.cache = Switch::Off).await;
        let a = pgmemo.client(USER, DB).await;
        let b = pgmemo.client(USER, DB).await;
        a.batch_execute("PREPARE p AS SELECT 42").await.unwrap();
        let first = backend_pid(&a).await;
        // B holds A's server: A's next transaction runs on the other one, which lacks p.
        assert_eq!(hold(&b).await, first);
        a.batch_execute("BEGIN").await.unwrap();
        assert_ne!(backend_pid(&a).await, first);
        a.batch_execute("SELECT 1/0")
            .await
            .expect_err("division by zero");
        let e = a
            .batch_execute("EXECUTE p")
            .await
            .expect_err("aborted block");
        assert_eq!(sqlstate(&e), Some("25P02"), "{e}");
        a.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(value(&a, "EXECUTE p").await, "42");
        b.batch_execute("COMMIT").await.unwrap();
    })
    .await;
}

/// When the statement pgmemo prepares ahead of a client's `EXECUTE` fails there (its table
/// was dropped), the client gets that one error, after what the Query ran before it, as from
/// PostgreSQL: not a second error naming pgmemo's own statement.
#[tokio::test]
async fn a_failed_preparation_ahead_of_execute_is_reported_once() {
    use txn_support::{msg, Raw};
    within(TEST_DEADLINE, async {
        let t = create_table("prep_once", "(n int)").await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |c| c.cache = Switch::Off).await;
        let b = pgmemo.client(USER, DB).await;
        let mut a = Raw::login(pgmemo.addr().port()).await;
        let prepared = a
            .exchange(&[msg::query(&format!(
                "PREPARE p AS SELECT n FROM {t}; SELECT pg_backend_pid()"
            ))])
            .await;
        let first: i32 = prepared
            .iter()
            .find_map(|l| l.strip_prefix("DataRow [")?.strip_suffix(']')?.parse().ok())
            .unwrap_or_else(|| panic!("{prepared:?}"));
        // B holds A's server: A's next request runs on the other one, which lacks p.
        assert_eq!(hold(&b).await, first);
        drop_table(&t).await;
        let lines = a
            .exchange(&[msg::query("SELECT 1 AS one; EXECUTE p")])
            .await;
        assert_eq!(lines.len(), 5, "{lines:#?}");
        assert_eq!(lines[1], "DataRow [1]", "{lines:#?}");
        assert!(
            lines[3].starts_with("Error ERROR 42P01: relation")
                && lines[3].ends_with("does not exist"),
            "{lines:#?}"
        );
        assert_eq!(lines[4], "ReadyForQuery I", "{lines:#?}");
        b.batch_execute("COMMIT").await.unwrap();
    })
    .await;
}

/// A PREPARE of a text the server holds already is not sent; when it does not run (an error
/// before it), the client has no such statement, and the server still has its own.
#[tokio::test]
async fn a_prepare_that_did_not_run_leaves_the_servers_statement_alone() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| c.cache = Switch::Off).await;
        let a = pgmemo.client(USER, DB).await;
        a.batch_execute("PREPARE a1 AS SELECT 1").await.unwrap();
        a.batch_execute("SELECT 1/0; PREPARE b1 AS SELECT 1")
            .await
            .expect_err("division by zero");
        let e = a
            .batch_execute("EXECUTE b1")
            .await
            .expect_err("b1 never ran");
        assert_eq!(sqlstate(&e), Some("26000"), "{e}");
        assert_eq!(value(&a, "EXECUTE a1").await, "1");
    })
    .await;
}

/// A `DEALLOCATE` or Close that the server skips (an error before it, an aborted block)
/// drops nothing, as in PostgreSQL: the statement still runs afterwards.
/// A name dropped and prepared again in a request the server skipped keeps its first
/// statement, as in PostgreSQL, where neither the drop nor the new statement happened.
#[tokio::test]
async fn a_skipped_drop_and_prepare_of_one_name_keep_the_first_statement() {
    use txn_support::{msg, Raw};
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| c.cache = Switch::Off).await;
        let a = pgmemo.client(USER, DB).await;
        a.batch_execute("PREPARE p AS SELECT 'first'::text")
            .await
            .unwrap();
        a.batch_execute("SELECT 1/0; DEALLOCATE p; PREPARE p AS SELECT 'second'::text")
            .await
            .expect_err("division by zero");
        assert_eq!(value(&a, "EXECUTE p").await, "first");

        let mut raw = Raw::login(pgmemo.port()).await;
        raw.exchange(&[msg::parse("s", "SELECT 'first'::text", &[]), msg::sync()])
            .await;
        let skipped = raw
            .exchange(&[
                msg::parse("", "SELECT 1/0", &[]),
                msg::bind("", "", &[]),
                msg::execute("", 0),
                msg::close(b'S', "s"),
                msg::parse("s", "SELECT 'second'::text", &[]),
                msg::sync(),
            ])
            .await;
        assert!(skipped.iter().any(|l| l.contains("22012")), "{skipped:?}");
        let run = raw
            .exchange(&[msg::bind("", "s", &[]), msg::execute("", 0), msg::sync()])
            .await;
        assert!(run.iter().any(|l| l.contains("first")), "{run:?}");
    })
    .await;
}

/// pgmemo's Close of a statement it evicts from a full server, skipped by the server (an
/// error earlier in the batch): the server keeps the statement, and pgmemo's record says so,
/// so the statement is not prepared there again (which would fail with 42P05).
#[tokio::test]
async fn a_skipped_eviction_leaves_the_statement_usable() {
    use txn_support::{msg, Raw};
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| {
            c.cache = Switch::Off;
            c.max_prepared_statements = 2;
        })
        .await;
        let mut raw = Raw::login(pgmemo.port()).await;
        let a_text = format!("SELECT '{}'::text", unique("evicted"));
        raw.exchange(&[
            msg::parse("a", &a_text, &[]),
            msg::parse("b", "SELECT 2", &[]),
            msg::sync(),
        ])
        .await;
        let skipped = raw
            .exchange(&[
                msg::parse("", "SELECT 1/0", &[]),
                msg::bind("", "", &[]),
                msg::execute("", 0),
                msg::parse("c", "SELECT 3", &[]),
                msg::sync(),
            ])
            .await;
        assert!(skipped.iter().any(|l| l.contains("22012")), "{skipped:?}");
        for _ in 0..2 {
            let run = raw
                .exchange(&[msg::bind("", "a", &[]), msg::execute("", 0), msg::sync()])
                .await;
            assert!(run.iter().any(|l| l.contains("evicted")), "{run:?}");
            assert!(!run.iter().any(|l| l.contains("42P05")), "{run:?}");
        }
    })
    .await;
}

#[tokio::test]
async fn a_skipped_deallocate_or_close_keeps_the_statement() {
    use txn_support::{msg, Raw};
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| c.cache = Switch::Off).await;
        let a = pgmemo.client(USER, DB).await;
        a.batch_execute("PREPARE p AS SELECT 7").await.unwrap();
        a.batch_execute("BEGIN").await.unwrap();
        a.batch_execute("SELECT 1/0")
            .await
            .expect_err("division by zero");
        let e = a.batch_execute("DEALLOCATE p").await.expect_err("aborted");
        assert_eq!(sqlstate(&e), Some("25P02"), "{e}");
        a.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(value(&a, "EXECUTE p").await, "7");
        a.batch_execute("SELECT 1/0; DEALLOCATE ALL")
            .await
            .expect_err("division by zero");
        assert_eq!(value(&a, "EXECUTE p").await, "7");

        let mut raw = Raw::login(pgmemo.port()).await;
        raw.exchange(&[msg::parse("s1", "SELECT 5", &[]), msg::sync()])
            .await;
        let skipped = raw
            .exchange(&[
                msg::parse("", "SELECT 1/0", &[]),
                msg::bind("", "", &[]),
                msg::execute("", 0),
                msg::close(b'S', "s1"),
                msg::sync(),
            ])
            .await;
        assert!(skipped.iter().any(|l| l.contains("22012")), "{skipped:?}");
        let run = raw
            .exchange(&[msg::bind("", "s1", &[]), msg::execute("", 0), msg::sync()])
            .await;
        assert!(run.iter().any(|l| l.contains('5')), "{run:?}");
        assert!(!run.iter().any(|l| l.contains("26000")), "{run:?}");
    })
    .await;
}

/// A name whose statement set a setting, dropped and parsed again for a statement that sets
/// nothing, sets nothing when executed: the client's settings stay what it set last, also on
/// the next server it gets.
#[tokio::test]
async fn a_dropped_statement_name_loses_its_setting_effect() {
    use txn_support::{msg, Raw};
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |c| c.cache = Switch::Off).await;
        let mut a = Raw::login(pgmemo.port()).await;
        let run = |sql: &str| {
            vec![
                msg::parse("s", sql, &[]),
                msg::bind("", "s", &[]),
                msg::execute("", 0),
                msg::sync(),
            ]
        };
        a.exchange(&run("SET work_mem = '1MB'")).await;
        a.exchange(&[msg::query("DEALLOCATE s")]).await;
        a.exchange(&[msg::query("SET work_mem = '64MB'")]).await;
        a.exchange(&run("SELECT 1")).await;
        // B (the same startup parameters) holds A's server: A's next statement runs on a new
        // one, where pgmemo applies A's settings.
        let mut b = Raw::login(pgmemo.port()).await;
        b.exchange(&[msg::query("BEGIN")]).await;
        let shown = a.exchange(&[msg::query("SHOW work_mem")]).await;
        assert!(shown.iter().any(|l| l.contains("64MB")), "{shown:?}");
        b.exchange(&[msg::query("COMMIT")]).await;
    })
    .await;
}

#[tokio::test]
async fn settings_pgmemo_cannot_replay_are_refused() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let client = pgmemo.client(USER, DB).await;
        for (sql, what) in [
            (
                "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
                "SET SESSION CHARACTERISTICS",
            ),
            ("SET search_path FROM CURRENT", "SET ... FROM CURRENT"),
        ] {
            let e = client.batch_execute(sql).await.unwrap_err();
            assert_refused(&client, e, what).await;
        }
        // Startup options other than settings cannot be replayed on pooled servers.
        let mut config: tokio_postgres::Config = pgmemo.url(USER, DB).parse().unwrap();
        config.options("-B 100");
        let e = config
            .connect(tokio_postgres::NoTls)
            .await
            .err()
            .expect("the login is refused");
        assert_eq!(sqlstate(&e), Some("0A000"), "{e:?}");
        assert!(db_message(&e).contains("-B 100"), "{e:?}");
        let mut config: tokio_postgres::Config = pgmemo.url(USER, DB).parse().unwrap();
        config.options("-c search_path=public,pg_temp");
        let e = config
            .connect(tokio_postgres::NoTls)
            .await
            .err()
            .expect("the login is refused");
        assert_eq!(sqlstate(&e), Some("0A000"), "{e:?}");
        assert!(db_message(&e).contains("pg_temp"), "{e:?}");
    })
    .await;
}

/// A client that described a prepared statement decodes every later execution's rows with
/// that description, without asking again (tokio-postgres, JDBC, pgx). After DDL changes the
/// statement's result type (here its columns swap places: as many, of other types),
/// PostgreSQL fails each execution with 0A000 `cached plan must not change result type`
/// until the client prepares it again. pgmemo does the same where the statement is stale on
/// the server and where it prepares it afresh on a server (which would run it and send rows
/// of the new shape, decoded with the old one: garbage). A client that described the
/// statement after the change executes it without an error, also on a server whose copy is
/// stale.
#[tokio::test]
async fn rows_of_another_shape_than_the_client_described_are_never_sent() {
    within(TEST_DEADLINE, async {
        let t = create_table("txn_shape", "(id int, v text, w int)").await;
        let direct = LocalPostgres.client(USER, DB).await;
        direct
            .batch_execute(&format!("INSERT INTO {t} VALUES (1, 'one', 7)"))
            .await
            .unwrap();
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |c| c.cache = Switch::Off).await;
        let a = pgmemo.client(USER, DB).await;
        let h = pgmemo.client(USER, DB).await;
        let select = format!("SELECT * FROM {t}");
        // Both servers prepare the statement before the change: A on one while H holds the
        // other, then H on the other while A holds its own.
        h.batch_execute("BEGIN").await.unwrap();
        let st = a.prepare(&select).await.unwrap();
        let row = a.query_one(&st, &[]).await.unwrap();
        assert_eq!(
            (row.get::<_, i32>(0), row.get::<_, String>(1)),
            (1, "one".into())
        );
        h.batch_execute("COMMIT").await.unwrap();
        a.batch_execute("BEGIN").await.unwrap();
        h.query_one(&h.prepare(&select).await.unwrap(), &[])
            .await
            .unwrap();
        a.batch_execute("COMMIT").await.unwrap();
        assert_ne!(backend_pid(&a).await, backend_pid(&h).await);

        direct
            .batch_execute(&format!(
                "ALTER TABLE {t} DROP COLUMN v; ALTER TABLE {t} ADD COLUMN v text DEFAULT 'new'"
            ))
            .await
            .unwrap();
        // Stale on A's server, then prepared afresh there: an error each time, as from
        // PostgreSQL, never rows.
        for attempt in ["stale", "prepared afresh"] {
            let err = a
                .query_one(&st, &[])
                .await
                .expect_err("rows of another shape");
            assert_eq!(sqlstate(&err), Some("0A000"), "{attempt}: {err}");
            assert!(
                db_message(&err).contains("cached plan must not change result type"),
                "{attempt}: {err}"
            );
        }
        // Prepared again, the statement has the new shape and runs.
        let st = a.prepare(&select).await.unwrap();
        let row = a.query_one(&st, &[]).await.unwrap();
        assert_eq!(
            (row.get::<_, i32>(1), row.get::<_, String>(2)),
            (7, "new".into())
        );

        // C describes the statement after the change, on A's server while H holds its own,
        // then runs it on H's server, whose copy is still stale: no error.
        let (server_a, server_h) = (backend_pid(&a).await, backend_pid(&h).await);
        let c = pgmemo.client(USER, DB).await;
        h.batch_execute("BEGIN").await.unwrap();
        let c_st = c.prepare(&select).await.unwrap();
        h.batch_execute("COMMIT").await.unwrap();
        a.batch_execute("BEGIN").await.unwrap();
        let row = c
            .query_one(&c_st, &[])
            .await
            .unwrap_or_else(|e| panic!("C on the stale server: {e}"));
        assert_eq!(
            (row.get::<_, i32>(1), row.get::<_, String>(2)),
            (7, "new".into())
        );
        assert_eq!(backend_pid(&c).await, server_h);
        a.batch_execute("COMMIT").await.unwrap();
        assert_eq!(backend_pid(&a).await, server_a);
        pgmemo.shutdown().await;
        drop_table(&t).await;
    })
    .await
}

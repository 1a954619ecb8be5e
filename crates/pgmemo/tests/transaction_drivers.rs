//! Transaction pooling (`pool_mode = "transaction"`) with clients that bring their own
//! protocol code: a raw protocol client whose answers must match PostgreSQL's message for
//! message, pgbench in every query mode with 64 clients over 4 server connections, psql with
//! SQL-level prepared statements, psycopg 3 (server-side prepared statements, pipeline mode)
//! and asyncpg (prepares everything, same statement names in every process).
//!
//! The Python drivers are installed from PyPI once per target directory (see
//! `txn_support::python_deps`); the scripts are in `tests/python/`.

mod txn_support;

use std::time::Duration;

use pgmemo::config::{Seconds, Switch};
use testkit::{
    assert_pgbench_report, output, pg_client, rows, run_ok, sqlstate, unique, within,
    LocalPostgres, TempPostgres,
};
use txn_support::{
    create_table, create_tenants, drop_table, drop_tenants, evicting_pgmemo, evicting_pgmemo_at,
    lock_exclusive, msg, python, run_script, side_by_side, txn_pgmemo, value, Who, DB,
    TEST_DEADLINE, USER,
};

/// Upper bound for one run of an external client program.
const RUN_LIMIT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------------
// Prepared statements at the protocol level: transcripts compared with PostgreSQL.

/// Runs `steps` directly against PostgreSQL and through pgmemo (pool_size 1, so A and B share
/// one server connection), with the cache on and off (requests that need nothing of pgmemo
/// take the plain path then), and asserts identical answers; returns the transcript.
async fn same_as_postgres(steps: &[(Who, Vec<Vec<u8>>)]) -> Vec<String> {
    same_as_postgres_over(1, steps).await
}

/// [`same_as_postgres`] over a pool of `servers`.
async fn same_as_postgres_over(servers: usize, steps: &[(Who, Vec<Vec<u8>>)]) -> Vec<String> {
    same_as_postgres_at(LocalPostgres::PORT, servers, steps).await
}

/// [`same_as_postgres_over`] against the server on `port`.
async fn same_as_postgres_at(
    port: u16,
    servers: usize,
    steps: &[(Who, Vec<Vec<u8>>)],
) -> Vec<String> {
    let direct = run_script(port, steps).await;
    for cache in [Switch::On, Switch::Off] {
        let pgmemo = txn_pgmemo(port, servers, |c| c.cache = cache).await;
        assert_same_through(pgmemo, &direct, steps, format!("cache {cache:?}")).await;
    }
    direct
}

/// Asserts the `direct` answers to `steps` through an [`evicting_pgmemo`], cache on and off.
async fn same_through_evicting(direct: &[String], steps: &[(Who, Vec<Vec<u8>>)]) {
    same_through_evicting_at(LocalPostgres::PORT, direct, steps).await;
}

/// [`same_through_evicting`] against the server on `port`.
async fn same_through_evicting_at(port: u16, direct: &[String], steps: &[(Who, Vec<Vec<u8>>)]) {
    for cache in [Switch::On, Switch::Off] {
        let pgmemo = evicting_pgmemo_at(port, cache).await;
        assert_same_through(pgmemo, direct, steps, format!("cache {cache:?}, evicting")).await;
    }
}

/// Asserts the `direct` answers to `steps` through pgmemo in session pooling, cache on and
/// off: for the tests of malformed input, which both pooling modes must fail as PostgreSQL.
async fn same_in_session_pooling(direct: &[String], steps: &[(Who, Vec<Vec<u8>>)]) {
    for cache in [Switch::On, Switch::Off] {
        // A server for each of the two clients.
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |c| {
            c.cache = cache;
            c.pool_mode = pgmemo::config::PoolMode::Session;
        })
        .await;
        let what = format!("session pooling, cache {cache:?}");
        assert_same_through(pgmemo, direct, steps, what).await;
    }
}

/// A cluster of the test's own with the database [`DB`]: PostgreSQL analyses a statement
/// again, under the settings in force then, whenever DDL anywhere on the server resets the
/// plan cache (`CREATE SCHEMA` does), which other tests on the shared server do at any time.
/// Tests that compare how a statement keeps its first reading need a server nobody else uses.
async fn quiet_cluster() -> TempPostgres {
    let pg = TempPostgres::start()
        .await
        .expect("a throwaway cluster starts");
    pg.client(USER, "postgres")
        .await
        .batch_execute(&format!("CREATE DATABASE {DB}"))
        .await
        .expect("create the test database");
    pg
}

/// Runs `steps` through `pgmemo` (shut down afterwards) and asserts the `direct` answers.
async fn assert_same_through(
    pgmemo: testkit::PgmemoInstance,
    direct: &[String],
    steps: &[(Who, Vec<Vec<u8>>)],
    what: String,
) {
    let proxied = run_script(pgmemo.port(), steps).await;
    assert!(
        direct == proxied,
        "answers differ ({what}):\n{}",
        side_by_side(direct, &proxied)
    );
    pgmemo.shutdown().await;
}

fn exec(statement: &str, params: &[Option<&str>]) -> Vec<Vec<u8>> {
    vec![
        msg::bind("", statement, params),
        msg::execute("", 0),
        msg::sync(),
    ]
}

/// An eviction pgmemo sends in a batch the server then skips (an error earlier in it) leaves
/// the statement on the server: a batch pipelined behind it that prepares the statement
/// again closes it first, and the records follow what the server really holds (differential
/// seed 1018869, where the second Parse failed with 42P05 on pgmemo's own name).
#[tokio::test]
async fn a_skipped_eviction_does_not_make_a_pipelined_prepare_collide() {
    use Who::A;
    let noon = "SELECT 1 AS a";
    let mut pipelined = vec![
        msg::parse("", "SELECT 1/0 AS boom", &[]),
        msg::bind("", "", &[]),
        msg::execute("", 0),
        // Evicts s1's statement to make room, in the part of the batch the server skips.
        msg::parse("s2", "SELECT 2 AS b", &[]),
        msg::sync(),
        // The same text as s1 again, before the error above is known.
        msg::parse("s3", noon, &[]),
        msg::sync(),
    ];
    pipelined.extend(exec("s3", &[]));
    let steps = vec![
        (A, vec![msg::parse("s1", noon, &[]), msg::sync()]),
        (A, pipelined),
        (A, exec("s1", &[])),
        (A, vec![msg::parse("s2", "SELECT 2 AS b", &[]), msg::sync()]),
        (A, exec("s2", &[])),
        (A, exec("s3", &[])),
    ];
    let direct = same_as_postgres(&steps).await;
    assert!(shows(&direct, " 1 A| ", "DataRow [1]"), "{direct:#?}");
    same_through_evicting(&direct, &steps).await;
}

/// The same for a SQL-level `PREPARE` pipelined behind the skipped eviction: pgmemo closes
/// its statement (a Close and a Sync of its own) before the Query that prepares it again.
#[tokio::test]
async fn a_skipped_eviction_does_not_make_a_pipelined_sql_prepare_collide() {
    use Who::A;
    let prepare = |name: &str| msg::query(&format!("PREPARE {name} AS SELECT 1 AS a"));
    let pipelined = vec![
        msg::parse("", "SELECT 1/0 AS boom", &[]),
        msg::bind("", "", &[]),
        msg::execute("", 0),
        // Evicts q1's statement to make room, in the part of the batch the server skips.
        msg::parse("s2", "SELECT 2 AS b", &[]),
        msg::sync(),
        // The same text as q1 again, before the error above is known.
        prepare("q3"),
        msg::query("EXECUTE q3"),
    ];
    let steps = vec![
        (A, vec![prepare("q1")]),
        (A, pipelined),
        (A, vec![msg::query("EXECUTE q1")]),
        (A, vec![msg::parse("s2", "SELECT 2 AS b", &[]), msg::sync()]),
        (A, exec("s2", &[])),
        (A, vec![msg::query("EXECUTE q3; EXECUTE q1")]),
    ];
    let direct = same_as_postgres(&steps).await;
    assert!(shows(&direct, " 1 A| ", "DataRow [1]"), "{direct:#?}");
    same_through_evicting(&direct, &steps).await;
}

/// A `set_config` in a query whose portal stops after its first row (Execute with a row
/// limit: PortalSuspended, no CommandComplete) changed the setting all the same, also after a
/// `SET` of the same setting earlier in the transaction: the client keeps the value
/// `set_config` gave it after COMMIT, on its next server too (damaged-message fuzz seed 811,
/// where pgmemo took the report for the `SET`'s and put back the `SET`'s value).
#[tokio::test]
async fn a_set_config_in_a_suspended_portal_counts_after_a_set() {
    within(TEST_DEADLINE, async {
        use Who::{A, B};
        let steps = vec![
            (A, vec![msg::query("BEGIN")]),
            (
                A,
                vec![
                    msg::parse("", "SET application_name = 'fz_one'", &[]),
                    msg::bind("", "", &[]),
                    msg::execute("", 0),
                    msg::sync(),
                ],
            ),
            (
                A,
                vec![
                    msg::parse(
                        "",
                        "SELECT set_config('application_name', 'fz_two', false)",
                        &[],
                    ),
                    msg::bind("p1", "", &[]),
                    msg::describe(b'P', "p1"),
                    msg::execute("p1", 1),
                    msg::close(b'P', "p1"),
                    msg::sync(),
                ],
            ),
            (A, vec![msg::query("COMMIT")]),
            (B, vec![msg::query("SHOW application_name")]),
            (A, vec![msg::query("SHOW application_name")]),
        ];
        let direct = same_as_postgres(&steps).await;
        assert!(
            direct.iter().any(|l| l.contains("A| DataRow [fz_two]")),
            "{direct:#?}"
        );
    })
    .await
}

/// A function that sets a reported setting (here `application_name`) in a later request of
/// the transaction than a `SET` of the same setting: the server's report of the function's
/// value is not the `SET`'s, and the function's value is what the client keeps after COMMIT.
/// The same for a `DO` block after a `SET` in one request (one report for both).
#[tokio::test]
async fn a_function_setting_what_a_set_set_earlier_in_the_transaction_counts() {
    within(TEST_DEADLINE, async {
        use Who::{A, B};
        let f = unique("set_app_name");
        let direct = LocalPostgres.client(USER, DB).await;
        direct
            .batch_execute(&format!(
                "CREATE FUNCTION {f}() RETURNS text LANGUAGE plpgsql AS $$ BEGIN \
                 PERFORM set_config('application_name', 'fz_three', false); RETURN 'x'; END $$"
            ))
            .await
            .unwrap();
        let steps = vec![
            (A, vec![msg::query("BEGIN")]),
            (A, vec![msg::query("SET application_name = 'fz_one'")]),
            (A, vec![msg::query(&format!("SELECT {f}()"))]),
            (A, vec![msg::query("COMMIT")]),
            (B, vec![msg::query("SHOW application_name")]),
            (A, vec![msg::query("SHOW application_name")]),
            (
                A,
                vec![msg::query(
                    "BEGIN; SET application_name = 'fz_one'; DO $$ BEGIN \
                     PERFORM set_config('application_name', 'fz_four', false); END $$",
                )],
            ),
            (A, vec![msg::query("COMMIT")]),
            (B, vec![msg::query("SHOW application_name")]),
            (A, vec![msg::query("SHOW application_name")]),
        ];
        let answers = same_as_postgres(&steps).await;
        direct
            .batch_execute(&format!("DROP FUNCTION {f}()"))
            .await
            .unwrap();
        assert!(
            answers.iter().any(|l| l.contains("A| DataRow [fz_three]"))
                && answers.iter().any(|l| l.contains("A| DataRow [fz_four]")),
            "{answers:#?}"
        );
    })
    .await
}

/// A Describe of a portal tells the client the shape of the rows of the statement last bound
/// to it, unless that Bind failed or was skipped: here the portal is still the one a `SET`
/// left (NoData), and noting that as the query's shape made pgmemo refuse the query's next
/// Bind with 0A000 as if its result type had changed (differential seed 21831).
#[tokio::test]
async fn a_portal_described_after_its_bind_was_skipped_teaches_no_row_shape() {
    within(TEST_DEADLINE, async {
        use Who::B;
        let seq = unique("skipped_bind_seq");
        LocalPostgres
            .client(USER, DB)
            .await
            .batch_execute(&format!("CREATE SEQUENCE {seq}"))
            .await
            .unwrap();
        let steps = vec![
            (
                B,
                vec![msg::query("BEGIN ISOLATION LEVEL SERIALIZABLE; RESET ALL")],
            ),
            (
                B,
                vec![
                    msg::parse("s2", &format!("SELECT nextval('{seq}') AS n"), &[]),
                    msg::sync(),
                ],
            ),
            (
                B,
                vec![
                    msg::parse("s1", "SET DateStyle = 'ISO, MDY'", &[]),
                    msg::bind("p1", "s1", &[]),
                    msg::describe(b'P', "p1"),
                    msg::execute("p1", 0),
                    msg::execute("p1", 0),
                    msg::sync(),
                ],
            ),
            (
                B,
                vec![
                    msg::parse("", "SELECT '2020-01-01 12:00'::timestamptz AS t", &[]),
                    msg::bind("p1", "s2", &[]),
                    msg::execute("p1", 0),
                    msg::parse("s2", "SELECT 2 AS n, 3 AS s", &[]),
                    msg::parse("s1", "RESET ALL", &[]),
                    msg::sync(),
                ],
            ),
            (
                B,
                vec![
                    msg::describe(b'P', "p1"),
                    msg::sync(),
                    msg::bind("p1", "s1", &[]),
                    msg::sync(),
                ],
            ),
            (B, vec![msg::query("ROLLBACK")]),
            (
                B,
                vec![
                    msg::parse("s1", "RELEASE SAVEPOINT sp", &[]),
                    msg::bind("p1", "s1", &[]),
                    msg::execute("p1", 0),
                    msg::sync(),
                    msg::bind("", "s2", &[]),
                    msg::close(b'P', "p1"),
                    msg::sync(),
                ],
            ),
        ];
        same_as_postgres(&steps).await;
    })
    .await;
}

/// A Bind with a wrong parameter count fails with that count (08P01) as in PostgreSQL, which
/// checks the counts before it finds the statement's result type changed, also where pgmemo
/// would refuse the Bind itself because the server's statement has another shape than the
/// client described (0A000; differential seed 19670).
#[tokio::test]
async fn a_wrong_parameter_count_comes_before_a_changed_result_type() {
    within(TEST_DEADLINE, async {
        use Who::A;
        let t = create_table("count_first", "(k int, v text)").await;
        let q = |sql: String| (A, vec![msg::query(&sql)]);
        let steps = vec![
            q(format!("ALTER TABLE {t} DROP COLUMN IF EXISTS w")),
            (
                A,
                vec![
                    msg::parse("s1", &format!("SELECT * FROM {t}"), &[]),
                    msg::describe(b'S', "s1"),
                    msg::sync(),
                ],
            ),
            (A, exec("s1", &[])),
            q(format!("ALTER TABLE {t} ADD COLUMN w int DEFAULT 7")),
            (A, exec("s1", &[])),
            (A, exec("s1", &[Some("1")])),
            (A, exec("s1", &[])),
        ];
        let direct = same_as_postgres(&steps).await;
        assert!(
            shows(&direct, " 5 A| ", "08P01") && shows(&direct, " 6 A| ", "0A000"),
            "{direct:#?}"
        );
        same_through_evicting(&direct, &steps).await;
        drop_table(&t).await;
    })
    .await;
}

/// Extended-protocol messages whose layout is wrong (truncated, with bytes left over, a bad
/// Describe or Close target) fail as in PostgreSQL, which reads the whole message before it
/// acts on it: an error (08P01), the rest of the batch skipped up to its Sync, a transaction
/// block aborted; the session, and the server it shares, go on. So do names and texts that
/// are not UTF-8 from a UTF-8 client (22021).
#[tokio::test]
async fn malformed_messages_fail_as_in_postgres() {
    within(TEST_DEADLINE, async {
        let f = msg::frame;
        let batch = |mut messages: Vec<Vec<u8>>| {
            messages.push(msg::sync());
            messages
        };
        let steps = vec![
            // A Bind too short for its counts, an Execute too short for its row limit.
            (
                Who::A,
                batch(vec![
                    msg::parse("", "SELECT 1", &[]),
                    f(b'B', b"\0\0\0"),
                    msg::execute("", 0),
                ]),
            ),
            (
                Who::A,
                batch(vec![
                    msg::parse("", "SELECT 1", &[]),
                    msg::bind("", "", &[]),
                    f(b'E', b"\0\0\0"),
                ]),
            ),
            // Bad targets, a name without its terminator, bytes left over.
            (
                Who::A,
                batch(vec![
                    msg::parse("s1", "SELECT 2", &[]),
                    f(b'D', b"X\0"),
                    msg::execute("", 0),
                ]),
            ),
            (Who::B, vec![msg::query("SELECT 'B in between'")]),
            (Who::A, batch(vec![f(b'C', b"Xs1\0")])),
            (Who::A, batch(vec![f(b'P', b"s2\0SELECT 3")])),
            (Who::A, batch(vec![f(b'P', b"s2\0SELECT 3\0\0\0junk")])),
            (
                Who::A,
                batch(vec![f(b'D', b"Ss1\0junk"), msg::describe(b'S', "s1")]),
            ),
            (Who::A, batch(vec![f(b'E', b"\0\0\0\0\0junk")])),
            // What the failed messages named is as it was: s1 parsed before the error, s2 never.
            (
                Who::A,
                batch(vec![msg::bind("", "s1", &[]), msg::execute("", 0)]),
            ),
            (
                Who::A,
                batch(vec![msg::bind("", "s2", &[]), msg::execute("", 0)]),
            ),
            // Inside a block: the block fails.
            (Who::A, vec![msg::query("BEGIN")]),
            (Who::A, batch(vec![f(b'D', b"X\0")])),
            (Who::A, vec![msg::query("SELECT 'aborted'")]),
            (Who::A, vec![msg::query("ROLLBACK")]),
            (Who::A, vec![msg::query("SELECT 'A goes on'")]),
            // Bytes that are not UTF-8 from a UTF-8 client, in a name or a text.
            (Who::A, batch(vec![f(b'P', b"s3\0SELECT '\xff'\0\0\0")])),
            (Who::A, batch(vec![f(b'P', b"s\xff\0SELECT 1\0\0\0")])),
            (Who::A, batch(vec![f(b'P', b"s\xe9\0SELECT '\xff'\0\0\0")])),
            (
                Who::A,
                batch(vec![f(b'B', b"\0s\xff\0\0\0\0\0\0\0"), msg::execute("", 0)]),
            ),
            (Who::A, batch(vec![f(b'D', b"Ss\xff\0")])),
            (Who::A, batch(vec![f(b'C', b"Ss\xff\0")])),
            (
                Who::A,
                batch(vec![msg::bind("", "s1", &[]), msg::execute("", 0)]),
            ),
            // PostgreSQL refuses such an unnamed Parse while it reads it, before it drops the
            // unnamed statement it had: that one still runs (B's Query in between dropped it
            // on the server they share).
            (
                Who::A,
                batch(vec![
                    msg::parse("", "SELECT $1::int AS kept", &[]),
                    msg::bind("", "", &[Some("1")]),
                    msg::execute("", 0),
                ]),
            ),
            (Who::B, vec![msg::query("SELECT 'B in between'")]),
            (Who::A, batch(vec![f(b'P', b"\0SELECT '\xff'\0\0\0")])),
            // A Query with bytes after its text's terminator runs nothing (08P01).
            (
                Who::A,
                vec![f(b'Q', b"SET application_name = 'never'\0\xff\0")],
            ),
            (Who::A, vec![msg::query("SHOW application_name")]),
            (
                Who::A,
                batch(vec![msg::bind("", "", &[Some("2")]), msg::execute("", 0)]),
            ),
        ];
        let transcript = same_as_postgres(&steps).await;
        same_in_session_pooling(&transcript, &steps).await;
        let errors = transcript.iter().filter(|l| l.contains("08P01")).count();
        assert_eq!(errors, 10, "{transcript:#?}");
        let errors = transcript.iter().filter(|l| l.contains("22021")).count();
        assert_eq!(errors, 7, "{transcript:#?}");
        assert!(
            transcript.iter().any(|l| l.ends_with("DataRow [2]")),
            "{transcript:#?}"
        );
    })
    .await;
}

/// The client's unnamed statement outlives messages PostgreSQL fails before they act: a Bind
/// cut short (the rest of its batch skipped, a Close of the statement with it), an unnamed
/// Parse with bytes left over. With the cache on, the batch that made the statement was
/// answered from the cache, and the server still had to get it: pgmemo once sent it along
/// with a message the failed batch skipped, or took the failed Parse for its replacement,
/// and the next Bind found no statement (26000). Also, a Bind whose portal name is not UTF-8
/// fails on that name (22021) before pgmemo's own checks of the statement it names (seed 5
/// of `randomly_damaged_messages_fail_as_in_postgres` with 1,000 batches), and a Parse
/// PostgreSQL fails that way leaves the server's unnamed statement as it was, which pgmemo
/// must then close before the client's Bind of the unnamed statement (seed 60).
#[tokio::test]
async fn an_unnamed_statement_outlives_messages_postgres_fails() {
    within(TEST_DEADLINE, async {
        let t = create_table("unnamed_kept", "(k int PRIMARY KEY, v text)").await;
        LocalPostgres
            .client(USER, DB)
            .await
            .batch_execute(&format!("INSERT INTO {t} VALUES (1, 'one')"))
            .await
            .unwrap();
        let f = msg::frame;
        let select = format!("SELECT v FROM {t} WHERE k = $1");
        let read = vec![
            msg::parse("", &select, &[]),
            msg::bind("", "", &[Some("1")]),
            msg::describe(b'P', ""),
            msg::execute("", 0),
            msg::sync(),
        ];
        let steps = vec![
            (Who::A, read.clone()),
            (Who::A, read.clone()),
            // A Query drops the unnamed statement; the read parses it again (from the cache).
            (Who::A, vec![msg::query("SELECT 'A'")]),
            // Pipelined behind the read, with a Flush: relayed message by message.
            (
                Who::A,
                [
                    read.clone(),
                    vec![
                        f(b'B', b"p"),
                        msg::describe(b'S', ""),
                        msg::flush(),
                        msg::close(b'S', ""),
                        msg::sync(),
                    ],
                ]
                .concat(),
            ),
            (Who::A, exec("", &[Some("1")])),
            (Who::A, vec![msg::query("SELECT 'A again'")]),
            (Who::A, read.clone()),
            (
                Who::A,
                vec![f(b'P', b"\0SELECT 1 AS a\0\0\0!\x14"), msg::sync()],
            ),
            (Who::A, exec("", &[Some("1")])),
            // B's Query drops the unnamed statement of the server they share.
            (Who::B, vec![msg::query("SELECT 'B in between'")]),
            (Who::A, vec![f(b'B', b"p\xff\0\0\0\0\0\0\0"), msg::sync()]),
            (Who::A, exec("", &[Some("1")])),
            // A duplicate named Parse is analysed as the server's unnamed statement; a named
            // Parse whose text is not UTF-8 fails (22021) while PostgreSQL reads it, which
            // leaves that unnamed statement on the server. The client has none (26000).
            (Who::A, vec![msg::query("SELECT 'A drops it'")]),
            (
                Who::A,
                vec![msg::parse("s1", "SELECT $1::int AS b", &[]), msg::sync()],
            ),
            (
                Who::A,
                vec![msg::parse("s1", "SELECT $1::int AS b", &[]), msg::sync()],
            ),
            (
                Who::A,
                vec![f(b'P', b"s2\0SELECT '\xff'\0\0\0"), msg::sync()],
            ),
            (Who::A, exec("", &[])),
        ];
        let transcript = same_as_postgres(&steps).await;
        same_in_session_pooling(&transcript, &steps).await;
        let rows = transcript.iter().filter(|l| l.ends_with("DataRow [one]"));
        assert_eq!(rows.count(), 7, "{transcript:#?}");
        let errors = transcript.iter().filter(|l| l.contains("22021")).count();
        assert_eq!(errors, 2, "{transcript:#?}");
        assert!(
            transcript
                .last_chunk::<2>()
                .is_some_and(|[e, _]| e.contains("26000")),
            "{transcript:#?}"
        );
        drop_table(&t).await;
    })
    .await;
}

/// A Query that executes one SQL-level statement and prepares another runs both when the
/// server may hold only one (`max_prepared_statements` = 1): pgmemo prepares what the Query
/// executes before sending it, and once closed the first to make room for the second, so
/// that the `EXECUTE` failed with 26000 (seed 45 of the damaged-session-statements fuzzer
/// with 1,000 batches).
#[tokio::test]
async fn a_query_keeps_the_statements_it_uses_on_a_full_server() {
    within(TEST_DEADLINE, async {
        let steps = vec![
            (Who::A, vec![msg::query("PREPARE q1 AS SELECT 1 AS one")]),
            (Who::A, vec![msg::query("PREPARE q2 AS SELECT 2 AS two")]),
            (
                Who::A,
                vec![msg::query(
                    "EXECUTE q1; PREPARE q3 AS SELECT 3 AS three; EXECUTE q3",
                )],
            ),
            (Who::B, vec![msg::query("SELECT 'B in between'")]),
            (
                Who::A,
                vec![msg::query("EXECUTE q2; EXECUTE q3; EXECUTE q1")],
            ),
            (Who::A, vec![msg::query("DEALLOCATE ALL")]),
        ];
        let transcript = same_as_postgres(&steps).await;
        same_through_evicting(&transcript, &steps).await;
        let rows = transcript
            .iter()
            .filter(|l| l.contains("| DataRow ["))
            .count();
        assert_eq!(rows, 6, "{transcript:#?}");
    })
    .await;
}

/// A Sync or a Flush with bytes in its body fails as in PostgreSQL (08P01), with transaction
/// and session pooling, cache on and off. PostgreSQL fails such a Sync before it commits: the
/// implicit transaction is rolled back (a `SET` in it too) and ReadyForQuery follows; a failed
/// Flush skips the batch to its Sync. pgmemo once answered them as a plain Sync or Flush, from
/// the cache or without a server.
#[tokio::test]
async fn a_sync_or_flush_with_a_body_fails_as_in_postgres() {
    within(TEST_DEADLINE, async {
        let t = create_table("sync_body", "(k int PRIMARY KEY, v text)").await;
        LocalPostgres
            .client(USER, DB)
            .await
            .batch_execute(&format!("INSERT INTO {t} VALUES (1, 'one')"))
            .await
            .unwrap();
        let f = msg::frame;
        let select = format!("SELECT v FROM {t} WHERE k = $1");
        let read = |sync: Vec<u8>| {
            vec![
                msg::parse("", &select, &[]),
                msg::bind("", "", &[Some("1")]),
                msg::describe(b'P', ""),
                msg::execute("", 0),
                sync,
            ]
        };
        let set_in = |sync: Vec<u8>| {
            vec![
                msg::parse("", "SET application_name = 'rolled_back'", &[]),
                msg::bind("", "", &[]),
                msg::execute("", 0),
                sync,
            ]
        };
        let steps = vec![
            (Who::A, vec![f(b'S', b"x")]),
            (Who::B, vec![msg::query("SELECT 'B in between'")]),
            // Twice cleanly (the cache keeps it), then ended by a Sync with a body.
            (Who::A, read(msg::sync())),
            (Who::A, read(msg::sync())),
            (Who::A, read(f(b'S', b"junk"))),
            (Who::A, set_in(f(b'S', b"\0"))),
            (Who::A, vec![msg::query("SHOW application_name")]),
            (Who::A, set_in(msg::sync())),
            (Who::B, vec![msg::query("SHOW application_name")]),
            (Who::A, vec![msg::query("SHOW application_name")]),
            (Who::A, vec![f(b'H', b"x"), msg::sync()]),
            (
                Who::A,
                vec![
                    msg::parse("", "SELECT 1", &[]),
                    f(b'H', b"xy"),
                    msg::bind("", "", &[]),
                    msg::execute("", 0),
                    msg::sync(),
                ],
            ),
            (Who::A, vec![msg::flush(), msg::query("SELECT 'A goes on'")]),
            // Inside a block: the block fails.
            (Who::A, vec![msg::query("BEGIN")]),
            (Who::A, vec![f(b'S', b"x")]),
            (Who::A, vec![msg::query("SELECT 'aborted'")]),
            (Who::A, vec![msg::query("ROLLBACK")]),
            (Who::A, read(msg::sync())),
        ];
        let transcript = same_as_postgres(&steps).await;
        let errors = transcript.iter().filter(|l| l.contains("08P01")).count();
        assert_eq!(errors, 6, "{transcript:#?}");
        same_in_session_pooling(&transcript, &steps).await;
        drop_table(&t).await;
    })
    .await;
}

/// Batches with one message damaged at random (cut short, lengthened, one byte replaced or
/// dropped; a Sync or a Flush given a body), seeded: every answer as from PostgreSQL, which
/// checks a message's layout (and a UTF-8 client's bytes) before it acts on it. The mutation
/// fuzzer that found the cases of [`malformed_messages_fail_as_in_postgres`], kept as a test.
#[tokio::test]
async fn randomly_damaged_messages_fail_as_in_postgres() {
    within(TEST_DEADLINE, async {
        let t = create_table("damaged", "(k int PRIMARY KEY, v text)").await;
        LocalPostgres
            .client(USER, DB)
            .await
            .batch_execute(&format!("INSERT INTO {t} VALUES (7, 'seven')"))
            .await
            .unwrap();
        // xorshift64*: a few hundred numbers, the same on every run.
        // `PGMEMO_FUZZ_SEED` and `PGMEMO_FUZZ_BATCHES` run other batches, for a longer search;
        // `PGMEMO_FUZZ_PRINT` prints each step's messages.
        let mut state = std::env::var("PGMEMO_FUZZ_SEED")
            .map_or(0x9e37_79b9_7f4a_7c15u64, |s| s.parse().expect("a u64 seed"));
        let batches: usize = std::env::var("PGMEMO_FUZZ_BATCHES")
            .map_or(300, |s| s.parse().expect("a number of batches"));
        let mut next = move |below: usize| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % below.max(1)
        };
        let texts = [
            "SELECT 1 AS a".to_owned(),
            "SELECT $1::int AS b".to_owned(),
            format!("SELECT v FROM {t} WHERE k = $1"),
        ];
        let mut steps = Vec::new();
        for _ in 0..batches {
            let text = &texts[next(texts.len())];
            let params: Vec<Option<&str>> = vec![Some("7"); text.matches('$').count()];
            let name = ["", "s1"][next(2)];
            let mut messages = vec![
                msg::parse(name, text, &[]),
                msg::bind("", name, &params),
                msg::describe(b'P', ""),
                msg::execute("", 0),
                msg::sync(),
                msg::bind("p1", name, &params),
                msg::describe(b'S', name),
                msg::flush(),
                msg::execute("p1", 0),
                msg::close(b'P', "p1"),
                msg::close(b'S', name),
                msg::sync(),
            ];
            let at = next(messages.len());
            let victim = &mut messages[at];
            let mut body = victim[5..].to_vec();
            match next(4) {
                0 if !body.is_empty() => body.truncate(next(body.len())),
                1 => body.extend((0..=next(3)).map(|_| next(256) as u8)),
                2 if !body.is_empty() => {
                    let at = next(body.len());
                    body[at] = [0, 0xff, b'X', 1][next(4)];
                }
                _ if !body.is_empty() => {
                    body.remove(next(body.len()));
                }
                _ => body.push(b'X'),
            }
            *victim = msg::frame(victim[0], &body);
            if std::env::var_os("PGMEMO_FUZZ_PRINT").is_some() {
                eprintln!("step {}: {messages:?}", steps.len());
            }
            steps.push((Who::A, messages));
            steps.push((Who::B, vec![msg::query("SELECT 'B in between'")]));
        }
        let transcript = same_as_postgres(&steps).await;
        same_in_session_pooling(&transcript, &steps).await;
        same_through_evicting(&transcript, &steps).await;
        let refused = transcript
            .iter()
            .filter(|l| l.contains("08P01") || l.contains("22021"))
            .count();
        assert!(refused >= batches / 2, "{transcript:#?}");
        drop_table(&t).await;
    })
    .await;
}

/// Damaged messages that carry statements changing session state (settings, SQL-level
/// prepared statements, transaction blocks), simple or extended protocol, seeded: after each
/// the client reads back its settings and statements, and the other client on the same
/// server checks it sees none of them; every answer as from PostgreSQL. `PGMEMO_FUZZ_SEED`
/// and `PGMEMO_FUZZ_BATCHES` run other batches; `PGMEMO_FUZZ_PRINT` prints what each step
/// sends.
#[tokio::test]
async fn randomly_damaged_session_statements_fail_as_in_postgres() {
    within(TEST_DEADLINE, async {
        let t = create_table("damaged_copy", "(k int, v text)").await;
        let mut state = std::env::var("PGMEMO_FUZZ_SEED")
            .map_or(0x2545_f491_4f6c_dd1du64, |s| s.parse().expect("a u64 seed"));
        let batches: usize = std::env::var("PGMEMO_FUZZ_BATCHES")
            .map_or(200, |s| s.parse().expect("a number of batches"));
        let mut next = move |below: usize| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % below.max(1)
        };
        let texts = [
            "SET application_name = 'fz_one'",
            "SET TimeZone = 'Asia/Tokyo'",
            "RESET ALL",
            "PREPARE q1 AS SELECT 1 AS one",
            "DEALLOCATE q1",
            "EXECUTE q1",
            "BEGIN",
            "COMMIT",
            "SELECT set_config('application_name', 'fz_two', false)",
            "SET LOCAL TimeZone = 'America/Lima'",
            "SAVEPOINT sp",
            "ROLLBACK TO sp",
            "RELEASE sp",
            "DISCARD ALL",
            "DEALLOCATE ALL",
            "RESET TimeZone",
            "SET search_path = pg_catalog, public",
            "ROLLBACK",
        ];
        // Every run (direct, then through pgmemo) starts from an empty table.
        let mut steps = vec![(Who::B, vec![msg::query(&format!("TRUNCATE {t}"))])];
        for _ in 0..batches {
            let first = texts[next(texts.len())];
            let second = texts[next(texts.len())];
            let mut messages = match next(6) {
                0 => vec![msg::query(&format!("{first}; {second}"))],
                1 => vec![msg::query(first), msg::query(second)],
                // In a block, through a named portal and the unnamed one.
                2 => vec![
                    msg::query("BEGIN"),
                    msg::parse("", first, &[]),
                    msg::bind("p1", "", &[]),
                    msg::execute("p1", 0),
                    msg::sync(),
                    msg::parse("", second, &[]),
                    msg::bind("", "", &[]),
                    msg::describe(b'P', ""),
                    msg::execute("", 0),
                    msg::close(b'P', "p1"),
                    msg::sync(),
                    msg::query("COMMIT"),
                ],
                // set_config (OID 2078) called by OID, and a statement.
                3 => vec![
                    msg::function_call(2078, &["application_name", "fz_three", "false"]),
                    msg::query(first),
                ],
                // COPY FROM STDIN, then a statement and a count of what the COPY kept.
                4 => vec![
                    msg::query(&format!("COPY {t} FROM STDIN")),
                    msg::copy_data(b"1\tone\n2\ttwo\n"),
                    msg::frame(b'c', b""),
                    msg::query(first),
                    msg::query(&format!("SELECT count(*) FROM {t}")),
                ],
                _ => {
                    // Transaction pooling refuses SQL-level PREPARE, EXECUTE and DEALLOCATE
                    // in a named statement (docs/transaction-pooling.md).
                    let sql_level = ["PREPARE", "EXECUTE", "DEALLOCATE", "DISCARD"]
                        .iter()
                        .any(|w| first.starts_with(w));
                    let name = if sql_level { "" } else { ["", "s1"][next(2)] };
                    vec![
                        msg::parse(name, first, &[]),
                        msg::bind("", name, &[]),
                        msg::execute("", 0),
                        msg::sync(),
                        msg::parse("", second, &[]),
                        msg::bind("", "", &[]),
                        msg::execute("", 0),
                        msg::close(b'S', name),
                        msg::sync(),
                    ]
                }
            };
            let at = next(messages.len());
            let victim = &mut messages[at];
            let mut body = victim[5..].to_vec();
            match next(4) {
                0 if !body.is_empty() => body.truncate(next(body.len())),
                1 => body.extend((0..=next(3)).map(|_| next(256) as u8)),
                2 if !body.is_empty() => {
                    let at = next(body.len());
                    // Not 0xff: transaction pooling refuses a statement that may change
                    // session state when it is not UTF-8 (documented).
                    body[at] = [0, 1, b'X', b';'][next(4)];
                }
                _ if !body.is_empty() => {
                    body.remove(next(body.len()));
                }
                _ => body.push(b'X'),
            }
            *victim = msg::frame(victim[0], &body);
            if !messages.iter().any(|m| matches!(m[0], b'S' | b'Q')) {
                messages.push(msg::sync());
            }
            if std::env::var_os("PGMEMO_FUZZ_PRINT").is_some() {
                let shown: Vec<_> = messages
                    .iter()
                    .map(|m| String::from_utf8_lossy(m))
                    .collect();
                eprintln!("step {}: {shown:?}", steps.len());
            }
            steps.push((Who::A, messages));
            steps.push((
                Who::A,
                vec![
                    msg::query("SHOW application_name; SHOW TimeZone; SHOW search_path"),
                    msg::query("EXECUTE q1"),
                    msg::query("ROLLBACK"),
                ],
            ));
            steps.push((
                Who::B,
                vec![msg::query("SHOW application_name; SHOW TimeZone")],
            ));
        }
        let transcript = same_as_postgres(&steps).await;
        same_in_session_pooling(&transcript, &steps).await;
        same_through_evicting(&transcript, &steps).await;
        drop_table(&t).await;
    })
    .await;
}

/// A client whose `client_encoding` is not UTF-8 (LATIN1 here): its queries, simple or
/// unnamed extended-protocol ones, go to the server as it sent them, accented literals and
/// all, as PostgreSQL gets them. What pgmemo must read but cannot (a named prepared
/// statement, a statement that may change session state, whose bytes are not UTF-8) is
/// refused with 0A000, and the session goes on.
#[tokio::test]
async fn a_latin1_client_runs_its_queries_through_transaction_pooling() {
    within(TEST_DEADLINE, async {
        let latin1 = |text: &str| -> Vec<u8> {
            text.chars()
                .map(|c| u8::try_from(u32::from(c)).unwrap())
                .collect()
        };
        let parse = |name: &str, text: &str| {
            let mut body = name.as_bytes().to_vec();
            body.push(0);
            body.extend_from_slice(&latin1(text));
            body.extend_from_slice(&[0, 0, 0]);
            msg::frame(b'P', &body)
        };
        let query = |text: &str| {
            let mut body = latin1(text);
            body.push(0);
            msg::frame(b'Q', &body)
        };
        let select = "SELECT 'été' AS v, length('été') AS n";
        let steps = vec![
            (Who::A, vec![msg::query("SET client_encoding = 'LATIN1'")]),
            (Who::B, vec![msg::query("SELECT 'B in between'")]),
            (
                Who::A,
                vec![
                    parse("", select),
                    msg::bind("", "", &[]),
                    msg::describe(b'P', ""),
                    msg::execute("", 0),
                    msg::sync(),
                ],
            ),
            (Who::B, vec![msg::query("SELECT 'B in between'")]),
            (
                Who::A,
                vec![msg::bind("", "", &[]), msg::execute("", 0), msg::sync()],
            ),
            (Who::A, vec![query(select)]),
            (Who::A, vec![query("SHOW client_encoding")]),
            // A name that is not UTF-8 and that nothing created: 26000, and a Close of it
            // changes nothing, as in PostgreSQL.
            (
                Who::A,
                vec![
                    msg::frame(b'B', b"\0s\xe9\0\0\0\0\0\0\0"),
                    msg::execute("", 0),
                    msg::sync(),
                ],
            ),
            (Who::A, vec![msg::frame(b'D', b"Ss\xe9\0"), msg::sync()]),
            (Who::A, vec![msg::frame(b'C', b"Ss\xe9\0"), msg::sync()]),
        ];
        let transcript = same_as_postgres(&steps).await;
        assert!(
            transcript
                .iter()
                .any(|l| l.contains("DataRow [\u{fffd}t\u{fffd}, 3]")),
            "{transcript:#?}"
        );

        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let mut a = txn_support::Raw::login(pgmemo.port()).await;
        a.exchange(&[msg::query("SET client_encoding = 'LATIN1'")])
            .await;
        for refused in [
            vec![parse("s1", select), msg::sync()],
            vec![query("SET application_name = 'café'")],
            vec![
                parse("", "SET application_name = 'café'"),
                msg::bind("", "", &[]),
                msg::execute("", 0),
                msg::sync(),
            ],
        ] {
            let answer = a.exchange(&refused).await;
            assert!(answer.iter().any(|l| l.contains("0A000")), "{answer:#?}");
        }
        let answer = a.exchange(&[msg::query("SELECT 'A goes on'")]).await;
        assert!(
            answer.iter().any(|l| l.contains("A goes on")),
            "{answer:#?}"
        );
        pgmemo.shutdown().await;
    })
    .await;
}

/// A prepared statement reads its literals under the settings of the session that prepared
/// it, and keeps that reading after a later SET (PostgreSQL analyses it once). Two clients
/// that prepare the same text under different TimeZones on one server each get their own
/// reading, as each would from a server of its own.
#[tokio::test]
async fn a_prepared_statement_reads_literals_under_its_clients_settings() {
    use Who::{A, B};
    let sql = "SELECT '2020-01-01 00:00'::timestamptz = '2020-01-01 00:00+00'::timestamptz";
    let q = |sql: &str| vec![msg::query(sql)];
    let steps = vec![
        (A, q("SET TimeZone = 'UTC'")),
        (A, vec![msg::parse("s1", sql, &[]), msg::sync()]),
        (A, exec("s1", &[])),
        (B, q("SET TimeZone = 'Asia/Tokyo'")),
        (B, vec![msg::parse("s1", sql, &[]), msg::sync()]),
        (B, exec("s1", &[])),
        // Parsed under UTC: still true after A moves to Tokyo.
        (A, q("SET TimeZone = 'Asia/Tokyo'")),
        (A, exec("s1", &[])),
        (A, exec("s1", &[])),
        (B, exec("s1", &[])),
        (B, exec("s1", &[])),
    ];
    let transcript = same_as_postgres(&steps).await;
    let rows: Vec<&String> = transcript
        .iter()
        .filter(|l| l.contains("DataRow"))
        .collect();
    assert_eq!(rows.len(), 6, "{transcript:#?}");
    for (row, expected) in rows.iter().zip(["t", "f", "t", "t", "f", "f"]) {
        assert!(
            row.ends_with(&format!("DataRow [{expected}]")),
            "{transcript:#?}"
        );
    }
}

/// What pgmemo runs on its own behalf in the middle of a client's batch (preparing a
/// statement again on a server that lacks it, under the settings it was first prepared
/// with) leaves the client's unnamed portal alone: a portal bound before it runs after it,
/// for a protocol-level statement and for an SQL-level `EXECUTE` parsed as the unnamed
/// statement. `max_prepared_statements` = 1 makes the server lack them.
#[tokio::test]
async fn statements_prepared_again_mid_batch_leave_the_clients_unnamed_portal_alone() {
    use Who::A;
    let literal = "SELECT extract(epoch FROM '2024-01-01 00:00'::timestamptz)::int8";
    let q = |sql: &str| (A, vec![msg::query(sql)]);
    let evict = (
        A,
        vec![msg::bind("", "o", &[]), msg::execute("", 0), msg::sync()],
    );
    let steps = vec![
        q("SET TimeZone = 'UTC'"),
        (A, vec![msg::parse("s", literal, &[]), msg::sync()]),
        q(&format!("PREPARE lit AS {literal}")),
        q("SET TimeZone = 'America/New_York'"),
        (A, vec![msg::parse("o", "SELECT 2", &[]), msg::sync()]),
        evict.clone(),
        (
            A,
            vec![
                msg::parse("", "SELECT 'mine'", &[]),
                msg::bind("", "", &[]),
                msg::bind("p", "s", &[]),
                msg::execute("", 0),
                msg::execute("p", 0),
                msg::sync(),
            ],
        ),
        evict,
        (
            A,
            vec![
                msg::parse("", "SELECT 'mine again'", &[]),
                msg::bind("", "", &[]),
                msg::parse("", "EXECUTE lit", &[]),
                msg::bind("q", "", &[]),
                msg::execute("", 0),
                msg::execute("q", 0),
                msg::sync(),
            ],
        ),
        q("SHOW TimeZone"),
    ];
    let direct = run_script(LocalPostgres::PORT, &steps).await;
    let rows: Vec<&String> = direct.iter().filter(|l| l.contains("DataRow")).collect();
    assert_eq!(rows.len(), 7, "{direct:#?}");
    same_through_evicting(&direct, &steps).await;
}

/// The type bytes of every answer to `messages` (ParameterStatus included) up to the first
/// ReadyForQuery.
async fn tags(raw: &mut txn_support::Raw, messages: &[Vec<u8>]) -> String {
    raw.send(messages).await;
    let mut tags = String::new();
    loop {
        let (tag, _) = raw.recv().await;
        tags.push(tag as char);
        if tag == b'Z' {
            return tags;
        }
    }
}

/// A Describe of a statement the server lacks gets what PostgreSQL, which describes a
/// prepared statement from what it fixed at Parse, sends: a statement that returns no rows
/// is described also in an aborted block and after its table is gone; one that returns rows
/// is refused in an aborted block, and where its table is gone the client gets its
/// ParameterDescription before the error, whether a Describe told its parameter types before
/// or its Parse gave them. `max_prepared_statements` = 1 makes the server lack them.
#[tokio::test]
async fn a_describe_of_a_statement_the_server_lacks_answers_as_postgres_does() {
    use Who::A;
    let t = format!("descr_{}", std::process::id());
    let q = |sql: &str| (A, vec![msg::query(sql)]);
    let prepare = |name: &str, sql: &str, types: &[u32], describe: bool| {
        let mut messages = vec![msg::parse(name, sql, types)];
        if describe {
            messages.push(msg::describe(b'S', name));
        }
        messages.push(msg::sync());
        (A, messages)
    };
    let describe = |name: &str| (A, vec![msg::describe(b'S', name), msg::sync()]);
    let steps = vec![
        q(&format!(
            "DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (k int)"
        )),
        prepare("upd", &format!("UPDATE {t} SET k = k + $1"), &[], true),
        prepare("sel", &format!("SELECT k FROM {t} WHERE k > $1"), &[], true),
        prepare(
            "typed",
            &format!("SELECT k FROM {t} WHERE k = $1"),
            &[23],
            false,
        ),
        prepare("one", "SELECT 1 AS one", &[], false),
        prepare("tx", "RELEASE SAVEPOINT sp", &[], false),
        q("BEGIN"),
        q("SELECT 1/0"),
        describe("upd"),
        describe("sel"),
        describe("tx"),
        q("ROLLBACK"),
        q(&format!("DROP TABLE {t}")),
        describe("sel"),
        describe("upd"),
        // Behind a batch that runs nothing, the server cannot be in an aborted block.
        (
            A,
            vec![
                msg::parse("fresh", "SELECT 3", &[]),
                msg::sync(),
                msg::describe(b'S', "typed"),
                msg::sync(),
            ],
        ),
        // After another client's SET, the server is brought in line first (pgmemo's own
        // Query ahead of the Describe, which cannot abort anything either).
        (Who::B, vec![msg::query("SET application_name = 'other'")]),
        describe("sel"),
        describe("one"),
    ];
    let direct = run_script(LocalPostgres::PORT, &steps).await;
    let expected = [
        " 8 A| ParameterDescription [23]",
        " 8 A| NoData",
        " 9 A| Error ERROR 25P02",
        "10 A| ParameterDescription []",
        "10 A| NoData",
        "13 A| ParameterDescription [23]",
        "13 A| Error ERROR 42P01",
        "14 A| NoData",
        "15 A| ParseComplete",
        "15 A| ParameterDescription [23]",
        "15 A| Error ERROR 42P01",
        "17 A| ParameterDescription [23]",
        "17 A| Error ERROR 42P01",
        "18 A| RowDescription [one:23]",
    ];
    for line in expected {
        assert!(
            direct.iter().any(|l| l.starts_with(line)),
            "{line}: {direct:#?}"
        );
    }
    same_through_evicting(&direct, &steps).await;
}

/// A statement parsed again is a new statement to PostgreSQL, analysed and described anew:
/// after its column's type changed, a Describe tells the new parameter type, not the one
/// pgmemo kept from describing the old statement of that name.
#[tokio::test]
async fn a_statement_parsed_again_is_described_anew() {
    use Who::A;
    let t = format!("redescr_{}", std::process::id());
    let q = |sql: &str| (A, vec![msg::query(sql)]);
    let upd = format!("UPDATE {t} SET k = $1");
    let steps = vec![
        q(&format!(
            "DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (k int)"
        )),
        (
            A,
            vec![
                msg::parse("upd", &upd, &[]),
                msg::describe(b'S', "upd"),
                msg::sync(),
            ],
        ),
        q(&format!("ALTER TABLE {t} ALTER k TYPE bigint")),
        (
            A,
            vec![
                msg::close(b'S', "upd"),
                msg::parse("upd", &upd, &[]),
                msg::parse("other", "SELECT 1", &[]),
                msg::sync(),
            ],
        ),
        (A, vec![msg::describe(b'S', "upd"), msg::sync()]),
        q(&format!("DROP TABLE {t}")),
    ];
    let direct = run_script(LocalPostgres::PORT, &steps).await;
    assert!(
        direct
            .iter()
            .any(|l| l == " 4 A| ParameterDescription [20]"),
        "{direct:#?}"
    );
    same_through_evicting(&direct, &steps).await;
}

/// A statement whose Parse left its parameter types to the server keeps the types resolved
/// then, as in PostgreSQL, also on a server that lacks it: after its column became bigint a
/// value too large for an integer is refused (22003), and under a `search_path` that no
/// longer finds its function the error names the resolved type (`f(integer)`, not
/// `f(unknown)`). `max_prepared_statements` = 1 makes the server lack them.
#[tokio::test]
async fn a_statement_prepared_again_keeps_the_parameter_types_resolved_first() {
    use Who::A;
    let t = format!("resolved_{}", std::process::id());
    let q = |sql: &str| (A, vec![msg::query(sql)]);
    let parse = |name: &str, sql: &str| (A, vec![msg::parse(name, sql, &[]), msg::sync()]);
    let run = |name: &str, params: &[Option<&str>]| (A, exec(name, params));
    let steps = vec![
        q(&format!(
            "DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (k int); \
             CREATE OR REPLACE FUNCTION {t}_f(int) RETURNS int LANGUAGE sql AS 'SELECT $1'"
        )),
        parse("upd", &format!("UPDATE {t} SET k = $1")),
        parse("call", &format!("SELECT {t}_f($1) AS f")),
        parse("other", "SELECT 1"),
        q(&format!("ALTER TABLE {t} ALTER k TYPE bigint")),
        run("upd", &[Some("5000000000")]),
        run("upd", &[Some("5")]),
        run("call", &[Some("5")]),
        parse("other2", "SELECT 2"),
        q("SET search_path = pg_catalog"),
        run("call", &[Some("5")]),
        q("RESET search_path"),
        q(&format!("DROP TABLE {t}; DROP FUNCTION {t}_f(int)")),
    ];
    let direct = run_script(LocalPostgres::PORT, &steps).await;
    for line in [
        "22003: value \"5000000000\" is out of range for type integer",
        &format!("42883: function {t}_f(integer) does not exist"),
    ] {
        assert!(
            direct.iter().any(|l| l.contains(line)),
            "{line}: {direct:#?}"
        );
    }
    same_through_evicting(&direct, &steps).await;
}

/// A statement prepared after a `SET` earlier in its Query or open transaction is analysed
/// under the value that `SET` gave, also when pgmemo prepares it again on a server that lacks
/// it: `'2020-01-01 12:00'::timestamptz` stays noon in Tokyo. SQL-level and protocol-level;
/// B's statement of the same text, prepared under the server's TimeZone, is not A's.
/// `max_prepared_statements` = 1 makes the server lack them.
#[tokio::test]
async fn a_statement_prepared_after_a_set_in_its_transaction_keeps_that_reading() {
    use Who::{A, B};
    let q = |who, sql: &str| (who, vec![msg::query(sql)]);
    let noon = "SELECT '2020-01-01 12:00'::timestamptz AS t";
    let run = |who, name: &str| (who, exec(name, &[]));
    let steps = vec![
        q(
            A,
            &format!("SET TimeZone = 'Asia/Tokyo'; PREPARE q3 AS {noon}"),
        ),
        q(A, "PREPARE other AS SELECT 1"),
        q(A, "EXECUTE q3"),
        (B, vec![msg::parse("s1", noon, &[]), msg::sync()]),
        q(A, "RESET TimeZone"),
        q(A, "BEGIN"),
        q(A, "SET TimeZone = 'Asia/Tokyo'"),
        (A, vec![msg::parse("s1", noon, &[]), msg::sync()]),
        run(A, "s1"),
        q(A, "COMMIT"),
        (A, vec![msg::parse("s2", "SELECT 2", &[]), msg::sync()]),
        run(A, "s1"),
        run(B, "s1"),
    ];
    let direct = run_script(LocalPostgres::PORT, &steps).await;
    assert!(
        direct
            .iter()
            .filter(|l| l.contains("DataRow [2020-01-01 12:00:00+09]"))
            .count()
            == 3,
        "{direct:#?}"
    );
    same_as_postgres(&steps).await;
    same_through_evicting(&direct, &steps).await;
}

/// A statement two clients share on a server is analysed there again under the settings in
/// force when it runs after another client ran it under another `search_path`, or after DDL
/// (`CREATE SCHEMA`) when it was prepared before: a client whose TimeZone moved since its
/// `PREPARE` (or Parse) runs a copy of its own, prepared under the settings of its `PREPARE`,
/// and reads `'2020-01-01 12:00'::timestamptz` as noon UTC, as its own statement in
/// PostgreSQL does (differential seed 16671). SQL-level and protocol-level, and behind a
/// change earlier in the same Query (seed 17223: `set_config`, whose answer alone tells
/// what it set, and `SET`, which pgmemo follows), and with a `search_path` written otherwise
/// besides (seed 18598). Not after a change of `search_path` alone: PostgreSQL analyses its
/// own statement again when the path resolves to other schemas, keeping the parameter types
/// its first analysis resolved, and so does the server with the shared one
/// (`tz_f(integer)` is missing, not `tz_f(unknown)`, which a statement prepared anew under
/// the new path would give: differential seed 16798).
#[tokio::test]
async fn a_shared_statement_keeps_its_reading_for_a_client_whose_settings_moved() {
    use Who::{A, B};
    let q = |who, sql: &str| (who, vec![msg::query(sql)]);
    let run = |who, name: &str| (who, exec(name, &[]));
    let noon = "SELECT '2020-01-01 12:00'::timestamptz AS t";
    let prepare = format!("PREPARE q3 AS {noon}");
    let parse = |who| (who, vec![msg::parse("s1", noon, &[]), msg::sync()]);
    let steps = vec![
        q(
            A,
            "CREATE OR REPLACE FUNCTION tz_f(int) RETURNS int LANGUAGE sql AS 'SELECT $1'",
        ),
        q(A, "SET TimeZone = 'UTC'"),
        q(B, "SET TimeZone = 'UTC'"),
        // Shared, then analysed again under B's search_path.
        q(A, &prepare),
        q(B, &prepare),
        parse(A),
        parse(B),
        q(B, "SET search_path = information_schema, public"),
        q(B, "EXECUTE q3"),
        run(B, "s1"),
        q(A, "SET TimeZone = 'Europe/Paris'"),
        q(A, "EXECUTE q3"),
        run(A, "s1"),
        // Shared with a statement prepared before DDL.
        q(A, "DEALLOCATE ALL"),
        q(A, "SET TimeZone = 'UTC'"),
        q(B, "RESET search_path"),
        q(B, "EXECUTE q3"),
        run(B, "s1"),
        q(B, "CREATE SCHEMA tz_reading; DROP SCHEMA tz_reading"),
        q(A, &prepare),
        parse(A),
        q(A, "SET TimeZone = 'Europe/Paris'"),
        q(A, "EXECUTE q3"),
        run(A, "s1"),
        // A parameter type resolved by the first analysis.
        (
            B,
            vec![msg::parse("s9", "SELECT tz_f($1) AS f", &[]), msg::sync()],
        ),
        (B, exec("s9", &[Some("1")])),
        q(B, "SET search_path = pg_catalog"),
        (B, exec("s9", &[Some("4")])),
        // Behind a change earlier in the same Query, which pgmemo learns of only from its
        // answer (`set_config`, differential seed 17223) or follows (`SET`).
        q(A, "SET TimeZone = 'UTC'"),
        q(B, "RESET search_path"),
        q(B, &format!("PREPARE q5 AS {noon}")),
        q(B, "EXECUTE q5"),
        q(B, "CREATE SCHEMA tz_reading; DROP SCHEMA tz_reading"),
        q(A, &format!("PREPARE q5 AS {noon}; PREPARE q6 AS {noon}")),
        q(
            A,
            "SELECT set_config('TimeZone', 'Europe/Paris', false); EXECUTE q5",
        ),
        q(A, "SET TimeZone = 'UTC'"),
        q(A, "SET TimeZone = 'Europe/Paris'; EXECUTE q6"),
        // TimeZone and a `search_path` written otherwise that resolves to the same schemas:
        // PostgreSQL does not analyse its statement again (differential seed 18598).
        q(A, "SET TimeZone = 'UTC'"),
        q(B, &format!("PREPARE q7 AS {noon}")),
        q(B, "EXECUTE q7"),
        q(B, "CREATE SCHEMA tz_reading; DROP SCHEMA tz_reading"),
        q(A, &format!("PREPARE q7 AS {noon}")),
        q(A, "SET search_path = public; SET TimeZone = 'Europe/Paris'"),
        q(A, "EXECUTE q7"),
        // A copy is prepared under its first reading, path and all, and analysed again by
        // the server under the new path with the parameter type that reading resolved.
        (B, exec("s9", &[Some("5")])),
        q(
            B,
            "SET TimeZone = 'Europe/Paris'; SET search_path = pg_catalog",
        ),
        (B, exec("s9", &[Some("6")])),
    ];
    let pg = quiet_cluster().await;
    let direct = same_as_postgres_at(pg.port(), 1, &steps).await;
    let noon_utc = "DataRow [2020-01-01 13:00:00+01]";
    for step in [
        "11 A| ", "12 A| ", "22 A| ", "23 A| ", "34 A| ", "36 A| ", "43 A| ",
    ] {
        assert!(shows(&direct, step, noon_utc), "{step}: {direct:#?}");
    }
    let resolved = "function tz_f(integer) does not exist";
    assert!(shows(&direct, "27 B| ", resolved), "{direct:#?}");
    assert!(shows(&direct, "46 B| ", resolved), "{direct:#?}");
    same_through_evicting_at(pg.port(), &direct, &steps).await;
}

/// A statement prepared again on a server that lacks it, for a client whose `search_path`
/// moved since it parsed it, is prepared under its first reading and analysed again by the
/// server at execution, keeping the parameter types that reading resolved, as PostgreSQL's
/// own statement is (differential seed 1019230: `pt_f(unknown)` where PostgreSQL reports
/// `pt_f(integer)`). The client never described it, and parsed it while the server held the
/// statement another client had prepared, so pgmemo learnt no types of it.
#[tokio::test]
async fn a_statement_prepared_again_under_another_path_keeps_its_parameter_types() {
    use Who::{A, B};
    let parse = |who, name: &str, sql: &str| (who, vec![msg::parse(name, sql, &[]), msg::sync()]);
    let steps = vec![
        (
            A,
            vec![msg::query(
                "CREATE OR REPLACE FUNCTION pt_f(int) RETURNS int LANGUAGE sql AS 'SELECT $1'",
            )],
        ),
        parse(B, "s1", "SELECT pt_f($1) AS f"),
        parse(A, "s1", "SELECT pt_f($1) AS f"),
        (A, vec![msg::query("SET search_path = pg_catalog")]),
        // Another statement: a server that holds one at a time drops s1's.
        parse(A, "s2", "SELECT 1 AS one"),
        (A, exec("s2", &[])),
        (A, exec("s1", &[Some("1")])),
        (A, vec![msg::query("RESET search_path")]),
        (A, exec("s1", &[Some("2")])),
    ];
    let pg = quiet_cluster().await;
    let direct = same_as_postgres_at(pg.port(), 1, &steps).await;
    let resolved = "function pt_f(integer) does not exist";
    assert!(shows(&direct, " 6 A| ", resolved), "{direct:#?}");
    assert!(shows(&direct, " 8 A| ", "DataRow [2]"), "{direct:#?}");
    same_through_evicting_at(pg.port(), &direct, &steps).await;
}

/// What a client learnt of a shared statement when it described it goes with the copy it
/// gets after its settings moved (`ClientState::own_copy_of`): the copy is prepared with the
/// parameter types the first analysis resolved (`cf(integer)`), not read afresh from the
/// Parse, which after `cf(text)` appeared would resolve `cf(unknown)` to the new function.
#[tokio::test]
async fn a_copy_of_a_shared_statement_keeps_what_the_client_learnt_of_it() {
    use Who::{A, B};
    let q = |who, sql: &str| (who, vec![msg::query(sql)]);
    let function = |arg: &str| {
        format!(
            "CREATE OR REPLACE FUNCTION cf({arg}) RETURNS text LANGUAGE sql AS 'SELECT ''{arg}'''"
        )
    };
    let parse = |who| {
        (
            who,
            vec![msg::parse("s1", "SELECT cf($1) AS f", &[]), msg::sync()],
        )
    };
    let describe = |who| (who, vec![msg::describe(b'S', "s1"), msg::sync()]);
    let steps = vec![
        q(A, "DROP FUNCTION IF EXISTS cf(text)"),
        q(A, &function("int")),
        q(A, "SET TimeZone = 'UTC'"),
        q(B, "SET TimeZone = 'UTC'"),
        parse(A),
        describe(A),
        parse(B),
        q(A, &function("text")),
        q(A, "SET TimeZone = 'Europe/Paris'"),
        describe(A),
        (A, exec("s1", &[Some("7")])),
        q(A, "DROP FUNCTION cf(text)"),
    ];
    let pg = quiet_cluster().await;
    let direct = same_as_postgres_at(pg.port(), 1, &steps).await;
    for line in [" 9 A| ParameterDescription [23]", "10 A| DataRow [int]"] {
        assert!(
            direct.iter().any(|l| l.starts_with(line)),
            "{line}: {direct:#?}"
        );
    }
    same_through_evicting_at(pg.port(), &direct, &steps).await;
}

/// Settings that change how PostgreSQL reads a statement when it prepares it, each with a
/// statement whose answer shows the reading and the row it gives under the changed value:
/// one the server reports (`TimeZone`) and one it does not (`transform_null_equals`).
const READINGS: [(&str, &str, &str); 2] = [
    (
        "TimeZone', 'Asia/Tokyo",
        "SELECT '2020-01-01 12:00'::timestamptz AS t",
        "DataRow [2020-01-01 12:00:00+09]",
    ),
    (
        "transform_null_equals', 'on",
        "SELECT (NULL = NULL) AS eq",
        "DataRow [t]",
    ),
];

/// Whether the transcript's answers to step `step` (its line prefix) include `line`.
fn shows(transcript: &[String], step: &str, line: &str) -> bool {
    transcript
        .iter()
        .any(|l| l.starts_with(step) && l.contains(line))
}

/// A Parse pipelined behind a statement that changes a setting, whose answer has not arrived
/// yet, is analysed under the new value: it is never handed to another client whose settings
/// are the ones before that change, on the same server (answered from the registry) or on one
/// that lacks it.
#[tokio::test]
async fn a_parse_pipelined_behind_a_set_is_not_shared_under_the_settings_before_it() {
    use Who::{A, B};
    let run = |who, name: &str| (who, exec(name, &[]));
    let pg = quiet_cluster().await;
    for (setting, sql, changed_row) in READINGS {
        let (name, value) = setting.split_once("', '").unwrap();
        for set in [
            format!("SET {name} = '{value}'"),
            format!("SELECT set_config('{setting}', false)"),
        ] {
            // Pipelined: the Query, the Parse and its Sync go out before any answer comes.
            let steps = [
                (
                    A,
                    vec![msg::query(&set), msg::parse("s1", sql, &[]), msg::sync()],
                ),
                run(A, "s1"),
                (B, vec![msg::parse("s1", sql, &[]), msg::sync()]),
                run(B, "s1"),
                (A, vec![msg::query(&format!("RESET {name}"))]),
                run(A, "s1"),
            ];
            // After code pgmemo cannot see into, A's own statement prepared again on a server
            // that lacks it reads under the settings in force then (a documented limit): only
            // B's answers are compared then, which must never come from A's statement.
            let steps = if set.starts_with("SET") {
                &steps[..]
            } else {
                &steps[..4]
            };
            let direct = same_as_postgres_at(pg.port(), 1, steps).await;
            assert!(
                shows(&direct, " 1 A| ", changed_row) && !shows(&direct, " 3 B| ", changed_row),
                "{set}: {direct:#?}"
            );
            same_through_evicting_at(pg.port(), &direct, steps).await;
        }
    }
}

/// A statement prepared again on a server that lacks it, in a batch pipelined behind a `SET`
/// whose answer has not come, is read under the settings in force there: pgmemo does not
/// switch the server's settings around it, which would put back the values from before that
/// `SET` afterwards and undo it.
#[tokio::test]
async fn a_statement_prepared_again_behind_a_pipelined_set_leaves_that_set_alone() {
    use Who::A;
    let q = |sql: &str| (A, vec![msg::query(sql)]);
    let mut pipelined = vec![msg::query("SET TimeZone = 'Asia/Tokyo'")];
    pipelined.extend(exec("s1", &[]));
    let steps = vec![
        q("SET TimeZone = 'UTC'"),
        (
            A,
            vec![
                msg::parse("s1", "SELECT '2020-01-01 12:00'::timestamptz AS t", &[]),
                msg::sync(),
            ],
        ),
        q("SET TimeZone = 'Europe/Paris'"),
        // Evicts s1 from the evicting pool's one server.
        (A, vec![msg::parse("s2", "SELECT 2", &[]), msg::sync()]),
        (A, pipelined),
        q("SHOW TimeZone"),
    ];
    let pg = quiet_cluster().await;
    let direct = same_as_postgres_at(pg.port(), 1, &steps).await;
    assert!(
        shows(&direct, " 4 A| ", "DataRow [2020-01-01 21:00:00+09]")
            && shows(&direct, " 5 A| ", "DataRow [Asia/Tokyo]"),
        "{direct:#?}"
    );
    same_through_evicting_at(pg.port(), &direct, &steps).await;
}

/// Inside a transaction block a `set_config` cannot wait for its value to be read back (the
/// server stays with the client until the block ends): a statement the client prepares after
/// it is analysed under that value and is the client's own, not another client's to share.
#[tokio::test]
async fn a_statement_prepared_after_set_config_in_a_block_is_not_shared() {
    use Who::{A, B};
    let pg = quiet_cluster().await;
    let q = |who, sql: &str| (who, vec![msg::query(sql)]);
    let run = |who, name: &str| (who, exec(name, &[]));
    for (setting, sql, changed_row) in READINGS {
        let name = setting.split_once('\'').unwrap().0;
        let steps = vec![
            q(A, "BEGIN"),
            q(A, &format!("SELECT set_config('{setting}', false)")),
            (A, vec![msg::parse("s1", sql, &[]), msg::sync()]),
            run(A, "s1"),
            q(A, "COMMIT"),
            q(A, &format!("RESET {name}")),
            (B, vec![msg::parse("s1", sql, &[]), msg::sync()]),
            run(B, "s1"),
            run(A, "s1"),
        ];
        let direct = same_as_postgres_at(pg.port(), 1, &steps).await;
        assert!(
            shows(&direct, " 3 A| ", changed_row) && !shows(&direct, " 7 B| ", changed_row),
            "{setting}: {direct:#?}"
        );
        // A's own statement prepared again after an eviction reads under the settings in
        // force then (a documented limit after code pgmemo cannot see into): B's never A's.
        let head = &steps[..8];
        same_through_evicting_at(pg.port(), &run_script(pg.port(), head).await, head).await;
    }
}

/// A `set_config` in the client's own statement changes a setting the server does not
/// report (`extra_float_digits`): a batch pipelined behind it that must wait for its answer
/// (a second Parse of the name it just gave) runs under the new value, which stays the
/// client's own, and the other client sharing the server never sees it.
#[tokio::test]
async fn a_batch_held_behind_a_set_config_keeps_its_value() {
    use Who::{A, B};
    let q = |who: Who, sql: &str| (who, vec![msg::query(sql)]);
    let sum = "SELECT 0.1::float8 + 0.2 AS f";
    let t = create_table("heldset", "(k int)").await;
    // Volatile: it may change settings, so the server is brought in line before its next use.
    LocalPostgres
        .client(USER, DB)
        .await
        .batch_execute(&format!(
            "CREATE FUNCTION {t}_f() RETURNS int LANGUAGE sql AS 'SELECT 1'"
        ))
        .await
        .unwrap();
    let steps = vec![
        q(A, &format!("SET extra_float_digits = 0; SELECT {t}_f()")),
        (
            A,
            vec![
                msg::parse(
                    "s1",
                    "SELECT set_config('extra_float_digits', '2', false) AS c",
                    &[],
                ),
                msg::bind("p1", "s1", &[]),
                msg::execute("p1", 0),
                msg::sync(),
                msg::parse("s1", "SELECT 2", &[]),
                msg::bind("p1", "s1", &[]),
                msg::execute("p1", 0),
                msg::sync(),
            ],
        ),
        (
            A,
            vec![
                msg::parse("", sum, &[]),
                msg::bind("", "", &[]),
                msg::execute("", 0),
                msg::sync(),
            ],
        ),
        q(A, "SHOW extra_float_digits"),
        q(B, "SHOW extra_float_digits"),
        q(A, "SHOW extra_float_digits"),
    ];
    let direct = run_script(LocalPostgres::PORT, &steps).await;
    for cache in [Switch::On, Switch::Off] {
        // Admitted at once, the function call is planned with the catalog: the server is
        // then brought in line before each batch.
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| {
            c.cache = cache;
            c.cache_admission = pgmemo::config::CacheAdmission::Always;
        })
        .await;
        assert_same_through(pgmemo, &direct, &steps, format!("cache {cache:?}")).await;
    }
    let twos = direct.iter().filter(|l| l.contains("DataRow [2]")).count();
    assert_eq!(twos, 3, "set_config, then A's value twice: {direct:#?}");
    assert_eq!(
        direct
            .iter()
            .filter(|l| l.contains("0.30000000000000004"))
            .count(),
        1,
        "{direct:#?}"
    );
}

/// Setting a server to a statement's first TimeZone and back around preparing it again
/// sends the client no ParameterStatus (PostgreSQL reports a setting only when its value at
/// ReadyForQuery differs from the one it reported last), also when that Parse fails in a
/// transaction block.
#[tokio::test]
async fn preparing_again_under_the_first_settings_reports_no_parameter_status() {
    use txn_support::Raw;
    within(TEST_DEADLINE, async {
        let t = create_table("pstatus", "(x int)").await;
        let pgmemo = evicting_pgmemo(Switch::Off).await;
        let mut raw = Raw::login(pgmemo.port()).await;
        let literal = "SELECT extract(epoch FROM '2024-01-01 00:00'::timestamptz)::int8";
        raw.exchange(&[msg::query("SET TimeZone = 'UTC'")]).await;
        raw.exchange(&[
            msg::parse("s", literal, &[]),
            msg::parse("gone", &format!("SELECT x FROM {t}"), &[]),
            msg::sync(),
        ])
        .await;
        raw.exchange(&[msg::query("SET TimeZone = 'America/New_York'")])
            .await;
        drop_table(&t).await;
        let run = |name: &str| [msg::bind("", name, &[]), msg::execute("", 0), msg::sync()];
        // 2: BindComplete, D: the row read under UTC, C, Z; an E in the block.
        assert_eq!(tags(&mut raw, &run("s")).await, "2DCZ");
        assert_eq!(tags(&mut raw, &[msg::query("BEGIN")]).await, "CZ");
        assert_eq!(tags(&mut raw, &run("gone")).await, "EZ");
        assert_eq!(tags(&mut raw, &[msg::query("ROLLBACK")]).await, "CZ");
        assert_eq!(tags(&mut raw, &run("s")).await, "2DCZ");
        pgmemo.shutdown().await;
    })
    .await
}

/// A `BEGIN ISOLATION LEVEL ...` prepared under another TimeZone and prepared again on a
/// server that lacks it runs as the transaction's first statement: pgmemo sends nothing that
/// queries before it (25001 otherwise).
#[tokio::test]
async fn a_begin_prepared_again_after_a_set_still_starts_its_transaction() {
    use Who::A;
    let q = |sql: &str| (A, vec![msg::query(sql)]);
    let steps = vec![
        q("SET TimeZone = 'UTC'"),
        (
            A,
            vec![
                msg::parse("s", "BEGIN ISOLATION LEVEL REPEATABLE READ", &[]),
                msg::sync(),
            ],
        ),
        q("SET TimeZone = 'America/New_York'"),
        (A, vec![msg::parse("o", "SELECT 2", &[]), msg::sync()]),
        (
            A,
            vec![msg::bind("", "s", &[]), msg::execute("", 0), msg::sync()],
        ),
        q("SHOW transaction_isolation"),
        q("COMMIT"),
    ];
    let direct = run_script(LocalPostgres::PORT, &steps).await;
    assert!(
        direct.iter().any(|l| l.contains("repeatable read")),
        "{direct:#?}"
    );
    same_through_evicting(&direct, &steps).await;
}

/// A Bind with the wrong number of parameters for a statement the server lacks gets
/// PostgreSQL's 08P01, not the error of preparing the statement there again first: in an
/// aborted block (25P02) or under a `search_path` that no longer finds its table (42P01). With
/// the right number it gets those errors, as from PostgreSQL. `max_prepared_statements` = 1
/// makes the server lack them. Also for statements the client described (differential seed
/// 11510: pgmemo prepared such a statement again to check its shape first).
#[tokio::test]
async fn a_bind_with_the_wrong_parameter_count_is_told_so_before_anything_else() {
    use Who::A;
    let t = create_table("bindcount", "(k int)").await;
    let q = |sql: &str| (A, vec![msg::query(sql)]);
    let parse = |name: &str, sql: &str| (A, vec![msg::parse(name, sql, &[]), msg::sync()]);
    let run = |name: &str, params: &[Option<&str>]| {
        (
            A,
            vec![
                msg::bind("", name, params),
                msg::execute("", 0),
                msg::sync(),
            ],
        )
    };
    // Described by the client (whose Binds pgmemo then checks for the rows' shape first), one
    // of them prepared after a SET in its transaction (read under settings pgmemo cannot name).
    let described = |name: &str, sql: &str| {
        let messages = vec![
            msg::parse(name, sql, &[23]),
            msg::describe(b'S', name),
            msg::sync(),
        ];
        (A, messages)
    };
    let steps = vec![
        parse("s1", "SELECT $1::int"),
        parse("s2", &format!("SELECT count(*) FROM {t}")),
        described("s4", &format!("DELETE FROM {t} WHERE k = $1")),
        q("BEGIN"),
        q("SET TimeZone = 'UTC'"),
        described("s5", &format!("SELECT k FROM {t} WHERE k = $1")),
        q("COMMIT"),
        q("BEGIN"),
        q("SELECT 1/0"),
        run("s1", &[]),
        run("s1", &[Some("1")]),
        q("ROLLBACK"),
        q("SET search_path = pg_catalog"),
        parse("s3", "SELECT 3"),
        run("s2", &[Some("1")]),
        run("s2", &[]),
        run("s4", &[]),
        run("s5", &[]),
        q("RESET search_path"),
        run("s2", &[]),
    ];
    let direct = run_script(LocalPostgres::PORT, &steps).await;
    let count = |code: &str| direct.iter().filter(|l| l.contains(code)).count();
    assert_eq!(
        (count("08P01"), count("25P02"), count("42P01")),
        (4, 1, 1),
        "{direct:#?}"
    );
    same_through_evicting(&direct, &steps).await;
    drop_table(&t).await;
}

/// The same for the client's unnamed statement, on a server whose unnamed statement is
/// another client's: a wrong count is 08P01 (naming the statement `""`) in an aborted block
/// and under a `search_path` that finds no table, where preparing it there again would fail
/// first. Statements run by name, as a simple Query would drop the unnamed statement.
#[tokio::test]
async fn an_unnamed_bind_with_the_wrong_parameter_count_is_told_so_before_anything_else() {
    use Who::{A, B};
    let t = create_table("ubindcount", "(k int)").await;
    let parse = |who, name: &str, sql: &str| (who, vec![msg::parse(name, sql, &[]), msg::sync()]);
    let run = |who, name: &str, params: &[Option<&str>]| (who, exec(name, params));
    let steps = vec![
        parse(A, "begin", "BEGIN"),
        parse(A, "fail", "SELECT 1/0"),
        parse(A, "rollback", "ROLLBACK"),
        parse(A, "hide", "SET search_path = pg_catalog"),
        parse(A, "show", "RESET search_path"),
        parse(A, "", "SELECT $1::int"),
        parse(B, "", "SELECT 2"),
        run(A, "begin", &[]),
        run(A, "fail", &[]),
        run(A, "", &[]),
        run(A, "", &[Some("1")]),
        run(A, "rollback", &[]),
        parse(A, "", &format!("SELECT count(*) FROM {t} WHERE k = $1")),
        parse(B, "", "SELECT 3"),
        run(A, "hide", &[]),
        run(A, "", &[]),
        run(A, "", &[Some("1")]),
        run(A, "show", &[]),
        run(A, "", &[Some("1")]),
    ];
    let transcript = same_as_postgres(&steps).await;
    let count = |code: &str| transcript.iter().filter(|l| l.contains(code)).count();
    assert_eq!(
        (count("08P01"), count("25P02"), count("42P01")),
        (2, 1, 1),
        "{transcript:#?}"
    );
    let line = "bind message supplies 0 parameters, but prepared statement \"\" requires 1";
    assert!(
        transcript.iter().any(|l| l.ends_with(line)),
        "{transcript:#?}"
    );
    drop_table(&t).await;
}

/// Settings that a transaction undoes stay undone for their client and never reach another:
/// a SET in an implicit transaction that fails, a SET rolled back to a savepoint (in one
/// Query and message by message), a SET before a savepoint that is rolled back (kept), a SET
/// in a released savepoint (kept), and a SET (or RESET ALL) after a ROLLBACK in the same
/// request, which runs in a transaction of its own (kept). A and B share one server;
/// PostgreSQL gives each its own.
#[tokio::test]
async fn settings_undone_by_their_transaction_stay_undone() {
    use Who::{A, B};
    let q = |sql: &str| vec![msg::query(sql)];
    let show = "SHOW work_mem";
    let mut steps = Vec::new();
    let mut then_show = |request: &[&str]| {
        for sql in request {
            steps.push((A, q(sql)));
        }
        steps.push((A, q(show)));
        steps.push((B, q(show)));
    };
    then_show(&["SET work_mem = '7MB'; SELECT 1/0"]);
    then_show(&["BEGIN; SAVEPOINT s; SET work_mem = '8MB'; ROLLBACK TO s; COMMIT"]);
    then_show(&[
        "BEGIN",
        "SAVEPOINT s",
        "SET work_mem = '9MB'",
        "ROLLBACK TO s",
        "COMMIT",
    ]);
    then_show(&["BEGIN; SET work_mem = '10MB'; SAVEPOINT s; ROLLBACK TO s; COMMIT"]);
    then_show(&["BEGIN; SAVEPOINT s; SET work_mem = '11MB'; RELEASE s; COMMIT"]);
    then_show(&["BEGIN", "SET work_mem = '12MB'", "SELECT 1/0", "COMMIT"]);
    // A SET after a ROLLBACK in the same request runs in a transaction of its own. Each case
    // shows twice: B's SHOW brings the server in line with B, so A's second SHOW shows what
    // pgmemo recorded for A.
    for request in [
        &[
            "BEGIN",
            "SET work_mem = '13MB'",
            "ROLLBACK; SET work_mem = '14MB'",
        ][..],
        &["BEGIN", "SELECT 1/0", "ROLLBACK; SET work_mem = '15MB'"],
        &["ROLLBACK; SET work_mem = '16MB'"],
        &["BEGIN; SAVEPOINT s; ROLLBACK TO s; COMMIT; SET work_mem = '17MB'"],
        &["BEGIN", "ROLLBACK; RESET ALL"],
    ] {
        then_show(request);
        then_show(&[]);
    }
    then_show(&["RESET work_mem"]);
    // The same in one Sync group of the extended protocol.
    let run = |sql: &str| {
        vec![
            msg::parse("", sql, &[]),
            msg::bind("", "", &[]),
            msg::execute("", 0),
        ]
    };
    steps.push((A, q("BEGIN")));
    steps.push((
        A,
        [
            run("SET work_mem = '3MB'"),
            run("ROLLBACK"),
            run("SET work_mem = '18MB'"),
            vec![msg::sync()],
        ]
        .concat(),
    ));
    steps.push((A, q(show)));
    steps.push((B, q(show)));
    let transcript = same_as_postgres(&steps).await;
    for kept in ["10MB", "11MB", "14MB", "15MB", "16MB", "17MB", "18MB"] {
        assert!(
            transcript
                .iter()
                .any(|l| l.ends_with(&format!("DataRow [{kept}]"))),
            "{kept}: {transcript:#?}"
        );
    }
}

#[tokio::test]
async fn same_statement_names_of_two_clients_stay_apart() {
    use Who::{A, B};
    let parse = |name: &str, sql: &str| vec![msg::parse(name, sql, &[]), msg::sync()];
    let mut steps = vec![
        (A, parse("s0", "SELECT 1::int AS a")),
        (B, parse("s0", "SELECT 'b'::text AS b")),
        (A, vec![msg::describe(b'S', "s0"), msg::sync()]),
        (B, vec![msg::describe(b'S', "s0"), msg::sync()]),
    ];
    for _ in 0..3 {
        steps.push((A, exec("s0", &[])));
        steps.push((B, exec("s0", &[])));
    }
    steps.extend([
        // Two requests in one write (Parse+Sync, Bind+Execute+Sync): pipelining.
        (
            A,
            [parse("s1", "SELECT $1::int * 10"), exec("s1", &[Some("4")])].concat(),
        ),
        (
            B,
            [
                parse("s1", "SELECT $1::text || '!'"),
                exec("s1", &[Some("hi")]),
            ]
            .concat(),
        ),
        (A, exec("s1", &[Some("5")])),
        (B, exec("s1", &[Some("yo")])),
        // The same name and text on both; one client closes it, the other keeps it.
        (A, parse("s2", "SELECT 'shared'")),
        (B, parse("s2", "SELECT 'shared'")),
        (A, vec![msg::close(b'S', "s2"), msg::sync()]),
        (B, exec("s2", &[])),
        (A, exec("s2", &[])),
        // The unnamed statement lives across Syncs, whatever the other client parses.
        (A, parse("", "SELECT 'unnamed A'")),
        (B, parse("", "SELECT 'unnamed B'")),
        (A, exec("", &[])),
        (B, exec("", &[])),
        // A portal fetched in pieces inside a transaction keeps its server across Syncs.
        (A, vec![msg::query("BEGIN")]),
        (A, parse("g", "SELECT generate_series(1, 5)")),
        (
            A,
            vec![
                msg::bind("cur", "g", &[]),
                msg::execute("cur", 2),
                msg::sync(),
            ],
        ),
        (A, vec![msg::execute("cur", 2), msg::sync()]),
        (A, vec![msg::execute("cur", 0), msg::sync()]),
        (A, vec![msg::query("COMMIT")]),
        (B, exec("s0", &[])),
        (A, exec("s0", &[])),
        // 31-32: a Flush after the Sync (psycopg ends its pipelines so) asks for nothing: the
        // server is free for B at once.
        (A, [exec("s0", &[]), vec![msg::flush()]].concat()),
        (B, exec("s0", &[])),
        // 33: a Flush inside a batch sends what is ready; the batch goes on to its Sync.
        (
            A,
            vec![
                msg::parse("f", "SELECT 'flushed'", &[]),
                msg::flush(),
                msg::bind("", "f", &[]),
                msg::execute("", 0),
                msg::sync(),
            ],
        ),
        (B, exec("s0", &[])),
    ]);
    let transcript = same_as_postgres(&steps).await;
    // Sanity: the script exercised what it is about.
    for line in [
        " 4 A| DataRow [1]",
        " 5 B| DataRow [b]",
        " 2 A| RowDescription [a:23]",
        " 3 B| RowDescription [b:25]",
        "21 A| DataRow [unnamed A]",
        "22 B| DataRow [unnamed B]",
        "32 B| DataRow [b]",
        "33 A| DataRow [flushed]",
        "34 B| DataRow [b]",
    ] {
        assert!(
            transcript.iter().any(|l| l == line),
            "{line}: {transcript:#?}"
        );
    }
    assert!(transcript
        .iter()
        .any(|l| l.starts_with("18 A| Error ERROR 26000")));
}

/// A named Parse inside an aborted block fails (25P02) and leaves the name free, as in
/// PostgreSQL, also when the server holds that statement for another name already.
#[tokio::test]
async fn a_named_parse_in_an_aborted_block_fails_and_takes_no_name() {
    use Who::A;
    within(TEST_DEADLINE, async {
        let steps = vec![
            (A, vec![msg::parse("s0", "SELECT 1", &[]), msg::sync()]),
            (A, vec![msg::query("BEGIN")]),
            (A, vec![msg::query("SELECT 1/0")]),
            (
                A,
                vec![
                    msg::parse("s1", "SELECT 1", &[]),
                    msg::bind("", "s1", &[]),
                    msg::execute("", 0),
                    msg::sync(),
                ],
            ),
            (A, vec![msg::query("ROLLBACK")]),
            (A, vec![msg::parse("s1", "SELECT 1", &[]), msg::sync()]),
            (A, exec("s1", &[])),
        ];
        let transcript = same_as_postgres(&steps).await;
        assert!(
            transcript
                .iter()
                .any(|l| l.starts_with(" 3 A| Error ERROR 25P02")),
            "{transcript:#?}"
        );
    })
    .await;
}

/// A named Parse of a statement the server already holds, where the server is in an aborted
/// block when it gets there, behaves as in PostgreSQL: refused (25P02, the name stays free)
/// also when the block was aborted by a request pipelined ahead of it, in the block or from
/// outside one (pgmemo answered ParseComplete itself, and the name was taken); accepted when
/// it is a ROLLBACK (it got 42P05 about pgmemo's server-side name).
#[tokio::test]
async fn a_named_parse_behind_an_aborting_request_is_refused_as_in_postgres() {
    use Who::A;
    within(TEST_DEADLINE, async {
        let parse = |name: &str, sql: &str| vec![msg::parse(name, sql, &[]), msg::sync()];
        let q = |sql: &str| vec![msg::query(sql)];
        let steps = vec![
            (A, parse("s0", "SELECT 1")),
            (A, parse("r1", "ROLLBACK")),
            (A, q("BEGIN")),
            // 3: pipelined behind the Query that aborts the block.
            (A, [q("SELECT 1/0"), parse("s1", "SELECT 1")].concat()),
            (A, parse("r2", "ROLLBACK")),
            (A, exec("r2", &[])),
            (A, exec("s1", &[])),
            // 7: the Query begins the block and aborts it.
            (
                A,
                [q("BEGIN; SELECT 1/0"), parse("s2", "SELECT 1"), q("ROLLBACK")].concat(),
            ),
            (A, exec("s2", &[])),
            (A, [parse("s3", "SELECT 1"), exec("s3", &[])].concat()),
        ];
        let transcript = same_as_postgres(&steps).await;
        for line in [
            " 3 A| Error ERROR 25P02: current transaction is aborted, commands ignored until end of transaction block",
            " 5 A| CommandComplete ROLLBACK",
            " 6 A| Error ERROR 26000: prepared statement \"s1\" does not exist",
            " 8 A| Error ERROR 26000: prepared statement \"s2\" does not exist",
            " 9 A| DataRow [1]",
        ] {
            assert!(transcript.iter().any(|l| l == line), "{line}: {transcript:#?}");
        }
    })
    .await;
}

/// A Bind or Describe of a statement name the client does not have fails with 26000 also
/// inside an aborted block, as in PostgreSQL (which looks the name up first): pgmemo's error
/// came from a `DO` block the aborted server refused with 25P02. Also when the block was
/// aborted by a request pipelined ahead of it, and the rest of the batch is still skipped.
#[tokio::test]
async fn an_unknown_statement_in_an_aborted_block_is_reported_as_in_postgres() {
    use Who::A;
    within(TEST_DEADLINE, async {
        let q = |sql: &str| vec![msg::query(sql)];
        let steps = vec![
            (A, vec![msg::parse("s0", "SELECT 1", &[]), msg::sync()]),
            (A, q("BEGIN")),
            (A, q("SELECT 1/0")),
            (A, exec("nope", &[])),
            (A, vec![msg::describe(b'S', "nope"), msg::sync()]),
            (A, q("ROLLBACK")),
            (A, q("BEGIN")),
            (
                A,
                [
                    q("SELECT 1/0"),
                    vec![
                        msg::bind("", "nope", &[]),
                        msg::execute("", 0),
                        msg::parse("", "ROLLBACK", &[]),
                        msg::bind("", "", &[]),
                        msg::execute("", 0),
                        msg::sync(),
                    ],
                ]
                .concat(),
            ),
            (A, q("ROLLBACK")),
            (A, exec("s0", &[])),
        ];
        let transcript = same_as_postgres(&steps).await;
        let nope = "Error ERROR 26000: prepared statement \"nope\" does not exist";
        for line in [
            format!(" 3 A| {nope}"),
            format!(" 4 A| {nope}"),
            format!(" 7 A| {nope}"),
            " 7 A| ReadyForQuery E".to_owned(),
        ] {
            assert!(transcript.contains(&line), "{line}: {transcript:#?}");
        }
    })
    .await;
}

/// A Parse of a statement the server holds already (another client prepared the same text)
/// still makes the server analyse the text, as PostgreSQL does: that analysis takes the
/// transaction's snapshot, so a `BEGIN ISOLATION LEVEL` executed after it in the same batch
/// fails with 25001 (differential seed 1010596; pgmemo used to answer such a Parse itself).
#[tokio::test]
async fn a_parse_of_a_statement_the_server_holds_takes_a_snapshot_as_in_postgres() {
    use Who::{A, B};
    within(TEST_DEADLINE, async {
        let steps = vec![
            (A, vec![msg::parse("s2", "SELECT 1", &[]), msg::sync()]),
            (
                B,
                vec![
                    msg::parse("s1", "BEGIN ISOLATION LEVEL REPEATABLE READ", &[]),
                    msg::sync(),
                ],
            ),
            (
                B,
                vec![
                    msg::bind("", "s1", &[]),
                    msg::parse("s2", "SELECT 1", &[]),
                    msg::execute("", 0),
                    msg::sync(),
                ],
            ),
            (B, vec![msg::query("SELECT 'in step'")]),
        ];
        let direct = same_as_postgres(&steps).await;
        assert!(direct.iter().any(|l| l.contains("25001")), "{direct:?}");
    })
    .await;
}

/// A Close of a statement that the server skips (an error earlier in its batch) drops
/// nothing, but a `DEALLOCATE ALL` pipelined after it still drops that statement when it runs,
/// as in PostgreSQL: the later Bind finds no statement (26000), not the old one (differential
/// seed 1010125).
#[tokio::test]
async fn a_deallocate_all_behind_a_skipped_close_drops_its_statement_too() {
    use Who::A;
    within(TEST_DEADLINE, async {
        let steps = vec![
            (
                A,
                vec![msg::parse("s2", "SELECT $1::int", &[]), msg::sync()],
            ),
            (
                A,
                vec![
                    // Wrong parameter count: the rest of the batch, its Close too, is skipped.
                    msg::bind("p1", "s2", &[]),
                    msg::execute("p1", 0),
                    msg::close(b'S', "s2"),
                    msg::sync(),
                    msg::parse("", "DEALLOCATE ALL", &[]),
                    msg::bind("", "", &[]),
                    msg::describe(b'P', ""),
                    msg::execute("", 0),
                    msg::close(b'S', ""),
                    msg::sync(),
                ],
            ),
            (
                A,
                vec![
                    msg::bind("p1", "s2", &[]),
                    msg::execute("p1", 0),
                    msg::sync(),
                ],
            ),
        ];
        let direct = same_as_postgres_over(2, &steps).await;
        assert!(direct.iter().any(|l| l.contains("26000")), "{direct:?}");
    })
    .await;
}

/// A `DISCARD ALL` in an extended-protocol batch that the server skips (an error earlier in
/// the batch) drops nothing, as in PostgreSQL: the client's statements still run; one that
/// runs drops them.
#[tokio::test]
async fn a_skipped_discard_all_keeps_the_clients_statements() {
    use Who::{A, B};
    within(TEST_DEADLINE, async {
        let steps = vec![
            (A, vec![msg::parse("s1", "SELECT 5", &[]), msg::sync()]),
            (
                A,
                vec![
                    msg::parse("", "SELECT 1/0", &[]),
                    msg::bind("", "", &[]),
                    msg::execute("", 0),
                    msg::parse("", "DISCARD ALL", &[]),
                    msg::bind("", "", &[]),
                    msg::execute("", 0),
                    msg::sync(),
                ],
            ),
            (A, exec("s1", &[])),
            (B, vec![msg::query("SELECT 1")]),
            (
                A,
                vec![
                    msg::parse("", "DISCARD ALL", &[]),
                    msg::bind("", "", &[]),
                    msg::execute("", 0),
                    msg::sync(),
                ],
            ),
            (A, exec("s1", &[])),
        ];
        let transcript = same_as_postgres(&steps).await;
        assert!(
            transcript.contains(&" 2 A| DataRow [5]".to_owned()),
            "{transcript:#?}"
        );
    })
    .await;
}

#[tokio::test]
async fn protocol_level_name_errors_match_postgres() {
    use Who::{A, B};
    let parse = |name: &str, sql: &str| vec![msg::parse(name, sql, &[]), msg::sync()];
    let steps = vec![
        (A, parse("dup", "SELECT 1")),
        // 1: a second Parse of a name the client has: 42P05, and the first one stays.
        (A, parse("dup", "SELECT 2")),
        (B, parse("dup", "SELECT 'B'")),
        (A, exec("dup", &[])),
        (B, exec("dup", &[])),
        // 5-7: unknown names: 26000 for Bind and Describe, Close is fine.
        (A, exec("nope", &[])),
        (A, vec![msg::describe(b'S', "nope"), msg::sync()]),
        (A, vec![msg::close(b'S', "nope"), msg::sync()]),
        // 8: an error mid-batch: what came before it stays, what came after is skipped.
        (
            A,
            vec![
                msg::parse("p1", "SELECT 10", &[]),
                msg::bind("", "nope", &[]),
                msg::execute("", 0),
                msg::parse("p2", "SELECT 20", &[]),
                msg::sync(),
            ],
        ),
        (A, exec("p1", &[])),
        (A, exec("p2", &[])),
        // 11-14: a statement parsed in a rolled-back transaction survives (not transactional).
        (A, vec![msg::query("BEGIN")]),
        (A, parse("intx", "SELECT 'intx'")),
        (A, vec![msg::query("ROLLBACK")]),
        (A, exec("intx", &[])),
        // 15-18: a failed Parse registers nothing.
        (A, vec![msg::query("BEGIN")]),
        (A, parse("bad", "SELEC 1")),
        (A, vec![msg::query("ROLLBACK")]),
        (A, exec("bad", &[])),
        // 19-23: protocol and SQL level share one namespace per client.
        (A, parse("x1", "SELECT 'x1'")),
        (A, vec![msg::query("EXECUTE x1")]),
        (A, vec![msg::query("PREPARE x2 AS SELECT 'x2'")]),
        (A, exec("x2", &[])),
        (A, vec![msg::query("DEALLOCATE x1")]),
        (A, exec("x1", &[])),
        // 25-28: Close, then the name is free for a new text; B's statement is untouched.
        (A, vec![msg::close(b'S', "dup"), msg::sync()]),
        (A, parse("dup", "SELECT 3")),
        (A, exec("dup", &[])),
        (B, exec("dup", &[])),
        // 29: a bad parameter value is the server's error, answered in order.
        (
            A,
            [
                vec![msg::parse("typed", "SELECT $1", &[23])],
                exec("typed", &[Some("abc")]),
            ]
            .concat(),
        ),
        // 30-32: DEALLOCATE ALL forgets A's statements only.
        (A, vec![msg::query("DEALLOCATE ALL")]),
        (A, exec("p1", &[])),
        (B, exec("dup", &[])),
    ];
    let transcript = same_as_postgres(&steps).await;
    for line in [
        " 1 A| Error ERROR 42P05: prepared statement \"dup\" already exists",
        " 3 A| DataRow [1]",
        " 4 B| DataRow [B]",
        " 5 A| Error ERROR 26000: prepared statement \"nope\" does not exist",
        " 6 A| Error ERROR 26000: prepared statement \"nope\" does not exist",
        " 9 A| DataRow [10]",
        "10 A| Error ERROR 26000: prepared statement \"p2\" does not exist",
        "14 A| DataRow [intx]",
        "18 A| Error ERROR 26000: prepared statement \"bad\" does not exist",
        "20 A| DataRow [x1]",
        "22 A| DataRow [x2]",
        "24 A| Error ERROR 26000: prepared statement \"x1\" does not exist",
        "27 A| DataRow [3]",
        "28 B| DataRow [B]",
        "31 A| Error ERROR 26000: prepared statement \"p1\" does not exist",
        "32 B| DataRow [B]",
    ] {
        assert!(
            transcript.iter().any(|l| l == line),
            "{line}: {transcript:#?}"
        );
    }
}

/// A Parse of several statements fails with PostgreSQL's own 42601 ("cannot insert multiple
/// commands into a prepared statement"), named or unnamed, whatever the statements are: not
/// with pgmemo's refusal of a PREPARE or DISCARD ALL among them (0A000, 25001). The name stays
/// free and no setting changes.
#[tokio::test]
async fn a_parse_of_several_statements_fails_as_in_postgres() {
    use Who::A;
    within(TEST_DEADLINE, async {
        let mut steps = Vec::new();
        for (i, sql) in [
            "SELECT 1; SELECT 2",
            "PREPARE x AS SELECT 1; SELECT 1",
            "DEALLOCATE ALL; SELECT 1",
            "DISCARD ALL; SELECT 1",
            "SET work_mem = '1MB'; SELECT 1",
        ]
        .into_iter()
        .enumerate()
        {
            let name = format!("m{i}");
            steps.push((A, vec![msg::parse(&name, sql, &[]), msg::sync()]));
            steps.push((A, exec(&name, &[])));
            steps.push((A, [vec![msg::parse("", sql, &[])], exec("", &[])].concat()));
        }
        steps.push((A, vec![msg::query("SHOW work_mem")]));
        let transcript = same_as_postgres(&steps).await;
        let refused =
            "Error ERROR 42601: cannot insert multiple commands into a prepared statement";
        assert_eq!(
            transcript.iter().filter(|l| l.ends_with(refused)).count(),
            10,
            "{transcript:#?}"
        );
    })
    .await;
}

/// The errors pgmemo makes the server raise for a client's request (an unknown or duplicate
/// statement name) are run as the server's unnamed statement. Another client sharing that
/// server that has no unnamed statement gets 26000 for its Bind or Describe of it, as in
/// PostgreSQL: it ran pgmemo's statement, and saw the first client's error and statement name.
#[tokio::test]
async fn another_clients_error_is_not_the_unnamed_statement_of_the_next() {
    use Who::{A, B};
    within(TEST_DEADLINE, async {
        let steps = vec![
            (A, exec("nope", &[])),
            (B, exec("", &[])),
            (A, vec![msg::parse("d", "SELECT 1", &[]), msg::sync()]),
            (A, vec![msg::parse("d", "SELECT 2", &[]), msg::sync()]),
            (B, vec![msg::describe(b'S', ""), msg::sync()]),
        ];
        let transcript = same_as_postgres(&steps).await;
        let gone = "Error ERROR 26000: unnamed prepared statement does not exist";
        for line in [format!(" 1 B| {gone}"), format!(" 4 B| {gone}")] {
            assert!(transcript.contains(&line), "{line}: {transcript:#?}");
        }
    })
    .await;
}

/// In an aborted block PostgreSQL still describes a statement that returns no rows (from what
/// its Parse fixed). The client's unnamed statement is described so too when the server's
/// unnamed statement is no longer the client's (here pgmemo's own Parse of a statement the
/// server held replaced it), where parsing it there again would fail with 25P02
/// (differential seed 11706).
#[tokio::test]
async fn the_unnamed_statement_is_described_in_an_aborted_block_as_in_postgres() {
    use Who::{A, B};
    let t = create_table("abortdescribe", "(k int, v int)").await;
    let begin = "BEGIN ISOLATION LEVEL SERIALIZABLE";
    let run = |name: &str| {
        vec![
            msg::parse(name, begin, &[]),
            msg::bind("", name, &[]),
            msg::execute("", 0),
            msg::sync(),
        ]
    };
    let update = format!("UPDATE {t} SET v = v + 1 WHERE k = $1");
    let steps = vec![
        // The server holds the text under pgmemo's name.
        (A, run("a1")),
        (A, vec![msg::query("ROLLBACK")]),
        (B, vec![msg::parse("", &update, &[23]), msg::sync()]),
        (B, run("b1")),
        (B, vec![msg::execute("nowhere", 0), msg::sync()]),
        (B, vec![msg::describe(b'S', ""), msg::sync()]),
        (B, vec![msg::query("ROLLBACK")]),
        (B, vec![msg::describe(b'S', ""), msg::sync()]),
    ];
    let transcript = same_as_postgres(&steps).await;
    assert!(
        transcript.iter().any(|l| l == " 5 B| NoData"),
        "{transcript:#?}"
    );
    drop_table(&t).await;
}

/// A Close of the unnamed statement that the server skips (an error earlier in its batch)
/// leaves the statement where it was, as PostgreSQL does: still the client's, and never run
/// by another client sharing the server, whether pgmemo sent the Close on (the server held
/// the client's statement) or answered it itself (the server held another client's).
#[tokio::test]
async fn a_skipped_close_of_the_unnamed_statement_keeps_it() {
    use Who::{A, B};
    let parse = |name: &str, sql: &str| vec![msg::parse(name, sql, &[]), msg::sync()];
    let failing_then_close = |name: &str| {
        vec![
            msg::parse(name, "SELECT 1/0", &[]),
            msg::bind("", name, &[]),
            msg::execute("", 0),
            msg::close(b'S', ""),
            msg::sync(),
        ]
    };
    let steps = vec![
        (A, parse("", "SELECT 'secret a'")),
        (A, failing_then_close("s")),
        (B, exec("", &[])),
        (A, exec("", &[])),
        // 4-7: the server holds B's unnamed statement when A's Close is skipped.
        (B, parse("", "SELECT 'b'")),
        (A, failing_then_close("t")),
        (A, exec("", &[])),
        (B, exec("", &[])),
    ];
    let transcript = same_as_postgres(&steps).await;
    for line in [
        " 1 A| Error ERROR 22012: division by zero",
        " 2 B| Error ERROR 26000: unnamed prepared statement does not exist",
        " 3 A| DataRow [secret a]",
        " 6 A| DataRow [secret a]",
        " 7 B| DataRow [b]",
    ] {
        assert!(
            transcript.iter().any(|l| l == line),
            "{line}: {transcript:#?}"
        );
    }
}

/// Requests that need nothing of pgmemo (a Query that cannot touch the session, a batch on
/// the unnamed statement) go to the server as they are and their answers are relayed by
/// message type only (`client/transaction/plain.rs`): what pgmemo must still keep track of
/// around them (whose unnamed statement the server holds, the transaction's status and
/// settings, errors) is checked here against PostgreSQL, clients A and B sharing one server.
/// The session's application_name, as a column.
const SHOW_NAME: &str = "SELECT current_setting('application_name') AS n";
/// The session's work_mem, as a column.
const SHOW_MEM: &str = "SELECT current_setting('work_mem') AS m";

/// pgmemo's own simple queries on a pooled server drop its unnamed statement, as any simple
/// Query does: the health check of a server idle longer than `server_check_delay` (0 here:
/// every checkout) and the admin console's superuser check. A client's Bind of its unnamed
/// statement afterwards runs as on PostgreSQL (pgmemo parses it there again first); it got
/// 26000 when pgmemo took the statement for still there.
#[tokio::test]
async fn the_unnamed_statement_outlives_pgmemos_own_queries_on_its_server() {
    use txn_support::Raw;
    within(TEST_DEADLINE, async {
        let run = vec![
            msg::parse("", "SELECT $1::int + 1 AS a", &[]),
            msg::bind("", "", &[Some("1")]),
            msg::execute("", 0),
            msg::sync(),
        ];
        let mut direct = Raw::login(LocalPostgres::PORT).await;
        let mut expected = direct.exchange(&run).await;
        expected.extend(direct.exchange(&exec("", &[Some("2")])).await);
        expected.extend(direct.exchange(&exec("", &[Some("3")])).await);
        assert!(
            !expected.iter().any(|l| l.contains("Error")),
            "{expected:?}"
        );
        for cache in [Switch::On, Switch::Off] {
            let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| {
                c.cache = cache;
                c.server_check_delay = Seconds(Duration::ZERO);
            })
            .await;
            let mut a = Raw::login(pgmemo.port()).await;
            let mut got = a.exchange(&run).await;
            // The health check ran at this checkout.
            got.extend(a.exchange(&exec("", &[Some("2")])).await);
            // The superuser check ran on the one server of the pool.
            let admin = pgmemo.client(USER, "pgmemo").await;
            admin.simple_query("SHOW POOLS").await.unwrap();
            got.extend(a.exchange(&exec("", &[Some("3")])).await);
            assert!(
                got == expected,
                "cache {cache:?}:\n{}",
                side_by_side(&expected, &got)
            );
            pgmemo.shutdown().await;
        }
    })
    .await;
}

#[tokio::test]
async fn plain_requests_match_postgres() {
    use Who::{A, B};
    let run = |sql: &str, params: &[Option<&str>]| {
        vec![
            msg::parse("", sql, &[]),
            msg::bind("", "", params),
            msg::describe(b'P', ""),
            msg::execute("", 0),
            msg::sync(),
        ]
    };
    let mut steps = vec![
        // 0-2: a new unnamed statement, the same one again, then only Bind and Execute.
        (A, run("SELECT $1::int + 1 AS a", &[Some("1")])),
        (A, run("SELECT $1::int + 1 AS a", &[Some("2")])),
        (
            A,
            vec![
                msg::bind("", "", &[Some("3")]),
                msg::describe(b'S', ""),
                msg::execute("", 0),
                msg::sync(),
            ],
        ),
        // 3-4: B replaces the server's unnamed statement; A's is restored for A.
        (B, run("SELECT 'b' || $1::text AS b", &[Some("1")])),
        (A, exec("", &[Some("4")])),
        // 5-6: a simple Query drops the unnamed statement, as in PostgreSQL.
        (A, vec![msg::query("SELECT 'q' AS q")]),
        (A, exec("", &[Some("5")])),
        // 7-8: the Parse succeeds, the Bind fails: the statement stays for the next Bind.
        (A, run("SELECT $1::int * 10 AS t", &[Some("x")])),
        (A, exec("", &[Some("6")])),
        // 9-10: a failing plain batch and query; the session goes on.
        (A, run("SELECT 1 / $1::int AS d", &[Some("0")])),
        (A, vec![msg::query("SELECT 1 / 0")]),
        (A, exec("", &[Some("1")])),
        // 12-17: a setting made in a block is kept at a plain COMMIT and stays A's own.
        (A, vec![msg::query("BEGIN")]),
        (A, vec![msg::query("SET application_name = 'plain_a'")]),
        (A, run(SHOW_NAME, &[])),
        (A, vec![msg::query("COMMIT")]),
        (B, vec![msg::query(SHOW_NAME)]),
        (A, vec![msg::query(SHOW_NAME)]),
    ];
    // 18-23: a setting made in a block that fails in a plain request is dropped at the plain
    // COMMIT (which PostgreSQL answers with ROLLBACK), also after B used the server; 24-29:
    // the same with a plain ROLLBACK.
    for (value, inside, end) in [
        (
            "failed_a",
            run("SELECT 1 / $1::int AS d", &[Some("0")]),
            "COMMIT",
        ),
        ("rolled_back_a", vec![msg::query(SHOW_NAME)], "ROLLBACK"),
    ] {
        steps.extend([
            (A, vec![msg::query("BEGIN")]),
            (
                A,
                vec![msg::query(&format!("SET application_name = '{value}'"))],
            ),
            (A, inside),
            (A, vec![msg::query(end)]),
            (B, vec![msg::query(SHOW_NAME)]),
            (A, vec![msg::query(SHOW_NAME)]),
        ]);
    }
    steps.extend([
        // 30-31: several statements in one plain Query; an empty one.
        (A, vec![msg::query("SELECT 1 AS x; SELECT 2 AS y")]),
        (A, vec![msg::query("")]),
        // 32: a Query pipelined behind a plain batch.
        (
            A,
            [
                run("SELECT 'first' AS f", &[]),
                vec![msg::query("SELECT 'second' AS s")],
            ]
            .concat(),
        ),
        (B, exec("", &[Some("2")])),
        // 34-39: an Execute alone of a portal whose statement changes a setting is not plain:
        // the SET counts at COMMIT for A, and B does not get it (work_mem, which the server
        // does not report, so only the portal's tracking can tell).
        (A, vec![msg::query("BEGIN")]),
        (
            A,
            vec![
                msg::parse("set_mem", "SET work_mem = '4242kB'", &[]),
                msg::bind("p", "set_mem", &[]),
                msg::sync(),
            ],
        ),
        (A, vec![msg::execute("p", 0), msg::sync()]),
        (A, vec![msg::query("COMMIT")]),
        (B, vec![msg::query(SHOW_MEM)]),
        (A, vec![msg::query(SHOW_MEM)]),
    ]);
    let transcript = same_as_postgres(&steps).await;
    let unnamed_gone = "Error ERROR 26000: unnamed prepared statement does not exist";
    for line in [
        " 0 A| DataRow [2]",
        " 1 A| DataRow [3]",
        " 2 A| DataRow [4]",
        " 3 B| DataRow [b1]",
        " 4 A| DataRow [5]",
        &format!(" 6 A| {unnamed_gone}"),
        " 7 A| Error ERROR 22P02: invalid input syntax for type integer: \"x\"",
        " 8 A| DataRow [60]",
        &format!("11 A| {unnamed_gone}"),
        "16 B| DataRow []",
        "17 A| DataRow [plain_a]",
        "20 A| ReadyForQuery E",
        "21 A| CommandComplete ROLLBACK",
        "22 B| DataRow []",
        "23 A| DataRow [plain_a]",
        "28 B| DataRow []",
        "29 A| DataRow [plain_a]",
        "31 A| EmptyQueryResponse",
        "32 A| DataRow [second]",
        &format!("33 B| {unnamed_gone}"),
        "36 A| CommandComplete SET",
        "39 A| DataRow [4242kB]",
    ] {
        assert!(
            transcript.iter().any(|l| l == line),
            "{line}: {transcript:#?}"
        );
    }
}

/// Plain requests of many clients interleaved on two servers: each client's unnamed statement
/// and settings must follow it from server to server, plain requests or not (cache off, so
/// that most requests take the plain path).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plain_requests_of_many_clients_keep_their_own_statements_and_settings() {
    use txn_support::Raw;
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |c| c.cache = Switch::Off).await;
        let port = pgmemo.port();
        let clients = (0..16).map(|i| async move {
            let mut raw = Raw::login(port).await;
            raw.context = format!("client {i}");
            // First with settings of its own (servers change hands with a settings sync, and
            // every request after it takes the general path), then with the same settings as
            // every other client (plain requests follow each other on a shared server).
            for name in [format!("plain_{i}"), String::new()] {
                let set = if name.is_empty() {
                    msg::query("RESET application_name")
                } else {
                    msg::query(&format!("SET application_name = '{name}'"))
                };
                let answer = raw.exchange(&[set]).await;
                assert!(
                    answer.ends_with(&["ReadyForQuery I".to_owned()]),
                    "{answer:?}"
                );
                requests_of_one_client(&mut raw, i, &name).await;
            }
        });
        futures_util::future::join_all(clients).await;
        pgmemo.shutdown().await;
    })
    .await
}

/// 40 batches of client `i` on its unnamed statement (parsed in every fourth, the others Bind
/// only), with a simple Query after every fourth: every answer must be its own, with
/// application_name `name`.
async fn requests_of_one_client(raw: &mut txn_support::Raw, i: usize, name: &str) {
    // Each client's own text, so that another client's statement would show.
    let sql = format!("SELECT current_setting('application_name') || ' {i} ' || $1::text");
    for n in 0..40 {
        let value = n.to_string();
        let mut batch = Vec::new();
        if n % 4 == 0 {
            batch.push(msg::parse("", &sql, &[]));
        }
        batch.extend([
            msg::bind("", "", &[Some(&value)]),
            msg::execute("", 0),
            msg::sync(),
        ]);
        let answer = raw.exchange(&batch).await;
        let want = format!("DataRow [{name} {i} {n}]");
        assert!(answer.contains(&want), "client {i}, {n}: {answer:?}");
        if n % 4 == 3 {
            // A simple Query, plain too; it drops the unnamed statement.
            let answer = raw
                .exchange(&[msg::query(
                    "SELECT '<' || current_setting('application_name') || '>'",
                )])
                .await;
            assert!(
                answer.contains(&format!("DataRow [<{name}>]")),
                "client {i}, {n}: {answer:?}"
            );
        }
    }
}

/// A simple Query drops the client's unnamed statement also when the cache answers it, detached
/// or inside a transaction block: a later Bind of the unnamed statement fails as it does
/// directly.
#[tokio::test]
async fn a_query_answered_from_the_cache_drops_the_unnamed_statement() {
    use Who::A;
    within(TEST_DEADLINE, async {
        let table = create_table("unnamed_hit", "(id int)").await;
        let count = format!("SELECT count(*) AS n FROM {table}");
        let run = vec![
            msg::parse("", &format!("SELECT count(*) AS u FROM {table}"), &[]),
            msg::bind("", "", &[]),
            msg::execute("", 0),
            msg::sync(),
        ];
        let steps = vec![
            (A, run.clone()),
            (A, vec![msg::query(&count)]),
            (A, exec("", &[])),
            (A, run.clone()),
            (A, vec![msg::query(&count)]),
            (A, exec("", &[])),
            (A, vec![msg::query("BEGIN")]),
            (A, run.clone()),
            (A, vec![msg::query(&count)]),
            (A, exec("", &[])),
            (A, vec![msg::query("ROLLBACK")]),
        ];
        let direct = run_script(LocalPostgres::PORT, &steps).await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| {
            c.cache = Switch::On;
            c.cache_admission = pgmemo::config::CacheAdmission::Always;
        })
        .await;
        let proxied = run_script(pgmemo.port(), &steps).await;
        assert!(
            direct == proxied,
            "answers differ:\n{}",
            side_by_side(&direct, &proxied)
        );
        let admin = pgmemo.client(USER, "pgmemo").await;
        let hits: u64 = rows(&admin.simple_query("SHOW CACHE").await.unwrap())
            .into_iter()
            .find(|r| r[0].as_deref() == Some("hits"))
            .and_then(|r| r[1].as_deref()?.parse().ok())
            .expect("SHOW CACHE has hits");
        assert!(
            hits >= 2,
            "the Query was answered from the cache {hits} times"
        );
        for n in [2, 5, 9] {
            let line =
                format!("{n:>2} A| Error ERROR 26000: unnamed prepared statement does not exist");
            assert!(direct.contains(&line), "{line}: {direct:#?}");
        }
        pgmemo.shutdown().await;
        drop_table(&table).await;
    })
    .await
}

/// An extended-protocol COPY FROM STDIN on the unnamed statement starts as a plain batch:
/// the server ignores the batch's Sync until the copy ends, and pgmemo must not wait for
/// its ReadyForQuery (nor count it for the Sync after CopyDone), or it would keep the
/// server from the next client.
#[tokio::test]
async fn copy_in_on_the_unnamed_statement_with_the_cache_off() {
    use txn_support::Raw;
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| c.cache = Switch::Off).await;
        let mut transcripts = Vec::new();
        for port in [LocalPostgres::PORT, pgmemo.port()] {
            let table = create_table("plain_copy", "(id int)").await;
            let mut raw = Raw::login(port).await;
            raw.send(&[
                msg::parse("", &format!("COPY {table} FROM STDIN"), &[]),
                msg::bind("", "", &[]),
                msg::execute("", 0),
                msg::sync(),
            ])
            .await;
            let mut lines = Vec::new();
            loop {
                let (tag, body) = raw.recv().await;
                lines.push(txn_support::describe(tag, &body));
                if tag == b'G' {
                    break;
                }
            }
            let copy_data = |row: &str| {
                let mut m = vec![b'd'];
                m.extend_from_slice(&(row.len() as u32 + 4).to_be_bytes());
                m.extend_from_slice(row.as_bytes());
                m
            };
            let copy_done = vec![b'c', 0, 0, 0, 4];
            raw.send(&[copy_data("1\n"), copy_data("2\n"), copy_done])
                .await;
            lines.extend(raw.exchange(&[msg::sync()]).await);
            lines.extend(
                raw.exchange(&[msg::query(&format!("SELECT count(*) FROM {table}"))])
                    .await,
            );
            // A is owed nothing now: another client gets the one server at once.
            let mut other = Raw::login(port).await;
            lines.extend(other.exchange(&[msg::query("SELECT 'other' AS o")]).await);
            drop(raw);
            transcripts.push(lines);
            drop_table(&table).await;
        }
        assert_eq!(transcripts[0], transcripts[1]);
        for line in ["CommandComplete COPY 2", "DataRow [2]", "DataRow [other]"] {
            assert!(
                transcripts[1].contains(&line.to_owned()),
                "{line}: {transcripts:#?}"
            );
        }
        pgmemo.shutdown().await;
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// pgbench.

/// The pgbench database on the local server, created and initialized (`pgbench -i -s 1`) on
/// first use and reused afterwards; a file lock keeps parallel test processes from
/// initializing it twice at once.
const BENCH_DB: &str = "pgmemo_txn_bench";

async fn bench_database() {
    let lock_path = std::env::temp_dir().join("pgmemo_txn_bench.lock");
    let _lock = tokio::task::spawn_blocking(move || lock_exclusive(&lock_path))
        .await
        .unwrap();
    let admin = LocalPostgres.client(USER, DB).await;
    if let Err(e) = admin
        .batch_execute(&format!("CREATE DATABASE {BENCH_DB}"))
        .await
    {
        assert_eq!(sqlstate(&e), Some("42P04"), "CREATE DATABASE: {e:?}");
    }
    let bench = LocalPostgres.client(USER, BENCH_DB).await;
    let ready = bench
        .query_one(
            "SELECT (SELECT count(*) FROM pgbench_branches) = 1 \
             AND (SELECT count(*) FROM pgbench_tellers) = 10 \
             AND (SELECT count(*) FROM pgbench_accounts) = 100000",
            &[],
        )
        .await
        .map(|r| r.get::<_, bool>(0))
        .unwrap_or(false);
    if !ready {
        let mut init = pg_client("pgbench");
        init.args(["-i", "-s", "1", "-q", "-h", "127.0.0.1", "-p", "5432"])
            .args(["-U", USER, BENCH_DB]);
        run_ok(init, "pgbench -i", RUN_LIMIT).await;
    }
    // Keep the history from growing run after run.
    bench
        .batch_execute("TRUNCATE pgbench_history")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pgbench_64_clients_over_4_servers_in_every_query_mode() {
    within(Duration::from_secs(300), async {
        bench_database().await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 4, |c| {
            c.max_client_conn = 200;
            c.query_wait_timeout = Seconds(Duration::from_secs(60));
        })
        .await;
        let port = pgmemo.port().to_string();
        for mode in ["prepared", "extended", "simple"] {
            let mut bench = pg_client("pgbench");
            bench
                .args(["-M", mode, "-c", "64", "-j", "2", "-T", "10", "-n"])
                .args(["-h", "127.0.0.1", "-p", &port, "-U", USER, BENCH_DB]);
            let out = run_ok(bench, &format!("pgbench -M {mode}"), RUN_LIMIT).await;
            let report = assert_pgbench_report(&out, mode);
            assert!(
                report.contains("number of clients: 64"),
                "-M {mode}:\n{report}"
            );
            for pool in pgmemo.handle().shared().pools.all() {
                assert!(pool.counts().1 <= 4, "-M {mode}: {:?}", pool.counts());
            }
        }
        pgmemo.shutdown().await;
        // With the cache off, most of these requests take the plain path.
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 4, |c| {
            c.max_client_conn = 200;
            c.query_wait_timeout = Seconds(Duration::from_secs(60));
            c.cache = Switch::Off;
        })
        .await;
        let port = pgmemo.port().to_string();
        for mode in ["extended", "simple"] {
            let mut bench = pg_client("pgbench");
            bench
                .args(["-M", mode, "-c", "64", "-j", "2", "-T", "5", "-n"])
                .args(["-h", "127.0.0.1", "-p", &port, "-U", USER, BENCH_DB]);
            let out = run_ok(bench, &format!("pgbench -M {mode}, cache off"), RUN_LIMIT).await;
            assert_pgbench_report(&out, mode);
        }
        // Every transaction was applied whole: the three balances still agree.
        let bench = LocalPostgres.client(USER, BENCH_DB).await;
        let sums = value(
            &bench,
            "SELECT (SELECT sum(abalance) FROM pgbench_accounts) || ' ' || \
             (SELECT sum(tbalance) FROM pgbench_tellers) || ' ' || \
             (SELECT sum(bbalance) FROM pgbench_branches)",
        )
        .await;
        let parts: Vec<&str> = sums.split(' ').collect();
        assert!(
            parts.len() == 3 && parts[0] == parts[1] && parts[1] == parts[2],
            "{sums}"
        );
        pgmemo.shutdown().await;
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// psql.

/// SQL-level prepared statements, echoed (`-a`). Nothing printed depends on the connection.
const PSQL_SCRIPT: &str = "PREPARE q(int) AS SELECT $1 + 1 AS answer;
EXECUTE q(41);
DEALLOCATE q;
EXECUTE q(1);
PREPARE q(int) AS SELECT $1 * 2 AS doubled;
EXECUTE q(21);
PREPARE q(int) AS SELECT 0;
EXECUTE q(4);
PREPARE r AS SELECT 'r' AS name \\; EXECUTE r \\; DEALLOCATE PREPARE r;
EXECUTE r;
BEGIN;
PREPARE in_tx(text) AS SELECT upper($1) AS shout;
EXECUTE in_tx('inside');
COMMIT;
EXECUTE in_tx('after commit');
DEALLOCATE ALL;
EXECUTE q(1);
EXECUTE in_tx('gone');
SELECT 'done' AS status;
";

/// Runs psql with `args` against 127.0.0.1:`port`; returns (exit code, stdout, stderr).
async fn psql(port: u16, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = pg_client("psql");
    cmd.args(["-X", "-h", "127.0.0.1", "-p", &port.to_string(), "-U", USER])
        .args(["-d", DB])
        .args(args);
    let out = output(cmd, "psql", RUN_LIMIT).await;
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn psql_prepared_statements_match_a_direct_connection() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        // A neighbour on the same (only) server with statements of the same names.
        let neighbour = pgmemo.client(USER, DB).await;
        neighbour
            .batch_execute(
                "PREPARE q(int) AS SELECT -1; PREPARE r AS SELECT 'other r'; \
                 PREPARE m(int) AS SELECT -2",
            )
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("prepared.sql");
        std::fs::write(&script, PSQL_SCRIPT).unwrap();
        let script = script.to_string_lossy().into_owned();
        let runs: [Vec<&str>; 3] = [
            vec!["-a", "-v", "ON_ERROR_STOP=0", "-f", &script],
            // ON_ERROR_STOP: 42, then the error ends psql.
            vec![
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                "PREPARE q(int) AS SELECT $1 + 1",
                "-c",
                "EXECUTE q(41)",
                "-c",
                "DEALLOCATE q",
                "-c",
                "EXECUTE q(1)",
                "-c",
                "SELECT 'not reached'",
            ],
            // Several statements in one Query message.
            vec![
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                "PREPARE m(int) AS SELECT $1 + 1; EXECUTE m(41); DEALLOCATE m; EXECUTE m(2)",
            ],
        ];
        for args in &runs {
            let direct = psql(LocalPostgres::PORT, args).await;
            // Twice through pgmemo: the second run shares the server with the first's leftovers.
            for attempt in 0..2 {
                let proxied = psql(pgmemo.port(), args).await;
                assert_eq!(proxied.0, direct.0, "exit code, run {attempt} of {args:?}");
                assert_eq!(proxied.1, direct.1, "stdout, run {attempt} of {args:?}");
                assert_eq!(proxied.2, direct.2, "stderr, run {attempt} of {args:?}");
            }
        }
        for (sql, expected) in [("EXECUTE q(1)", "-1"), ("EXECUTE r", "other r")] {
            assert_eq!(
                value(&neighbour, sql).await,
                expected,
                "the neighbour's {sql}"
            );
        }
        assert_eq!(value(&neighbour, "EXECUTE m(1)").await, "-2");
        // Sanity: the runs did what they are about.
        let (code, out, err) = psql(LocalPostgres::PORT, &runs[0]).await;
        assert_eq!(code, Some(0));
        for expected in [
            "     42",
            "      42",
            " shout",
            " INSIDE",
            " AFTER COMMIT",
            " done",
        ] {
            assert!(out.contains(expected), "{expected:?} missing:\n{out}");
        }
        for expected in [
            "ERROR:  prepared statement \"q\" does not exist",
            "ERROR:  prepared statement \"q\" already exists",
            "ERROR:  prepared statement \"r\" does not exist",
            "ERROR:  prepared statement \"in_tx\" does not exist",
        ] {
            assert!(err.contains(expected), "{expected:?} missing:\n{err}");
        }
        let (code, out, err) = psql(LocalPostgres::PORT, &runs[1]).await;
        assert_ne!(code, Some(0));
        assert!(out.contains("42") && !out.contains("not reached"), "{out}");
        assert!(
            err.contains("prepared statement \"q\" does not exist"),
            "{err}"
        );
        pgmemo.shutdown().await;
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Python drivers.

/// The columns of the tables the Python scripts work on ([`create_table`]).
const SCRIPT_TABLE: &str = "(id int PRIMARY KEY, v text)";

#[tokio::test]
async fn psycopg_prepared_statements_and_pipeline_mode() {
    within(Duration::from_secs(300), async {
        let t = create_table("txn_psycopg", SCRIPT_TABLE).await;
        // The script against PostgreSQL itself first: it is correct, so a failure through
        // pgmemo is pgmemo's.
        let args = |port: u16| vec![port.to_string(), t.clone(), "main".to_owned()];
        let direct = python("psycopg_check.py", &args(LocalPostgres::PORT)).await;
        run_ok(direct, "psycopg_check.py main (direct)", RUN_LIMIT).await;

        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |_| {}).await;
        let proxied = python("psycopg_check.py", &args(pgmemo.port())).await;
        let out = run_ok(proxied, "psycopg_check.py main", RUN_LIMIT).await;
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
        pgmemo.shutdown().await;
        drop_table(&t).await;
    })
    .await
}

#[tokio::test]
async fn psycopg_sees_a_column_added_between_two_executions() {
    within(Duration::from_secs(300), async {
        let args = |port: u16, t: &str| vec![port.to_string(), t.to_owned(), "alter".to_owned()];
        let setup = |t: String| async move {
            let direct = LocalPostgres.client(USER, DB).await;
            direct
                .batch_execute(&format!("INSERT INTO {t} VALUES (1, 'one')"))
                .await
                .unwrap();
            t
        };
        // Directly, psycopg's second execution of its prepared SELECT * fails: the scenario
        // is real. pgmemo, outside an explicit transaction, re-prepares and retries.
        let t = setup(create_table("txn_alter_direct", SCRIPT_TABLE).await).await;
        let direct = python("psycopg_check.py", &args(LocalPostgres::PORT, &t)).await;
        let out = output(direct, "psycopg_check.py alter (direct)", RUN_LIMIT).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("cached plan must not change result type"),
            "{stderr}"
        );
        drop_table(&t).await;

        let t = setup(create_table("txn_alter", SCRIPT_TABLE).await).await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let proxied = python("psycopg_check.py", &args(pgmemo.port(), &t)).await;
        run_ok(proxied, "psycopg_check.py alter", RUN_LIMIT).await;
        pgmemo.shutdown().await;
        drop_table(&t).await;
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Java: PostgreSQL's JDBC driver.

/// pgjdbc with server-side prepared statements from the first execution (it names them S_1,
/// S_2, ... on every connection, for different texts), transactions committed and rolled
/// back, batched inserts, typed values (timestamptz, numeric, bytea, arrays, NULL), a
/// connection's `SET TIME ZONE` kept for it alone, and eight threads over a pool of two.
#[tokio::test]
async fn jdbc_prepared_statements_transactions_and_settings() {
    within(Duration::from_secs(300), async {
        // The program against PostgreSQL itself first: a failure through pgmemo is pgmemo's.
        let t = create_table("txn_jdbc_direct", SCRIPT_TABLE).await;
        let args = |port: u16, t: &str| vec![port.to_string(), t.to_owned(), "main".to_owned()];
        let direct = txn_support::jdbc_check(&args(LocalPostgres::PORT, &t));
        run_ok(direct, "JdbcCheck main (direct)", RUN_LIMIT).await;
        drop_table(&t).await;

        let t = create_table("txn_jdbc", SCRIPT_TABLE).await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |_| {}).await;
        let proxied = txn_support::jdbc_check(&args(pgmemo.port(), &t));
        let out = run_ok(proxied, "JdbcCheck main", RUN_LIMIT).await;
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
        pgmemo.shutdown().await;
        drop_table(&t).await;
    })
    .await
}

/// pgjdbc keeps the columns it was told when it prepared a statement and sends only Bind and
/// Execute after that. When another connection adds a column, PostgreSQL fails the next
/// execution with `cached plan must not change result type`, which pgjdbc answers by
/// preparing the statement again: every execution after the change shows the new column.
/// Through pgmemo the client sees the same, never rows decoded with the old columns.
#[tokio::test]
async fn jdbc_sees_a_column_added_between_executions_as_with_postgres() {
    within(Duration::from_secs(300), async {
        let run = |port: u16, prefix: &'static str, mode: &'static str| async move {
            let t = create_table(prefix, SCRIPT_TABLE).await;
            let direct = LocalPostgres.client(USER, DB).await;
            direct
                .batch_execute(&format!("INSERT INTO {t} VALUES (1, 'one')"))
                .await
                .unwrap();
            let args = vec![port.to_string(), t.clone(), mode.to_owned()];
            let out = run_ok(txn_support::jdbc_check(&args), prefix, RUN_LIMIT).await;
            drop_table(&t).await;
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |c| c.cache = Switch::Off).await;
        // Autocommit, and each execution in a transaction with autosave=conservative.
        for mode in ["alter", "alter-in-transaction"] {
            let direct = run(LocalPostgres::PORT, "txn_jdbc_alter_direct", mode).await;
            assert!(
                direct.contains("after 1: id=1 v=one extra=7"),
                "{mode}: {direct}"
            );
            let proxied = run(pgmemo.port(), "txn_jdbc_alter", mode).await;
            assert_eq!(proxied, direct, "{mode}");
        }
        pgmemo.shutdown().await;
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Node.js: node-postgres.

/// node-postgres with named prepared statements (the same names on several connections for
/// different texts), transactions, an error inside one, typed values, settings kept per
/// connection, and a pool of eight clients over a proxy pool of two.
#[tokio::test]
async fn node_postgres_prepared_statements_transactions_and_settings() {
    within(Duration::from_secs(300), async {
        // The script against PostgreSQL itself first: a failure through pgmemo is pgmemo's.
        let t = create_table("txn_node_direct", SCRIPT_TABLE).await;
        let args = |port: u16, t: &str| vec![port.to_string(), t.to_owned()];
        let direct = txn_support::node("pg_check.js", &args(LocalPostgres::PORT, &t)).await;
        run_ok(direct, "pg_check.js (direct)", RUN_LIMIT).await;
        drop_table(&t).await;

        let t = create_table("txn_node", SCRIPT_TABLE).await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |_| {}).await;
        let proxied = txn_support::node("pg_check.js", &args(pgmemo.port(), &t)).await;
        let out = run_ok(proxied, "pg_check.js", RUN_LIMIT).await;
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
        pgmemo.shutdown().await;
        drop_table(&t).await;
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// PHP: PDO and the pgsql extension, on libpq.

/// PDO with server-side prepared statements names them `pdo_stmt_00000001`, ... on every
/// connection and drops each with a SQL-level `DEALLOCATE` (the PHP case of the issue), over
/// two connections sharing a pool of two; also transactions, an error inside one, settings
/// kept per connection, and the pgsql extension's `pg_prepare` / `pg_execute` with the same
/// name on two connections.
#[tokio::test]
async fn php_pdo_and_pgsql_prepared_statements() {
    within(Duration::from_secs(300), async {
        // The script against PostgreSQL itself first: a failure through pgmemo is pgmemo's.
        let t = create_table("txn_php_direct", SCRIPT_TABLE).await;
        let args = |port: u16, t: &str| vec![port.to_string(), t.to_owned()];
        let direct = txn_support::php("pdo_check.php", &args(LocalPostgres::PORT, &t));
        run_ok(direct, "pdo_check.php (direct)", RUN_LIMIT).await;
        drop_table(&t).await;

        let t = create_table("txn_php", SCRIPT_TABLE).await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |_| {}).await;
        let proxied = txn_support::php("pdo_check.php", &args(pgmemo.port(), &t));
        let out = run_ok(proxied, "pdo_check.php", RUN_LIMIT).await;
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
        pgmemo.shutdown().await;
        drop_table(&t).await;
    })
    .await
}

/// asyncpg decodes a cached statement's rows with the description it got when it prepared
/// it. When another connection swaps two columns' places, PostgreSQL fails the next
/// execution with `cached plan must not change result type` and asyncpg prepares the
/// statement again; through pgmemo the client sees the same transcript, never the new rows
/// decoded with the old columns.
#[tokio::test]
async fn asyncpg_sees_columns_changed_between_executions_as_with_postgres() {
    within(Duration::from_secs(300), async {
        let run = |port: u16, prefix: &'static str| async move {
            let t = create_table(prefix, "(id int PRIMARY KEY, v text, w int)").await;
            let direct = LocalPostgres.client(USER, DB).await;
            direct
                .batch_execute(&format!("INSERT INTO {t} VALUES (1, 'one', 7)"))
                .await
                .unwrap();
            let cmd = python("asyncpg_alter.py", &[port.to_string(), t.clone()]).await;
            let out = run_ok(cmd, prefix, RUN_LIMIT).await;
            drop_table(&t).await;
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let direct = run(LocalPostgres::PORT, "txn_asyncpg_alter_direct").await;
        assert!(
            direct.contains("after 1: {'id': 1, 'w': 7, 'v': 'new'}"),
            "{direct}"
        );
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |_| {}).await;
        let proxied = run(pgmemo.port(), "txn_asyncpg_alter").await;
        assert_eq!(proxied, direct);
        pgmemo.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asyncpg_processes_with_the_same_statement_names() {
    within(Duration::from_secs(300), async {
        let t = create_table("txn_asyncpg", SCRIPT_TABLE).await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |_| {}).await;
        // Two processes at once, 10 connections each: both name their statements
        // __asyncpg_stmt_1__, __asyncpg_stmt_2__, ... for different texts.
        let mut runs = Vec::new();
        for proc in 1..=2 {
            let args = [pgmemo.port(), proc]
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>();
            let args = vec![args[0].clone(), t.clone(), args[1].clone(), "10".to_owned()];
            let cmd = python("asyncpg_check.py", &args).await;
            runs.push(tokio::spawn(run_ok(cmd, "asyncpg_check.py", RUN_LIMIT)));
        }
        for run in runs {
            let out = run.await.unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
        }
        let direct = LocalPostgres.client(USER, DB).await;
        assert_eq!(
            value(&direct, &format!("SELECT count(*) FROM {t}")).await,
            "100"
        );
        pgmemo.shutdown().await;
        drop_table(&t).await;
    })
    .await
}

/// An error about one of the client's statements names it as the client did, not by the
/// name pgmemo gave it on the servers (`pgmemo_7`): a Bind with the wrong number of
/// parameters, also when the batch closes the statement after the Bind, and when two names
/// stand for one text.
#[tokio::test]
async fn errors_name_the_clients_own_statement() {
    use Who::A;
    within(TEST_DEADLINE, async {
        let sql = "SELECT $1::int + 1 AS n";
        let steps = vec![
            (A, vec![msg::parse("s1", sql, &[]), msg::sync()]),
            (A, vec![msg::parse("s2", sql, &[]), msg::sync()]),
            (A, exec("s1", &[])),
            (A, exec("s2", &[Some("1"), Some("2")])),
            (
                A,
                vec![
                    msg::bind("", "s1", &[]),
                    msg::execute("", 0),
                    msg::close(b'S', "s1"),
                    msg::sync(),
                ],
            ),
            (A, exec("s2", &[Some("1")])),
        ];
        let transcript = same_as_postgres(&steps).await;
        for line in [
            "bind message supplies 0 parameters, but prepared statement \"s1\" requires 1",
            "bind message supplies 2 parameters, but prepared statement \"s2\" requires 1",
        ] {
            assert!(
                transcript.iter().any(|l| l.ends_with(line)),
                "{line}: {transcript:#?}"
            );
        }
    })
    .await;
}

/// A Parse that reuses a name the client has is refused with 42P05 only once its text has
/// been parsed and analysed, as in PostgreSQL: a syntax error, several statements, a
/// missing table or an aborted block is what the client hears about first; in an aborted
/// block a duplicate ROLLBACK is refused with 42P05 too.
#[tokio::test]
async fn a_duplicate_name_is_reported_after_the_texts_own_errors() {
    use Who::A;
    within(TEST_DEADLINE, async {
        let table = create_table("dup_name", "(id int)").await;
        let parse = |sql: &str| (A, vec![msg::parse("s1", sql, &[]), msg::sync()]);
        let steps = vec![
            parse(&format!("SELECT id FROM {table}")),
            parse("SELEC 1"),
            parse("SELECT 1; SELECT 2"),
            parse("SELECT * FROM no_such_table_here"),
            parse(&format!("SELECT count(*) FROM {table}")),
            (A, exec("s1", &[])),
            // In an aborted block PostgreSQL refuses any text but ROLLBACK or COMMIT before
            // it looks at the name.
            (A, vec![msg::query("BEGIN")]),
            (A, vec![msg::query("SELECT 1/0")]),
            parse("SELECT 1"),
            parse("ROLLBACK"),
            (A, vec![msg::query("ROLLBACK")]),
            (A, exec("s1", &[])),
        ];
        let transcript = same_as_postgres(&steps).await;
        for code in ["42601", "42P01", "42P05", "25P02"] {
            assert!(
                transcript
                    .iter()
                    .any(|l| l.contains(&format!("ERROR {code}:"))),
                "{code}: {transcript:#?}"
            );
        }
        drop_table(&table).await;
    })
    .await;
}

/// Clients on different `search_path`s (a schema per tenant) that prepare the same text do
/// not share a server-side statement: each reads its own schema's table, and a client whose
/// path lacks the table fails at Parse, as in PostgreSQL, instead of being answered from a
/// statement another client's server accepted.
#[tokio::test]
async fn clients_on_other_search_paths_prepare_their_own_statements() {
    use Who::{A, B};
    within(TEST_DEADLINE, async {
        let schemas = create_tenants("accounts", "v").await;
        let q = |sql: String| vec![msg::query(&sql)];
        let read = "SELECT v FROM accounts";
        let steps = vec![
            (A, q(format!("SET search_path = {}", schemas[0]))),
            (B, q(format!("SET search_path = {}", schemas[1]))),
            (A, vec![msg::parse("s1", read, &[]), msg::sync()]),
            (A, exec("s1", &[])),
            (B, vec![msg::parse("s1", read, &[]), msg::sync()]),
            (B, exec("s1", &[])),
            (A, exec("s1", &[])),
            (B, q("SET search_path = pg_catalog".into())),
            (B, vec![msg::parse("s2", read, &[]), msg::sync()]),
            (B, exec("s2", &[])),
        ];
        let transcript = same_as_postgres(&steps).await;
        assert!(
            transcript
                .iter()
                .any(|l| l.starts_with(" 8 B| Error ERROR 42P01")),
            "{transcript:#?}"
        );
        drop_tenants(&schemas).await;
    })
    .await;
}

/// Batches pipelined behind one that fails: PostgreSQL skips the failed batch's messages up
/// to its Sync, so a Parse or Close of a name in it never happened, and the batches after it
/// see the name as it was before. pgmemo, which answers Closes and known Parses itself and
/// refuses duplicate names itself, waits for the failed batch's answers before it decides
/// (a failure it raises itself needs no wait: the rest of that batch is not sent).
#[tokio::test]
async fn batches_pipelined_behind_a_failure_see_names_as_postgres_does() {
    use Who::A;
    within(TEST_DEADLINE, async {
        let parse = |name: &str, sql: &str| msg::parse(name, sql, &[]);
        let steps = vec![
            (A, vec![parse("s1", "SELECT 1 AS one"), msg::sync()]),
            // A duplicate Parse dooms its batch: the Close after it is skipped, and the Parse
            // of the next batch is a duplicate again.
            (
                A,
                vec![
                    parse("s1", "SELECT 2 AS two"),
                    msg::close(b'S', "s1"),
                    msg::sync(),
                    parse("s1", "SELECT 3 AS three"),
                    msg::sync(),
                ],
            ),
            (A, exec("s1", &[])),
            // A batch failing on the server (no such portal): its Close of s1 is skipped, the
            // Bind of s1 pipelined behind it runs the statement; its Parse of s2 is skipped,
            // so the next batch's Parse of s2 is no duplicate.
            (
                A,
                vec![
                    msg::execute("nope", 0),
                    msg::close(b'S', "s1"),
                    parse("s2", "SELECT 4 AS four"),
                    msg::sync(),
                    msg::bind("", "s1", &[]),
                    msg::execute("", 0),
                    msg::sync(),
                    parse("s2", "SELECT 5 AS five"),
                    msg::sync(),
                ],
            ),
            (A, exec("s2", &[])),
            // Errors of two pipelined batches name the statements of their own batch.
            (
                A,
                vec![
                    parse("s3", "SELECT $1::int AS n"),
                    parse("s4", "SELECT $1::int AS n"),
                    msg::sync(),
                    msg::bind("", "s4", &[]),
                    msg::sync(),
                    msg::bind("", "s3", &[]),
                    msg::sync(),
                ],
            ),
        ];
        let transcript = same_as_postgres(&steps).await;
        assert!(
            transcript.iter().any(|l| l.ends_with("DataRow [5]")),
            "{transcript:#?}"
        );
    })
    .await;
}

/// An `EXECUTE` or `DEALLOCATE` of a name the client does not have, sent as the unnamed
/// statement, fails when it is executed, as PostgreSQL looks the name up then: its Parse,
/// Bind and Describe succeed first.
#[tokio::test]
async fn an_unknown_name_in_an_unnamed_statement_fails_at_execute() {
    use Who::A;
    within(TEST_DEADLINE, async {
        let mut steps = Vec::new();
        for sql in ["EXECUTE nope", "DEALLOCATE nope"] {
            steps.push((
                A,
                vec![
                    msg::parse("", sql, &[]),
                    msg::bind("", "", &[]),
                    msg::describe(b'P', ""),
                    msg::execute("", 0),
                    msg::sync(),
                ],
            ));
        }
        let transcript = same_as_postgres(&steps).await;
        assert_eq!(
            transcript
                .iter()
                .filter(|l| l.ends_with("ParseComplete"))
                .count(),
            2,
            "{transcript:#?}"
        );
    })
    .await;
}

/// A batch that fails on the server after pgmemo held back one of its messages (a Parse of a
/// name the client has, which pgmemo decides only once the answers before it are in): the
/// server skips everything up to the batch's Sync, so pgmemo must not send the held message
/// as a batch of its own. The next query is answered, not left waiting.
#[tokio::test]
async fn a_failure_before_a_held_message_skips_the_rest_of_its_batch() {
    use Who::A;
    within(TEST_DEADLINE, async {
        let steps = vec![
            (
                A,
                vec![
                    msg::parse("s1", "SHOW TimeZone", &[]),
                    msg::bind("", "s1", &[]),
                    msg::execute("", 0),
                    msg::sync(),
                    msg::execute("p1", 0),
                    msg::flush(),
                    msg::parse("s1", "BEGIN", &[]),
                    msg::bind("p1", "", &[]),
                    msg::bind("p1", "s1", &[]),
                    msg::sync(),
                ],
            ),
            (A, vec![msg::query("SELECT 1 AS one")]),
        ];
        let transcript = same_as_postgres(&steps).await;
        assert!(
            transcript.iter().any(|l| l.ends_with("DataRow [1]")),
            "{transcript:#?}"
        );
    })
    .await;
}

/// A failed Parse of the unnamed statement leaves no unnamed statement, neither the new one
/// nor the one before it: a Bind of it fails with 26000, as in PostgreSQL, and pgmemo does not
/// run the earlier text in its place.
#[tokio::test]
async fn a_failed_unnamed_parse_leaves_no_unnamed_statement() {
    use Who::A;
    within(TEST_DEADLINE, async {
        let steps = vec![
            (
                A,
                vec![msg::parse("s2", "SELECT 2 AS two", &[]), msg::sync()],
            ),
            (A, vec![msg::parse("", "SELECT 1 AS one", &[]), msg::sync()]),
            (A, vec![msg::parse("", "SELEC 1", &[]), msg::sync()]),
            (A, exec("", &[])),
            (
                A,
                vec![msg::parse("s2", "SELECT 3 AS three", &[]), msg::sync()],
            ),
            (A, exec("", &[])),
        ];
        let transcript = same_as_postgres(&steps).await;
        assert_eq!(
            transcript
                .iter()
                .filter(|l| l.contains("ERROR 26000"))
                .count(),
            2,
            "{transcript:#?}"
        );
    })
    .await;
}

/// A Bind of the unnamed statement pipelined behind a batch that fails: pgmemo's Close of
/// another client's unnamed statement in the failed batch was skipped, so the Bind waits for
/// that batch's answers and closes it again rather than run the other client's statement.
/// As in PostgreSQL, the client that never parsed one gets 26000.
#[tokio::test]
async fn a_bind_behind_a_failed_batch_never_runs_another_clients_unnamed_statement() {
    use Who::{A, B};
    within(TEST_DEADLINE, async {
        let steps = vec![
            (
                B,
                vec![
                    msg::parse("", "SELECT 'b' AS owner", &[]),
                    msg::bind("", "", &[]),
                    msg::execute("", 0),
                    msg::sync(),
                ],
            ),
            (
                A,
                vec![
                    msg::describe(b'P', ""),
                    msg::describe(b'S', ""),
                    msg::execute("", 0),
                    msg::sync(),
                    msg::bind("", "", &[]),
                    msg::execute("", 0),
                    msg::sync(),
                ],
            ),
        ];
        let transcript = same_as_postgres(&steps).await;
        assert!(
            transcript
                .iter()
                .any(|l| l.starts_with(" 1 A| Error ERROR 26000")),
            "{transcript:#?}"
        );
    })
    .await;
}

/// A Parse of a name given in an earlier, failed batch of the same write, behind a Close of
/// a portal and followed by Flush: it waits for the failed batch's answers, is then found a
/// duplicate (the failed batch's first Parse of the name had succeeded), and every answer
/// comes, as from PostgreSQL.
#[tokio::test]
async fn a_duplicate_behind_a_failed_batch_and_a_flush_is_answered() {
    use Who::A;
    within(TEST_DEADLINE, async {
        let steps = vec![(
            A,
            vec![
                msg::parse("s2", "SELECT 1 AS one", &[]),
                msg::execute("", 0),
                msg::parse("s2", "SELECT 2 AS two", &[]),
                msg::flush(),
                msg::sync(),
                msg::close(b'P', "p1"),
                msg::parse("s2", "SELECT $1::int AS three", &[23]),
                msg::flush(),
                msg::sync(),
            ],
        )];
        let transcript = same_as_postgres(&steps).await;
        assert!(
            transcript.iter().any(|l| l.contains("ERROR 42P05")),
            "{transcript:#?}"
        );
    })
    .await;
}

/// A Bind pipelined behind a batch in which pgmemo prepared the statement on the client's
/// new server: when the server skipped that Parse (here: the transaction is aborted), the
/// Bind waits and prepares it again rather than name a statement the server lacks. As in
/// PostgreSQL, both batches fail with 25P02.
#[tokio::test]
async fn a_bind_behind_a_skipped_preparation_prepares_again() {
    use Who::{A, B};
    within(TEST_DEADLINE, async {
        let q = |s: &str| vec![msg::query(s)];
        let run = |portal: &'static str| {
            vec![
                msg::bind(portal, "s1", &[Some("7")]),
                msg::describe(b'P', portal),
                msg::execute(portal, 0),
                msg::sync(),
            ]
        };
        let steps = vec![
            (
                A,
                vec![msg::parse("s1", "SELECT $1::int AS n", &[23]), msg::sync()],
            ),
            // B holds the server A prepared s1 on: A's block runs on the other one.
            (B, q("BEGIN")),
            (A, q("BEGIN; SELECT 1/0")),
            (A, [run("p1"), run("")].concat()),
            (A, q("ROLLBACK")),
            (B, q("ROLLBACK")),
        ];
        let transcript = same_as_postgres_over(2, &steps).await;
        assert_eq!(
            transcript
                .iter()
                .filter(|l| l.starts_with(" 3 A| Error ERROR 25P02"))
                .count(),
            2,
            "{transcript:#?}"
        );
    })
    .await;
}

/// A SQL-level `PREPARE` of a name the client has: PostgreSQL analyses the statement first,
/// so one with an error of its own fails with that error, and only a sound one with 42P05;
/// either way the prepared statement the client had stays as it was.
#[tokio::test]
async fn a_duplicate_sql_prepare_reports_its_statements_own_error_first() {
    use Who::A;
    within(TEST_DEADLINE, async {
        let q = |sql: &str| vec![msg::query(sql)];
        let steps = vec![
            (A, q("PREPARE q2(int) AS SELECT $1::int AS n")),
            (
                A,
                q("PREPARE q2(int) AS SELECT v FROM pgmemo_nosuch WHERE k = $1"),
            ),
            (A, q("PREPARE q2(int) AS SELECT $1::int + 1 AS m")),
            (
                A,
                q("SELECT 1 AS one; PREPARE q2 AS SELECT nosuch_col; SELECT 2"),
            ),
            (
                A,
                vec![
                    msg::parse("", "PREPARE q2 AS SELECT 'it''s' FROM pgmemo_nosuch", &[]),
                    msg::bind("", "", &[]),
                    msg::execute("", 0),
                    msg::sync(),
                ],
            ),
            (A, q("BEGIN; SELECT 1/0")),
            (A, q("PREPARE q2 AS SELECT 3")),
            (A, q("ROLLBACK")),
            (A, q("EXECUTE q2(5)")),
        ];
        let transcript = same_as_postgres(&steps).await;
        for expected in [
            " 1 A| Error ERROR 42P01",
            " 2 A| Error ERROR 42P05",
            " 3 A| Error ERROR 42703",
            " 4 A| Error ERROR 42P01",
            " 6 A| Error ERROR 25P02",
            " 8 A| DataRow [5]",
        ] {
            assert!(
                transcript.iter().any(|l| l.starts_with(expected)),
                "{expected}: {transcript:#?}"
            );
        }
    })
    .await;
}

/// `DISCARD ALL` closes the client's portals, as in PostgreSQL (which commits it at once in
/// the extended protocol, dropping every portal): an Execute of a portal bound before it in
/// the same batch fails with 34000.
#[tokio::test]
async fn discard_all_closes_the_clients_portals() {
    use Who::A;
    within(TEST_DEADLINE, async {
        let steps = vec![(
            A,
            vec![
                msg::parse("s1", "SELECT 1 AS one", &[]),
                msg::bind("p1", "s1", &[]),
                msg::parse("", "DISCARD ALL", &[]),
                msg::bind("", "", &[]),
                msg::execute("", 0),
                msg::execute("p1", 0),
                msg::sync(),
            ],
        )];
        let transcript = same_as_postgres(&steps).await;
        assert!(
            transcript
                .iter()
                .any(|l| l.starts_with(" 0 A| Error ERROR 34000")),
            "{transcript:#?}"
        );
    })
    .await;
}

/// A second Execute of a portal that ran a SQL-level `PREPARE` fails (a utility statement's
/// portal runs once) and undoes nothing: the client still has the statement, and a second
/// `PREPARE` of its name fails with 42P05, as in PostgreSQL.
#[tokio::test]
async fn a_second_execute_of_a_prepare_portal_undoes_nothing() {
    use Who::A;
    within(TEST_DEADLINE, async {
        let prepare = "PREPARE q2(int) AS SELECT $1::int AS n";
        let steps = vec![
            (
                A,
                vec![
                    msg::parse("", prepare, &[]),
                    msg::bind("p1", "", &[]),
                    msg::execute("p1", 0),
                    msg::execute("p1", 0),
                    msg::sync(),
                ],
            ),
            (A, vec![msg::query(&format!("SELECT 1 AS one; {prepare}"))]),
            (A, vec![msg::query("EXECUTE q2(4)")]),
        ];
        let transcript = same_as_postgres(&steps).await;
        assert!(
            transcript
                .iter()
                .any(|l| l.starts_with(" 1 A| Error ERROR 42P05")),
            "{transcript:#?}"
        );
    })
    .await;
}

/// A batch whose Parse of the unnamed statement the server skips, pipelined ahead of one in
/// which pgmemo gives the server an unnamed statement of its own (a named Parse it has the
/// server check in place of the client's): undoing the skipped Parse must not make pgmemo
/// forget the later one, or the next client's Bind of the unnamed statement would run it.
#[tokio::test]
async fn undoing_a_skipped_unnamed_parse_keeps_a_later_batchs() {
    use Who::{A, B};
    within(TEST_DEADLINE, async {
        let update = "UPDATE pgmemo_undo_t SET v = v + 1 WHERE k = $1";
        let admin = testkit::connect(&testkit::url("127.0.0.1", LocalPostgres::PORT, USER, DB))
            .await
            .unwrap();
        admin
            .batch_execute(
                "DROP TABLE IF EXISTS pgmemo_undo_t; \
                 CREATE TABLE pgmemo_undo_t (k int PRIMARY KEY, v int)",
            )
            .await
            .unwrap();
        let steps = vec![
            // The server gets the statement, the client forgets its name.
            (A, vec![msg::parse("w1", update, &[]), msg::sync()]),
            (A, vec![msg::close(b'S', "w1"), msg::sync()]),
            (
                B,
                vec![
                    msg::describe(b'P', ""),
                    msg::parse("", "SELECT 1 AS one", &[]),
                    msg::sync(),
                    msg::parse("s2", update, &[]),
                    msg::bind("p1", "s2", &[Some("1")]),
                    msg::execute("p1", 0),
                    msg::sync(),
                ],
            ),
            (A, vec![msg::bind("", "", &[]), msg::sync()]),
        ];
        let transcript = same_as_postgres(&steps).await;
        assert!(
            transcript
                .iter()
                .any(|l| l.starts_with(" 3 A| Error ERROR 26000")),
            "{transcript:#?}"
        );
        admin
            .batch_execute("DROP TABLE pgmemo_undo_t")
            .await
            .unwrap();
    })
    .await;
}

/// A Parse in an aborted block, of a text the server holds already (another client prepared
/// it), with a Bind of its name pipelined in the next batch: PostgreSQL refuses the Parse
/// (25P02), so the name does not exist and the Bind fails with 26000, which pgmemo must not
/// turn into the server's 25P02 for the statement it holds.
#[tokio::test]
async fn a_bind_behind_a_refused_parse_of_a_held_statement_fails_with_26000() {
    use Who::{A, B};
    within(TEST_DEADLINE, async {
        let text = "SELECT 41 AS n";
        let steps = vec![
            (A, vec![msg::parse("w1", text, &[]), msg::sync()]),
            (B, vec![msg::query("BEGIN; SELECT 1/0")]),
            (
                B,
                vec![
                    msg::parse("s1", text, &[]),
                    msg::bind("p1", "s1", &[]),
                    msg::sync(),
                    msg::bind("", "s1", &[]),
                    msg::sync(),
                ],
            ),
            (B, vec![msg::query("ROLLBACK")]),
        ];
        let transcript = same_as_postgres(&steps).await;
        assert!(
            transcript
                .iter()
                .any(|l| l.starts_with(" 2 B| Error ERROR 26000")),
            "{transcript:#?}"
        );
    })
    .await;
}

/// An unnamed `DEALLOCATE ALL` whose Parse the server skips (an error earlier in the batch)
/// deallocates nothing: the client's statements still run, as in PostgreSQL.
#[tokio::test]
async fn a_skipped_unnamed_deallocate_all_keeps_the_clients_statements() {
    use Who::A;
    within(TEST_DEADLINE, async {
        let steps = vec![
            (
                A,
                vec![msg::parse("s1", "SELECT 11 AS n", &[]), msg::sync()],
            ),
            (
                A,
                vec![
                    msg::bind("", "", &[]),
                    msg::parse("", "DEALLOCATE ALL", &[]),
                    msg::execute("p1", 0),
                    msg::sync(),
                ],
            ),
            (A, exec("s1", &[])),
        ];
        let transcript = same_as_postgres(&steps).await;
        assert!(
            transcript.iter().any(|l| l.ends_with("DataRow [11]")),
            "{transcript:#?}"
        );
    })
    .await;
}

/// A Parse of a name the client already has goes to the server as an unnamed Parse (so that
/// its text's own errors come first): pipelined behind an unnamed Parse that the server skips,
/// it is what the server holds afterwards, and another client's Bind of the unnamed statement
/// fails as it would in PostgreSQL instead of binding it (differential seed 181).
#[tokio::test]
async fn an_unnamed_parse_skipped_before_a_duplicate_name_leaves_nothing_to_bind() {
    use Who::{A, B};
    let steps = vec![
        (
            B,
            vec![
                msg::parse("s2", "SELECT 1 WHERE $1::int > 0", &[]),
                msg::bind("", "s2", &[Some("6")]),
                msg::execute("", 1),
                msg::sync(),
            ],
        ),
        (
            B,
            vec![
                // Fails (the unnamed portal ended with its transaction): the Parse is skipped.
                msg::describe(b'P', ""),
                msg::parse("", "SELECT 2", &[]),
                msg::sync(),
                // 42P05, after the server parsed the text as its unnamed statement.
                msg::parse("s2", "SELECT 3", &[]),
                msg::sync(),
            ],
        ),
        (
            A,
            vec![
                msg::parse("s1", "SELECT 4", &[]),
                msg::bind("", "", &[]),
                msg::sync(),
            ],
        ),
        (B, exec("", &[])),
    ];
    let transcript = same_as_postgres(&steps).await;
    let misses = transcript
        .iter()
        .filter(|l| l.contains("26000: unnamed prepared statement does not exist"))
        .count();
    assert_eq!(misses, 2, "{transcript:#?}");
}

/// An unnamed statement holding a SQL-level PREPARE, bound and executed again in a later
/// batch: PostgreSQL says 42P05 for the client's name (not pgmemo's), and the failure does
/// not make pgmemo forget the statement the first run prepared (differential seed 1000079).
#[tokio::test]
async fn an_unnamed_prepare_bound_again_finds_its_name_taken() {
    use Who::B;
    let run_twice = |portal: &str| {
        vec![
            msg::bind(portal, "", &[]),
            msg::describe(b'P', portal),
            msg::execute(portal, 0),
            msg::execute(portal, 0),
            msg::sync(),
        ]
    };
    let steps = vec![
        (
            B,
            [
                vec![msg::parse("", "PREPARE q2(int) AS SELECT $1 + 1", &[])],
                run_twice("p1"),
            ]
            .concat(),
        ),
        (B, run_twice("p1")),
        (B, vec![msg::query("EXECUTE q2(41)")]),
    ];
    let transcript = same_as_postgres(&steps).await;
    assert!(
        transcript.iter().any(|l| l.contains("42P05")),
        "{transcript:#?}"
    );
    assert!(
        transcript.iter().any(|l| l.ends_with("DataRow [42]")),
        "{transcript:#?}"
    );
}

/// An unnamed Parse that fails leaves the client no unnamed statement, also when the next
/// batch was pipelined behind it before the error came back: its Bind of the unnamed
/// statement fails with 26000, and pgmemo does not parse the failed text again for it (a
/// Parse of a statement the server already holds, in between, is checked as the server's
/// unnamed statement; differential seed 1000156).
#[tokio::test]
async fn a_failed_unnamed_parse_is_not_given_to_the_server_again() {
    use Who::{A, B};
    let steps = vec![
        (A, vec![msg::parse("s2", "SELECT 3", &[]), msg::sync()]),
        (
            B,
            vec![
                msg::parse("", "SELECT $1::int; SELECT 2", &[]),
                msg::bind("", "", &[Some("6")]),
                msg::execute("", 0),
                msg::sync(),
                msg::parse("s2", "SELECT 3", &[]),
                msg::bind("p1", "", &[Some("6")]),
                msg::bind("", "s2", &[]),
                msg::execute("p1", 0),
                msg::flush(),
                msg::sync(),
            ],
        ),
        (B, exec("s2", &[])),
    ];
    let transcript = same_as_postgres(&steps).await;
    assert!(
        transcript
            .iter()
            .any(|l| l.contains("26000: unnamed prepared statement does not exist")),
        "{transcript:#?}"
    );
}

/// Statements that set the transaction's characteristics must come before its first query:
/// pgmemo's catalog lookup for the rest of a Query must not be that first query inside a
/// block, in either pool mode (differential seed 1000200: 25001 "SET TRANSACTION ISOLATION
/// LEVEL must be called before any query" where PostgreSQL runs the Query).
#[tokio::test]
async fn a_transaction_mode_set_in_a_block_is_not_preceded_by_pgmemos_lookups() {
    use pgmemo::config::PoolMode;
    use Who::A;
    let t = create_table("txmode", "(k int PRIMARY KEY)").await;
    let q = |sql: String| vec![msg::query(&sql)];
    let steps = vec![
        (A, q("BEGIN".into())),
        (
            A,
            q(format!(
                "BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT k FROM {t} WHERE k > 4"
            )),
        ),
        (A, q("SHOW transaction_isolation".into())),
        (A, q("COMMIT".into())),
        (A, q("BEGIN".into())),
        (
            A,
            q(format!(
                "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM {t}"
            )),
        ),
        (A, q("SHOW transaction_isolation".into())),
        (A, q("COMMIT".into())),
        // A setting changed first: pgmemo reads nothing from the server in between.
        (A, q("BEGIN".into())),
        (A, q("SET TimeZone = 'UTC'".into())),
        (A, q("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE".into())),
        (A, q(format!("SELECT count(*) FROM {t}"))),
        (A, q("COMMIT".into())),
    ];
    let direct = run_script(LocalPostgres::PORT, &steps).await;
    assert!(
        direct.iter().any(|l| l.ends_with("DataRow [serializable]"))
            && direct
                .iter()
                .any(|l| l.ends_with("DataRow [repeatable read]")),
        "{direct:#?}"
    );
    for mode in [PoolMode::Session, PoolMode::Transaction] {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |c| c.pool_mode = mode).await;
        assert_same_through(pgmemo, &direct, &steps, format!("{mode:?}")).await;
    }
    drop_table(&t).await;
}

/// A setting changed by `set_config` (which pgmemo cannot follow from the text) is read back
/// from the server before the client's next statement runs elsewhere or is answered from the
/// cache: with two servers, the next read shows the value set_config gave (differential seed
/// 1000239).
#[tokio::test]
async fn a_setting_changed_by_set_config_follows_the_client() {
    use Who::B;
    let q = |sql: &str| vec![msg::query(sql)];
    let steps = vec![
        (B, q("SET extra_float_digits = 0")),
        (B, q("SELECT 0.1::float8 + 0.2 AS f")),
        (
            B,
            q("SELECT set_config('extra_float_digits', '1', false) AS c"),
        ),
        (B, q("SELECT 0.1::float8 + 0.2 AS f")),
        (B, q("SELECT 0.1::float8 + 0.2 AS f")),
        // A reported setting, in a Query with a RESET of it (seed 1000319).
        (
            B,
            q("RESET TimeZone; SELECT set_config('TimeZone', 'Europe/Paris', false) AS c"),
        ),
        (B, q("SHOW TimeZone; SET TimeZone = 'Asia/Tokyo'")),
        (B, q("SHOW TimeZone")),
    ];
    let transcript = same_as_postgres_over(2, &steps).await;
    assert!(
        transcript
            .iter()
            .any(|l| l.ends_with("DataRow [0.30000000000000004]")),
        "{transcript:#?}"
    );
}

/// A SQL-level PREPARE is analysed under the client's search_path, also when another client
/// prepared the same text on the server under another one (differential seeds 1000271,
/// 1000494): set by a protocol-level statement, or earlier in the same Query.
#[tokio::test]
async fn a_sql_prepare_is_analysed_under_its_clients_search_path() {
    use Who::{A, B};
    let t = create_table("sqlprep", "(v int)").await;
    let prepare = format!("PREPARE q1 AS SELECT v FROM {t}");
    let steps = vec![
        (A, vec![msg::query(&prepare)]),
        (
            B,
            vec![
                msg::parse("s2", "SET search_path = pg_catalog", &[]),
                msg::bind("p1", "s2", &[]),
                msg::execute("p1", 2),
                msg::sync(),
            ],
        ),
        (B, vec![msg::query(&prepare)]),
        (B, vec![msg::query("RESET search_path")]),
        (
            B,
            vec![msg::query(&format!(
                "SET search_path = pg_catalog; {prepare}"
            ))],
        ),
        (B, vec![msg::query("RESET search_path")]),
        // Earlier in the same transaction block, not committed yet.
        (B, vec![msg::query("BEGIN")]),
        (B, vec![msg::query("SET LOCAL search_path = pg_catalog")]),
        (B, vec![msg::query(&prepare)]),
        (B, vec![msg::query("ROLLBACK")]),
        (B, vec![msg::query("EXECUTE q1")]),
    ];
    let transcript = same_as_postgres_over(2, &steps).await;
    let missing = transcript.iter().filter(|l| l.contains("42P01")).count();
    assert_eq!(missing, 3, "{transcript:#?}");
    drop_table(&t).await;
}

/// `PREPARE`, `DEALLOCATE`, `DISCARD ALL` and `RESET ALL` sent as the unnamed statement take
/// effect when they are executed, not when parsed: parsed alone, described, bound, or with
/// an Execute the server refuses, they change nothing, and a statement pipelined behind them
/// sees the names as they were. pgmemo once applied them to the client's statement names at
/// the Parse (so that `EXECUTE q1` failed naming pgmemo's own statement, `pgmemo_1`).
#[tokio::test]
async fn sql_level_statements_parsed_but_not_executed_change_nothing() {
    within(TEST_DEADLINE, async {
        let unexecuted = |text: &str, tail: &[Vec<u8>]| {
            let mut v = vec![msg::parse("", text, &[])];
            v.extend_from_slice(tail);
            v.push(msg::sync());
            v
        };
        let check = vec![
            msg::query("SHOW application_name"),
            msg::query("EXECUTE q1"),
            msg::query("EXECUTE q2"),
        ];
        let tails = [
            vec![],
            vec![msg::describe(b'S', "")],
            vec![msg::bind("", "", &[])],
            vec![msg::bind("", "", &[]), msg::frame(b'E', b"\0\0\0\0")],
        ];
        let mut steps = vec![(
            Who::A,
            vec![msg::query(
                "SET application_name = 'kept'; PREPARE q1 AS SELECT 1 AS one",
            )],
        )];
        for text in [
            "PREPARE q2 AS SELECT 2 AS two",
            "DEALLOCATE q1",
            "DEALLOCATE ALL",
            "DISCARD ALL",
            "RESET ALL",
        ] {
            for tail in &tails {
                steps.push((Who::A, unexecuted(text, tail)));
                steps.push((Who::B, vec![msg::query("SELECT 'B in between'")]));
                steps.push((Who::A, check.clone()));
            }
            // Pipelined: the batch behind sees the names as they were.
            let mut pipelined = unexecuted(text, &[msg::bind("", "", &[])]);
            pipelined.extend(unexecuted(
                "EXECUTE q1",
                &[msg::bind("", "", &[]), msg::execute("", 0)],
            ));
            steps.push((Who::A, pipelined));
        }
        // Pipelined behind a batch whose Bind fails: that batch's DEALLOCATE or PREPARE did
        // not run, and the batch behind finds the names as they were.
        let failing = |text: &str| {
            unexecuted(
                text,
                &[msg::bind("", "", &[Some("1")]), msg::execute("", 0)],
            )
        };
        let executed =
            |text: &str| unexecuted(text, &[msg::bind("", "", &[]), msg::execute("", 0)]);
        for (first, second) in [
            ("DEALLOCATE q1", "PREPARE q1 AS SELECT 1 AS one"),
            ("PREPARE q2 AS SELECT 2 AS two", "EXECUTE q2"),
            ("DISCARD ALL", "EXECUTE q1"),
        ] {
            let mut pipelined = failing(first);
            pipelined.extend(executed(second));
            steps.push((Who::A, pipelined));
            steps.push((Who::A, check.clone()));
        }
        // Executed, each takes effect.
        steps.push((
            Who::A,
            unexecuted(
                "DEALLOCATE q1",
                &[msg::bind("", "", &[]), msg::execute("", 0)],
            ),
        ));
        steps.push((Who::A, check.clone()));
        let transcript = same_as_postgres(&steps).await;
        assert!(
            transcript.iter().any(|l| l.ends_with("DataRow [1]")),
            "{transcript:#?}"
        );
        same_in_session_pooling(&transcript, &steps).await;
    })
    .await;
}

/// A `DISCARD ALL` sent in the extended protocol: PostgreSQL refuses it after another
/// statement of its batch or pipelined behind a `BEGIN` (25001, the batch rolled back), and
/// commits as soon as it completes otherwise, so its reset stays when a later message of the
/// batch fails, while the `SET`s after it are rolled back with the rest.
#[tokio::test]
async fn discard_all_in_a_batch_runs_and_commits_as_in_postgres() {
    within(TEST_DEADLINE, async {
        let run = |text: &str| {
            vec![
                msg::parse("", text, &[]),
                msg::bind("", "", &[]),
                msg::execute("", 0),
            ]
        };
        let show = vec![msg::query("SHOW application_name; SHOW DateStyle")];
        let batch = |texts: &[&str], end: &[Vec<u8>]| {
            let mut v: Vec<Vec<u8>> = texts.iter().flat_map(|t| run(t)).collect();
            v.extend_from_slice(end);
            v
        };
        let steps = vec![
            (Who::A, vec![msg::query("SET application_name = 'before'")]),
            (
                Who::A,
                batch(&["SET DateStyle = 'German'", "DISCARD ALL"], &[msg::sync()]),
            ),
            (Who::B, vec![msg::query("SELECT 'B in between'")]),
            (Who::A, show.clone()),
            (
                Who::A,
                batch(
                    &[
                        "DISCARD ALL",
                        "SET DateStyle = 'German'",
                        "SET application_name = 'rolled_back'",
                    ],
                    &[msg::frame(b'S', b"x")],
                ),
            ),
            (Who::B, vec![msg::query("SELECT 'B in between'")]),
            (Who::A, show.clone()),
            // Pipelined behind a BEGIN: inside the block, refused.
            (
                Who::A,
                [
                    vec![msg::query("BEGIN")],
                    batch(&["DISCARD ALL"], &[msg::sync()]),
                    vec![msg::query("ROLLBACK")],
                ]
                .concat(),
            ),
        ];
        let transcript = same_as_postgres(&steps).await;
        let refused = transcript.iter().filter(|l| l.contains("25001")).count();
        assert_eq!(refused, 2, "{transcript:#?}");
        assert!(
            transcript.iter().any(|l| l == " 3 A| DataRow [before]")
                && transcript.iter().any(|l| l == " 6 A| DataRow []"),
            "{transcript:#?}"
        );
        same_in_session_pooling(&transcript, &steps).await;
    })
    .await;
}

/// An `EXECUTE` after a `SET search_path` in the same Query reads its statement's tables as
/// PostgreSQL does, parsing it again under that path, also when pgmemo must prepare the
/// statement again on a server that lost it (differential seed 13196): pgmemo prepares it
/// under the settings of its first reading, path included, not those in force before the
/// Query (under which the table was not found), and the server analyses it again under the
/// Query's path when it runs it.
#[tokio::test]
async fn an_execute_after_a_search_path_change_in_its_query_reads_the_new_path() {
    within(TEST_DEADLINE, async {
        let t = create_table("path_reread", "(k int, v text)").await;
        let tenant = format!("{t}_s");
        LocalPostgres
            .client(USER, DB)
            .await
            .batch_execute(&format!(
                "CREATE SCHEMA {tenant}; CREATE TABLE {tenant}.{t} (k int, v text); \
                 INSERT INTO {t} VALUES (2, 'public'); \
                 INSERT INTO {tenant}.{t} VALUES (2, 'tenant')"
            ))
            .await
            .unwrap();
        let steps = vec![
            (
                Who::A,
                vec![msg::query(&format!(
                    "PREPARE q1 AS SELECT v FROM {t} WHERE k = 2"
                ))],
            ),
            (Who::A, vec![msg::query("SET search_path = pg_catalog")]),
            // Another statement: the server that holds one at a time drops q1's.
            (
                Who::A,
                vec![msg::query("PREPARE q2 AS SELECT 1 AS one; EXECUTE q2")],
            ),
            (Who::B, vec![msg::query("SELECT 'B in between'")]),
            (
                Who::A,
                vec![msg::query(&format!(
                    "SET search_path = {tenant}, public; EXECUTE q1"
                ))],
            ),
            (Who::A, vec![msg::query("EXECUTE q2")]),
            (Who::A, vec![msg::query("RESET search_path; EXECUTE q1")]),
            (Who::A, vec![msg::query("EXECUTE q2")]),
            (
                Who::A,
                vec![msg::query("SET search_path = pg_catalog; EXECUTE q1")],
            ),
        ];
        let direct = same_as_postgres(&steps).await;
        assert!(
            direct.iter().any(|l| l == " 4 A| DataRow [tenant]")
                && direct.iter().any(|l| l == " 6 A| DataRow [public]"),
            "{direct:#?}"
        );
        same_through_evicting(&direct, &steps).await;
        LocalPostgres
            .client(USER, DB)
            .await
            .batch_execute(&format!("DROP SCHEMA {tenant} CASCADE"))
            .await
            .unwrap();
        drop_table(&t).await;
    })
    .await;
}

/// A `DEALLOCATE ALL` pipelined behind a named Parse that the server then refuses (an
/// aborted block) does not bring that name back when it is refused too: the client never
/// had the statement, and parsing the name again succeeds, as in PostgreSQL (differential
/// seed 13752; pgmemo answered 42P05).
#[tokio::test]
async fn a_name_a_refused_parse_gave_stays_unknown() {
    within(TEST_DEADLINE, async {
        let steps = vec![
            (Who::A, vec![msg::query("BEGIN")]),
            (Who::A, vec![msg::query("SELECT 1/0")]),
            (
                Who::A,
                vec![
                    msg::parse("s1", "SELECT 1 AS one", &[]),
                    msg::bind("p1", "s1", &[]),
                    msg::execute("p1", 0),
                    msg::sync(),
                    msg::parse("", "DEALLOCATE ALL", &[]),
                    msg::bind("", "", &[]),
                    msg::execute("", 0),
                    msg::sync(),
                ],
            ),
            (Who::A, vec![msg::query("ROLLBACK")]),
            (Who::B, vec![msg::query("SELECT 'B in between'")]),
            (
                Who::A,
                vec![
                    msg::parse("s1", "SELECT 2 AS two", &[]),
                    msg::bind("", "s1", &[]),
                    msg::execute("", 0),
                    msg::sync(),
                ],
            ),
        ];
        let transcript = same_as_postgres(&steps).await;
        assert!(
            transcript.iter().any(|l| l == " 5 A| DataRow [2]"),
            "{transcript:#?}"
        );
        same_through_evicting(&transcript, &steps).await;
        same_in_session_pooling(&transcript, &steps).await;
    })
    .await;
}

/// A Bind pipelined behind a batch that evicts its statement from the server, where an error
/// earlier in that batch makes the server skip the eviction: pgmemo waits for that answer
/// before it checks the statement's shape on the server, which would prepare it there
/// again (42P05, its own statement already existing; differential seed 13791).
#[tokio::test]
async fn a_bind_behind_a_skipped_eviction_finds_its_statement() {
    within(TEST_DEADLINE, async {
        let steps = vec![
            (
                Who::A,
                vec![
                    msg::parse("s2", "SELECT 1 AS one", &[]),
                    msg::describe(b'S', "s2"),
                    msg::sync(),
                ],
            ),
            (
                Who::A,
                vec![
                    msg::describe(b'P', "no_such_portal"),
                    msg::parse("s1", "SELECT 2 AS two", &[]),
                    msg::sync(),
                    msg::bind("", "s2", &[]),
                    msg::execute("", 0),
                    msg::sync(),
                ],
            ),
            (Who::B, vec![msg::query("SELECT 'B in between'")]),
            (
                Who::A,
                vec![msg::bind("", "s2", &[]), msg::execute("", 0), msg::sync()],
            ),
        ];
        let direct = run_script(LocalPostgres::PORT, &steps).await;
        assert!(
            direct.iter().any(|l| l == " 1 A| DataRow [1]"),
            "{direct:#?}"
        );
        same_through_evicting(&direct, &steps).await;
    })
    .await;
}

/// Executing such an unnamed statement in a later batch than the one that parsed it is
/// refused in transaction pooling (a documented difference: PostgreSQL runs it then), and
/// the session goes on with its names as they were.
#[tokio::test]
async fn a_sql_level_statement_executed_after_its_batch_is_refused() {
    within(TEST_DEADLINE, async {
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 1, |_| {}).await;
        let steps = vec![
            (Who::A, vec![msg::query("PREPARE q1 AS SELECT 1 AS one")]),
            (
                Who::A,
                vec![
                    msg::parse("", "DEALLOCATE q1", &[]),
                    msg::bind("", "", &[]),
                    msg::sync(),
                ],
            ),
            (
                Who::A,
                vec![msg::bind("", "", &[]), msg::execute("", 0), msg::sync()],
            ),
            (Who::A, vec![msg::query("EXECUTE q1")]),
        ];
        let transcript = run_script(pgmemo.port(), &steps).await;
        let refused = transcript.iter().any(|l| {
            l.starts_with(" 2 A| Error ERROR 0A000") && l.contains("batch that parses it")
        });
        assert!(refused, "{transcript:#?}");
        assert!(
            transcript.iter().any(|l| l == " 3 A| DataRow [1]"),
            "{transcript:#?}"
        );
        pgmemo.shutdown().await;
    })
    .await;
}

/// A FunctionCall of `set_config` by OID (2078) changes the client's setting as in
/// PostgreSQL: a Query pipelined right behind it sees the new value, and the value follows
/// the client to its next server (read back from the server, as for a `set_config` in SQL
/// text), `search_path` too, which PostgreSQL does not report. pgmemo once reset the server
/// under the pipelined Query, and forgot unreported settings.
#[tokio::test]
async fn a_function_call_of_set_config_follows_the_client() {
    within(TEST_DEADLINE, async {
        let set_config =
            |name: &str, value: &str| msg::function_call(2078, &[name, value, "false"]);
        let steps = vec![
            (Who::A, vec![msg::query("SET application_name = 'before'")]),
            (
                Who::A,
                vec![
                    set_config("application_name", "called"),
                    msg::query("SHOW application_name"),
                ],
            ),
            (
                Who::A,
                vec![
                    set_config("search_path", "pg_catalog, public"),
                    msg::query("SHOW search_path"),
                ],
            ),
            (
                Who::B,
                vec![msg::query("SHOW application_name; SHOW search_path")],
            ),
            (
                Who::A,
                vec![msg::query("SHOW application_name; SHOW search_path")],
            ),
        ];
        let transcript = same_as_postgres_over(2, &steps).await;
        assert!(
            transcript
                .iter()
                .any(|l| l == " 4 A| DataRow [pg_catalog, public]"),
            "{transcript:#?}"
        );
        same_through_evicting(&transcript, &steps).await;
    })
    .await;
}

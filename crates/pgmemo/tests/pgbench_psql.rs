//! Real PostgreSQL clients through pgmemo: pgbench in all three query modes (simple, extended,
//! prepared) with concurrent clients, and a psql script (multi-statement queries, `\copy` both
//! ways, COPY FROM STDIN, `\gset`, transactions, savepoints, errors with ON_ERROR_STOP off)
//! whose echoed output must match a run directly against PostgreSQL.
//!
//! Each test has its own cluster, so the pgbench tables and the psql objects clash with nothing.

use std::path::Path;
use std::time::Duration;

use pgmemo::Config;
use testkit::{
    assert_pgbench_report, pg_client, pgmemo_config_for, run_ok, spawn_pgmemo, TempPostgres,
};

/// Upper bound for one client program run (pgbench runs 5 s).
const RUN_LIMIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pgbench_runs_cleanly_in_every_query_mode() {
    let pg = TempPostgres::start().await.unwrap();
    let port = pg.port().to_string();
    let mut init = pg_client("pgbench");
    init.args(["-i", "-s", "1", "-q", "-h", "127.0.0.1", "-p", &port])
        .args(["-U", "postgres", "postgres"]);
    run_ok(init, "pgbench -i", RUN_LIMIT).await;

    let pgmemo = spawn_pgmemo(Config {
        pool_size: 10,
        ..pgmemo_config_for(pg.port())
    })
    .await
    .unwrap();
    let pgmemo_port = pgmemo.port().to_string();
    // Totals read through pgmemo are cached before each run; the run's writes (in explicit
    // transactions, in every protocol mode) must invalidate them.
    let through = pgmemo.client("postgres", "postgres").await;
    let direct = pg.client("postgres", "postgres").await;
    let total = "SELECT sum(abalance)::text, count(*)::text FROM pgbench_accounts";
    let value = |rows: Vec<tokio_postgres::SimpleQueryMessage>| {
        rows.into_iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
    };
    for mode in ["simple", "extended", "prepared"] {
        let before = value(through.simple_query(total).await.unwrap());
        assert_eq!(value(through.simple_query(total).await.unwrap()), before);
        let mut bench = pg_client("pgbench");
        bench
            .args(["-M", mode, "-c", "8", "-j", "2", "-T", "5", "-n"])
            .args(["-h", "127.0.0.1", "-p", &pgmemo_port, "-U", "postgres"])
            .arg("postgres");
        let out = run_ok(bench, &format!("pgbench -M {mode}"), RUN_LIMIT).await;
        assert_pgbench_report(&out, mode);
        let after = value(through.simple_query(total).await.unwrap());
        assert_eq!(
            after,
            value(direct.simple_query(total).await.unwrap()),
            "-M {mode}: the cached total was invalidated"
        );
    }

    // The benchmark's writes went through: pgbench_history has one row per transaction.
    let history: u64 = pg
        .psql("SELECT count(*) FROM pgbench_history")
        .await
        .parse()
        .unwrap();
    assert!(history > 0);
    pgmemo.shutdown().await;
}

/// Exercises what psql does beyond plain queries. `DATA` is replaced by the path of a data
/// file for `\copy`. Nothing printed depends on the port, the connection or the backend.
const PSQL_SCRIPT: &str = r#"CREATE TEMP TABLE items (id int PRIMARY KEY, name text, qty int);
INSERT INTO items VALUES (1, 'apple', 3), (2, 'pear', 5), (3, 'plum', 7);
SELECT count(*) AS n, sum(qty) AS total FROM items \gset
\echo items: :n total: :total
SELECT :n AS n_items, :total * 2 AS doubled;
SELECT 'one' AS a \; SELECT 'two' AS b \; UPDATE items SET qty = qty + 1 WHERE id = 1;
SELECT 1 AS x; SELECT 2 AS y;
\copy items TO 'DATA' WITH (FORMAT csv, HEADER)
CREATE TEMP TABLE items_copy (LIKE items);
\copy items_copy FROM 'DATA' WITH (FORMAT csv, HEADER)
COPY items_copy FROM STDIN;
10	kiwi	1
11	lime	2
\.
SELECT * FROM items_copy ORDER BY id;
\copy (SELECT id, upper(name) FROM items ORDER BY id) TO STDOUT
BEGIN;
INSERT INTO items VALUES (4, 'fig', 1);
SELECT * FROM no_such_table;
SELECT 'in a failed transaction';
ROLLBACK;
SELECT count(*) FROM items;
BEGIN;
UPDATE items SET qty = 0 WHERE id = 2;
SAVEPOINT s1;
INSERT INTO items VALUES (1, 'duplicate', 0);
ROLLBACK TO SAVEPOINT s1;
COMMIT;
SELECT id, name, qty FROM items ORDER BY id;
SELECT 1 / 0;
\echo error: :ERROR sqlstate: :SQLSTATE message: :LAST_ERROR_MESSAGE
DO $$ BEGIN RAISE NOTICE 'hello from %', 'plpgsql'; END $$;
PREPARE by_id(int) AS SELECT name FROM items WHERE id = $1;
EXECUTE by_id(3);
SET application_name = 'psql script';
SHOW application_name;
SELECT format('SELECT %s AS generated', i) FROM generate_series(1, 2) AS i \gexec
SELECT 'done' AS status;
"#;

/// Runs the script with `psql -X -a` against 127.0.0.1:`port`; returns (stdout, stderr).
async fn run_psql(port: u16, script: &Path) -> (String, String) {
    let mut psql = pg_client("psql");
    psql.args(["-X", "-a", "-v", "ON_ERROR_STOP=0", "-h", "127.0.0.1"])
        .args([
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-f",
        ])
        .arg(script);
    let out = run_ok(psql, "psql", RUN_LIMIT).await;
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_script_output_matches_a_direct_connection() {
    let pg = TempPostgres::start().await.unwrap();
    let pgmemo = spawn_pgmemo(Config {
        pool_size: 2,
        ..pgmemo_config_for(pg.port())
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("items.csv");
    let script = dir.path().join("script.sql");
    std::fs::write(
        &script,
        PSQL_SCRIPT.replace("DATA", &data.to_string_lossy()),
    )
    .unwrap();

    let (direct_out, direct_err) = run_psql(pg.port(), &script).await;
    let direct_csv = std::fs::read_to_string(&data).unwrap();
    std::fs::remove_file(&data).unwrap();
    let (proxied_out, proxied_err) = run_psql(pgmemo.port(), &script).await;
    let proxied_csv = std::fs::read_to_string(&data).unwrap();
    // Again through pgmemo, now on the pooled server connection of the first run: the reset
    // must have dropped its temp tables and prepared statement, or this run shows errors.
    let (again_out, again_err) = run_psql(pgmemo.port(), &script).await;

    // Sanity: the script did what it is meant to, so equal outputs mean something.
    for expected in [
        "items: 3 total: 15",
        " n_items | doubled",
        "COPY 2",
        "1\tAPPLE",
        "error: true sqlstate: 22012 message: division by zero",
        " generated",
        " done",
    ] {
        assert!(
            direct_out.contains(expected),
            "{expected:?} missing:\n{direct_out}"
        );
    }
    for expected in [
        "ERROR:  relation \"no_such_table\" does not exist",
        "ERROR:  current transaction is aborted",
        "ERROR:  duplicate key value violates unique constraint",
        "NOTICE:  hello from plpgsql",
    ] {
        assert!(
            direct_err.contains(expected),
            "{expected:?} missing:\n{direct_err}"
        );
    }
    assert!(direct_csv.starts_with("id,name,qty\n"), "{direct_csv}");

    assert_eq!(
        proxied_out, direct_out,
        "psql stdout differs through pgmemo"
    );
    assert_eq!(
        proxied_err, direct_err,
        "psql stderr differs through pgmemo"
    );
    assert_eq!(
        proxied_csv, direct_csv,
        "\\copy output differs through pgmemo"
    );
    assert_eq!(
        again_out, direct_out,
        "second psql run differs through pgmemo"
    );
    assert_eq!(
        again_err, direct_err,
        "second psql run differs through pgmemo"
    );
    pgmemo.shutdown().await;
}

//! sqlx through transaction pooling. sqlx names its prepared statements `sqlx_s_1`,
//! `sqlx_s_2`, ... on every connection, prepares each once per connection (Parse, Describe,
//! Sync), from then on only binds and executes it, decoding the rows with the description it
//! kept, and closes the statements its per-connection cache evicts: the pattern behind
//! PgBouncer users' `prepared statement "sqlx_s_2" already exists`. Each scenario runs against
//! PostgreSQL itself first, and must tell the same through pgmemo.

mod txn_support;

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{AssertSqlSafe, Connection, Executor, Row};
use testkit::{within, LocalPostgres};
use txn_support::{create_table, drop_table, txn_pgmemo, DB, USER};

/// Concurrent sqlx connections in [`statements_of_many_connections`].
const CONNECTIONS: usize = 12;

/// A sqlx connection to 127.0.0.1:`port` whose statement cache keeps `statements` statements.
async fn connect(port: u16, statements: usize) -> PgConnection {
    let options = PgConnectOptions::new()
        .host("127.0.0.1")
        .port(port)
        .username(USER)
        .database(DB)
        .statement_cache_capacity(statements);
    PgConnection::connect_with(&options)
        .await
        .unwrap_or_else(|e| panic!("sqlx connects to port {port}: {e}"))
}

/// The SQLSTATE of a sqlx error, or its text when it is not a database error.
fn code(e: &sqlx::Error) -> String {
    match e.as_database_error().and_then(|d| d.code()) {
        Some(code) => code.into_owned(),
        None => e.to_string(),
    }
}

/// Connection `i`'s share of [`statements_of_many_connections`]: four statements in an order
/// of its own (so each `sqlx_s_N` stands for another text on the next connection), five rounds,
/// a transaction that fails and rolls back in the third. Odd connections keep two statements
/// in sqlx's cache, so sqlx closes and prepares again under new names as they go.
async fn one_connection(port: u16, t: String, i: usize) -> Vec<String> {
    let mut c = connect(port, if i.is_multiple_of(2) { 100 } else { 2 }).await;
    // A simple Query: sqlx sends a text without arguments as one.
    c.execute(AssertSqlSafe(format!("SET application_name = 'sqlx{i}'")))
        .await
        .unwrap();
    let texts = [
        "SELECT $1::int4 * 2".to_owned(),
        format!("SELECT v FROM {t} WHERE id = $1"),
        "SELECT current_setting('application_name')".to_owned(),
        format!("SELECT count(*)::int4 FROM {t} WHERE id <= $1"),
    ];
    let mut lines = Vec::new();
    for round in 0..5i32 {
        for j in 0..texts.len() {
            let which = (i + j) % texts.len();
            let q = sqlx::query(AssertSqlSafe(texts[which].clone()));
            let line = match which {
                0 => {
                    let row = q.bind(i as i32 * 10 + round).fetch_one(&mut c).await;
                    format!(
                        "{:?}",
                        row.map(|r| r.get::<i32, _>(0)).map_err(|e| code(&e))
                    )
                }
                1 | 3 => {
                    let row = q.bind(round % 3 + 1).fetch_optional(&mut c).await;
                    let value = |r: sqlx::postgres::PgRow| {
                        if which == 1 {
                            r.get::<String, _>(0)
                        } else {
                            r.get::<i32, _>(0).to_string()
                        }
                    };
                    format!("{:?}", row.map(|r| r.map(value)).map_err(|e| code(&e)))
                }
                _ => {
                    let row = q.fetch_one(&mut c).await;
                    format!(
                        "{:?}",
                        row.map(|r| r.get::<String, _>(0)).map_err(|e| code(&e))
                    )
                }
            };
            lines.push(format!("c{i} r{round} t{which}: {line}"));
        }
        if round == 2 {
            let mut tx = c.begin().await.unwrap();
            let insert = format!("INSERT INTO {t} VALUES ($1, 'new')");
            sqlx::query(AssertSqlSafe(insert))
                .bind(100 + i as i32)
                .execute(&mut *tx)
                .await
                .unwrap();
            let failed = sqlx::query("SELECT 1 / ($1::int4 - $1::int4)")
                .bind(1)
                .fetch_one(&mut *tx)
                .await
                .map(|_| ())
                .map_err(|e| code(&e));
            tx.rollback().await.unwrap();
            lines.push(format!("c{i} r{round} failed in a transaction: {failed:?}"));
        }
    }
    c.close().await.unwrap();
    lines
}

/// [`CONNECTIONS`] connections at once, each running [`one_connection`]; the transcript in
/// connection order.
async fn statements_of_many_connections(port: u16, t: &str) -> Vec<String> {
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|i| tokio::spawn(one_connection(port, t.to_owned(), i)))
        .collect();
    let mut transcript = Vec::new();
    for task in tasks {
        transcript.extend(task.await.unwrap());
    }
    let mut c = connect(port, 100).await;
    let left: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {t} WHERE id >= 100"
    )))
    .fetch_one(&mut c)
    .await
    .unwrap();
    transcript.push(format!("rows the failed transactions left: {left}"));
    transcript
}

/// Twelve sqlx connections over two server connections, each naming other texts
/// `sqlx_s_1`..`sqlx_s_4`, some closing and preparing statements again as sqlx's cache
/// evicts them, with a setting per connection and transactions that fail and roll back:
/// every answer as from PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_statements_of_many_connections_over_two_servers() {
    within(Duration::from_secs(300), async {
        let setup =
            |t: &str| format!("INSERT INTO {t} VALUES (1, 'one'), (2, 'two'), (3, 'three')");
        let t = create_table("txn_sqlx_direct", "(id int PRIMARY KEY, v text)").await;
        let direct = LocalPostgres.client(USER, DB).await;
        direct.batch_execute(&setup(&t)).await.unwrap();
        let expected = statements_of_many_connections(LocalPostgres::PORT, &t).await;
        drop_table(&t).await;
        assert!(
            expected.contains(&"c0 r0 t2: Ok(\"sqlx0\")".to_owned()),
            "{expected:#?}"
        );

        let t = create_table("txn_sqlx", "(id int PRIMARY KEY, v text)").await;
        direct.batch_execute(&setup(&t)).await.unwrap();
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |_| {}).await;
        let proxied = statements_of_many_connections(pgmemo.port(), &t).await;
        pgmemo.shutdown().await;
        drop_table(&t).await;
        let expected = expected.join("\n").replace("txn_sqlx_direct", "txn_sqlx");
        assert_eq!(proxied.join("\n"), expected);
    })
    .await
}

/// How many columns each row of `star` (run with the parameter 1) has, or the error's code.
async fn columns(c: &mut PgConnection, star: &str) -> String {
    let rows = sqlx::query(AssertSqlSafe(star.to_owned()))
        .bind(1)
        .fetch_all(c)
        .await;
    format!(
        "{:?}",
        rows.map(|rows| rows.iter().map(|r| r.columns().len()).collect::<Vec<_>>())
            .map_err(|e| code(&e))
    )
}

/// What one sqlx connection sees of `SELECT *` (prepared and described once) when a
/// migration adds a column between executions, run through 127.0.0.1:`port`: PostgreSQL
/// fails every later execution with `cached plan must not change result type` (sqlx does not
/// prepare again), while a new connection sees the new column. `busy` other connections keep
/// the proxy's servers in use, so the statement's next execution may go to another server.
async fn a_migration_between_executions(port: u16, t: &str, busy: usize) -> Vec<String> {
    let mut c = connect(port, 100).await;
    let star = format!("SELECT * FROM {t} WHERE id = $1");
    let mut lines = vec![format!("before: {}", columns(&mut c, &star).await)];
    let mut migration = connect(port, 100).await;
    migration
        .execute(AssertSqlSafe(format!(
            "ALTER TABLE {t} ADD COLUMN extra int DEFAULT 7"
        )))
        .await
        .unwrap();
    let mut others = Vec::new();
    for _ in 0..busy {
        let mut o = connect(port, 100).await;
        let q = format!("SELECT count(*) FROM {t}");
        sqlx::query(AssertSqlSafe(q))
            .fetch_one(&mut o)
            .await
            .unwrap();
        others.push(o);
    }
    for n in 1..=3 {
        lines.push(format!("after {n}: {}", columns(&mut c, &star).await));
    }
    let mut fresh = connect(port, 100).await;
    lines.push(format!(
        "a new connection: {}",
        columns(&mut fresh, &star).await
    ));
    lines
}

/// sqlx keeps a statement's description: after a migration adds a column, its executions
/// fail as they do against PostgreSQL (which refuses to change a prepared statement's result
/// type), never decode rows of the new shape with the old description, wherever pgmemo runs
/// them; a new connection sees the new column. Cache on: a result of the new shape is not
/// served to the connection that knows the old one either.
#[tokio::test]
async fn sqlx_sees_a_column_added_between_executions_as_with_postgres() {
    within(Duration::from_secs(300), async {
        let setup = |t: &str| format!("INSERT INTO {t} VALUES (1, 'one')");
        let direct = LocalPostgres.client(USER, DB).await;
        let t = create_table("txn_sqlx_alter_direct", "(id int PRIMARY KEY, v text)").await;
        direct.batch_execute(&setup(&t)).await.unwrap();
        let expected = a_migration_between_executions(LocalPostgres::PORT, &t, 0).await;
        drop_table(&t).await;
        assert_eq!(expected[0], "before: Ok([2])");
        assert_eq!(expected[4], "a new connection: Ok([3])");

        let pgmemo = txn_pgmemo(LocalPostgres::PORT, 2, |_| {}).await;
        for busy in [0, 1, 3] {
            let t = create_table("txn_sqlx_alter", "(id int PRIMARY KEY, v text)").await;
            direct.batch_execute(&setup(&t)).await.unwrap();
            let proxied = a_migration_between_executions(pgmemo.port(), &t, busy).await;
            drop_table(&t).await;
            assert_eq!(proxied, expected, "{busy} other connections");
        }
        pgmemo.shutdown().await;
    })
    .await
}

//! Promotion of unnamed statements under transaction pooling (`max_promoted_statements`): a
//! text a client sends again as the unnamed extended-protocol statement is bound from a
//! statement pgmemo prepared on the server, and the client cannot tell: the answers match
//! PostgreSQL's message for message, also after DDL changed the statement's result, when a
//! Bind fails, when another batch is pipelined behind a failing one, when parsing raises a
//! notice and when another client reads literals under other settings.

mod txn_support;

use std::sync::atomic::Ordering;

use pgmemo::config::Switch;
use testkit::{unique, LocalPostgres};
use txn_support::{msg, run_script, side_by_side, txn_pgmemo, Raw, Who, DB, USER};

/// `sql` as the unnamed statement, bound to `params`, its portal described and executed.
fn unnamed(sql: &str, params: &[Option<&str>]) -> Vec<Vec<u8>> {
    vec![
        msg::parse("", sql, &[]),
        msg::bind("", "", params),
        msg::describe(b'P', ""),
        msg::execute("", 0),
        msg::sync(),
    ]
}

/// pgmemo over the local server's one connection (so clients A and B share it, and so do
/// the parts of a script), cache off, promoting up to 10 texts.
async fn promoting_pgmemo() -> testkit::PgmemoInstance {
    txn_pgmemo(LocalPostgres::PORT, 1, |c| {
        c.cache = Switch::Off;
        c.max_promoted_statements = 10;
    })
    .await
}

/// How many statements pgmemo promoted on its one server connection.
async fn promoted_on_server(port: u16) -> i64 {
    let client = testkit::connect(&testkit::url("127.0.0.1", port, USER, DB))
        .await
        .unwrap();
    let rows = client
        .simple_query("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'pgmemo_u%'")
        .await
        .unwrap();
    rows.iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0)?.parse().ok(),
            _ => None,
        })
        .expect("a count")
}

#[tokio::test]
async fn promoted_statements_answer_as_postgres_does() {
    use Who::{A, B};
    let t = unique("promoted");
    let select = format!("SELECT * FROM {t} WHERE id = $1");
    let warm: Vec<(Who, Vec<Vec<u8>>)> = vec![
        (
            A,
            vec![msg::query(&format!(
                "CREATE TABLE {t} (id int, v text); INSERT INTO {t} VALUES (1, 'one'), (2, 'two')"
            ))],
        ),
        (A, unnamed(&select, &[Some("1")])),
        (A, unnamed(&select, &[Some("2")])),
        (A, unnamed(&select, &[Some("1")])),
    ];
    let date = "SELECT '03/04/2020'::date AS d";
    let mut pipelined = unnamed(&select, &[Some("abc")]);
    pipelined.extend(unnamed(&select, &[Some("2")]));
    let mut stale_then_more = unnamed(&select, &[Some("1")]);
    stale_then_more.extend(unnamed(&select, &[Some("2")]));
    let changes: Vec<(Who, Vec<Vec<u8>>)> = vec![
        // The promoted statement's result changes: binding it fails, the batch is sent
        // again as the client sent it.
        (
            A,
            vec![msg::query(&format!(
                "ALTER TABLE {t} ADD COLUMN w int DEFAULT 7"
            ))],
        ),
        (A, unnamed(&select, &[Some("1")])),
        (A, unnamed(&select, &[Some("2")])),
        (A, unnamed(&select, &[Some("2")])),
        // A parameter the statement cannot take: ParseComplete, then the Bind's error.
        (A, unnamed(&select, &[Some("abc")])),
        (A, unnamed(&select, &[Some("1")])),
        (A, unnamed(&select, &[Some("1")])),
        // The batch behind a failing one waits for its replay.
        (A, pipelined),
        (A, unnamed(&select, &[Some("1")])),
        (A, unnamed(&select, &[Some("1")])),
        (
            A,
            vec![msg::query(&format!("ALTER TABLE {t} DROP COLUMN v"))],
        ),
        (A, stale_then_more),
        // Literals read under other settings are another statement.
        (A, unnamed(date, &[])),
        (A, unnamed(date, &[])),
        (B, vec![msg::query("SET DateStyle = 'ISO, DMY'")]),
        (B, unnamed(date, &[])),
        (B, unnamed(date, &[])),
        (A, unnamed(date, &[])),
        // A Bind of the unnamed statement without a Parse runs the client's own text.
        (
            A,
            vec![msg::bind("", "", &[]), msg::execute("", 0), msg::sync()],
        ),
        (A, vec![msg::query(&format!("DROP TABLE {t}"))]),
    ];
    let direct = [
        run_script(LocalPostgres::PORT, &warm).await,
        run_script(LocalPostgres::PORT, &changes).await,
    ];
    let pgmemo = promoting_pgmemo().await;
    let warmed = run_script(pgmemo.port(), &warm).await;
    assert!(
        direct[0] == warmed,
        "answers differ:\n{}",
        side_by_side(&direct[0], &warmed)
    );
    assert_eq!(
        promoted_on_server(pgmemo.port()).await,
        1,
        "the text sent twice was prepared"
    );
    let stats = pgmemo.stats();
    assert_eq!(stats.promoted_prepares.load(Ordering::Relaxed), 1);
    assert_eq!(stats.promoted_uses.load(Ordering::Relaxed), 1);
    let changed = run_script(pgmemo.port(), &changes).await;
    assert!(
        direct[1] == changed,
        "answers differ:\n{}",
        side_by_side(&direct[1], &changed)
    );
    assert!(
        changed.iter().any(|l| l.contains("DataRow [2020-03-04]"))
            && changed.iter().any(|l| l.contains("DataRow [2020-04-03]")),
        "each client reads the literal its own way: {changed:#?}"
    );
    pgmemo.shutdown().await;
}

/// Notices and ParameterStatus left out by `Raw::exchange` are counted here: a notice raised
/// while parsing (an identifier truncated) comes with every execution, as from PostgreSQL.
#[tokio::test]
async fn a_text_whose_parsing_raises_a_notice_raises_it_every_time() {
    let long = "a".repeat(70);
    let sql = format!("SELECT 1 AS {long}");
    let notices = |port: u16| {
        let sql = sql.clone();
        async move {
            let mut client = Raw::login(port).await;
            let mut seen = Vec::new();
            for _ in 0..4 {
                client.send(&unnamed(&sql, &[])).await;
                let mut messages = Vec::new();
                loop {
                    let (tag, _) = client.recv().await;
                    messages.push(tag as char);
                    if tag == b'Z' {
                        break;
                    }
                }
                seen.push(messages.into_iter().collect::<String>());
            }
            seen
        }
    };
    let direct = notices(LocalPostgres::PORT).await;
    assert!(direct.iter().all(|m| m.starts_with("N1")), "{direct:?}");
    let pgmemo = promoting_pgmemo().await;
    assert_eq!(notices(pgmemo.port()).await, direct);
    pgmemo.shutdown().await;
}

/// Two clients sharing the server's promoted statement, their own unnamed statements (closed,
/// dropped by a Query, bound without a Parse) and pipelines of promoted batches.
#[tokio::test]
async fn clients_sharing_promoted_statements_keep_their_own_unnamed_statements() {
    use Who::{A, B};
    let t = unique("promoted_shared");
    let select = format!("SELECT v FROM {t} WHERE id = $1");
    let other = format!("SELECT id FROM {t} WHERE v = $1");
    let run = |who: Who, param: &str| (who, unnamed(&select, &[Some(param)]));
    let bind_only = |param: &str| {
        vec![
            msg::bind("", "", &[Some(param)]),
            msg::execute("", 0),
            msg::sync(),
        ]
    };
    let mut three = unnamed(&select, &[Some("1")]);
    three.extend(unnamed(&other, &[Some("two")]));
    three.extend(unnamed(&select, &[Some("2")]));
    let steps: Vec<(Who, Vec<Vec<u8>>)> = vec![
        (
            A,
            vec![msg::query(&format!(
                "CREATE TABLE {t} (id int, v text); INSERT INTO {t} VALUES (1, 'one'), (2, 'two')"
            ))],
        ),
        run(A, "1"),
        run(B, "2"),
        run(A, "2"),
        run(B, "1"),
        (B, bind_only("2")),
        (A, unnamed(&other, &[Some("one")])),
        (B, bind_only("1")),
        (A, bind_only("two")),
        (A, three.clone()),
        (B, three),
        (A, vec![msg::close(b'S', ""), msg::sync()]),
        (A, bind_only("1")),
        run(A, "1"),
        (A, vec![msg::query("SELECT 1")]),
        (A, bind_only("1")),
        (B, bind_only("2")),
        (A, vec![msg::query(&format!("DROP TABLE {t}"))]),
        run(B, "1"),
    ];
    let direct = run_script(LocalPostgres::PORT, &steps).await;
    let pgmemo = promoting_pgmemo().await;
    let proxied = run_script(pgmemo.port(), &steps).await;
    assert!(
        direct == proxied,
        "answers differ:\n{}",
        side_by_side(&direct, &proxied)
    );
    assert_eq!(
        promoted_on_server(pgmemo.port()).await,
        1,
        "the second text was prepared, the first closed when its table was dropped"
    );
    pgmemo.shutdown().await;
}

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

/// A Bind of the unnamed statement without a Parse, to `param`, executed.
fn bind_only(param: &str) -> Vec<Vec<u8>> {
    vec![
        msg::bind("", "", &[Some(param)]),
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

/// The client's unnamed statement is the one it parsed last, as analysed then: bound or
/// described again without a Parse after DDL changed its rows, it fails as PostgreSQL's does,
/// also when pgmemo bound a promoted statement in its place (which it then binds again,
/// rather than parsing the text anew).
#[tokio::test]
async fn a_promoted_unnamed_statement_bound_again_after_ddl_fails_as_in_postgres() {
    use Who::{A, B};
    let t = unique("promoted_rebind");
    let select = format!("SELECT * FROM {t} WHERE id = $1");
    let steps: Vec<(Who, Vec<Vec<u8>>)> = vec![
        (
            A,
            vec![msg::query(&format!(
                "CREATE TABLE {t} (id int, v text); INSERT INTO {t} VALUES (1, 'one')"
            ))],
        ),
        (A, unnamed(&select, &[Some("1")])),
        (A, unnamed(&select, &[Some("1")])),
        (A, bind_only("1")),
        // A Bind whose parameter count does not fit: PostgreSQL's error names the client's
        // statement, "" (damaged-message fuzz seed 823 with promotion on: 65280 read as -256).
        (
            A,
            vec![
                msg::frame(b'B', b"\0\0\0\0\xff\x00\0\0"),
                msg::execute("", 0),
                msg::sync(),
            ],
        ),
        (A, unnamed(&select, &[Some("1")])),
        (A, unnamed(&select, &[Some("1")])),
        (B, unnamed(&select, &[Some("1")])),
        (
            B,
            vec![msg::query(&format!("ALTER TABLE {t} ADD COLUMN w int"))],
        ),
        (A, bind_only("1")),
        (A, vec![msg::describe(b'S', ""), msg::sync()]),
        (A, unnamed(&select, &[Some("1")])),
        (A, bind_only("1")),
        (A, vec![msg::query(&format!("DROP TABLE {t}"))]),
    ];
    let direct = run_script(LocalPostgres::PORT, &steps).await;
    assert!(
        direct
            .iter()
            .any(|l| l.contains("must not change result type")),
        "{direct:#?}"
    );
    let pgmemo = promoting_pgmemo().await;
    let proxied = run_script(pgmemo.port(), &steps).await;
    assert!(
        direct == proxied,
        "answers differ:\n{}",
        side_by_side(&direct, &proxied)
    );
    assert!(pgmemo.stats().promoted_uses.load(Ordering::Relaxed) >= 2);
    pgmemo.shutdown().await;
}

/// A small random generator (xorshift), so that a failing script is found again from its
/// seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// A random conversation of two clients on table `t`, made of what promotion has to get
/// right: texts sent again as the unnamed statement (so promoted, evicted and prepared again
/// with two texts per server), DDL that changes their result or breaks them, parameters they
/// reject, pipelines, a notice while parsing, transaction blocks, settings that change how
/// literals read, Binds without a Parse and Queries that drop the unnamed statement.
fn conversation(seed: u64, t: &str) -> Vec<(Who, Vec<Vec<u8>>)> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let by_id = format!("SELECT * FROM {t} WHERE id = $1 ORDER BY v");
    let texts = [
        by_id.clone(),
        format!("SELECT count(*) AS n FROM {t} WHERE id < $1"),
        format!("UPDATE {t} SET v = v || 'x' WHERE id = $1"),
        format!("SELECT $1::int AS {}", "a".repeat(70)),
        "SELECT '03/04/2020'::date + $1::int AS d".to_owned(),
    ];
    let mut steps = vec![(
        Who::A,
        vec![msg::query(&format!(
            "CREATE TABLE {t} (id int, v text); \
             INSERT INTO {t} SELECT g, 'v' || g FROM generate_series(1, 4) g"
        ))],
    )];
    let mut columns = 0;
    let mut in_block = [false, false];
    // DDL came after the client's last Parse: a Bind without a Parse would then differ for a
    // reason promotion has nothing to do with (a client's unnamed statement that another
    // client's Parse displaced from the server is parsed there again, after the DDL).
    let mut altered_since_parse = [false, false];
    for _ in 0..40 {
        // One server: while a client is inside a block, the other would wait for it.
        let who = match in_block {
            [true, _] => Who::A,
            [_, true] => Who::B,
            _ if rng.below(3) == 0 => Who::B,
            _ => Who::A,
        };
        let i = who as usize;
        let param = ["1", "2", "3", "abc", "9"][rng.below(5)];
        let text = &texts[rng.below(texts.len())];
        let mut kind = rng.below(12);
        if kind == 6 && altered_since_parse[i] {
            kind = 0;
        }
        if matches!(kind, 0..=5 | 11) {
            altered_since_parse[i] = false;
        }
        if matches!(kind, 7 | 8) {
            altered_since_parse = [true, true];
        }
        let step = match kind {
            0..=4 => unnamed(text, &[Some(param)]),
            5 => {
                let mut two = unnamed(text, &[Some(param)]);
                two.extend(unnamed(&texts[rng.below(texts.len())], &[Some("2")]));
                two
            }
            6 => bind_only(param),
            7 if !in_block[0] && !in_block[1] => {
                columns += 1;
                vec![msg::query(&format!(
                    "ALTER TABLE {t} ADD COLUMN c{columns} int DEFAULT {columns}"
                ))]
            }
            8 if columns > 0 && !in_block[0] && !in_block[1] => {
                let sql = format!("ALTER TABLE {t} DROP COLUMN c{columns}");
                columns -= 1;
                vec![msg::query(&sql)]
            }
            9 => {
                in_block[i] = !in_block[i];
                vec![msg::query(if in_block[i] { "BEGIN" } else { "COMMIT" })]
            }
            10 => vec![msg::query(
                [
                    "SET DateStyle = 'ISO, DMY'",
                    "SET DateStyle = 'ISO, MDY'",
                    "SELECT 1",
                ][rng.below(3)],
            )],
            _ => unnamed(&by_id, &[Some("1")]),
        };
        steps.push((who, step));
    }
    for (i, who) in [Who::A, Who::B].into_iter().enumerate() {
        if in_block[i] {
            steps.push((who, vec![msg::query("ROLLBACK")]));
        }
    }
    steps.push((Who::A, vec![msg::query(&format!("DROP TABLE {t}"))]));
    steps
}

/// Random conversations (`PGMEMO_PROMOTE_SEEDS=n` runs more, `PGMEMO_PROMOTE_SEED=s` one,
/// `PGMEMO_PROMOTE_PRINT=1` prints them) through pgmemo promoting two texts per server get
/// PostgreSQL's answers.
#[tokio::test]
async fn random_conversations_with_promoted_statements_answer_as_postgres_does() {
    let seeds: Vec<u64> = match std::env::var("PGMEMO_PROMOTE_SEED") {
        Ok(s) => vec![s.parse().expect("a seed")],
        Err(_) => {
            let n = std::env::var("PGMEMO_PROMOTE_SEEDS")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(12);
            (1..=n).collect()
        }
    };
    // `PGMEMO_PROMOTE_SERVERS=2`: the clients' requests may go to either of two servers.
    let servers = std::env::var("PGMEMO_PROMOTE_SERVERS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let t = unique("promoted_random");
    let mut promoted = 0;
    for seed in seeds {
        let steps = conversation(seed, &t);
        if std::env::var_os("PGMEMO_PROMOTE_PRINT").is_some() {
            for (n, (who, messages)) in steps.iter().enumerate() {
                let parts: Vec<String> = messages
                    .iter()
                    .map(|m| {
                        let body = String::from_utf8_lossy(&m[5..]).replace('\0', "|");
                        format!(
                            "{}:{}",
                            m[0] as char,
                            body.chars().take(50).collect::<String>()
                        )
                    })
                    .collect();
                eprintln!("{n:>2} {who:?} {}", parts.join("  "));
            }
        }
        let direct = run_script(LocalPostgres::PORT, &steps).await;
        let pgmemo = txn_pgmemo(LocalPostgres::PORT, servers, |c| {
            c.cache = Switch::Off;
            c.max_promoted_statements = 2;
        })
        .await;
        let proxied = run_script(pgmemo.port(), &steps).await;
        assert!(
            direct == proxied,
            "seed {seed}: answers differ:\n{}",
            side_by_side(&direct, &proxied)
        );
        promoted += pgmemo.stats().promoted_uses.load(Ordering::Relaxed);
        pgmemo.shutdown().await;
    }
    assert!(promoted > 0, "no conversation bound a promoted statement");
}

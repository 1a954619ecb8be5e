//! The PostgreSQL protocol through pgmemo, as a real client library (tokio-postgres) uses it:
//! simple and extended queries, pipelining, result formats, COPY, LISTEN/NOTIFY, notices,
//! cancel, errors inside a pipeline, transactions, ParameterStatus, prepared statements and
//! large values. Every test runs its own pgmemo in front of the local PostgreSQL on 5432 and
//! uses its own uniquely named objects, so the tests run in parallel with everything else.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use testkit::{
    assert_eventually, eventually_some, pg_sleep_running, pgmemo_config_for, rows, spawn_pgmemo,
    sqlstate, unique, within, LocalPostgres, PgmemoInstance,
};
use tokio::sync::mpsc;
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::{
    AsyncMessage, Client, Connection, CopyInSink, NoTls, SimpleQueryMessage, Socket,
};

const USER: &str = "postgres";
const DB: &str = "test";
/// Upper bound for any single test; a hang fails instead of blocking the suite.
const TEST_DEADLINE: Duration = Duration::from_secs(120);

async fn pgmemo() -> PgmemoInstance {
    spawn_pgmemo(pgmemo_config_for(LocalPostgres::PORT))
        .await
        .expect("pgmemo starts")
}

/// [`pgmemo`] and one client through it, how most tests here begin.
async fn pgmemo_and_client() -> (PgmemoInstance, Client) {
    let pg = pgmemo().await;
    let client = pg.client(USER, DB).await;
    (pg, client)
}

/// `SELECT count(*)` of table `t`.
async fn count(client: &Client, t: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM {t}");
    client.query_one(&sql, &[]).await.unwrap().get(0)
}

/// `COPY t FROM STDIN` started on `client`. Dropping the sink unfinished sends CopyFail.
async fn copy_in(client: &Client, t: &str) -> Pin<Box<CopyInSink<Bytes>>> {
    let sink = client.copy_in(&format!("COPY {t} FROM STDIN")).await;
    Box::pin(sink.unwrap())
}

type PgConnection = Connection<Socket, NoTlsStream>;

/// A client through pgmemo whose connection the test drives itself (for `poll_message` and
/// `parameter`).
async fn raw_client(pg: &PgmemoInstance) -> (Client, PgConnection) {
    tokio_postgres::connect(&pg.url(USER, DB), NoTls)
        .await
        .expect("connect through pgmemo")
}

/// A client through pgmemo whose asynchronous messages (notices, notifications) arrive on the
/// returned channel.
async fn client_with_messages(
    pg: &PgmemoInstance,
) -> (Client, mpsc::UnboundedReceiver<AsyncMessage>) {
    let (client, mut connection) = raw_client(pg).await;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if tx.send(m).is_err() {
                break;
            }
        }
    });
    (client, rx)
}

/// Runs `fut` while driving `conn` in the same task, so the test can inspect the connection
/// (e.g. its ParameterStatus values) afterwards. Asynchronous messages are dropped.
async fn drive<T>(conn: &mut PgConnection, fut: impl Future<Output = T>) -> T {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(v);
        }
        loop {
            match conn.poll_message(cx) {
                Poll::Ready(Some(Ok(_))) => continue,
                Poll::Ready(Some(Err(e))) => panic!("connection failed: {e}"),
                Poll::Ready(None) => panic!("connection closed"),
                Poll::Pending => break,
            }
        }
        fut.as_mut().poll(cx)
    })
    .await
}

fn command_counts(messages: &[SimpleQueryMessage]) -> Vec<u64> {
    messages
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::CommandComplete(n) => Some(*n),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn simple_query_single_and_multi_statement() {
    within(TEST_DEADLINE, async {
        let (_pg, client) = pgmemo_and_client().await;
        let t = unique("pm_simple");

        let one = client
            .simple_query("SELECT 1 AS a, 'x' AS b")
            .await
            .unwrap();
        assert_eq!(rows(&one), vec![vec![Some("1".into()), Some("x".into())]]);
        assert_eq!(command_counts(&one), vec![1]);

        let sql = format!(
            "CREATE TEMP TABLE {t} (id int, v text); \
             INSERT INTO {t} VALUES (1, 'a'), (2, NULL), (3, 'c'); \
             UPDATE {t} SET v = 'b' WHERE id = 2; \
             SELECT id, v FROM {t} ORDER BY id; \
             SELECT count(*) FROM {t}"
        );
        let many = client.simple_query(&sql).await.unwrap();
        // CREATE, INSERT 3, UPDATE 1, SELECT 3, SELECT 1
        assert_eq!(command_counts(&many), vec![0, 3, 1, 3, 1]);
        assert_eq!(
            rows(&many),
            vec![
                vec![Some("1".into()), Some("a".into())],
                vec![Some("2".into()), Some("b".into())],
                vec![Some("3".into()), Some("c".into())],
                vec![Some("3".into())],
            ]
        );

        // An error in the middle of a multi-statement query aborts the rest (implicit
        // transaction), and the session goes on.
        let err = client
            .simple_query(&format!(
                "INSERT INTO {t} VALUES (4, 'd'); SELECT 1/0; INSERT INTO {t} VALUES (5, 'e')"
            ))
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&err), Some("22012"));
        let count = client
            .simple_query(&format!("SELECT count(*) FROM {t}"))
            .await
            .unwrap();
        assert_eq!(rows(&count), vec![vec![Some("3".into())]]);

        // An empty query is answered too.
        let empty = client.simple_query("").await.unwrap();
        assert!(rows(&empty).is_empty());
        client
            .simple_query(&format!("DROP TABLE {t}"))
            .await
            .unwrap();
    })
    .await
}

#[tokio::test]
async fn extended_query_with_parameters() {
    within(TEST_DEADLINE, async {
        let (_pg, client) = pgmemo_and_client().await;

        let row = client
            .query_one(
                "SELECT $1::int8 + 1, $2::text || '!', $3::float8 * 2, $4::bytea, $5::int4[], \
                 $6::text IS NULL",
                &[
                    &41i64,
                    &"héllo",
                    &1.25f64,
                    &vec![0u8, 1, 255],
                    &vec![1i32, 2, 3],
                    &None::<String>,
                ],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(0), 42);
        assert_eq!(row.get::<_, String>(1), "héllo!");
        assert_eq!(row.get::<_, f64>(2), 2.5);
        assert_eq!(row.get::<_, Vec<u8>>(3), vec![0u8, 1, 255]);
        assert_eq!(row.get::<_, Vec<i32>>(4), vec![1, 2, 3]);
        assert!(row.get::<_, bool>(5));

        let many = client
            .query(
                "SELECT g, g * $1::int4 FROM generate_series(1, $2::int4) g ORDER BY g",
                &[&3i32, &1000i32],
            )
            .await
            .unwrap();
        assert_eq!(many.len(), 1000);
        for (i, r) in many.iter().enumerate() {
            let g = i as i32 + 1;
            assert_eq!(r.get::<_, i32>(0), g);
            assert_eq!(r.get::<_, i32>(1), g * 3);
        }

        let affected = client
            .execute("SELECT 1 FROM generate_series(1, $1::int4)", &[&7i32])
            .await
            .unwrap();
        assert_eq!(affected, 7);
    })
    .await
}

#[tokio::test]
async fn pipelined_queries_return_in_order() {
    within(TEST_DEADLINE, async {
        let (_pg, client) = pgmemo_and_client().await;
        let stmt = client
            .prepare("SELECT $1::int4 * 2, pg_backend_pid()")
            .await
            .unwrap();

        let futures = (0..200i32).map(|i| {
            let client = &client;
            let stmt = &stmt;
            async move { client.query_one(stmt, &[&i]).await }
        });
        let results = futures_util::future::try_join_all(futures).await.unwrap();
        assert_eq!(results.len(), 200);
        let pid: i32 = results[0].get(1);
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r.get::<_, i32>(0), 2 * i as i32);
            // one session, one server connection
            assert_eq!(r.get::<_, i32>(1), pid);
        }

        // Distinct statements (each prepared and executed) pipelined as well.
        let (a, b, c) = tokio::try_join!(
            client.query_one("SELECT 'a'::text", &[]),
            client.query_one("SELECT $1::int8", &[&7i64]),
            client.query("SELECT g FROM generate_series(1, 5000) g", &[]),
        )
        .unwrap();
        assert_eq!(a.get::<_, String>(0), "a");
        assert_eq!(b.get::<_, i64>(0), 7);
        assert_eq!(c.len(), 5000);
        assert_eq!(c[4999].get::<_, i32>(0), 5000);
    })
    .await
}

#[tokio::test]
async fn text_and_binary_result_formats() {
    within(TEST_DEADLINE, async {
        let (_pg, client) = pgmemo_and_client().await;
        client.simple_query("SET TimeZone = 'UTC'").await.unwrap();
        let sql = "SELECT 9223372036854775807::int8, -1.5::float8, 'tab\there'::text, \
                   '\\x0001ff'::bytea, 12345678901234567890.123456789::numeric::text, \
                   '2024-01-02 03:04:05.123456+00'::timestamptz, ARRAY[1, NULL, 3]::int4[], \
                   ARRAY['a', 'b c', 'q\"']::text[], NULL::text";

        // query(): binary results
        let row = client.query_one(sql, &[]).await.unwrap();
        assert_eq!(row.get::<_, i64>(0), i64::MAX);
        assert_eq!(row.get::<_, f64>(1), -1.5);
        assert_eq!(row.get::<_, String>(2), "tab\there");
        assert_eq!(row.get::<_, Vec<u8>>(3), vec![0u8, 1, 255]);
        assert_eq!(row.get::<_, String>(4), "12345678901234567890.123456789");
        let ts = UNIX_EPOCH + Duration::from_micros(1_704_164_645_123_456);
        assert_eq!(row.get::<_, SystemTime>(5), ts);
        assert_eq!(
            row.get::<_, Vec<Option<i32>>>(6),
            vec![Some(1), None, Some(3)]
        );
        assert_eq!(
            row.get::<_, Vec<String>>(7),
            vec!["a".to_owned(), "b c".to_owned(), "q\"".to_owned()]
        );
        assert_eq!(row.get::<_, Option<String>>(8), None);

        // simple_query(): text results
        let text = client.simple_query(sql).await.unwrap();
        assert_eq!(
            rows(&text),
            vec![vec![
                Some("9223372036854775807".into()),
                Some("-1.5".into()),
                Some("tab\there".into()),
                Some("\\x0001ff".into()),
                Some("12345678901234567890.123456789".into()),
                Some("2024-01-02 03:04:05.123456+00".into()),
                Some("{1,NULL,3}".into()),
                Some("{a,\"b c\",\"q\\\"\"}".into()),
                None,
            ]]
        );

        // Binary parameters round-trip the same values.
        let echo = client
            .query_one(
                "SELECT $1::int8, $2::float8, $3::bytea, $4::timestamptz, $5::text[]",
                &[
                    &i64::MIN,
                    &f64::MAX,
                    &vec![7u8; 1000],
                    &ts,
                    &vec!["x".to_owned(), "".to_owned()],
                ],
            )
            .await
            .unwrap();
        assert_eq!(echo.get::<_, i64>(0), i64::MIN);
        assert_eq!(echo.get::<_, f64>(1), f64::MAX);
        assert_eq!(echo.get::<_, Vec<u8>>(2), vec![7u8; 1000]);
        assert_eq!(echo.get::<_, SystemTime>(3), ts);
        assert_eq!(
            echo.get::<_, Vec<String>>(4),
            vec!["x".to_owned(), String::new()]
        );
    })
    .await
}

/// Rows `id \t payload \n` as COPY's text format writes them back byte for byte.
fn copy_rows(target_bytes: usize) -> (Vec<u8>, u64, i64, i64) {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut data = Vec::with_capacity(target_bytes + 200);
    let (mut rows, mut id_sum, mut payload_len) = (0u64, 0i64, 0i64);
    let mut id = 0i64;
    while data.len() < target_bytes {
        data.extend_from_slice(id.to_string().as_bytes());
        data.push(b'\t');
        let len = 50 + (id % 100) as usize;
        for k in 0..len {
            data.push(ALPHABET[(id as usize * 7 + k) % ALPHABET.len()]);
        }
        data.push(b'\n');
        rows += 1;
        id_sum += id;
        payload_len += len as i64;
        id += 1;
    }
    (data, rows, id_sum, payload_len)
}

#[tokio::test]
async fn copy_in_10mb_and_copy_out() {
    within(TEST_DEADLINE, async {
        let (_pg, client) = pgmemo_and_client().await;
        let t = unique("pm_copy");
        client
            .batch_execute(&format!("CREATE TEMP TABLE {t} (id int8, payload text)"))
            .await
            .unwrap();

        let (data, expected_rows, id_sum, payload_len) = copy_rows(10 << 20);
        let mut sink = copy_in(&client, &t).await;
        for chunk in data.chunks(64 * 1024) {
            sink.send(Bytes::copy_from_slice(chunk)).await.unwrap();
        }
        let copied = sink.as_mut().finish().await.unwrap();
        assert_eq!(copied, expected_rows);

        let stats = client
            .query_one(
                &format!(
                    "SELECT count(*), sum(id)::int8, sum(length(payload))::int8, \
                     md5(string_agg(id::text || E'\\t' || payload || E'\\n', '' ORDER BY id)) \
                     FROM {t}"
                ),
                &[],
            )
            .await
            .unwrap();
        assert_eq!(stats.get::<_, i64>(0) as u64, expected_rows);
        assert_eq!(stats.get::<_, i64>(1), id_sum);
        assert_eq!(stats.get::<_, i64>(2), payload_len);
        let table_md5: String = stats.get(3);
        let sent_md5: String = client
            .query_one("SELECT md5($1::bytea)", &[&data])
            .await
            .unwrap()
            .get(0);
        assert_eq!(table_md5, sent_md5);

        let out = client
            .copy_out(&format!(
                "COPY (SELECT id, payload FROM {t} ORDER BY id) TO STDOUT"
            ))
            .await
            .unwrap();
        let mut out = std::pin::pin!(out);
        let mut received = Vec::with_capacity(data.len());
        while let Some(chunk) = out.next().await {
            received.extend_from_slice(&chunk.unwrap());
        }
        assert_eq!(received.len(), data.len());
        assert!(
            received == data,
            "COPY TO STDOUT differs from what was copied in"
        );

        // The session is in a clean state afterwards.
        assert_eq!(count(&client, &t).await as u64, expected_rows);
        client
            .batch_execute(&format!("DROP TABLE {t}"))
            .await
            .unwrap();
    })
    .await
}

#[tokio::test]
async fn copy_in_error_and_copy_fail_leave_session_usable() {
    within(TEST_DEADLINE, async {
        let (_pg, client) = pgmemo_and_client().await;
        let t = unique("pm_copyerr");
        client
            .batch_execute(&format!("CREATE TEMP TABLE {t} (id int8)"))
            .await
            .unwrap();

        // Bad data: the server fails the COPY.
        let mut sink = copy_in(&client, &t).await;
        sink.send(Bytes::from_static(b"1\nnot a number\n"))
            .await
            .ok();
        let err = sink.as_mut().finish().await.unwrap_err();
        assert_eq!(sqlstate(&err), Some("22P02"));

        // Client abort: dropping the sink sends CopyFail.
        {
            let mut sink = copy_in(&client, &t).await;
            sink.send(Bytes::from_static(b"1\n2\n")).await.unwrap();
        }
        assert_eq!(count(&client, &t).await, 0);
    })
    .await
}

#[tokio::test]
async fn listen_notify_between_two_clients() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        let (listener, mut messages) = client_with_messages(&pg).await;
        let notifier = pg.client(USER, DB).await;
        let channel = unique("pm_chan");

        listener
            .batch_execute(&format!("LISTEN {channel}"))
            .await
            .unwrap();
        let notifier_pid: i32 = notifier
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        notifier
            .execute("SELECT pg_notify($1, $2)", &[&channel, &"first payload"])
            .await
            .unwrap();
        notifier
            .batch_execute(&format!("NOTIFY {channel}, 'second'"))
            .await
            .unwrap();

        let mut got = Vec::new();
        while got.len() < 2 {
            let msg = tokio::time::timeout(Duration::from_secs(10), messages.recv())
                .await
                .expect("notification delivered while the listener is idle")
                .expect("connection open");
            if let AsyncMessage::Notification(n) = msg {
                assert_eq!(n.channel(), channel);
                assert_eq!(n.process_id(), notifier_pid);
                got.push(n.payload().to_owned());
            }
        }
        assert_eq!(got, vec!["first payload".to_owned(), "second".to_owned()]);

        // After UNLISTEN nothing arrives; a query on the listener still works.
        listener
            .batch_execute(&format!("UNLISTEN {channel}"))
            .await
            .unwrap();
        notifier
            .batch_execute(&format!("NOTIFY {channel}, 'third'"))
            .await
            .unwrap();
        let one: i32 = listener.query_one("SELECT 1", &[]).await.unwrap().get(0);
        assert_eq!(one, 1);
        while let Ok(msg) = messages.try_recv() {
            assert!(
                !matches!(msg, AsyncMessage::Notification(_)),
                "notification after UNLISTEN"
            );
        }
    })
    .await
}

#[tokio::test]
async fn notices_are_delivered() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        let (client, mut messages) = client_with_messages(&pg).await;
        client
            .batch_execute(
                "DO $$ BEGIN RAISE NOTICE 'hello %', 42; RAISE WARNING 'careful'; END $$",
            )
            .await
            .unwrap();
        let mut notices = Vec::new();
        while notices.len() < 2 {
            let msg = tokio::time::timeout(Duration::from_secs(10), messages.recv())
                .await
                .expect("notice delivered")
                .expect("connection open");
            if let AsyncMessage::Notice(n) = msg {
                notices.push((n.severity().to_owned(), n.message().to_owned()));
            }
        }
        assert_eq!(
            notices,
            vec![
                ("NOTICE".to_owned(), "hello 42".to_owned()),
                ("WARNING".to_owned(), "careful".to_owned()),
            ]
        );
    })
    .await
}

#[tokio::test]
async fn cancel_interrupts_a_running_query_quickly() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        let app = unique("pm_cancel");
        let url = format!("{}?application_name={app}", pg.url(USER, DB));
        let client = testkit::connect(&url).await.unwrap();
        let direct = LocalPostgres.client(USER, DB).await;

        let token = client.cancel_token();
        let running = tokio::spawn(async move {
            let r = client.query("SELECT pg_sleep(10)", &[]).await;
            (r.map(|_| ()), Instant::now(), client)
        });
        assert_eventually(Duration::from_secs(10), "pg_sleep is running", || {
            pg_sleep_running(&direct, &app)
        })
        .await;

        let cancelled_at = Instant::now();
        token.cancel_query(NoTls).await.unwrap();
        let (result, failed_at, client) = running.await.unwrap();
        let err = result.expect_err("the query was cancelled");
        assert_eq!(sqlstate(&err), Some("57014"), "{err}");
        let elapsed = failed_at.duration_since(cancelled_at);
        assert!(elapsed < Duration::from_secs(1), "cancel took {elapsed:?}");

        // The session survives a cancel.
        let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
        assert_eq!(one, 1);
        assert_eq!(pg.stats().cancel_requests.load(Ordering::Relaxed), 1);
    })
    .await
}

#[tokio::test]
async fn cancel_only_hits_the_session_it_names() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        let app = unique("pm_nocancel");
        let url = format!("{}?application_name={app}", pg.url(USER, DB));
        let busy = testkit::connect(&url).await.unwrap();
        let idle = pg.client(USER, DB).await;
        let direct = LocalPostgres.client(USER, DB).await;

        let running = tokio::spawn(async move {
            busy.query_one("SELECT pg_sleep(1)::text", &[])
                .await
                .map(|_| ())
        });
        assert_eventually(Duration::from_secs(10), "pg_sleep is running", || {
            pg_sleep_running(&direct, &app)
        })
        .await;
        // Cancelling the idle session must not touch the busy one.
        idle.cancel_token().cancel_query(NoTls).await.unwrap();
        running
            .await
            .unwrap()
            .expect("the busy session's query is not cancelled");
        let one: i32 = idle.query_one("SELECT 1", &[]).await.unwrap().get(0);
        assert_eq!(one, 1);
    })
    .await
}

#[tokio::test]
async fn error_in_the_middle_of_a_pipeline() {
    within(TEST_DEADLINE, async {
        let (_pg, client) = pgmemo_and_client().await;
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);

        // Execution-time error in the middle.
        let (a, b, c) = tokio::join!(
            client.query_one("SELECT 1::int4", &[]),
            client.query_one("SELECT 1 / $1::int4", &[&0i32]),
            client.query_one("SELECT 3::int4", &[]),
        );
        assert_eq!(a.unwrap().get::<_, i32>(0), 1);
        assert_eq!(sqlstate(&b.unwrap_err()), Some("22012"));
        assert_eq!(c.unwrap().get::<_, i32>(0), 3);

        // Parse-time error in the middle.
        let (a, b, c) = tokio::join!(
            client.query_one("SELECT 'a'::text", &[]),
            client.query_one("SELEC 2", &[]),
            client.query_one("SELECT 'c'::text", &[]),
        );
        assert_eq!(a.unwrap().get::<_, String>(0), "a");
        assert_eq!(sqlstate(&b.unwrap_err()), Some("42601"));
        assert_eq!(c.unwrap().get::<_, String>(0), "c");

        // Many pipelined requests with several failures.
        let results = futures_util::future::join_all((0..50i32).map(|i| {
            let client = &client;
            async move { client.query_one("SELECT 100 / $1::int4", &[&(i % 5)]).await }
        }))
        .await;
        for (i, r) in results.into_iter().enumerate() {
            match (i % 5, r) {
                (0, Err(e)) => assert_eq!(sqlstate(&e), Some("22012")),
                (d, Ok(row)) => assert_eq!(row.get::<_, i32>(0), 100 / d as i32),
                (_, Err(e)) => panic!("query {i} failed: {e}"),
            }
        }

        // Recovery: the same server session goes on.
        let row = client
            .query_one("SELECT pg_backend_pid(), 42::int4", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, i32>(0), pid);
        assert_eq!(row.get::<_, i32>(1), 42);
    })
    .await
}

#[tokio::test]
async fn transactions_rollback_and_commit() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        let mut client = pg.client(USER, DB).await;
        let observer = pg.client(USER, DB).await;
        let t = unique("pm_tx");
        client
            .batch_execute(&format!("CREATE TABLE {t} (id int PRIMARY KEY)"))
            .await
            .unwrap();
        let tx = client.transaction().await.unwrap();
        tx.execute(&format!("INSERT INTO {t} VALUES (1)"), &[])
            .await
            .unwrap();
        assert_eq!(
            tx.query_one(&format!("SELECT count(*) FROM {t}"), &[])
                .await
                .unwrap()
                .get::<_, i64>(0),
            1
        );
        // Not visible to another session before commit.
        assert_eq!(count(&observer, &t).await, 0);
        tx.rollback().await.unwrap();
        assert_eq!(count(&client, &t).await, 0);

        let tx = client.transaction().await.unwrap();
        tx.execute(&format!("INSERT INTO {t} VALUES (2)"), &[])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(count(&observer, &t).await, 1);

        // A failed transaction stays failed until ROLLBACK.
        client.batch_execute("BEGIN").await.unwrap();
        let err = client
            .execute(&format!("INSERT INTO {t} VALUES (2)"), &[])
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&err), Some("23505"));
        let err = client.execute("SELECT 1", &[]).await.unwrap_err();
        assert_eq!(sqlstate(&err), Some("25P02"));
        client.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(count(&client, &t).await, 1);

        // Simple-protocol transaction block in one query string.
        client
            .batch_execute(&format!(
                "BEGIN; INSERT INTO {t} VALUES (3); INSERT INTO {t} VALUES (4); COMMIT"
            ))
            .await
            .unwrap();
        assert_eq!(count(&observer, &t).await, 3);

        observer
            .batch_execute(&format!("DROP TABLE {t}"))
            .await
            .unwrap();
    })
    .await
}

#[tokio::test]
async fn parameter_status_changes_are_visible() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        let (client, mut conn) = raw_client(&pg).await;

        // The startup announced the server's parameters.
        assert_eq!(conn.parameter("server_encoding"), Some("UTF8"));
        assert!(conn
            .parameter("server_version")
            .is_some_and(|v| v.starts_with("15")));

        let app = unique("pm_app");
        drive(
            &mut conn,
            client.batch_execute(&format!("SET application_name = '{app}'")),
        )
        .await
        .unwrap();
        assert_eq!(conn.parameter("application_name"), Some(app.as_str()));
        let shown = drive(&mut conn, client.simple_query("SHOW application_name"))
            .await
            .unwrap();
        assert_eq!(rows(&shown), vec![vec![Some(app.clone())]]);

        drive(&mut conn, client.batch_execute("SET TimeZone = 'UTC'"))
            .await
            .unwrap();
        assert_eq!(conn.parameter("TimeZone"), Some("UTC"));
        let sql = "SELECT '2024-01-02 03:04:05+00'::timestamptz";
        let utc = drive(&mut conn, client.simple_query(sql)).await.unwrap();
        assert_eq!(
            rows(&utc),
            vec![vec![Some("2024-01-02 03:04:05+00".into())]]
        );

        drive(
            &mut conn,
            client.batch_execute("SET TimeZone = 'Asia/Kolkata'"),
        )
        .await
        .unwrap();
        assert_eq!(conn.parameter("TimeZone"), Some("Asia/Kolkata"));
        let kolkata = drive(&mut conn, client.simple_query(sql)).await.unwrap();
        assert_eq!(
            rows(&kolkata),
            vec![vec![Some("2024-01-02 08:34:05+05:30".into())]]
        );
        let shown = drive(&mut conn, client.simple_query("SHOW TimeZone"))
            .await
            .unwrap();
        assert_eq!(rows(&shown), vec![vec![Some("Asia/Kolkata".into())]]);

        // RESET reports the default back.
        drive(&mut conn, client.batch_execute("RESET application_name"))
            .await
            .unwrap();
        assert_eq!(conn.parameter("application_name"), Some(""));
    })
    .await
}

#[tokio::test]
async fn prepared_statement_reused_many_times() {
    within(TEST_DEADLINE, async {
        let (_pg, client) = pgmemo_and_client().await;
        let marker = unique("pm_stmt");
        let sql = format!("SELECT $1::int8 * $1::int8, '{marker}'::text");
        let stmt = client.prepare(&sql).await.unwrap();
        for i in 0..500i64 {
            let row = client.query_one(&stmt, &[&i]).await.unwrap();
            assert_eq!(row.get::<_, i64>(0), i * i);
        }
        // One server-side statement, executed each time without re-preparing.
        let prepared: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement = $1",
                &[&sql],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(prepared, 1);

        // Pipelined executions of the same statement.
        let results = futures_util::future::try_join_all((0..100i64).map(|i| {
            let (client, stmt) = (&client, &stmt);
            async move { client.query_one(stmt, &[&i]).await }
        }))
        .await
        .unwrap();
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r.get::<_, i64>(0), (i * i) as i64);
            assert_eq!(r.get::<_, String>(1), marker);
        }
    })
    .await
}

#[tokio::test]
async fn large_values_pass_intact() {
    within(TEST_DEADLINE, async {
        let (_pg, client) = pgmemo_and_client().await;
        const SIZE: usize = 50 << 20;

        // 50 MB up (Bind) and back (DataRow).
        let value: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
        let row = client
            .query_one(
                "SELECT $1::bytea, length($1::bytea), get_byte($1::bytea, 0), \
                 get_byte($1::bytea, 12345678), get_byte($1::bytea, $2::int4 - 1)",
                &[&value, &(SIZE as i32)],
            )
            .await
            .unwrap();
        // The server saw the bytes the client sent...
        assert_eq!(row.get::<_, i32>(1) as usize, SIZE);
        assert_eq!(row.get::<_, i32>(2), 0);
        assert_eq!(row.get::<_, i32>(3), 12_345_678 % 251);
        assert_eq!(row.get::<_, i32>(4), ((SIZE - 1) % 251) as i32);
        // ...and the client got them back unchanged.
        let echoed: Vec<u8> = row.get(0);
        assert_eq!(echoed.len(), SIZE);
        assert!(echoed == value, "50 MB bytea came back altered");

        // A 50 MB text value in a simple (text-format) query.
        let text = client
            .simple_query("SELECT repeat('abcdefghij', 5 * 1024 * 1024)")
            .await
            .unwrap();
        let rows = rows(&text);
        let big = rows[0][0].as_deref().unwrap();
        assert_eq!(big.len(), SIZE);
        assert!(big.as_bytes().chunks(10).all(|c| c == b"abcdefghij"));

        // The session is fine afterwards.
        let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
        assert_eq!(one, 1);
    })
    .await
}

#[tokio::test]
async fn session_state_does_not_leak_to_the_next_client() {
    within(TEST_DEADLINE, async {
        let mut config = pgmemo_config_for(LocalPostgres::PORT);
        config.pool_size = 1;
        let pg = spawn_pgmemo(config).await.unwrap();
        let first = pg.client(USER, DB).await;
        let pid = rows(&first.simple_query("SELECT pg_backend_pid()").await.unwrap())[0][0]
            .clone()
            .unwrap()
            .parse::<i32>()
            .unwrap();
        first
            .batch_execute(
                "SET TimeZone = 'Asia/Kolkata'; CREATE TEMP TABLE pm_leak (x int); \
                 PREPARE pm_leak_stmt AS SELECT 1; BEGIN; SELECT 1",
            )
            .await
            .unwrap();
        drop(first);

        // With one server connection the next client gets the same backend, reset.
        let pid_again = eventually_some(Duration::from_secs(10), || {
            let pg = &pg;
            async move {
                let c = pg.try_client(USER, DB).await.ok()?;
                let msgs = c
                    .simple_query(
                        "SELECT pg_backend_pid(), current_setting('TimeZone'), \
                         (SELECT count(*) FROM pg_prepared_statements), \
                         to_regclass('pm_leak') IS NULL",
                    )
                    .await
                    .ok()?;
                rows(&msgs).into_iter().next()
            }
        })
        .await
        .expect("a second client is served");
        assert_eq!(
            pid_again[0].as_deref(),
            Some(pid.to_string().as_str()),
            "the pooled connection is reused"
        );
        assert_ne!(pid_again[1].as_deref(), Some("Asia/Kolkata"));
        assert_eq!(
            pid_again[2].as_deref(),
            Some("0"),
            "prepared statement survived"
        );
        assert_eq!(
            pid_again[3].as_deref(),
            Some("t"),
            "temp table survived the reset"
        );

        // The ParameterStatus a reused connection announces matches its reset state.
        let (client, mut conn) = raw_client(&pg).await;
        let announced = conn.parameter("TimeZone").map(str::to_owned);
        let shown = drive(&mut conn, client.simple_query("SHOW TimeZone"))
            .await
            .unwrap();
        let pid_third = drive(&mut conn, client.simple_query("SELECT pg_backend_pid()"))
            .await
            .unwrap();
        assert_eq!(
            rows(&pid_third)[0][0].as_deref(),
            Some(pid.to_string().as_str())
        );
        assert_eq!(rows(&shown)[0][0], announced);
    })
    .await
}

/// tokio-postgres (like libpq) sends Sync right after the COPY's Execute and again after
/// CopyDone/CopyFail; the server ignores the first (it arrives in copy-in mode) and answers
/// ReadyForQuery once. pgmemo must still see the session at a clean boundary afterwards.
#[tokio::test]
async fn session_after_copy_in_is_at_a_clean_boundary() {
    within(TEST_DEADLINE, async {
        let mut config = pgmemo_config_for(LocalPostgres::PORT);
        config.pool_size = 1;
        let pg = spawn_pgmemo(config).await.unwrap();
        let client = pg.client(USER, DB).await;
        let t = unique("pm_copyb");
        let pid = rows(
            &client
                .simple_query(&format!(
                    "CREATE TEMP TABLE {t} (id int8); SELECT pg_backend_pid()"
                ))
                .await
                .unwrap(),
        )[0][0]
            .clone()
            .unwrap();

        // A successful COPY, a failed one, and an aborted one.
        let mut sink = copy_in(&client, &t).await;
        sink.send(Bytes::from_static(b"1\n2\n")).await.unwrap();
        assert_eq!(sink.as_mut().finish().await.unwrap(), 2);
        let mut sink = copy_in(&client, &t).await;
        sink.send(Bytes::from_static(b"x\n")).await.ok();
        assert!(sink.as_mut().finish().await.is_err());
        {
            let mut sink = copy_in(&client, &t).await;
            sink.send(Bytes::from_static(b"3\n")).await.unwrap();
        }
        assert_eq!(count(&client, &t).await, 2);
        drop(client);

        // The connection went back to the pool (not closed as mid-request).
        let next = eventually_some(Duration::from_secs(10), || {
            let pg = &pg;
            async move {
                let c = pg.try_client(USER, DB).await.ok()?;
                let msgs = c.simple_query("SELECT pg_backend_pid()").await.ok()?;
                rows(&msgs).into_iter().next()
            }
        })
        .await
        .expect("the next client is served");
        assert_eq!(next[0].as_deref(), Some(pid.as_str()));
        assert_eq!(pg.stats().servers_closed_dirty.load(Ordering::Relaxed), 0);
    })
    .await
}

//! A result far larger than pgmemo's memory budget streams through the pgmemo binary: bytes are
//! forwarded as they arrive, so the proxy's peak RSS (VmHWM) stays a small constant however big
//! the result is.

use std::path::Path;
use std::pin::pin;
use std::time::Duration;

use futures_util::StreamExt as _;
use testkit::{assert_eventually, LocalPostgres, PgmemoProcess};
use tokio_postgres::types::ToSql;
use tokio_postgres::SimpleQueryMessage;

/// Rows of the result and bytes of payload per row: 210 000 × 1000 B = 210 MB (200 MiB).
const ROWS: i64 = 210_000;
const ROW_BYTES: usize = 1000;
const TOTAL: u64 = ROWS as u64 * ROW_BYTES as u64;

/// Largest acceptable growth of pgmemo's peak RSS over its resident size before the big
/// results. Measured with the debug binary: about 0.1 MiB of growth (the relay forwards 32 kB
/// reads) over a 7.7 MiB baseline; the bound leaves a wide margin for allocator behaviour while
/// staying far below the 3 × 200 MiB streamed.
const MAX_GROWTH: u64 = 16 << 20;

/// Largest acceptable peak RSS overall.
const MAX_PEAK: u64 = 48 << 20;

async fn start_pgmemo() -> PgmemoProcess {
    start_pgmemo_with(&[]).await
}

async fn start_pgmemo_with(extra: &[&str]) -> PgmemoProcess {
    let mut args = vec![
        "--upstream".to_owned(),
        format!("postgres://127.0.0.1:{}", LocalPostgres::PORT),
        "--log-level".to_owned(),
        "warn".to_owned(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    PgmemoProcess::spawn(Path::new(env!("CARGO_BIN_EXE_pgmemo")), &args)
        .await
        .expect("pgmemo binary starts")
}

/// An error quoting a huge input value (PostgreSQL's 22P02 repeats the whole value) streams
/// through like a row instead of being held whole, with the cache on and off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_error_message_streams_in_constant_memory() {
    const VALUE: usize = 100 << 20;
    for cache in ["on", "off"] {
        let pgmemo = start_pgmemo_with(&["--cache", cache]).await;
        let client = pgmemo.client("postgres", "test").await;
        let baseline = pgmemo.rss_bytes().expect("pgmemo runs");
        let e = client
            .simple_query(&format!("SELECT repeat('x', {VALUE})::int"))
            .await
            .expect_err("not an integer");
        let db = e.as_db_error().expect("the server's error");
        assert_eq!(db.code().code(), "22P02");
        assert!(db.message().len() > VALUE, "the whole message arrives");
        assert_eq!(
            client.simple_query("SELECT 1").await.unwrap().len(),
            3,
            "the session goes on"
        );
        let growth = pgmemo
            .peak_rss_bytes()
            .expect("pgmemo runs")
            .saturating_sub(baseline);
        assert!(
            growth < MAX_GROWTH,
            "cache {cache}: pgmemo's peak RSS grew by {:.1} MiB for a {:.0} MiB error",
            mb(growth),
            mb(VALUE as u64)
        );
    }
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mb_result_streams_in_constant_memory() {
    let pgmemo = start_pgmemo().await;
    let client = pgmemo.client("postgres", "test").await;
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let direct = LocalPostgres.client("postgres", "test").await;
    let baseline = pgmemo.rss_bytes().expect("pgmemo runs");

    // COPY OUT: one CopyData message per row.
    let copy = client
        .copy_out(&format!(
            "COPY (SELECT repeat('x', {ROW_BYTES}) FROM generate_series(1, {ROWS})) TO STDOUT"
        ))
        .await
        .unwrap();
    let mut copy = pin!(copy);
    let mut copied = 0u64;
    while let Some(chunk) = copy.next().await {
        copied += chunk.unwrap().len() as u64;
    }
    assert_eq!(
        copied,
        TOTAL + ROWS as u64,
        "payload plus one newline per row"
    );

    // Extended protocol: DataRow messages, consumed as a stream without keeping them.
    let rows = client
        .query_raw(
            "SELECT repeat('x', $1::int) FROM generate_series(1, $2::bigint)",
            [&(ROW_BYTES as i32) as &(dyn ToSql + Sync), &ROWS],
        )
        .await
        .unwrap();
    let mut rows = pin!(rows);
    let (mut received, mut count) = (0u64, 0i64);
    // A client that stops reading: the backpressure reaches PostgreSQL (its backend blocks
    // writing to pgmemo) instead of pgmemo buffering the result.
    let first = rows.next().await.expect("a first row").unwrap();
    received += first.get::<_, &str>(0).len() as u64;
    count += 1;
    assert_eventually(
        Duration::from_secs(30),
        "the backend blocks on a full socket",
        || async {
            direct
                .query_one(
                    "SELECT coalesce(wait_event, '') FROM pg_stat_activity WHERE pid = $1",
                    &[&pid],
                )
                .await
                .map(|r| r.get::<_, String>(0) == "ClientWrite")
                .unwrap_or(false)
        },
    )
    .await;
    let stalled = pgmemo.rss_bytes().expect("pgmemo runs");
    assert!(
        stalled.saturating_sub(baseline) < MAX_GROWTH,
        "pgmemo buffered {:.1} MiB for a stalled client",
        mb(stalled.saturating_sub(baseline))
    );
    while let Some(row) = rows.next().await {
        let row = row.unwrap();
        received += row.get::<_, &str>(0).len() as u64;
        count += 1;
    }
    assert_eq!((count, received), (ROWS, TOTAL));

    // Simple protocol, streamed too.
    let messages = client
        .simple_query_raw(&format!(
            "SELECT repeat('x', {ROW_BYTES}) FROM generate_series(1, {ROWS})"
        ))
        .await
        .unwrap();
    let mut messages = pin!(messages);
    let mut simple = 0u64;
    while let Some(message) = messages.next().await {
        if let SimpleQueryMessage::Row(row) = message.unwrap() {
            simple += row.get(0).map_or(0, str::len) as u64;
        }
    }
    assert_eq!(simple, TOTAL);

    // The session still works afterwards.
    client.simple_query("SELECT 1").await.unwrap();

    let peak = pgmemo.peak_rss_bytes().expect("pgmemo runs");
    let growth = peak.saturating_sub(baseline);
    eprintln!(
        "pgmemo RSS before: {:.1} MiB, peak after 3 × {:.0} MiB: {:.1} MiB (growth {:.1} MiB)",
        mb(baseline),
        mb(TOTAL),
        mb(peak),
        mb(growth)
    );
    assert!(
        growth < MAX_GROWTH,
        "pgmemo's peak RSS grew by {:.1} MiB while streaming {:.0} MiB (limit {:.0} MiB)",
        mb(growth),
        mb(TOTAL),
        mb(MAX_GROWTH)
    );
    assert!(peak < MAX_PEAK, "peak RSS {:.1} MiB", mb(peak));
}

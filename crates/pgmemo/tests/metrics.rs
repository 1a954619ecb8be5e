//! The Prometheus endpoint end to end: pgmemo in front of the shared local server with
//! `metrics_listen` on a kernel-picked port, scraped with a raw TCP client. Checks the page
//! (well-formed, HELP/TYPE per family, cache hits, pool gauges, the upstream histogram), the
//! answers to other paths and to garbage, that it stops with pgmemo, and that a busy address
//! is a start error.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use testkit::{eventually_some, pgmemo_config_for, spawn_pgmemo, LocalPostgres, PgmemoInstance};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Database and superuser on the shared local server.
const DB: &str = "test";
const USER: &str = "postgres";

/// Generous bound for anything that should happen "at once" on a busy CI machine.
const SOON: Duration = Duration::from_secs(10);

async fn pgmemo_with_metrics() -> PgmemoInstance {
    let config = pgmemo::Config {
        metrics_listen: Some(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
        ..pgmemo_config_for(LocalPostgres::PORT)
    };
    spawn_pgmemo(config).await.expect("pgmemo starts")
}

fn metrics_addr(memo: &PgmemoInstance) -> SocketAddr {
    memo.handle().metrics_addr().expect("metrics_listen is set")
}

/// Sends `request` as is, ends the sending side (so an incomplete request is answered at
/// once, not after the server's read timeout) and returns everything the server answers before
/// it closes. A reset counts as a close: the bytes read until then are returned.
async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut socket = TcpStream::connect(addr)
        .await
        .expect("metrics port accepts");
    socket.write_all(request).await.expect("request sent");
    socket.shutdown().await.expect("half-close");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(SOON, socket.read_to_end(&mut answer))
        .await
        .expect("the server closes after answering");
    if let Err(e) = read {
        assert!(answer.is_empty(), "reset after a partial answer: {e}");
    }
    String::from_utf8(answer).expect("answers are UTF-8")
}

/// `(status line, headers, body)` of an HTTP response.
fn split(response: &str) -> (&str, &str, &str) {
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of head in {response:?}"));
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status, headers, body)
}

async fn scrape(addr: SocketAddr) -> String {
    let response = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: pgmemo\r\n\r\n").await;
    let (status, headers, body) = split(&response);
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        headers
            .to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{headers}"
    );
    assert!(
        headers.contains(&format!("Content-Length: {}", body.len())),
        "{headers}"
    );
    body.to_owned()
}

/// The value of the sample written exactly as `series` (name and labels).
fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Every line is a comment or `name{labels} value`; every family has HELP then TYPE before
/// its samples, and no family appears twice.
fn assert_well_formed(page: &str) {
    let mut typed = HashSet::new();
    let mut helped = HashSet::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            assert!(helped.insert(name.to_owned()), "HELP twice for {name}");
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(helped.contains(name), "TYPE before HELP for {name}");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert!(typed.insert(name.to_owned()), "TYPE twice for {name}");
        } else {
            let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line:?}"));
            assert!(value.parse::<f64>().is_ok(), "value of {line:?}");
            let name = series.split('{').next().unwrap();
            assert!(
                name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
                "{line:?}"
            );
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| typed.contains(*f)))
                .unwrap_or(name);
            assert!(typed.contains(family), "sample before TYPE: {line:?}");
        }
    }
}

#[tokio::test]
async fn scrape_shows_cache_hits_pools_and_the_upstream_histogram() {
    let memo = pgmemo_with_metrics().await;
    let addr = metrics_addr(&memo);
    let table = format!("metrics_scrape_{}", std::process::id());
    let direct = LocalPostgres.client(USER, DB).await;
    direct
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id int PRIMARY KEY, v text);
             INSERT INTO {table} VALUES (1, 'one');"
        ))
        .await
        .unwrap();

    let client = memo.client(USER, DB).await;
    let query = format!("SELECT v FROM {table} WHERE id = 1");
    for _ in 0..2 {
        client.simple_query(&query).await.unwrap();
    }
    // The hit is counted right after its answer went out: poll rather than race it.
    let page = eventually_some(SOON, || async {
        let page = scrape(addr).await;
        (sample(&page, "pgmemo_cache_hits_total")? >= 1.0).then_some(page)
    })
    .await
    .expect("a scrape shows the cache hit");

    assert_well_formed(&page);
    assert_eq!(
        sample(&page, "pgmemo_cache_hits_total"),
        Some(1.0),
        "{page}"
    );
    assert_eq!(
        sample(&page, "pgmemo_cache_misses_total"),
        Some(1.0),
        "{page}"
    );
    assert_eq!(sample(&page, "pgmemo_cache_entries"), Some(1.0), "{page}");
    assert!(
        sample(&page, "pgmemo_clients_accepted_total") >= Some(1.0),
        "{page}"
    );
    assert!(
        sample(&page, "pgmemo_clients_connected") >= Some(1.0),
        "{page}"
    );
    for line in [
        "# HELP pgmemo_cache_hits_total ",
        "# TYPE pgmemo_cache_hits_total counter",
        "# TYPE pgmemo_cache_bytes gauge",
        "# TYPE pgmemo_pool_server_connections gauge",
        "# HELP pgmemo_upstream_query_seconds ",
        "# TYPE pgmemo_upstream_query_seconds histogram",
        "pgmemo_upstream_query_seconds_bucket{le=\"0.001\"} ",
        "pgmemo_upstream_query_seconds_bucket{le=\"+Inf\"} ",
        "pgmemo_upstream_query_seconds_sum ",
        "pgmemo_upstream_query_seconds_count ",
        "pgmemo_cache_refusals_total{reason=\"",
    ] {
        assert!(page.contains(line), "missing {line:?} in:\n{page}");
    }
    let infinite = sample(&page, "pgmemo_upstream_query_seconds_bucket{le=\"+Inf\"}");
    assert_eq!(
        infinite,
        sample(&page, "pgmemo_upstream_query_seconds_count")
    );
    let pool = format!("{{database=\"{DB}\",user=\"{USER}\",server=\"127.0.0.1:5432\"}}");
    assert_eq!(
        sample(&page, &format!("pgmemo_pool_clients{pool}")),
        Some(1.0),
        "{page}"
    );

    // A value recorded into the shared histogram shows up in its buckets.
    let before = sample(&page, "pgmemo_upstream_query_seconds_count").unwrap();
    memo.handle().shared().upstream_time.observe(1_500);
    let page = scrape(addr).await;
    assert_eq!(
        sample(&page, "pgmemo_upstream_query_seconds_count"),
        Some(before + 1.0)
    );

    // The counters of SHOW STATS are here too: a failed login shows at the next scrape.
    let failures = sample(&page, "pgmemo_login_failures_total").expect("login failures");
    assert!(
        sample(&page, "pgmemo_server_connects_total") >= Some(1.0),
        "{page}"
    );
    let url = memo.url(USER, "metrics_no_such_db");
    assert!(tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .is_err());
    // Counted once the session ends, which may be just after the client read the error.
    eventually_some(SOON, || async {
        let page = scrape(addr).await;
        (sample(&page, "pgmemo_login_failures_total")? == failures + 1.0).then_some(())
    })
    .await
    .expect("the failed login is counted");

    direct
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
    memo.shutdown().await;
}

#[tokio::test]
async fn other_paths_methods_and_garbage_get_errors_and_the_endpoint_survives() {
    let memo = pgmemo_with_metrics().await;
    let addr = metrics_addr(&memo);

    let missing = exchange(addr, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");
    let post = exchange(addr, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").await;
    assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
    let head = exchange(addr, b"HEAD /metrics HTTP/1.0\r\n\r\n").await;
    assert!(
        head.starts_with("HTTP/1.1 200 ") && head.ends_with("\r\n\r\n"),
        "{head}"
    );

    let mut too_long = b"GET /metrics HTTP/1.1\r\nX-Filler: ".to_vec();
    too_long.extend(std::iter::repeat_n(b'a', 16 * 1024));
    too_long.extend_from_slice(b"\r\n\r\n");
    for garbage in [
        &b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03garbage\r\n\r\n"[..],
        b"\0\0\0\x08\x04\xd2\x16\x2f",
        b"GET\r\n\r\n",
        b"GET /metrics HTTP/9.9\r\n\r\n",
        b"\xff\xfe\n\n",
        b"\r\n\r\n",
        &too_long,
    ] {
        let answer = exchange(addr, garbage).await;
        assert!(
            answer.is_empty()
                || answer.starts_with("HTTP/1.1 400 ")
                || answer.starts_with("HTTP/1.1 431 "),
            "{garbage:?} got {answer:?}"
        );
    }
    // A client that connects and goes away without a word.
    drop(TcpStream::connect(addr).await.unwrap());

    let page = scrape(addr).await;
    assert!(page.contains("# TYPE pgmemo_cache_hits_total counter"));
    memo.shutdown().await;
}

#[tokio::test]
async fn the_endpoint_stops_with_pgmemo() {
    let memo = pgmemo_with_metrics().await;
    let addr = metrics_addr(&memo);
    scrape(addr).await;
    memo.shutdown().await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the metrics port is closed after shutdown"
    );
}

#[tokio::test]
async fn metrics_are_off_by_default_and_a_busy_address_is_a_start_error() {
    let plain = spawn_pgmemo(pgmemo_config_for(LocalPostgres::PORT))
        .await
        .expect("pgmemo starts");
    assert_eq!(plain.handle().metrics_addr(), None);
    plain.shutdown().await;

    let taken = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let config = pgmemo::Config {
        metrics_listen: Some(taken.local_addr().unwrap()),
        ..pgmemo_config_for(LocalPostgres::PORT)
    };
    let err = match spawn_pgmemo(config).await {
        Ok(_) => panic!("started although the metrics address is taken"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("cannot listen for metrics on"), "{err}");
}

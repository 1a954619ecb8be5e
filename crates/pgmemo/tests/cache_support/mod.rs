//! Shared by the cache test files (`cache.rs`: session pooling, `transaction_cache.rs`:
//! transaction pooling; `replication.rs` reads values with it): the cluster and table the tests
//! start from, reading one value, the admin console's counters, and the scenarios both pool
//! modes must pass the same way. Test files that use it also declare `mod raw;`.

#![allow(dead_code)]

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgmemo::Config;
use testkit::{pgmemo_config_for, rows, spawn_pgmemo, PgmemoInstance, TempPostgres};
use tokio_postgres::{Client, SimpleQueryMessage};

/// A cluster of its own with table `t (id int PRIMARY KEY, v text, ts timestamptz)` holding
/// rows (1, 'one') and (2, 'two'), pgmemo in front of it with the configuration `adjust` makes,
/// and a direct connection to the cluster, which pgmemo does not see.
pub async fn setup_with(
    adjust: impl FnOnce(&mut Config),
) -> (TempPostgres, PgmemoInstance, Client) {
    let pg = TempPostgres::builder()
        .start()
        .await
        .expect("cluster starts");
    pg.psql(
        "CREATE TABLE t (id int PRIMARY KEY, v text, ts timestamptz DEFAULT '2024-01-01 12:00Z');
         INSERT INTO t (id, v) VALUES (1, 'one'), (2, 'two');",
    )
    .await;
    let mut config = pgmemo_config_for(pg.port());
    adjust(&mut config);
    let memo = spawn_pgmemo(config).await.expect("pgmemo starts");
    let direct = pg.client("postgres", "postgres").await;
    (pg, memo, direct)
}

/// Runs `sql` twice through pgmemo (`memo` is a client of it), changes `t` of [`setup_with`]
/// directly, and tells whether pgmemo still answers with the value from before the change
/// (served from the cache). An uncached answer must be the fresh one.
pub async fn served_from_cache(memo: &Client, direct: &Client, sql: &str) -> bool {
    let before = first(memo, sql).await;
    assert_eq!(
        first(memo, sql).await,
        before,
        "{sql}: stable while nothing changes"
    );
    direct
        .batch_execute("UPDATE t SET v = v || '+', ts = ts + interval '1 hour'")
        .await
        .unwrap();
    let after = first(memo, sql).await;
    let fresh = first(direct, sql).await;
    if after == before && after != fresh {
        return true;
    }
    assert_eq!(after, fresh, "{sql}: an uncached read must be fresh");
    false
}

/// Two sessions of `user` through `memo`, one with TimeZone UTC and one with Asia/Tokyo, for
/// [`assert_ts_in_each_zone`].
pub async fn utc_and_tokyo(memo: &PgmemoInstance, user: &str) -> (Client, Client) {
    let utc = memo.client(user, "postgres").await;
    let tokyo = memo.client(user, "postgres").await;
    utc.batch_execute("SET TimeZone = 'UTC'").await.unwrap();
    tokyo
        .batch_execute("SET TimeZone = 'Asia/Tokyo'")
        .await
        .unwrap();
    (utc, tokyo)
}

/// Asserts that the sessions of [`utc_and_tokyo`] read `ts` of row 1 of [`setup_with`]'s table
/// `t` as it was created (12:00 UTC), each in its own time zone: a result of one is never
/// served to the other.
pub async fn assert_ts_in_each_zone(utc: &Client, tokyo: &Client) {
    let q = "SELECT ts::text FROM t WHERE id = 1";
    assert_eq!(
        first(utc, q).await.as_deref(),
        Some("2024-01-01 12:00:00+00")
    );
    assert_eq!(
        first(tokyo, q).await.as_deref(),
        Some("2024-01-01 21:00:00+09")
    );
}

/// A cluster of its own with the table [`reads_never_stale`] works on: `kv (k, v)`, keys 0-19,
/// every value 0.
pub async fn kv_cluster() -> TempPostgres {
    let pg = TempPostgres::builder()
        .start()
        .await
        .expect("cluster starts");
    pg.psql("CREATE TABLE kv (k int PRIMARY KEY, v bigint NOT NULL); INSERT INTO kv SELECT g, 0 FROM generate_series(0, 19) g;")
        .await;
    pg
}

/// The first column of the first row of a simple query.
pub async fn first(client: &Client, sql: &str) -> Option<String> {
    client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).map(str::to_owned)),
            _ => None,
        })
        .flatten()
}

/// The rows of an admin console command, as text.
pub async fn admin_rows(memo: &PgmemoInstance, command: &str) -> Vec<Vec<Option<String>>> {
    let admin = memo.client("postgres", "pgmemo").await;
    let messages = admin
        .simple_query(command)
        .await
        .unwrap_or_else(|e| panic!("{command}: {e}"));
    rows(&messages)
}

/// One counter of the admin console's `SHOW CACHE`.
pub async fn show_cache(memo: &PgmemoInstance, name: &str) -> u64 {
    admin_rows(memo, "SHOW CACHE")
        .await
        .into_iter()
        .find(|r| r[0].as_deref() == Some(name))
        .and_then(|r| r[1].clone())
        .unwrap_or_else(|| panic!("SHOW CACHE has no {name}"))
        .parse()
        .unwrap()
}

/// `SHOW CACHE`'s count of requests refused for `reason` (a reason not seen yet is not
/// listed: 0).
pub async fn refused(memo: &PgmemoInstance, reason: &str) -> u64 {
    let name = format!("refused_{reason}");
    admin_rows(memo, "SHOW CACHE")
        .await
        .into_iter()
        .find(|r| r[0].as_deref() == Some(&name))
        .and_then(|r| r[1].clone())
        .map_or(0, |v| v.parse().unwrap())
}

/// How both pool modes begin their transaction tests, on row 2 of [`setup_with`]'s table `t`:
/// the read is cached; a transaction block that wrote reads its own write, not the cache; its
/// ROLLBACK invalidates nothing, so after a direct write (which pgmemo cannot see) the cached
/// value is still served. `c` goes through pgmemo, `direct` does not.
pub async fn a_rollback_invalidates_nothing(c: &Client, direct: &Client) {
    let q = "SELECT v FROM t WHERE id = 2";
    assert_eq!(first(c, q).await.as_deref(), Some("two"));
    assert_eq!(first(c, q).await.as_deref(), Some("two"));
    c.batch_execute("BEGIN; UPDATE t SET v = 'mine' WHERE id = 2")
        .await
        .unwrap();
    assert_eq!(first(c, q).await.as_deref(), Some("mine"));
    c.batch_execute("ROLLBACK").await.unwrap();
    direct
        .batch_execute("UPDATE t SET v = 'behind' WHERE id = 2")
        .await
        .unwrap();
    assert_eq!(
        first(c, q).await.as_deref(),
        Some("two"),
        "a rollback invalidates nothing"
    );
}

/// The staleness stress test: `clients` clients read and write the rows of
/// `kv (k int PRIMARY KEY, v bigint)` (20 rows, keys 0-19) through pgmemo for `duration`,
/// writes in autocommit and in explicit transactions, reads simple and prepared, in autocommit
/// and in read-only transaction blocks. Values only
/// grow, so a read that returns less than a write acknowledged before the read started is
/// stale. Returns (reads, writes).
pub async fn reads_never_stale(
    memo: &PgmemoInstance,
    clients: u64,
    duration: Duration,
) -> (u64, u64) {
    let floors: Arc<Vec<AtomicI64>> = Arc::new((0..20).map(|_| AtomicI64::new(0)).collect());
    let deadline = Instant::now() + duration;
    let mut tasks = Vec::new();
    for client_no in 0..clients {
        let c = memo.client("postgres", "postgres").await;
        let floors = Arc::clone(&floors);
        tasks.push(tokio::spawn(async move {
            let read = c.prepare("SELECT v FROM kv WHERE k = $1").await.unwrap();
            let mut x = client_no.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let (mut reads, mut writes) = (0u64, 0u64);
            while Instant::now() < deadline {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Key and operation from different bits: every key is both read and written.
                let k = ((x >> 40) % 20) as i32;
                if x % 10 == 0 {
                    let v: i64 = if (x >> 20) % 2 == 0 {
                        c.query_one("UPDATE kv SET v = v + 1 WHERE k = $1 RETURNING v", &[&k])
                            .await
                            .unwrap()
                            .get(0)
                    } else {
                        c.batch_execute("BEGIN").await.unwrap();
                        let sql = format!("UPDATE kv SET v = v + 1 WHERE k = {k} RETURNING v");
                        let v = first(&c, &sql).await.unwrap().parse().unwrap();
                        c.batch_execute("COMMIT").await.unwrap();
                        v
                    };
                    floors[k as usize].fetch_max(v, Ordering::SeqCst);
                    writes += 1;
                } else if x % 10 == 1 {
                    // Pipelined: tokio-postgres sends concurrent requests without waiting,
                    // a write among them at times.
                    let ks = [k, (k + 7) % 20, (k + 13) % 20];
                    let before: Vec<i64> = ks
                        .iter()
                        .map(|k| floors[*k as usize].load(Ordering::SeqCst))
                        .collect();
                    let (k0, k1) = (ks[0], ks[1]);
                    let write = format!("UPDATE kv SET v = v + 1 WHERE k = {k1}");
                    let bump = async {
                        if (x >> 20) % 3 == 0 {
                            c.batch_execute(&write).await.unwrap();
                        }
                    };
                    let simple = format!("SELECT v FROM kv WHERE k = {}", ks[2]);
                    let (p0, p1): (
                        [&(dyn tokio_postgres::types::ToSql + Sync); 1],
                        [&(dyn tokio_postgres::types::ToSql + Sync); 1],
                    ) = ([&k0], [&k1]);
                    let (a, b, (), d) = futures_util::join!(
                        c.query_one(&read, &p0),
                        c.query_one(&read, &p1),
                        bump,
                        first(&c, &simple),
                    );
                    let got: [i64; 3] = [
                        a.unwrap().get(0),
                        b.unwrap().get(0),
                        d.unwrap().parse().unwrap(),
                    ];
                    for ((k, v), floor) in ks.iter().zip(got).zip(before) {
                        assert!(
                            v >= floor,
                            "key {k}: pipelined read {v} after a write of {floor} was acknowledged"
                        );
                    }
                    reads += 3;
                } else {
                    let floor = floors[k as usize].load(Ordering::SeqCst);
                    let v: i64 = if x % 3 == 0 {
                        first(&c, &format!("SELECT v FROM kv WHERE k = {k}"))
                            .await
                            .unwrap()
                            .parse()
                            .unwrap()
                    } else if x % 3 == 1 {
                        // Inside a block that has not written: served and stored too.
                        c.batch_execute("BEGIN").await.unwrap();
                        let v = c.query_one(&read, &[&k]).await.unwrap().get(0);
                        c.batch_execute("COMMIT").await.unwrap();
                        v
                    } else {
                        c.query_one(&read, &[&k]).await.unwrap().get(0)
                    };
                    assert!(
                        v >= floor,
                        "key {k}: read {v} after a write of {floor} was acknowledged"
                    );
                    reads += 1;
                }
            }
            (reads, writes)
        }));
    }
    let (mut reads, mut writes) = (0, 0);
    for t in tasks {
        let (r, w) = t.await.unwrap();
        reads += r;
        writes += w;
    }
    (reads, writes)
}

/// A Parse of a statement name in use is refused by PostgreSQL (42P05), which keeps the old
/// statement; pgmemo must go on keying the name by its first text. Needs table `t` with rows
/// (1, 'one') and (2, 'two').
pub async fn a_name_in_use_keeps_its_statement(memo: &PgmemoInstance) {
    use crate::raw::*;
    let mut c = Raw::connect(memo.addr()).await;
    let one = "SELECT v FROM t WHERE id = 1 AND $1::int = 0";
    let two = "SELECT v FROM t WHERE id = 2 AND $1::int = 0";
    let run = |name: &str| vec![bind_named(name, &["0"]), execute(), sync()];
    let (tags, _) = c
        .round_trip(&[
            parse_named("s1", one, &[]),
            parse_named("s2", two, &[]),
            sync(),
        ])
        .await;
    assert_eq!(tags, vec!['1', '1', 'Z']);
    // Both results are cached.
    for _ in 0..2 {
        assert_eq!(c.round_trip(&run("s1")).await.1, vec!["one"]);
        assert_eq!(c.round_trip(&run("s2")).await.1, vec!["two"]);
    }
    // s1 again with s2's text: PostgreSQL refuses it and s1 stays what it was.
    let (tags, _) = c.round_trip(&[parse_named("s1", two, &[]), sync()]).await;
    assert_eq!(tags, vec!['E', 'Z']);
    assert_eq!(
        c.round_trip(&run("s1")).await.1,
        vec!["one"],
        "s1 still means its first text, from the cache or not"
    );
}

/// A Parse the server refused leaves no statement: a later Bind of its name gets PostgreSQL's
/// error, even once another client has cached a result for the same text.
pub async fn a_refused_parse_leaves_no_statement(memo: &PgmemoInstance) {
    use crate::raw::*;
    let text = "SELECT v FROM later WHERE id = $1";
    let mut a = Raw::connect(memo.addr()).await;
    let (tags, _) = a.round_trip(&[parse_named("s1", text, &[]), sync()]).await;
    assert_eq!(tags, vec!['E', 'Z'], "the table does not exist yet");
    let b = memo.client("postgres", "postgres").await;
    b.batch_execute(
        "CREATE TABLE later (id int PRIMARY KEY, v text); INSERT INTO later VALUES (1, 'x')",
    )
    .await
    .unwrap();
    // Another client caches the result of the same statement (same text, parameter types
    // and formats: the same key).
    let mut c = Raw::connect(memo.addr()).await;
    let (tags, _) = c.round_trip(&[parse_named("s9", text, &[]), sync()]).await;
    assert_eq!(tags, vec!['1', 'Z']);
    for _ in 0..2 {
        let (_, values) = c
            .round_trip(&[bind_named("s9", &["1"]), execute(), sync()])
            .await;
        assert_eq!(values, vec!["x"]);
    }
    let (tags, values) = a
        .round_trip(&[bind_named("s1", &["1"]), execute(), sync()])
        .await;
    assert_eq!(tags, vec!['E', 'Z'], "s1 does not exist: got {values:?}");
}

/// `cache_admission = auto` (the default), in table `t` (`id`, `v`) with rows 1 and 2, on
/// an instance whose `cache_costly_miss` no lookup reaches (so that the test does not depend
/// on how long a miss takes): a new statement's result is stored on its first miss, the same
/// statement's other keys from their second miss.
pub async fn admission_stores_cheap_results_from_their_second_miss(memo: &PgmemoInstance) {
    let c = memo.client("postgres", "postgres").await;
    let hits = || show_cache(memo, "hits");
    first(&c, "SELECT v FROM t WHERE id = 1").await;
    let h = hits().await;
    first(&c, "SELECT v FROM t WHERE id = 1").await;
    assert_eq!(hits().await, h + 1, "a new statement is stored at once");
    let skips = show_cache(memo, "admission_skips").await;
    first(&c, "SELECT v FROM t WHERE id = 2").await;
    first(&c, "SELECT v FROM t WHERE id = 2").await;
    assert_eq!(hits().await, h + 1, "second miss, stored now");
    assert_eq!(show_cache(memo, "admission_skips").await, skips + 1);
    first(&c, "SELECT v FROM t WHERE id = 2").await;
    assert_eq!(hits().await, h + 2, "then served");
}

/// With the default `cache_costly_miss` (1 ms), a statement whose misses take far longer
/// (tens of milliseconds) has its results stored on every first miss.
pub async fn admission_stores_costly_results_at_once(memo: &PgmemoInstance) {
    let c = memo.client("postgres", "postgres").await;
    let slow = |n: u32| {
        format!(
            "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 100000)
             SELECT count(*) FROM r WHERE x > {n}"
        )
    };
    first(&c, &slow(1)).await;
    first(&c, &slow(2)).await;
    let h = show_cache(memo, "hits").await;
    first(&c, &slow(2)).await;
    assert_eq!(
        show_cache(memo, "hits").await,
        h + 1,
        "a costly result is stored on its first miss"
    );
}

/// Creates table `table (id int PRIMARY KEY, v text)` holding `(1, 'old')` through pgmemo and
/// reads the row until it is served from the cache; returns the reading session and its query.
async fn cached_row(memo: &PgmemoInstance, table: &str) -> (Client, String) {
    let reader = memo.client("postgres", "postgres").await;
    reader
        .batch_execute(&format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, v text);
             INSERT INTO {table} VALUES (1, 'old');"
        ))
        .await
        .unwrap();
    let read = format!("SELECT v FROM {table} WHERE id = 1");
    assert_eq!(first(&reader, &read).await.as_deref(), Some("old"));
    let hits = show_cache(memo, "hits").await;
    assert_eq!(first(&reader, &read).await.as_deref(), Some("old"));
    assert_eq!(
        show_cache(memo, "hits").await,
        hits + 1,
        "the read is cached"
    );
    (reader, read)
}

/// Turns the cache on or off by a reload, as SIGHUP or `RELOAD` would.
pub fn reload_cache(memo: &PgmemoInstance, on: bool) {
    let mut config = (**memo.handle().shared().config()).clone();
    config.cache = if on {
        pgmemo::config::Switch::On
    } else {
        pgmemo::config::Switch::Off
    };
    memo.handle().reload(config).expect("reload");
}

/// A session that starts while the cache is off relays its traffic untracked, so its writes
/// invalidate nothing: once the cache is back on, no result cached before those writes is
/// served, while that session runs or after it ended, and caching resumes once it has.
/// `memo` runs with the cache on and without a replication feed.
pub async fn untracked_writes_never_leave_stale_results(memo: &PgmemoInstance) {
    let (reader, read) = cached_row(memo, "untracked").await;

    reload_cache(memo, false);
    let writer = memo.client("postgres", "postgres").await;
    writer
        .simple_query("UPDATE untracked SET v = 'new' WHERE id = 1")
        .await
        .unwrap();
    reload_cache(memo, true);

    // The session that cached the old value, and a new one, while the writer is connected.
    assert_eq!(first(&reader, &read).await.as_deref(), Some("new"));
    let fresh = memo.client("postgres", "postgres").await;
    assert_eq!(first(&fresh, &read).await.as_deref(), Some("new"));
    assert!(
        show_cache(memo, "refused_untracked_sessions").await > 0,
        "counted as refusals"
    );

    // After the writer left: still the new value, and cached again.
    drop(writer);
    testkit::assert_eventually(Duration::from_secs(10), "caching resumes", || async {
        let before = show_cache(memo, "hits").await;
        let values = (first(&fresh, &read).await, first(&fresh, &read).await);
        assert_eq!(values, (Some("new".into()), Some("new".into())));
        show_cache(memo, "hits").await > before
    })
    .await;
}

/// A reload that turns the cache off for one database through its `[databases]` entry stops
/// sessions already connected to it from serving results, as the global switch does. `memo`
/// runs with the cache on and without a replication feed; `direct` is a connection to the
/// server that pgmemo does not see.
pub async fn a_reload_turning_a_database_off_stops_running_sessions(
    memo: &PgmemoInstance,
    direct: &Client,
) {
    let reader = memo.client("postgres", "postgres").await;
    reader
        .batch_execute(
            "CREATE TABLE per_db (id int PRIMARY KEY, v text);
             INSERT INTO per_db VALUES (1, 'old');",
        )
        .await
        .unwrap();
    let read = "SELECT v FROM per_db WHERE id = 1";
    assert_eq!(first(&reader, read).await.as_deref(), Some("old"));
    direct
        .simple_query("UPDATE per_db SET v = 'new' WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(
        first(&reader, read).await.as_deref(),
        Some("old"),
        "served from the cache (pgmemo did not see the write)"
    );

    let mut config = (**memo.handle().shared().config()).clone();
    config.databases.insert(
        "postgres".into(),
        pgmemo::config::DatabaseConfig {
            cache: Some(pgmemo::config::Switch::Off),
            ..Default::default()
        },
    );
    memo.handle().reload(config).expect("reload");
    assert_eq!(first(&reader, read).await.as_deref(), Some("new"));
}

/// A reload that excludes a table from the cache stops results reading it from being served
/// or stored, for sessions already running too (their plans were memoized with the old
/// lists). `memo` runs with the cache on and without a replication feed; `direct` is a
/// connection to the server that pgmemo does not see.
pub async fn a_reload_excluding_a_table_stops_caching_it(memo: &PgmemoInstance, direct: &Client) {
    let (reader, read, bump) = stale_cached_read(memo, direct, "excluded_later").await;
    let (read, bump) = (read.as_str(), bump.as_str());
    let mut config = (**memo.handle().shared().config()).clone();
    config.cache_exclude_tables = vec!["public.excluded_later".into()];
    memo.handle().reload(config).expect("reload");
    assert_eq!(first(&reader, read).await.as_deref(), Some("1"));
    for expected in ["2", "3"] {
        direct.simple_query(bump).await.unwrap();
        assert_eq!(first(&reader, read).await.as_deref(), Some(expected));
        assert_eq!(first(&reader, read).await.as_deref(), Some(expected));
    }
}

/// A reload that changes `cache_ttl` or `cache_table_ttl` empties the cache: a TTL is fixed
/// on an entry when it is stored, and one set to bound the staleness of writes pgmemo does
/// not see must bind the results stored before it too.
pub async fn a_reload_changing_a_ttl_empties_the_cache(memo: &PgmemoInstance, direct: &Client) {
    let (reader, read, _) = stale_cached_read(memo, direct, "ttl_later").await;
    let mut config = (**memo.handle().shared().config()).clone();
    config.cache_table_ttl.insert(
        "public.ttl_later".into(),
        pgmemo::config::Seconds(std::time::Duration::from_secs(3600)),
    );
    memo.handle().reload(config).expect("reload");
    assert_eq!(first(&reader, &read).await.as_deref(), Some("1"));
}

/// A new table `table` whose row `id = 1` pgmemo serves from its cache as `v = 0` after a
/// write it did not see (made through `direct`) set it to 1: the reading client, the read
/// and the write that bumps `v`.
async fn stale_cached_read(
    memo: &PgmemoInstance,
    direct: &Client,
    table: &str,
) -> (Client, String, String) {
    let reader = memo.client("postgres", "postgres").await;
    reader
        .batch_execute(&format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, v int);
             INSERT INTO {table} VALUES (1, 0);"
        ))
        .await
        .unwrap();
    let read = format!("SELECT v FROM {table} WHERE id = 1");
    let bump = format!("UPDATE {table} SET v = v + 1 WHERE id = 1");
    assert_eq!(first(&reader, &read).await.as_deref(), Some("0"));
    direct.simple_query(&bump).await.unwrap();
    assert_eq!(
        first(&reader, &read).await.as_deref(),
        Some("0"),
        "served from the cache (pgmemo did not see the write)"
    );
    (reader, read, bump)
}

/// `SET pgmemo.cache = off` stops a session's own reads from being served or stored, not the
/// tracking of its writes: another session's cached result of a table it changes goes.
pub async fn writes_of_a_session_with_the_cache_off_still_invalidate(memo: &PgmemoInstance) {
    let (reader, read) = cached_row(memo, "switched").await;

    let writer = memo.client("postgres", "postgres").await;
    writer
        .batch_execute("SET pgmemo.cache = off")
        .await
        .unwrap();
    writer
        .batch_execute("UPDATE switched SET v = 'autocommit' WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(first(&reader, &read).await.as_deref(), Some("autocommit"));
    assert_eq!(first(&reader, &read).await.as_deref(), Some("autocommit"));
    writer
        .batch_execute("BEGIN; UPDATE switched SET v = 'committed' WHERE id = 1; COMMIT")
        .await
        .unwrap();
    assert_eq!(first(&reader, &read).await.as_deref(), Some("committed"));
}

/// `Parse Bind Describe(statement) Execute Sync` with every parameter type given (what
/// tokio-postgres' `query_typed` sends) is cached: the answers, a hit's included, are byte for
/// byte what PostgreSQL sends (ParameterDescription, the statement's RowDescription with
/// format codes zero, binary rows), and the entry also answers the same batch describing the
/// portal (its RowDescription then carries the Bind's formats). A Parse that leaves a type
/// to the server is never cached this way. `pg` is the cluster of [`setup_with`].
pub async fn statement_described_batches_are_cached(
    memo: &PgmemoInstance,
    pg: &TempPostgres,
    direct: &Client,
) {
    use crate::raw::{
        bind_results, describe_portal, describe_statement, execute, parse, sync, Raw,
    };
    let text = "SELECT v, id FROM t WHERE id = $1";
    let batch = |types: &[u32], describe: Vec<u8>| {
        vec![
            parse(text, types),
            bind_results(&["1"], &[1]),
            describe,
            execute(),
            sync(),
        ]
    };
    let typed = batch(&[23], describe_statement());
    let by_portal = batch(&[23], describe_portal());
    let untyped = batch(&[0], describe_statement());
    let pg_addr: std::net::SocketAddr = ([127, 0, 0, 1], pg.port()).into();
    let mut at_server = Raw::connect(pg_addr).await;
    let want_typed = at_server.round_trip_bytes(&typed).await;
    let want_by_portal = at_server.round_trip_bytes(&by_portal).await;
    let want_untyped = at_server.round_trip_bytes(&untyped).await;

    let mut r = Raw::connect(memo.addr()).await;
    for _ in 0..3 {
        assert_eq!(r.round_trip_bytes(&typed).await, want_typed);
        assert_eq!(r.round_trip_bytes(&untyped).await, want_untyped);
    }
    let hits = show_cache(memo, "hits").await;
    direct
        .batch_execute("UPDATE t SET v = 'changed' WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(
        r.round_trip_bytes(&typed).await,
        want_typed,
        "a hit answers as PostgreSQL did"
    );
    assert_eq!(
        r.round_trip_bytes(&by_portal).await,
        want_by_portal,
        "the entry answers the portal's Describe too"
    );
    assert_eq!(show_cache(memo, "hits").await, hits + 2);
    assert_ne!(
        r.round_trip_bytes(&untyped).await,
        want_untyped,
        "a type left to the server: not cached"
    );

    // The driver that sends this form decodes the answers.
    let c = memo.client("postgres", "postgres").await;
    let typed_read = |id: i32| {
        let c = &c;
        async move {
            c.query_typed(
                "SELECT v FROM t WHERE id = $1",
                &[(&id, tokio_postgres::types::Type::INT4)],
            )
            .await
            .unwrap()[0]
                .get::<_, String>(0)
        }
    };
    for _ in 0..3 {
        assert_eq!(typed_read(2).await, "two");
    }
    direct
        .batch_execute("UPDATE t SET v = 'deux' WHERE id = 2")
        .await
        .unwrap();
    assert_eq!(typed_read(2).await, "two", "served from the cache");
}

/// Reads pipelined behind other reads (sent before the answers before them arrived) are
/// answered from the cache in their turn and stored when they miss, in simple and extended
/// protocol, also behind a read that fails; a read pipelined behind a write is not served
/// from a result the write made stale. Needs `cache_admission = "always"` (every miss stored
/// at once). `direct` writes without pgmemo seeing it: a read that still returns the old
/// value afterwards was served from the cache.
pub async fn pipelined_misses_are_stored(memo: &PgmemoInstance, direct: &Client) {
    use crate::raw::*;
    direct
        .batch_execute("INSERT INTO t (id, v) VALUES (3, 'three'), (4, 'four'), (5, 'five')")
        .await
        .unwrap();
    let read = |id: u32| query(&format!("SELECT v FROM t WHERE id = {id}"));
    let mut c = Raw::connect(memo.addr()).await;
    // The statement's shape is planned at a request boundary first (a pipelined request is
    // never planned with the catalog).
    assert_eq!(c.round_trip(&[read(1)]).await.1, ["one"]);
    let bad = || query("SELECT v::int FROM t WHERE id = 1");
    assert!(c.round_trip(&[bad()]).await.0.contains(&'E'));
    // A read never stored (its text reads the clock).
    let clock = || query("SELECT v FROM t WHERE id = 2 AND ts < 'now'");
    assert_eq!(c.round_trip(&[clock()]).await.1, ["two"]);
    // One write: a miss, a hit, a read not stored, two more misses; then a failing read and
    // two more.
    let pipeline = [
        read(2),
        read(1),
        clock(),
        read(3),
        read(4),
        bad(),
        read(1),
        read(5),
    ];
    let mut answers = Vec::new();
    for i in 0..pipeline.len() {
        let (tags, v) = c.round_trip(if i == 0 { &pipeline } else { &[] }).await;
        answers.push((tags.contains(&'E'), v));
    }
    let expected = [
        (false, vec!["two"]),
        (false, vec!["one"]),
        (false, vec!["two"]),
        (false, vec!["three"]),
        (false, vec!["four"]),
        (true, vec![]),
        (false, vec!["one"]),
        (false, vec!["five"]),
    ];
    let expected: Vec<(bool, Vec<String>)> = expected
        .into_iter()
        .map(|(e, v)| (e, v.into_iter().map(str::to_owned).collect()))
        .collect();
    assert_eq!(answers, expected, "simple protocol, in order");
    // Extended protocol: a named statement executed once at a boundary, then pipelined.
    let s = "SELECT v FROM t WHERE id = $1 AND v IS NOT NULL";
    c.round_trip(&[parse_named("s", s, &[23]), sync()]).await;
    let exec = |id: &str| [bind_named("s", &[id]), execute(), sync()].concat();
    assert_eq!(c.round_trip(&[exec("1")]).await.1, ["one"]);
    let pipeline = [exec("2"), exec("1"), exec("3"), exec("4"), exec("5")];
    let (_, v) = c.round_trip(&pipeline).await;
    let mut values = v;
    for _ in 1..pipeline.len() {
        values.extend(c.round_trip(&[]).await.1);
    }
    assert_eq!(
        values,
        ["two", "one", "three", "four", "five"],
        "extended protocol, in order"
    );
    direct
        .batch_execute("UPDATE t SET v = v || '+'")
        .await
        .unwrap();
    for (id, old) in [(2, "two"), (3, "three"), (4, "four"), (5, "five")] {
        assert_eq!(
            c.round_trip(&[read(id)]).await.1,
            [old],
            "the pipelined simple read of row {id} was stored as its own"
        );
        assert_eq!(
            c.round_trip(&[exec(&id.to_string())]).await.1,
            [old],
            "the pipelined execution for row {id} was stored as its own"
        );
    }
    // A read pipelined behind a write is not answered from the cache: the write's commit
    // will have made the stored result stale by the time the read would run.
    let (_, v) = c
        .round_trip(&[query("UPDATE t SET v = 'cinq' WHERE id = 5"), read(5)])
        .await;
    assert!(v.is_empty());
    assert_eq!(c.round_trip(&[]).await.1, ["cinq"]);
    assert_eq!(c.round_trip(&[read(5)]).await.1, ["cinq"]);
}

/// Inside a transaction block, a read pipelined behind the block's own write (sent before that
/// write was answered) sees the write: it is neither answered from the cache nor stored (what
/// it reads is uncommitted, and the ROLLBACK below undoes it).
pub async fn a_read_pipelined_behind_a_write_in_a_block_sees_the_write(memo: &PgmemoInstance) {
    use crate::raw::*;
    let read = |id: u32| query(&format!("SELECT v FROM t WHERE id = {id}"));
    let mut c = Raw::connect(memo.addr()).await;
    let s = "SELECT v FROM t WHERE id = $1 AND v IS NOT NULL";
    c.round_trip(&[parse_named("s", s, &[23]), sync()]).await;
    let exec = |id: &str| [bind_named("s", &[id]), execute(), sync()].concat();
    // Row 2 is cached, in both protocols (a cheap result is stored from its second miss).
    for _ in 0..3 {
        assert_eq!(c.round_trip(&[read(2)]).await.1, ["two"]);
        assert_eq!(c.round_trip(&[exec("2")]).await.1, ["two"]);
    }
    c.round_trip(&[query("BEGIN")]).await;
    let write = |id: u32, v: &str| query(&format!("UPDATE t SET v = '{v}' WHERE id = {id}"));
    // Cached, but the block changed the row: not served from the cache.
    c.round_trip(&[write(2, "x"), read(2)]).await;
    assert_eq!(c.round_trip(&[]).await.1, ["x"], "simple protocol");
    c.round_trip(&[write(2, "y"), exec("2")]).await;
    assert_eq!(c.round_trip(&[]).await.1, ["y"], "extended protocol");
    // Not cached: read from the server, and what it saw must not be stored.
    for _ in 0..2 {
        c.round_trip(&[write(1, "uncommitted"), read(1)]).await;
        assert_eq!(c.round_trip(&[]).await.1, ["uncommitted"]);
        c.round_trip(&[write(1, "uncommitted"), exec("1")]).await;
        assert_eq!(c.round_trip(&[]).await.1, ["uncommitted"]);
    }
    c.round_trip(&[query("ROLLBACK")]).await;
    for _ in 0..2 {
        assert_eq!(c.round_trip(&[read(1)]).await.1, ["one"]);
        assert_eq!(c.round_trip(&[exec("1")]).await.1, ["one"]);
        assert_eq!(c.round_trip(&[read(2)]).await.1, ["two"]);
        assert_eq!(c.round_trip(&[exec("2")]).await.1, ["two"]);
    }
}

/// A row-limited Execute of a cached statement is neither answered with the whole result nor
/// stored (refusal `portal_suspension`); a named portal run whole, and reads executed in a
/// batch with more than one Execute, are not batches the cache keys (`unsupported_batch`).
/// Each is answered fresh after a direct write. `c` goes through pgmemo.
pub async fn row_limited_and_unkeyed_executions_are_refused(
    memo: &PgmemoInstance,
    c: &mut Client,
    direct: &Client,
) {
    // The whole result is cached; a row-limited Execute of the same statement must neither be
    // answered with it (a different response: all rows, no PortalSuspended) nor store its own.
    let stmt = c.prepare("SELECT v FROM t WHERE id = $1").await.unwrap();
    async fn get(c: &Client, s: &tokio_postgres::Statement) -> String {
        c.query_one(s, &[&1i32]).await.unwrap().get::<_, String>(0)
    }
    let cached = get(c, &stmt).await;
    assert_eq!(get(c, &stmt).await, cached);
    let hits = show_cache(memo, "hits").await;
    assert_eq!(get(c, &stmt).await, cached);
    assert_eq!(
        show_cache(memo, "hits").await,
        hits + 1,
        "the whole result is cached"
    );
    for round in 0..3 {
        let tx = c.transaction().await.unwrap();
        let portal = tx.bind(&stmt, &[&1i32]).await.unwrap();
        let rows = tx.query_portal(&portal, 1).await.unwrap();
        tx.commit().await.unwrap();
        let got: Option<String> = rows[0].get(0);
        let fresh = first(direct, "SELECT v FROM t WHERE id = 1").await;
        assert_eq!(got, fresh, "Execute with max_rows 1, round {round}");
        direct
            .batch_execute("UPDATE t SET v = v || '+' WHERE id = 1")
            .await
            .unwrap();
    }
    assert!(show_cache(memo, "refused_portal_suspension").await > 0);
    // A named portal run whole is not a batch the cache keys either.
    let tx = c.transaction().await.unwrap();
    let portal = tx.bind(&stmt, &[&1i32]).await.unwrap();
    let rows = tx.query_portal(&portal, 0).await.unwrap();
    tx.commit().await.unwrap();
    let fresh = first(direct, "SELECT v FROM t WHERE id = 1").await;
    assert_eq!(rows[0].get::<_, Option<String>>(0), fresh, "a named portal");
    assert!(show_cache(memo, "refused_unsupported_batch").await > 0);
    // Two reads executed before one Sync.
    {
        use crate::raw::*;
        let mut raw = Raw::connect(memo.addr()).await;
        let s = "SELECT v FROM t WHERE id = $1";
        raw.round_trip(&[parse_named("two", s, &[23]), sync()])
            .await;
        // A cacheable read first: transaction pooling reads the client's settings for it.
        raw.round_trip(&[query("SELECT v FROM t WHERE id = 2")])
            .await;
        let batch = [
            bind_named("two", &["1"]),
            execute(),
            bind_named("two", &["2"]),
            execute(),
            sync(),
        ];
        // The first run plans the statement (transaction pooling: after the transaction).
        raw.round_trip(&batch).await;
        let before = show_cache(memo, "refused_unsupported_batch").await;
        direct
            .batch_execute("UPDATE t SET v = v || '+' WHERE id = 1")
            .await
            .unwrap();
        let (_, v) = raw.round_trip(&batch).await;
        let mut fresh = Vec::new();
        for id in [1, 2] {
            let sql = format!("SELECT v FROM t WHERE id = {id}");
            fresh.push(first(direct, &sql).await.unwrap());
        }
        assert_eq!(v, fresh);
        assert_eq!(
            show_cache(memo, "refused_unsupported_batch").await,
            before + 2,
            "each read of the batch"
        );
    }
}

/// Tables `a` and `b` where each insert into `a` bumps `b`'s one counter from a trigger: a
/// write pgmemo relays (into `a`) that changes a table it cannot attribute the write to (`b`).
pub async fn trigger_tables(pg: &TempPostgres) {
    pg.psql(
        "CREATE TABLE a (id int PRIMARY KEY);
         CREATE TABLE b (id int PRIMARY KEY, n int);
         INSERT INTO b VALUES (1, 0);
         CREATE FUNCTION bump() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN UPDATE b SET n = n + 1; RETURN NEW; END $$;
         CREATE TRIGGER a_bumps_b AFTER INSERT ON a FOR EACH ROW EXECUTE FUNCTION bump();",
    )
    .await;
}

/// A session waiting for another session's fill of the same key (single flight) is, as far
/// as its client knows, running its statement: a cancel answers it at once with 57014
/// instead of after the fill (session pooling: its server is idle, and PostgreSQL would
/// ignore the cancel), the session goes on, and the fill goes on for the session that leads
/// it.
pub async fn a_cancel_while_waiting_for_another_sessions_fill_answers_at_once(
    pg: &TempPostgres,
    memo: &PgmemoInstance,
    direct: &Client,
) {
    create_slow_function(pg).await;
    // Planned, and slow enough to be worth a single flight.
    let warm = memo.client("postgres", "postgres").await;
    let slow = |n: u32| format!("SELECT v, slow({n}) FROM t WHERE id = 1");
    assert_eq!(first(&warm, &slow(2)).await.as_deref(), Some("one"));
    let leader = memo.client("postgres", "postgres").await;
    let follower = Arc::new(memo.client("postgres", "postgres").await);
    first(&leader, "SELECT 1").await;
    first(&follower, "SELECT 1").await;

    // The leader's read waits for a lock, so its fill lasts until the test ends it.
    direct
        .batch_execute("BEGIN; LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let q = slow(3);
    let leading = tokio::spawn({
        let q = q.clone();
        async move { first(&leader, &q).await }
    });
    await_lock_wait(direct, "%slow(3) FROM t%", "the fill waits").await;
    let token = follower.cancel_token();
    let following = tokio::spawn({
        let (q, follower) = (q.clone(), follower.clone());
        async move { follower.simple_query(&q).await.map(|_| ()) }
    });
    let err = cancel_the_waiting_follower(memo, &token, following).await;
    assert_eq!(testkit::sqlstate(&err), Some("57014"), "{err}");
    assert_eq!(show_cache(memo, "flight_waiting").await, 0);
    assert_eq!(
        first(&follower, "SELECT 'in step'").await.as_deref(),
        Some("in step"),
        "the follower's session goes on"
    );

    direct.batch_execute("COMMIT").await.unwrap();
    assert_eq!(leading.await.unwrap().as_deref(), Some("one"));
    // The follower's cancel stopped nothing else: its statement is answered from the fill.
    assert_eq!(first(&follower, &q).await.as_deref(), Some("one"));
}

/// Session pooling: a cancel while an extended-protocol batch, or a statement inside a
/// transaction block, waits for another session's fill of the same key cancels the statement
/// without running it (nothing is left for the server to run: a cancel sent there would
/// stop nothing); inside a block it fails the block, as it would without pgmemo.
pub async fn a_cancel_while_waiting_for_a_fill_cancels_batches_and_blocks(
    pg: &TempPostgres,
    memo: &PgmemoInstance,
    direct: &Client,
) {
    create_slow_function(pg).await;
    let warm = memo.client("postgres", "postgres").await;
    let slow = |n: i32| format!("SELECT v, slow({n}) FROM t WHERE id = 1");
    assert_eq!(first(&warm, &slow(2)).await.as_deref(), Some("one"));
    let leader = Arc::new(memo.client("postgres", "postgres").await);
    let follower = Arc::new(memo.client("postgres", "postgres").await);
    first(&follower, "SELECT 1").await;
    // Prepared before the table is locked: a Parse would wait for the lock on the server.
    // The follower's first execution takes the general path, its second the quick one for a
    // statement whose plan is known.
    let parameterized = "SELECT v, slow($1) FROM t WHERE id = 1";
    let statements = (
        leader.prepare(parameterized).await.unwrap(),
        follower.prepare(parameterized).await.unwrap(),
    );
    for (n, how) in [
        (3i32, "extended"),
        (4, "simple in a block"),
        (5, "extended in a block"),
    ] {
        let q = slow(n);
        let prepared = (!how.starts_with("simple")).then(|| statements.clone());
        direct
            .batch_execute("BEGIN; LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
            .await
            .unwrap();
        // The same request as the follower's (a Query and an Execute are keyed apart).
        let leading = tokio::spawn({
            let (q, leader, prepared) = (q.clone(), leader.clone(), prepared.clone());
            async move {
                match prepared {
                    None => first(&leader, &q).await,
                    Some((statement, _)) => {
                        let rows = leader.query(&statement, &[&n]).await.unwrap();
                        rows[0].get::<_, Option<String>>(0)
                    }
                }
            }
        });
        let running = if prepared.is_some() {
            parameterized.to_owned()
        } else {
            q.clone()
        };
        await_lock_wait(direct, &running, "the fill waits").await;
        let in_block = how.ends_with("in a block");
        if in_block {
            follower.batch_execute("BEGIN").await.unwrap();
        }
        let token = follower.cancel_token();
        let following = tokio::spawn({
            let (q, follower, prepared) = (q.clone(), follower.clone(), prepared.clone());
            async move {
                match prepared {
                    None => follower.simple_query(&q).await.map(|_| ()),
                    Some((_, statement)) => follower.query(&statement, &[&n]).await.map(|_| ()),
                }
            }
        });
        let err = cancel_the_waiting_follower(memo, &token, following).await;
        assert_eq!(testkit::sqlstate(&err), Some("57014"), "{how}: {err}");
        if in_block {
            let err = follower.simple_query("SELECT 1").await.unwrap_err();
            assert_eq!(testkit::sqlstate(&err), Some("25P02"), "{how}: {err}");
            follower.batch_execute("ROLLBACK").await.unwrap();
        }
        assert_in_step(&follower).await;
        direct.batch_execute("COMMIT").await.unwrap();
        assert_eq!(leading.await.unwrap().as_deref(), Some("one"), "{how}");
    }
}

/// Waits until the statement that `following` runs waits for another session's fill, cancels it
/// with `token`, and returns its error, which must come without waiting for the fill.
async fn cancel_the_waiting_follower(
    memo: &PgmemoInstance,
    token: &tokio_postgres::CancelToken,
    following: tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
) -> tokio_postgres::Error {
    testkit::assert_eventually(Duration::from_secs(10), "the follower waits", || async {
        show_cache(memo, "flight_waiting").await == 1
    })
    .await;
    token.cancel_query(tokio_postgres::NoTls).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), following)
        .await
        .expect("the cancel waited for the fill")
        .unwrap()
        .expect_err("the follower's statement was cancelled")
}

/// A cancel while pgmemo looks up a new statement's tables on the server (the lookup waits
/// for a lock on a catalog here) answers the statement with 57014 once the lookup is done,
/// without running it: sent on to the server, it would stop the lookup instead, and the
/// statement would then run to its end. The session goes on, and the statement runs normally
/// when asked again. (A simple Query outside a transaction block: what session pooling
/// answers so.)
pub async fn a_cancel_during_catalog_lookups_cancels_the_statement(
    memo: &PgmemoInstance,
    direct: &Client,
) -> Arc<Client> {
    let c = Arc::new(memo.client("postgres", "postgres").await);
    first(&c, "SELECT 1").await;
    let q = "SELECT v FROM t WHERE id = 2 AND v <> 'looked up'";
    let simple = {
        let c = c.clone();
        async move { c.simple_query(q).await.map(|_| ()) }
    };
    let err = cancelled_during_lookup(direct, &c, simple).await;
    assert_eq!(testkit::sqlstate(&err), Some("57014"), "{err}");
    assert_eq!(
        first(&c, "SELECT 'in step'").await.as_deref(),
        Some("in step"),
        "the session goes on"
    );
    assert_eq!(first(&c, q).await.as_deref(), Some("two"));
    c
}

/// [`a_cancel_during_catalog_lookups_cancels_the_statement`] for extended-protocol batches,
/// which pgmemo does not answer itself: prepared, then executed; and Parse Bind Describe
/// Execute Sync in one. Each statement sleeps 3 s when it runs, so a lost cancel fails the
/// test; each has a shape of its own, so each is looked up.
pub async fn a_cancel_during_catalog_lookups_cancels_batches(c: &Arc<Client>, direct: &Client) {
    let prepared = {
        let (c, q) = (c.clone(), sleeper(", 1"));
        async move { c.query(&q, &[]).await.map(|_| ()) }
    };
    let err = cancelled_during_lookup(direct, c, prepared).await;
    assert_eq!(testkit::sqlstate(&err), Some("57014"), "prepared: {err}");
    assert_in_step(c).await;

    let typed = {
        let (c, q) = (c.clone(), sleeper(", 1, 2"));
        async move { c.query_typed(&q, &[]).await.map(|_| ()) }
    };
    let err = cancelled_during_lookup(direct, c, typed).await;
    assert_eq!(testkit::sqlstate(&err), Some("57014"), "typed: {err}");
    assert_in_step(c).await;
}

/// Session pooling looks statements up inside transaction blocks too: a cancel meanwhile
/// cancels the statement (simple Query, or an extended-protocol batch) and fails the block,
/// as it would without pgmemo.
pub async fn a_cancel_during_catalog_lookups_in_a_block_fails_the_block(
    c: &Arc<Client>,
    direct: &Client,
) {
    for (how, extra) in [("simple", ", 1, 2, 3"), ("extended", ", 1, 2, 3, 4")] {
        c.batch_execute("BEGIN").await.unwrap();
        let statement = {
            let (c, q) = (c.clone(), sleeper(extra));
            async move {
                if how == "simple" {
                    c.simple_query(&q).await.map(|_| ())
                } else {
                    c.query(&q, &[]).await.map(|_| ())
                }
            }
        };
        let err = cancelled_during_lookup(direct, c, statement).await;
        assert_eq!(testkit::sqlstate(&err), Some("57014"), "{how}: {err}");
        let err = c.simple_query("SELECT 1").await.unwrap_err();
        assert_eq!(
            testkit::sqlstate(&err),
            Some("25P02"),
            "{how}: the cancel failed the block: {err}"
        );
        c.batch_execute("ROLLBACK").await.unwrap();
        assert_in_step(c).await;
    }
}

/// A statement of table `t` that sleeps 3 s, with `extra` columns (which give it a shape of
/// its own).
fn sleeper(extra: &str) -> String {
    format!("SELECT v, pg_sleep(3)::text{extra} FROM t WHERE id = 2")
}

/// The session answers a statement after a cancelled one.
async fn assert_in_step(c: &Client) {
    assert_eq!(
        first(c, "SELECT 'in step'").await.as_deref(),
        Some("in step"),
        "the session goes on"
    );
}

/// Runs `statement` (of client `c`, a statement pgmemo has not planned) while `direct` holds
/// a lock the catalog lookup needs, cancels it once the lookup waits, lets the lookup go on,
/// and returns the statement's error.
pub async fn cancelled_during_lookup(
    direct: &Client,
    c: &Client,
    statement: impl std::future::Future<Output = Result<(), tokio_postgres::Error>> + Send + 'static,
) -> tokio_postgres::Error {
    direct
        .batch_execute("BEGIN; LOCK TABLE pg_catalog.pg_inherits IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let token = c.cancel_token();
    let running = tokio::spawn(statement);
    await_lock_wait(direct, "/* pgmemo catalog lookup */%", "the lookup waits").await;
    token.cancel_query(tokio_postgres::NoTls).await.unwrap();
    direct.batch_execute("COMMIT").await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the statement ended")
        .unwrap()
        .expect_err("the statement was cancelled")
}

/// Waits until exactly one session waits for a lock while running a statement `LIKE like`,
/// as `direct` sees it. `direct` may be inside a transaction (holding that lock): there
/// pg_stat_activity is read once, so the snapshot is cleared before each look.
async fn await_lock_wait(direct: &Client, like: &str, what: &str) {
    testkit::assert_eventually(Duration::from_secs(10), what, || async {
        direct
            .batch_execute("SELECT pg_stat_clear_snapshot()")
            .await
            .unwrap();
        let waiting = direct
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND query LIKE $1",
                &[&like],
            )
            .await
            .unwrap();
        waiting.get::<_, i64>(0) == 1
    })
    .await;
}

/// A slow cacheable read: `slow(x)` is declared IMMUTABLE and sleeps 0.6 s. Creates it.
pub async fn create_slow_function(pg: &TempPostgres) {
    pg.psql(
        "CREATE FUNCTION slow(x int) RETURNS int IMMUTABLE LANGUAGE plpgsql AS
         $$ BEGIN PERFORM pg_sleep(0.6); RETURN x; END $$;",
    )
    .await;
}

/// A miss pipelined behind another request never waits for another session's fill of the
/// same key (docs/cache.md): its answer must keep its place, so it runs on the server itself.
/// A request at a boundary does wait (the control, counted in `flight_waits`).
// `start_fill` returns the fill's task handle on purpose: it is awaited after the reads.
#[allow(clippy::async_yields_async)]
pub async fn a_pipelined_miss_does_not_wait_for_another_sessions_fill(
    memo: &PgmemoInstance,
    pg: &TempPostgres,
    direct: &Client,
) {
    use crate::raw::*;
    create_slow_function(pg).await;
    // The shape is planned (and its cost learnt) at a boundary first: a pipelined statement
    // of a shape never planned is forwarded whatever the flights.
    let warm = memo.client("postgres", "postgres").await;
    first(&warm, "SELECT v, slow(2) FROM t WHERE id = 1").await;
    // A session that learnt its context first (transaction pooling reads it on a server once,
    // so that its read is looked up before it takes a server) starts filling the key of
    // `slow(n)`; returns once its read runs on the server.
    let start_fill = |n: u32| async move {
        let c = memo.client("postgres", "postgres").await;
        first(&c, "SELECT 1").await;
        let fill = tokio::spawn(async move {
            first(&c, &format!("SELECT v, slow({n}) FROM t WHERE id = 1")).await
        });
        let running = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
             AND query LIKE '%slow({n}) FROM t%' AND pid <> pg_backend_pid()"
        );
        testkit::assert_eventually(Duration::from_secs(10), "the fill runs", || async {
            first(direct, &running).await.as_deref() == Some("1")
        })
        .await;
        fill
    };
    let mut late = Raw::connect(memo.addr()).await;
    late.round_trip(&[query("SELECT 1")]).await;
    let waits = show_cache(memo, "flight_waits").await;

    // Control: a second session asking at a boundary while the first fills waits for it.
    let fill = start_fill(3).await;
    let slow_read = |n: u32| query(&format!("SELECT v, slow({n}) FROM t WHERE id = 1"));
    let rows = |v: &[&str]| {
        let values = v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        (vec!['T', 'D', 'C', 'Z'], values)
    };
    assert_eq!(late.round_trip(&[slow_read(3)]).await, rows(&["one", "3"]));
    assert_eq!(fill.await.unwrap().as_deref(), Some("one"));
    assert_eq!(
        show_cache(memo, "flight_waits").await,
        waits + 1,
        "a request at a boundary waits for the fill"
    );

    // The same behind another read in one write: forwarded, never waiting.
    let fill = start_fill(4).await;
    let pipeline = [query("SELECT v FROM t WHERE id = 2"), slow_read(4)];
    assert_eq!(late.round_trip(&pipeline).await, rows(&["two"]));
    assert_eq!(late.round_trip(&[]).await, rows(&["one", "4"]));
    assert_eq!(fill.await.unwrap().as_deref(), Some("one"));
    assert_eq!(
        show_cache(memo, "flight_waits").await,
        waits + 1,
        "the pipelined miss did not wait"
    );
}

/// A COMMIT that leaves the session in a transaction (`COMMIT AND CHAIN`, or more statements
/// after it in the same Query) makes its writes visible to everyone: results depending on
/// them go at that COMMIT, not when the session is next idle, and a ROLLBACK of the chained
/// transaction does not undo that.
pub async fn a_commit_that_chains_invalidates_at_once(memo: &PgmemoInstance, direct: &Client) {
    let reader = memo.client("postgres", "postgres").await;
    let writer = memo.client("postgres", "postgres").await;
    let read = |id: u32| format!("SELECT v FROM t WHERE id = {id}");
    let cached = |id: u32| {
        let (reader, read) = (&reader, read(id));
        async move {
            let h = show_cache(memo, "hits").await;
            for _ in 0..3 {
                first(reader, &read).await;
            }
            assert!(show_cache(memo, "hits").await > h, "{read} is served");
        }
    };
    let fresh = |id: u32| {
        let (reader, read) = (&reader, read(id));
        async move {
            assert_eq!(
                first(reader, &read).await,
                first(direct, &read).await,
                "{read}"
            );
        }
    };
    for (id, chain) in [
        (
            1,
            "BEGIN; UPDATE t SET v = 'chained' WHERE id = 1; COMMIT AND CHAIN",
        ),
        // COMMIT, then a new block, in one Query.
        (
            2,
            "BEGIN; UPDATE t SET v = 'next' WHERE id = 2; COMMIT; BEGIN",
        ),
    ] {
        cached(id).await;
        writer.batch_execute(chain).await.unwrap();
        fresh(id).await;
        writer.batch_execute("ROLLBACK").await.unwrap();
        fresh(id).await;
    }
    // AND CHAIN keeps REPEATABLE READ: what the chained transaction reads from its snapshot
    // is never stored (here, after another session's write through pgmemo).
    writer
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; COMMIT AND CHAIN")
        .await
        .unwrap();
    assert_eq!(first(&writer, &read(1)).await.as_deref(), Some("chained"));
    let other = memo.client("postgres", "postgres").await;
    other
        .batch_execute("UPDATE t SET v = 'after' WHERE id = 1")
        .await
        .unwrap();
    for _ in 0..2 {
        assert_eq!(first(&writer, &read(1)).await.as_deref(), Some("chained"));
    }
    writer.batch_execute("COMMIT").await.unwrap();
    fresh(1).await;
}

/// Writes through pgmemo that reach tables other than the ones they name, without a
/// replication feed (docs/cache.md, "what a write invalidates"): a trigger or a rule on the
/// table written, a foreign-key cascade, a partition or inheritance child of the table read,
/// the base table of a view, and writes hidden in `DO`, `CALL`, SQL `EXECUTE` and a volatile
/// function. Each read is served from the cache first; after the write it is fresh.
pub async fn hidden_and_indirect_writes_invalidate_what_they_change(
    memo: &PgmemoInstance,
    pg: &TempPostgres,
    direct: &Client,
) {
    trigger_tables(pg).await;
    pg.psql(
        "CREATE TABLE r1 (id int);
         CREATE TABLE r2 (n int);
         INSERT INTO r2 VALUES (0);
         CREATE RULE r1_bumps_r2 AS ON INSERT TO r1 DO ALSO UPDATE r2 SET n = n + 1;
         CREATE TABLE parent (id int PRIMARY KEY);
         CREATE TABLE child (id int, pid int REFERENCES parent ON DELETE CASCADE);
         INSERT INTO parent VALUES (1), (2);
         INSERT INTO child VALUES (1, 1), (2, 2);
         CREATE TABLE pt (id int, v text) PARTITION BY RANGE (id);
         CREATE TABLE pt1 PARTITION OF pt FOR VALUES FROM (0) TO (100);
         CREATE TABLE ip (id int);
         CREATE TABLE ic () INHERITS (ip);
         CREATE VIEW tv AS SELECT v FROM t WHERE id = 1;
         CREATE PROCEDURE set_two(x text) LANGUAGE sql AS $$ UPDATE t SET v = x WHERE id = 2 $$;
         CREATE FUNCTION write_two(x text) RETURNS int VOLATILE LANGUAGE sql AS
           $$ UPDATE t SET v = x WHERE id = 2 RETURNING 1 $$;",
    )
    .await;
    let reader = memo.client("postgres", "postgres").await;
    let writer = memo.client("postgres", "postgres").await;
    let cases = [
        ("a trigger", "SELECT n FROM b", "INSERT INTO a VALUES (1)"),
        ("a rule", "SELECT n FROM r2", "INSERT INTO r1 VALUES (1)"),
        (
            "a foreign-key cascade",
            "SELECT count(*) FROM child",
            "DELETE FROM parent WHERE id = 1",
        ),
        (
            "a partition",
            "SELECT count(*) FROM pt",
            "INSERT INTO pt1 VALUES (5, 'x')",
        ),
        (
            "an inheritance child",
            "SELECT count(*) FROM ip",
            "INSERT INTO ic VALUES (1)",
        ),
        (
            "a view's base table",
            "SELECT v FROM tv",
            "UPDATE t SET v = 'view' WHERE id = 1",
        ),
        (
            "DO",
            "SELECT v FROM t WHERE id = 2",
            "DO $$ BEGIN UPDATE t SET v = 'do' WHERE id = 2; END $$",
        ),
        (
            "CALL",
            "SELECT v FROM t WHERE id = 2",
            "CALL set_two('call')",
        ),
        (
            "",
            "SELECT v FROM t WHERE id = 2",
            "PREPARE w AS UPDATE t SET v = 'exec' WHERE id = 2",
        ),
        ("SQL EXECUTE", "SELECT v FROM t WHERE id = 2", "EXECUTE w"),
        (
            "a volatile function",
            "SELECT v FROM t WHERE id = 2",
            "SELECT write_two('function')",
        ),
    ];
    for (what, read, write) in cases {
        let before = first(direct, read).await;
        let hits = show_cache(memo, "hits").await;
        for _ in 0..3 {
            assert_eq!(first(&reader, read).await, before, "{what}: {read}");
        }
        assert!(
            show_cache(memo, "hits").await > hits,
            "{what}: {read} is served"
        );
        writer
            .batch_execute(write)
            .await
            .unwrap_or_else(|e| panic!("{write}: {e}"));
        if what.is_empty() {
            // PREPARE writes nothing: its EXECUTE is the next case.
            continue;
        }
        let after = first(direct, read).await;
        assert_ne!(after, before, "{what}: {write} changed {read}");
        assert_eq!(
            first(&reader, read).await,
            after,
            "{what}: {read} after {write}"
        );
    }
}

/// The key holds what changes the answer (docs/cache.md, "The key"): a session whose output
/// settings differ never gets another session's cached result, a role without access to the
/// table gets PostgreSQL's error rather than a result cached for a superuser, and a session
/// whose transactions run under REPEATABLE READ by `default_transaction_isolation` neither
/// stores nor is served. `set_role`: the statement that switches role (`SET ROLE` in session
/// pooling; transaction pooling refuses it and takes `SET LOCAL ROLE` in a block).
pub async fn results_follow_the_session(memo: &PgmemoInstance, pg: &TempPostgres, set_role: &str) {
    pg.psql("CREATE ROLE outsider").await;
    let plain = memo.client("postgres", "postgres").await;
    let cases = [
        (
            "SET bytea_output = 'escape'",
            "SELECT decode(v, 'escape') FROM t WHERE id = 1",
        ),
        (
            "SET extra_float_digits = 0",
            "SELECT id / 3.0::float8 FROM t WHERE id = 1",
        ),
        (
            "SET DateStyle = 'SQL, DMY'",
            "SELECT ts FROM t WHERE id = 1",
        ),
        (
            "SET IntervalStyle = 'sql_standard'",
            "SELECT ts - ts FROM t WHERE id = 1",
        ),
        (
            "SET quote_all_identifiers = on",
            "SELECT quote_ident(v) FROM t WHERE id = 1",
        ),
    ];
    for (set, read) in cases {
        let hits = show_cache(memo, "hits").await;
        let default = first(&plain, read).await;
        for _ in 0..2 {
            assert_eq!(first(&plain, read).await, default, "{read}");
        }
        assert!(show_cache(memo, "hits").await > hits, "{read} is served");
        let other = memo.client("postgres", "postgres").await;
        other.batch_execute(set).await.unwrap();
        let direct = pg.client("postgres", "postgres").await;
        direct.batch_execute(set).await.unwrap();
        let expected = first(&direct, read).await;
        assert_ne!(expected, default, "{set} changes {read}");
        for _ in 0..2 {
            assert_eq!(first(&other, read).await, expected, "{set}: {read}");
        }
    }

    // A role that may not read t.
    let read = "SELECT v FROM t WHERE id = 2";
    for _ in 0..3 {
        first(&plain, read).await;
    }
    let outsider = memo.client("postgres", "postgres").await;
    outsider
        .batch_execute(&format!("BEGIN; {set_role}"))
        .await
        .unwrap();
    let e = outsider.simple_query(read).await.unwrap_err();
    assert_eq!(
        e.as_db_error().map(|e| e.code().code()),
        Some("42501"),
        "{set_role}: {e}"
    );
    outsider.batch_execute("ROLLBACK").await.unwrap();

    // Transactions under REPEATABLE READ by default: a read in one that saw the table before
    // another session's write must not be stored after that write's invalidation.
    let read = "SELECT v FROM t WHERE id = 1";
    let rr = memo.client("postgres", "postgres").await;
    rr.batch_execute("SET default_transaction_isolation = 'repeatable read'")
        .await
        .unwrap();
    rr.batch_execute("BEGIN").await.unwrap();
    let before = first(&rr, read).await;
    plain
        .batch_execute("UPDATE t SET v = 'rr' WHERE id = 1")
        .await
        .unwrap();
    for _ in 0..2 {
        assert_eq!(first(&rr, read).await, before, "the block's snapshot");
    }
    rr.batch_execute("COMMIT").await.unwrap();
    // Read by a session of the same key (the isolation default is part of it).
    let rr2 = memo.client("postgres", "postgres").await;
    rr2.batch_execute("SET default_transaction_isolation = 'repeatable read'")
        .await
        .unwrap();
    for _ in 0..2 {
        assert_eq!(
            first(&rr2, read).await.as_deref(),
            Some("rr"),
            "nothing stale stored"
        );
    }
}

/// A simple Query drops the unnamed statement (PostgreSQL's rule), also when the cache answers
/// the Query or the Bind after it: a Bind of the unnamed statement then fails with 26000 as it
/// does on PostgreSQL, never runs the statement from before the Query. `memo` stores every
/// cacheable miss (`cache_admission = always`).
pub async fn a_query_drops_the_unnamed_statement_for_the_cache_too(
    memo: &PgmemoInstance,
    pg: &TempPostgres,
) {
    use crate::raw::*;
    let direct_addr = std::net::SocketAddr::from(([127, 0, 0, 1], pg.port()));
    let text = "SELECT v FROM t WHERE id = $1";
    let run = |id: &str| [parse(text, &[23]), bind(&[id]), execute(), sync()].concat();
    let exec = [bind(&["2"]), execute(), sync()].concat();
    let read = query("SELECT v FROM t WHERE id = 1");
    // With `cache_admission = always` every cacheable miss is stored. A Bind pgmemo cannot
    // resolve may run anything: it invalidates the database, so each Query after one misses.
    let script = [
        // The batch is stored, then served.
        run("2"),
        run("2"),
        // A miss of the Query: it reaches the server.
        read.clone(),
        exec.clone(),
        // The Query is stored; the server holds the unnamed statement (a miss), then the
        // Query is a hit.
        read.clone(),
        run("3"),
        read,
        exec,
    ];
    let mut transcripts = Vec::new();
    for addr in [direct_addr, memo.addr()] {
        let mut c = Raw::connect(addr).await;
        let mut transcript = Vec::new();
        for step in &script {
            transcript.push(c.round_trip(std::slice::from_ref(step)).await);
        }
        transcripts.push(transcript);
    }
    assert_eq!(
        transcripts[1], transcripts[0],
        "through pgmemo, then directly"
    );
}

/// A cacheable read inside a transaction block the cache may not serve is counted as
/// refused under the block's reason, by the simple and the extended protocol alike:
/// `snapshot_isolation` under REPEATABLE READ, whether the BEGIN asked for it or
/// `default_transaction_isolation` did, and `transaction_wrote` after a write. `c` goes
/// through pgmemo; table `t` of [`setup_with`].
pub async fn reads_a_block_may_not_serve_are_counted_by_reason(memo: &PgmemoInstance, c: &Client) {
    let sql = "SELECT v FROM t WHERE id = 2";
    async fn both_protocols(c: &Client, sql: &str) {
        first(c, sql).await;
        c.query(sql, &[]).await.unwrap();
    }
    // Known outside a block first: planned and memoized.
    for _ in 0..2 {
        both_protocols(c, sql).await;
    }
    let snapshot = refused(memo, "snapshot_isolation").await;
    c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    both_protocols(c, sql).await;
    c.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        refused(memo, "snapshot_isolation").await,
        snapshot + 2,
        "BEGIN ISOLATION LEVEL REPEATABLE READ"
    );
    c.batch_execute("SET default_transaction_isolation = 'repeatable read'")
        .await
        .unwrap();
    // An autocommit read makes the new settings known (transaction pooling reads them for
    // a cacheable read between transactions; until then a block's reason is
    // `settings_unknown`).
    // (Session pooling stores such autocommit reads, transaction pooling refuses them too.)
    both_protocols(c, sql).await;
    let snapshot = refused(memo, "snapshot_isolation").await;
    c.batch_execute("BEGIN").await.unwrap();
    both_protocols(c, sql).await;
    c.batch_execute("COMMIT").await.unwrap();
    c.batch_execute("RESET default_transaction_isolation")
        .await
        .unwrap();
    assert_eq!(
        refused(memo, "snapshot_isolation").await,
        snapshot + 2,
        "REPEATABLE READ by default_transaction_isolation"
    );
    let wrote = refused(memo, "transaction_wrote").await;
    c.batch_execute("BEGIN").await.unwrap();
    c.batch_execute("UPDATE t SET v = v WHERE id = 1")
        .await
        .unwrap();
    both_protocols(c, sql).await;
    c.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        refused(memo, "transaction_wrote").await,
        wrote + 2,
        "a block that wrote"
    );
}

/// `COPY (UPDATE ... RETURNING ...) TO STDOUT` writes like the UPDATE it wraps: through
/// pgmemo it invalidates what it changed, and a read after it in the same block is not stored
/// (the block wrote). `c` goes through pgmemo; table `t` of [`setup_with`].
pub async fn a_copy_of_a_write_invalidates_what_it_wrote(memo: &PgmemoInstance, c: &Client) {
    use futures_util::StreamExt;
    async fn copy_out(c: &Client, sql: &str) -> usize {
        let stream = c
            .copy_out(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let mut stream = std::pin::pin!(stream);
        let mut bytes = 0;
        while let Some(chunk) = stream.next().await {
            bytes += chunk.unwrap().len();
        }
        bytes
    }
    let q = "SELECT v FROM t WHERE id = 1";
    let before = first(c, q).await;
    let hits = memo.handle().shared().cache.stats.hits();
    assert_eq!(first(c, q).await, before);
    assert_eq!(first(c, q).await, before);
    assert!(memo.handle().shared().cache.stats.hits() > hits, "cached");
    copy_out(
        c,
        "COPY (UPDATE t SET v = 'copied' WHERE id = 1 RETURNING id) TO STDOUT",
    )
    .await;
    assert_eq!(first(c, q).await.as_deref(), Some("copied"), "invalidated");
    // In a block: the read after the COPY is not stored, the ROLLBACK undoes the delete.
    c.batch_execute("BEGIN").await.unwrap();
    copy_out(
        c,
        "COPY (DELETE FROM t WHERE id = 1 RETURNING id) TO STDOUT",
    )
    .await;
    assert_eq!(first(c, q).await, None, "the block sees its delete");
    c.batch_execute("ROLLBACK").await.unwrap();
    for _ in 0..2 {
        assert_eq!(first(c, q).await.as_deref(), Some("copied"), "rolled back");
    }
}

/// A Query that ends a transaction and goes on (`COMMIT; ROLLBACK`, or `ROLLBACK; UPDATE`
/// inside a block) keeps what committed: the block's writes in the first case, the UPDATE
/// that ran on its own after the ROLLBACK in the second. Another session's cached read of
/// what they changed is not served afterwards. `c` and `other` go through pgmemo; table `t`
/// of [`setup_with`].
pub async fn a_query_that_ends_a_transaction_and_goes_on_keeps_what_committed(
    c: &Client,
    other: &Client,
) {
    let q = "SELECT v FROM t WHERE id = 1";
    async fn cache(other: &Client, q: &str, expected: &str) {
        for _ in 0..3 {
            assert_eq!(first(other, q).await.as_deref(), Some(expected), "{q}");
        }
    }
    cache(other, q, "one").await;
    c.batch_execute("BEGIN").await.unwrap();
    c.batch_execute("UPDATE t SET v = 'committed' WHERE id = 1")
        .await
        .unwrap();
    c.batch_execute("COMMIT; ROLLBACK").await.unwrap();
    assert_eq!(
        first(other, q).await.as_deref(),
        Some("committed"),
        "COMMIT; ROLLBACK"
    );
    cache(other, q, "committed").await;
    c.batch_execute("BEGIN").await.unwrap();
    c.batch_execute("UPDATE t SET v = 'rolled back' WHERE id = 2")
        .await
        .unwrap();
    c.batch_execute("ROLLBACK; UPDATE t SET v = 'after' WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(
        first(other, q).await.as_deref(),
        Some("after"),
        "ROLLBACK; UPDATE"
    );
}

/// Tables whose writes run code that calls `set_config('bytea_output', 'escape', false)`:
/// a trigger (`au_log`), a column default (`au_default`), a CHECK constraint's volatile
/// function (`au_check`) and a rule (`au_ruled`); and `au_t`, whose `b` reads differently
/// under each `bytea_output`.
pub async fn hidden_set_config_tables(pg: &TempPostgres) {
    pg.psql(
        r"CREATE TABLE au_t (id int PRIMARY KEY, b bytea);
          INSERT INTO au_t VALUES (1, '\x00ff');
          CREATE FUNCTION au_escape() RETURNS trigger VOLATILE LANGUAGE plpgsql
            AS $$BEGIN PERFORM set_config('bytea_output', 'escape', false); RETURN NEW; END$$;
          CREATE TABLE au_log (x int);
          CREATE TRIGGER au_log_escape BEFORE INSERT ON au_log
            FOR EACH ROW EXECUTE FUNCTION au_escape();
          CREATE TABLE au_default (x int, y text DEFAULT set_config('bytea_output', 'escape', false));
          CREATE FUNCTION au_chk(int) RETURNS boolean VOLATILE LANGUAGE plpgsql
            AS $$BEGIN PERFORM set_config('bytea_output', 'escape', false); RETURN true; END$$;
          CREATE TABLE au_check (x int CHECK (au_chk(x)));
          CREATE TABLE au_ruled (x int);
          CREATE RULE au_ruled_escape AS ON INSERT TO au_ruled
            DO ALSO SELECT set_config('bytea_output', 'escape', false);",
    )
    .await;
}

/// A write whose hidden code (see [`hidden_set_config_tables`]) changes `bytea_output` of the
/// writing session A: what A reads next is not stored under the context A had before, so a
/// fresh session B (hex output) reads the bytes PostgreSQL gives it. `pool_size` 1 under
/// transaction pooling also checks that the change does not stay on the server for B.
pub async fn settings_changed_by_hidden_code_of_a_write_are_seen(
    memo: &PgmemoInstance,
    pg: &TempPostgres,
    direct: &Client,
) {
    hidden_set_config_tables(pg).await;
    let mut wrong = Vec::new();
    for (i, table) in ["au_log", "au_default", "au_check", "au_ruled"]
        .into_iter()
        .enumerate()
    {
        let q = format!("SELECT b, {i} FROM au_t WHERE id = 1");
        let expected = first(direct, &q).await;
        assert_eq!(expected.as_deref(), Some(r"\x00ff"));
        let a = memo.client("postgres", "postgres").await;
        // A's context is read before the write.
        first(&a, "SELECT v FROM t WHERE id = 1").await;
        a.batch_execute(&format!("INSERT INTO {table} (x) VALUES (1)"))
            .await
            .unwrap();
        // Twice: a cheap result is stored from its second miss.
        for _ in 0..2 {
            first(&a, &q).await;
        }
        let b = memo.client("postgres", "postgres").await;
        for _ in 0..2 {
            let got = first(&b, &q).await;
            if got != expected {
                wrong.push((table, got));
            }
        }
    }
    assert!(wrong.is_empty(), "B read A's bytea_output: {wrong:?}");
}

//! Invalidation from the logical replication stream (`invalidation = "replication"`), each test
//! against its own cluster with `wal_level = logical`: writes pgmemo does not relay reach the
//! cache, a lost stream closes the gate and is re-established, and the temporary slot never
//! holds WAL back nor outlives pgmemo.

mod cache_support;
mod raw;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cache_support::first;
use pgmemo::cache::feed::FeedState;
use pgmemo::config::{DatabaseConfig, Invalidation, PoolMode, Switch, UpstreamUrl};
use pgmemo::invalidate::FeedStatus;
use testkit::{assert_eventually, eventually_some, pgmemo_config_for, spawn_pgmemo};
use testkit::{PgmemoInstance, TempPostgres};
use tokio_postgres::{Client, SimpleQueryMessage};

/// How long a feed may take to connect, create its slot and go live.
const LIVE_DEADLINE: Duration = Duration::from_secs(10);

async fn cluster() -> TempPostgres {
    let pg = TempPostgres::builder()
        .conf("wal_level = logical")
        .conf("max_replication_slots = 10")
        .conf("max_wal_senders = 10")
        .hba("host replication all 127.0.0.1/32 trust")
        .start()
        .await
        .expect("cluster starts");
    pg.psql(
        "CREATE TABLE t (id int PRIMARY KEY, v text);
         INSERT INTO t VALUES (1, 'one'), (2, 'two');",
    )
    .await;
    pg
}

async fn pgmemo_for(pg: &TempPostgres) -> PgmemoInstance {
    pgmemo_with(pg, Invalidation::Replication).await
}

async fn pgmemo_with(pg: &TempPostgres, invalidation: Invalidation) -> PgmemoInstance {
    pgmemo_in(pg, invalidation, PoolMode::Session).await
}

async fn pgmemo_in(
    pg: &TempPostgres,
    invalidation: Invalidation,
    mode: PoolMode,
) -> PgmemoInstance {
    let mut config = pgmemo_config_for(pg.port());
    config.pool_mode = mode;
    config.upstream =
        UpstreamUrl::parse(&format!("postgres://postgres@127.0.0.1:{}", pg.port())).expect("url");
    config.invalidation = invalidation;
    spawn_pgmemo(config).await.expect("pgmemo starts")
}

fn hits(memo: &PgmemoInstance) -> u64 {
    memo.handle().shared().cache.stats.hits()
}

/// The feed of the only database used through `memo`.
fn feed(memo: &PgmemoInstance) -> Option<Arc<FeedStatus>> {
    memo.handle().shared().feeds.all().into_iter().next()
}

/// Waits until the feed is live on a slot other than `not_slot`; returns the slot.
async fn wait_live(memo: &PgmemoInstance, not_slot: Option<&str>) -> String {
    eventually_some(LIVE_DEADLINE, || async {
        let f = feed(memo)?;
        let slot = f.slot()?;
        (f.state() == FeedState::Live && Some(slot.as_str()) != not_slot).then_some(slot)
    })
    .await
    .unwrap_or_else(|| {
        let error = feed(memo).and_then(|f| f.last_error());
        panic!("the feed did not go live within {LIVE_DEADLINE:?} (last error: {error:?})")
    })
}

/// Reads `sql` through pgmemo until a second read is a hit: proves the result is cached.
async fn cached(memo: &PgmemoInstance, c: &Client, sql: &str) -> Option<String> {
    let before = hits(memo);
    let value = first(c, sql).await;
    assert_eventually(
        Duration::from_secs(5),
        "a repeated read is a hit",
        || async {
            assert_eq!(first(c, sql).await, value);
            hits(memo) > before
        },
    )
    .await;
    value
}

#[tokio::test]
async fn a_direct_write_invalidates_a_cached_read_within_a_second() {
    let pg = cluster().await;
    let memo = pgmemo_for(&pg).await;
    let c = memo.client("postgres", "postgres").await;
    let direct = pg.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 1";
    assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    let slot = wait_live(&memo, None).await;

    // SHOW REPLICATION reports the live feed and its slot.
    let (admin, conn) =
        tokio_postgres::connect(&memo.url("postgres", "pgmemo"), tokio_postgres::NoTls)
            .await
            .expect("admin console");
    tokio::spawn(conn);
    let rows = admin.simple_query("SHOW REPLICATION").await.unwrap();
    let row = rows
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })
        .expect("one feed");
    assert_eq!(row.get("state"), Some("live"));
    assert_eq!(row.get("slot"), Some(slot.as_str()));
    assert_eq!(row.get("publication"), Some("pgmemo"));
    let slots = first(
        &direct,
        "SELECT string_agg(slot_name || ':' || temporary, ',') FROM pg_replication_slots",
    )
    .await;
    assert_eq!(slots, Some(format!("{slot}:true")));

    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("one"));
    direct
        .batch_execute("UPDATE t SET v = 'uno' WHERE id = 1")
        .await
        .unwrap();
    let committed = Instant::now();
    assert_eventually(
        Duration::from_secs(1),
        "the fresh value via pgmemo",
        || async { first(&c, q).await.as_deref() == Some("uno") },
    )
    .await;
    let staleness = committed.elapsed();
    assert!(staleness < Duration::from_secs(1), "{staleness:?}");
    // The feed measured the commit's staleness too.
    let measured = memo.handle().shared().feeds.staleness.snapshot();
    assert!(measured.count >= 1, "{measured:?}");
    assert!(
        measured.sum_micros < 1_000_000 * measured.count,
        "{measured:?}"
    );
    // And the fresh value is cached again.
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("uno"));
    memo.shutdown().await;
}

#[tokio::test]
async fn a_trigger_fired_by_a_write_through_pgmemo_invalidates_another_table() {
    trigger_write_is_seen(PoolMode::Session).await;
}

/// The same in transaction pooling, where the writer reads the WAL position to wait for on the
/// server its next request attaches.
#[tokio::test]
async fn a_trigger_fired_by_a_write_through_pgmemo_invalidates_another_table_in_transaction_pooling(
) {
    trigger_write_is_seen(PoolMode::Transaction).await;
}

/// A trigger's write reaches the cache only through the feed: other sessions see it once the
/// feed applied it, the writer at once. (The writer bypasses the cache until the feed reached
/// its commit's WAL position; a local feed applies so fast that this test cannot tell that
/// bypass from the feed itself: `writer_bypasses_until_the_feed_catches_up` holds the feed
/// back to show it.)
async fn trigger_write_is_seen(mode: PoolMode) {
    let pg = cluster().await;
    cache_support::trigger_tables(&pg).await;
    let memo = pgmemo_in(&pg, Invalidation::Replication, mode).await;
    let c = memo.client("postgres", "postgres").await;
    let reader = memo.client("postgres", "postgres").await;
    let q = "SELECT n FROM b";
    assert_eq!(first(&reader, q).await.as_deref(), Some("0"));
    wait_live(&memo, None).await;
    assert_eq!(cached(&memo, &reader, q).await.as_deref(), Some("0"));
    c.batch_execute("INSERT INTO a VALUES (1)").await.unwrap();
    assert_eventually(
        Duration::from_secs(5),
        "b's new value via pgmemo",
        || async { first(&reader, q).await.as_deref() == Some("1") },
    )
    .await;
    // The writer itself reads its write at once (read-your-writes), even with the old value
    // cached.
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("1"));
    c.batch_execute("INSERT INTO a VALUES (2)").await.unwrap();
    assert_eq!(first(&c, q).await.as_deref(), Some("2"), "{mode:?}");
    memo.shutdown().await;
}

/// Keeps a server process stopped (SIGSTOP) until dropped (SIGCONT), so that a failed
/// assertion cannot leave the cluster unable to shut down.
struct Stopped(i32);

impl Stopped {
    fn process(pid: i32) -> Stopped {
        // SAFETY: kill has no memory effects; the pid is a backend of the test's own cluster.
        assert_eq!(
            unsafe { libc::kill(pid, libc::SIGSTOP) },
            0,
            "SIGSTOP {pid}"
        );
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

#[tokio::test]
async fn the_writer_reads_its_trigger_writes_while_the_feed_is_held_back() {
    writer_bypasses_until_the_feed_catches_up(PoolMode::Session).await;
}

#[tokio::test]
async fn the_writer_reads_its_trigger_writes_while_the_feed_is_held_back_in_transaction_pooling() {
    writer_bypasses_until_the_feed_catches_up(PoolMode::Transaction).await;
}

/// Read-your-writes does not rest on the feed being quick: with the server's WAL sender
/// stopped, a write through pgmemo whose trigger changes another table leaves that table's
/// cached result in place for everyone else (only the feed can invalidate it), yet the
/// writer reads the new value, because it bypasses the cache until the feed has applied its
/// commit. Once the sender runs again the others see it too.
async fn writer_bypasses_until_the_feed_catches_up(mode: PoolMode) {
    let pg = cluster().await;
    cache_support::trigger_tables(&pg).await;
    let memo = pgmemo_in(&pg, Invalidation::Replication, mode).await;
    let writer = memo.client("postgres", "postgres").await;
    let reader = memo.client("postgres", "postgres").await;
    let direct = pg.client("postgres", "postgres").await;
    let q = "SELECT n FROM b";
    wait_live(&memo, None).await;
    assert_eq!(cached(&memo, &reader, q).await.as_deref(), Some("0"));
    assert_eq!(cached(&memo, &writer, q).await.as_deref(), Some("0"));

    let sender: i32 = direct
        .query_one("SELECT pid FROM pg_stat_replication", &[])
        .await
        .expect("one WAL sender: pgmemo's feed")
        .get(0);
    let stopped = Stopped::process(sender);
    writer
        .batch_execute("INSERT INTO a VALUES (1)")
        .await
        .unwrap();
    assert_eq!(
        first(&writer, q).await.as_deref(),
        Some("1"),
        "the writer reads its own write ({mode:?})"
    );
    let before = hits(&memo);
    assert_eq!(
        first(&reader, q).await.as_deref(),
        Some("0"),
        "the feed is held back: the others' cached result is still served"
    );
    assert!(hits(&memo) > before, "the reader's read was a hit");
    assert_eq!(
        first(&writer, q).await.as_deref(),
        Some("1"),
        "and the writer keeps bypassing it"
    );

    drop(stopped);
    assert_eventually(
        Duration::from_secs(10),
        "the feed applies the trigger's write once the sender runs again",
        || async { first(&reader, q).await.as_deref() == Some("1") },
    )
    .await;
    memo.shutdown().await;
}

#[tokio::test]
async fn a_killed_stream_closes_the_gate_flushes_and_reconnects() {
    let pg = cluster().await;
    let memo = pgmemo_for(&pg).await;
    let c = memo.client("postgres", "postgres").await;
    let direct = pg.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 2";
    assert_eq!(first(&c, q).await.as_deref(), Some("two"));
    let slot = wait_live(&memo, None).await;
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("two"));

    let killed = first(
        &direct,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_replication",
    )
    .await;
    assert_eq!(killed.as_deref(), Some("1"));
    assert_eventually(Duration::from_secs(5), "the gate closes", || async {
        feed(&memo).is_some_and(|f| f.state() != FeedState::Live)
    })
    .await;
    direct
        .batch_execute("UPDATE t SET v = 'dos' WHERE id = 2")
        .await
        .unwrap();
    // From the moment the update committed, no read returns the old value: the gate is down
    // (reads bypass the cache) until a new stream is live, and the cache is flushed by then.
    let fresh_until_live = async {
        loop {
            assert_eq!(first(&c, q).await.as_deref(), Some("dos"), "stale read");
            if feed(&memo).is_some_and(|f| f.state() == FeedState::Live) {
                break;
            }
        }
    };
    tokio::time::timeout(LIVE_DEADLINE, fresh_until_live)
        .await
        .expect("the feed comes back");
    let new_slot = wait_live(&memo, Some(&slot)).await;
    assert!(feed(&memo).unwrap().reconnects() >= 1);
    assert_eq!(first(&c, q).await.as_deref(), Some("dos"));

    // Caching works again, and the new stream invalidates.
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("dos"));
    direct
        .batch_execute("UPDATE t SET v = 'deux' WHERE id = 2")
        .await
        .unwrap();
    assert_eventually(
        Duration::from_secs(1),
        "the new stream invalidates",
        || async { first(&c, q).await.as_deref() == Some("deux") },
    )
    .await;
    let slots = first(
        &direct,
        "SELECT string_agg(slot_name, ',') FROM pg_replication_slots",
    )
    .await;
    assert_eq!(slots, Some(new_slot), "the old temporary slot is gone");
    memo.shutdown().await;
}

#[tokio::test]
async fn the_slot_retains_no_wal_and_disappears_with_pgmemo() {
    let pg = cluster().await;
    let memo = pgmemo_for(&pg).await;
    let c = memo.client("postgres", "postgres").await;
    let direct = pg.client("postgres", "postgres").await;
    assert_eq!(
        first(&c, "SELECT count(*) FROM t").await.as_deref(),
        Some("2")
    );
    wait_live(&memo, None).await;
    drop(c);

    let start = first(&direct, "SELECT pg_current_wal_lsn()::text").await;
    direct
        .batch_execute(
            "DO $$ BEGIN
               FOR i IN 1..10000 LOOP
                 UPDATE t SET v = i::text WHERE id = 1;
                 COMMIT;
               END LOOP;
             END $$",
        )
        .await
        .unwrap();
    let behind = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, \
                  pg_wal_lsn_diff(confirmed_flush_lsn, $1::text::pg_lsn)::bigint \
                  FROM pg_replication_slots";
    let start = start.expect("an LSN");
    let last = std::sync::Mutex::new(None);
    let caught_up = testkit::eventually(Duration::from_secs(10), || async {
        let row = direct.query_one(behind, &[&start]).await.expect("one slot");
        let (lag, advanced): (i64, i64) = (row.get(0), row.get(1));
        *last.lock().unwrap() = Some((lag, advanced));
        (0..64 * 1024).contains(&lag) && advanced > 0
    })
    .await;
    assert!(
        caught_up,
        "confirmed_flush_lsn stays behind (bytes behind, bytes advanced): {:?}",
        last.lock().unwrap()
    );
    // The confirmed position may be within the lag bound a few commits before the last one
    // is applied: wait for that too.
    let applied = testkit::eventually(Duration::from_secs(10), || async {
        feed(&memo).unwrap().transactions() >= 10_000
    })
    .await;
    assert!(
        applied,
        "transactions applied: {}",
        feed(&memo).unwrap().transactions()
    );

    memo.shutdown().await;
    assert_eventually(Duration::from_secs(5), "no slot remains", || async {
        first(&direct, "SELECT count(*) FROM pg_replication_slots")
            .await
            .as_deref()
            == Some("0")
    })
    .await;
}

#[tokio::test]
async fn no_publication_is_created_while_a_table_lacks_a_replica_identity() {
    let pg = cluster().await;
    pg.psql("CREATE TABLE log (line text)").await;
    let memo = pgmemo_for(&pg).await;
    let c = memo.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 1";
    assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    assert_eventually(Duration::from_secs(5), "the feed reports why", || async {
        feed(&memo)
            .and_then(|f| f.last_error())
            .is_some_and(|e| e.contains("public.log"))
    })
    .await;
    assert_eq!(feed(&memo).unwrap().state(), FeedState::Down);
    // Fail closed: nothing is served from the cache; the application's writes still work.
    let before = hits(&memo);
    for _ in 0..3 {
        assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    }
    assert_eq!(hits(&memo), before);
    c.batch_execute("INSERT INTO log VALUES ('x'); UPDATE log SET line = 'y'")
        .await
        .unwrap();
    let direct = pg.client("postgres", "postgres").await;
    assert_eq!(
        first(&direct, "SELECT count(*) FROM pg_publication")
            .await
            .as_deref(),
        Some("0")
    );
    memo.shutdown().await;
}

#[tokio::test]
async fn auto_without_a_publication_falls_back_to_proxy_for_the_database() {
    let pg = cluster().await;
    let memo = pgmemo_with(&pg, Invalidation::Auto).await;
    let c = memo.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 1";
    assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    assert_eventually(Duration::from_secs(5), "the feed gives up", || async {
        feed(&memo).is_some_and(|f| f.state() == FeedState::NotUsed)
    })
    .await;
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("one"));
    memo.shutdown().await;
}

#[tokio::test]
async fn auto_with_a_publication_uses_the_feed() {
    let pg = cluster().await;
    pg.psql("CREATE PUBLICATION pgmemo FOR ALL TABLES").await;
    let memo = pgmemo_with(&pg, Invalidation::Auto).await;
    let c = memo.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 1";
    assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    wait_live(&memo, None).await;
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("one"));
    let direct = pg.client("postgres", "postgres").await;
    direct
        .batch_execute("UPDATE t SET v = 'uno' WHERE id = 1")
        .await
        .unwrap();
    assert_eventually(
        Duration::from_secs(1),
        "the fresh value via pgmemo",
        || async { first(&c, q).await.as_deref() == Some("uno") },
    )
    .await;
    memo.shutdown().await;
}

/// A pgmemo with `invalidation = auto` whose feed user `feeder` (REPLICATION, no superuser,
/// publication created beforehand) cannot log in yet: its connection limit is 0, so every
/// login is refused with 53300, as when the server is out of connection slots.
async fn pgmemo_while_the_feeder_cannot_log_in(pg: &TempPostgres) -> PgmemoInstance {
    pg.psql(
        "CREATE ROLE feeder LOGIN REPLICATION CONNECTION LIMIT 0; \
         CREATE PUBLICATION pgmemo FOR ALL TABLES;",
    )
    .await;
    let mut config = pgmemo_config_for(pg.port());
    config.upstream =
        UpstreamUrl::parse(&format!("postgres://feeder@127.0.0.1:{}", pg.port())).expect("url");
    config.invalidation = Invalidation::Auto;
    let memo = spawn_pgmemo(config).await.expect("pgmemo starts");
    assert_eventually(
        Duration::from_secs(5),
        "the auto probe's login is refused",
        || async {
            pg.log_contents()
                .contains("too many connections for role \"feeder\"")
        },
    )
    .await;
    memo
}

/// `auto` does not take a login refused for now (here a connection limit, as with "too many
/// clients", a server starting up or max_wal_senders reached) for "no feed, ever": it asks
/// again, and once the user may log in the feed goes live and writes made elsewhere reach
/// the cache.
#[tokio::test]
async fn auto_asks_again_after_a_login_refused_for_now() {
    let pg = cluster().await;
    let memo = pgmemo_while_the_feeder_cannot_log_in(&pg).await;
    let c = memo.client("postgres", "postgres").await;
    let direct = pg.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 1";
    assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    direct
        .batch_execute("ALTER ROLE feeder CONNECTION LIMIT -1")
        .await
        .unwrap();
    wait_live(&memo, None).await;
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("one"));
    direct
        .batch_execute("UPDATE t SET v = 'uno' WHERE id = 1")
        .await
        .unwrap();
    assert_eventually(
        Duration::from_secs(1),
        "the fresh value via pgmemo",
        || async { first(&c, q).await.as_deref() == Some("uno") },
    )
    .await;
    memo.shutdown().await;
}

/// While `auto` has not decided whether a feed runs (here its login is refused for now, so it
/// keeps asking), pgmemo cannot count on seeing every write: the cache serves and stores
/// nothing, so a write made directly on the server is never hidden by a cached read. Once the
/// feed is live, the cache serves.
#[tokio::test]
async fn auto_serves_nothing_from_the_cache_until_it_has_decided() {
    let pg = cluster().await;
    let memo = pgmemo_while_the_feeder_cannot_log_in(&pg).await;
    let c = memo.client("postgres", "postgres").await;
    let direct = pg.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 1";
    for _ in 0..4 {
        assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    }
    direct
        .batch_execute("UPDATE t SET v = 'uno' WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(first(&c, q).await.as_deref(), Some("uno"), "stale read");
    assert_eq!(hits(&memo), 0, "served before the feed was decided");
    assert_eq!(show_cache_feed(&memo).await.as_deref(), Some("probing"));

    direct
        .batch_execute("ALTER ROLE feeder CONNECTION LIMIT -1")
        .await
        .unwrap();
    wait_live(&memo, None).await;
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("uno"));
    memo.shutdown().await;
}

#[tokio::test]
async fn ddl_made_directly_reaches_the_cache_through_the_event_trigger() {
    let pg = cluster().await;
    let memo = pgmemo_for(&pg).await;
    let c = memo.client("postgres", "postgres").await;
    let q = "SELECT * FROM t WHERE id = 1";
    assert_eq!(first(&c, q).await.as_deref(), Some("1"));
    wait_live(&memo, None).await;
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("1"));
    let direct = pg.client("postgres", "postgres").await;
    let triggers = first(
        &direct,
        "SELECT string_agg(evtname, ',' ORDER BY evtname) FROM pg_event_trigger",
    )
    .await;
    assert_eq!(triggers.as_deref(), Some("pgmemo_ddl,pgmemo_ddl_drop"));
    // A column added directly (no row changes at all) appears through pgmemo.
    direct
        .batch_execute("ALTER TABLE t ADD COLUMN extra int DEFAULT 7")
        .await
        .unwrap();
    assert_eventually(
        Duration::from_secs(1),
        "the new column via pgmemo",
        || async {
            let rows = c.simple_query(q).await.unwrap();
            rows.iter().any(|m| match m {
                SimpleQueryMessage::Row(r) => matches!(r.try_get("extra"), Ok(Some("7"))),
                _ => false,
            })
        },
    )
    .await;
    memo.shutdown().await;
}

/// `SHOW CACHE`'s `invalidation_feed` row through the admin console.
async fn show_cache_feed(memo: &PgmemoInstance) -> Option<String> {
    let (admin, conn) =
        tokio_postgres::connect(&memo.url("postgres", "pgmemo"), tokio_postgres::NoTls)
            .await
            .expect("admin console");
    tokio::spawn(conn);
    let rows = admin.simple_query("SHOW CACHE").await.unwrap();
    rows.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) if r.get("name") == Some("invalidation_feed") => {
            r.get("value").map(str::to_owned)
        }
        _ => None,
    })
}

#[tokio::test]
async fn an_fk_cascade_invalidates_the_child_table() {
    let pg = cluster().await;
    pg.psql(
        "CREATE TABLE parent (id int PRIMARY KEY);
         CREATE TABLE child (id int PRIMARY KEY,
                             parent int REFERENCES parent ON DELETE CASCADE);
         INSERT INTO parent VALUES (1), (2);
         INSERT INTO child VALUES (10, 1), (20, 2);",
    )
    .await;
    let memo = pgmemo_for(&pg).await;
    let c = memo.client("postgres", "postgres").await;
    let direct = pg.client("postgres", "postgres").await;
    let q = "SELECT count(*) FROM child";
    assert_eq!(first(&c, q).await.as_deref(), Some("2"));
    wait_live(&memo, None).await;
    assert_eq!(
        show_cache_feed(&memo).await.as_deref(),
        Some("postgres=live")
    );

    // Directly on PostgreSQL.
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("2"));
    direct
        .batch_execute("DELETE FROM parent WHERE id = 1")
        .await
        .unwrap();
    assert_eventually(
        Duration::from_secs(1),
        "the cascaded delete via pgmemo",
        || async { first(&c, q).await.as_deref() == Some("1") },
    )
    .await;

    // Through pgmemo, from another session.
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("1"));
    let writer = memo.client("postgres", "postgres").await;
    writer
        .batch_execute("DELETE FROM parent WHERE id = 2")
        .await
        .unwrap();
    assert_eq!(first(&writer, q).await.as_deref(), Some("0"));
    assert_eventually(
        Duration::from_secs(1),
        "the cascaded delete via pgmemo",
        || async { first(&c, q).await.as_deref() == Some("0") },
    )
    .await;
    memo.shutdown().await;
}

#[tokio::test]
async fn a_volatile_function_called_by_select_invalidates_what_it_wrote() {
    let pg = cluster().await;
    pg.psql(
        "CREATE TABLE b (id int PRIMARY KEY, n int);
         INSERT INTO b VALUES (1, 0);
         CREATE FUNCTION bump_b() RETURNS int VOLATILE LANGUAGE plpgsql AS
           $$ BEGIN UPDATE b SET n = n + 1; RETURN 0; END $$;",
    )
    .await;
    let memo = pgmemo_for(&pg).await;
    let writer = memo.client("postgres", "postgres").await;
    let reader = memo.client("postgres", "postgres").await;
    let q = "SELECT n FROM b";
    assert_eq!(first(&reader, q).await.as_deref(), Some("0"));
    wait_live(&memo, None).await;
    assert_eq!(cached(&memo, &reader, q).await.as_deref(), Some("0"));
    assert_eq!(cached(&memo, &writer, q).await.as_deref(), Some("0"));
    writer.batch_execute("SELECT bump_b()").await.unwrap();
    // The calling session sees its write at once.
    assert_eq!(first(&writer, q).await.as_deref(), Some("1"));
    assert_eventually(
        Duration::from_secs(1),
        "the function's write via another session",
        || async { first(&reader, q).await.as_deref() == Some("1") },
    )
    .await;
    memo.shutdown().await;
}

#[tokio::test]
async fn a_write_through_one_pgmemo_invalidates_another_instance() {
    let pg = cluster().await;
    let one = pgmemo_for(&pg).await;
    let two = pgmemo_for(&pg).await;
    let c1 = one.client("postgres", "postgres").await;
    let c2 = two.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 1";
    assert_eq!(first(&c1, q).await.as_deref(), Some("one"));
    assert_eq!(first(&c2, q).await.as_deref(), Some("one"));
    let slot1 = wait_live(&one, None).await;
    let slot2 = wait_live(&two, None).await;
    assert_ne!(slot1, slot2);
    assert_eq!(cached(&two, &c2, q).await.as_deref(), Some("one"));
    c1.batch_execute("UPDATE t SET v = 'uno' WHERE id = 1")
        .await
        .unwrap();
    assert_eventually(
        Duration::from_secs(1),
        "instance two serves the fresh value",
        || async { first(&c2, q).await.as_deref() == Some("uno") },
    )
    .await;
    one.shutdown().await;
    two.shutdown().await;
}

#[tokio::test]
async fn a_postgres_restart_under_load_serves_nothing_stale_and_recovers() {
    let pg = cluster().await;
    let memo = Arc::new(pgmemo_for(&pg).await);
    let c = memo.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 1";
    assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    wait_live(&memo, None).await;
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("one"));
    drop(c);

    // Readers that reconnect whenever their connection is cut.
    let stop = tokio_util::sync::CancellationToken::new();
    let mut readers = Vec::new();
    for _ in 0..4 {
        let memo = Arc::clone(&memo);
        let stop = stop.clone();
        readers.push(tokio::spawn(async move {
            let mut ok = 0u64;
            while !stop.is_cancelled() {
                let Ok(c) = memo.try_client("postgres", "postgres").await else {
                    tokio::task::yield_now().await;
                    continue;
                };
                while !stop.is_cancelled() {
                    match c.simple_query(q).await {
                        Ok(_) => ok += 1,
                        Err(_) => break,
                    }
                }
            }
            ok
        }));
    }
    pg.restart().await.expect("restart");
    let direct = pg.client("postgres", "postgres").await;
    direct
        .batch_execute("UPDATE t SET v = 'uno' WHERE id = 1")
        .await
        .unwrap();
    let c = eventually_some(LIVE_DEADLINE, || async {
        memo.try_client("postgres", "postgres").await.ok()
    })
    .await
    .expect("pgmemo accepts clients again");
    // From the direct write on, no read returns the old value, until and after the feed is live.
    let fresh_until_live = async {
        loop {
            match c.simple_query(q).await {
                Ok(rows) => {
                    let v = rows.iter().find_map(|m| match m {
                        SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                        _ => None,
                    });
                    assert_eq!(v.as_deref(), Some("uno"), "stale read");
                }
                Err(e) => panic!("read after restart: {e}"),
            }
            if feed(&memo).is_some_and(|f| f.state() == FeedState::Live) {
                break;
            }
        }
    };
    tokio::time::timeout(LIVE_DEADLINE, fresh_until_live)
        .await
        .expect("the feed comes back");
    stop.cancel();
    for r in readers {
        assert!(r.await.unwrap() > 0, "every reader read");
    }
    assert_eq!(
        show_cache_feed(&memo).await.as_deref(),
        Some("postgres=live")
    );
    assert_eq!(first(&c, q).await.as_deref(), Some("uno"));
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("uno"));
    direct
        .batch_execute("UPDATE t SET v = 'eins' WHERE id = 1")
        .await
        .unwrap();
    assert_eventually(
        Duration::from_secs(1),
        "the new stream invalidates",
        || async { first(&c, q).await.as_deref() == Some("eins") },
    )
    .await;
    drop(c);
    if let Ok(memo) = Arc::try_unwrap(memo) {
        memo.shutdown().await;
    }
}

/// A stream that goes silent without ending (here its walsender is stopped with SIGSTOP: the
/// connection stays open, as behind a network partition) is taken for lost within about ten
/// seconds: the gate closes, so a direct write is never answered from the cache, and a new
/// stream goes live.
#[tokio::test]
async fn a_silent_stream_closes_the_gate_and_is_replaced() {
    let pg = cluster().await;
    let memo = pgmemo_for(&pg).await;
    let c = memo.client("postgres", "postgres").await;
    let direct = pg.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 2";
    let slot = wait_live(&memo, None).await;
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("two"));
    let pid = first(&direct, "SELECT pid FROM pg_stat_replication")
        .await
        .expect("a walsender");
    let _stopped = Stopped::process(pid.parse().unwrap());
    assert_eventually(Duration::from_secs(20), "the gate closes", || async {
        feed(&memo).is_some_and(|f| f.state() != FeedState::Live)
    })
    .await;
    assert!(
        feed(&memo)
            .and_then(|f| f.last_error())
            .is_some_and(|e| e.contains("said nothing")),
        "{:?}",
        feed(&memo).and_then(|f| f.last_error())
    );
    direct
        .batch_execute("UPDATE t SET v = 'dos' WHERE id = 2")
        .await
        .unwrap();
    assert_eq!(first(&c, q).await.as_deref(), Some("dos"), "stale read");
    wait_live(&memo, Some(&slot)).await;
    assert_eq!(first(&c, q).await.as_deref(), Some("dos"));
    memo.shutdown().await;
}

/// A publication of the configured name that does not show every write (here only table
/// `t`, without deletes) is not taken for a complete feed: with `invalidation = replication`
/// the cache serves nothing (fail closed) and the error names what the publication lacks;
/// `auto` falls back to proxy for the database.
#[tokio::test]
async fn a_publication_that_misses_writes_is_not_used() {
    let pg = cluster().await;
    pg.psql("CREATE TABLE u (id int PRIMARY KEY); CREATE PUBLICATION pgmemo FOR TABLE t WITH (publish = 'insert, update')")
        .await;
    let memo = pgmemo_for(&pg).await;
    let c = memo.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 1";
    let error = eventually_some(LIVE_DEADLINE, || async {
        feed(&memo).and_then(|f| f.last_error())
    })
    .await
    .expect("the feed reports why it is down");
    assert!(
        error.contains("FOR ALL TABLES") && error.contains("delete"),
        "{error}"
    );
    assert_ne!(feed(&memo).unwrap().state(), FeedState::Live);
    for _ in 0..3 {
        assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    }
    assert_eq!(
        hits(&memo),
        0,
        "served while the feed cannot see every write"
    );
    memo.shutdown().await;

    let memo = pgmemo_with(&pg, Invalidation::Auto).await;
    let c = memo.client("postgres", "postgres").await;
    assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    assert_eventually(Duration::from_secs(5), "auto gives the feed up", || async {
        feed(&memo).is_some_and(|f| f.state() == FeedState::NotUsed)
    })
    .await;
    memo.shutdown().await;
}

/// A feed whose user is not a superuser runs without pgmemo's DDL event trigger, so DDL
/// reaches it from nowhere. Code run through pgmemo that may have run DDL (here `REFRESH
/// MATERIALIZED VIEW` inside `DO`, whose rows logical decoding never shows) is then not left
/// to the feed: the database's results go at once.
#[tokio::test]
async fn user_code_is_not_left_to_a_feed_that_carries_no_ddl() {
    let pg = cluster().await;
    pg.psql(
        "CREATE ROLE feeder LOGIN REPLICATION; \
         CREATE PUBLICATION pgmemo FOR ALL TABLES; \
         CREATE MATERIALIZED VIEW mv AS SELECT id, v FROM t;",
    )
    .await;
    let mut config = pgmemo_config_for(pg.port());
    config.upstream =
        UpstreamUrl::parse(&format!("postgres://feeder@127.0.0.1:{}", pg.port())).expect("url");
    config.invalidation = Invalidation::Replication;
    let memo = spawn_pgmemo(config).await.expect("pgmemo starts");
    let c = memo.client("postgres", "postgres").await;
    let direct = pg.client("postgres", "postgres").await;
    let q = "SELECT v FROM mv WHERE id = 1";
    assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    wait_live(&memo, None).await;
    // The view's base table changes (its invalidation arrives on the feed), the view does
    // not until refreshed: its old rows are cached again.
    direct
        .batch_execute("UPDATE t SET v = 'uno' WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("one"));
    c.batch_execute("DO $$BEGIN REFRESH MATERIALIZED VIEW mv; END$$")
        .await
        .unwrap();
    // Another session (the writer itself waits for the feed anyway).
    let other = memo.client("postgres", "postgres").await;
    assert_eq!(first(&other, q).await.as_deref(), Some("uno"), "stale view");
    memo.shutdown().await;
}

/// A session relayed without the cache (here through a `[databases]` alias with the cache
/// off, mapped to the same upstream database) is seen by no proxy; a feed whose user is not
/// a superuser carries no DDL. So while such a session is connected, that feed is not trusted
/// with its writes: a view it replaces is read afresh through the cached database.
#[tokio::test]
async fn an_untracked_session_is_not_left_to_a_feed_that_carries_no_ddl() {
    let pg = cluster().await;
    pg.psql(
        "CREATE ROLE feeder LOGIN REPLICATION; \
         CREATE PUBLICATION pgmemo FOR ALL TABLES; \
         CREATE VIEW vw AS SELECT id, v FROM t;",
    )
    .await;
    let mut config = pgmemo_config_for(pg.port());
    config.upstream =
        UpstreamUrl::parse(&format!("postgres://feeder@127.0.0.1:{}", pg.port())).expect("url");
    config.invalidation = Invalidation::Replication;
    config.databases.insert(
        "raw".to_owned(),
        DatabaseConfig {
            dbname: Some("postgres".to_owned()),
            cache: Some(Switch::Off),
            ..DatabaseConfig::default()
        },
    );
    let memo = spawn_pgmemo(config).await.expect("pgmemo starts");
    let c = memo.client("postgres", "postgres").await;
    let q = "SELECT v FROM vw WHERE id = 1";
    assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    wait_live(&memo, None).await;
    let raw = memo.client("postgres", "raw").await;
    raw.batch_execute("SELECT 1").await.unwrap();
    for _ in 0..4 {
        assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    }
    raw.batch_execute("CREATE OR REPLACE VIEW vw AS SELECT id, upper(v) AS v FROM t")
        .await
        .unwrap();
    assert_eq!(first(&c, q).await.as_deref(), Some("ONE"), "stale view");
    memo.shutdown().await;
}

/// Without the DDL event trigger, a partition created elsewhere shows on the feed only with
/// its first change (a Relation message for a relation new to the stream): the database is
/// flushed at that commit, so a cached read of the parent counts the new partition's rows.
#[tokio::test]
async fn a_partition_created_elsewhere_reaches_a_feed_that_carries_no_ddl() {
    let pg = cluster().await;
    pg.psql(
        "CREATE ROLE feeder LOGIN REPLICATION; \
         CREATE PUBLICATION pgmemo FOR ALL TABLES; \
         CREATE TABLE p (id int) PARTITION BY RANGE (id); \
         CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (100); \
         INSERT INTO p VALUES (1);",
    )
    .await;
    let mut config = pgmemo_config_for(pg.port());
    config.upstream =
        UpstreamUrl::parse(&format!("postgres://feeder@127.0.0.1:{}", pg.port())).expect("url");
    config.invalidation = Invalidation::Replication;
    let memo = spawn_pgmemo(config).await.expect("pgmemo starts");
    let c = memo.client("postgres", "postgres").await;
    let direct = pg.client("postgres", "postgres").await;
    let q = "SELECT count(*) FROM p";
    assert_eq!(first(&c, q).await.as_deref(), Some("1"));
    wait_live(&memo, None).await;
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("1"));
    direct
        .batch_execute(
            "CREATE TABLE p2 PARTITION OF p FOR VALUES FROM (100) TO (200); \
             INSERT INTO p VALUES (150)",
        )
        .await
        .unwrap();
    assert_eventually(
        Duration::from_secs(10),
        "the new partition's row is counted",
        || async { first(&c, q).await.as_deref() == Some("2") },
    )
    .await;
    memo.shutdown().await;
}

/// `auto`: a live feed whose publication goes away falls back to proxy invalidation. A
/// commit pgmemo left to the feed (a `DO` block's write) that the feed never applied is
/// flushed then, as proxy invalidation would have done, and its session uses the cache again.
#[tokio::test]
async fn auto_falling_back_flushes_what_was_left_to_the_feed() {
    let pg = cluster().await;
    pg.psql("CREATE PUBLICATION pgmemo FOR ALL TABLES").await;
    let memo = pgmemo_with(&pg, Invalidation::Auto).await;
    let c = memo.client("postgres", "postgres").await;
    let other = memo.client("postgres", "postgres").await;
    let direct = pg.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 1";
    assert_eq!(first(&other, q).await.as_deref(), Some("one"));
    wait_live(&memo, None).await;
    assert_eq!(cached(&memo, &other, q).await.as_deref(), Some("one"));
    direct
        .batch_execute("DROP PUBLICATION pgmemo")
        .await
        .unwrap();
    c.batch_execute("DO $$BEGIN UPDATE t SET v = 'done' WHERE id = 1; END$$")
        .await
        .unwrap();
    assert_eventually(Duration::from_secs(10), "the feed gives up", || async {
        feed(&memo).is_some_and(|f| f.state() == FeedState::NotUsed)
    })
    .await;
    assert_eq!(first(&other, q).await.as_deref(), Some("done"));
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("done"));
    memo.shutdown().await;
}

/// A publication altered so that it no longer carries every write: the feed makes its stream
/// again, which checks the publication, and the cache stops serving rather than miss the
/// writes the stream no longer shows.
#[tokio::test]
async fn a_publication_altered_under_a_live_feed_is_checked_again() {
    let pg = cluster().await;
    pg.psql("CREATE PUBLICATION pgmemo FOR ALL TABLES").await;
    let memo = pgmemo_for(&pg).await;
    let c = memo.client("postgres", "postgres").await;
    let direct = pg.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 1";
    assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    wait_live(&memo, None).await;
    assert_eq!(cached(&memo, &c, q).await.as_deref(), Some("one"));
    direct
        .batch_execute("ALTER PUBLICATION pgmemo SET (publish = 'insert')")
        .await
        .unwrap();
    assert_eventually(Duration::from_secs(10), "the feed stops", || async {
        feed(&memo).is_some_and(|f| f.state() == FeedState::Down && f.slot().is_none())
    })
    .await;
    // A read while it is down, an update the stream would not have shown, a read again.
    assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    direct
        .batch_execute("UPDATE t SET v = 'unpublished' WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(first(&c, q).await.as_deref(), Some("unpublished"));
    memo.shutdown().await;
}

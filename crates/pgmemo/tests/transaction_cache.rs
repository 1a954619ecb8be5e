//! The result cache under `pool_mode = transaction`, against a real PostgreSQL: hits are
//! answered without taking a server, misses are captured on the server the client attached,
//! writes relayed in transaction pooling invalidate at COMMIT (never at ROLLBACK), and the
//! key follows each client's own settings, which pgmemo replays per transaction. As in
//! `cache.rs`, whether a read came from the cache is seen from outside: after a write made
//! directly to the server, a cached read still returns the old value.

mod cache_support;
mod raw;

use std::time::Duration;

use cache_support::{first, show_cache};
use pgmemo::config::{Invalidation, PoolMode, Seconds, Switch};
use pgmemo::Config;
use testkit::{pgmemo_config_for, spawn_pgmemo, within, PgmemoInstance, TempPostgres};
use tokio_postgres::Client;

/// Upper bound for one test: a hang fails instead of blocking the suite.
const DEADLINE: Duration = Duration::from_secs(120);

/// [`cache_support::setup_with`] transaction pooling over `pool_size` server connections.
async fn setup(pool_size: usize) -> (TempPostgres, PgmemoInstance, Client) {
    cache_support::setup_with(|c| {
        c.pool_mode = PoolMode::Transaction;
        c.pool_size = pool_size;
        c.cache = Switch::On;
        c.invalidation = Invalidation::Proxy;
        c.query_wait_timeout = Seconds(Duration::from_secs(5));
    })
    .await
}

#[tokio::test]
async fn cheap_results_are_stored_from_their_second_miss() {
    within(DEADLINE, async {
        let (pg, memo, _direct) = setup(2).await;
        cache_support::admission_stores_costly_results_at_once(&memo).await;
        let config = Config {
            pool_mode: PoolMode::Transaction,
            pool_size: 2,
            invalidation: Invalidation::Proxy,
            cache_costly_miss: Seconds(Duration::from_secs(3600)),
            ..pgmemo_config_for(pg.port())
        };
        let cheap = spawn_pgmemo(config).await.expect("pgmemo starts");
        cache_support::admission_stores_cheap_results_from_their_second_miss(&cheap).await;
    })
    .await;
}

#[tokio::test]
async fn hits_are_answered_without_a_server() {
    use raw::*;
    within(DEADLINE, async {
        let (_pg, memo, direct) = setup(1).await;
        let reader = memo.client("postgres", "postgres").await;
        let q = "SELECT v FROM t WHERE id = 1";
        let stmt = reader
            .prepare("SELECT v FROM t WHERE id = $1")
            .await
            .unwrap();
        let mut raw = Raw::connect(memo.addr()).await;
        let unnamed = |id: &str| {
            vec![
                parse("SELECT v FROM t WHERE id = $1 AND v IS NOT NULL", &[23]),
                bind(&[id]),
                describe_portal(),
                execute(),
                sync(),
            ]
        };
        // Fill: simple, named prepared, unnamed statement.
        assert_eq!(first(&reader, q).await.as_deref(), Some("one"));
        let named: String = reader.query_one(&stmt, &[&2i32]).await.unwrap().get(0);
        assert_eq!(named, "two");
        let (tags, values) = raw.round_trip(&unnamed("1")).await;
        assert_eq!(tags, vec!['1', '2', 'T', 'D', 'C', 'Z']);
        assert_eq!(values, vec!["one"]);
        direct
            .batch_execute("UPDATE t SET v = v || '+'")
            .await
            .unwrap();

        // Another client holds the only server connection in an open transaction.
        let holder = memo.client("postgres", "postgres").await;
        holder.batch_execute("BEGIN; SELECT 1").await.unwrap();

        // Hits need no server: they are answered (with the values from before the direct
        // write) although no server is free.
        assert_eq!(first(&reader, q).await.as_deref(), Some("one"));
        let named: String = reader.query_one(&stmt, &[&2i32]).await.unwrap().get(0);
        assert_eq!(named, "two");
        let (tags, values) = raw.round_trip(&unnamed("1")).await;
        assert_eq!(
            tags,
            vec!['1', '2', 'T', 'D', 'C', 'Z'],
            "as PostgreSQL answers"
        );
        assert_eq!(values, vec!["one"]);
        // The unnamed statement answered from the cache is the client's own afterwards.
        let (tags, values) = raw
            .round_trip(&[bind(&["1"]), describe_portal(), execute(), sync()])
            .await;
        assert_eq!(tags, vec!['2', 'T', 'D', 'C', 'Z']);
        assert_eq!(values, vec!["one"]);

        // A miss waits for a server (and gets the fresh value) once the holder is done.
        let miss =
            tokio::spawn(async move { first(&reader, "SELECT v FROM t WHERE id = 2").await });
        holder.batch_execute("COMMIT").await.unwrap();
        assert_eq!(miss.await.unwrap().as_deref(), Some("two+"));
        // (The admin console checks its user on the upstream: asked only now.)
        assert_eq!(show_cache(&memo, "hits").await, 4);
    })
    .await;
}

#[tokio::test]
async fn commit_invalidates_rollback_does_not_and_blocks_bypass() {
    within(DEADLINE, async {
        let (_pg, memo, direct) = setup(2).await;
        let c = memo.client("postgres", "postgres").await;
        let q = "SELECT v FROM t WHERE id = 2";
        // Inside a transaction block that wrote, the client reads its own write; a rollback
        // invalidates nothing.
        cache_support::a_rollback_invalidates_nothing(&c, &direct).await;

        // A savepoint rolled back inside a committed transaction: the commit still counts.
        c.batch_execute(
            "BEGIN; UPDATE t SET v = 'kept' WHERE id = 2; SAVEPOINT s; \
             UPDATE t SET v = 'undone' WHERE id = 1; ROLLBACK TO SAVEPOINT s",
        )
        .await
        .unwrap();
        c.batch_execute("COMMIT").await.unwrap();
        assert_eq!(first(&c, q).await.as_deref(), Some("kept"));

        // Extended protocol: a prepared write in a transaction, committed by another
        // statement; another client's cached read sees it at once.
        let other = memo.client("postgres", "postgres").await;
        assert_eq!(first(&other, q).await.as_deref(), Some("kept"));
        let upd = c.prepare("UPDATE t SET v = $1 WHERE id = 2").await.unwrap();
        c.batch_execute("BEGIN").await.unwrap();
        c.execute(&upd, &[&"extended"]).await.unwrap();
        assert_eq!(
            first(&other, q).await.as_deref(),
            Some("kept"),
            "not committed yet"
        );
        c.batch_execute("COMMIT").await.unwrap();
        assert_eq!(first(&other, q).await.as_deref(), Some("extended"));

        // Autocommit writes of every kind relayed in transaction pooling invalidate.
        for write in [
            "INSERT INTO t (id, v) VALUES (3, 'three')",
            "UPDATE t SET v = 'u' WHERE id = 3",
            "DELETE FROM t WHERE id = 3",
            "COPY t (id, v) FROM PROGRAM 'echo 4,four' WITH (FORMAT csv)",
            "TRUNCATE t",
        ] {
            let count = "SELECT count(*) FROM t";
            let before = first(&other, count).await;
            assert_eq!(first(&other, count).await, before);
            c.batch_execute(write).await.unwrap();
            let fresh = first(&direct, count).await;
            assert_eq!(first(&other, count).await, fresh, "after {write}");
        }

        // Reads inside a transaction block that wrote neither use nor fill the cache (not
        // even when the block rolls back, which invalidates nothing).
        c.batch_execute("INSERT INTO t (id, v) VALUES (5, 'five')")
            .await
            .unwrap();
        let in_block = "SELECT v FROM t WHERE id = 5";
        c.batch_execute("BEGIN; UPDATE t SET v = 'five' WHERE id = 5")
            .await
            .unwrap();
        for _ in 0..3 {
            assert_eq!(first(&c, in_block).await.as_deref(), Some("five"));
        }
        c.batch_execute("ROLLBACK").await.unwrap();
        direct
            .batch_execute("UPDATE t SET v = 'direct' WHERE id = 5")
            .await
            .unwrap();
        assert_eq!(first(&c, in_block).await.as_deref(), Some("direct"));
    })
    .await;
}

#[tokio::test]
async fn each_clients_settings_are_part_of_its_key() {
    within(DEADLINE, async {
        let (_pg, memo, direct) = setup(1).await;
        let (utc, tokyo) = cache_support::utc_and_tokyo(&memo, "postgres").await;
        let q = "SELECT ts::text FROM t WHERE id = 1";
        for _ in 0..2 {
            cache_support::assert_ts_in_each_zone(&utc, &tokyo).await;
        }
        // Both are cached (a direct write is not seen), each under its own settings.
        direct
            .batch_execute("UPDATE t SET ts = ts + interval '1 hour'")
            .await
            .unwrap();
        cache_support::assert_ts_in_each_zone(&utc, &tokyo).await;
        // A client that changes its settings gets the result for its new settings.
        utc.batch_execute("SET TimeZone = 'Asia/Tokyo'")
            .await
            .unwrap();
        assert_eq!(
            first(&utc, q).await.as_deref(),
            Some("2024-01-01 21:00:00+09")
        );
        utc.batch_execute("RESET TimeZone; SET search_path = nowhere")
            .await
            .unwrap();
        let err = utc.simple_query("SELECT v FROM t WHERE id = 1").await;
        assert!(
            err.is_err(),
            "search_path is part of the key: t is not found"
        );
        // SET pgmemo.cache = off is answered by pgmemo and bypasses the cache.
        tokyo.batch_execute("SET pgmemo.cache = off").await.unwrap();
        assert_eq!(
            first(&tokyo, q).await.as_deref(),
            Some("2024-01-01 22:00:00+09")
        );
    })
    .await;
}

#[tokio::test]
async fn uncacheable_reads_are_refused() {
    within(DEADLINE, async {
        let (_pg, memo, direct) = setup(2).await;
        let c = memo.client("postgres", "postgres").await;
        for q in [
            "SELECT v || now()::text FROM t WHERE id = 1",
            "SELECT v FROM t WHERE id = 1 FOR UPDATE",
            "SELECT v || random()::text FROM t WHERE id = 1",
        ] {
            let a = first(&c, q).await;
            direct
                .batch_execute("UPDATE t SET v = v || '.' WHERE id = 1")
                .await
                .unwrap();
            let b = first(&c, q).await;
            assert_ne!(a, b, "{q} must not be served from the cache");
        }
        assert_eq!(show_cache(&memo, "hits").await, 0);
    })
    .await;
}

#[tokio::test]
async fn concurrent_misses_on_one_key_run_once() {
    within(DEADLINE, async {
        let (pg, memo, _direct) = setup(4).await;
        cache_support::create_slow_function(&pg).await;
        let q = "SELECT v, slow(1) FROM t WHERE id = 1";
        // The first run plans the statement (and learns the context); the concurrent ones
        // after it have everything they need before taking a server.
        let warm = memo.client("postgres", "postgres").await;
        assert_eq!(
            first(&warm, "SELECT v, slow(2) FROM t WHERE id = 1")
                .await
                .as_deref(),
            Some("one")
        );
        let mut clients = Vec::new();
        for _ in 0..4 {
            let c = memo.client("postgres", "postgres").await;
            first(&c, "SELECT 1").await;
            clients.push(c);
        }
        let misses_before = show_cache(&memo, "misses").await;
        let tasks: Vec<_> = clients
            .into_iter()
            .map(|c| tokio::spawn(async move { first(&c, q).await }))
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap().as_deref(), Some("one"));
        }
        assert_eq!(show_cache(&memo, "misses").await - misses_before, 1);
    })
    .await;
}

#[tokio::test]
async fn a_cancel_while_waiting_for_another_clients_fill_answers_at_once() {
    within(DEADLINE, async {
        let (pg, memo, direct) = setup(2).await;
        cache_support::a_cancel_while_waiting_for_another_sessions_fill_answers_at_once(
            &pg, &memo, &direct,
        )
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_cancel_during_catalog_lookups_cancels_the_statement() {
    within(DEADLINE, async {
        let (_pg, memo, direct) = setup(2).await;
        let c =
            cache_support::a_cancel_during_catalog_lookups_cancels_the_statement(&memo, &direct)
                .await;
        // Transaction pooling looks statements up only when it attaches a server, at the start
        // of a transaction: inside a block a cancel goes to the server that runs the statement.
        cache_support::a_cancel_during_catalog_lookups_cancels_batches(&c, &direct).await;
    })
    .await;
}

#[tokio::test]
async fn hidden_and_indirect_writes_invalidate_what_they_change() {
    within(DEADLINE, async {
        let (pg, memo, direct) = setup(2).await;
        cache_support::hidden_and_indirect_writes_invalidate_what_they_change(&memo, &pg, &direct)
            .await;
    })
    .await;
}

/// One server: the hidden code's `set_config` must not stay on it for the next client.
#[tokio::test]
async fn settings_changed_by_hidden_code_of_a_write_are_seen() {
    within(DEADLINE, async {
        let (pg, memo, direct) = setup(1).await;
        cache_support::settings_changed_by_hidden_code_of_a_write_are_seen(&memo, &pg, &direct)
            .await;
    })
    .await;
}

#[tokio::test]
async fn results_follow_the_session() {
    within(DEADLINE, async {
        let (pg, memo, _direct) = setup(2).await;
        cache_support::results_follow_the_session(&memo, &pg, "SET LOCAL ROLE outsider").await;
    })
    .await;
}

#[tokio::test]
async fn a_query_drops_the_unnamed_statement_for_the_cache_too() {
    within(DEADLINE, async {
        let (pg, memo, _direct) = cache_support::setup_with(|c| {
            c.pool_mode = PoolMode::Transaction;
            c.pool_size = 2;
            c.invalidation = Invalidation::Proxy;
            c.cache_admission = pgmemo::config::CacheAdmission::Always;
        })
        .await;
        cache_support::a_query_drops_the_unnamed_statement_for_the_cache_too(&memo, &pg).await;
    })
    .await;
}

#[tokio::test]
async fn a_commit_that_chains_invalidates_at_once() {
    within(DEADLINE, async {
        let (_pg, memo, direct) = setup(2).await;
        cache_support::a_commit_that_chains_invalidates_at_once(&memo, &direct).await;
    })
    .await;
}

#[tokio::test]
async fn a_pipelined_miss_does_not_wait_for_another_sessions_fill() {
    within(DEADLINE, async {
        let (pg, memo, direct) = setup(4).await;
        cache_support::a_pipelined_miss_does_not_wait_for_another_sessions_fill(
            &memo, &pg, &direct,
        )
        .await;
    })
    .await;
}

/// A Bind of the client's unnamed statement pipelined without a Parse in its batch waits for
/// the batch in front that parsed it (docs/cache.md): a Parse failing in flight there would
/// have left no unnamed statement. At a boundary the same batch is answered from the cache;
/// behind the Parse it is answered once that batch is, from the statement it left.
#[tokio::test]
async fn a_pipelined_bind_of_the_unnamed_statement_waits_for_the_parse_in_front() {
    use raw::*;
    within(DEADLINE, async {
        let (_pg, memo, _direct) = setup(2).await;
        let mut c = Raw::connect(memo.addr()).await;
        let text = "SELECT v FROM t WHERE id = $1";
        let run = |id: &str| [parse(text, &[23]), bind(&[id]), execute(), sync()].concat();
        let exec = |id: &str| [bind(&[id]), execute(), sync()].concat();
        let answer = |v: &str| (vec!['1', '2', 'D', 'C', 'Z'], vec![v.to_owned()]);
        // Stored from its second miss, then served: whole batches and a Bind-only one.
        for _ in 0..3 {
            assert_eq!(c.round_trip(&[run("2")]).await, answer("two"));
        }
        let hits = show_cache(&memo, "hits").await;
        assert!(hits >= 1, "the third run was served");
        let bound = (vec!['2', 'D', 'C', 'Z'], vec!["two".to_owned()]);
        assert_eq!(c.round_trip(&[exec("2")]).await, bound);
        assert_eq!(
            show_cache(&memo, "hits").await,
            hits + 1,
            "a Bind-only batch at a boundary is served"
        );
        // Behind a miss (the same statement with a value never read) it waits for that
        // batch, then is served from what the Parse there left.
        assert_eq!(
            c.round_trip(&[run("1"), exec("2")]).await,
            answer("one"),
            "the miss in front"
        );
        assert_eq!(c.round_trip(&[]).await, bound, "the pipelined Bind");
        assert_eq!(
            show_cache(&memo, "hits").await,
            hits + 2,
            "the pipelined Bind was answered from the cache after the Parse in front"
        );
        // Behind a Parse that fails, the Bind finds no unnamed statement, as in PostgreSQL.
        let failing = [parse("SELECT v FROM no_such_table", &[]), sync()].concat();
        let (tags, _) = c.round_trip(&[failing, exec("2")]).await;
        assert_eq!(tags, vec!['E', 'Z'], "the failing Parse");
        let (tags, _) = c.round_trip(&[]).await;
        assert_eq!(
            tags,
            vec!['E', 'Z'],
            "the Bind behind it finds no unnamed statement"
        );
    })
    .await;
}

/// 12 clients over 3 server connections read and write the same rows for 10 s
/// ([`cache_support::reads_never_stale`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reads_and_writes_never_see_stale_values() {
    within(DEADLINE, async {
        let pg = cache_support::kv_cluster().await;
        let config = Config {
            pool_mode: PoolMode::Transaction,
            pool_size: 3,
            cache: Switch::On,
            invalidation: Invalidation::Proxy,
            ..pgmemo_config_for(pg.port())
        };
        let memo = spawn_pgmemo(config).await.unwrap();
        let (reads, writes) =
            cache_support::reads_never_stale(&memo, 12, Duration::from_secs(10)).await;
        assert!(reads > 100 && writes > 10, "{reads} reads, {writes} writes");
        assert!(
            show_cache(&memo, "hits").await > 0,
            "some reads were served from the cache"
        );
    })
    .await;
}

#[tokio::test]
async fn a_write_first_seen_in_a_block_is_planned_after_it_and_then_invalidates_only_its_table() {
    within(DEADLINE, async {
        let (pg, memo, direct) = setup(1).await;
        pg.psql(
            "CREATE TABLE other (id int PRIMARY KEY, v text); INSERT INTO other VALUES (1, 'a');",
        )
        .await;
        let c = memo.client("postgres", "postgres").await;
        let q = "SELECT v FROM other WHERE id = 1";
        let write = "UPDATE t SET v = v || '.' WHERE id = 1";
        assert_eq!(first(&c, q).await.as_deref(), Some("a"));
        // Unknown to pgmemo inside a block: it may write anything, so `other` goes too.
        c.batch_execute("BEGIN").await.unwrap();
        c.batch_execute(write).await.unwrap();
        c.batch_execute("COMMIT").await.unwrap();
        direct
            .batch_execute("UPDATE other SET v = 'b'")
            .await
            .unwrap();
        assert_eq!(first(&c, q).await.as_deref(), Some("b"));
        // Planned after that transaction: the same write now invalidates only `t`.
        c.batch_execute("BEGIN").await.unwrap();
        c.batch_execute(write).await.unwrap();
        c.batch_execute("COMMIT").await.unwrap();
        direct
            .batch_execute("UPDATE other SET v = 'c'")
            .await
            .unwrap();
        assert_eq!(
            first(&c, q).await.as_deref(),
            Some("b"),
            "the cached read of another table survives"
        );
        assert_eq!(
            first(&c, "SELECT v FROM t WHERE id = 1").await.as_deref(),
            Some("one..")
        );
    })
    .await;
}

/// A read first seen inside a block is planned without the catalog: the relation it reads
/// may be a view whose volatile function writes, so it counts as writing anything until it
/// is planned.
#[tokio::test]
async fn a_read_first_seen_in_a_block_may_write_through_a_view() {
    within(DEADLINE, async {
        let (pg, memo, _direct) = setup(1).await;
        pg.psql(
            "CREATE TABLE audit (n int);
             CREATE FUNCTION note() RETURNS int VOLATILE LANGUAGE plpgsql
               AS $$BEGIN INSERT INTO audit VALUES (1); RETURN 1; END$$;
             CREATE VIEW noting AS SELECT note() AS n;",
        )
        .await;
        let c = memo.client("postgres", "postgres").await;
        let count = "SELECT count(*) FROM audit";
        assert_eq!(first(&c, count).await.as_deref(), Some("0"));
        assert_eq!(first(&c, count).await.as_deref(), Some("0"));
        c.batch_execute("BEGIN").await.unwrap();
        assert_eq!(
            first(&c, "SELECT n FROM noting").await.as_deref(),
            Some("1")
        );
        c.batch_execute("COMMIT").await.unwrap();
        assert_eq!(
            first(&c, count).await.as_deref(),
            Some("1"),
            "after the commit"
        );
    })
    .await;
}

#[tokio::test]
async fn a_refused_parse_of_a_name_in_use_keeps_the_old_statement() {
    let (_pg, memo, _direct) = setup(2).await;
    cache_support::a_name_in_use_keeps_its_statement(&memo).await;
}

#[tokio::test]
async fn a_refused_parse_leaves_no_statement() {
    let (_pg, memo, _direct) = setup(2).await;
    cache_support::a_refused_parse_leaves_no_statement(&memo).await;
}

#[tokio::test]
async fn untracked_writes_never_leave_stale_results() {
    within(DEADLINE, async {
        let (_pg, memo, _direct) = setup(2).await;
        cache_support::untracked_writes_never_leave_stale_results(&memo).await;
    })
    .await;
}

#[tokio::test]
async fn reads_in_a_block_that_has_not_written_are_served_from_the_cache() {
    within(DEADLINE, async {
        let (_pg, memo, direct) = setup(2).await;
        let c = memo.client("postgres", "postgres").await;
        let q = "SELECT v FROM t WHERE id = 1";
        assert_eq!(first(&c, q).await.as_deref(), Some("one"));
        direct
            .batch_execute("UPDATE t SET v = 'direct' WHERE id = 1")
            .await
            .unwrap();
        c.batch_execute("BEGIN").await.unwrap();
        assert_eq!(
            first(&c, q).await.as_deref(),
            Some("one"),
            "a read-committed block that has not written is served from the cache"
        );
        // Once the block has written, its reads go to the server (and see its own write).
        c.batch_execute("UPDATE t SET v = 'mine' WHERE id = 2")
            .await
            .unwrap();
        assert_eq!(first(&c, q).await.as_deref(), Some("direct"));
        c.batch_execute("ROLLBACK").await.unwrap();
        // REPEATABLE READ blocks are never served from the cache.
        c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            .await
            .unwrap();
        assert_eq!(first(&c, q).await.as_deref(), Some("direct"));
        c.batch_execute("COMMIT").await.unwrap();
        // Nor blocks that changed a setting.
        c.batch_execute("BEGIN; SET LOCAL TimeZone = 'UTC'")
            .await
            .unwrap();
        assert_eq!(first(&c, q).await.as_deref(), Some("direct"));
        c.batch_execute("COMMIT").await.unwrap();
    })
    .await;
}

/// Applications that wrap every request in a transaction (ORMs) read only inside blocks: a
/// read in a read-committed block that has not written is stored as an autocommit read would
/// be (once its shape was planned, after the first block), in the simple and the extended
/// protocol, and answers clients outside blocks. A read after the block wrote (it sees the
/// block's own uncommitted write) and a read under REPEATABLE READ (it sees its snapshot,
/// older than a write that committed since) are never stored.
#[tokio::test]
async fn reads_in_a_block_that_has_not_written_are_stored() {
    within(DEADLINE, async {
        let (_pg, memo, direct) = setup(3).await;
        let c = memo.client("postgres", "postgres").await;
        let other = memo.client("postgres", "postgres").await;
        let simple = "SELECT v FROM t WHERE id = 1";
        let extended = "SELECT v || '!' FROM t WHERE id = $1";
        let named = c.prepare(extended).await.unwrap();
        // The first block plans the shapes, the next two miss (admission stores a cheap
        // result from its second miss); two more for margin.
        for _ in 0..5 {
            c.batch_execute("BEGIN").await.unwrap();
            assert_eq!(first(&c, simple).await.as_deref(), Some("one"));
            let row = c.query_one(&named, &[&2i32]).await.unwrap();
            assert_eq!(row.get::<_, String>(0), "two!");
            c.batch_execute("COMMIT").await.unwrap();
        }
        direct
            .batch_execute("UPDATE t SET v = 'direct'")
            .await
            .unwrap();
        assert_eq!(
            first(&other, simple).await.as_deref(),
            Some("one"),
            "stored from a block (simple protocol)"
        );
        let row = other.query_one(extended, &[&2i32]).await.unwrap();
        assert_eq!(
            row.get::<_, String>(0),
            "two!",
            "stored from a block (extended protocol)"
        );

        // The block's own uncommitted write is never stored.
        let wrote = "SELECT v FROM t WHERE id = 2";
        c.batch_execute("BEGIN; UPDATE t SET v = 'uncommitted' WHERE id = 2")
            .await
            .unwrap();
        for _ in 0..3 {
            assert_eq!(first(&c, wrote).await.as_deref(), Some("uncommitted"));
        }
        c.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(first(&other, wrote).await.as_deref(), Some("direct"));

        // Nor a snapshot older than a write committed through pgmemo meanwhile.
        c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            .await
            .unwrap();
        assert_eq!(first(&c, wrote).await.as_deref(), Some("direct"));
        other
            .batch_execute("UPDATE t SET v = 'newer' WHERE id = 2")
            .await
            .unwrap();
        for _ in 0..3 {
            assert_eq!(first(&c, wrote).await.as_deref(), Some("direct"));
        }
        c.batch_execute("COMMIT").await.unwrap();
        assert_eq!(first(&other, wrote).await.as_deref(), Some("newer"));
    })
    .await;
}

/// The same in the extended protocol: a named statement's Bind/Execute and an unnamed
/// statement's Parse/Bind/Describe/Execute inside a read-committed block that has not written
/// are answered from the cache; once it wrote, or under REPEATABLE READ, they go to the server.
#[tokio::test]
async fn extended_reads_in_a_block_that_has_not_written_are_served_from_the_cache() {
    within(DEADLINE, async {
        // Two clients in blocks hold a server each; the admin console needs a third.
        let (_pg, memo, direct) = setup(3).await;
        let c = memo.client("postgres", "postgres").await;
        let named = c.prepare("SELECT v FROM t WHERE id = $1").await.unwrap();
        let by_name = || async {
            c.query_one(&named, &[&1i32])
                .await
                .unwrap()
                .get::<_, String>(0)
        };
        let mut r = raw::Raw::connect(memo.addr()).await;
        let unnamed = [
            raw::parse("SELECT v || '' FROM t WHERE id = $1", &[23]),
            raw::bind(&["1"]),
            raw::describe_portal(),
            raw::execute(),
            raw::sync(),
        ];
        // Stored outside a block (a cheap result from its second miss on).
        for _ in 0..3 {
            assert_eq!(by_name().await, "one");
            assert_eq!(r.round_trip(&unnamed).await.1, ["one"]);
        }
        direct
            .batch_execute("UPDATE t SET v = 'direct' WHERE id = 1")
            .await
            .unwrap();
        let hits = show_cache(&memo, "hits").await;
        c.batch_execute("BEGIN").await.unwrap();
        r.round_trip(&[raw::query("BEGIN")]).await;
        assert_eq!(
            by_name().await,
            "one",
            "a named statement's read in the block"
        );
        let (tags, values) = r.round_trip(&unnamed).await;
        assert_eq!(values, ["one"], "an unnamed statement's read in the block");
        assert_eq!(
            tags,
            ['1', '2', 'T', 'D', 'C', 'Z'],
            "as PostgreSQL answers"
        );
        assert_eq!(show_cache(&memo, "hits").await, hits + 2);
        // The block goes on at the server as usual, the unnamed statement too.
        assert_eq!(
            first(&c, "SELECT count(*) FROM t").await.as_deref(),
            Some("2")
        );
        let (_, values) = r
            .round_trip(&[raw::bind(&["2"]), raw::execute(), raw::sync()])
            .await;
        assert_eq!(values, ["two"]);
        c.batch_execute("UPDATE t SET v = 'mine' WHERE id = 2")
            .await
            .unwrap();
        r.round_trip(&[raw::query("INSERT INTO t (id, v) VALUES (3, 'three')")])
            .await;
        assert_eq!(by_name().await, "direct", "after the block wrote");
        assert_eq!(
            r.round_trip(&unnamed).await.1,
            ["direct"],
            "after the block wrote"
        );
        c.batch_execute("ROLLBACK").await.unwrap();
        r.round_trip(&[raw::query("ROLLBACK")]).await;
        c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            .await
            .unwrap();
        assert_eq!(by_name().await, "direct", "repeatable read");
        c.batch_execute("COMMIT").await.unwrap();
        // Outside the block the entries still answer (nothing wrote t through pgmemo).
        assert_eq!(by_name().await, "one");
        assert_eq!(r.round_trip(&unnamed).await.1, ["one"]);
    })
    .await;
}

/// A write executed after a ROLLBACK in one extended-protocol batch runs on its own and
/// commits at the Sync: it invalidates, although the block before it rolled back.
#[tokio::test]
async fn a_write_batched_after_a_rollback_invalidates() {
    within(DEADLINE, async {
        let (_pg, memo, direct) = setup(2).await;
        let c = memo.client("postgres", "postgres").await;
        let q = "SELECT v FROM t WHERE id = 1";
        let before = first(&direct, q).await;
        assert_eq!(first(&c, q).await, before);
        assert_eq!(first(&c, q).await, before);
        let mut r = raw::Raw::connect(memo.addr()).await;
        r.round_trip(&[raw::query("BEGIN")]).await;
        r.round_trip(&[
            raw::parse("ROLLBACK", &[]),
            raw::bind(&[]),
            raw::execute(),
            raw::parse("UPDATE t SET v = 'after rollback' WHERE id = 1", &[]),
            raw::bind(&[]),
            raw::execute(),
            raw::sync(),
        ])
        .await;
        assert_eq!(
            first(&direct, q).await.as_deref(),
            Some("after rollback"),
            "committed at the Sync"
        );
        assert_eq!(first(&c, q).await.as_deref(), Some("after rollback"));
    })
    .await;
}

/// A client that leaves while its autocommit write runs: the server still commits it. The
/// cache is invalidated at once and again once the server has ended the write, so reads
/// stored while it ran do not outlive it.
#[tokio::test]
async fn a_write_its_client_left_running_still_invalidates() {
    within(DEADLINE, async {
        let (_pg, memo, direct) = setup(2).await;
        let c = memo.client("postgres", "postgres").await;
        let q = "SELECT v FROM t WHERE id = 1";
        assert_eq!(first(&c, q).await.as_deref(), Some("one"));
        assert_eq!(first(&c, q).await.as_deref(), Some("one"));
        let write = "UPDATE t SET v = 'left' WHERE id = 1 AND pg_sleep(1) IS NOT NULL";
        let mut r = raw::Raw::connect(memo.addr()).await;
        r.exchange(&[raw::query(write)], 0).await;
        testkit::assert_eventually(Duration::from_secs(10), "the write runs", || {
            testkit::query_running(&direct, write)
        })
        .await;
        drop(r);
        for _ in 0..2 {
            assert_eq!(first(&c, q).await.as_deref(), Some("one"));
        }
        testkit::assert_eventually(Duration::from_secs(10), "the write committed", || async {
            first(&direct, q).await.as_deref() == Some("left")
        })
        .await;
        testkit::assert_eventually(Duration::from_secs(10), "pgmemo serves it", || async {
            first(&c, q).await.as_deref() == Some("left")
        })
        .await;
    })
    .await;
}

/// A Parse of the unnamed statement that the server skipped (an error earlier in the batch)
/// leaves the statement it had: a later Bind without a Parse runs that one, and its result
/// is neither keyed nor stored under the skipped text.
#[tokio::test]
async fn a_skipped_unnamed_parse_keeps_the_statement_the_server_runs() {
    within(DEADLINE, async {
        let (_pg, memo, _direct) = setup(1).await;
        let first_text = "SELECT 'first'::text AS v";
        let second_text = "SELECT 'second'::text AS v";
        let mut c = raw::Raw::connect(memo.addr()).await;
        let (_, values) = c
            .round_trip(&[
                raw::parse(first_text, &[]),
                raw::bind(&[]),
                raw::execute(),
                raw::sync(),
            ])
            .await;
        assert_eq!(values, ["first"]);
        let (tags, _) = c
            .round_trip(&[
                raw::describe_portal_named("nope"),
                raw::parse(second_text, &[]),
                raw::bind(&[]),
                raw::execute(),
                raw::sync(),
            ])
            .await;
        assert_eq!(tags, ['E', 'Z'], "the rest of the batch is skipped");
        for _ in 0..3 {
            let (_, values) = c
                .round_trip(&[raw::bind(&[]), raw::execute(), raw::sync()])
                .await;
            assert_eq!(values, ["first"], "the statement the server kept");
        }
        let mut d = raw::Raw::connect(memo.addr()).await;
        for _ in 0..2 {
            let (_, values) = d
                .round_trip(&[
                    raw::parse(second_text, &[]),
                    raw::bind(&[]),
                    raw::execute(),
                    raw::sync(),
                ])
                .await;
            assert_eq!(values, ["second"]);
        }
    })
    .await;
}

#[tokio::test]
async fn a_client_leaving_mid_transaction_has_its_writes_invalidated_anyway() {
    within(DEADLINE, async {
        let (_pg, memo, direct) = setup(2).await;
        let c = memo.client("postgres", "postgres").await;
        let q = "SELECT v FROM t WHERE id = 1";
        assert_eq!(first(&c, q).await.as_deref(), Some("one"));
        // A client writes in a block and leaves without ending it: pgmemo cannot know whether a
        // COMMIT was on its way, so what the block wrote goes from the cache.
        let leaver = memo.client("postgres", "postgres").await;
        leaver
            .batch_execute("BEGIN; UPDATE t SET v = 'x' WHERE id = 2")
            .await
            .unwrap();
        drop(leaver);
        direct
            .batch_execute("UPDATE t SET v = 'behind' WHERE id = 1")
            .await
            .unwrap();
        let fresh = testkit::eventually(Duration::from_secs(10), || async {
            first(&c, q).await.as_deref() == Some("behind")
        })
        .await;
        assert!(
            fresh,
            "t's cached result outlived the abandoned block's write"
        );
    })
    .await;
}

#[tokio::test]
async fn a_reload_turning_a_database_off_stops_running_sessions() {
    within(DEADLINE, async {
        let (_pg, memo, direct) = setup(2).await;
        cache_support::a_reload_turning_a_database_off_stops_running_sessions(&memo, &direct).await;
    })
    .await;
}

#[tokio::test]
async fn a_reload_excluding_a_table_stops_caching_it() {
    within(DEADLINE, async {
        let (_pg, memo, direct) = setup(2).await;
        cache_support::a_reload_excluding_a_table_stops_caching_it(&memo, &direct).await;
    })
    .await;
}

#[tokio::test]
async fn a_reload_changing_a_ttl_empties_the_cache() {
    within(DEADLINE, async {
        let (_pg, memo, direct) = setup(2).await;
        cache_support::a_reload_changing_a_ttl_empties_the_cache(&memo, &direct).await;
    })
    .await;
}

#[tokio::test]
async fn writes_of_a_session_with_the_cache_off_still_invalidate() {
    within(DEADLINE, async {
        let (_pg, memo, _direct) = setup(2).await;
        cache_support::writes_of_a_session_with_the_cache_off_still_invalidate(&memo).await;
    })
    .await;
}

#[tokio::test]
async fn statement_described_batches_are_cached() {
    within(DEADLINE, async {
        let (pg, memo, direct) = setup(2).await;
        cache_support::statement_described_batches_are_cached(&memo, &pg, &direct).await;
    })
    .await;
}

#[tokio::test]
async fn a_read_pipelined_behind_a_write_in_a_block_sees_the_write() {
    within(DEADLINE, async {
        let (_pg, memo, _direct) = setup(2).await;
        cache_support::a_read_pipelined_behind_a_write_in_a_block_sees_the_write(&memo).await;
    })
    .await;
}

#[tokio::test]
async fn pipelined_misses_are_stored() {
    within(DEADLINE, async {
        let (_pg, memo, direct) = cache_support::setup_with(|c| {
            c.pool_mode = PoolMode::Transaction;
            c.pool_size = 2;
            c.invalidation = Invalidation::Proxy;
            c.cache_admission = pgmemo::config::CacheAdmission::Always;
        })
        .await;
        cache_support::pipelined_misses_are_stored(&memo, &direct).await;
    })
    .await;
}

#[tokio::test]
async fn row_limited_and_unkeyed_executions_are_refused() {
    within(DEADLINE, async {
        let (_pg, memo, direct) = setup(2).await;
        let mut c = memo.client("postgres", "postgres").await;
        cache_support::row_limited_and_unkeyed_executions_are_refused(&memo, &mut c, &direct).await;
    })
    .await;
}

#[tokio::test]
async fn reads_a_block_may_not_serve_are_counted_by_reason() {
    within(DEADLINE, async {
        let (_pg, memo, _direct) = setup(2).await;
        let c = memo.client("postgres", "postgres").await;
        cache_support::reads_a_block_may_not_serve_are_counted_by_reason(&memo, &c).await;
    })
    .await;
}

#[tokio::test]
async fn a_copy_of_a_write_invalidates_what_it_wrote() {
    within(DEADLINE, async {
        let (_pg, memo, _direct) = setup(2).await;
        let c = memo.client("postgres", "postgres").await;
        cache_support::a_copy_of_a_write_invalidates_what_it_wrote(&memo, &c).await;
    })
    .await;
}

/// A statement is planned with its client's settings even when the one server it gets was
/// last used by a client with another search_path: here the plan of B's new statement was
/// made with A's search_path, named A's table, and so a write to B's own table left B's
/// cached result in place.
#[tokio::test]
async fn statements_are_planned_with_their_clients_search_path() {
    within(DEADLINE, async {
        let (pg, memo, _direct) = setup(1).await;
        pg.psql(
            "CREATE SCHEMA a; CREATE TABLE a.t (id int PRIMARY KEY, v text); \
             INSERT INTO a.t VALUES (1, 'a-one'); \
             CREATE SCHEMA b; CREATE TABLE b.t (id int PRIMARY KEY, v text); \
             INSERT INTO b.t VALUES (1, 'b-one');",
        )
        .await;
        let a = memo.client("postgres", "postgres").await;
        let b = memo.client("postgres", "postgres").await;
        a.batch_execute("SET search_path = a").await.unwrap();
        b.batch_execute("SET search_path = b").await.unwrap();
        // Both contexts known.
        assert_eq!(
            first(&a, "SELECT v FROM t WHERE id = 1").await.as_deref(),
            Some("a-one")
        );
        assert_eq!(
            first(&b, "SELECT v FROM t WHERE id = 1").await.as_deref(),
            Some("b-one")
        );
        // The server runs with A's settings again.
        a.batch_execute("SELECT v, random() FROM t WHERE id = 1")
            .await
            .unwrap();
        // A statement new to B, planned now.
        let q = "SELECT v || '' FROM t WHERE id = 1";
        for _ in 0..3 {
            assert_eq!(first(&b, q).await.as_deref(), Some("b-one"));
        }
        b.batch_execute("UPDATE t SET v = 'b-two' WHERE id = 1")
            .await
            .unwrap();
        assert_eq!(first(&b, q).await.as_deref(), Some("b-two"), "stale");
    })
    .await;
}

#[tokio::test]
async fn a_query_that_ends_a_transaction_and_goes_on_keeps_what_committed() {
    within(DEADLINE, async {
        let (_pg, memo, _direct) = setup(2).await;
        let c = memo.client("postgres", "postgres").await;
        let other = memo.client("postgres", "postgres").await;
        cache_support::a_query_that_ends_a_transaction_and_goes_on_keeps_what_committed(&c, &other)
            .await;
    })
    .await;
}

/// Results are stored and served per shape of the rows the client expects: after DDL changes
/// a statement's result type, the result another client stores (of the new shape) never
/// reaches a client that described the statement before and still decodes its rows with
/// the old shape; that client gets PostgreSQL's 0A000 until it prepares the statement again.
#[tokio::test]
async fn a_result_of_another_shape_than_the_client_described_is_not_served() {
    within(DEADLINE, async {
        let (_pg, memo, _direct) = setup(1).await;
        let a = memo.client("postgres", "postgres").await;
        let b = memo.client("postgres", "postgres").await;
        let q = "SELECT * FROM t WHERE id = 1";
        let st = a.prepare(q).await.unwrap();
        for _ in 0..3 {
            let row = a.query_one(&st, &[]).await.unwrap();
            assert_eq!(row.get::<_, String>(1), "one");
        }
        a.batch_execute("ALTER TABLE t ALTER COLUMN v TYPE int USING length(v)")
            .await
            .unwrap();
        let b_st = b.prepare(q).await.unwrap();
        for _ in 0..3 {
            let row = b.query_one(&b_st, &[]).await.unwrap();
            assert_eq!(row.get::<_, i32>(1), 3);
        }
        let hits = show_cache(&memo, "hits").await;
        for _ in 0..2 {
            let err = a
                .query_one(&st, &[])
                .await
                .expect_err("rows of another shape");
            assert_eq!(testkit::sqlstate(&err), Some("0A000"), "{err}");
        }
        assert_eq!(show_cache(&memo, "hits").await, hits, "nothing served to A");
        let st = a.prepare(q).await.unwrap();
        assert_eq!(a.query_one(&st, &[]).await.unwrap().get::<_, i32>(1), 3);
    })
    .await;
}

//! The result cache's correctness matrix, against a real PostgreSQL. Whether a read was served
//! from the cache is observed from outside: after a write made directly to the server (which
//! pgmemo cannot see without the replication feed), a cached read still returns the old value
//! and an uncached one the new value.

mod cache_support;
mod raw;

use cache_support::{admin_rows, first, served_from_cache, setup_with, show_cache};
use testkit::{pgmemo_config_for, spawn_pgmemo, PgmemoInstance, TempPostgres};
use tokio_postgres::{Client, SimpleQueryMessage};

/// [`setup_with`] pgmemo's default configuration (session pooling).
async fn setup() -> (TempPostgres, PgmemoInstance, Client) {
    setup_with(|_| {}).await
}

/// A portal runs the statement it was bound to, even after its statement's name was given
/// to another text: the write of an UPDATE bound before the unnamed statement was parsed
/// again still invalidates.
#[tokio::test]
async fn a_portal_bound_before_its_statement_was_replaced_runs_what_it_was_bound_to() {
    let (_pg, memo, _direct) = setup().await;
    let c = memo.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 1";
    assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    let bind_p = raw::msg(b'B', b"p\0\0\0\0\0\0\0\0");
    let execute_p = raw::msg(b'E', b"p\0\0\0\0\0");
    let mut r = raw::Raw::connect(memo.addr()).await;
    let (tags, _) = r
        .round_trip(&[
            raw::parse("UPDATE t SET v = 'rebound' WHERE id = 1", &[]),
            bind_p,
            raw::parse("SELECT 1", &[]),
            execute_p,
            raw::sync(),
        ])
        .await;
    assert!(!tags.contains(&'E'), "{tags:?}");
    assert_eq!(first(&c, q).await.as_deref(), Some("rebound"));
}

/// A Parse of a name in use under another text fails with 42P05 and the server keeps the
/// old statement: a later Bind of the name (its BindComplete says only that the name exists)
/// runs the old statement, a write, which is neither answered from the cache nor stored as
/// the refused text's result.
#[tokio::test]
async fn a_refused_parse_does_not_make_its_text_the_names_statement() {
    let (_pg, memo, direct) = setup().await;
    let mut r = raw::Raw::connect(memo.addr()).await;
    let run = [raw::bind_named("s", &[]), raw::execute(), raw::sync()];
    r.round_trip(&[
        raw::parse_named("s", "DELETE FROM t WHERE id = 100", &[]),
        raw::sync(),
    ])
    .await;
    let (tags, _) = r
        .round_trip(&[
            raw::parse_named("s", "SELECT count(*) FROM t", &[]),
            raw::sync(),
        ])
        .await;
    assert!(tags.contains(&'E'), "42P05 expected: {tags:?}");
    for _ in 0..3 {
        direct
            .batch_execute("INSERT INTO t (id, v) VALUES (100, 'again')")
            .await
            .unwrap();
        let (tags, _) = r.round_trip(&run).await;
        assert!(!tags.contains(&'E'), "{tags:?}");
        let left = direct
            .query_one("SELECT count(*) FROM t WHERE id = 100", &[])
            .await
            .unwrap()
            .get::<_, i64>(0);
        assert_eq!(left, 0, "the DELETE ran");
    }
}

/// A parameter declared `unknown` (OID 705) is resolved by the server as one left
/// unspecified (0): a hit answers the batch's Describe with the server's types, not with the
/// declared ones.
#[tokio::test]
async fn a_hit_describes_unknown_parameters_as_the_server_resolved_them() {
    let (_pg, memo, _direct) = setup().await;
    let mut r = raw::Raw::connect(memo.addr()).await;
    let batch = [
        raw::parse("SELECT v FROM t WHERE v = $1", &[705]),
        raw::bind(&["one"]),
        raw::describe_statement(),
        raw::execute(),
        raw::sync(),
    ];
    let first = r.round_trip_bytes(&batch).await;
    for _ in 0..2 {
        assert_eq!(r.round_trip_bytes(&batch).await, first);
    }
}

#[tokio::test]
async fn repeated_read_is_cached_and_a_write_through_pgmemo_invalidates_it() {
    let (_pg, memo, direct) = setup().await;
    let c = memo.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 1";
    assert!(served_from_cache(&c, &direct, q).await);
    c.batch_execute("UPDATE t SET v = 'uno' WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(first(&c, q).await.as_deref(), Some("uno"));
    // Another session of the same role and settings shares the entry.
    let other = memo.client("postgres", "postgres").await;
    assert_eq!(first(&other, q).await.as_deref(), Some("uno"));
}

#[tokio::test]
async fn writes_of_every_kind_invalidate() {
    let (_pg, memo, _direct) = setup().await;
    let c = memo.client("postgres", "postgres").await;
    let q = "SELECT count(*) FROM t";
    assert_eq!(first(&c, q).await.as_deref(), Some("2"));
    c.batch_execute("INSERT INTO t (id, v) VALUES (3, 'three')")
        .await
        .unwrap();
    assert_eq!(first(&c, q).await.as_deref(), Some("3"));
    c.batch_execute("DELETE FROM t WHERE id = 3").await.unwrap();
    assert_eq!(first(&c, q).await.as_deref(), Some("2"));
    // COPY FROM STDIN.
    let sink = c.copy_in("COPY t (id, v) FROM STDIN").await.unwrap();
    use futures_util::SinkExt;
    let mut sink = Box::pin(sink);
    sink.send(bytes::Bytes::from_static(b"4\tfour\n"))
        .await
        .unwrap();
    sink.as_mut().finish().await.unwrap();
    assert_eq!(first(&c, q).await.as_deref(), Some("3"));
    c.batch_execute("TRUNCATE t").await.unwrap();
    assert_eq!(first(&c, q).await.as_deref(), Some("0"));
    // DDL: the new column appears in SELECT *.
    let star = "SELECT * FROM t";
    c.simple_query(star).await.unwrap();
    c.batch_execute(
        "INSERT INTO t (id, v) VALUES (5, 'five'); ALTER TABLE t ADD COLUMN extra int DEFAULT 7",
    )
    .await
    .unwrap();
    let rows = c.simple_query(star).await.unwrap();
    let row = rows
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })
        .expect("a row");
    assert_eq!(row.get("extra"), Some("7"));
}

#[tokio::test]
async fn transactions_commit_invalidates_rollback_does_not_and_written_reads_bypass() {
    let (_pg, memo, direct) = setup().await;
    let c = memo.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 2";
    // A transaction that wrote reads its own write, not the cache; a rollback invalidates
    // nothing.
    cache_support::a_rollback_invalidates_nothing(&c, &direct).await;

    // A committed write invalidates.
    c.batch_execute("BEGIN; UPDATE t SET v = 'committed' WHERE id = 2; COMMIT")
        .await
        .unwrap();
    assert_eq!(first(&c, q).await.as_deref(), Some("committed"));

    // REPEATABLE READ bypasses the cache.
    assert_eq!(first(&c, q).await.as_deref(), Some("committed"));
    direct
        .batch_execute("UPDATE t SET v = 'rr' WHERE id = 2")
        .await
        .unwrap();
    c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    assert_eq!(first(&c, q).await.as_deref(), Some("rr"));
    c.batch_execute("COMMIT").await.unwrap();
}

#[tokio::test]
async fn reads_that_must_not_be_cached_are_not() {
    let (pg, memo, direct) = setup().await;
    pg.psql(
        "CREATE SEQUENCE s; CREATE UNLOGGED TABLE u AS SELECT * FROM t;
         CREATE TABLE r AS SELECT * FROM t; ALTER TABLE r ENABLE ROW LEVEL SECURITY;
         CREATE FUNCTION stable_v(int) RETURNS text STABLE LANGUAGE sql AS 'SELECT v FROM t WHERE id = $1';
         CREATE VIEW vnow AS SELECT v, now() AS at FROM t;
         CREATE VIEW vsample AS SELECT v FROM t TABLESAMPLE SYSTEM (100);",
    )
    .await;
    let c = memo.client("postgres", "postgres").await;
    // A view reading the clock is not cached, but reading it writes nothing: a result
    // cached before stays (here stale on purpose, after a write pgmemo cannot see).
    let kept = "SELECT v FROM t WHERE id = 2";
    let cached = first(&c, kept).await;
    assert_eq!(first(&c, kept).await, cached);
    direct
        .batch_execute("UPDATE t SET v = v || '!' WHERE id = 2")
        .await
        .unwrap();
    first(&c, "SELECT v FROM vnow LIMIT 1").await;
    assert_eq!(first(&c, kept).await, cached, "the view's read invalidated");
    for sql in [
        "SELECT v FROM t WHERE id = 1 AND now() > '2000-01-01'",
        "SELECT v FROM t WHERE id = 1 AND random() >= 0",
        "SELECT v FROM t WHERE id = 1 FOR UPDATE",
        "SELECT v FROM t WHERE id = 1 AND current_timestamp IS NOT NULL",
        "SELECT v FROM t WHERE id = 1 AND 'now'::timestamptz > '2000-01-01'",
        "SELECT stable_v(1)",
        "SELECT v FROM vnow LIMIT 1",
        "SELECT v FROM vsample ORDER BY v LIMIT 1",
        "/* pgmemo:nocache */ SELECT v FROM t WHERE id = 1",
        "/*NO QUERY CACHE*/ SELECT v FROM t WHERE id = 2",
        "SELECT relname || (SELECT v FROM t WHERE id = 1) FROM pg_class WHERE relname = 't'",
    ] {
        assert!(
            !served_from_cache(&c, &direct, sql).await,
            "{sql} was cached"
        );
    }
    // Tables whose contents pgmemo must not cache: the probe changes t, so these read t
    // through a join to make the change visible.
    for sql in [
        "SELECT (SELECT v FROM t WHERE id = 1) || count(*) FROM u",
        "SELECT (SELECT v FROM t WHERE id = 1) || count(*) FROM r",
        "SELECT (SELECT v FROM t WHERE id = 1) || last_value FROM s",
    ] {
        assert!(
            !served_from_cache(&c, &direct, sql).await,
            "{sql} was cached"
        );
    }
    c.batch_execute("CREATE TEMP TABLE tmp AS SELECT 1 AS x")
        .await
        .unwrap();
    // Only this session sees tmp, so the fresh value comes from t directly.
    let tq = "SELECT (SELECT v FROM t WHERE id = 1) || x FROM tmp";
    first(&c, tq).await;
    first(&c, tq).await;
    direct
        .batch_execute("UPDATE t SET v = 'temp-probe' WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(
        first(&c, tq).await.as_deref(),
        Some("temp-probe1"),
        "temp table read was cached"
    );
    // And immutable functions are fine.
    assert!(served_from_cache(&c, &direct, "SELECT upper(v) FROM t WHERE id = 1").await);
}

/// `sql` is answered fresh after a direct write (not served from the cache), SHOW QUERIES
/// gives `reason` as its shape's last refusal, and so does EXPLAIN CACHE unless the statement
/// dropped the memoized plans (one that runs user code may have run DDL).
async fn assert_refused(
    memo: &PgmemoInstance,
    c: &Client,
    direct: &Client,
    sql: &str,
    reason: &str,
) {
    assert!(!served_from_cache(c, direct, sql).await, "{sql} was cached");
    let explained = admin_rows(memo, &format!("EXPLAIN CACHE {sql}")).await;
    let shape = explained[0][8].clone();
    let queries = admin_rows(memo, "SHOW QUERIES").await;
    let row = queries
        .iter()
        .find(|r| r[0] == shape)
        .unwrap_or_else(|| panic!("{sql}: no {shape:?} in {queries:?}"));
    assert_eq!(row[6].as_deref(), Some(reason), "{sql}: {row:?}");
    if explained[0][3].as_deref() != Some("unknown") {
        assert_eq!(
            explained[0][4].as_deref(),
            Some(reason),
            "{sql}: {explained:?}"
        );
    }
}

/// Operators are function calls: a user-defined one over a volatile or stable function keeps
/// a read out of the cache (also inside a view), with the reason EXPLAIN CACHE gives.
#[tokio::test]
async fn user_defined_operators_are_checked_for_volatility() {
    let (pg, memo, direct) = setup().await;
    pg.psql(
        "CREATE FUNCTION vol_add(int, int) RETURNS int VOLATILE LANGUAGE sql AS 'SELECT $1 + $2';
         CREATE OPERATOR +# (LEFTARG = int, RIGHTARG = int, FUNCTION = vol_add);
         CREATE FUNCTION stable_cat(text, text) RETURNS text STABLE LANGUAGE sql AS 'SELECT $1 || $2';
         CREATE OPERATOR ||| (LEFTARG = text, RIGHTARG = text, FUNCTION = stable_cat);
         CREATE FUNCTION imm_cat(text, text) RETURNS text IMMUTABLE LANGUAGE sql AS 'SELECT $1 || $2';
         CREATE OPERATOR &&& (LEFTARG = text, RIGHTARG = text, FUNCTION = imm_cat);
         CREATE VIEW stable_view AS SELECT id, v ||| '' AS w FROM t;",
    )
    .await;
    let c = memo.client("postgres", "postgres").await;
    for (sql, reason) in [
        ("SELECT v FROM t WHERE id +# 0 = 1", "volatile_function"),
        ("SELECT v ||| '!' FROM t WHERE id = 1", "stable_function"),
        (
            "SELECT v OPERATOR(public.|||) '!' FROM t WHERE id = 1",
            "stable_function",
        ),
        ("SELECT w FROM stable_view WHERE id = 1", "stable_function"),
    ] {
        assert_refused(&memo, &c, &direct, sql, reason).await;
    }
    // Immutable user-defined operators and the built-in ones are fine.
    assert!(served_from_cache(&c, &direct, "SELECT v &&& '!' FROM t WHERE id = 1").await);
    assert!(served_from_cache(&c, &direct, "SELECT v || '!' FROM t WHERE id + 0 = 1").await);
}

/// A cast runs a function too: a user-defined cast over a volatile or stable function keeps a
/// read out of the cache; built-in casts and immutable user-defined ones do not.
#[tokio::test]
async fn user_defined_casts_are_checked_for_volatility() {
    let (pg, memo, direct) = setup().await;
    pg.psql(
        "CREATE TYPE wrapped AS (v text);
         CREATE FUNCTION wrap(text) RETURNS wrapped VOLATILE LANGUAGE sql AS 'SELECT ROW($1)::wrapped';
         CREATE CAST (text AS wrapped) WITH FUNCTION wrap(text);
         CREATE TYPE held AS (v text);
         CREATE FUNCTION hold(text) RETURNS held STABLE LANGUAGE sql AS 'SELECT ROW($1)::held';
         CREATE CAST (text AS held) WITH FUNCTION hold(text);
         CREATE TYPE boxed AS (v text);
         CREATE FUNCTION box_it(text) RETURNS boxed IMMUTABLE LANGUAGE sql AS 'SELECT ROW($1)::boxed';
         CREATE CAST (text AS boxed) WITH FUNCTION box_it(text);",
    )
    .await;
    let c = memo.client("postgres", "postgres").await;
    for (sql, reason) in [
        (
            "SELECT (v::wrapped).v FROM t WHERE id = 1",
            "volatile_function",
        ),
        (
            "SELECT (CAST(v AS public.held)).v FROM t WHERE id = 1",
            "stable_function",
        ),
    ] {
        assert_refused(&memo, &c, &direct, sql, reason).await;
    }
    assert!(served_from_cache(&c, &direct, "SELECT (v::boxed).v FROM t WHERE id = 1").await);
    assert!(
        served_from_cache(
            &c,
            &direct,
            "SELECT v::varchar(9), id::int8 FROM t WHERE id = 1"
        )
        .await
    );
}

/// A volatile operator may write: a read it makes stale must not be served afterwards.
#[tokio::test]
async fn a_volatile_operator_that_writes_invalidates() {
    let (pg, memo, _direct) = setup().await;
    pg.psql(
        "CREATE TABLE counter (n int); INSERT INTO counter VALUES (0);
         CREATE FUNCTION bump(int, int) RETURNS int VOLATILE LANGUAGE sql
           AS 'UPDATE counter SET n = n + $2; SELECT $1';
         CREATE OPERATOR #+ (LEFTARG = int, RIGHTARG = int, FUNCTION = bump);",
    )
    .await;
    let c = memo.client("postgres", "postgres").await;
    let q = "SELECT n FROM counter";
    assert_eq!(first(&c, q).await.as_deref(), Some("0"));
    assert_eq!(first(&c, q).await.as_deref(), Some("0"));
    assert_eq!(first(&c, "SELECT 1 #+ 5").await.as_deref(), Some("1"));
    assert_eq!(
        first(&c, q).await.as_deref(),
        Some("5"),
        "the operator's write left a stale result"
    );
}

#[tokio::test]
async fn session_switch_turns_the_cache_off_for_one_session() {
    let (_pg, memo, direct) = setup().await;
    let c = memo.client("postgres", "postgres").await;
    c.batch_execute("SET pgmemo.cache = off").await.unwrap();
    assert!(!served_from_cache(&c, &direct, "SELECT v FROM t WHERE id = 1").await);
    c.batch_execute("SET pgmemo.cache = on").await.unwrap();
    assert!(served_from_cache(&c, &direct, "SELECT v FROM t WHERE id = 1").await);
}

#[tokio::test]
async fn roles_search_paths_and_time_zones_never_share_a_result() {
    let (pg, memo, _direct) = setup().await;
    pg.psql(
        "CREATE ROLE reader LOGIN; CREATE ROLE outsider LOGIN;
         GRANT SELECT ON t TO reader;
         CREATE SCHEMA a; CREATE SCHEMA b; CREATE TABLE a.x AS SELECT 'in a'::text AS w;
         CREATE TABLE b.x AS SELECT 'in b'::text AS w; GRANT USAGE ON SCHEMA a, b TO reader;
         GRANT SELECT ON a.x, b.x TO reader;",
    )
    .await;
    let q = "SELECT v FROM t WHERE id = 1";
    let reader = memo.client("reader", "postgres").await;
    assert_eq!(first(&reader, q).await.as_deref(), Some("one"));
    assert_eq!(first(&reader, q).await.as_deref(), Some("one"));
    let outsider = memo.client("outsider", "postgres").await;
    let err = outsider.simple_query(q).await.expect_err("no privilege");
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE)
    );

    let s1 = memo.client("reader", "postgres").await;
    let s2 = memo.client("reader", "postgres").await;
    s1.batch_execute("SET search_path = a").await.unwrap();
    s2.batch_execute("SET search_path = b").await.unwrap();
    for _ in 0..2 {
        assert_eq!(first(&s1, "SELECT w FROM x").await.as_deref(), Some("in a"));
        assert_eq!(first(&s2, "SELECT w FROM x").await.as_deref(), Some("in b"));
    }

    // A SET inside a transaction: the session's names resolve differently until it ends,
    // and nothing learnt meanwhile may leak to sessions with the old settings.
    let s3 = memo.client("reader", "postgres").await;
    s3.batch_execute("SET search_path = a").await.unwrap();
    assert_eq!(first(&s3, "SELECT w FROM x").await.as_deref(), Some("in a"));
    s3.batch_execute("BEGIN; SET LOCAL search_path = b")
        .await
        .unwrap();
    assert_eq!(
        first(&s3, "SELECT w FROM x WHERE true").await.as_deref(),
        Some("in b")
    );
    assert_eq!(
        first(&s1, "SELECT w FROM x WHERE true").await.as_deref(),
        Some("in a")
    );
    s3.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        first(&s3, "SELECT w FROM x WHERE true").await.as_deref(),
        Some("in a")
    );
    // s1's cached result depends on a.x (not on what s3 resolved): a write to a.x ends it.
    assert_eq!(
        first(&s1, "SELECT w FROM x WHERE true").await.as_deref(),
        Some("in a")
    );
    let admin = memo.client("postgres", "postgres").await;
    admin
        .batch_execute("UPDATE a.x SET w = 'in a!'")
        .await
        .unwrap();
    assert_eq!(
        first(&s1, "SELECT w FROM x WHERE true").await.as_deref(),
        Some("in a!")
    );

    let (z1, z2) = cache_support::utc_and_tokyo(&memo, "reader").await;
    for _ in 0..2 {
        cache_support::assert_ts_in_each_zone(&z1, &z2).await;
    }
}

#[tokio::test]
async fn settings_changed_by_functions_are_seen_and_builtins_cost_no_reread() {
    let (pg, memo, _direct) = setup().await;
    pg.psql(
        "CREATE SCHEMA a; CREATE SCHEMA b;
         CREATE TABLE a.x AS SELECT 'in a'::text AS w; CREATE TABLE b.x AS SELECT 'in b'::text AS w;
         CREATE FUNCTION public.use_b() RETURNS void VOLATILE LANGUAGE plpgsql
           AS $$ BEGIN PERFORM set_config('search_path', 'b', false); END $$;",
    )
    .await;
    let c = memo.client("postgres", "postgres").await;
    let q = "SELECT w FROM x";
    c.batch_execute("SET search_path = a").await.unwrap();
    for _ in 0..2 {
        assert_eq!(first(&c, q).await.as_deref(), Some("in a"));
    }
    // set_config changes what names mean: the next read must see it.
    first(&c, "SELECT set_config('search_path', 'b', false)").await;
    for _ in 0..2 {
        assert_eq!(
            first(&c, q).await.as_deref(),
            Some("in b"),
            "after set_config"
        );
    }
    // So may a function of the user's.
    c.batch_execute("SET search_path = a").await.unwrap();
    assert_eq!(first(&c, q).await.as_deref(), Some("in a"));
    first(&c, "SELECT public.use_b()").await;
    assert_eq!(first(&c, q).await.as_deref(), Some("in b"), "after use_b()");
    // Built-in volatile functions cannot: no query to read the settings again.
    let reads = show_cache(&memo, "context_reads").await;
    for sql in [
        "SELECT random() >= 0",
        "SELECT clock_timestamp() IS NOT NULL",
    ] {
        for _ in 0..3 {
            first(&c, sql).await;
            assert_eq!(first(&c, q).await.as_deref(), Some("in b"));
        }
    }
    assert_eq!(show_cache(&memo, "context_reads").await, reads);
}

#[tokio::test]
async fn prepared_statements_are_cached_per_parameter_values() {
    let (_pg, memo, direct) = setup().await;
    let c = memo.client("postgres", "postgres").await;
    let stmt = c.prepare("SELECT v FROM t WHERE id = $1").await.unwrap();
    let get = |id: i32| {
        let c = &c;
        let stmt = stmt.clone();
        async move {
            c.query_one(&stmt, &[&id])
                .await
                .unwrap()
                .get::<_, String>(0)
        }
    };
    assert_eq!(get(1).await, "one");
    // Another value of a quick statement is stored from its second miss (admission).
    assert_eq!(get(2).await, "two");
    assert_eq!(get(2).await, "two");
    assert_eq!(get(1).await, "one");
    direct
        .batch_execute("UPDATE t SET v = v || '!'")
        .await
        .unwrap();
    // Served from the cache, each with its own parameter's value.
    assert_eq!(get(1).await, "one");
    assert_eq!(get(2).await, "two");
    c.execute("UPDATE t SET v = 'fresh' WHERE id = 1", &[])
        .await
        .unwrap();
    assert_eq!(get(1).await, "fresh");
    // Binary results (tokio-postgres asks for binary) and text results never share an entry.
    assert_eq!(
        first(&c, "SELECT v FROM t WHERE id = 2").await.as_deref(),
        Some("two!")
    );
}

#[tokio::test]
async fn admin_console_reports_hits_and_purges() {
    let (_pg, memo, direct) = setup().await;
    let c = memo.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 1";
    first(&c, q).await;
    first(&c, q).await;
    let admin = memo.client("postgres", "pgmemo").await;
    let cache = admin.simple_query("SHOW CACHE").await.unwrap();
    let value = |name: &str| {
        cache.iter().find_map(|m| match m {
            SimpleQueryMessage::Row(r) if r.get(0) == Some(name) => r.get(1).map(str::to_owned),
            _ => None,
        })
    };
    assert_eq!(value("hits").as_deref(), Some("1"));
    assert_eq!(value("entries").as_deref(), Some("1"));
    let queries = admin.simple_query("SHOW QUERIES").await.unwrap();
    assert!(queries.iter().any(|m| matches!(m,
        SimpleQueryMessage::Row(r) if r.get(0) == Some("SELECT v FROM t WHERE id = ?") && r.get(2) == Some("1"))));
    direct
        .batch_execute("UPDATE t SET v = 'purged' WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    admin.simple_query("CACHE PURGE t").await.unwrap();
    assert_eq!(first(&c, q).await.as_deref(), Some("purged"));
    // Without a table: everything goes.
    let two = "SELECT v FROM t WHERE id = 2";
    for _ in 0..3 {
        first(&c, two).await;
    }
    direct
        .batch_execute("UPDATE t SET v = 'all purged'")
        .await
        .unwrap();
    assert_eq!(first(&c, two).await.as_deref(), Some("two"), "served");
    admin.simple_query("CACHE PURGE").await.unwrap();
    assert_eq!(show_cache(&memo, "entries").await, 0);
    assert_eq!(first(&c, q).await.as_deref(), Some("all purged"));
    assert_eq!(first(&c, two).await.as_deref(), Some("all purged"));
}

/// A response with a notice is never stored (docs/cache.md): answered from the cache, the
/// notice would be lost.
#[tokio::test]
async fn a_read_that_raises_a_notice_is_not_stored() {
    let (pg, memo, _direct) = setup().await;
    pg.psql(
        "CREATE FUNCTION noisy(x text) RETURNS text IMMUTABLE LANGUAGE plpgsql AS
         $$ BEGIN RAISE NOTICE 'reading %', x; RETURN x; END $$;",
    )
    .await;
    let c = memo.client("postgres", "postgres").await;
    let q = "SELECT noisy(v) FROM t WHERE id = 1";
    for round in 0..3 {
        let messages = c.simple_query(q).await.unwrap();
        assert!(
            messages
                .iter()
                .any(|m| matches!(m, SimpleQueryMessage::Row(_))),
            "round {round}"
        );
    }
    assert_eq!(show_cache(&memo, "hits").await, 0);
    assert!(show_cache(&memo, "refused_response_not_cacheable").await >= 1);
}

/// A parameter that reads the clock (`'now'` cast to a time) is never cached, in text format
/// and in binary format, in which a text parameter carries its text as well (tokio-postgres
/// sends every parameter in binary, as Npgsql does).
#[tokio::test]
async fn parameters_that_read_the_clock_are_not_cached_in_either_format() {
    let (_pg, memo, _direct) = setup().await;
    let c = memo.client("postgres", "postgres").await;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..3 {
        let row = c
            .query_one(
                "SELECT $1::text::timestamptz::text, v FROM t WHERE id = 1",
                &[&"now"],
            )
            .await
            .unwrap();
        seen.insert(row.get::<_, String>(0));
    }
    assert_eq!(seen.len(), 3, "each execution reads the clock: {seen:?}");
    assert_eq!(show_cache(&memo, "hits").await, 0);
}

/// A client of pgmemo with `options` at startup, and the notices it receives.
async fn client_hearing_notices(
    memo: &PgmemoInstance,
    options: &str,
) -> (Client, tokio::sync::mpsc::UnboundedReceiver<String>) {
    use futures_util::StreamExt;
    let mut config: tokio_postgres::Config = memo.url("postgres", "postgres").parse().unwrap();
    if !options.is_empty() {
        config.options(options);
    }
    let (client, mut connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notice(n) = message {
                let _ = tx.send(n.message().to_owned());
            }
        }
    });
    (client, rx)
}

/// The settings that decide which notices a statement sends are part of the key: a result
/// stored by a session that silenced them does not answer one that hears them. Sessions that
/// hear LOG or DEBUG messages are not served at all (their messages depend on more than the
/// statement).
#[tokio::test]
async fn a_result_stored_with_notices_silenced_does_not_answer_a_session_that_hears_them() {
    let (pg, memo, _direct) = setup().await;
    pg.psql(
        "CREATE FUNCTION noisy(x text) RETURNS text IMMUTABLE LANGUAGE plpgsql AS
         $$ BEGIN RAISE NOTICE 'reading %', x; RETURN x; END $$;",
    )
    .await;
    let q = "SELECT noisy(v) FROM t WHERE id = 1";
    let (quiet, _) = client_hearing_notices(&memo, "-c client_min_messages=warning").await;
    for _ in 0..3 {
        assert_eq!(first(&quiet, q).await.as_deref(), Some("one"));
    }
    assert!(
        show_cache(&memo, "hits").await >= 1,
        "the silenced session's result is cached"
    );
    let (loud, mut notices) = client_hearing_notices(&memo, "").await;
    assert_eq!(first(&loud, q).await.as_deref(), Some("one"));
    // The Notice arrives before the answer it belongs to.
    assert_eq!(notices.try_recv().ok().as_deref(), Some("reading one"));

    let (verbose, _) = client_hearing_notices(&memo, "-c client_min_messages=log").await;
    let plain = "SELECT v FROM t WHERE id = 2";
    for _ in 0..3 {
        assert_eq!(first(&verbose, plain).await.as_deref(), Some("two"));
    }
    assert!(cache_support::refused(&memo, "log_messages").await >= 1);
}

/// `COMMIT PREPARED` may commit writes of any table (docs/cache.md): every result of the
/// database goes. The writes of a transaction are seen as it is prepared, too early, and
/// reads between PREPARE TRANSACTION and COMMIT PREPARED store the old values again.
#[tokio::test]
async fn commit_prepared_invalidates_the_database() {
    let pg = TempPostgres::builder()
        .conf("max_prepared_transactions = 2")
        .start()
        .await
        .expect("cluster starts");
    pg.psql(
        "CREATE TABLE t (id int PRIMARY KEY, v text);
         INSERT INTO t VALUES (1, 'one');",
    )
    .await;
    let memo = spawn_pgmemo(pgmemo_config_for(pg.port()))
        .await
        .expect("pgmemo starts");
    let reader = memo.client("postgres", "postgres").await;
    let writer = memo.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 1";
    writer
        .batch_execute("BEGIN; UPDATE t SET v = 'prepared' WHERE id = 1; PREPARE TRANSACTION 'w'")
        .await
        .unwrap();
    for _ in 0..3 {
        assert_eq!(first(&reader, q).await.as_deref(), Some("one"));
    }
    assert!(
        show_cache(&memo, "hits").await >= 1,
        "the old value is served"
    );
    writer.batch_execute("COMMIT PREPARED 'w'").await.unwrap();
    assert_eq!(first(&reader, q).await.as_deref(), Some("prepared"));
}

#[tokio::test]
async fn explain_cache_and_show_tables_tell_what_the_cache_decided() {
    let (_pg, memo, _direct) = setup().await;
    let c = memo.client("postgres", "postgres").await;
    let cached = "SELECT v FROM t WHERE id = 1";
    let volatile = "SELECT v FROM t WHERE id = 1 AND random() >= 0";
    first(&c, cached).await;
    first(&c, cached).await;
    first(&c, volatile).await;
    // Columns: database, role, context, cacheable, reason, depends_on, ttl, invalidates, shape.
    let explained = admin_rows(&memo, &format!("EXPLAIN CACHE {cached}")).await;
    let r = &explained[0];
    assert_eq!(r[1].as_deref(), Some("postgres"), "{explained:?}");
    assert_eq!(r[3].as_deref(), Some("yes"), "{explained:?}");
    assert!(
        r[5].as_deref()
            .is_some_and(|d| d.split(", ").any(|t| t.ends_with('t'))),
        "depends on t: {explained:?}"
    );
    assert_eq!(r[8].as_deref(), Some("SELECT v FROM t WHERE id = ?"));
    let explained = admin_rows(&memo, &format!("EXPLAIN CACHE {volatile}")).await;
    assert_eq!(explained[0][3].as_deref(), Some("no"), "{explained:?}");
    assert_eq!(
        explained[0][4].as_deref(),
        Some("volatile_function"),
        "{explained:?}"
    );
    // A statement pgmemo has not planned yet is analysed without the catalog.
    let explained = admin_rows(&memo, "EXPLAIN CACHE SELECT v FROM t FOR UPDATE").await;
    assert_eq!(explained[0][3].as_deref(), Some("no"), "{explained:?}");
    assert_eq!(
        explained[0][4].as_deref(),
        Some("locking_clause"),
        "{explained:?}"
    );

    // Columns: database, table, oid, fills, invalidations.
    let t_row = |rows: &[Vec<Option<String>>]| {
        rows.iter()
            .find(|r| r[1].as_deref().is_some_and(|n| n.ends_with('t')))
            .cloned()
            .unwrap_or_else(|| panic!("no row for t: {rows:?}"))
    };
    let before = t_row(&admin_rows(&memo, "SHOW TABLES").await);
    assert_eq!(
        before[3].as_deref(),
        Some("1"),
        "one result stored: {before:?}"
    );
    let invalidations: u64 = before[4].as_deref().unwrap().parse().unwrap();
    c.batch_execute("UPDATE t SET v = 'changed' WHERE id = 2")
        .await
        .unwrap();
    let after = t_row(&admin_rows(&memo, "SHOW TABLES").await);
    assert_eq!(
        after[4].as_deref().unwrap().parse::<u64>().unwrap(),
        invalidations + 1,
        "the write through pgmemo invalidated t: {after:?}"
    );
}

/// Reads that pgmemo relays without storing: a result over `max_entry_size`, rows fetched
/// from a cursor, an Execute with a row limit (the portal is suspended, the result partial).
/// Each is answered fresh after a direct write, and counted under its refusal.
#[tokio::test]
async fn oversized_results_cursors_and_row_limited_portals_are_not_cached() {
    let (_pg, memo, direct) =
        setup_with(|c| c.max_entry_size = pgmemo::config::ByteSize(4096)).await;
    let mut c = memo.client("postgres", "postgres").await;

    // 2,000 copies of v: 6 kB and more, over the 4 kB limit; a small result still fits.
    let big = "SELECT repeat(v, 2000) FROM t WHERE id = 1";
    assert!(!served_from_cache(&c, &direct, big).await);
    assert!(show_cache(&memo, "refused_too_large").await > 0);
    assert!(served_from_cache(&c, &direct, "SELECT v FROM t WHERE id = 2").await);

    for round in 0..3 {
        c.batch_execute("BEGIN; DECLARE cur CURSOR FOR SELECT v FROM t WHERE id = 1")
            .await
            .unwrap();
        let fetched = first(&c, "FETCH 1 FROM cur").await;
        c.batch_execute("COMMIT").await.unwrap();
        let fresh = first(&direct, "SELECT v FROM t WHERE id = 1").await;
        assert_eq!(fetched, fresh, "FETCH, round {round}");
        direct
            .batch_execute("UPDATE t SET v = v || '+' WHERE id = 1")
            .await
            .unwrap();
    }

    cache_support::row_limited_and_unkeyed_executions_are_refused(&memo, &mut c, &direct).await;
}

/// Sessions waiting for another's fill of the same key run the query themselves as soon as
/// that fill ends without an entry (here its result is over `max_entry_size`), not after the
/// 10 s a wait may last.
#[tokio::test]
async fn waiters_run_the_query_at_once_when_the_fill_stores_nothing() {
    let (pg, memo, _direct) =
        setup_with(|c| c.max_entry_size = pgmemo::config::ByteSize(4096)).await;
    cache_support::create_slow_function(&pg).await;
    let q = "SELECT repeat(v, 2000), slow(1) FROM t WHERE id = 1";
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let c = memo.client("postgres", "postgres").await;
        tasks.push(tokio::spawn(async move { first(&c, q).await }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().map(|v| v.len()), Some(6000));
    }
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(8),
        "waited for the cap: {took:?}"
    );
    assert!(
        show_cache(&memo, "flight_waits").await >= 1,
        "someone waited"
    );
    assert!(show_cache(&memo, "refused_too_large").await >= 1);
    assert_eq!(show_cache(&memo, "entries").await, 0);
}

#[tokio::test]
async fn a_cancel_while_waiting_for_another_sessions_fill_answers_at_once() {
    let (pg, memo, direct) = setup().await;
    cache_support::a_cancel_while_waiting_for_another_sessions_fill_answers_at_once(
        &pg, &memo, &direct,
    )
    .await;
}

#[tokio::test]
async fn a_cancel_while_waiting_for_a_fill_cancels_batches_and_blocks() {
    let (pg, memo, direct) = setup().await;
    cache_support::a_cancel_while_waiting_for_a_fill_cancels_batches_and_blocks(
        &pg, &memo, &direct,
    )
    .await;
}

#[tokio::test]
async fn a_cancel_during_catalog_lookups_cancels_the_statement() {
    let (_pg, memo, direct) = setup().await;
    let c =
        cache_support::a_cancel_during_catalog_lookups_cancels_the_statement(&memo, &direct).await;
    cache_support::a_cancel_during_catalog_lookups_cancels_batches(&c, &direct).await;
    cache_support::a_cancel_during_catalog_lookups_in_a_block_fails_the_block(&c, &direct).await;
}

#[tokio::test]
async fn concurrent_misses_on_one_key_run_once() {
    let (pg, memo, _direct) = setup().await;
    cache_support::create_slow_function(&pg).await;
    let q = "SELECT v, slow(1) FROM t WHERE id = 1";
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let c = memo.client("postgres", "postgres").await;
        tasks.push(tokio::spawn(async move { first(&c, q).await }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().as_deref(), Some("one"));
    }
    assert_eq!(
        show_cache(&memo, "misses").await,
        1,
        "one session ran the query"
    );
    assert_eq!(
        show_cache(&memo, "hits").await,
        3,
        "the others were answered from its entry"
    );
    assert_eq!(show_cache(&memo, "flight_waits").await, 3);
}

#[tokio::test]
async fn hidden_and_indirect_writes_invalidate_what_they_change() {
    let (pg, memo, direct) = setup().await;
    cache_support::hidden_and_indirect_writes_invalidate_what_they_change(&memo, &pg, &direct)
        .await;
}

#[tokio::test]
async fn settings_changed_by_hidden_code_of_a_write_are_seen() {
    let (pg, memo, direct) = setup().await;
    cache_support::settings_changed_by_hidden_code_of_a_write_are_seen(&memo, &pg, &direct).await;
}

/// A trigger that creates a temporary table shadowing a table of the same name gives the
/// writing session a context of its own: what it reads from its temporary table is never
/// served to another session, whose name means the regular table.
#[tokio::test]
async fn a_temporary_table_created_by_a_trigger_is_not_shared() {
    let (pg, memo, direct) = setup_with(|c| {
        c.cache_admission = pgmemo::config::CacheAdmission::Always;
    })
    .await;
    pg.psql(
        "CREATE TABLE au_c (id int PRIMARY KEY, v int);
         INSERT INTO au_c VALUES (1, 6), (2, 7);
         CREATE FUNCTION au_make_temp() RETURNS trigger VOLATILE LANGUAGE plpgsql
           AS $$BEGIN
             CREATE TEMP TABLE au_c (id int, v int);
             INSERT INTO pg_temp.au_c VALUES (1, 666);
             RETURN NULL;
           END$$;
         CREATE TABLE au_log (x int);
         CREATE TRIGGER au_log_temp AFTER INSERT ON au_log
           FOR EACH ROW EXECUTE FUNCTION au_make_temp();",
    )
    .await;
    let a = memo.client("postgres", "postgres").await;
    // The shape is planned (and its plan memoized) before the temporary table exists.
    assert_eq!(
        first(&a, "SELECT v FROM au_c WHERE id = 2")
            .await
            .as_deref(),
        Some("7")
    );
    a.batch_execute("INSERT INTO au_log VALUES (1)")
        .await
        .unwrap();
    let q = "SELECT v FROM au_c WHERE id = 1";
    assert_eq!(
        first(&a, q).await.as_deref(),
        Some("666"),
        "A reads its own"
    );
    let b = memo.client("postgres", "postgres").await;
    for _ in 0..2 {
        assert_eq!(first(&b, q).await, first(&direct, q).await);
    }
}

#[tokio::test]
async fn results_follow_the_session() {
    let (pg, memo, _direct) = setup().await;
    cache_support::results_follow_the_session(&memo, &pg, "SET ROLE outsider").await;
}

#[tokio::test]
async fn a_query_drops_the_unnamed_statement_for_the_cache_too() {
    let (pg, memo, _direct) = setup_with(|c| {
        c.cache_admission = pgmemo::config::CacheAdmission::Always;
    })
    .await;
    cache_support::a_query_drops_the_unnamed_statement_for_the_cache_too(&memo, &pg).await;
}

#[tokio::test]
async fn a_commit_that_chains_invalidates_at_once() {
    let (_pg, memo, direct) = setup().await;
    cache_support::a_commit_that_chains_invalidates_at_once(&memo, &direct).await;
}

#[tokio::test]
async fn a_pipelined_miss_does_not_wait_for_another_sessions_fill() {
    let (pg, memo, direct) = setup().await;
    cache_support::a_pipelined_miss_does_not_wait_for_another_sessions_fill(&memo, &pg, &direct)
        .await;
}

#[tokio::test]
async fn a_read_that_raced_with_a_committed_write_is_not_stored() {
    let (pg, memo, direct) = setup().await;
    cache_support::create_slow_function(&pg).await;
    // slow(id), not slow(1): a constant argument would be folded while planning, before the
    // read's snapshot is taken.
    let q = "SELECT v || slow(id) FROM t WHERE id = 1";
    let reader = memo.client("postgres", "postgres").await;
    let slow_read = tokio::spawn(async move { first(&reader, q).await });
    // Wait until the read runs on the server (its snapshot is taken), then write through
    // pgmemo and let the write commit while the read is still going.
    testkit::assert_eventually(
        std::time::Duration::from_secs(10),
        "the slow read is running",
        || async {
            first(
                &direct,
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%slow(id)%' AND pid <> pg_backend_pid()",
            )
            .await
            .as_deref()
                == Some("1")
        },
    )
    .await;
    let writer = memo.client("postgres", "postgres").await;
    writer
        .batch_execute("UPDATE t SET v = 'new' WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(
        slow_read.await.unwrap().as_deref(),
        Some("one1"),
        "read the old snapshot"
    );
    assert_eq!(show_cache(&memo, "stale_fills").await, 1);
    assert_eq!(
        first(&writer, q).await.as_deref(),
        Some("new1"),
        "the stale result was not stored"
    );
}

#[tokio::test]
async fn cheap_results_are_stored_from_their_second_miss_costly_ones_at_once() {
    let (pg, memo, _direct) = setup().await;
    cache_support::admission_stores_costly_results_at_once(&memo).await;
    let mut config = pgmemo_config_for(pg.port());
    config.cache_costly_miss = pgmemo::config::Seconds(std::time::Duration::from_secs(3600));
    let cheap = spawn_pgmemo(config).await.expect("pgmemo starts");
    cache_support::admission_stores_cheap_results_from_their_second_miss(&cheap).await;

    // With cache_admission = always every cacheable miss is stored.
    let mut config = pgmemo_config_for(pg.port());
    config.cache_admission = pgmemo::config::CacheAdmission::Always;
    let always = spawn_pgmemo(config).await.expect("pgmemo starts");
    let c = always.client("postgres", "postgres").await;
    first(&c, "SELECT v FROM t WHERE id = 1").await;
    first(&c, "SELECT v FROM t WHERE id = 2").await;
    let h = show_cache(&always, "hits").await;
    first(&c, "SELECT v FROM t WHERE id = 2").await;
    assert_eq!(show_cache(&always, "hits").await, h + 1);
    assert_eq!(show_cache(&always, "admission_skips").await, 0);
}

#[tokio::test]
async fn the_store_stays_within_its_byte_limit() {
    let pg = TempPostgres::builder()
        .start()
        .await
        .expect("cluster starts");
    pg.psql("CREATE TABLE big AS SELECT g AS id, repeat('x', 1000) AS pad FROM generate_series(1, 2000) g;")
        .await;
    let mut config = pgmemo_config_for(pg.port());
    config.cache_size = pgmemo::config::ByteSize(256 * 1024);
    // Every miss stored, so that 1,500 distinct lookups overflow the store.
    config.cache_admission = pgmemo::config::CacheAdmission::Always;
    let memo = spawn_pgmemo(config).await.unwrap();
    let c = memo.client("postgres", "postgres").await;
    for id in 1..=1500 {
        first(&c, &format!("SELECT pad FROM big WHERE id = {id}")).await;
    }
    let bytes = show_cache(&memo, "bytes").await;
    let limit = show_cache(&memo, "limit_bytes").await;
    assert_eq!(limit, 256 * 1024);
    assert!(
        bytes as f64 <= limit as f64 * 1.05,
        "{bytes} bytes held over a limit of {limit}"
    );
    assert!(show_cache(&memo, "evictions").await > 0);
    assert!(
        show_cache(&memo, "entries").await > 50,
        "the cache still holds entries"
    );
}

/// 16 clients read and write the same rows through pgmemo for 20 s
/// ([`cache_support::reads_never_stale`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reads_and_writes_never_see_stale_values() {
    let pg = cache_support::kv_cluster().await;
    let memo = spawn_pgmemo(pgmemo_config_for(pg.port())).await.unwrap();
    let (reads, writes) =
        cache_support::reads_never_stale(&memo, 16, std::time::Duration::from_secs(20)).await;
    assert!(reads > 100 && writes > 10, "{reads} reads, {writes} writes");
    assert!(
        show_cache(&memo, "hits").await > 0,
        "the cache served some reads"
    );
}

#[tokio::test]
async fn unnamed_statements_hit_and_the_server_catches_up_when_needed() {
    use raw::*;
    let (_pg, memo, direct) = setup().await;
    let mut c = Raw::connect(memo.addr()).await;
    let q = "SELECT v FROM t WHERE id = $1";
    let batch = |id: &str| {
        vec![
            parse(q, &[23]),
            bind(&[id]),
            describe_portal(),
            execute(),
            sync(),
        ]
    };
    let (tags, values) = c.round_trip(&batch("1")).await;
    assert_eq!(tags, vec!['1', '2', 'T', 'D', 'C', 'Z']);
    assert_eq!(values, vec!["one"]);
    direct
        .batch_execute("UPDATE t SET v = v || '+'")
        .await
        .unwrap();
    // Served from the cache, with the same messages PostgreSQL sends.
    let (tags, values) = c.round_trip(&batch("1")).await;
    assert_eq!(tags, vec!['1', '2', 'T', 'D', 'C', 'Z']);
    assert_eq!(values, vec!["one"]);
    // A Bind of the unnamed statement without a Parse: pgmemo parses it on the server first
    // and keeps that ParseComplete from the client.
    let (tags, values) = c
        .round_trip(&[bind(&["2"]), describe_portal(), execute(), sync()])
        .await;
    assert_eq!(tags, vec!['2', 'T', 'D', 'C', 'Z']);
    assert_eq!(values, vec!["two+"]);
    // Once more from the cache, then a client that drives the unnamed statement with Flush
    // (answers before any Sync): the restored Parse's ParseComplete is still kept back.
    let (tags, _) = c.round_trip(&batch("1")).await;
    assert_eq!(tags, vec!['1', '2', 'T', 'D', 'C', 'Z']);
    let (tags, values) = c.exchange(&[bind(&["2"]), execute(), flush()], 3).await;
    assert_eq!(tags, vec!['2', 'D', 'C']);
    assert_eq!(values, vec!["two+"]);
    let (tags, _) = c.round_trip(&[sync()]).await;
    assert_eq!(tags, vec!['Z']);
    // And the next Bind-only batch needs nothing more.
    let (tags, values) = c.round_trip(&[bind(&["1"]), execute(), sync()]).await;
    assert_eq!(tags, vec!['2', 'D', 'C', 'Z']);
    assert_eq!(values, vec!["one"], "cached");
}

#[tokio::test]
async fn ttls_from_hints_and_tables_end_entries() {
    let pg = TempPostgres::builder()
        .start()
        .await
        .expect("cluster starts");
    pg.psql(
        "CREATE TABLE t (id int PRIMARY KEY, v text, ts timestamptz DEFAULT now());
         INSERT INTO t (id, v) VALUES (1, 'one'), (2, 'two');
         CREATE TABLE rates (id int, v text); INSERT INTO rates VALUES (1, 'r');",
    )
    .await;
    let mut config = pgmemo_config_for(pg.port());
    config.cache_table_ttl.insert(
        "rates".into(),
        pgmemo::config::Seconds(std::time::Duration::from_secs(1)),
    );
    let memo = spawn_pgmemo(config).await.unwrap();
    let direct = pg.client("postgres", "postgres").await;
    let c = memo.client("postgres", "postgres").await;
    for (q, table) in [
        ("/* pgmemo:ttl=1s */ SELECT v FROM t WHERE id = 1", "t"),
        ("SELECT v FROM rates WHERE id = 1", "rates"),
    ] {
        let before = first(&c, q).await;
        first(&c, q).await;
        direct
            .batch_execute(&format!("UPDATE {table} SET v = v || '!'"))
            .await
            .unwrap();
        let fresh = first(&direct, q).await;
        // Still the cached value right after the direct write (unless a slow machine already
        // passed the TTL), then the fresh one once the TTL is over.
        let now = first(&c, q).await;
        assert!(now == before || now == fresh);
        testkit::assert_eventually(
            std::time::Duration::from_secs(10),
            "the entry expires",
            || {
                let (c, q, fresh) = (&c, q, fresh.clone());
                async move { first(c, q).await == fresh }
            },
        )
        .await;
    }
    // Without a TTL the entry stays.
    let q = "SELECT v FROM t WHERE id = 2";
    assert!(served_from_cache(&c, &direct, q).await);
}

async fn get(c: &Client, s: &tokio_postgres::Statement) -> String {
    c.query_one(s, &[&1i32]).await.unwrap().get::<_, String>(0)
}

#[tokio::test]
async fn a_session_with_temporary_tables_shares_no_result() {
    let (_pg, memo, _direct) = setup().await;
    let a = memo.client("postgres", "postgres").await;
    let b = memo.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = $1";
    let sb = b.prepare(q).await.unwrap();
    assert_eq!(get(&b, &sb).await, "one");
    a.batch_execute("CREATE TEMP TABLE t (id int, v text); INSERT INTO t VALUES (1, 'mine')")
        .await
        .unwrap();
    let sa = a.prepare(q).await.unwrap();
    for _ in 0..3 {
        assert_eq!(get(&b, &sb).await, "one");
        assert_eq!(
            get(&a, &sa).await,
            "mine",
            "A reads its own temporary table"
        );
    }
}

/// A backend keeps its temporary schema after its temporary tables are gone; a session whose
/// tables are all dropped shares results with the others again (the context's second query
/// looks for relations in the schema), while one backend that never had any asks nothing more.
#[tokio::test]
async fn a_session_whose_temporary_tables_are_gone_shares_results_again() {
    let (_pg, memo, direct) = setup().await;
    let a = memo.client("postgres", "postgres").await;
    let b = memo.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 1";
    a.batch_execute("CREATE TEMP TABLE scratch (x int)")
        .await
        .unwrap();
    a.batch_execute("DROP TABLE scratch").await.unwrap();
    let has_schema = first(&a, "SELECT (pg_my_temp_schema() <> 0)::text").await;
    assert_eq!(
        has_schema.as_deref(),
        Some("true"),
        "the schema outlives the table"
    );
    // B stores the result (a cheap statement is stored from its second miss).
    let before = first(&b, q).await;
    assert_eq!(first(&b, q).await, before);
    direct
        .batch_execute("UPDATE t SET v = v || '+'")
        .await
        .unwrap();
    assert_eq!(
        first(&a, q).await,
        before,
        "A, without temporary tables, is served B's entry (a direct write is not seen here)"
    );
}

#[tokio::test]
async fn prepared_statements_follow_a_table_swapped_in_under_the_same_name() {
    let (pg, memo, _direct) = setup().await;
    pg.psql(
        "CREATE TABLE t_next (id int PRIMARY KEY, v text); INSERT INTO t_next VALUES (1, 'next');",
    )
    .await;
    let a = memo.client("postgres", "postgres").await;
    let b = memo.client("postgres", "postgres").await;
    let sa = a.prepare("SELECT v FROM t WHERE id = $1").await.unwrap();
    assert_eq!(get(&a, &sa).await, "one");
    b.batch_execute("ALTER TABLE t RENAME TO t_old; ALTER TABLE t_next RENAME TO t")
        .await
        .unwrap();
    // PostgreSQL re-plans the same prepared statement against the table now called t.
    assert_eq!(get(&a, &sa).await, "next");
    assert_eq!(get(&a, &sa).await, "next");
    // The entry depends on that table, not the one the statement first read.
    b.batch_execute("UPDATE t SET v = 'newer' WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(get(&a, &sa).await, "newer");
}

/// A prepared statement dropped where pgmemo cannot see it (a `DEALLOCATE` run by a `DO`
/// block) and parsed again under its name with another text: the name stands for the new text
/// once the server accepted it, and the new text's rows are never stored as the old one's.
#[tokio::test]
async fn a_name_parsed_again_after_an_unseen_deallocate_means_the_new_statement() {
    use raw::*;
    let (_pg, memo, _direct) = setup().await;
    let mut c = Raw::connect(memo.addr()).await;
    let old = "SELECT v FROM t WHERE id = $1";
    let new = "SELECT upper(v) FROM t WHERE id = $1";
    let run = [bind_named("s1", &["1"]), execute(), sync()];
    c.round_trip(&[parse_named("s1", old, &[]), sync()]).await;
    assert_eq!(c.round_trip(&run).await.1, vec!["one"]);
    assert_eq!(c.round_trip(&run).await.1, vec!["one"]);
    c.round_trip(&[query("DO $$BEGIN EXECUTE 'DEALLOCATE s1'; END$$")])
        .await;
    let (tags, _) = c.round_trip(&[parse_named("s1", new, &[]), sync()]).await;
    assert_eq!(
        tags,
        vec!['1', 'Z'],
        "the server accepted the new statement"
    );
    assert_eq!(c.round_trip(&run).await.1, vec!["ONE"]);
    assert_eq!(c.round_trip(&run).await.1, vec!["ONE"]);
    // Another session running the old text gets the old text's rows.
    let mut other = Raw::connect(memo.addr()).await;
    other
        .round_trip(&[parse_named("s9", old, &[]), sync()])
        .await;
    let run_old = [bind_named("s9", &["1"]), execute(), sync()];
    assert_eq!(other.round_trip(&run_old).await.1, vec!["one"]);
}

#[tokio::test]
async fn pipelined_requests_mix_hits_and_misses_in_order() {
    use raw::*;
    let (_pg, memo, direct) = setup().await;
    let mut c = Raw::connect(memo.addr()).await;
    let one = "SELECT v FROM t WHERE id = 1";
    c.round_trip(&[query(one)]).await;
    c.round_trip(&[query(one)]).await;
    direct
        .batch_execute("UPDATE t SET v = v || '+'")
        .await
        .unwrap();
    // Sent in one write: a miss, a hit, a locking read (not inert: what follows it is not
    // answered from the cache), and the first query again.
    let pipeline = [
        query("SELECT v FROM t WHERE id = 2"),
        query(one),
        query("SELECT v FROM t WHERE id = 2 FOR UPDATE"),
        query(one),
    ];
    let mut values = Vec::new();
    let (tags, v) = c.round_trip(&pipeline).await;
    assert_eq!(tags, vec!['T', 'D', 'C', 'Z']);
    values.extend(v);
    for _ in 0..3 {
        let (tags, v) = c.round_trip(&[]).await;
        assert_eq!(tags, vec!['T', 'D', 'C', 'Z']);
        values.extend(v);
    }
    assert_eq!(values, vec!["two+", "one", "two+", "one+"]);
    let admin = memo.client("postgres", "pgmemo").await;
    let cache = admin.simple_query("SHOW CACHE").await.unwrap();
    let hits = cache.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) if r.get(0) == Some("hits") => r.get(1).map(str::to_owned),
        _ => None,
    });
    assert_eq!(
        hits.as_deref(),
        Some("2"),
        "the second read and the pipelined one"
    );
}

#[tokio::test]
async fn pipelined_misses_are_stored() {
    let (_pg, memo, direct) = setup_with(|c| {
        c.cache_admission = pgmemo::config::CacheAdmission::Always;
    })
    .await;
    cache_support::pipelined_misses_are_stored(&memo, &direct).await;
}

#[tokio::test]
async fn a_refused_parse_of_a_name_in_use_keeps_the_old_statement() {
    let (_pg, memo, _direct) = setup().await;
    cache_support::a_name_in_use_keeps_its_statement(&memo).await;
}

#[tokio::test]
async fn a_statement_first_seen_inside_a_transaction_block_is_planned_there_harmlessly() {
    let (_pg, memo, _direct) = setup().await;
    let c = memo.client("postgres", "postgres").await;
    c.batch_execute("BEGIN").await.unwrap();
    // The catalog lookup runs inside the client's block (in a savepoint of pgmemo's).
    let q = "SELECT v FROM t WHERE id = 2 AND v <> 'x'";
    assert_eq!(first(&c, q).await.as_deref(), Some("two"));
    assert_eq!(first(&c, q).await.as_deref(), Some("two"));
    assert_eq!(
        show_cache(&memo, "hits").await,
        1,
        "planned and cached in the block"
    );
    // The block is the client's as before: its own savepoints and statements work.
    c.batch_execute(
        "SAVEPOINT mine; UPDATE t SET v = 'x' WHERE id = 1; ROLLBACK TO SAVEPOINT mine",
    )
    .await
    .unwrap();
    c.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        first(&c, "SELECT v FROM t WHERE id = 1").await.as_deref(),
        Some("one")
    );
}

#[tokio::test]
async fn a_refused_parse_leaves_no_statement() {
    let (_pg, memo, _direct) = setup().await;
    cache_support::a_refused_parse_leaves_no_statement(&memo).await;
}

#[tokio::test]
async fn untracked_writes_never_leave_stale_results() {
    let (_pg, memo, _direct) = setup().await;
    cache_support::untracked_writes_never_leave_stale_results(&memo).await;
}

#[tokio::test]
async fn a_reload_turning_a_database_off_stops_running_sessions() {
    let (_pg, memo, direct) = setup().await;
    cache_support::a_reload_turning_a_database_off_stops_running_sessions(&memo, &direct).await;
}

#[tokio::test]
async fn a_reload_excluding_a_table_stops_caching_it() {
    let (_pg, memo, direct) = setup().await;
    cache_support::a_reload_excluding_a_table_stops_caching_it(&memo, &direct).await;
}

#[tokio::test]
async fn a_reload_changing_a_ttl_empties_the_cache() {
    let (_pg, memo, direct) = setup().await;
    cache_support::a_reload_changing_a_ttl_empties_the_cache(&memo, &direct).await;
}

#[tokio::test]
async fn writes_of_a_session_with_the_cache_off_still_invalidate() {
    let (_pg, memo, _direct) = setup().await;
    cache_support::writes_of_a_session_with_the_cache_off_still_invalidate(&memo).await;
}

#[tokio::test]
async fn statement_described_batches_are_cached() {
    let (pg, memo, direct) = setup().await;
    cache_support::statement_described_batches_are_cached(&memo, &pg, &direct).await;
}

#[tokio::test]
async fn a_read_pipelined_behind_a_write_in_a_block_sees_the_write() {
    let (_pg, memo, _direct) = setup().await;
    cache_support::a_read_pipelined_behind_a_write_in_a_block_sees_the_write(&memo).await;
}

#[tokio::test]
async fn reads_a_block_may_not_serve_are_counted_by_reason() {
    let (_pg, memo, _direct) = setup().await;
    let c = memo.client("postgres", "postgres").await;
    cache_support::reads_a_block_may_not_serve_are_counted_by_reason(&memo, &c).await;
}

#[tokio::test]
async fn a_copy_of_a_write_invalidates_what_it_wrote() {
    let (_pg, memo, _direct) = setup().await;
    let c = memo.client("postgres", "postgres").await;
    cache_support::a_copy_of_a_write_invalidates_what_it_wrote(&memo, &c).await;
}

/// DDL run where pgmemo cannot see it (inside `DO`) drops the memoized plans too: here it
/// enables row security on a table whose reads were planned as cacheable, with a policy on a
/// custom setting that is not part of the key. Each tenant then gets its own rows, never
/// another tenant's result cached under the old plan.
#[tokio::test]
async fn ddl_inside_do_drops_the_memoized_plans() {
    let (pg, memo, _direct) = setup().await;
    pg.psql(
        "CREATE TABLE docs (id int PRIMARY KEY, tenant int, v text); \
         INSERT INTO docs VALUES (1, 1, 'one''s'), (2, 2, 'two''s'); \
         CREATE ROLE app LOGIN; GRANT SELECT ON docs TO app;",
    )
    .await;
    let app = memo.client("app", "postgres").await;
    let q = "SELECT v FROM docs WHERE id = 1";
    for _ in 0..3 {
        assert_eq!(first(&app, q).await.as_deref(), Some("one's"));
    }
    let owner = memo.client("postgres", "postgres").await;
    owner
        .batch_execute(
            "DO $$BEGIN \
               ALTER TABLE docs ENABLE ROW LEVEL SECURITY; \
               CREATE POLICY by_tenant ON docs \
                 USING (tenant = current_setting('app.tenant')::int); \
             END$$",
        )
        .await
        .unwrap();
    app.batch_execute("SET app.tenant = '1'").await.unwrap();
    for _ in 0..3 {
        assert_eq!(first(&app, q).await.as_deref(), Some("one's"), "tenant 1");
    }
    app.batch_execute("SET app.tenant = '2'").await.unwrap();
    for _ in 0..2 {
        assert_eq!(
            first(&app, q).await,
            None,
            "tenant 2 sees no row of tenant 1"
        );
    }
}

/// A user-defined operator in a schema whose name needs quotes (`"Audit"`) is found by its
/// unqualified name through the search_path, and its volatile function keeps its reads out
/// of the cache.
#[tokio::test]
async fn operators_of_a_schema_whose_name_needs_quotes_are_checked() {
    let (pg, memo, direct) = setup().await;
    pg.psql(
        r#"CREATE SCHEMA "Audit";
           CREATE FUNCTION "Audit".log_eq(int, int) RETURNS bool VOLATILE LANGUAGE sql AS 'SELECT $1 = $2';
           CREATE OPERATOR "Audit".=== (LEFTARG = int, RIGHTARG = int, FUNCTION = "Audit".log_eq);"#,
    )
    .await;
    let c = memo.client("postgres", "postgres").await;
    for client in [&c, &direct] {
        client
            .batch_execute(r#"SET search_path = "Audit", public"#)
            .await
            .unwrap();
    }
    let sql = "SELECT v FROM t WHERE id === 1";
    assert!(
        !served_from_cache(&c, &direct, sql).await,
        "{sql} was cached"
    );
}

/// pgmemo's catalog lookup runs in the client's session, under the client's search_path: a
/// schema listed before pg_catalog must not replace the functions, operators or types the
/// lookup uses. Here the client's own `to_regclass` made a table with row security look like
/// a plain one, and its rows were cached (and tied to the other table's invalidations).
#[tokio::test]
async fn the_catalog_lookup_cannot_be_misled_through_the_search_path() {
    let (pg, memo, direct) = setup().await;
    pg.psql(
        "CREATE TABLE r AS SELECT * FROM t; ALTER TABLE r ENABLE ROW LEVEL SECURITY;
         CREATE SCHEMA lure;
         CREATE FUNCTION lure.to_regclass(text) RETURNS regclass IMMUTABLE LANGUAGE sql
           AS $$SELECT 'public.t'::pg_catalog.regclass$$;
         CREATE FUNCTION lure.quote_ident(text) RETURNS text IMMUTABLE LANGUAGE sql
           AS $$SELECT 't'$$;",
    )
    .await;
    let c = memo.client("postgres", "postgres").await;
    for client in [&c, &direct] {
        client
            .batch_execute("SET search_path = lure, public, pg_catalog")
            .await
            .unwrap();
    }
    assert_refused(
        &memo,
        &c,
        &direct,
        "SELECT v FROM r WHERE id = 1",
        "row_level_security",
    )
    .await;
}

/// `t.f` is a call of `f(t)` when `t` has no column `f` (attribute notation): a volatile
/// function called so keeps the read out of the cache, and a plain qualified column does not.
#[tokio::test]
async fn functions_called_with_attribute_notation_are_checked() {
    let (pg, memo, direct) = setup().await;
    pg.psql(
        "CREATE FUNCTION shout(t) RETURNS text VOLATILE LANGUAGE sql AS $$SELECT $1.v || '!'$$;",
    )
    .await;
    let c = memo.client("postgres", "postgres").await;
    for sql in [
        "SELECT t.shout FROM t WHERE id = 1",
        "SELECT (t).shout FROM t WHERE id = 1",
    ] {
        assert_refused(&memo, &c, &direct, sql, "volatile_function").await;
    }
    assert!(served_from_cache(&c, &direct, "SELECT t.v FROM t WHERE t.id = 1").await);
}

/// Reading a view runs the functions it calls: a volatile one may write, so the read counts as
/// a write of anything (as a call of the function by name does), and what it wrote is not
/// served stale, neither after it nor inside the block that ran it.
#[tokio::test]
async fn a_view_calling_a_volatile_function_counts_as_a_write() {
    let (pg, memo, _direct) = setup().await;
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
    assert_eq!(
        first(&c, "SELECT n FROM noting").await.as_deref(),
        Some("1")
    );
    assert_eq!(
        first(&c, count).await.as_deref(),
        Some("1"),
        "after the view ran"
    );
    assert_eq!(first(&c, count).await.as_deref(), Some("1"));
    c.batch_execute("BEGIN").await.unwrap();
    assert_eq!(
        first(&c, "SELECT n FROM noting").await.as_deref(),
        Some("1")
    );
    assert_eq!(first(&c, count).await.as_deref(), Some("2"), "in the block");
    c.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        first(&c, count).await.as_deref(),
        Some("1"),
        "after the rollback"
    );
}

/// A view defined with `FOR UPDATE` locks the rows a read of it returns, and one that casts a
/// special time word at run time (`'today'::text::date`) reads the clock: neither read is
/// answered from memory, which would skip the lock or freeze the date.
#[tokio::test]
async fn views_that_lock_rows_or_read_the_clock_are_not_cached() {
    let (pg, memo, direct) = setup().await;
    pg.psql(
        "CREATE VIEW locked AS SELECT * FROM t FOR UPDATE;
         CREATE VIEW dated AS SELECT id, 'today'::text::date AS day FROM t;",
    )
    .await;
    let c = memo.client("postgres", "postgres").await;
    let lock = "SELECT v FROM locked WHERE id = 1";
    let day = "SELECT day FROM dated WHERE id = 1";
    for q in [lock, day, lock, day] {
        first(&c, q).await;
    }
    for (q, reason) in [(lock, "locking_clause"), (day, "stable_function")] {
        let explained = admin_rows(&memo, &format!("EXPLAIN CACHE {q}")).await;
        assert_eq!(explained[0][3].as_deref(), Some("no"), "{explained:?}");
        assert_eq!(explained[0][4].as_deref(), Some(reason), "{explained:?}");
    }
    // The read inside a block takes its row lock: a direct write waits for it.
    c.batch_execute("BEGIN").await.unwrap();
    assert_eq!(first(&c, lock).await.as_deref(), Some("one"));
    let e = direct
        .batch_execute("SET lock_timeout = '200ms'; UPDATE t SET v = 'x' WHERE id = 1")
        .await
        .expect_err("the row is locked by the read through the view");
    assert_eq!(e.code().map(|c| c.code()), Some("55P03"), "{e:?}");
    direct.batch_execute("RESET lock_timeout").await.unwrap();
    c.batch_execute("ROLLBACK").await.unwrap();
}

/// A call that leaves out a parameter runs its default: an IMMUTABLE function whose default
/// takes a sequence's next value, or casts a time word at run time, gives a new answer each
/// call, while one whose default is a constant expression stays cacheable.
#[tokio::test]
async fn parameter_defaults_count_toward_a_functions_volatility() {
    let (pg, memo, _direct) = setup().await;
    pg.psql(
        "CREATE SEQUENCE tickets;
         CREATE FUNCTION ticket(n bigint DEFAULT nextval('tickets')) RETURNS bigint
           IMMUTABLE LANGUAGE sql AS 'SELECT $1';
         CREATE FUNCTION day_of(d date DEFAULT 'today'::text::date) RETURNS date
           IMMUTABLE LANGUAGE sql AS 'SELECT $1';
         CREATE FUNCTION plus(n int DEFAULT 1 + 2) RETURNS int
           IMMUTABLE LANGUAGE sql AS 'SELECT $1 + 1';",
    )
    .await;
    let c = memo.client("postgres", "postgres").await;
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(first(&c, "SELECT ticket()").await);
    }
    assert_eq!(
        got,
        [Some("1".into()), Some("2".into()), Some("3".into())],
        "every call takes a number"
    );
    for (q, cacheable, reason) in [
        ("SELECT day_of()", "no", Some("stable_function")),
        ("SELECT plus()", "yes", None),
    ] {
        first(&c, q).await;
        first(&c, q).await;
        let explained = admin_rows(&memo, &format!("EXPLAIN CACHE {q}")).await;
        assert_eq!(
            explained[0][3].as_deref(),
            Some(cacheable),
            "{q}: {explained:?}"
        );
        assert_eq!(explained[0][4].as_deref(), reason, "{q}: {explained:?}");
    }
}

/// An operator in the session's temporary schema (`OPERATOR(pg_temp.op)`) is each session's
/// own: two sessions alike in every setting do not share its results.
#[tokio::test]
async fn operators_of_the_temporary_schema_are_not_shared() {
    let (_pg, memo, _direct) = setup().await;
    let define = |arg: &str| {
        format!(
            "CREATE FUNCTION pg_temp.pick(int, int) RETURNS int IMMUTABLE LANGUAGE sql AS 'SELECT ${arg}';
             CREATE OPERATOR pg_temp.<<< (LEFTARG = int, RIGHTARG = int, FUNCTION = pg_temp.pick);"
        )
    };
    let q = "SELECT 1 OPERATOR(pg_temp.<<<) 2";
    // Both defined first: DDL through pgmemo empties the database's cache.
    let a = memo.client("postgres", "postgres").await;
    a.batch_execute(&define("2")).await.unwrap();
    let b = memo.client("postgres", "postgres").await;
    b.batch_execute(&define("1")).await.unwrap();
    assert_eq!(first(&a, q).await.as_deref(), Some("2"));
    assert_eq!(first(&a, q).await.as_deref(), Some("2"));
    assert_eq!(first(&b, q).await.as_deref(), Some("1"), "b's own operator");
}

/// A cast to a domain runs the domain's CHECK constraints: one calling a function that reads
/// a table gives another answer (here an error) once that table changes, so it is not cached.
#[tokio::test]
async fn casts_to_a_domain_count_the_functions_its_checks_call() {
    let (pg, memo, direct) = setup().await;
    pg.psql(
        "CREATE TABLE allowed_codes (code text); INSERT INTO allowed_codes VALUES ('EUR');
         CREATE FUNCTION is_allowed(text) RETURNS bool STABLE LANGUAGE sql
           AS 'SELECT EXISTS (SELECT 1 FROM allowed_codes WHERE code = $1)';
         CREATE DOMAIN currency AS text CHECK (is_allowed(VALUE));
         CREATE DOMAIN short_code AS text CHECK (length(VALUE) <= 3);",
    )
    .await;
    let c = memo.client("postgres", "postgres").await;
    let q = "SELECT 'EUR'::currency";
    assert_eq!(first(&c, q).await.as_deref(), Some("EUR"));
    assert_eq!(first(&c, q).await.as_deref(), Some("EUR"));
    direct
        .batch_execute("DELETE FROM allowed_codes")
        .await
        .unwrap();
    let e = c.simple_query(q).await.expect_err("the check fails now");
    assert_eq!(e.code().map(|c| c.code()), Some("23514"), "{e:?}");
    // A check of built-in immutable functions leaves the cast cacheable.
    let q = "SELECT 'EUR'::short_code";
    first(&c, q).await;
    first(&c, q).await;
    let explained = admin_rows(&memo, &format!("EXPLAIN CACHE {q}")).await;
    assert_eq!(explained[0][3].as_deref(), Some("yes"), "{explained:?}");
}

/// `SELECT ... INTO` creates a table as `CREATE TABLE AS` does: rows read in its block are
/// not stored (the block wrote), and names it shadows are looked up again.
#[tokio::test]
async fn select_into_counts_as_creating_a_table() {
    let (pg, memo, _direct) = setup().await;
    pg.psql(
        "CREATE TABLE src AS SELECT generate_series(1, 3) AS n;
         CREATE SCHEMA app;
         CREATE TABLE public.shadow AS SELECT 1 AS n;",
    )
    .await;
    let c = memo.client("postgres", "postgres").await;
    c.batch_execute("BEGIN; SELECT * INTO made FROM src")
        .await
        .unwrap();
    let count = "SELECT count(*) FROM made";
    assert_eq!(first(&c, count).await.as_deref(), Some("3"));
    assert_eq!(first(&c, count).await.as_deref(), Some("3"));
    c.batch_execute("ROLLBACK").await.unwrap();
    let other = memo.client("postgres", "postgres").await;
    let e = other.simple_query(count).await.expect_err("rolled back");
    assert_eq!(e.code().map(|c| c.code()), Some("42P01"), "{e:?}");

    c.batch_execute("SET search_path = app, public")
        .await
        .unwrap();
    let count = "SELECT count(*) FROM shadow";
    assert_eq!(first(&c, count).await.as_deref(), Some("1"));
    assert_eq!(first(&c, count).await.as_deref(), Some("1"));
    c.batch_execute("SELECT n INTO app.shadow FROM generate_series(1, 5) AS n")
        .await
        .unwrap();
    assert_eq!(
        first(&c, count).await.as_deref(),
        Some("5"),
        "app.shadow now"
    );
}

/// A statement prepared before DDL changed its result type is not answered from entries
/// stored after it (with the new type): the client gets PostgreSQL's own refusal, as
/// directly, instead of rows its cached description misreads. Once the server accepts a Bind
/// of a statement again, its results are served from the cache again.
#[tokio::test]
async fn a_statement_prepared_before_its_row_type_changed_is_not_served_new_rows() {
    let (pg, memo, direct) = setup().await;
    pg.psql("CREATE TABLE rt (id int PRIMARY KEY, c int); INSERT INTO rt VALUES (1, 7);")
        .await;
    let old = memo.client("postgres", "postgres").await;
    let text = "SELECT * FROM rt WHERE id = 1";
    let stmt = old.prepare(text).await.unwrap();
    for _ in 0..2 {
        let rows = old.query(&stmt, &[]).await.unwrap();
        assert_eq!(rows[0].get::<_, i32>(1), 7);
    }
    let other = memo.client("postgres", "postgres").await;
    other
        .batch_execute("ALTER TABLE rt ALTER COLUMN c TYPE bigint")
        .await
        .unwrap();
    let new = other.prepare(text).await.unwrap();
    for _ in 0..3 {
        let rows = other.query(&new, &[]).await.unwrap();
        assert_eq!(rows[0].get::<_, i64>(1), 7);
    }
    let e = old
        .query(&stmt, &[])
        .await
        .expect_err("the result type changed");
    assert_eq!(e.code().map(|c| c.code()), Some("0A000"), "{e:?}");

    // A statement whose result type did not change is accepted again, then served.
    let same = old
        .prepare("SELECT c::int AS v FROM rt WHERE id = 1")
        .await
        .unwrap();
    for _ in 0..2 {
        old.query(&same, &[]).await.unwrap();
    }
    other.batch_execute("CREATE INDEX ON rt (c)").await.unwrap();
    for _ in 0..3 {
        let rows = old.query(&same, &[]).await.unwrap();
        assert_eq!(rows[0].get::<_, i32>(0), 7);
    }
    // Served from the cache: a write pgmemo cannot see does not show.
    direct.batch_execute("UPDATE rt SET c = 8").await.unwrap();
    let rows = old.query(&same, &[]).await.unwrap();
    assert_eq!(rows[0].get::<_, i32>(0), 7, "a hit again");
}

/// pgx's CopyFrom: a Describe batch, then COPY through a simple Query. The batch's Sync must
/// not count as one the COPY ignores: requests and answers stay matched, so writes after it
/// still invalidate and reads are still cached.
#[tokio::test]
async fn a_simple_query_copy_after_an_extended_batch_keeps_requests_and_answers_matched() {
    let (_pg, memo, direct) = setup().await;
    let mut r = raw::Raw::connect(memo.addr()).await;
    r.round_trip(&[
        raw::parse("SELECT id, v FROM t", &[]),
        raw::describe_statement(),
        raw::sync(),
    ])
    .await;
    let (tags, _) = r
        .exchange(&[raw::query("COPY t (id, v) FROM STDIN")], 1)
        .await;
    assert_eq!(tags, ['G']);
    let (tags, _) = r
        .round_trip(&[raw::copy_data(b"10\tten\n"), raw::copy_done()])
        .await;
    assert_eq!(tags, ['C', 'Z']);
    let q = "SELECT v FROM t WHERE id = 10";
    for _ in 0..2 {
        assert_eq!(r.round_trip(&[raw::query(q)]).await.1, ["ten"]);
    }
    r.round_trip(&[raw::query("UPDATE t SET v = 'TEN' WHERE id = 10")])
        .await;
    let other = memo.client("postgres", "postgres").await;
    assert_eq!(first(&other, q).await.as_deref(), Some("TEN"));
    assert_eq!(first(&direct, q).await.as_deref(), Some("TEN"));
    assert_eq!(r.round_trip(&[raw::query(q)]).await.1, ["TEN"]);
}

/// A client that leaves while its write runs: the server still commits it, with nobody
/// there to see its answer. The cache is invalidated at once and again once the server has
/// ended the write, so reads stored while it ran do not outlive it.
#[tokio::test]
async fn a_write_its_client_left_running_still_invalidates() {
    let (_pg, memo, direct) = setup().await;
    let c = memo.client("postgres", "postgres").await;
    let q = "SELECT v FROM t WHERE id = 1";
    assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    let write = "UPDATE t SET v = 'left' WHERE id = 1 AND pg_sleep(1) IS NOT NULL";
    let mut r = raw::Raw::connect(memo.addr()).await;
    r.exchange(&[raw::query(write)], 0).await;
    testkit::assert_eventually(std::time::Duration::from_secs(10), "the write runs", || {
        testkit::query_running(&direct, write)
    })
    .await;
    drop(r);
    // While it runs, reads store the old value again.
    for _ in 0..2 {
        assert_eq!(first(&c, q).await.as_deref(), Some("one"));
    }
    testkit::assert_eventually(
        std::time::Duration::from_secs(10),
        "the write committed",
        || async { first(&direct, q).await.as_deref() == Some("left") },
    )
    .await;
    testkit::assert_eventually(
        std::time::Duration::from_secs(10),
        "pgmemo serves it",
        || async { first(&c, q).await.as_deref() == Some("left") },
    )
    .await;
}

/// A column default calling a volatile user-defined function runs it on INSERT, and the
/// function may write other tables: such an INSERT counts as writing anything.
#[tokio::test]
async fn a_column_default_calling_a_writing_function_invalidates_what_it_writes() {
    let (pg, memo, _direct) = setup().await;
    pg.psql(
        "CREATE TABLE audit (n int);
         CREATE FUNCTION note() RETURNS int VOLATILE LANGUAGE plpgsql
           AS $$BEGIN INSERT INTO audit VALUES (1); RETURN 1; END$$;
         CREATE TABLE noted (id serial, n int DEFAULT note());",
    )
    .await;
    let c = memo.client("postgres", "postgres").await;
    let count = "SELECT count(*) FROM audit";
    assert_eq!(first(&c, count).await.as_deref(), Some("0"));
    assert_eq!(first(&c, count).await.as_deref(), Some("0"));
    c.batch_execute("INSERT INTO noted DEFAULT VALUES")
        .await
        .unwrap();
    assert_eq!(
        first(&c, count).await.as_deref(),
        Some("1"),
        "after the insert"
    );
}

/// `TRUNCATE ... CASCADE` also empties the tables whose foreign keys reach the named one,
/// whatever their ON DELETE action.
#[tokio::test]
async fn truncate_cascade_invalidates_the_tables_it_reaches() {
    let (pg, memo, _direct) = setup().await;
    pg.psql(
        "CREATE TABLE parent (id int PRIMARY KEY); CREATE TABLE child (pid int REFERENCES parent);
         INSERT INTO parent VALUES (1); INSERT INTO child VALUES (1);",
    )
    .await;
    let c = memo.client("postgres", "postgres").await;
    let count = "SELECT count(*) FROM child";
    assert_eq!(first(&c, count).await.as_deref(), Some("1"));
    assert_eq!(first(&c, count).await.as_deref(), Some("1"));
    c.batch_execute("TRUNCATE parent CASCADE").await.unwrap();
    assert_eq!(first(&c, count).await.as_deref(), Some("0"));
}

/// A user-defined aggregate is as volatile as the worst of its support functions (PostgreSQL
/// records every aggregate as immutable): one whose transition function is volatile keeps
/// its reads out of the cache.
#[tokio::test]
async fn aggregates_take_the_volatility_of_their_functions() {
    let (pg, memo, direct) = setup().await;
    pg.psql(
        "CREATE FUNCTION keep_last(text, text) RETURNS text VOLATILE LANGUAGE sql AS 'SELECT $2';
         CREATE AGGREGATE last_of(text) (sfunc = keep_last, stype = text);",
    )
    .await;
    let c = memo.client("postgres", "postgres").await;
    assert_refused(
        &memo,
        &c,
        &direct,
        "SELECT last_of(v) FROM t WHERE id = 1",
        "volatile_function",
    )
    .await;
}

#[tokio::test]
async fn a_query_that_ends_a_transaction_and_goes_on_keeps_what_committed() {
    let (_pg, memo, _direct) = setup().await;
    let c = memo.client("postgres", "postgres").await;
    let other = memo.client("postgres", "postgres").await;
    cache_support::a_query_that_ends_a_transaction_and_goes_on_keeps_what_committed(&c, &other)
        .await;
}

/// A statement first seen inside a REPEATABLE READ block is not planned from that block's
/// snapshot of the catalog: here the snapshot predates row security on the table, and a plan
/// made from it (and memoized for every session of the role) let one tenant's cached row be
/// served to another.
#[tokio::test]
async fn a_snapshot_block_does_not_plan_from_its_old_catalog() {
    let (pg, memo, _direct) = setup().await;
    pg.psql(
        "CREATE TABLE docs (id int PRIMARY KEY, tenant int, v text); \
         INSERT INTO docs VALUES (1, 1, 'one''s'); \
         CREATE ROLE app LOGIN; GRANT SELECT ON docs TO app;",
    )
    .await;
    let q = "SELECT v FROM docs WHERE id = 1";
    let early = memo.client("app", "postgres").await;
    // The session's context is known (read between transactions), then its snapshot taken.
    first(&early, "SELECT v FROM docs WHERE id = 1 AND tenant = 1").await;
    early
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    first(&early, "SELECT 1").await;
    let owner = memo.client("postgres", "postgres").await;
    owner
        .batch_execute(
            "ALTER TABLE docs ENABLE ROW LEVEL SECURITY; \
             CREATE POLICY by_tenant ON docs \
               USING (tenant = current_setting('app.tenant', true)::int)",
        )
        .await
        .unwrap();
    // Row security applies to the read itself (the executor sees the current catalog).
    assert_eq!(first(&early, q).await, None);
    early.batch_execute("COMMIT").await.unwrap();
    let one = memo.client("app", "postgres").await;
    one.batch_execute("SET app.tenant = '1'").await.unwrap();
    for _ in 0..3 {
        assert_eq!(first(&one, q).await.as_deref(), Some("one's"), "tenant 1");
    }
    let two = memo.client("app", "postgres").await;
    two.batch_execute("SET app.tenant = '2'").await.unwrap();
    assert_eq!(
        first(&two, q).await,
        None,
        "tenant 2 sees no row of tenant 1"
    );
}

/// Roles belong to the whole cluster: a `REVOKE` of a role's membership run in one database
/// takes the results cached for that role in every database, so the role gets PostgreSQL's
/// permission error where its membership used to let it read.
#[tokio::test]
async fn a_role_change_in_one_database_reaches_the_cache_of_every_database() {
    let (pg, memo, _direct) = setup().await;
    pg.psql("CREATE DATABASE other; CREATE ROLE readers; CREATE ROLE alice LOGIN IN ROLE readers;")
        .await;
    let other_admin = pg.client("postgres", "other").await;
    other_admin
        .batch_execute(
            "CREATE TABLE secret (id int PRIMARY KEY, v text); \
             INSERT INTO secret VALUES (1, 'classified'); \
             GRANT SELECT ON secret TO readers;",
        )
        .await
        .unwrap();
    let alice = memo.client("alice", "other").await;
    let q = "SELECT v FROM secret WHERE id = 1";
    let hits = show_cache(&memo, "hits").await;
    for _ in 0..3 {
        assert_eq!(first(&alice, q).await.as_deref(), Some("classified"));
    }
    assert!(show_cache(&memo, "hits").await > hits, "cached for alice");
    let admin = memo.client("postgres", "postgres").await;
    admin
        .batch_execute("REVOKE readers FROM alice")
        .await
        .unwrap();
    let err = alice
        .simple_query(q)
        .await
        .expect_err("alice still reads after losing her membership");
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE)
    );
}

/// A client of pgmemo whose session starts under `time_zone`.
async fn client_in_zone(memo: &PgmemoInstance, time_zone: &str) -> Client {
    let mut config: tokio_postgres::Config = memo.url("postgres", "postgres").parse().unwrap();
    config.options(format!("-c TimeZone={time_zone}"));
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// PostgreSQL reads a statement's literals under the settings of its Parse and keeps them
/// after `SET TimeZone`: a named statement executed after the SET is neither answered from nor
/// stored under the new context, whose fresh parses read the literal another way.
#[tokio::test]
async fn a_statement_keeps_the_settings_it_was_parsed_under() {
    let (_pg, memo, direct) = setup().await;
    let q = "SELECT '2020-01-01 00:00'::timestamptz = '2020-01-01 00:00+00'::timestamptz, 7";
    let a = client_in_zone(&memo, "UTC").await;
    let s1 = a.prepare(q).await.unwrap();
    let equal = |rows: Vec<tokio_postgres::Row>| rows[0].get::<_, bool>(0);
    assert!(equal(a.query(&s1, &[]).await.unwrap()));
    a.batch_execute("SET TimeZone = 'Asia/Tokyo'")
        .await
        .unwrap();
    // Past admission: a cheap result is stored at its second miss.
    for _ in 0..3 {
        assert!(equal(a.query(&s1, &[]).await.unwrap()), "parsed under UTC");
    }
    assert!(cache_support::refused(&memo, "parsed_under_other_settings").await >= 3);
    direct
        .batch_execute("SET TimeZone = 'Asia/Tokyo'")
        .await
        .unwrap();
    assert!(!equal(direct.query(q, &[]).await.unwrap()));
    let b = client_in_zone(&memo, "Asia/Tokyo").await;
    // Bind Execute Sync, as A's executions (a Describe in the batch would be a miss).
    for _ in 0..3 {
        assert!(!equal(b.query(q, &[]).await.unwrap()), "parsed under Tokyo");
    }
    assert!(!equal(b.query_typed(q, &[]).await.unwrap()));
}

/// pgmemo's own queries on a session's server (planning a statement shape it has not seen,
/// reading the session's settings) run between a client's Parse of the unnamed statement
/// and its later Binds of it, as libpq's `PQexecPrepared` with `""` sends them: they leave the
/// unnamed statement in place, in and out of a transaction block, as PostgreSQL would.
#[tokio::test]
async fn the_unnamed_statement_survives_pgmemos_own_queries() {
    let (_pg, memo, direct) = setup().await;
    // A write to a table with a trigger makes the session read its settings again.
    direct
        .batch_execute(
            "CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
             CREATE TRIGGER noop BEFORE UPDATE OR DELETE ON t FOR EACH ROW EXECUTE FUNCTION noop();",
        )
        .await
        .unwrap();
    let mut r = raw::Raw::connect(memo.addr()).await;
    for (begin, write, read) in [
        (
            None,
            "DELETE FROM t WHERE id = $1",
            "SELECT v FROM t WHERE id = $1",
        ),
        (
            Some("BEGIN"),
            "UPDATE t SET v = v WHERE id = $1",
            "SELECT v, id FROM t WHERE id = $1",
        ),
    ] {
        if let Some(begin) = begin {
            r.round_trip(&[raw::query(begin)]).await;
        }
        for (n, sql) in [write, read].into_iter().enumerate() {
            let (tags, _) = r
                .round_trip(&[
                    raw::parse(sql, &[]),
                    raw::describe_statement(),
                    raw::bind(&["7"]),
                    raw::execute(),
                    raw::sync(),
                ])
                .await;
            assert!(!tags.contains(&'E'), "{sql}: {tags:?}");
            // A named portal lasts until the block ends: one name per statement.
            let portal = format!("p{n}");
            let mut execute_body = portal.as_bytes().to_vec();
            execute_body.extend_from_slice(&[0, 0, 0, 0, 0]);
            for (bind, execute) in [
                (raw::bind(&["2"]), raw::execute()),
                (bind_portal(&portal, &["2"]), raw::msg(b'E', &execute_body)),
            ] {
                let answer = r.round_trip_bytes(&[bind, execute, raw::sync()]).await;
                assert!(
                    answer.first() != Some(&b'E'),
                    "{sql} bound again: {}",
                    String::from_utf8_lossy(&answer)
                );
            }
        }
    }
    r.round_trip(&[raw::query("ROLLBACK")]).await;
}

/// Bind of the portal `portal` to the unnamed statement, text parameters and results.
fn bind_portal(portal: &str, params: &[&str]) -> Vec<u8> {
    let mut body = portal.as_bytes().to_vec();
    body.extend_from_slice(&[0, 0, 0, 0]);
    body.extend_from_slice(&(params.len() as i16).to_be_bytes());
    for p in params {
        body.extend_from_slice(&(p.len() as i32).to_be_bytes());
        body.extend_from_slice(p.as_bytes());
    }
    body.extend_from_slice(&[0, 0]);
    raw::msg(b'B', &body)
}

//! Operators are function calls: a user-defined one backed by a volatile or stable function
//! must keep a read out of the cache, and a volatile one that writes must invalidate.

mod cache_support;
mod raw;

use cache_support::{admin_rows, first, setup_with};
use tokio_postgres::Client;

/// Runs `sql` twice through pgmemo, changes `t` directly, and tells whether pgmemo still
/// answers with the value from before the change (served from the cache).
async fn served_from_cache(memo: &Client, direct: &Client, sql: &str) -> bool {
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

#[tokio::test]
async fn user_defined_operators_are_checked_for_volatility() {
    let (pg, memo, direct) = setup_with(|_| {}).await;
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
        assert!(
            !served_from_cache(&c, &direct, sql).await,
            "{sql} was cached"
        );
        let explained = admin_rows(&memo, &format!("EXPLAIN CACHE {sql}")).await;
        assert_eq!(
            explained[0][4].as_deref(),
            Some(reason),
            "{sql}: {explained:?}"
        );
    }
    // Immutable user-defined operators and the built-in ones are fine.
    assert!(served_from_cache(&c, &direct, "SELECT v &&& '!' FROM t WHERE id = 1").await);
    assert!(served_from_cache(&c, &direct, "SELECT v || '!' FROM t WHERE id + 0 = 1").await);
}

#[tokio::test]
async fn a_volatile_operator_that_writes_invalidates() {
    let (pg, memo, _direct) = setup_with(|_| {}).await;
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

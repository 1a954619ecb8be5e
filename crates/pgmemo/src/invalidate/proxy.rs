//! Invalidation by writes that pass through pgmemo: both pool modes apply a transaction's
//! effects here when its COMMIT (or the end of an autocommit statement) arrives, before the
//! client can see it.

use std::sync::atomic::Ordering;

use crate::cache::plan::Effects;
use crate::cache::DatabaseCache;
use crate::shared::Shared;

/// Applies committed effects to the cache. Returns true when writes pgmemo cannot attribute
/// were left to the live replication feed: the writing session must then bypass the cache until
/// the feed has applied its commit (read-your-writes).
pub fn apply_commit(e: &Effects, shared: &Shared, db: &DatabaseCache) -> bool {
    tracing::debug!(effects = ?e, "applying committed effects");
    let stats = &shared.cache.stats;
    let mut left_to_feed = false;
    if e.all_databases {
        // A role lost (or gained) what it may read anywhere: no database's results or plans
        // stand, this one's included.
        shared.cache.purge_all();
        stats.database_invalidations.fetch_add(1, Ordering::Relaxed);
        return false;
    }
    // DDL relayed here (applied at once, whatever the stream reports later), or user code
    // pgmemo cannot see into (DO, CALL, a volatile user-defined function) that may have run
    // some while the stream carries no DDL (no event trigger). What a memoized plan says of a
    // statement (cacheable, its tables, row security, the volatility of its functions) may
    // no longer hold. Built-in volatile functions (random(), nextval()) run no DDL and keep
    // the plans.
    let unreported_ddl = e.ddl || (e.hidden_settings && !db.feed.sees_ddl());
    if unreported_ddl {
        db.forget_plans();
    }
    if e.database_wide {
        // Rows a statement wrote somewhere pgmemo cannot name (DO, CALL, volatile functions,
        // triggers) arrive on a live feed, so the other sessions' entries need not all go;
        // not so after DDL the stream does not report (`REFRESH MATERIALIZED VIEW` in a `DO`
        // block changes rows the stream never shows).
        if db.feed.state() == crate::cache::feed::FeedState::Live && !unreported_ddl {
            left_to_feed = true;
        } else {
            db.generations.invalidate_database();
            stats.database_invalidations.fetch_add(1, Ordering::Relaxed);
        }
    }
    if !e.writes.is_empty() {
        db.generations.invalidate_tables(&e.writes);
        stats
            .invalidations
            .fetch_add(e.writes.len() as u64, Ordering::Relaxed);
    }
    left_to_feed
}

//! `SHOW CACHE`, `SHOW QUERIES`, `SHOW TABLES` and `CACHE PURGE [table]`: what the result cache
//! holds, how well it does, per statement and per table, and a way to empty it.

use std::sync::atomic::Ordering;

use super::table::Table;
use crate::shared::Shared;

fn n(v: u64) -> Option<String> {
    Some(v.to_string())
}

/// `SHOW CACHE`: one row per figure (name, value), like `SHOW STATS`.
pub fn show_cache(shared: &Shared) -> Table {
    let c = &shared.cache;
    let s = &c.stats;
    let (hits, misses) = (s.hits(), s.misses());
    let ratio = if hits + misses == 0 {
        0.0
    } else {
        hits as f64 / (hits + misses) as f64
    };
    let mut t = Table::new(&["name", "value"]);
    let mut row = |name: &str, value: Option<String>| t.row(vec![Some(name.to_owned()), value]);
    row("enabled", Some(shared.config().cache.is_on().to_string()));
    row("entries", n(c.store.len() as u64));
    row("bytes", n(c.store.bytes()));
    row("limit_bytes", n(c.store.capacity()));
    row("hits", n(hits));
    row("misses", n(misses));
    row("hit_ratio", Some(format!("{ratio:.4}")));
    row("stores", n(s.stores.load(Ordering::Relaxed)));
    row("stale_fills", n(s.stale_fills.load(Ordering::Relaxed)));
    row("invalidations", n(s.invalidations.load(Ordering::Relaxed)));
    row(
        "database_invalidations",
        n(s.database_invalidations.load(Ordering::Relaxed)),
    );
    row("evictions", n(c.store.evictions()));
    row("flight_waits", n(s.flight_waits.load(Ordering::Relaxed)));
    row(
        "flight_waiting",
        n(s.flight_waiting.load(Ordering::Relaxed)),
    );
    row(
        "catalog_lookups",
        n(s.catalog_lookups.load(Ordering::Relaxed)),
    );
    row("context_reads", n(s.context_reads.load(Ordering::Relaxed)));
    row(
        "admission_skips",
        n(s.admission_skips.load(Ordering::Relaxed)),
    );
    row("saved_ms", n(s.saved_micros() / 1000));
    row("invalidation_feed", Some(feed_states(shared)));
    for (reason, count) in s.refusals() {
        row(&format!("refused_{reason}"), n(count));
    }
    t
}

/// The state of every replication feed as `db=state`, comma-separated, in start order;
/// `probing` while `invalidation = auto` has not decided yet whether a feed runs (the cache
/// serves nothing meanwhile); `not_used` when no feed was started (`invalidation = proxy |
/// ttl`, or nothing used yet), so an operator sees at a glance whether the cache is failing
/// closed.
fn feed_states(shared: &Shared) -> String {
    let feeds = shared.feeds.all();
    if feeds.is_empty() && shared.cache.feed_undecided() {
        return "probing".to_owned();
    }
    if feeds.is_empty() {
        return crate::cache::feed::FeedState::NotUsed.name().to_owned();
    }
    feeds
        .iter()
        .map(|f| {
            let db = f.db.name.rsplit('/').next().unwrap_or(&f.db.name);
            format!("{db}={}", f.state().name())
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `SHOW QUERIES`: per statement shape.
pub fn show_queries(shared: &Shared) -> Table {
    let mut t = Table::new(&[
        "query",
        "calls",
        "hits",
        "misses",
        "mean_miss_ms",
        "saved_ms",
        "last_refusal",
    ]);
    let mut queries = shared.cache.queries.all();
    queries.sort_by_key(|q| std::cmp::Reverse(q.calls()));
    for q in queries {
        let timed = q.timed_misses.load(Ordering::Relaxed);
        let mean = if timed == 0 {
            0.0
        } else {
            q.miss_micros.load(Ordering::Relaxed) as f64 / timed as f64 / 1000.0
        };
        t.row(vec![
            Some(q.text.clone()),
            n(q.calls()),
            n(q.hits()),
            n(q.misses()),
            Some(format!("{mean:.3}")),
            n(q.saved_micros() / 1000),
            q.last_refusal().map(|r| r.name().to_owned()),
        ]);
    }
    t
}

/// `SHOW TABLES`: per table seen by the cache.
pub fn show_tables(shared: &Shared) -> Table {
    let mut t = Table::new(&["database", "table", "oid", "fills", "invalidations"]);
    for db in shared.cache.databases() {
        for table in db.generations.all() {
            let name = table.name.lock().unwrap_or_else(|e| e.into_inner()).clone();
            t.row(vec![
                Some(db.name.clone()),
                Some(name),
                n(u64::from(table.oid)),
                n(table.fills.load(Ordering::Relaxed)),
                n(table.invalidations.load(Ordering::Relaxed)),
            ]);
        }
    }
    t
}

//! What the cache counts: totals for `SHOW CACHE` and the metrics endpoint, refusals by reason,
//! and per-statement figures for `SHOW QUERIES`. Atomics only on the hit path, and striped per
//! core there (see [`super::striped`]); the statement registry is locked on a miss, never on a
//! hit (entries hold their statement's counters).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use super::plan::Refusal;
use super::striped::Striped;

use crate::hash::Map;

/// Most statements `SHOW QUERIES` keeps; past it new statements are not tracked.
const MAX_TRACKED_QUERIES: usize = 5000;

/// The striped cache-wide counters every hit or miss bumps: see [`CacheStats::hits`].
const HITS: usize = 0;
const MISSES: usize = 1;
const SAVED_MICROS: usize = 2;

/// Cache-wide counters.
#[derive(Debug)]
pub struct CacheStats {
    /// Hits, misses and the upstream time hits saved.
    served: Striped<3>,
    pub stores: AtomicU64,
    /// Stores skipped because a write committed while the result was being read (fill race).
    pub stale_fills: AtomicU64,
    /// Table invalidations applied (one per table per write).
    pub invalidations: AtomicU64,
    /// Whole-database invalidations (writes pgmemo could not attribute, DDL, purges).
    pub database_invalidations: AtomicU64,
    /// Misses that waited for another session's identical query instead of running it.
    pub flight_waits: AtomicU64,
    /// Sessions waiting now for another session's identical query (a gauge).
    pub flight_waiting: AtomicU64,
    /// Catalog lookups pgmemo ran to analyse a statement shape.
    pub catalog_lookups: AtomicU64,
    /// Cacheable misses not stored because their key had not missed recently (see
    /// [`super::admission`]).
    pub admission_skips: AtomicU64,
    /// Times pgmemo read a session's settings (the key's context) again after something may
    /// have changed them: each costs a query on the server.
    pub context_reads: AtomicU64,
    refusals: [AtomicU64; Refusal::COUNT],
}

impl Default for CacheStats {
    fn default() -> Self {
        CacheStats {
            served: Striped::default(),
            stores: AtomicU64::new(0),
            stale_fills: AtomicU64::new(0),
            invalidations: AtomicU64::new(0),
            database_invalidations: AtomicU64::new(0),
            flight_waits: AtomicU64::new(0),
            flight_waiting: AtomicU64::new(0),
            catalog_lookups: AtomicU64::new(0),
            context_reads: AtomicU64::new(0),
            admission_skips: AtomicU64::new(0),
            refusals: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl CacheStats {
    /// Counts a hit answered from `entry`, and the upstream time it saved.
    pub fn served(&self, entry: &super::store::Entry) {
        self.count_hit(entry.miss_micros);
        entry.query.hit(entry.miss_micros);
    }

    /// Counts a hit that saved `micros` of upstream time (cache-wide only).
    pub fn count_hit(&self, micros: u64) {
        self.served.add_each([1, 0, micros]);
    }

    /// Requests answered from the cache.
    pub fn hits(&self) -> u64 {
        self.served.get(HITS)
    }

    /// Cacheable requests sent upstream.
    pub fn misses(&self) -> u64 {
        self.served.get(MISSES)
    }

    /// Microseconds of upstream time saved by hits.
    pub fn saved_micros(&self) -> u64 {
        self.served.get(SAVED_MICROS)
    }

    /// Counts one request that was not cached, by reason.
    pub fn refused(&self, reason: Refusal) {
        self.refusals[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a statement's request refused for `reason`, on the cache and on the statement.
    pub fn refused_query(&self, reason: Refusal, query: &QueryStats) {
        self.refused(reason);
        query.miss(Some(reason));
    }

    /// Counts a cacheable request that missed (stored or not), on the cache and on the
    /// statement.
    pub fn missed(&self, query: &QueryStats) {
        self.served.add(MISSES, 1);
        query.miss(None);
    }

    /// Refusal counts by reason name, leaving out reasons never seen.
    pub fn refusals(&self) -> Vec<(&'static str, u64)> {
        Refusal::ALL
            .iter()
            .map(|r| (r.name(), self.refusals[*r as usize].load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Count for one reason.
    pub fn refusal_count(&self, reason: Refusal) -> u64 {
        self.refusals[reason as usize].load(Ordering::Relaxed)
    }
}

/// Mean miss time from which a statement's concurrent misses share one run.
const SINGLE_FLIGHT_MIN: std::time::Duration = std::time::Duration::from_millis(1);

/// Figures for one normalized statement.
#[derive(Debug)]
pub struct QueryStats {
    /// The statement's shape (literals blanked).
    pub text: String,
    /// Calls, hits, misses and the upstream time hits saved: every session running the
    /// statement bumps them, so they are striped.
    runs: Striped<4>,
    /// Total upstream time of misses that were timed, in microseconds.
    pub miss_micros: AtomicU64,
    /// Misses that were timed.
    pub timed_misses: AtomicU64,
    /// `Refusal as u8 + 1`, 0 for none: an atomic rather than a lock, as every refused run of
    /// the statement (every write, among others) records it, from every session at once.
    last_refusal: AtomicU8,
}

impl QueryStats {
    fn new(text: String) -> QueryStats {
        QueryStats {
            text,
            runs: Striped::default(),
            miss_micros: AtomicU64::new(0),
            timed_misses: AtomicU64::new(0),
            last_refusal: AtomicU8::new(0),
        }
    }

    /// Records a hit that saved `micros` of upstream time.
    #[inline]
    pub fn hit(&self, micros: u64) {
        self.runs.add_each([1, 1, 0, micros]);
    }

    /// Records a miss (or an uncached run).
    pub fn miss(&self, refusal: Option<Refusal>) {
        self.runs.add_each([1, 0, 1, 0]);
        if let Some(r) = refusal {
            self.note_refusal(r);
        }
    }

    /// Runs of the statement through pgmemo (hits and misses).
    pub fn calls(&self) -> u64 {
        self.runs.get(0)
    }

    /// Runs answered from the cache.
    pub fn hits(&self) -> u64 {
        self.runs.get(1)
    }

    /// Runs sent upstream.
    pub fn misses(&self) -> u64 {
        self.runs.get(2)
    }

    /// Microseconds of upstream time the statement's hits saved.
    pub fn saved_micros(&self) -> u64 {
        self.runs.get(3)
    }

    /// Records why a miss already counted was not stored after all (its response was too
    /// large, or not a clean result): `SHOW QUERIES`' last refusal.
    pub fn note_refusal(&self, refusal: Refusal) {
        const _: () = assert!(Refusal::COUNT < u8::MAX as usize);
        let code = refusal as u8 + 1;
        // Written only when it changes: a statement refused for the same reason run after run
        // (a write) leaves the cache line shared instead of pulling it to every core in turn.
        if self.last_refusal.load(Ordering::Relaxed) != code {
            self.last_refusal.store(code, Ordering::Relaxed);
        }
    }

    /// Whether the statement is new or its misses take at least `min` upstream on average:
    /// such a statement's results are stored on their first miss (see [`super::admission`]).
    pub fn costly(&self, min: std::time::Duration) -> bool {
        let n = self.timed_misses.load(Ordering::Relaxed);
        n == 0 || self.miss_micros.load(Ordering::Relaxed) / n >= min.as_micros() as u64
    }

    /// Whether concurrent misses of this statement should wait for one another (single
    /// flight): when it is new or its misses take a millisecond or more. For quicker ones the
    /// bookkeeping would cost more than running the statement twice.
    pub fn worth_single_flight(&self) -> bool {
        self.costly(SINGLE_FLIGHT_MIN)
    }

    /// Records how long a miss took upstream.
    pub fn timed(&self, micros: u64) {
        self.miss_micros.fetch_add(micros, Ordering::Relaxed);
        self.timed_misses.fetch_add(1, Ordering::Relaxed);
    }

    /// Why the statement was last not cached.
    pub fn last_refusal(&self) -> Option<Refusal> {
        let code = self.last_refusal.load(Ordering::Relaxed);
        Refusal::ALL.get(usize::from(code).checked_sub(1)?).copied()
    }
}

/// The per-statement registry.
#[derive(Debug, Default)]
pub struct QueryRegistry {
    queries: Mutex<Map<String, Arc<QueryStats>>>,
    /// Shared by every statement past the tracking limit.
    overflow: std::sync::OnceLock<Arc<QueryStats>>,
}

impl QueryRegistry {
    /// The counters of the statement with this shape.
    pub fn get(&self, shape: &str) -> Arc<QueryStats> {
        let mut queries = self.queries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(q) = queries.get(shape) {
            return Arc::clone(q);
        }
        if queries.len() >= MAX_TRACKED_QUERIES {
            return Arc::clone(
                self.overflow
                    .get_or_init(|| Arc::new(QueryStats::new("(other statements)".into()))),
            );
        }
        let q = Arc::new(QueryStats::new(shape.to_owned()));
        queries.insert(shape.to_owned(), Arc::clone(&q));
        q
    }

    /// Every tracked statement.
    pub fn all(&self) -> Vec<Arc<QueryStats>> {
        let queries = self.queries.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = queries.values().cloned().collect();
        v.extend(self.overflow.get().cloned());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_refusal_is_kept_for_every_reason() {
        let q = QueryStats::new("SELECT ?".into());
        assert_eq!(q.last_refusal(), None);
        for &r in Refusal::ALL {
            q.miss(Some(r));
            assert_eq!(q.last_refusal(), Some(r));
        }
        q.miss(None);
        assert_eq!(
            q.last_refusal(),
            Refusal::ALL.last().copied(),
            "a plain miss keeps it"
        );
        q.note_refusal(Refusal::ALL[0]);
        assert_eq!(q.last_refusal(), Some(Refusal::ALL[0]));
        assert_eq!(q.calls(), Refusal::ALL.len() as u64 + 1);
        assert_eq!(q.misses(), q.calls());
        q.hit(250);
        assert_eq!(
            (q.calls(), q.hits(), q.saved_micros()),
            (q.misses() + 1, 1, 250)
        );
    }
}

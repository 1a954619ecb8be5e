//! The query-result cache: step 4 of the query path. A session asks it for a result by key
//! (`store`), for the plan of a statement shape (`plan`, memoized per database and session
//! context), and tells it about writes (`generation`). Everything here is shared by all
//! sessions through [`Cache`], held in [`crate::shared::Shared`].
//!
//! - `context`: the session half of the key (role and output-relevant settings), interned.
//! - `catalog`: the lookup that resolves a statement's names on the upstream.
//! - `plan`: the policy: cacheable or why not, and what a statement's run invalidates.
//! - `generation`: per-table counters that make invalidation O(tables) and the fill race
//!   impossible.
//! - `store`: the byte-bounded map of results.
//! - `stats`: counters for the admin console and metrics.

pub mod admission;
pub mod capture;
pub mod catalog;
pub mod context;
pub mod feed;
pub mod flight;
pub mod generation;
pub mod memo;
pub mod plan;
pub mod planner;
pub mod stats;
pub mod store;
pub mod striped;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use context::Contexts;
use generation::Generations;
use plan::Plan;
use stats::{CacheStats, QueryRegistry};
use store::Store;

use crate::hash::Map;

/// The cache state of one upstream database.
pub struct DatabaseCache {
    /// Process-unique id; first bytes of every key of this database.
    pub id: u32,
    /// `host:port/dbname`, for the admin console.
    pub name: String,
    /// Where the database lives, for the replication feed.
    pub host: String,
    pub port: u16,
    pub dbname: String,
    pub generations: Generations,
    pub contexts: Contexts,
    /// Whether the replication feed lets this database's cache serve (doctrine rule 5).
    pub feed: feed::FeedGate,
    /// Memoized plans by [`plan_memo_key`].
    plans: memo::PlanMemo,
    /// Sessions relaying this database without the cache (see [`Cache::untracked_session`]).
    untracked: Arc<AtomicUsize>,
}

/// A session relaying a database without the cache, from [`Cache::untracked_session`] until
/// dropped.
pub struct UntrackedSession {
    count: Arc<AtomicUsize>,
}

impl Drop for UntrackedSession {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

impl DatabaseCache {
    /// Whether every write relayed by this pgmemo reaches this database's cache: no session
    /// relays it untracked, or the replication feed sees their writes anyway. Their DDL too:
    /// a feed without pgmemo's event trigger (its user is no superuser) carries row changes
    /// only, and `CREATE OR REPLACE VIEW`, `ALTER TABLE ... ENABLE ROW LEVEL SECURITY` or a
    /// function made `VOLATILE` by an untracked session would then reach neither the proxy
    /// nor the feed.
    pub fn sees_relayed_writes(&self) -> bool {
        self.untracked.load(Ordering::Acquire) == 0 || self.feed.sees_ddl()
    }

    /// The memoized plan for a key made by [`plan_memo_key`].
    pub fn plan(&self, key: &[u8]) -> Option<Arc<Plan>> {
        self.plans.get(key)
    }

    /// Memoizes a plan made from what was known at `epoch` (a [`Self::plans_epoch`] read before
    /// the plan's inputs): see [`memo::PlanMemo::remember`].
    pub fn remember(&self, key: Vec<u8>, plan: Arc<Plan>, epoch: u64) {
        self.plans.remember(key, plan, epoch);
    }

    /// The memoized plans of a shape, per session context id (for `EXPLAIN CACHE`).
    pub fn plans_for_shape(&self, hints: &[String], shape: &str) -> Vec<(u64, Arc<Plan>)> {
        let rest = plan_memo_key(0, hints, shape);
        let rest = &rest[8..];
        let mut v = self.plans.matching(|k| {
            let (ctx, k_rest) = k.split_first_chunk::<8>()?;
            (k_rest == rest).then(|| u64::from_le_bytes(*ctx))
        });
        v.sort_by_key(|(ctx, _)| *ctx);
        v
    }

    /// Drops every memoized plan (after DDL: names may now mean other relations, functions
    /// other volatilities).
    pub fn forget_plans(&self) {
        self.plans.forget();
    }

    /// Changes whenever memoized plans are dropped.
    pub fn plans_epoch(&self) -> u64 {
        self.plans.epoch()
    }
}

/// How a database is named in the cache's maps and the admin console: `host:port/dbname`.
fn database_name(host: &str, port: u16, dbname: &str) -> String {
    format!("{host}:{port}/{dbname}")
}

/// The memo key of a statement shape planned in session context `context_id`: the context,
/// the shape, and the hint comments (the shape drops comments, hints change the plan) after a
/// NUL, which no query text holds.
pub fn plan_memo_key(context_id: u64, hints: &[String], shape: &str) -> Vec<u8> {
    let hints_len: usize = hints.iter().map(String::len).sum();
    let mut key = Vec::with_capacity(9 + hints_len + shape.len());
    key.extend_from_slice(&context_id.to_le_bytes());
    key.extend_from_slice(shape.as_bytes());
    push_hints(&mut key, hints);
    key
}

/// [`plan_memo_key`] of the text `sql`, shaped straight into `key` (cleared first; a buffer
/// the caller keeps, so that the lookup every simple-query miss makes allocates nothing), and
/// what the shape found.
pub fn plan_memo_key_into(
    context_id: u64,
    sql: &str,
    standard_conforming_strings: bool,
    key: &mut Vec<u8>,
) -> sql::ShapeFacts {
    key.clear();
    key.extend_from_slice(&context_id.to_le_bytes());
    let facts = sql::shape_into(sql, standard_conforming_strings, key);
    push_hints(key, &facts.hints);
    facts
}

fn push_hints(key: &mut Vec<u8>, hints: &[String]) {
    key.push(0);
    for h in hints {
        key.extend_from_slice(h.as_bytes());
    }
}

/// The process-wide cache.
pub struct Cache {
    pub store: Store,
    /// Which misses are stored (see [`admission`]).
    pub admission: admission::Admission,
    pub stats: CacheStats,
    pub queries: QueryRegistry,
    /// Keys being filled now (single flight).
    pub flights: Arc<flight::Flights>,
    databases: Mutex<Map<String, Arc<DatabaseCache>>>,
    next_database: AtomicU32,
    /// Per database (`host:port/dbname`), the sessions relaying it without the cache.
    untracked: Mutex<Map<String, Arc<AtomicUsize>>>,
    /// Told about every database when it is first used, so the replication feed can follow
    /// it (set once at start when a feed is wanted).
    new_databases: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<Arc<DatabaseCache>>>,
    /// Whether a feed is used is not decided yet (`invalidation = auto` asking the upstream):
    /// databases' gates start `Down` (see [`Cache::hold_until_feed_decided`]). Read and
    /// written with `databases` locked, so no database escapes a decision.
    feed_undecided: AtomicBool,
}

impl Cache {
    /// Waits (at most [`flight::WAIT_LIMIT`]) for the session filling a key to finish, counting
    /// the wait; the caller then looks the key up again. Counted in `flight_waiting` while it
    /// waits, also when the wait is abandoned (a cancel).
    pub async fn wait_for_flight(&self, done: tokio::sync::watch::Receiver<()>) {
        /// Takes the waiter off the gauge however the wait ends.
        struct Waiting<'a>(&'a std::sync::atomic::AtomicU64);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.stats.flight_waiting.fetch_add(1, Ordering::Relaxed);
        let _waiting = Waiting(&self.stats.flight_waiting);
        flight::wait(done, flight::WAIT_LIMIT).await;
        self.stats.flight_waits.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether a cacheable miss of `key` (statement `query`) is stored under the
    /// configuration's `cache_admission` and `cache_costly_miss`, and counts it when not
    /// (see [`admission`]).
    pub fn admits(&self, key: &[u8], query: &stats::QueryStats, config: &crate::Config) -> bool {
        if config.cache_admission == crate::config::CacheAdmission::Always {
            return true;
        }
        // Noted whatever decides: a key stored at once and then invalidated is not new.
        let seen = self.admission.seen_before(key);
        let admitted = seen || query.costly(config.cache_costly_miss.0);
        if !admitted {
            self.stats.admission_skips.fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    /// A cache holding at most `capacity` bytes.
    pub fn new(capacity: u64) -> Cache {
        Cache {
            store: Store::new(capacity),
            admission: admission::Admission::new(capacity),
            stats: CacheStats::default(),
            queries: QueryRegistry::default(),
            flights: Arc::default(),
            databases: Mutex::new(Map::default()),
            next_database: AtomicU32::new(0),
            untracked: Mutex::new(Map::default()),
            new_databases: std::sync::OnceLock::new(),
            feed_undecided: AtomicBool::new(false),
        }
    }

    /// Until [`Cache::follow_databases`] or [`Cache::no_feed`], every database's gate is
    /// `Down`, those used from now on too: while `invalidation = auto` asks the upstream
    /// whether a feed is possible, pgmemo cannot know that it sees every write, so the cache
    /// serves and stores nothing (doctrine rule 5).
    pub fn hold_until_feed_decided(&self) {
        let dbs = self.databases.lock().unwrap_or_else(|e| e.into_inner());
        self.feed_undecided.store(true, Ordering::Release);
        for db in dbs.values() {
            db.feed.set(feed::FeedState::Down);
        }
    }

    /// Whether `invalidation = auto` is still asking the upstream whether a feed is possible
    /// (the cache serves nothing meanwhile), for `SHOW CACHE`.
    pub fn feed_undecided(&self) -> bool {
        self.feed_undecided.load(Ordering::Acquire)
    }

    /// No feed will run (`auto` found none possible): every database's gate opens for the
    /// proxy's invalidation (`NotUsed`). Nothing was served or stored while they were held,
    /// and every write relayed meanwhile invalidated as under `proxy`, so nothing is flushed.
    pub fn no_feed(&self) {
        let dbs = self.databases.lock().unwrap_or_else(|e| e.into_inner());
        self.feed_undecided.store(false, Ordering::Release);
        for db in dbs.values() {
            db.feed.set(feed::FeedState::NotUsed);
        }
    }

    /// Asks to be told about databases as they are first used (and about those already
    /// known). A new database's gate starts `Down` from then on, until its feed opens it.
    pub fn follow_databases(&self) -> tokio::sync::mpsc::UnboundedReceiver<Arc<DatabaseCache>> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let dbs = self.databases.lock().unwrap_or_else(|e| e.into_inner());
        for db in dbs.values() {
            db.feed.set(feed::FeedState::Down);
            let _ = tx.send(Arc::clone(db));
        }
        let _ = self.new_databases.set(tx);
        self.feed_undecided.store(false, Ordering::Release);
        rx
    }

    /// The state of the database `dbname` on `host:port`, created on first use.
    pub fn database(&self, host: &str, port: u16, dbname: &str) -> Arc<DatabaseCache> {
        let name = database_name(host, port, dbname);
        let name = name.as_str();
        let mut dbs = self.databases.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(db) = dbs.get(name) {
            return Arc::clone(db);
        }
        let db = Arc::new(DatabaseCache {
            id: self.next_database.fetch_add(1, Ordering::Relaxed) + 1,
            name: name.to_owned(),
            host: host.to_owned(),
            port,
            dbname: dbname.to_owned(),
            generations: Generations::default(),
            contexts: Contexts::default(),
            feed: feed::FeedGate::default(),
            plans: memo::PlanMemo::default(),
            untracked: self.untracked_count(name),
        });
        dbs.insert(name.to_owned(), Arc::clone(&db));
        if let Some(tx) = self.new_databases.get() {
            db.feed.set(feed::FeedState::Down);
            let _ = tx.send(Arc::clone(&db));
        } else if self.feed_undecided.load(Ordering::Acquire) {
            db.feed.set(feed::FeedState::Down);
        }
        db
    }

    /// Registers a session that relays database `dbname` at `host:port` without looking at
    /// its traffic (the cache was off for it when it started), so its writes invalidate
    /// nothing (doctrine rule 5). What the database's cache holds goes at once, and until the
    /// session ends the cache serves and stores nothing for the database unless its
    /// replication feed is live and carries DDL (see [`DatabaseCache::sees_relayed_writes`]):
    /// a reload that turns the cache back on, or another client database mapped to the same
    /// upstream database with the cache on, never gets a result those writes made stale.
    /// Registering creates no database cache (and no feed).
    pub fn untracked_session(&self, host: &str, port: u16, dbname: &str) -> UntrackedSession {
        let name = database_name(host, port, dbname);
        let count = self.untracked_count(&name);
        count.fetch_add(1, Ordering::AcqRel);
        // After the count: a fill that began before is refused when it would be stored.
        let db = self
            .databases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&name)
            .cloned();
        if let Some(db) = db {
            db.generations.invalidate_database();
        }
        UntrackedSession { count }
    }

    fn untracked_count(&self, name: &str) -> Arc<AtomicUsize> {
        let mut counts = self.untracked.lock().unwrap_or_else(|e| e.into_inner());
        match counts.get(name) {
            Some(c) => Arc::clone(c),
            None => {
                let c = Arc::new(AtomicUsize::new(0));
                counts.insert(name.to_owned(), Arc::clone(&c));
                c
            }
        }
    }

    /// Every database seen.
    pub fn databases(&self) -> Vec<Arc<DatabaseCache>> {
        let dbs = self.databases.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = dbs.values().cloned().collect();
        v.sort_by_key(|d| d.id);
        v
    }

    /// `CACHE PURGE`: every result of every database goes.
    pub fn purge_all(&self) {
        for db in self.databases() {
            db.generations.invalidate_database();
            db.forget_plans();
        }
        self.store.clear();
    }

    /// `CACHE PURGE table`: results depending on tables named `name` (`schema.name` or just
    /// `name`) go; returns how many tables matched.
    pub fn purge_table(&self, name: &str) -> usize {
        let mut matched = 0;
        for db in self.databases() {
            let oids: Vec<u32> = db
                .generations
                .all()
                .iter()
                .filter(|t| {
                    let full = t.name.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    full == name || full.rsplit('.').next() == Some(name)
                })
                .map(|t| t.oid)
                .collect();
            matched += oids.len();
            db.generations.invalidate_tables(&oids);
        }
        matched
    }
}

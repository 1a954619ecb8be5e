//! The store: results kept as the exact backend bytes PostgreSQL sent, bounded by bytes with
//! quick_cache's frequency-aware (CLOCK-Pro) eviction. An entry's weight counts its key, its
//! payload and a fixed allowance for bookkeeping, so `cache_size` bounds what pgmemo holds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use quick_cache::sync::Cache as QuickCache;
use quick_cache::{Lifecycle, Weighter};
use wire::backend::put_row_description_with_formats;

use super::generation::Snapshot;
use super::stats::QueryStats;

/// Bytes counted per entry on top of its key and payload: the entry struct, the snapshot's
/// table list, the Arc headers and quick_cache's slot.
pub const ENTRY_OVERHEAD: usize = 160;

/// What a request asks to be told about its result (its Describe), which the same stored
/// result answers in each form: result formats are part of the key, and the stored
/// RowDescription is the portal's.
#[derive(Debug, Clone, Copy)]
pub enum Described<'a> {
    /// No Describe: the rows only.
    Nothing,
    /// Describe of the portal (or a simple Query): the RowDescription as stored.
    Portal,
    /// Describe of the statement the request's Parse made, with every parameter type given:
    /// a ParameterDescription of these types (the count and OIDs, as the Parse sent them),
    /// then the RowDescription with every format code zero, as PostgreSQL describes a
    /// statement.
    Statement(&'a [u8]),
}

/// One cached result.
#[derive(Debug)]
pub struct Entry {
    /// The response as PostgreSQL sent it, in one allocation: the RowDescription (when the
    /// request that filled the entry asked for it; result formats are part of the key), then
    /// the DataRows and the CommandComplete.
    payload: Box<[u8]>,
    /// Length of the RowDescription at the front of `payload` (0: none).
    description_len: usize,
    /// Generations of the tables the result was read from.
    pub snapshot: Snapshot,
    /// When the entry stops being served (TTL), if ever.
    pub expires: Option<Instant>,
    /// Statistics of the statement, bumped on every hit without a lookup.
    pub query: Arc<QueryStats>,
    /// Upstream time the result took, credited as time saved on each hit.
    pub miss_micros: u64,
}

impl Entry {
    /// An entry holding `payload`, whose first `description_len` bytes are a RowDescription.
    pub fn new(
        payload: Box<[u8]>,
        description_len: usize,
        snapshot: Snapshot,
        expires: Option<Instant>,
        query: Arc<QueryStats>,
        miss_micros: u64,
    ) -> Entry {
        Entry {
            description_len: description_len.min(payload.len()),
            payload,
            snapshot,
            expires,
            query,
            miss_micros,
        }
    }

    /// Whether the entry may be served now.
    #[inline]
    pub fn is_servable(&self, now: impl FnOnce() -> Instant) -> bool {
        self.snapshot.is_fresh() && self.expires.is_none_or(|at| now() < at)
    }

    /// Whether the entry can answer a request that describes its result as `described` asks
    /// (a Describe needs the RowDescription).
    #[inline]
    pub fn can_answer(&self, described: Described<'_>) -> bool {
        matches!(described, Described::Nothing) || self.description_len > 0
    }

    /// Appends the answer to a request this entry serves: `prefix` (what pgmemo answers for the
    /// request's Parse and Bind), what its Describe asks for (see [`Described`]), then the rows
    /// and CommandComplete. The caller adds ReadyForQuery. Returns `false` (with `out` holding
    /// part of an answer) when the stored description cannot be turned into a statement's,
    /// which a well-formed one always can.
    #[inline]
    pub fn answer_into(&self, out: &mut Vec<u8>, prefix: &[u8], described: Described<'_>) -> bool {
        let from = match described {
            Described::Nothing => self.description_len,
            Described::Portal => 0,
            Described::Statement(types) => return self.answer_statement_into(out, prefix, types),
        };
        // One copy of what is served (a hit's cost is mostly its copies and its syscall).
        let rest = &self.payload[from..];
        out.reserve(prefix.len() + rest.len() + 6);
        out.extend_from_slice(prefix);
        out.extend_from_slice(rest);
        true
    }

    /// [`Self::answer_into`] for a request that describes its statement.
    #[inline(never)]
    fn answer_statement_into(&self, out: &mut Vec<u8>, prefix: &[u8], types: &[u8]) -> bool {
        let (description, rows) = self.payload.split_at(self.description_len);
        out.reserve(prefix.len() + 5 + types.len() + self.payload.len() + 6);
        out.extend_from_slice(prefix);
        out.push(b't');
        out.extend_from_slice(&((4 + types.len()) as u32).to_be_bytes());
        out.extend_from_slice(types);
        if put_row_description_with_formats(description, |_| 0, out).is_none() {
            return false;
        }
        out.extend_from_slice(rows);
        true
    }

    /// Bytes of the result held (RowDescription included).
    pub fn payload_len(&self) -> usize {
        self.payload.len()
    }

    fn weight(&self, key_len: usize) -> u64 {
        (key_len + self.payload.len() + ENTRY_OVERHEAD + self.snapshot.tables().count() * 16) as u64
    }
}

#[derive(Clone)]
struct ByteWeighter;

impl Weighter<Box<[u8]>, Arc<Entry>> for ByteWeighter {
    fn weight(&self, key: &Box<[u8]>, val: &Arc<Entry>) -> u64 {
        val.weight(key.len())
    }
}

/// Counts evictions as quick_cache reports them.
#[derive(Clone, Default)]
struct EvictionCounter(Arc<AtomicU64>);

impl Lifecycle<Box<[u8]>, Arc<Entry>> for EvictionCounter {
    type RequestState = ();

    fn begin_request(&self) -> Self::RequestState {}

    fn on_evict(&self, _state: &mut (), _key: Box<[u8]>, _val: Arc<Entry>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

type Inner = QuickCache<
    Box<[u8]>,
    Arc<Entry>,
    ByteWeighter,
    quick_cache::DefaultHashBuilder,
    EvictionCounter,
>;

/// The bounded map from key bytes to entries.
pub struct Store {
    inner: Inner,
    evictions: Arc<AtomicU64>,
}

impl Store {
    /// A store holding at most `capacity` bytes.
    pub fn new(capacity: u64) -> Store {
        let evictions = EvictionCounter::default();
        let counter = Arc::clone(&evictions.0);
        let estimated_items = (capacity / 2048).clamp(64, 1 << 22) as usize;
        let options = quick_cache::OptionsBuilder::new()
            .estimated_items_capacity(estimated_items)
            .weight_capacity(capacity.max(1))
            .build()
            .expect("valid cache options");
        Store {
            inner: Inner::with_options(options, ByteWeighter, Default::default(), evictions),
            evictions: counter,
        }
    }

    /// The entry under `key`, servable or not.
    #[inline]
    pub fn get(&self, key: &[u8]) -> Option<Arc<Entry>> {
        self.inner.get(key)
    }

    /// Stores an entry (replacing any under the same key).
    pub fn insert(&self, key: Box<[u8]>, entry: Arc<Entry>) {
        self.inner.insert(key, entry);
    }

    /// Drops the entry under `key`.
    pub fn remove(&self, key: &[u8]) {
        self.inner.remove(key);
    }

    /// Drops every entry for which `keep` is false.
    pub fn retain(&self, keep: impl Fn(&Box<[u8]>, &Arc<Entry>) -> bool) {
        self.inner.retain(keep);
    }

    /// Drops everything.
    pub fn clear(&self) {
        self.inner.clear();
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Bytes held now, as weighed.
    pub fn bytes(&self) -> u64 {
        self.inner.weight()
    }

    /// The byte limit.
    pub fn capacity(&self) -> u64 {
        self.inner.capacity()
    }

    /// Entries evicted to stay under the limit so far.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }
}

//! Capture: a miss whose result may be stored is recorded as it streams to the client, and
//! stored when its response ends cleanly, unless a write committed meanwhile (the snapshot of
//! its tables' generations is no longer fresh: doctrine rule 4). Both pool modes capture the
//! same way; only how they see the response's frames differs.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::flight::FlightGuard;
use super::generation::Snapshot;
use super::plan::{ReadPlan, Refusal};
use super::stats::QueryStats;
use super::store::Entry;
use super::{Cache, DatabaseCache};
use crate::config::Config;

/// A miss whose result is to be stored.
pub struct Capture {
    pub key: Box<[u8]>,
    pub snapshot: Snapshot,
    pub ttl: Option<Duration>,
    pub query: Arc<QueryStats>,
    pub started: Instant,
    pub max_bytes: usize,
    /// Ends the single flight of `key` once the capture is stored or dropped.
    pub flight: Option<FlightGuard>,
}

impl Capture {
    /// The capture of a miss on `key` whose plan allows storing it (`read`): its tables'
    /// generations as they are now, and its TTL (a hint wins; otherwise the shortest of the
    /// per-table and global TTLs).
    pub fn for_read(
        key: &[u8],
        read: &ReadPlan,
        query: &Arc<QueryStats>,
        db: &DatabaseCache,
        config: &Config,
    ) -> Box<Capture> {
        let global = Some(config.cache_ttl.0).filter(|t| !t.is_zero());
        let table = config.table_ttl(read.tables.iter().map(|(_, name)| name.as_str()));
        let ttl = read.ttl.or(match (table, global) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        });
        Box::new(Capture {
            key: key.into(),
            snapshot: db.generations.snapshot_of(&read.generations),
            ttl,
            query: Arc::clone(query),
            started: Instant::now(),
            max_bytes: config.max_entry_size.0,
            flight: None,
        })
    }
}

/// A response being captured.
pub struct Filling {
    capture: Box<Capture>,
    description: Option<Bytes>,
    rows: Vec<u8>,
    completes: usize,
    ok: bool,
    error: bool,
}

impl Filling {
    /// Starts recording the response of `capture`'s request.
    pub fn new(capture: Box<Capture>) -> Filling {
        Filling {
            capture,
            description: None,
            rows: Vec::new(),
            completes: 0,
            ok: true,
            error: false,
        }
    }

    /// Records one message of the response (not its ReadyForQuery).
    pub fn add(&mut self, tag: u8, frame: &[u8]) {
        if tag == b'E' {
            self.error = true;
        }
        if !self.ok {
            return;
        }
        match tag {
            b'T' if self.description.is_none() => {
                self.description = Some(Bytes::copy_from_slice(frame));
            }
            b'D' => self.rows.extend_from_slice(frame),
            b'C' => {
                self.completes += 1;
                self.rows.extend_from_slice(frame);
            }
            // ParseComplete, BindComplete, NoData: the hit path writes its own.
            b'1' | b'2' | b'n' => {}
            // Errors, notices, notifications, parameter changes, copy, empty query: the
            // response is not what a later identical request would get.
            _ => self.abort(),
        }
        if self.rows.len() + self.description.as_ref().map_or(0, Bytes::len)
            > self.capture.max_bytes
        {
            self.abort();
        }
    }

    /// Gives up on storing this response (it streams on to the client untouched).
    pub fn abort(&mut self) {
        self.ok = false;
        self.rows = Vec::new();
    }

    /// Whether an incoming frame of `len` bytes still fits.
    pub fn fits(&self, len: usize) -> bool {
        self.ok && self.rows.len() + len <= self.capture.max_bytes
    }

    /// Whether the response is still being recorded.
    pub fn is_ok(&self) -> bool {
        self.ok
    }

    /// The response ended (its ReadyForQuery arrived; `error`: the server reported one):
    /// stores it if it is one clean result and no write committed since the request began.
    pub fn finish(self, error: bool, cache: &Cache, upstream_time: &crate::metrics::Histogram) {
        let micros = self.capture.started.elapsed().as_micros() as u64;
        self.capture.query.timed(micros);
        upstream_time.observe(micros);
        if !self.ok {
            cache.stats.refused(Refusal::NotStored);
            return;
        }
        if error || self.error || self.completes != 1 {
            return;
        }
        if !self.capture.snapshot.is_fresh() {
            cache.stats.stale_fills.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Filling {
            capture,
            description,
            rows,
            ..
        } = self;
        let Capture {
            key,
            snapshot,
            ttl,
            query,
            flight,
            ..
        } = *capture;
        for t in snapshot.tables() {
            t.fills.fetch_add(1, Ordering::Relaxed);
        }
        let entry = Entry {
            description,
            rows: Bytes::from(rows),
            snapshot,
            expires: ttl.map(|d| Instant::now() + d),
            query,
            miss_micros: micros,
        };
        cache.store.insert(key, Arc::new(entry));
        cache.stats.stores.fetch_add(1, Ordering::Relaxed);
        // Waiting sessions look again only now that the entry is there.
        drop(flight);
    }
}

//! Capture: a miss whose result may be stored is recorded as it streams to the client, and
//! stored when its response ends cleanly, unless a write committed meanwhile (the snapshot of
//! its tables' generations is no longer fresh: doctrine rule 4). Both pool modes capture the
//! same way; only how they see the response's frames differs.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wire::backend::put_row_description_with_formats;
use wire::frontend::peek::result_format;

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
    /// The request described the statement, not the portal: the result format codes its
    /// Bind chose (see `wire::frontend::peek::result_format`). The response then carries a
    /// ParameterDescription, which pgmemo answers itself, and the statement's RowDescription
    /// (format codes zero), stored as the portal's would be, with these formats.
    pub statement_formats: Option<Box<[u8]>>,
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
            statement_formats: None,
        })
    }
}

/// A scratch buffer kept for the next capture is dropped instead when a large result grew it
/// beyond this, so an idle session does not hold on to it.
const KEEP_SCRATCH: usize = 64 * 1024;

/// A response being captured, into a buffer the pump lends (and gets back from
/// [`Filling::finish`]), so a capture neither allocates nor grows a buffer of its own: the
/// only copy made is the stored entry's, of exactly its size.
pub struct Filling {
    capture: Box<Capture>,
    /// The response so far: the RowDescription, if any, then DataRows and CommandComplete.
    bytes: Vec<u8>,
    description_len: usize,
    completes: usize,
    /// Why the response will not be stored, once that is known.
    refused: Option<Refusal>,
    error: bool,
}

impl Filling {
    /// Starts recording the response of `capture`'s request into `scratch` (cleared).
    pub fn new(capture: Box<Capture>, mut scratch: Vec<u8>) -> Filling {
        scratch.clear();
        Filling {
            capture,
            bytes: scratch,
            description_len: 0,
            completes: 0,
            refused: None,
            error: false,
        }
    }

    /// Records one message of the response (not its ReadyForQuery).
    pub fn add(&mut self, tag: u8, frame: &[u8]) {
        if tag == b'E' {
            self.error = true;
        }
        if self.refused.is_some() {
            return;
        }
        match tag {
            // One RowDescription, ahead of the rows.
            b'T' if self.bytes.is_empty() => match &self.capture.statement_formats {
                None => {
                    self.bytes.extend_from_slice(frame);
                    self.description_len = frame.len();
                }
                Some(codes) => {
                    let portal = |i| result_format(codes, i);
                    if put_row_description_with_formats(frame, portal, &mut self.bytes).is_none() {
                        self.abort(Refusal::NotStored);
                        return;
                    }
                    self.description_len = self.bytes.len();
                }
            },
            // A described statement's parameter types: the hit path writes them.
            b't' if self.capture.statement_formats.is_some() => {}
            b'D' => self.bytes.extend_from_slice(frame),
            b'C' => {
                self.completes += 1;
                self.bytes.extend_from_slice(frame);
            }
            // ParseComplete, BindComplete, NoData: the hit path writes its own.
            b'1' | b'2' | b'n' => {}
            // Errors, notices, notifications, parameter changes, copy, empty query, a
            // suspended portal: the response is not what a later identical request would get.
            _ => self.abort(Refusal::NotStored),
        }
        if self.bytes.len() > self.capture.max_bytes {
            self.abort(Refusal::TooLarge);
        }
    }

    /// Gives up on storing this response (it streams on to the client untouched), for
    /// `reason` (counted when the response ends; the first reason is the one counted).
    pub fn abort(&mut self, reason: Refusal) {
        self.refused.get_or_insert(reason);
        self.bytes.clear();
        if self.bytes.capacity() > KEEP_SCRATCH {
            self.bytes = Vec::new();
        }
    }

    /// Whether an incoming frame of `len` bytes still fits.
    pub fn fits(&self, len: usize) -> bool {
        self.refused.is_none() && self.bytes.len() + len <= self.capture.max_bytes
    }

    /// Whether the response is still being recorded.
    pub fn is_ok(&self) -> bool {
        self.refused.is_none()
    }

    /// The response ended (its ReadyForQuery arrived; `error`: the server reported one):
    /// stores it if it is one clean result and no write committed since the request began.
    /// Returns the scratch buffer, emptied, for the next capture.
    pub fn finish(
        self,
        error: bool,
        cache: &Cache,
        upstream_time: &crate::metrics::Histogram,
    ) -> Vec<u8> {
        let micros = self.capture.started.elapsed().as_micros() as u64;
        self.capture.query.timed(micros);
        upstream_time.observe(micros);
        let store = if let Some(reason) = self.refused {
            cache.stats.refused(reason);
            self.capture.query.note_refusal(reason);
            false
        } else if error || self.error || self.completes != 1 {
            false
        } else if !self.capture.snapshot.is_fresh() {
            cache.stats.stale_fills.fetch_add(1, Ordering::Relaxed);
            false
        } else {
            true
        };
        let Filling {
            capture,
            bytes: mut scratch,
            description_len,
            ..
        } = self;
        if store {
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
            let entry = Entry::new(
                Box::from(&scratch[..]),
                description_len,
                snapshot,
                ttl.map(|d| Instant::now() + d),
                query,
                micros,
            );
            cache.store.insert(key, Arc::new(entry));
            cache.stats.stores.fetch_add(1, Ordering::Relaxed);
            // Waiting sessions look again only now that the entry is there.
            drop(flight);
        }
        scratch.clear();
        if scratch.capacity() > KEEP_SCRATCH {
            scratch = Vec::new();
        }
        scratch
    }
}

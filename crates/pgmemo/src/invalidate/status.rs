//! What one replication feed reports about itself: written by its task, read by
//! `SHOW REPLICATION` and the metrics endpoint without locking anything the task holds for long.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::cache::feed::FeedState;
use crate::cache::DatabaseCache;

/// The status of the feed of one database. The gate (state, applied LSN) lives in the
/// database's [`crate::cache::feed::FeedGate`]; the rest is here.
pub struct FeedStatus {
    /// The database followed (its gate is the feed's state).
    pub db: Arc<DatabaseCache>,
    /// The publication subscribed to.
    pub publication: String,
    slot: Mutex<Option<String>>,
    last_error: Mutex<Option<String>>,
    received_lsn: AtomicU64,
    server_wal_end: AtomicU64,
    /// Unix time (µs) when the last message arrived; 0 before the first.
    last_message_micros: AtomicI64,
    /// Receipt time minus the server's send time of the last message, in ms.
    lag_ms: AtomicI64,
    reconnects: AtomicU64,
    transactions: AtomicU64,
}

impl FeedStatus {
    /// A feed that has not connected yet.
    pub fn new(db: Arc<DatabaseCache>, publication: String) -> FeedStatus {
        FeedStatus {
            db,
            publication,
            slot: Mutex::new(None),
            last_error: Mutex::new(None),
            received_lsn: AtomicU64::new(0),
            server_wal_end: AtomicU64::new(0),
            last_message_micros: AtomicI64::new(0),
            lag_ms: AtomicI64::new(0),
            reconnects: AtomicU64::new(0),
            transactions: AtomicU64::new(0),
        }
    }

    /// Whether the feed's stream is live (the cache of its database serves).
    pub fn state(&self) -> FeedState {
        self.db.feed.state()
    }

    /// The temporary slot of the current (or last) stream.
    pub fn slot(&self) -> Option<String> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(super) fn set_slot(&self, slot: Option<String>) {
        *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = slot;
    }

    /// Why the last stream ended or could not start, for the operator.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(super) fn set_error(&self, error: String) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
    }

    /// Furthest WAL position received.
    pub fn received_lsn(&self) -> u64 {
        self.received_lsn.load(Ordering::Relaxed)
    }

    /// The server's end of WAL, from its last keepalive or message.
    pub fn server_wal_end(&self) -> u64 {
        self.server_wal_end.load(Ordering::Relaxed)
    }

    /// Bytes of WAL the server has that the feed has not applied: 0 when caught up.
    pub fn lag_bytes(&self) -> u64 {
        self.server_wal_end()
            .saturating_sub(self.db.feed.applied_lsn())
    }

    /// Milliseconds between the server sending the last message and pgmemo receiving it (clock
    /// skew between the hosts included).
    pub fn lag_ms(&self) -> i64 {
        self.lag_ms.load(Ordering::Relaxed)
    }

    /// When the last message arrived, if any did.
    pub fn last_message(&self) -> Option<SystemTime> {
        let micros = self.last_message_micros.load(Ordering::Relaxed);
        (micros > 0).then(|| UNIX_EPOCH + std::time::Duration::from_micros(micros as u64))
    }

    /// Streams established after the first one.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// Committed transactions received.
    pub fn transactions(&self) -> u64 {
        self.transactions.load(Ordering::Relaxed)
    }

    pub(super) fn count_reconnect(&self) {
        self.reconnects.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn count_transaction(&self) {
        self.transactions.fetch_add(1, Ordering::Relaxed);
    }

    /// Notes a message from the server: its WAL positions and its send time (µs since 2000).
    pub(super) fn received(&self, lsn: u64, wal_end: u64, send_time: i64) {
        self.received_lsn.fetch_max(lsn, Ordering::Relaxed);
        self.server_wal_end.fetch_max(wal_end, Ordering::Relaxed);
        let now = SystemTime::now();
        let now_micros = now
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        self.last_message_micros
            .store(now_micros, Ordering::Relaxed);
        if let Some(sent) = wire::replication::pg_time_to_system(send_time) {
            let lag = match now.duration_since(sent) {
                Ok(d) => d.as_millis() as i64,
                Err(e) => -(e.duration().as_millis() as i64),
            };
            self.lag_ms.store(lag, Ordering::Relaxed);
        }
    }

    /// A new stream starts at `lsn`: positions of the old one no longer apply.
    pub(super) fn restart_at(&self, lsn: u64) {
        self.received_lsn.store(lsn, Ordering::Relaxed);
        self.server_wal_end.store(lsn, Ordering::Relaxed);
    }
}

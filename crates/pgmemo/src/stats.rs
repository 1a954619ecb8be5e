//! Process-wide counters (atomics, never locks), read by the admin console and the metrics
//! endpoint.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters pgmemo keeps about its clients and servers.
#[derive(Debug, Default)]
pub struct Stats {
    pub clients_accepted: AtomicU64,
    pub clients_rejected: AtomicU64,
    pub login_failures: AtomicU64,
    pub server_connects: AtomicU64,
    pub server_connect_failures: AtomicU64,
    pub servers_closed_dirty: AtomicU64,
    pub pool_wait_timeouts: AtomicU64,
    pub cancel_requests: AtomicU64,
    pub protocol_errors: AtomicU64,
    /// Transaction pooling: uses of a statement the attached server had prepared already.
    pub prepared_hits: AtomicU64,
    /// Transaction pooling: statements pgmemo had to prepare on the attached server first.
    pub prepared_misses: AtomicU64,
    /// Transaction pooling: executions of a client's unnamed statement that bound a statement
    /// pgmemo had promoted on the attached server (`max_promoted_statements`).
    pub promoted_uses: AtomicU64,
    /// Transaction pooling: unnamed statements pgmemo prepared under a name of its own.
    pub promoted_prepares: AtomicU64,
}

impl Stats {
    /// Adds one to a counter.
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

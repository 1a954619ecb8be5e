//! `SHOW STATS`: pgmemo's counters, one row per counter (name, value), so new counters never
//! change the shape scripts read.

use std::sync::atomic::Ordering;

use super::table::Table;
use crate::shared::Shared;

/// Builds the table.
pub fn show_stats(shared: &Shared) -> Table {
    let s = &shared.stats;
    let mut t = Table::new(&["name", "value"]);
    for (name, counter) in [
        ("clients_accepted", &s.clients_accepted),
        ("clients_rejected", &s.clients_rejected),
        ("login_failures", &s.login_failures),
        ("server_connects", &s.server_connects),
        ("server_connect_failures", &s.server_connect_failures),
        ("servers_closed_dirty", &s.servers_closed_dirty),
        ("pool_wait_timeouts", &s.pool_wait_timeouts),
        ("cancel_requests", &s.cancel_requests),
        ("protocol_errors", &s.protocol_errors),
        ("prepared_hits", &s.prepared_hits),
        ("prepared_misses", &s.prepared_misses),
        ("promoted_uses", &s.promoted_uses),
        ("promoted_prepares", &s.promoted_prepares),
    ] {
        t.row(vec![
            Some(name.to_owned()),
            Some(counter.load(Ordering::Relaxed).to_string()),
        ]);
    }
    t.row(vec![
        Some("clients_connected".to_owned()),
        Some(shared.client_count().to_string()),
    ]);
    t
}

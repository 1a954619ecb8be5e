//! `SHOW REPLICATION`: one row per database followed by the replication feed (see
//! `crate::invalidate`): whether its cache may serve (state), the temporary slot, how far the
//! stream has been received and applied, and how far behind the server it is.

use std::time::SystemTime;

use wire::replication::Lsn;

use super::table::Table;
use crate::shared::Shared;

/// Builds the table; empty when no feed runs (`invalidation = proxy | ttl`, or `auto` without a
/// usable upstream).
pub fn show_replication(shared: &Shared) -> Table {
    let mut t = Table::new(&[
        "database",
        "state",
        "slot",
        "publication",
        "received_lsn",
        "applied_lsn",
        "server_wal_end",
        "lag_bytes",
        "lag_ms",
        "last_message_age_ms",
        "transactions",
        "reconnects",
        "last_error",
    ]);
    let lsn = |v: u64| Some(Lsn(v).to_string());
    for feed in shared.feeds.all() {
        let age = feed.last_message().map(|at| {
            SystemTime::now()
                .duration_since(at)
                .map(|d| d.as_millis())
                .unwrap_or(0)
                .to_string()
        });
        t.row(vec![
            Some(feed.db.name.clone()),
            Some(feed.state().name().to_owned()),
            feed.slot(),
            Some(feed.publication.clone()),
            lsn(feed.received_lsn()),
            lsn(feed.db.feed.applied_lsn()),
            lsn(feed.server_wal_end()),
            Some(feed.lag_bytes().to_string()),
            Some(feed.lag_ms().to_string()),
            age,
            Some(feed.transactions().to_string()),
            Some(feed.reconnects().to_string()),
            feed.last_error(),
        ]);
    }
    t
}

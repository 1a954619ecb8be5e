//! `SHOW CLIENTS`: the clients logged in now.

use std::time::{SystemTime, UNIX_EPOCH};

use super::table::Table;
use crate::shared::Shared;

/// Builds the table.
pub fn show_clients(shared: &Shared) -> Table {
    let mut t = Table::new(&[
        "address",
        "user",
        "database",
        "tls",
        "admin",
        "connected_seconds",
        "connect_time",
    ]);
    let now = SystemTime::now();
    for c in shared.clients.snapshot() {
        let age = now.duration_since(c.connected_at).unwrap_or_default();
        let since_epoch = c
            .connected_at
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        t.row(vec![
            Some(c.peer.to_string()),
            Some(c.user),
            Some(c.database),
            Some(c.tls.to_string()),
            Some(c.admin.to_string()),
            Some(age.as_secs().to_string()),
            Some(since_epoch.to_string()),
        ]);
    }
    t
}

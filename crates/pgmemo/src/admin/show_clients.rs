//! `SHOW CLIENTS`: the clients logged in now.

use std::time::SystemTime;

use super::table::{connected_columns, Table};
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
        let [connected_seconds, connect_time] = connected_columns(c.connected_at, now);
        t.row(vec![
            Some(c.peer.to_string()),
            Some(c.user),
            Some(c.database),
            Some(c.tls.to_string()),
            Some(c.admin.to_string()),
            connected_seconds,
            connect_time,
        ]);
    }
    t
}

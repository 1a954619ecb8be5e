//! `SHOW SERVERS`: the server connections pgmemo holds now, one row each, with what each is
//! doing and, in transaction pooling, its prepared statements.

use std::time::SystemTime;

use super::table::{connected_columns, Table};
use crate::shared::Shared;

/// Builds the table.
pub fn show_servers(shared: &Shared) -> Table {
    let mut t = Table::new(&[
        "database",
        "user",
        "server",
        "pid",
        "state",
        "tls",
        "state_seconds",
        "connected_seconds",
        "connect_time",
        "prepared_statements",
        "prepared_hits",
        "prepared_misses",
    ]);
    let now = SystemTime::now();
    for s in shared.pools.servers.snapshot() {
        let [connected_seconds, connect_time] = connected_columns(s.connected_at, now);
        t.row(vec![
            Some(s.pool.alias),
            Some(s.pool.user),
            Some(format!("{}:{}", s.pool.host, s.pool.port)),
            s.pid.map(|p| p.to_string()),
            Some(s.state.name().to_owned()),
            Some(s.tls.to_string()),
            Some((s.state_millis / 1000).to_string()),
            connected_seconds,
            connect_time,
            Some(s.statements.to_string()),
            Some(s.prepared_hits.to_string()),
            Some(s.prepared_misses.to_string()),
        ]);
    }
    t
}

//! `SHOW POOLS`: one row per (server, database, user) pool with its size and how its
//! connections are used right now.

use super::table::Table;
use crate::shared::Shared;

/// Builds the table.
pub fn show_pools(shared: &Shared) -> Table {
    let mut t = Table::new(&[
        "database",
        "user",
        "server",
        "pool_size",
        "clients",
        "server_total",
        "server_idle",
        "clients_waiting",
    ]);
    let mut pools = shared.pools.all();
    pools.sort_by(|a, b| (&a.key().alias, &a.key().user).cmp(&(&b.key().alias, &b.key().user)));
    for pool in pools {
        let key = pool.key();
        let (idle, total) = pool.counts();
        t.row(vec![
            Some(key.alias.clone()),
            Some(key.user.clone()),
            Some(format!("{}:{}", key.host, key.port)),
            Some(pool.size().to_string()),
            Some(pool.leases().to_string()),
            Some(total.to_string()),
            Some(idle.to_string()),
            Some(pool.waiting().to_string()),
        ]);
    }
    t
}

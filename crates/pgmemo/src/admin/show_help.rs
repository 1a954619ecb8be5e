//! `SHOW VERSION` and `SHOW HELP`.

use super::table::Table;

/// pgmemo's version.
pub fn show_version() -> Table {
    let mut t = Table::new(&["version"]);
    t.row(vec![Some(format!("pgmemo {}", env!("CARGO_PKG_VERSION")))]);
    t
}

/// The commands the console knows.
pub fn show_help() -> Table {
    let mut t = Table::new(&["command", "description"]);
    for (c, d) in [
        ("SHOW POOLS", "server connection pools and their use"),
        ("SHOW CLIENTS", "clients logged in now"),
        (
            "SHOW SERVERS",
            "server connections: state, pid, prepared statements and their hits/misses",
        ),
        ("SHOW STATS", "counters since start"),
        ("SHOW CONFIG", "settings in force (passwords masked)"),
        ("SHOW VERSION", "pgmemo's version"),
        (
            "SHOW CACHE",
            "result cache size, hits, misses, invalidations, refusals by reason",
        ),
        (
            "SHOW QUERIES",
            "per statement: calls, hits, misses, mean miss time, time saved",
        ),
        ("SHOW TABLES", "per table: results stored and invalidations"),
        (
            "SHOW REPLICATION",
            "per database: invalidation feed state, slot, LSNs, lag, reconnects",
        ),
        (
            "CACHE PURGE [table]",
            "drop every cached result, or those reading a table",
        ),
        ("RELOAD", "reload the configuration, as SIGHUP does"),
    ] {
        t.row(vec![Some(c.to_owned()), Some(d.to_owned())]);
    }
    t
}

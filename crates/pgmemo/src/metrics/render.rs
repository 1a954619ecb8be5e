//! What the metrics endpoint exposes: the counters the admin console shows (`SHOW STATS`,
//! `SHOW POOLS`, `SHOW CACHE`) plus the upstream time histogram, read from [`Shared`] without
//! taking any lock a client session holds for long.

use std::sync::atomic::{AtomicU64, Ordering};

use super::exposition::{seconds, Exposition, Kind};
use crate::cache::plan::Refusal;
use crate::shared::Shared;

/// The whole page for one scrape.
pub fn render(shared: &Shared) -> String {
    let mut page = Exposition::default();
    clients_and_servers(&mut page, shared);
    pools(&mut page, shared);
    cache(&mut page, shared);
    replication(&mut page, shared);
    page.histogram_seconds(
        "pgmemo_upstream_query_seconds",
        "Time the upstream server took to answer statements pgmemo could not serve from \
         the cache (cache misses), from request to ReadyForQuery.",
        &shared.upstream_time.snapshot(),
    );
    page.finish()
}

fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// `SHOW STATS`: `pgmemo_<name>_total` per counter, and the clients connected now.
fn clients_and_servers(page: &mut Exposition, shared: &Shared) {
    let s = &shared.stats;
    for (name, counter, help) in [
        (
            "clients_accepted",
            &s.clients_accepted,
            "Client connections accepted.",
        ),
        (
            "clients_rejected",
            &s.clients_rejected,
            "Client connections refused because max_client_conn was reached.",
        ),
        (
            "login_failures",
            &s.login_failures,
            "Client logins that failed.",
        ),
        (
            "server_connects",
            &s.server_connects,
            "Server connections opened.",
        ),
        (
            "server_connect_failures",
            &s.server_connect_failures,
            "Server connections that could not be opened.",
        ),
        (
            "servers_closed_dirty",
            &s.servers_closed_dirty,
            "Server connections closed instead of pooled: their client left mid-transaction or mid-query.",
        ),
        (
            "pool_wait_timeouts",
            &s.pool_wait_timeouts,
            "Clients that gave up waiting for a server connection (query_wait_timeout).",
        ),
        (
            "cancel_requests",
            &s.cancel_requests,
            "Cancel requests received.",
        ),
        (
            "protocol_errors",
            &s.protocol_errors,
            "Protocol violations by clients.",
        ),
        (
            "prepared_hits",
            &s.prepared_hits,
            "Transaction pooling: statement uses the attached server had prepared already.",
        ),
        (
            "prepared_misses",
            &s.prepared_misses,
            "Transaction pooling: statements prepared on the attached server first.",
        ),
        (
            "promoted_uses",
            &s.promoted_uses,
            "Transaction pooling: unnamed-statement executions bound from a promoted statement.",
        ),
        (
            "promoted_prepares",
            &s.promoted_prepares,
            "Transaction pooling: unnamed statements prepared under a name of pgmemo's.",
        ),
    ] {
        page.single(
            &format!("pgmemo_{name}_total"),
            Kind::Counter,
            help,
            load(counter),
        );
    }
    page.single(
        "pgmemo_clients_connected",
        Kind::Gauge,
        "Client connections open now.",
        shared.client_count(),
    );
}

/// `SHOW POOLS`: one gauge family per column, one sample per pool. `server` is a label too:
/// `[databases]` entries can send the same (database, user) to different servers, and a
/// series must stay unique.
fn pools(page: &mut Exposition, shared: &Shared) {
    let mut pools = shared.pools.all();
    pools.sort_by(|a, b| {
        let key = |p: &crate::pool::Pool| {
            let k = p.key();
            (k.alias.clone(), k.user.clone(), k.host.clone(), k.port)
        };
        key(a).cmp(&key(b))
    });
    let rows: Vec<_> = pools
        .iter()
        .map(|pool| {
            let key = pool.key();
            let (idle, total) = pool.counts();
            let server = format!("{}:{}", key.host, key.port);
            let figures = [pool.size(), pool.leases(), total, idle, pool.waiting()];
            (key, server, figures)
        })
        .collect();
    let families = [
        (
            "pgmemo_pool_size",
            "Configured server connections per pool.",
        ),
        (
            "pgmemo_pool_clients",
            "Clients holding a place in the pool now.",
        ),
        (
            "pgmemo_pool_server_connections",
            "Server connections of the pool, busy or idle.",
        ),
        (
            "pgmemo_pool_server_idle_connections",
            "Idle server connections of the pool.",
        ),
        (
            "pgmemo_pool_clients_waiting",
            "Clients queued for a place in the pool now.",
        ),
    ];
    for (column, (name, help)) in families.into_iter().enumerate() {
        page.family(name, Kind::Gauge, help);
        for (key, server, figures) in &rows {
            let labels = [
                ("database", key.alias.as_str()),
                ("user", key.user.as_str()),
                ("server", server.as_str()),
            ];
            page.sample(name, &labels, figures[column]);
        }
    }
}

/// `SHOW CACHE`: totals, size, time saved and refusals by reason.
fn cache(page: &mut Exposition, shared: &Shared) {
    let c = &shared.cache;
    let s = &c.stats;
    page.single(
        "pgmemo_cache_enabled",
        Kind::Gauge,
        "1 when the result cache is on (the cache setting), else 0.",
        u8::from(shared.config().cache.is_on()),
    );
    for (name, value, help) in [
        ("hits", s.hits(), "Requests answered from the cache."),
        (
            "misses",
            s.misses(),
            "Cacheable requests sent upstream to fill the cache (no servable entry).",
        ),
        ("stores", load(&s.stores), "Results stored in the cache."),
        (
            "stale_fills",
            load(&s.stale_fills),
            "Results not stored because a write committed while they were read.",
        ),
        (
            "invalidations",
            load(&s.invalidations),
            "Table invalidations applied (one per table per write).",
        ),
        (
            "database_invalidations",
            load(&s.database_invalidations),
            "Whole-database invalidations (unattributed writes, DDL, purges).",
        ),
        (
            "catalog_lookups",
            load(&s.catalog_lookups),
            "Catalog lookups run to analyse a statement shape.",
        ),
        (
            "context_reads",
            load(&s.context_reads),
            "Session settings read again after something may have changed them.",
        ),
        (
            "admission_skips",
            load(&s.admission_skips),
            "Cacheable misses not stored: a cheap statement's key that had not missed recently.",
        ),
        (
            "flight_waits",
            load(&s.flight_waits),
            "Misses that waited for another session's identical query instead of running it.",
        ),
        (
            "evictions",
            c.store.evictions(),
            "Entries evicted to stay within cache_size.",
        ),
    ] {
        page.single(
            &format!("pgmemo_cache_{name}_total"),
            Kind::Counter,
            help,
            value,
        );
    }
    for (name, value, help) in [
        ("entries", c.store.len() as u64, "Entries in the cache now."),
        (
            "bytes",
            c.store.bytes(),
            "Bytes the cache holds now (keys, results, bookkeeping).",
        ),
        (
            "limit_bytes",
            c.store.capacity(),
            "Most bytes the cache may hold (cache_size).",
        ),
        (
            "flight_waiting",
            s.flight_waiting.load(Ordering::Relaxed),
            "Sessions waiting now for another session's identical query (single flight).",
        ),
    ] {
        page.single(&format!("pgmemo_cache_{name}"), Kind::Gauge, help, value);
    }
    page.single(
        "pgmemo_cache_saved_seconds_total",
        Kind::Counter,
        "Upstream time saved by hits, estimated from the time the stored result took.",
        seconds(s.saved_micros()),
    );
    page.family(
        "pgmemo_cache_refusals_total",
        Kind::Counter,
        "Requests not cached, by reason.",
    );
    // Every reason, zeros included, so each series exists from the first scrape on.
    for &reason in Refusal::ALL {
        page.sample(
            "pgmemo_cache_refusals_total",
            &[("reason", reason.name())],
            s.refusal_count(reason),
        );
    }
}

/// `SHOW REPLICATION`: per followed database, the feed's state, lag and reconnects. The
/// families are written even without feeds, so dashboards find them.
fn replication(page: &mut Exposition, shared: &Shared) {
    let feeds = shared.feeds.all();
    page.family(
        "pgmemo_replication_feed_live",
        Kind::Gauge,
        "1 while the database's replication feed is live (its cache may serve), 0 while it is down.",
    );
    for f in &feeds {
        let live = f.state() == crate::cache::feed::FeedState::Live;
        page.sample(
            "pgmemo_replication_feed_live",
            &[("database", &f.db.name)],
            u8::from(live),
        );
    }
    page.family(
        "pgmemo_replication_lag_bytes",
        Kind::Gauge,
        "WAL bytes between the server's last reported end of WAL and what the feed has applied.",
    );
    for f in &feeds {
        page.sample(
            "pgmemo_replication_lag_bytes",
            &[("database", &f.db.name)],
            f.lag_bytes(),
        );
    }
    page.histogram_seconds(
        "pgmemo_replication_staleness_seconds",
        "Time from a commit on the upstream to pgmemo no longer serving the entries it \
         invalidated (upstream commit time to local clock: clock skew included).",
        &shared.feeds.staleness.snapshot(),
    );
    page.family(
        "pgmemo_replication_reconnects_total",
        Kind::Counter,
        "Times the replication feed's stream was lost or could not be opened.",
    );
    for f in &feeds {
        page.sample(
            "pgmemo_replication_reconnects_total",
            &[("database", &f.db.name)],
            f.reconnects(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::pool::PoolKey;
    use crate::stats::Stats;

    #[test]
    fn page_names_every_family_and_escapes_pool_labels() {
        let shared = Shared::new(Config::default()).unwrap();
        let key = PoolKey {
            host: "db".into(),
            port: 5433,
            database: "real".into(),
            user: "alice".into(),
            alias: "we\"ird\\db\nname".into(),
        };
        shared.pools.get(&key, 7, 0);
        Stats::bump(&shared.stats.clients_accepted);
        for micros in [0, 0, 1_250_000] {
            shared.cache.stats.count_hit(micros);
        }
        shared.cache.stats.refused(Refusal::ALL[0]);
        shared.upstream_time.observe(3_000);
        let page = render(&shared);
        let labels = "{database=\"we\\\"ird\\\\db\\nname\",user=\"alice\",server=\"db:5433\"}";
        let reason = Refusal::ALL[0].name();
        for line in [
            "# TYPE pgmemo_clients_accepted_total counter\npgmemo_clients_accepted_total 1\n"
                .to_owned(),
            "# TYPE pgmemo_cache_hits_total counter\npgmemo_cache_hits_total 3\n".to_owned(),
            "pgmemo_cache_saved_seconds_total 1.25\n".to_owned(),
            "pgmemo_cache_enabled 1\n".to_owned(),
            "# TYPE pgmemo_cache_flight_waiting gauge\npgmemo_cache_flight_waiting 0\n".to_owned(),
            format!("pgmemo_pool_size{labels} 7\n"),
            format!("pgmemo_pool_server_idle_connections{labels} 0\n"),
            format!("pgmemo_pool_clients_waiting{labels} 0\n"),
            format!("pgmemo_cache_refusals_total{{reason=\"{reason}\"}} 1\n"),
            "pgmemo_upstream_query_seconds_bucket{le=\"0.0025\"} 0\n".to_owned(),
            "pgmemo_upstream_query_seconds_bucket{le=\"0.005\"} 1\n".to_owned(),
            "pgmemo_upstream_query_seconds_sum 0.003\n".to_owned(),
        ] {
            assert!(page.contains(&line), "missing {line:?} in:\n{page}");
        }
        let families = page.lines().filter(|l| l.starts_with("# TYPE ")).count();
        let helps = page.lines().filter(|l| l.starts_with("# HELP ")).count();
        assert_eq!(families, helps);
        assert_eq!(families, 14 + 4 + 1 + 11 + 4 + 2 + 5 + 1, "{page}");
        assert_eq!(
            page.matches("pgmemo_cache_refusals_total{").count(),
            Refusal::ALL.len(),
            "every reason, zeros included"
        );
    }
}

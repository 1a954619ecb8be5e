//! Per-table generation counters: the mechanism behind invalidation and behind doctrine rule 4
//! (no fill race). A miss snapshots the generations of every table its result depends on
//! *before* the query goes upstream; a write bumps them when its commit is acknowledged. An
//! entry whose snapshot no longer matches is stale: it is not stored, and a hit on it is a miss.
//! Invalidation is therefore O(tables written), whatever the number of entries, and a hit checks
//! a handful of atomics without any map lookup or lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::hash::Map;

/// The generation of one relation (by OID) of one database.
#[derive(Debug)]
pub struct TableGeneration {
    /// The relation's OID.
    pub oid: u32,
    /// `schema.name` as last resolved, for `SHOW TABLES`.
    pub name: Mutex<String>,
    generation: AtomicU64,
    /// How many times writes invalidated this table.
    pub invalidations: AtomicU64,
    /// Results stored that depend on this table.
    pub fills: AtomicU64,
}

impl TableGeneration {
    fn current(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

/// All generations of one database, plus the database-wide one that writes pgmemo cannot
/// attribute (DDL, DO, CALL, volatile functions) bump.
#[derive(Debug, Default)]
pub struct Generations {
    database: Arc<AtomicU64>,
    tables: Mutex<Map<u32, Arc<TableGeneration>>>,
}

/// A snapshot of the generations a result depends on, taken before its query went upstream.
#[derive(Debug, Clone)]
pub struct Snapshot {
    database: Arc<AtomicU64>,
    database_seen: u64,
    tables: Box<[(Arc<TableGeneration>, u64)]>,
}

impl Snapshot {
    /// No write to any of the tables (or to the database as a whole) since the snapshot.
    #[inline]
    pub fn is_fresh(&self) -> bool {
        self.database.load(Ordering::Acquire) == self.database_seen
            && self.tables.iter().all(|(t, seen)| t.current() == *seen)
    }

    /// The tables this snapshot covers.
    pub fn tables(&self) -> impl Iterator<Item = &Arc<TableGeneration>> {
        self.tables.iter().map(|(t, _)| t)
    }
}

impl Generations {
    /// The generation record of `oid`, created on first use.
    pub fn table(&self, oid: u32, name: &str) -> Arc<TableGeneration> {
        let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        let t = tables.entry(oid).or_insert_with(|| {
            Arc::new(TableGeneration {
                oid,
                name: Mutex::new(name.to_owned()),
                generation: AtomicU64::new(0),
                invalidations: AtomicU64::new(0),
                fills: AtomicU64::new(0),
            })
        });
        Arc::clone(t)
    }

    /// Snapshots the generations of `tables` (OID, display name).
    pub fn snapshot(&self, tables: &[(u32, String)]) -> Snapshot {
        let database_seen = self.database.load(Ordering::Acquire);
        let tables = tables
            .iter()
            .map(|(oid, name)| {
                let t = self.table(*oid, name);
                let seen = t.current();
                (t, seen)
            })
            .collect();
        Snapshot {
            database: Arc::clone(&self.database),
            database_seen,
            tables,
        }
    }

    /// Fills a plan's generation records, so misses of the plan snapshot without a lookup.
    pub fn attach(&self, plan: &mut super::plan::ReadPlan) {
        plan.generations = plan
            .tables
            .iter()
            .map(|(oid, name)| self.table(*oid, name))
            .collect();
    }

    /// Snapshots generation records attached earlier.
    pub fn snapshot_of(&self, tables: &[Arc<TableGeneration>]) -> Snapshot {
        let database_seen = self.database.load(Ordering::Acquire);
        Snapshot {
            database: Arc::clone(&self.database),
            database_seen,
            tables: tables
                .iter()
                .map(|t| (Arc::clone(t), t.current()))
                .collect(),
        }
    }

    /// Makes every result depending on one of `oids` stale.
    pub fn invalidate_tables(&self, oids: &[u32]) {
        let tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        for oid in oids {
            if let Some(t) = tables.get(oid) {
                t.generation.fetch_add(1, Ordering::AcqRel);
                t.invalidations.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Makes every result of the database stale.
    pub fn invalidate_database(&self) {
        self.database.fetch_add(1, Ordering::AcqRel);
    }

    /// Every table pgmemo has seen, for `SHOW TABLES`.
    pub fn all(&self) -> Vec<Arc<TableGeneration>> {
        let tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = tables.values().cloned().collect();
        v.sort_by_key(|t| t.oid);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_after_the_snapshot_makes_it_stale() {
        let g = Generations::default();
        let snap = g.snapshot(&[(10, "a".into()), (11, "b".into())]);
        assert!(snap.is_fresh());
        g.invalidate_tables(&[12]);
        assert!(snap.is_fresh(), "other tables do not matter");
        g.invalidate_tables(&[11]);
        assert!(!snap.is_fresh());
        let later = g.snapshot(&[(11, "b".into())]);
        assert!(later.is_fresh(), "a read after the write is fresh");
        g.invalidate_database();
        assert!(!later.is_fresh());
    }
}

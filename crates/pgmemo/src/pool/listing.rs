//! The server connections that exist right now, for `SHOW SERVERS`: each pooled connection is
//! listed from its login until it is dropped, with what it is doing (lent to a client, idle
//! in its pool, being reset) and its prepared-statement counters.
//!
//! Listing and unlisting take a short lock, once per connection. What changes per
//! transaction (the state, the counters) is written to the connection's own atomics, which
//! only the admin console reads: no lock and no line shared with other connections.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use super::{PoolKey, Tick};

/// What a listed connection is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerState {
    /// Lent to a client (in session pooling, for the client's whole session).
    Active,
    /// In its pool, ready to be lent.
    Idle,
    /// Given back and being reset (`server_reset_query`, or a rollback) before it is idle.
    Resetting,
}

impl ServerState {
    /// The name `SHOW SERVERS` prints.
    pub fn name(self) -> &'static str {
        match self {
            ServerState::Active => "active",
            ServerState::Idle => "idle",
            ServerState::Resetting => "resetting",
        }
    }

    fn from_u8(v: u8) -> ServerState {
        match v {
            0 => ServerState::Active,
            1 => ServerState::Idle,
            _ => ServerState::Resetting,
        }
    }
}

/// What the admin console shows about one server connection.
#[derive(Debug)]
pub struct ServerInfo {
    pub pool: PoolKey,
    pub tls: bool,
    pub connected_at: SystemTime,
    /// The server's process id once its BackendKeyData arrived; 0 before.
    pid: AtomicU32,
    state: AtomicU8,
    /// When the state last changed, in [`Tick`] milliseconds.
    state_since: AtomicU64,
    /// Statements pgmemo has prepared on the connection (transaction pooling).
    statements: AtomicU64,
    prepared_hits: AtomicU64,
    prepared_misses: AtomicU64,
}

/// A snapshot of one connection's [`ServerInfo`].
#[derive(Debug, Clone)]
pub struct ServerRow {
    pub pool: PoolKey,
    pub tls: bool,
    pub connected_at: SystemTime,
    pub pid: Option<u32>,
    pub state: ServerState,
    /// Milliseconds in the current state.
    pub state_millis: u64,
    pub statements: u64,
    pub prepared_hits: u64,
    pub prepared_misses: u64,
}

type Listed = Arc<Mutex<HashMap<u64, Arc<ServerInfo>>>>;

/// Every listed server connection, by a process-unique id.
#[derive(Debug, Default)]
pub struct ServerRegistry {
    next: AtomicU64,
    servers: Listed,
}

/// Keeps a connection listed until dropped (it is a field of the connection).
#[derive(Debug)]
pub struct ServerListing {
    id: u64,
    info: Arc<ServerInfo>,
    servers: Listed,
}

impl ServerRegistry {
    /// Lists a connection of `pool`, just logged in (so lent to the client that needed it).
    pub fn add(&self, pool: &PoolKey, tls: bool) -> ServerListing {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let info = Arc::new(ServerInfo {
            pool: pool.clone(),
            tls,
            connected_at: SystemTime::now(),
            pid: AtomicU32::new(0),
            state: AtomicU8::new(ServerState::Active as u8),
            state_since: AtomicU64::new(Tick::now().millis()),
            statements: AtomicU64::new(0),
            prepared_hits: AtomicU64::new(0),
            prepared_misses: AtomicU64::new(0),
        });
        lock(&self.servers).insert(id, Arc::clone(&info));
        ServerListing {
            id,
            info,
            servers: Arc::clone(&self.servers),
        }
    }

    /// A snapshot, oldest connection first.
    pub fn snapshot(&self) -> Vec<ServerRow> {
        let now = Tick::now().millis();
        let mut rows: Vec<ServerRow> = lock(&self.servers)
            .values()
            .map(|i| ServerRow {
                pool: i.pool.clone(),
                tls: i.tls,
                connected_at: i.connected_at,
                pid: Some(i.pid.load(Ordering::Relaxed)).filter(|&p| p != 0),
                state: ServerState::from_u8(i.state.load(Ordering::Relaxed)),
                state_millis: now.saturating_sub(i.state_since.load(Ordering::Relaxed)),
                statements: i.statements.load(Ordering::Relaxed),
                prepared_hits: i.prepared_hits.load(Ordering::Relaxed),
                prepared_misses: i.prepared_misses.load(Ordering::Relaxed),
            })
            .collect();
        rows.sort_by_key(|r| r.connected_at);
        rows
    }
}

fn lock(servers: &Listed) -> MutexGuard<'_, HashMap<u64, Arc<ServerInfo>>> {
    servers.lock().unwrap_or_else(|e| e.into_inner())
}

impl ServerListing {
    /// The server's process id (from its BackendKeyData).
    pub fn set_pid(&self, pid: u32) {
        self.info.pid.store(pid, Ordering::Relaxed);
    }

    /// The connection is `state` since `at` (noted only when the state changes). Only the
    /// task holding the connection writes: plain loads and stores, no read-modify-write.
    pub fn set_state(&self, state: ServerState, at: Tick) {
        if self.info.state.load(Ordering::Relaxed) != state as u8 {
            self.info.state.store(state as u8, Ordering::Relaxed);
            self.info.state_since.store(at.millis(), Ordering::Relaxed);
        }
    }

    /// Prepared statements after a transaction: how many the connection holds, and the hits
    /// and misses of the client's statements on it.
    pub fn note_prepared(&self, statements: usize, hits: u64, misses: u64) {
        let i = &self.info;
        i.statements.store(statements as u64, Ordering::Relaxed);
        if hits > 0 {
            i.prepared_hits.fetch_add(hits, Ordering::Relaxed);
        }
        if misses > 0 {
            i.prepared_misses.fetch_add(misses, Ordering::Relaxed);
        }
    }
}

impl Drop for ServerListing {
    fn drop(&mut self) {
        lock(&self.servers).remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(db: &str) -> PoolKey {
        PoolKey {
            host: "127.0.0.1".into(),
            port: 5432,
            database: db.into(),
            user: "u".into(),
            alias: db.into(),
        }
    }

    #[test]
    fn a_connection_is_listed_until_its_listing_is_dropped() {
        let registry = ServerRegistry::default();
        let a = registry.add(&key("a"), false);
        let b = registry.add(&key("b"), true);
        a.set_pid(42);
        b.set_state(ServerState::Idle, Tick::now());
        b.note_prepared(3, 5, 1);
        b.note_prepared(3, 2, 0);
        let rows = registry.snapshot();
        assert_eq!(rows.len(), 2);
        let (ra, rb) = (&rows[0], &rows[1]);
        assert_eq!(
            (ra.pool.alias.as_str(), ra.pid, ra.state),
            ("a", Some(42), ServerState::Active)
        );
        assert_eq!((rb.pid, rb.state, rb.tls), (None, ServerState::Idle, true));
        assert_eq!(
            (rb.statements, rb.prepared_hits, rb.prepared_misses),
            (3, 7, 1)
        );
        drop(a);
        let rows = registry.snapshot();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].pool.database, "b");
    }
}

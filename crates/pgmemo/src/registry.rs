//! The clients connected right now, for `SHOW CLIENTS`. Touched once at login and once at
//! logout (a short lock), never on the query path.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

/// What the admin console shows about one client.
#[derive(Debug, Clone)]
pub struct ClientInfo {
    pub peer: crate::net::Peer,
    pub user: String,
    pub database: String,
    pub tls: bool,
    pub connected_at: SystemTime,
    pub admin: bool,
}

/// Logged-in clients by a process-unique id.
#[derive(Debug, Default)]
pub struct ClientRegistry {
    next: AtomicU64,
    clients: Mutex<HashMap<u64, ClientInfo>>,
}

/// Keeps a client listed until dropped.
pub struct ClientEntry<'a> {
    registry: &'a ClientRegistry,
    id: u64,
}

impl ClientRegistry {
    /// Lists a client until the returned entry is dropped.
    pub fn add(&self, info: ClientInfo) -> ClientEntry<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, info);
        ClientEntry { registry: self, id }
    }

    /// A snapshot, oldest connection first.
    pub fn snapshot(&self) -> Vec<ClientInfo> {
        let mut all: Vec<_> = self.lock().values().cloned().collect();
        all.sort_by_key(|c| c.connected_at);
        all
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, ClientInfo>> {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for ClientEntry<'_> {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.id);
    }
}

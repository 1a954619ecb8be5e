//! Cancel requests: pgmemo hands every client its own BackendKeyData and remembers which server
//! session that key stands for right now, so a CancelRequest reaches the right server process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rand::Rng;
use tokio::io::AsyncWriteExt;
use wire::startup::CancelKey;

/// Where a cancel for one client must go, read from its [`CancelSlot`] when one arrives.
#[derive(Debug, Clone)]
struct ServerCancelTarget {
    host: std::sync::Arc<str>,
    port: u16,
    key: CancelKey,
}

/// The server a client is attached to; changes on every checkout in transaction pooling, so
/// setting it is one atomic store rather than a lock and a reference count.
#[derive(Debug, Default)]
pub struct CancelSlot {
    /// The server process serving the client now: process id in the high half, secret key in
    /// the low half; 0 while detached (PostgreSQL never uses process id 0).
    key: AtomicU64,
    /// Where the client's servers listen. Every server a client gets comes from its one pool,
    /// which connects to one address, so this is set by the first attachment.
    address: OnceLock<(Arc<str>, u16)>,
}

impl CancelSlot {
    /// The client now talks to the server process `key` at `host:port`.
    pub fn attach(&self, host: &Arc<str>, port: u16, key: CancelKey) {
        let address = self.address.get_or_init(|| (host.clone(), port));
        let packed = if address.1 == port && *address.0 == **host {
            (u64::from(key.process_id as u32) << 32) | u64::from(key.secret_key as u32)
        } else {
            // Cannot happen (one pool per client): rather no cancel than one sent elsewhere.
            tracing::warn!(%host, port, "a client's servers changed address; cancel disabled");
            0
        };
        self.key.store(packed, Ordering::Release);
    }

    /// The client is between servers: a cancel now has nothing to cancel.
    pub fn detach(&self) {
        self.key.store(0, Ordering::Release);
    }

    fn get(&self) -> Option<ServerCancelTarget> {
        let packed = self.key.load(Ordering::Acquire);
        if packed >> 32 == 0 {
            return None;
        }
        let (host, port) = self.address.get()?;
        Some(ServerCancelTarget {
            host: host.clone(),
            port: *port,
            key: CancelKey {
                process_id: (packed >> 32) as u32 as i32,
                secret_key: packed as u32 as i32,
            },
        })
    }
}

/// Client cancel keys → the slot of that client's session.
#[derive(Debug, Default)]
pub struct CancelRegistry {
    by_pid: Mutex<HashMap<i32, (i32, Arc<CancelSlot>)>>,
}

/// Removes a client's key from the registry when its session ends.
pub struct CancelRegistration<'a> {
    registry: &'a CancelRegistry,
    /// The key handed to the client.
    pub key: CancelKey,
    /// The slot to update with the current server.
    pub slot: Arc<CancelSlot>,
}

impl Drop for CancelRegistration<'_> {
    fn drop(&mut self) {
        self.registry
            .by_pid
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key.process_id);
    }
}

impl CancelRegistry {
    /// Creates a fresh random key for a new client.
    pub fn register(&self) -> CancelRegistration<'_> {
        let mut rng = rand::thread_rng();
        let slot = Arc::new(CancelSlot::default());
        let mut map = self.by_pid.lock().unwrap_or_else(|e| e.into_inner());
        let key = loop {
            let key = CancelKey {
                process_id: rng.gen_range(1..i32::MAX),
                secret_key: rng.gen(),
            };
            if !map.contains_key(&key.process_id) {
                break key;
            }
        };
        map.insert(key.process_id, (key.secret_key, slot.clone()));
        CancelRegistration {
            registry: self,
            key,
            slot,
        }
    }

    /// Forwards a client's CancelRequest to its current server, if the key is valid and the
    /// client is attached to one. Invalid keys are ignored silently, as PostgreSQL does.
    pub async fn cancel(&self, key: CancelKey) -> bool {
        let target = {
            let map = self.by_pid.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(&key.process_id) {
                Some((secret, slot)) if *secret == key.secret_key => slot.get(),
                _ => None,
            }
        };
        let Some(target) = target else {
            return false;
        };
        match send_cancel(&target).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, host = %target.host, "forwarding cancel request failed");
                false
            }
        }
    }
}

async fn send_cancel(target: &ServerCancelTarget) -> std::io::Result<()> {
    let mut s = crate::net::connect(&target.host, target.port).await?;
    s.write_all(&target.key.encode_cancel_request()).await?;
    s.flush().await?;
    // PostgreSQL closes the socket once it has read the request; waiting for that keeps the
    // cancel ordered before anything the client does next.
    let mut buf = [0u8; 1];
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        tokio::io::AsyncReadExt::read(&mut s, &mut buf),
    )
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_keeps_the_attached_server_key_exactly() {
        let slot = CancelSlot::default();
        assert!(slot.get().is_none());
        let host: Arc<str> = "db.example".into();
        for key in [
            CancelKey {
                process_id: 1,
                secret_key: -1,
            },
            CancelKey {
                process_id: i32::MAX,
                secret_key: i32::MIN,
            },
            CancelKey {
                process_id: 4242,
                secret_key: 0,
            },
        ] {
            slot.attach(&host, 5433, key);
            let target = slot.get().expect("attached");
            assert_eq!(
                (&*target.host, target.port, target.key),
                ("db.example", 5433, key)
            );
            slot.detach();
            assert!(slot.get().is_none());
        }
    }

    #[test]
    fn slot_refuses_a_second_address() {
        let slot = CancelSlot::default();
        let key = CancelKey {
            process_id: 7,
            secret_key: 9,
        };
        slot.attach(&Arc::from("a"), 1, key);
        slot.attach(&Arc::from("b"), 1, key);
        assert!(slot.get().is_none());
        slot.attach(&Arc::from("a"), 1, key);
        assert_eq!(slot.get().map(|t| t.key), Some(key));
    }
}

//! Cancel requests: pgmemo hands every client its own BackendKeyData and remembers which server
//! session that key stands for right now, so a CancelRequest reaches the right server process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rand::Rng;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use wire::startup::CancelKey;

/// Where a cancel for one client must go.
#[derive(Debug, Clone)]
pub struct ServerCancelTarget {
    /// Shared with the server connection: a transaction-pooled client sets its target on
    /// every checkout.
    pub host: std::sync::Arc<str>,
    pub port: u16,
    pub key: CancelKey,
}

/// The server a client is attached to; changes on every checkout in transaction pooling.
#[derive(Debug, Default)]
pub struct CancelSlot {
    target: Mutex<Option<ServerCancelTarget>>,
}

impl CancelSlot {
    /// Records the server the client now talks to (`None` when detached).
    pub fn set(&self, target: Option<ServerCancelTarget>) {
        *self.target.lock().unwrap_or_else(|e| e.into_inner()) = target;
    }

    fn get(&self) -> Option<ServerCancelTarget> {
        self.target
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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
    let mut s = TcpStream::connect((&*target.host, target.port)).await?;
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

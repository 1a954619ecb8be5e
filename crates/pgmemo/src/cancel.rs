//! Cancel requests: pgmemo hands every client its own BackendKeyData and remembers which server
//! session that key stands for right now, so a CancelRequest reaches the right server process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rand::Rng;
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;
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
///
/// A cancel takes a moment to reach PostgreSQL (a new connection to the postmaster). If the
/// client's transaction ends meanwhile and its server goes to another client, the cancel
/// would stop that client's query. So a cancel counts itself in flight before it reads the
/// key, [`CancelSlot::detach`] says whether one is, and the session lets the server go only
/// once [`CancelSlot::settle`] saw every such cancel delivered (or closes it).
#[derive(Debug, Default)]
pub struct CancelSlot {
    /// The server process serving the client now: process id in the high half, secret key in
    /// the low half; 0 while detached (PostgreSQL never uses process id 0).
    key: AtomicU64,
    /// Where the client's servers listen. Every server a client gets comes from its one pool,
    /// which connects to one address, so this is set by the first attachment.
    address: OnceLock<(Arc<str>, u16)>,
    /// Cancels read from this slot and not yet known to be delivered or dropped.
    in_flight: AtomicU32,
    /// A cancel of this slot ended without knowing whether PostgreSQL got it (no answer in
    /// time): it may still arrive, so the server it named must not serve anyone else.
    doubtful: AtomicBool,
    /// Woken when the last cancel in flight ends.
    settled: Notify,
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

    /// The client is between servers: a cancel now has nothing to cancel. Returns whether a
    /// cancel read before is still on its way to the server the client had; then
    /// [`CancelSlot::settle`] must run before that server serves another client.
    #[must_use = "a cancel in flight must settle before the server serves another client"]
    pub fn detach(&self) -> bool {
        // SeqCst pairs with `begin`: either the cancel sees 0 here, or this sees it counted.
        self.key.store(0, Ordering::SeqCst);
        self.in_flight.load(Ordering::SeqCst) > 0
    }

    /// Waits until no cancel of this slot is in flight. `true` when every one that ended was
    /// delivered (or never sent); `false` when one may still reach the server, which must then
    /// be closed rather than given to another client.
    pub async fn settle(&self) -> bool {
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if self.in_flight.load(Ordering::SeqCst) == 0 {
                return !self.doubtful.swap(false, Ordering::AcqRel);
            }
            settled.await;
        }
    }

    /// Counts a cancel in flight and reads where it goes; `None` (and not counted) while
    /// detached.
    fn begin(self: &Arc<Self>) -> Option<(ServerCancelTarget, InFlight)> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight {
            slot: self.clone(),
            delivered: true,
        };
        let packed = self.key.load(Ordering::SeqCst);
        self.target(packed).map(|t| (t, guard))
    }

    #[cfg(test)]
    fn get(&self) -> Option<ServerCancelTarget> {
        self.target(self.key.load(Ordering::Acquire))
    }

    fn target(&self, packed: u64) -> Option<ServerCancelTarget> {
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

/// One cancel in flight; ends it when dropped (also when the forwarding task is dropped).
struct InFlight {
    slot: Arc<CancelSlot>,
    /// Whether PostgreSQL got the cancel or certainly never will.
    delivered: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.delivered {
            self.slot.doubtful.store(true, Ordering::Release);
        }
        if self.slot.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.slot.settled.notify_waiters();
        }
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
        let slot = {
            let map = self.by_pid.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(&key.process_id) {
                Some((secret, slot)) if *secret == key.secret_key => slot.clone(),
                _ => return false,
            }
        };
        let Some((target, mut in_flight)) = slot.begin() else {
            return false;
        };
        // Until known otherwise (also if this future is dropped half-way), the cancel may
        // still reach the server.
        in_flight.delivered = false;
        let outcome = tokio::time::timeout(CANCEL_TIMEOUT, send_cancel(&target)).await;
        match outcome {
            Ok(Ok(())) => {
                in_flight.delivered = true;
                true
            }
            Ok(Err(e)) => {
                in_flight.delivered = matches!(e, SendError::NotSent(_));
                tracing::warn!(error = %e, host = %target.host, "forwarding cancel request failed");
                false
            }
            Err(_) => {
                tracing::warn!(host = %target.host, "the server did not take the cancel request in time");
                false
            }
        }
    }
}

/// How long forwarding a cancel may take, from connecting to the server closing the
/// connection. A session whose transaction ended meanwhile holds its server until then.
const CANCEL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Why a cancel was not forwarded.
#[derive(Debug, thiserror::Error)]
enum SendError {
    /// Nothing reached the server.
    #[error("cannot connect: {0}")]
    NotSent(std::io::Error),
    /// The request may have reached the server.
    #[error("{0}")]
    Unconfirmed(std::io::Error),
}

async fn send_cancel(target: &ServerCancelTarget) -> Result<(), SendError> {
    // Short-lived and bounded by CANCEL_TIMEOUT: no keepalive.
    let keepalive = crate::net::TcpKeepalive::default();
    let mut s = crate::net::connect(&target.host, target.port, &keepalive)
        .await
        .map_err(SendError::NotSent)?;
    s.write_all(&target.key.encode_cancel_request())
        .await
        .map_err(SendError::Unconfirmed)?;
    s.flush().await.map_err(SendError::Unconfirmed)?;
    // PostgreSQL signals the backend, then closes the socket: once it is closed the cancel
    // cannot reach a later query of the backend, and is ordered before anything the client
    // does next.
    let mut buf = [0u8; 1];
    tokio::io::AsyncReadExt::read(&mut s, &mut buf)
        .await
        .map_err(SendError::Unconfirmed)?;
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
            assert!(!slot.detach(), "no cancel in flight");
            assert!(slot.get().is_none());
        }
    }

    #[tokio::test]
    async fn a_detached_slot_settles_once_its_cancels_end() {
        let slot = Arc::new(CancelSlot::default());
        let key = CancelKey {
            process_id: 7,
            secret_key: 9,
        };
        slot.attach(&Arc::from("a"), 1, key);
        let (_, delivered) = slot.begin().expect("attached");
        let (_, mut lost) = slot.begin().expect("attached");
        lost.delivered = false;
        assert!(slot.detach(), "two cancels in flight");
        assert!(slot.begin().is_none(), "a detached slot starts no cancel");
        let settling = tokio::spawn({
            let slot = slot.clone();
            async move { slot.settle().await }
        });
        drop(delivered);
        tokio::task::yield_now().await;
        assert!(!settling.is_finished(), "one cancel is still in flight");
        drop(lost);
        assert!(!settling.await.unwrap(), "a cancel may still arrive");
        // The doubt is about that one server only.
        slot.attach(&Arc::from("a"), 1, key);
        assert!(!slot.detach());
        assert!(slot.settle().await);
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

//! Cancel requests: pgmemo hands every client its own BackendKeyData and remembers which server
//! session that key stands for right now, so a CancelRequest reaches the right server process.
//!
//! A client's statement may wait in pgmemo before any server runs it: for a place in the pool
//! or another client's fill of the cache (transaction pooling), or while pgmemo looks up its
//! tables on an idle server (both modes). A cancel then has nowhere useful to go, yet the
//! statement is in progress as far as the client can tell, so the slot keeps it: the session
//! answers the statement as cancelled (57014) without running it, or, where it cannot, forwards
//! the cancel once the request has been sent (see [`CancelSlot::await_server`] and
//! [`CancelSlot::hold`]).

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
/// Between a request that needs a server and the moment it is sent, the slot is *waiting*: a
/// cancel arriving then is kept instead of dropped ([`CancelSlot::cancel_kept`] wakes the
/// session), and the session answers the request itself or forwards the cancel once it has
/// sent the request ([`CancelSlot::request_sent`]). Sent earlier, to a server still idle,
/// PostgreSQL would ignore it, and the statement would run to its end.
///
/// A cancel takes a moment to reach PostgreSQL (a new connection to the postmaster). If the
/// client's transaction ends meanwhile and its server goes to another client, the cancel
/// would stop that client's query. So a cancel counts itself in flight before it reads the
/// key, [`CancelSlot::detach`] says whether one is, and the session lets the server go only
/// once [`CancelSlot::settle`] saw every such cancel delivered (or closes it).
#[derive(Debug, Default)]
pub struct CancelSlot {
    /// The server process serving the client now: process id in the high half, secret key in
    /// the low half; [`DETACHED`], [`WAITING`] or [`WAITING_CANCELLED`] otherwise (process id 0,
    /// which PostgreSQL never uses).
    key: AtomicU64,
    /// The server a waiting request will be sent to, packed as `key`: published by
    /// [`CancelSlot::request_sent`]; 0 when none.
    staged: AtomicU64,
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
    /// Woken when a cancel is kept for a waiting request.
    kept: Notify,
}

/// `CancelSlot::key` while the client has no server: a cancel has nothing to stop.
const DETACHED: u64 = 0;
/// `CancelSlot::key` while a request of the client waits to be sent to a server.
const WAITING: u64 = 1;
/// [`WAITING`], and a cancel came meanwhile: it is forwarded once the request is sent.
const WAITING_CANCELLED: u64 = 2;

impl CancelSlot {
    /// The client now talks to the server process `key` at `host:port`.
    pub fn attach(&self, host: &Arc<str>, port: u16, key: CancelKey) {
        self.key
            .store(self.pack(host, port, key), Ordering::Release);
    }

    /// The client has sent a request that no server runs yet (transaction pooling, while
    /// detached): a cancel from now on is kept for the server the request will go to.
    pub fn await_server(&self) {
        // Only from detached: a cancel kept already (the request waited before) stays kept.
        let _ = self
            .key
            .compare_exchange(DETACHED, WAITING, Ordering::SeqCst, Ordering::Relaxed);
    }

    /// Resolves once a cancel was kept for the waiting request: a session queued for a
    /// server can answer the request as cancelled instead of running it later.
    pub async fn cancel_kept(&self) {
        loop {
            let kept = self.kept.notified();
            tokio::pin!(kept);
            kept.as_mut().enable();
            if self.is_kept() {
                return;
            }
            kept.await;
        }
    }

    /// Whether a cancel was kept for the waiting request.
    pub fn is_kept(&self) -> bool {
        self.key.load(Ordering::SeqCst) == WAITING_CANCELLED
    }

    /// The server the waiting request will be sent to (`None`: a server without a key,
    /// which no cancel can reach). Cancels keep waiting until [`CancelSlot::request_sent`].
    pub fn stage(&self, host: &Arc<str>, port: u16, key: Option<CancelKey>) {
        let packed = key.map_or(DETACHED, |key| self.pack(host, port, key));
        self.staged.store(packed, Ordering::Release);
    }

    /// Called after each write of client requests to the server: the first one after
    /// [`CancelSlot::stage`] makes cancels go to that server from now on, and forwards the
    /// cancel that came while the request waited. One relaxed load once published.
    pub fn request_sent(self: &Arc<Self>) {
        if self.key.load(Ordering::Relaxed) > WAITING_CANCELLED {
            return;
        }
        let staged = self.staged.swap(DETACHED, Ordering::AcqRel);
        if staged == DETACHED {
            return;
        }
        if self.key.swap(staged, Ordering::SeqCst) != WAITING_CANCELLED {
            return;
        }
        // Counted before the session can detach, so the server waits for it to settle.
        let guard = self.count_in_flight();
        let Some(target) = self.target(staged) else {
            return;
        };
        tracing::debug!(host = %target.host, "forwarding a cancel that came while the request waited");
        tokio::spawn(deliver(target, guard));
    }

    /// Session pooling: the client's statement waits in pgmemo (for another session's fill,
    /// or for catalog lookups) while its server is idle, where PostgreSQL would ignore a
    /// cancel. Until [`CancelSlot::resume`], a cancel is kept instead. Call only while
    /// attached.
    pub fn hold(&self) {
        let key = self.key.swap(WAITING, Ordering::SeqCst);
        self.staged.store(key, Ordering::Release);
    }

    /// Ends [`CancelSlot::hold`]: cancels go to the server again. `true` when one came
    /// meanwhile (the caller answers the statement as cancelled).
    #[must_use = "a cancel kept while held is the caller's to answer"]
    pub fn resume(&self) -> bool {
        let key = self.staged.swap(DETACHED, Ordering::AcqRel);
        self.key.swap(key, Ordering::SeqCst) == WAITING_CANCELLED
    }

    /// The client is between servers: a cancel now has nothing to cancel (one kept while a
    /// request waited is dropped: the request was answered without a server). Returns whether
    /// a cancel read before is still on its way to the server the client had; then
    /// [`CancelSlot::settle`] must run before that server serves another client.
    #[must_use = "a cancel in flight must settle before the server serves another client"]
    pub fn detach(&self) -> bool {
        self.staged.store(DETACHED, Ordering::Release);
        // SeqCst pairs with `begin`: either the cancel sees 0 here, or this sees it counted.
        self.key.store(DETACHED, Ordering::SeqCst);
        self.in_flight.load(Ordering::SeqCst) > 0
    }

    /// `key` as stored in `key`, or [`DETACHED`] if it is at another address than the
    /// client's servers so far.
    fn pack(&self, host: &Arc<str>, port: u16, key: CancelKey) -> u64 {
        let address = self.address.get_or_init(|| (host.clone(), port));
        if address.1 == port && *address.0 == **host {
            (u64::from(key.process_id as u32) << 32) | u64::from(key.secret_key as u32)
        } else {
            // Cannot happen (one pool per client): rather no cancel than one sent elsewhere.
            tracing::warn!(%host, port, "a client's servers changed address; cancel disabled");
            DETACHED
        }
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

    /// Counts a cancel in flight until the guard is dropped.
    fn count_in_flight(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight {
            slot: self.clone(),
            delivered: true,
        }
    }

    /// Counts a cancel in flight and reads where it goes.
    fn begin(self: &Arc<Self>) -> Begun {
        let guard = self.count_in_flight();
        let mut packed = self.key.load(Ordering::SeqCst);
        loop {
            match packed {
                DETACHED => return Begun::Nowhere,
                WAITING_CANCELLED => return Begun::Kept,
                WAITING => match self.key.compare_exchange(
                    WAITING,
                    WAITING_CANCELLED,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                ) {
                    Ok(_) => {
                        self.kept.notify_waiters();
                        return Begun::Kept;
                    }
                    Err(now) => packed = now,
                },
                _ => {
                    return match self.target(packed) {
                        Some(target) => Begun::Forward(target, guard),
                        None => Begun::Nowhere,
                    }
                }
            }
        }
    }

    #[cfg(test)]
    fn get(&self) -> Option<ServerCancelTarget> {
        self.target(self.key.load(Ordering::Acquire))
    }

    fn target(&self, packed: u64) -> Option<ServerCancelTarget> {
        // DETACHED, WAITING and WAITING_CANCELLED name no process.
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

/// What a cancel found in its client's slot.
enum Begun {
    /// The client's server: forward the cancel there.
    Forward(ServerCancelTarget, InFlight),
    /// The client's request waits for a server: the session forwards the cancel after
    /// sending it.
    Kept,
    /// The client is between requests: nothing to cancel.
    Nowhere,
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
    /// client is attached to one, or keeps it for the server its waiting request will go to;
    /// `true` when forwarded or kept. Invalid keys are ignored silently, as PostgreSQL does.
    pub async fn cancel(&self, key: CancelKey) -> bool {
        let slot = {
            let map = self.by_pid.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(&key.process_id) {
                Some((secret, slot)) if *secret == key.secret_key => slot.clone(),
                _ => return false,
            }
        };
        match slot.begin() {
            Begun::Forward(target, in_flight) => deliver(target, in_flight).await,
            Begun::Kept => true,
            Begun::Nowhere => false,
        }
    }
}

/// Sends a cancel to `target`; `in_flight` ends when it is known delivered or lost.
async fn deliver(target: ServerCancelTarget, mut in_flight: InFlight) -> bool {
    // Until known otherwise (also if this future is dropped half-way), the cancel may still
    // reach the server.
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

/// The error PostgreSQL gives a statement a cancel stopped: what pgmemo answers for a
/// statement cancelled before it reached a server.
pub fn cancelled_error() -> wire::ErrorResponse {
    wire::ErrorResponse::error(
        wire::sqlstate::QUERY_CANCELED,
        "canceling statement due to user request",
    )
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
        let (_, delivered) = forwarded(slot.begin()).expect("attached");
        let (_, mut lost) = forwarded(slot.begin()).expect("attached");
        lost.delivered = false;
        assert!(slot.detach(), "two cancels in flight");
        assert!(
            matches!(slot.begin(), Begun::Nowhere),
            "a detached slot starts no cancel"
        );
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

    fn forwarded(begun: Begun) -> Option<(ServerCancelTarget, InFlight)> {
        match begun {
            Begun::Forward(target, in_flight) => Some((target, in_flight)),
            _ => None,
        }
    }

    /// A cancel that comes while the client's request waits goes to the server the request
    /// is sent to, once it is sent; one that comes while the client is idle goes nowhere.
    #[tokio::test]
    async fn a_cancel_for_a_waiting_request_follows_it_to_its_server() {
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = server.local_addr().unwrap().port();
        let host: Arc<str> = "127.0.0.1".into();
        let key = CancelKey {
            process_id: 4711,
            secret_key: -3,
        };
        let slot = Arc::new(CancelSlot::default());
        assert!(matches!(slot.begin(), Begun::Nowhere), "idle: dropped");

        slot.await_server();
        assert!(matches!(slot.begin(), Begun::Kept));
        assert!(
            matches!(slot.begin(), Begun::Kept),
            "a second one is the same"
        );
        slot.stage(&host, port, Some(key));
        assert!(matches!(slot.begin(), Begun::Kept), "staged, not yet sent");
        slot.request_sent();
        let (mut conn, _) = server.accept().await.unwrap();
        let mut request = [0u8; 16];
        tokio::io::AsyncReadExt::read_exact(&mut conn, &mut request)
            .await
            .unwrap();
        assert_eq!(&request[..], &key.encode_cancel_request()[..]);
        assert!(
            slot.detach(),
            "the kept cancel is in flight until the server closes"
        );
        drop(conn);
        assert!(slot.settle().await, "delivered");

        // Sent once: later writes forward nothing more, and cancels go to the server.
        slot.await_server();
        slot.stage(&host, port, Some(key));
        slot.request_sent();
        slot.request_sent();
        assert!(forwarded(slot.begin()).is_some_and(|(t, _)| t.key == key));
        // A request answered without a server drops a kept cancel.
        assert!(!slot.detach());
        slot.await_server();
        assert!(matches!(slot.begin(), Begun::Kept));
        assert!(!slot.detach());
        slot.await_server();
        slot.stage(&host, port, Some(key));
        slot.request_sent();
        assert!(!slot.detach(), "nothing was forwarded");
    }

    /// Session pooling holds cancels while a statement waits in pgmemo with the server idle:
    /// kept meanwhile, and told to the caller at resume; the server's key is back after it.
    #[test]
    fn a_held_slot_keeps_cancels_until_resumed() {
        let slot = Arc::new(CancelSlot::default());
        let key = CancelKey {
            process_id: 12,
            secret_key: 34,
        };
        slot.attach(&Arc::from("a"), 1, key);
        slot.hold();
        assert!(!slot.resume(), "nothing came");
        assert!(forwarded(slot.begin()).is_some_and(|(t, _)| t.key == key));

        slot.hold();
        assert!(matches!(slot.begin(), Begun::Kept));
        assert!(slot.is_kept());
        assert!(slot.resume(), "the kept cancel is the caller's");
        assert!(!slot.is_kept());
        assert!(
            forwarded(slot.begin()).is_some_and(|(t, _)| t.key == key),
            "cancels reach the server again"
        );
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

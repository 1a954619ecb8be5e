//! Step 5 of the query path: server connection pools, one per (server, database, user).
//!
//! A client first takes a [`Lease`] (a place among `pool_size`, waiting in FIFO order up to
//! `query_wait_timeout`), then either an idle connection from the pool or a slot to open a new
//! one. Giving the lease back with a connection resets the connection (`server_reset_query`)
//! in the background before it becomes idle again; a connection that is not at a clean protocol
//! boundary is closed instead, so no client ever inherits another's transaction or settings.

mod clock;
mod lease;
mod listing;
mod prepared;
mod promoted;
mod server;
pub mod settings;
mod trust;
mod wait;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use clock::Tick;
pub use lease::{Lease, ReleaseState};
pub use listing::{ServerListing, ServerRegistry, ServerRow, ServerState};
pub use prepared::{
    ParamTypes, PreparedStatement, ServerStatements, Sharing, StatementKey, StatementRegistry,
    StatementSource,
};
pub use promoted::{PromotedStatements, Promotion};
pub use server::{ServerConn, ServerCredential, ServerError, ServerSession};
pub use trust::{Probe, Trust, TrustState};
pub use wait::WaitTimer;

/// Identifies a pool: the real server, database and user of its connections, and the
/// database name its clients use. Two `[databases]` entries naming one real database are two
/// pools, as in PgBouncer: each has its own `pool_size`, which one shared pool could only
/// follow by switching between them at each login.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub host: String,
    pub port: u16,
    pub database: String,
    pub user: String,
    /// The database name clients ask for (the `[databases]` entry, or `database` itself);
    /// what `SHOW POOLS`, `SHOW SERVERS` and the metrics show as the database.
    pub alias: String,
}

/// Why no server connection could be lent.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("no server connection became available within {0:?} (query_wait_timeout)")]
    WaitTimeout(Duration),
    #[error("pgmemo is shutting down")]
    Closed,
}

/// Timeouts and checks applied when lending and taking back connections.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub server_lifetime: Duration,
    pub server_idle_timeout: Duration,
    pub server_check_delay: Duration,
    pub server_check_query: String,
    /// How long the health check may take: a server that does not answer in time (a hung
    /// backend, a silent network) is closed, and the client gets another connection.
    pub server_check_timeout: Duration,
    pub server_reset_query: String,
}

/// All pools of a pgmemo instance.
#[derive(Default)]
pub struct Pools {
    pools: Mutex<HashMap<PoolKey, Arc<Pool>>>,
    /// Prepared statements of transaction-pooled clients, shared by every pool.
    pub statements: StatementRegistry,
    /// Every pooled server connection, for `SHOW SERVERS`.
    pub servers: ServerRegistry,
}

impl Pools {
    /// The pool for `key`, created on first use; its size follows `size` on every call so that
    /// a reloaded `pool_size` takes effect. `generation` is `Shared::config_generation` read
    /// before the configuration `size` comes from: a size from an older configuration than
    /// the pool's (a login that read it just before a reload) is ignored.
    pub fn get(&self, key: &PoolKey, size: usize, generation: u64) -> Arc<Pool> {
        let pool = {
            let mut map = self.pools.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(key.clone())
                .or_insert_with(|| Arc::new(Pool::new(key.clone(), size)))
                .clone()
        };
        pool.resize_from(size, generation);
        pool
    }

    /// Every pool, for statistics.
    pub fn all(&self) -> Vec<Arc<Pool>> {
        self.pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Closes idle connections that outlived `server_idle_timeout` or `server_lifetime`,
    /// then forgets pools nobody uses.
    pub async fn close_expired(&self, settings: &PoolSettings) {
        for pool in self.all() {
            for conn in pool.take_expired(settings) {
                conn.close().await;
            }
        }
        self.forget_unused();
    }

    /// Removes the pools that hold no connection and that no session holds: a pool is made
    /// for every (user, database) a client names, before it has logged in, so failed logins
    /// with made-up names would otherwise add pools (and their rows in SHOW POOLS and the
    /// metrics) without end. A pool with idle connections stays.
    pub fn forget_unused(&self) {
        let mut map = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        // Under the map's lock nobody can take a new handle on a pool: one held only by the
        // map is unused, and stays so while it is removed.
        map.retain(|_, pool| Arc::strong_count(pool) > 1 || pool.counts().1 > 0);
    }

    /// Closes every idle connection and refuses new leases (shutdown).
    pub async fn close_all(&self) {
        for pool in self.all() {
            pool.semaphore.close();
            pool.close_idle().await;
        }
    }
}

struct PoolState {
    idle: VecDeque<Box<ServerConn>>,
    /// Connections that exist: idle, lent out, or being reset.
    total: usize,
}

impl PoolState {
    /// Takes a connection given back in good state: it becomes idle, unless the pool holds
    /// more than `size` connections (its size was reloaded smaller), in which case it is no
    /// longer counted and is returned to be closed.
    fn keep(&mut self, conn: Box<ServerConn>, size: usize) -> Option<Box<ServerConn>> {
        if self.total > size {
            self.total -= 1;
            return Some(conn);
        }
        self.idle.push_back(conn);
        None
    }
}

/// Connections to one (server, database, user).
pub struct Pool {
    key: PoolKey,
    semaphore: Arc<Semaphore>,
    size: AtomicUsize,
    /// Places a shrink could not take away at once because they were in use: that many permits
    /// are forgotten instead of returned as leases end.
    shrink_debt: AtomicUsize,
    state: Mutex<PoolState>,
    /// Whether the server lets this key's logins in without a password: only then may
    /// `auth_type = upstream` serve a new client from the pool without relaying an
    /// authentication exchange.
    pub trust: TrustState,
    /// Clients queued for a place now (SHOW POOLS): a pool that is too small shows here
    /// before any wait times out.
    waiting: AtomicUsize,
    /// The configuration generation the size was last set from; held while resizing so
    /// that sizes from two configurations are applied in generation order.
    sized_in: Mutex<u64>,
}

/// Counts a client in `Pool::waiting` while it queues.
struct Queued<'a>(&'a AtomicUsize);

impl<'a> Queued<'a> {
    fn new(waiting: &'a AtomicUsize) -> Queued<'a> {
        waiting.fetch_add(1, Ordering::Relaxed);
        Queued(waiting)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Pool {
    fn new(key: PoolKey, size: usize) -> Pool {
        Pool {
            key,
            semaphore: Arc::new(Semaphore::new(size)),
            size: AtomicUsize::new(size),
            shrink_debt: AtomicUsize::new(0),
            state: Mutex::new(PoolState {
                idle: VecDeque::new(),
                total: 0,
            }),
            trust: TrustState::default(),
            waiting: AtomicUsize::new(0),
            sized_in: Mutex::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pool's identity.
    pub fn key(&self) -> &PoolKey {
        &self.key
    }

    /// Resizes to `size` unless the pool was sized from a newer configuration.
    fn resize_from(&self, size: usize, generation: u64) {
        let mut sized_in = self.sized_in.lock().unwrap_or_else(|e| e.into_inner());
        if generation < *sized_in {
            return;
        }
        *sized_in = generation;
        self.resize(size);
    }

    fn resize(&self, size: usize) {
        let old = self.size.swap(size, Ordering::AcqRel);
        if size > old {
            // Places still owed by an earlier shrink are cancelled before new ones are added.
            let grow = size - old;
            let owed = self
                .shrink_debt
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| {
                    Some(d - d.min(grow))
                })
                .unwrap_or(0);
            self.semaphore.add_permits(grow - owed.min(grow));
        } else if size < old {
            // Permits in use cannot be revoked; forget what is free now and let the rest shrink
            // as leases end (a shrunk pool may briefly exceed its new size).
            let removed = self.semaphore.forget_permits(old - size);
            if removed < old - size {
                self.shrink_debt
                    .fetch_add(old - size - removed, Ordering::AcqRel);
                tracing::debug!(pool = ?self.key, "pool shrinks as leases end");
            }
            // Idle connections over the new size are closed now; busy ones as they come back
            // (`PoolState::keep`), rather than lingering until `server_idle_timeout`.
            let surplus: Vec<_> = {
                let mut st = self.state();
                let over = st.total.saturating_sub(size).min(st.idle.len());
                st.total -= over;
                st.idle.drain(..over).collect()
            };
            for conn in surplus {
                tokio::spawn(conn.close());
            }
        }
    }

    /// Returns a lease's permit to the pool, or forgets it while a shrink is still owed.
    fn give_back(&self, permit: OwnedSemaphorePermit) {
        let owed = self
            .shrink_debt
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| d.checked_sub(1))
            .is_ok();
        if owed {
            permit.forget();
        }
    }

    /// Waits (FIFO) for a place among the pool's connections.
    pub async fn acquire(self: &Arc<Self>, wait: Duration) -> Result<Lease, PoolError> {
        match self.try_acquire() {
            Ok(Some(lease)) => Ok(lease),
            Ok(None) => Box::pin(self.wait_for_place(wait)).await,
            Err(e) => Err(e),
        }
    }

    /// As [`Pool::acquire`], with the client's own reusable deadline (transaction pooling
    /// queues once per transaction; see [`WaitTimer`] for what that saves and costs).
    pub async fn acquire_timed(
        self: &Arc<Self>,
        wait: Duration,
        timer: &mut WaitTimer,
    ) -> Result<Lease, PoolError> {
        if let Some(lease) = self.try_acquire()? {
            return Ok(lease);
        }
        let sleep = timer.arm(wait);
        let _queued = Queued::new(&self.waiting);
        let permit = tokio::select! {
            biased;
            p = self.semaphore.clone().acquire_owned() => p.map_err(|_| PoolError::Closed)?,
            _ = sleep => return Err(PoolError::WaitTimeout(wait)),
        };
        Ok(Lease::new(self.clone(), permit))
    }

    /// A free place without waiting (and without arming a timer: transaction pooling asks once
    /// per transaction); `None` when every place is taken. Tokio's semaphore is fair: a place
    /// is free only when nobody queues for one.
    pub fn try_acquire(self: &Arc<Self>) -> Result<Option<Lease>, PoolError> {
        match self.semaphore.clone().try_acquire_owned() {
            Ok(permit) => Ok(Some(Lease::new(self.clone(), permit))),
            Err(tokio::sync::TryAcquireError::Closed) => Err(PoolError::Closed),
            Err(tokio::sync::TryAcquireError::NoPermits) => Ok(None),
        }
    }

    /// Queues for a place for at most `wait` (boxed by [`Pool::acquire`]: the timer's future
    /// is large and rarely needed).
    async fn wait_for_place(self: &Arc<Self>, wait: Duration) -> Result<Lease, PoolError> {
        let _queued = Queued::new(&self.waiting);
        let permit = match tokio::time::timeout(wait, self.semaphore.clone().acquire_owned()).await
        {
            Err(_) => return Err(PoolError::WaitTimeout(wait)),
            Ok(Err(_)) => return Err(PoolError::Closed),
            Ok(Ok(p)) => p,
        };
        Ok(Lease::new(self.clone(), permit))
    }

    /// A place for a connection opened in the background so that the pool holds at least
    /// `min` (`min_pool_size`): a lease like a client's, so that a connection being opened
    /// counts against `pool_size` and the pool never holds more. `None` when the pool holds
    /// `min` connections already or every place is taken. The opener gives the connection
    /// back with [`Lease::return_idle`], or drops the lease when opening failed.
    pub fn reserve_spare(self: &Arc<Self>, min: usize) -> Option<Lease> {
        let limit = min.min(self.size());
        if self.state().total >= limit {
            return None;
        }
        let mut lease = self.try_acquire().ok()??;
        // Counted again under the lock: another spare may have been reserved meanwhile.
        lease.reserve_below(limit).then_some(lease)
    }

    /// Closes every idle connection of this pool (shutdown; also lets a test force the next
    /// login to reach the server).
    pub async fn close_idle(&self) {
        let idle: Vec<Box<ServerConn>> = {
            let mut st = self.state();
            let drained: Vec<_> = st.idle.drain(..).collect();
            st.total -= drained.len();
            drained
        };
        for conn in idle {
            conn.close().await;
        }
    }

    /// (idle, total) connection counts.
    pub fn counts(&self) -> (usize, usize) {
        let st = self.state();
        (st.idle.len(), st.total)
    }

    /// Clients holding a place in the pool now (connected sessions in session pooling).
    pub fn leases(&self) -> usize {
        let owed = self.shrink_debt.load(Ordering::Acquire);
        (self.size() + owed).saturating_sub(self.semaphore.available_permits())
    }

    /// Clients queued for a place now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// The configured size.
    pub fn size(&self) -> usize {
        self.size.load(Ordering::Acquire)
    }

    // Boxed as they are kept (see `ServerConn::open`): unboxing would copy each.
    #[allow(clippy::vec_box)]
    fn take_expired(&self, settings: &PoolSettings) -> Vec<Box<ServerConn>> {
        let now = Tick::now();
        let mut st = self.state();
        let mut expired = Vec::new();
        let mut keep = VecDeque::with_capacity(st.idle.len());
        while let Some(c) = st.idle.pop_front() {
            if c.expired(settings, now) {
                expired.push(c);
            } else {
                keep.push_back(c);
            }
        }
        st.idle = keep;
        st.total -= expired.len();
        expired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(user: &str) -> PoolKey {
        PoolKey {
            host: "127.0.0.1".into(),
            port: 5432,
            database: "db".into(),
            user: user.into(),
            alias: "db".into(),
        }
    }

    fn pool(size: usize) -> Arc<Pool> {
        Arc::new(Pool::new(key("u"), size))
    }

    #[tokio::test]
    async fn a_spare_being_opened_holds_a_place_of_the_pool() {
        let pool = pool(1);
        let spare = pool.reserve_spare(1).expect("room for a spare");
        assert_eq!(pool.counts(), (0, 1));
        assert!(
            pool.try_acquire().unwrap().is_none(),
            "a client waits while the spare is opened"
        );
        assert!(pool.reserve_spare(1).is_none(), "one spare at a time");
        // Opening failed: the room and the place come back.
        drop(spare);
        assert_eq!(pool.counts(), (0, 0));
        assert!(pool.try_acquire().unwrap().is_some());
    }

    #[tokio::test]
    async fn a_size_from_an_older_configuration_does_not_undo_a_newer_one() {
        let pools = Pools::default();
        let key = key("u");
        assert_eq!(pools.get(&key, 4, 1).size(), 4);
        // A reload (generation 2) shrinks it; a login that read generation 1 comes after.
        assert_eq!(pools.get(&key, 2, 2).size(), 2);
        assert_eq!(pools.get(&key, 4, 1).size(), 2, "the older size is ignored");
        assert_eq!(pools.get(&key, 6, 3).size(), 6);
    }

    #[tokio::test]
    async fn pools_nobody_uses_are_forgotten() {
        let pools = Pools::default();
        for i in 0..100 {
            pools.get(&key(&format!("made-up-{i}")), 4, 0);
        }
        let held = pools.get(&key("app"), 4, 0);
        let lease = held.try_acquire().unwrap().unwrap();
        drop(held);
        pools.forget_unused();
        assert_eq!(pools.all().len(), 1, "only the pool a lease holds");
        drop(lease);
        pools.forget_unused();
        assert!(pools.all().is_empty());
    }

    #[tokio::test]
    async fn no_spare_once_the_pool_holds_its_minimum() {
        let pool = pool(4);
        let a = pool.reserve_spare(2).unwrap();
        let b = pool.reserve_spare(2).unwrap();
        assert!(pool.reserve_spare(2).is_none());
        assert_eq!(pool.counts(), (0, 2));
        drop((a, b));
    }
}

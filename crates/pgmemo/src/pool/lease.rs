//! A client's place in a pool: the RAII guard that holds one of `pool_size` permits, lends a
//! connection, and on release resets the connection before another client can have it.

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;
use wire::backend::TransactionStatus;
use wire::startup::CancelKey;

use super::{Pool, PoolSettings, ServerConn, Tick};

/// In what state a client gives its connection back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseState {
    /// At a protocol boundary (every request answered with ReadyForQuery).
    Boundary(TransactionStatus),
    /// Mid-request, mid-COPY or mid-message: the server's state is unknown; close it.
    Dirty,
}

/// Holds a place in a pool until dropped. While it lives, the pool keeps room for one
/// connection for its holder.
pub struct Lease {
    pool: Arc<Pool>,
    permit: Option<OwnedSemaphorePermit>,
    /// Whether this lease counts a connection in `total` (an idle one taken, or a new one being
    /// opened).
    counted: bool,
}

impl Lease {
    pub(super) fn new(pool: Arc<Pool>, permit: OwnedSemaphorePermit) -> Lease {
        Lease {
            pool,
            permit: Some(permit),
            counted: false,
        }
    }

    /// The pool this lease belongs to.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Takes an idle connection opened with the same startup parameters, skipping (and
    /// closing) ones that expired or whose server went away. Connections idle for longer than
    /// `server_check_delay` are checked with `server_check_query` first.
    ///
    /// `prefer` names the server the client had last (transaction pooling): when it is idle
    /// the client gets it back, so a client that finds its own server free works with warm
    /// caches (the kernel's socket state, the backend's memory) and with settings and unnamed
    /// statement already in place. Otherwise the most recently returned one is taken.
    pub async fn take_idle(
        &mut self,
        fingerprint: u64,
        settings: &PoolSettings,
        prefer: Option<CancelKey>,
    ) -> Option<Box<ServerConn>> {
        debug_assert!(!self.counted);
        loop {
            let mut conn = {
                let mut st = self.pool.state();
                let preferred = prefer.and_then(|key| {
                    st.idle
                        .iter()
                        .position(|c| c.key == Some(key) && c.fingerprint == fingerprint)
                });
                let pos = match preferred {
                    Some(pos) => pos,
                    None => st.idle.iter().rposition(|c| c.fingerprint == fingerprint)?,
                };
                st.idle.remove(pos)
            }?;
            self.counted = true;
            let now = Tick::now();
            let healthy = !conn.expired(settings, now)
                && (!now.reached(conn.last_used, settings.server_check_delay)
                    || settings.server_check_query.is_empty()
                    // Rare (idle longer than server_check_delay): boxed, so that the
                    // query's future is not part of every checkout's.
                    || Box::pin(check(&mut conn, settings)).await);
            // Bytes left unread (see `release`) would be the next client's first answer.
            if healthy && conn.status == TransactionStatus::Idle && conn.read_buf.is_empty() {
                conn.set_state(super::ServerState::Active, now);
                return Some(conn);
            }
            self.discard_counted();
            tokio::spawn(conn.close());
        }
    }

    /// Reserves room for a new connection, closing an idle one of other startup parameters
    /// if the pool is full.
    pub fn reserve_new(&mut self) {
        debug_assert!(!self.counted);
        let evicted = {
            let mut st = self.pool.state();
            let evicted = if st.total >= self.pool.size() {
                st.idle.pop_front()
            } else {
                None
            };
            if evicted.is_none() {
                st.total += 1;
            }
            evicted
        };
        self.counted = true;
        if let Some(old) = evicted {
            tokio::spawn(old.close());
        }
    }

    /// Counts a connection about to be opened if the pool holds fewer than `limit`
    /// (`Pool::reserve_spare`).
    pub(super) fn reserve_below(&mut self, limit: usize) -> bool {
        debug_assert!(!self.counted);
        let mut st = self.pool.state();
        if st.total >= limit {
            return false;
        }
        st.total += 1;
        self.counted = true;
        true
    }

    fn discard_counted(&mut self) {
        if self.counted {
            self.pool.state().total -= 1;
            self.counted = false;
        }
    }

    /// Ends the lease. A connection at a boundary with nothing unread from the server is
    /// reset (rolled back first when in a transaction) in the background and becomes idle;
    /// the permit is held until then so the pool never has more than `pool_size`
    /// connections. Anything else is closed.
    pub fn release(mut self, conn: Box<ServerConn>, state: ReleaseState, settings: PoolSettings) {
        // Bytes the server sent that no one consumed (a client gone while its answer was
        // being written): the reset would read them as its own answer, and the next client
        // would get the reset's.
        let state = if conn.read_buf.is_empty() {
            state
        } else {
            ReleaseState::Dirty
        };
        let pool = self.pool.clone();
        let permit = self.permit.take();
        self.counted = false;
        conn.set_state(super::ServerState::Resetting, Tick::now());
        tokio::spawn(async move {
            match reset(conn, state, &settings).await {
                Some(mut conn) => {
                    conn.last_used = Tick::now();
                    conn.set_state(super::ServerState::Idle, conn.last_used);
                    let surplus = pool.state().keep(conn, pool.size());
                    if let Some(conn) = surplus {
                        tokio::spawn(conn.close());
                    }
                }
                None => {
                    pool.state().total -= 1;
                }
            }
            if let Some(permit) = permit {
                pool.give_back(permit);
            }
        });
    }

    /// Ends a transaction-pooling lease: a connection idle at a boundary, with nothing unread
    /// from the server, goes straight back to the pool (its session state is tracked, not
    /// reset); anything else is closed.
    pub fn return_idle(mut self, mut conn: Box<ServerConn>, at_boundary: bool) {
        // Unconsumed server bytes (see `release`) would be the next client's first answer.
        if !at_boundary || conn.status != TransactionStatus::Idle || !conn.read_buf.is_empty() {
            self.discard(conn);
            return;
        }
        conn.last_used = Tick::now();
        conn.set_state(super::ServerState::Idle, conn.last_used);
        self.counted = false;
        let surplus = self.pool.state().keep(conn, self.pool.size());
        if let Some(conn) = surplus {
            tokio::spawn(conn.close());
        }
        if let Some(permit) = self.permit.take() {
            self.pool.give_back(permit);
        }
    }

    /// Ends the lease and closes the connection (its server state cannot be trusted).
    pub fn discard(mut self, conn: Box<ServerConn>) {
        self.discard_counted();
        tokio::spawn(conn.close());
    }

    /// Closes a connection that may still be running a client's statement once it has ended
    /// (see `ServerConn::close_after_running`), then runs `after`: what the statement may
    /// have committed is known to be visible only then.
    pub fn discard_after_running(
        mut self,
        conn: Box<ServerConn>,
        limit: std::time::Duration,
        after: impl FnOnce() + Send + 'static,
    ) {
        self.discard_counted();
        tokio::spawn(async move {
            conn.close_after_running(limit).await;
            after();
        });
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // A lease dropped while counting a connection it never handed back (a failed connect,
        // a panicking session) gives its room back.
        self.discard_counted();
        if let Some(permit) = self.permit.take() {
            self.pool.give_back(permit);
        }
    }
}

/// Runs the health check, within `server_check_timeout`.
async fn check(conn: &mut ServerConn, settings: &PoolSettings) -> bool {
    let query = conn.simple_query(&settings.server_check_query);
    match tokio::time::timeout(settings.server_check_timeout, query).await {
        Ok(result) => result.is_ok(),
        Err(_) => {
            tracing::warn!(
                timeout = ?settings.server_check_timeout,
                "server health check got no answer; closing the connection"
            );
            false
        }
    }
}

async fn reset(
    mut conn: Box<ServerConn>,
    state: ReleaseState,
    settings: &PoolSettings,
) -> Option<Box<ServerConn>> {
    let status = match state {
        ReleaseState::Dirty => {
            conn.close().await;
            return None;
        }
        ReleaseState::Boundary(status) => status,
    };
    let timeout = std::time::Duration::from_secs(10);
    let work = async {
        if status != TransactionStatus::Idle {
            conn.simple_query("ROLLBACK").await?;
        }
        if !settings.server_reset_query.is_empty() {
            conn.simple_query(&settings.server_reset_query).await?;
        }
        Ok::<_, super::ServerError>(())
    };
    match tokio::time::timeout(timeout, work).await {
        // More after the reset's own ReadyForQuery: the reset read someone else's answer as
        // its own, and what it left would reach the next client.
        Ok(Ok(())) if conn.status == TransactionStatus::Idle && conn.read_buf.is_empty() => {
            Some(conn)
        }
        outcome => {
            tracing::warn!(?outcome, "server reset failed; closing the connection");
            conn.close().await;
            None
        }
    }
}

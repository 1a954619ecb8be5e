//! The gate between the replication feed and the cache of one database (doctrine rule 5):
//! while pgmemo cannot be sure it sees every write, no cached result is served or stored.
//! The feed (see `crate::invalidate`) opens the gate once its stream is connected and caught
//! up, after flushing what was cached before, and closes it the moment the stream is lost.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

use super::catalog::first_value;
use super::planner::Catalog;

/// The server's current WAL insert position, asked after a commit whose writes only the feed
/// will invalidate: the session bypasses the cache until the feed has applied that far
/// (read-your-writes). `None` when the server did not answer it.
pub async fn wal_insert_position<C: Catalog>(catalog: &mut C) -> Result<Option<u64>, C::Error> {
    let answer = catalog
        .ask("/* pgmemo wal position */ SELECT pg_catalog.pg_current_wal_insert_lsn()")
        .await?;
    Ok(first_value(answer)
        .and_then(|t| t.parse::<wire::replication::Lsn>().ok())
        .map(|lsn| lsn.0))
}

/// Where the feed of a database stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FeedState {
    /// No feed is used (`invalidation = proxy` or `ttl`): writes pgmemo sees invalidate, and
    /// the cache serves.
    NotUsed = 0,
    /// A feed is wanted but not connected and caught up, or `invalidation = auto` has not yet
    /// decided whether one runs: the cache serves nothing.
    Down = 1,
    /// The stream is live: every committed write reaches the cache.
    Live = 2,
}

impl FeedState {
    /// Name for `SHOW CACHE`, `SHOW REPLICATION` and metrics.
    pub fn name(self) -> &'static str {
        match self {
            FeedState::NotUsed => "not_used",
            FeedState::Down => "down",
            FeedState::Live => "live",
        }
    }
}

/// Shared between the feed task and every session of the database.
#[derive(Debug, Default)]
pub struct FeedGate {
    state: AtomicU8,
    /// WAL position up to which the stream's invalidations have been applied.
    applied_lsn: AtomicU64,
    /// The stream carries DDL (pgmemo's event trigger is installed): DDL run anywhere,
    /// inside `DO` or functions too, reaches the cache through it.
    sees_ddl: AtomicBool,
}

impl FeedGate {
    /// The state now.
    #[inline]
    pub fn state(&self) -> FeedState {
        match self.state.load(Ordering::Acquire) {
            1 => FeedState::Down,
            2 => FeedState::Live,
            _ => FeedState::NotUsed,
        }
    }

    /// Whether results may be served and stored.
    #[inline]
    pub fn allows_cache(&self) -> bool {
        self.state() != FeedState::Down
    }

    /// Sets the state (the feed task does).
    pub fn set(&self, state: FeedState) {
        self.state.store(state as u8, Ordering::Release);
    }

    /// Records whether the live stream carries DDL (the feed task does).
    pub fn set_sees_ddl(&self, sees: bool) {
        self.sees_ddl.store(sees, Ordering::Release);
    }

    /// Whether DDL made anywhere reaches the cache through a live stream.
    pub fn sees_ddl(&self) -> bool {
        self.state() == FeedState::Live && self.sees_ddl.load(Ordering::Acquire)
    }

    /// Notes that every commit up to `lsn` has been applied.
    pub fn applied(&self, lsn: u64) {
        self.applied_lsn.fetch_max(lsn, Ordering::AcqRel);
    }

    /// The WAL position applied so far.
    pub fn applied_lsn(&self) -> u64 {
        self.applied_lsn.load(Ordering::Acquire)
    }

    /// Whether a session whose writes were left to the feed up to `lsn` must still bypass
    /// the cache: the feed has not applied them yet. Not once the feed is given up for the
    /// proxy's invalidation (`NotUsed`): the database was flushed then.
    pub fn awaits(&self, lsn: u64) -> bool {
        lsn > self.applied_lsn() && self.state() != FeedState::NotUsed
    }
}

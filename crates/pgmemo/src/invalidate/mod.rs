//! Invalidation from writes pgmemo does not relay: step 6 of the query path, running beside it.
//! Writes that pass through pgmemo are applied by the caching client at COMMIT; everything else
//! (other applications, triggers, functions, cron jobs, other pgmemo instances) reaches the cache
//! here, through PostgreSQL's logical replication stream.
//!
//! - `proxy`: applies the committed effects of writes pgmemo relayed (both pool modes).
//! - `mode`: decides at start whether a feed runs (`invalidation = auto | replication | proxy |
//!   ttl`), probing the upstream for `auto`.
//! - `upstream`: opens the replication connection and prepares it (publication, temporary slot).
//! - `consumer`: the stream's meaning, without I/O: which tables a transaction wrote, what to
//!   acknowledge and when.
//! - `replication`: one task per database: connect, flush, go live, consume, reconnect.
//! - `ddl`: the event trigger that puts DDL into the stream.
//! - `status`: what each feed reports to `SHOW REPLICATION` and the metrics.
//!
//! The cache side of the contract is [`crate::cache::feed::FeedGate`]: a feed sets it `Down`
//! the moment its stream is lost, flushes the database once a new stream is established, and
//! only then sets it `Live`.

mod consumer;
mod ddl;
mod mode;
pub mod proxy;
mod replication;
mod status;
mod upstream;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::task::TaskTracker;

pub use consumer::{Consumer, Effect};
pub use status::FeedStatus;

use crate::pool::ServerError;
use crate::shared::Shared;

/// Why a feed's stream ended or could not be established. Every one of them closes the gate
/// and leads to a reconnect.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("invalid replication message: {0}")]
    Protocol(#[from] wire::WireError),
    #[error("the server ended the replication stream")]
    StreamEnded,
    #[error("the replication stream said nothing for {0:?}, though asked to every second")]
    Silent(std::time::Duration),
    #[error("unexpected answer to {command}: {detail}")]
    Unexpected {
        command: &'static str,
        detail: String,
    },
    #[error("could not connect within {0:?}")]
    Timeout(std::time::Duration),
    #[error("a publication changed ({0}): the stream is made again to check it")]
    PublicationChanged(String),
    #[error("the upstream URL names no user for the replication connection")]
    NoUser,
    #[error("publication \"{0}\" does not exist in this database (invalidation = \"auto\" never creates it)")]
    NoPublication(String),
    #[error("publication \"{0}\" does not show every write to the feed: it lacks {1}")]
    PartialPublication(String, String),
    #[error(
        "not creating publication FOR ALL TABLES: UPDATE and DELETE would then fail on tables \
         without a replica identity ({0}); add primary keys or REPLICA IDENTITY FULL, or create \
         the publication yourself"
    )]
    MissingReplicaIdentity(String),
}

/// The feeds of this pgmemo: their tasks (so shutdown can wait until every replication
/// connection, and with it every temporary slot, is gone) and their status.
pub struct Feeds {
    tasks: TaskTracker,
    list: Mutex<Vec<Arc<FeedStatus>>>,
    /// Part of every slot name: slots of several pgmemo instances (even in one process) on one
    /// server must not collide.
    instance: u64,
    next_slot: AtomicU64,
    /// Time from a commit on the upstream to the moment its invalidation was applied (entries
    /// it made stale are no longer served), for every commit that invalidated something. Based
    /// on the upstream's commit timestamp and this host's clock, so clock skew is included.
    pub staleness: crate::metrics::Histogram,
}

impl Default for Feeds {
    fn default() -> Feeds {
        Feeds {
            tasks: TaskTracker::new(),
            list: Mutex::new(Vec::new()),
            instance: rand::random::<u64>() & 0xFFFF_FFFF,
            next_slot: AtomicU64::new(1),
            staleness: crate::metrics::Histogram::default(),
        }
    }
}

impl Feeds {
    /// Every feed started so far, in start order.
    pub fn all(&self) -> Vec<Arc<FeedStatus>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A slot name no other feed of any pgmemo uses: `pgmemo_<pid>_<instance>_<n>`.
    fn slot_name(&self) -> String {
        format!(
            "pgmemo_{}_{:x}_{}",
            std::process::id(),
            self.instance,
            self.next_slot.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn add(&self, status: Arc<FeedStatus>) {
        self.list
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(status);
    }

    /// Waits until every feed task has stopped (after `stop_accepting` was cancelled), so that
    /// no replication connection outlives shutdown.
    pub async fn stopped(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// Starts what `invalidation` asks for: nothing for `proxy` and `ttl`; for `replication` a feed
/// per database (gates are `Down` from now on until each feed is live); for `auto` a probe of
/// the upstream that decides between the two, with every gate `Down` until it has (a feed may
/// be coming, so pgmemo cannot yet count on seeing every write). Returns at once; the work runs
/// in tasks tracked by [`Feeds`]. Called before the first client is accepted, so that no
/// database is used before its gate is set.
pub fn start(shared: &Arc<Shared>) {
    use crate::config::Invalidation;
    match shared.config().invalidation {
        Invalidation::Proxy | Invalidation::Ttl => {}
        Invalidation::Replication => {
            let databases = shared.cache.follow_databases();
            shared
                .feeds
                .tasks
                .spawn(supervise(Arc::clone(shared), databases));
        }
        Invalidation::Auto => {
            if let Some(reason) = mode::unavailable_without_asking(&shared.config()) {
                mode::log_unavailable(&reason);
                return;
            }
            shared.cache.hold_until_feed_decided();
            let shared = Arc::clone(shared);
            let tracker = shared.feeds.tasks.clone();
            tracker.spawn(async move {
                let available = mode::replication_available(&shared).await;
                if shared.stop_accepting.is_cancelled() {
                    // Shutting down: the gates stay down for the sessions still draining.
                    return;
                }
                if available {
                    let databases = shared.cache.follow_databases();
                    supervise(shared, databases).await;
                } else {
                    shared.cache.no_feed();
                }
            });
        }
    }
}

/// Starts one feed per database, for those known now and each one first used later.
async fn supervise(
    shared: Arc<Shared>,
    mut databases: tokio::sync::mpsc::UnboundedReceiver<Arc<crate::cache::DatabaseCache>>,
) {
    loop {
        let db = tokio::select! {
            _ = shared.stop_accepting.cancelled() => return,
            db = databases.recv() => match db {
                Some(db) => db,
                None => return,
            },
        };
        let status = Arc::new(FeedStatus::new(
            db,
            shared.config().replication_publication.clone(),
        ));
        shared.feeds.add(Arc::clone(&status));
        shared
            .feeds
            .tasks
            .spawn(replication::run(Arc::clone(&shared), status));
    }
}

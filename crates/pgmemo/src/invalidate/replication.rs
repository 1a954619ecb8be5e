//! The feed of one database: a task that keeps a logical replication stream open and applies
//! it to the database's cache.
//!
//! Each round: connect (`replication=database`), make sure the publication exists, install the
//! DDL trigger when possible, create a TEMPORARY slot, flush the database (writes may have been
//! missed while no stream was open), `START_REPLICATION` from the slot's consistent point, open
//! the gate (`Live`) and consume. Any error or end of stream closes the gate at once (`Down`:
//! the cache serves nothing) and the next round starts after a backoff of 100 ms doubling up to
//! 5 s. Shutdown (`stop_accepting`) ends the task and closes the connection, which drops the
//! slot.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::time::Instant;
use wire::backend::BackendMessage;
use wire::replication::{Lsn, StandbyStatusUpdate, WalSenderMessage};

use super::consumer::{Consumer, Effect};
use super::status::FeedStatus;
use super::{ddl, upstream, FeedError};
use crate::cache::feed::FeedState;
use crate::config::Invalidation;
use crate::pool::ServerConn;
use crate::shared::Shared;

/// First wait before reconnecting.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait before reconnecting.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A status update goes out at least this often, even when nothing happens.
const STATUS_INTERVAL: Duration = Duration::from_secs(1);
/// A stream that says nothing for this long is taken for lost (a network that went silent,
/// a walsender that hangs): the gate closes and a new stream is made. Every status update asks
/// the server for an answer, so a live stream is never silent for more than about
/// `STATUS_INTERVAL`, however quiet the database.
const SILENCE_LIMIT: Duration = Duration::from_secs(10);
/// After a commit or keepalive, the acknowledgement waits this long for more to batch.
const ACK_DELAY: Duration = Duration::from_millis(20);

/// Runs the feed of `status.db` until shutdown.
pub async fn run(shared: Arc<Shared>, status: Arc<FeedStatus>) {
    let db = Arc::clone(&status.db);
    let stop = shared.stop_accepting.clone();
    let mut backoff = MIN_BACKOFF;
    loop {
        db.feed.set(FeedState::Down);
        let mut went_live = false;
        let ended = tokio::select! {
            _ = stop.cancelled() => break,
            ended = stream(&shared, &status, &mut went_live) => ended,
        };
        db.feed.set(FeedState::Down);
        status.set_slot(None);
        if went_live {
            backoff = MIN_BACKOFF;
        }
        match ended {
            Ok(()) => break,
            Err(
                e @ (FeedError::NoPublication(_)
                | FeedError::PartialPublication(..)
                | FeedError::MissingReplicaIdentity(_)),
            ) if shared.config().invalidation == Invalidation::Auto => {
                // `auto` falls back to proxy for this database: its cache serves, writes from
                // elsewhere are seen only by TTL.
                tracing::warn!(database = %db.name, reason = %e,
                    "invalidation = auto: no replication feed for this database; writes from elsewhere are seen only by TTL");
                status.set_error(e.to_string());
                // Commits pgmemo left to the feed while it was live (DO, CALL, volatile
                // functions) and the feed never applied: flushed, as the proxy would have.
                db.generations.invalidate_database();
                db.forget_plans();
                db.feed.set(FeedState::NotUsed);
                return;
            }
            Err(e) => {
                tracing::warn!(database = %db.name, error = %e, retry_in = ?backoff,
                    "replication feed down: the cache of this database serves nothing until it is back");
                status.set_error(e.to_string());
            }
        }
        status.count_reconnect();
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
    db.feed.set(FeedState::Down);
    tracing::debug!(database = %db.name, "replication feed stopped");
}

/// One stream, from connecting to its end. `Ok` only on shutdown.
async fn stream(
    shared: &Arc<Shared>,
    status: &FeedStatus,
    went_live: &mut bool,
) -> Result<(), FeedError> {
    let db = &status.db;
    let mut conn = upstream::connect(shared, &db.host, db.port, &db.dbname, true).await?;
    let create = shared.config().invalidation == Invalidation::Replication;
    upstream::ensure_publication(&mut conn, &status.publication, create).await?;
    let messages = ddl::install(&mut conn, &db.dbname).await?;
    let slot = shared.feeds.slot_name();
    let start = upstream::create_slot(&mut conn, &slot).await?;
    status.set_slot(Some(slot.clone()));
    status.restart_at(start.0);
    // Writes committed before the consistent point may not have been seen: flush. Reads whose
    // snapshot predates this are not stored; the gate is still down, so none is served.
    db.generations.invalidate_database();
    db.forget_plans();
    shared
        .cache
        .stats
        .database_invalidations
        .fetch_add(1, Ordering::Relaxed);
    upstream::start_replication(&mut conn, &slot, start, &status.publication, messages).await?;
    db.feed.applied(start.0);
    db.feed.set_sees_ddl(messages);
    db.feed.set(FeedState::Live);
    *went_live = true;
    tracing::info!(database = %db.name, slot = %slot, start = %start, "replication feed live");
    consume(shared, status, &mut conn, start).await
}

/// Reads the stream and applies it until it fails or shutdown.
async fn consume(
    shared: &Arc<Shared>,
    status: &FeedStatus,
    conn: &mut ServerConn,
    start: Lsn,
) -> Result<(), FeedError> {
    let stop = shared.stop_accepting.clone();
    let mut consumer = Consumer::new(start).relations_mean_ddl(!status.db.feed.sees_ddl());
    let mut tick = tokio::time::interval(STATUS_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ack_due: Option<Instant> = None;
    let mut acked = start;
    let mut heard = Instant::now();
    loop {
        let frame = tokio::select! {
            biased;
            _ = stop.cancelled() => {
                let _ = conn.send(&wire::frontend::terminate()).await;
                return Ok(());
            }
            _ = tick.tick() => {
                if heard.elapsed() >= SILENCE_LIMIT {
                    return Err(FeedError::Silent(SILENCE_LIMIT));
                }
                acked = send_status(conn, &consumer, true).await?;
                ack_due = None;
                continue;
            }
            _ = sleep_until(ack_due) => {
                acked = send_status(conn, &consumer, false).await?;
                ack_due = None;
                continue;
            }
            frame = conn.read_frame() => frame?,
        };
        heard = Instant::now();
        let payload = match BackendMessage::decode(frame)? {
            BackendMessage::CopyData(payload) => payload,
            BackendMessage::ErrorResponse(e) => {
                return Err(crate::pool::ServerError::Server(e).into())
            }
            BackendMessage::CopyDone => return Err(FeedError::StreamEnded),
            BackendMessage::NoticeResponse(_) | BackendMessage::ParameterStatus { .. } => continue,
            other => {
                return Err(FeedError::Unexpected {
                    command: "START_REPLICATION",
                    detail: format!("{other:?}"),
                })
            }
        };
        let msg = WalSenderMessage::decode(payload)?;
        match &msg {
            WalSenderMessage::XLogData(x) => {
                status.received(x.wal_start.0, x.wal_end.0, x.send_time)
            }
            WalSenderMessage::PrimaryKeepalive(k) => {
                status.received(k.wal_end.0, k.wal_end.0, k.send_time)
            }
        }
        let effect = consumer.on_message(msg)?;
        apply(shared, status, &effect);
        if let Some(tag) = effect.publication_changed {
            return Err(FeedError::PublicationChanged(tag));
        }
        if effect.reply_now {
            acked = send_status(conn, &consumer, false).await?;
            ack_due = None;
        } else if consumer.applied() > acked && ack_due.is_none() {
            ack_due = Some(Instant::now() + ACK_DELAY);
        }
    }
}

/// Sleeps until `due`, or forever when there is nothing due.
async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// Applies one message's effect to the cache of the database.
fn apply(shared: &Shared, status: &FeedStatus, effect: &Effect) {
    let db = &status.db;
    let stats = &shared.cache.stats;
    if effect.flush_database {
        db.generations.invalidate_database();
        db.forget_plans();
        stats.database_invalidations.fetch_add(1, Ordering::Relaxed);
    }
    if !effect.invalidate.is_empty() {
        db.generations.invalidate_tables(&effect.invalidate);
        stats
            .invalidations
            .fetch_add(effect.invalidate.len() as u64, Ordering::Relaxed);
    }
    if effect.committed {
        status.count_transaction();
    }
    if let Some(commit_time) = effect.commit_time {
        if effect.flush_database || !effect.invalidate.is_empty() {
            shared.feeds.staleness.observe(micros_since(commit_time));
        }
    }
    // Only after the invalidations: a session waiting for this LSN (read-your-writes) must not
    // find the old entries still fresh.
    if let Some(lsn) = effect.applied {
        db.feed.applied(lsn.0);
    }
}

/// Tells the server how far the stream has been applied; returns the position acknowledged.
/// `ask`: the server answers at once with a keepalive (the stream's proof of life).
async fn send_status(
    conn: &mut ServerConn,
    consumer: &Consumer,
    ask: bool,
) -> Result<Lsn, FeedError> {
    let applied = consumer.applied();
    let update = StandbyStatusUpdate {
        written: consumer.received().max(applied),
        flushed: applied,
        applied,
        client_time: wire::replication::system_to_pg_time(std::time::SystemTime::now()),
        reply_requested: ask,
    };
    let mut out = BytesMut::new();
    update.encode(&mut out);
    conn.send(&out).await?;
    Ok(applied)
}

/// Microseconds from `pg_time` (the upstream's clock, µs since 2000-01-01) to now on this
/// host's clock; 0 when the upstream's clock is ahead.
fn micros_since(pg_time: i64) -> u64 {
    let now = wire::replication::system_to_pg_time(std::time::SystemTime::now());
    u64::try_from(now.saturating_sub(pg_time)).unwrap_or(0)
}

//! `invalidation = "auto"`: whether the upstream can give pgmemo a replication feed. Asked once
//! at start (retrying while the upstream cannot be reached); the answer holds until restart.

use std::sync::Arc;
use std::time::Duration;

use super::{upstream, FeedError};
use crate::pool::ServerError;
use crate::shared::Shared;

/// Waits between probes while the upstream cannot be reached.
const RETRY: Duration = Duration::from_secs(1);

/// True when the upstream has `wal_level = logical`, the configured user may replicate
/// (REPLICATION or superuser) and pg_hba.conf lets it open a replication connection. Otherwise
/// logs once why writes from elsewhere are seen only by TTL, and returns false. Returns false
/// on shutdown too.
pub async fn replication_available(shared: &Arc<Shared>) -> bool {
    loop {
        let probe = tokio::select! {
            _ = shared.stop_accepting.cancelled() => return false,
            probe = probe(shared) => probe,
        };
        match probe {
            Ok(None) => {
                tracing::info!("invalidation = auto: using the replication feed");
                return true;
            }
            Ok(Some(reason)) => {
                tracing::warn!(
                    reason = %reason,
                    "invalidation = auto: no replication feed; writes from elsewhere are seen only by TTL"
                );
                return false;
            }
            Err(e) => {
                tracing::debug!(error = %e, "invalidation = auto: upstream not reachable yet");
                tokio::select! {
                    _ = shared.stop_accepting.cancelled() => return false,
                    _ = tokio::time::sleep(RETRY) => {}
                }
            }
        }
    }
}

/// `Ok(None)` when a feed is possible, `Ok(Some(reason))` when it is not, `Err` when the
/// upstream could not be asked.
async fn probe(shared: &Arc<Shared>) -> Result<Option<String>, FeedError> {
    let config = shared.config();
    if config.upstream.user.is_none() {
        return Ok(Some("the upstream URL names no user".into()));
    }
    let host = config.upstream.host.clone();
    let port = config.upstream.port;
    let dbname = config
        .upstream
        .database
        .clone()
        .unwrap_or_else(|| "postgres".to_owned());
    drop(config);
    let mut conn = match upstream::connect(shared, &host, port, &dbname, false).await {
        Ok(conn) => conn,
        Err(FeedError::Server(ServerError::Server(e))) => {
            return Ok(Some(format!("cannot log in: {}", e.message)))
        }
        Err(e) => return Err(e),
    };
    let rows = conn
        .query_text_rows(
            "SELECT current_setting('wal_level'), rolsuper OR rolreplication \
             FROM pg_catalog.pg_roles WHERE rolname = current_user",
        )
        .await?;
    conn.close().await;
    let row = rows.into_iter().next().unwrap_or_default();
    let wal_level = row.first().cloned().flatten().unwrap_or_default();
    if wal_level != "logical" {
        return Ok(Some(format!(
            "the upstream has wal_level = {wal_level}, not logical"
        )));
    }
    if row.get(1).cloned().flatten().as_deref() != Some("t") {
        return Ok(Some(
            "the upstream user has neither REPLICATION nor superuser".into(),
        ));
    }
    match upstream::connect(shared, &host, port, &dbname, true).await {
        Ok(conn) => {
            conn.close().await;
            Ok(None)
        }
        Err(FeedError::Server(ServerError::Server(e))) => Ok(Some(format!(
            "replication connection refused: {}",
            e.message
        ))),
        Err(e) => Err(e),
    }
}

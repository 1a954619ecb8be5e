//! `invalidation = "auto"`: whether the upstream can give pgmemo a replication feed. Asked once
//! at start (retrying while the upstream cannot be reached or refuses logins for now); the
//! answer holds until restart.

use std::sync::Arc;
use std::time::Duration;

use super::{upstream, FeedError};
use crate::pool::ServerError;
use crate::shared::Shared;

/// First wait before probing again while the upstream cannot be reached or refuses logins for
/// now.
const MIN_RETRY: Duration = Duration::from_millis(250);
/// Longest wait between probes: the answer decides for pgmemo's whole life, so it is asked until
/// it comes, but a server that stays away is not hammered.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// True when the upstream has `wal_level = logical`, the configured user may replicate
/// (REPLICATION or superuser) and pg_hba.conf lets it open a replication connection. Otherwise
/// logs once why writes from elsewhere are seen only by TTL, and returns false. Returns false
/// on shutdown too.
///
/// Only an answer that will not change decides: a server that cannot be reached, or that
/// refuses the login for now (starting up, shutting down, out of connection slots or WAL
/// senders, see [`refused_for_now`]), is asked again after a backoff of 250 ms doubling up to
/// 5 s. Taking such a moment for "no feed, ever" would leave pgmemo blind to writes made
/// elsewhere for its whole life.
pub async fn replication_available(shared: &Arc<Shared>) -> bool {
    let mut retry = MIN_RETRY;
    let mut warned = false;
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
                log_unavailable(&reason);
                return false;
            }
            Err(e) => {
                if warned {
                    tracing::debug!(error = %e, retry_in = ?retry, "invalidation = auto: upstream cannot be asked yet");
                } else {
                    warned = true;
                    tracing::warn!(error = %e, retry_in = ?retry,
                        "invalidation = auto: upstream cannot be asked yet whether it gives a replication feed; asking again");
                }
                tokio::select! {
                    _ = shared.stop_accepting.cancelled() => return false,
                    _ = tokio::time::sleep(retry) => {}
                }
                retry = (retry * 2).min(MAX_RETRY);
            }
        }
    }
}

/// Why no feed is possible, when the configuration alone says so: then `auto` decides at
/// start without holding the cache while it asks.
pub fn unavailable_without_asking(config: &crate::Config) -> Option<String> {
    config
        .upstream
        .user
        .is_none()
        .then(|| "the upstream URL names no user".to_owned())
}

/// Tells the operator, once, that `auto` runs without a feed and why.
pub fn log_unavailable(reason: &str) {
    tracing::warn!(
        reason = %reason,
        "invalidation = auto: no replication feed; writes from elsewhere are seen only by TTL"
    );
}

/// `Ok(None)` when a feed is possible, `Ok(Some(reason))` when it is not, `Err` when the
/// upstream could not be asked (also when it refused a login for now).
async fn probe(shared: &Arc<Shared>) -> Result<Option<String>, FeedError> {
    let config = shared.config();
    if let Some(reason) = unavailable_without_asking(&config) {
        return Ok(Some(reason));
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
        Err(FeedError::Server(ServerError::Server(e))) if !refused_for_now(&e) => {
            return Ok(Some(format!("cannot log in: {}", e.message)))
        }
        Err(e) => return Err(e),
    };
    let rows = conn
        .simple_query_rows(
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
        Err(FeedError::Server(ServerError::Server(e))) if !refused_for_now(&e) => Ok(Some(
            format!("replication connection refused: {}", e.message),
        )),
        Err(e) => Err(e),
    }
}

/// Whether a login refused with `e` may succeed later without anyone changing the
/// configuration: connection exceptions (class 08), insufficient resources (class 53: too
/// many clients, slots reserved for superusers, a role's or database's connection limit,
/// `max_wal_senders` reached while an old instance's WAL senders exit, out of memory or disk)
/// and a server starting up, shutting down or in recovery (57P01, 57P02, 57P03). Everything
/// else (no such role, a wrong password, pg_hba.conf, no REPLICATION) holds until someone
/// changes it, which takes a restart of pgmemo to notice.
fn refused_for_now(e: &wire::ErrorResponse) -> bool {
    use wire::sqlstate::{ADMIN_SHUTDOWN, CANNOT_CONNECT_NOW};
    /// `crash_shutdown`: the server is reinitializing after a backend crashed.
    const CRASH_SHUTDOWN: &str = "57P02";
    let code = e.code.as_str();
    code.starts_with("08")
        || code.starts_with("53")
        || [ADMIN_SHUTDOWN, CRASH_SHUTDOWN, CANNOT_CONNECT_NOW].contains(&code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(code: &str) -> wire::ErrorResponse {
        wire::ErrorResponse::fatal(code, "refused")
    }

    #[test]
    fn refusals_that_pass_are_told_from_those_that_stay() {
        // Starting up or in recovery, shutting down, too many clients or WAL senders, a
        // connection that failed: ask again.
        for code in [
            "57P03", "57P01", "57P02", "53300", "53200", "08006", "08P01",
        ] {
            assert!(refused_for_now(&refusal(code)), "{code}");
        }
        // No such role or database, a wrong password, pg_hba.conf, no REPLICATION: decided.
        for code in ["28000", "28P01", "3D000", "42501", "XX000"] {
            assert!(!refused_for_now(&refusal(code)), "{code}");
        }
    }
}

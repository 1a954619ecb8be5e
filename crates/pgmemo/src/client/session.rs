//! One client's life: open (TLS, startup), log in, announce the session (ParameterStatus,
//! pgmemo's own BackendKeyData, ReadyForQuery), relay, and give the server connection back in a
//! state no other client can notice.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::BytesMut;
use wire::{backend, sqlstate, ErrorResponse};

use super::deadline::LoginDeadline;
use super::login::{login, pool_settings};
use super::relay::{self, End};
use super::startup::{self, Opening};
use super::{ClientConn, ClientError};
use crate::config::PoolMode;
use crate::net::{FastSocket, Peer};
use crate::registry::ClientInfo;
use crate::shared::Shared;
use crate::stats::Stats;

/// Serves a connection from accept to close.
pub async fn serve(socket: FastSocket, peer: Peer, shared: Arc<Shared>) {
    // One deadline for the startup and the authentication together.
    let deadline = LoginDeadline::start(shared.config().client_login_timeout.0);
    // Until the client is logged in it has no transaction to finish: once the shutdown grace
    // period is over it is closed like every other session, instead of holding the shutdown up
    // for client_login_timeout.
    let opened = tokio::select! {
        opened = tokio::time::timeout_at(deadline.instant(), startup::open(socket, peer, &shared)) => opened,
        _ = shared.terminate_sessions.cancelled() => {
            tracing::info!(%peer, "shutting down: closing a client that had not sent its startup packet");
            return;
        }
    };
    let (mut client, startup) = match opened {
        Err(_) => {
            tracing::info!(%peer, "client did not send a startup packet in time (client_login_timeout)");
            return;
        }
        Ok(Ok(Opening::Cancel)) => return,
        Ok(Ok(Opening::Session(client, startup))) => (client, startup),
        Ok(Err((client, e))) => {
            report(client, &e, peer, &shared).await;
            return;
        }
    };
    let user = startup.param("user").unwrap_or_default().to_owned();
    let database = startup
        .param("database")
        .filter(|d| !d.is_empty())
        .unwrap_or(&user)
        .to_owned();
    if database == crate::admin::ADMIN_DATABASE {
        crate::admin::serve(client, startup, shared, deadline).await;
        return;
    }

    // Every step of the login is bounded: authentication by the deadline, the wait for a pool
    // place by query_wait_timeout, opening a server by server_connect_timeout.
    let logged_in = tokio::select! {
        r = login(&mut client, &shared, &startup, deadline) => r,
        _ = shared.terminate_sessions.cancelled() => {
            Err(ClientError::Pool(crate::pool::PoolError::Closed))
        }
    };
    let (route, lease, mut server) = match logged_in {
        Ok(v) => v,
        Err(e) => {
            Stats::bump(&shared.stats.login_failures);
            tracing::info!(%peer, %user, %database, error = %e, "login failed");
            report(Some(client), &e, peer, &shared).await;
            return;
        }
    };

    let transaction_pooling = shared.config().pool_mode == PoolMode::Transaction;
    let mut txn_state = None;
    if transaction_pooling {
        let prepared = match super::transaction::client_state(&route, &shared.pools.statements) {
            Ok(state) => super::transaction::prepare_login_server(&state, &mut server)
                .await
                .map(|()| state),
            Err(e) => Err(ClientError::Refused(e)),
        };
        match prepared {
            Ok(state) => txn_state = Some(state),
            Err(e) => {
                report(Some(client), &e, peer, &shared).await;
                lease.return_idle(server, true);
                return;
            }
        }
    }

    let registration = shared.cancels.register();
    server.attach_cancel(&registration.slot);
    let mut hello = BytesMut::with_capacity(512);
    for (k, v) in &server.params {
        hello.extend_from_slice(&backend::parameter_status(k, v));
    }
    hello.extend_from_slice(&backend::backend_key_data(registration.key));
    hello.extend_from_slice(&backend::ready_for_query(server.status));
    if client.send(&hello).await.is_err() {
        super::give_back_unused(lease, server, &shared.config());
        return;
    }
    let started = Instant::now();
    tracing::info!(%peer, %user, %database, tls = client.stream.is_tls(), "client logged in");
    let _listed = shared.clients.add(ClientInfo {
        peer,
        user: user.clone(),
        database: database.clone(),
        tls: client.stream.is_tls(),
        connected_at: SystemTime::now(),
        admin: false,
    });

    if let Some(mut state) = txn_state {
        // The client may have sent a cancel as soon as it had its key.
        let settled = !registration.slot.detach() || registration.slot.settle().await;
        lease.return_idle(server, settled);
        let end =
            super::transaction::run(&mut client, &shared, &route, &mut state, &registration.slot)
                .await;
        drop(registration);
        tell_why_session_ends(&mut client, &end, &shared).await;
        tracing::info!(
            %peer, %user, database = %route.client_database,
            duration_ms = started.elapsed().as_millis() as u64,
            reason = ?end,
            "client closed"
        );
        return;
    }

    let max_message = shared.config().max_message_size.0;
    let caching = shared.config().cache_on_for(&route.client_database);
    // The database whose cache must be invalidated once the server has ended a write the
    // client left unanswered.
    let mut after_running = None;
    let (end, state) = if caching {
        let db = shared
            .cache
            .database(&route.key.host, route.key.port, &route.key.database);
        let mut session = super::cached::CacheSession::new(
            db,
            &route.client_database,
            Arc::clone(&registration.slot),
        );
        let ended =
            super::cached::run(&mut client, &mut server, &shared, max_message, &mut session).await;
        if session.writes_unanswered {
            after_running = Some(Arc::clone(&session.db));
        }
        ended
    } else {
        let _untracked =
            shared
                .cache
                .untracked_session(&route.key.host, route.key.port, &route.key.database);
        relay::run(&mut client, &mut server, &shared, max_message).await
    };
    // A cancel on its way to this server must not reach the next client's query.
    let settled = !registration.slot.detach() || registration.slot.settle().await;
    drop(registration);

    let settings = pool_settings(&shared.config());
    // The server goes back before the client is told anything: a client that does not read
    // must not hold it.
    match &end {
        End::ServerGone { .. } => lease.discard(server),
        _ if after_running.is_some() => {
            Stats::bump(&shared.stats.servers_closed_dirty);
            let (shared, db) = (Arc::clone(&shared), after_running.take().expect("checked"));
            lease.discard_after_running(server, UNANSWERED_WRITE_LIMIT, move || {
                super::cached::invalidate_everything(&shared, &db);
            });
        }
        _ => {
            if let End::ClientGone(Some(e)) = &end {
                tracing::debug!(%peer, error = %e, "client connection failed");
            }
            if state == crate::pool::ReleaseState::Dirty {
                Stats::bump(&shared.stats.servers_closed_dirty);
            }
            if settled {
                lease.release(server, state, settings);
            } else {
                lease.discard(server);
            }
        }
    }
    tell_why_session_ends(&mut client, &end, &shared).await;
    tracing::info!(
        %peer, %user, database = %route.client_database,
        duration_ms = started.elapsed().as_millis() as u64,
        reason = ?end,
        "client closed"
    );
}

/// Tells the client why its session ends, when pgmemo (not the server) has something to say:
/// the server vanished without a FATAL of its own, shutdown, or a protocol violation.
async fn tell_why_session_ends(client: &mut ClientConn, end: &End, shared: &Shared) {
    // Best effort: a client that does not read gets no longer than this.
    let _ = tokio::time::timeout(FAREWELL_TIMEOUT, farewell(client, end, shared)).await;
}

/// How long a session's last words to its client may take (a client that does not read
/// must not hold the session, nor a server when there still is one).
pub(super) const FAREWELL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long pgmemo waits for a server to end a write its client left unanswered before it
/// closes the connection anyway (and invalidates again, without knowing whether the write
/// committed yet).
pub(super) const UNANSWERED_WRITE_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

async fn farewell(client: &mut ClientConn, end: &End, shared: &Shared) {
    match end {
        End::ServerGone {
            fatal_forwarded: false,
        } => {
            client
                .send_error(
                    &ErrorResponse::fatal(
                        sqlstate::CONNECTION_FAILURE,
                        "server closed the connection unexpectedly",
                    )
                    .with_hint("The server may have been restarted; reconnect to continue."),
                )
                .await;
        }
        End::Shutdown => {
            client
                .send_error(
                    &ErrorResponse::fatal(
                        sqlstate::ADMIN_SHUTDOWN,
                        "terminating connection due to administrator command",
                    )
                    .with_detail("pgmemo is shutting down."),
                )
                .await;
        }
        End::ClientProtocol(e) => {
            Stats::bump(&shared.stats.protocol_errors);
            if let Some(err) = ClientError::Protocol(e.clone()).to_error_response() {
                client.send_error(&err).await;
            }
        }
        _ => {}
    }
}

/// Answers the opening packets of a connection that cannot be served (SSLRequest with 'N',
/// then the StartupMessage with `error`), the way PostgreSQL refuses a client it has no room
/// for: after the startup packet, so every client library shows the message.
pub async fn refuse(socket: FastSocket, peer: Peer, shared: &Arc<Shared>, error: ErrorResponse) {
    let login_timeout = shared.config().client_login_timeout.0;
    let opened = tokio::time::timeout(login_timeout, startup::open(socket, peer, shared)).await;
    if let Ok(Ok(Opening::Session(mut client, _))) = opened {
        client.send_error(&error).await;
    }
}

async fn report(client: Option<ClientConn>, e: &ClientError, peer: Peer, shared: &Shared) {
    if let ClientError::Protocol(_) = e {
        Stats::bump(&shared.stats.protocol_errors);
    }
    match e {
        ClientError::Disconnected | ClientError::Io(_) => {
            tracing::debug!(%peer, error = %e, "client went away during startup");
        }
        _ => tracing::info!(%peer, error = %e, "client refused"),
    }
    if let (Some(mut client), Some(err)) = (client, e.to_error_response()) {
        client.send_error(&err).await;
    }
}

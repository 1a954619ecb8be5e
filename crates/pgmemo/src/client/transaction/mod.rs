//! Step 2 of the query path under `pool_mode = transaction`: a client holds a server
//! connection only from the first message of a transaction (or autocommit statement) until
//! the server is idle again, and its session state lives here instead of on a server: its
//! prepared statements (mapped onto pgmemo's shared server-side ones, `commands` and
//! `requests`), its unnamed statement, and its settings (replayed on whichever server it gets).
//!
//! While attached, two pumps run in the session's task as in session pooling: `requests`
//! translates client messages, `responses` matches answers against the queue in `link`.

mod cache;
mod commands;
mod link;
mod local;
mod plain;
mod promote;
mod requests;
mod responses;
mod shape;

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use wire::backend::TransactionStatus;
use wire::{sqlstate, ErrorResponse, Frame, FrameHeader, WireError};

use super::login::{open_authenticated, pool_settings, Route};
use super::quiet::Quiet;
use super::relay::{refill_position, End};
use super::{ClientConn, ClientError};
use crate::cancel::CancelSlot;
use crate::config::Config;
use crate::hash::Map;
use crate::net::MaybeTls;
use crate::pool::settings::{
    commit, parse_options, quote_literal, set_raw_sql, sync_sql, valid_name, ClientSettings,
    SettingChange, TrackedChange,
};
use crate::pool::{
    Lease, Pool, PoolSettings, ReleaseState, ServerConn, StatementRegistry, WaitTimer,
};
use crate::shared::Shared;
use crate::stats::Stats;

use cache::{Detached, TxnCache};
pub use link::ClientState;
use link::{Link, TxnTrack};

/// The client's session state from its startup parameters, or the error that refuses it
/// (`options` that are not settings, names pgmemo cannot replay).
pub fn client_state(
    route: &Route,
    registry: &StatementRegistry,
) -> Result<ClientState, ErrorResponse> {
    let mut settings = Vec::new();
    for (name, value) in &route.client_params {
        if name == "options" {
            let parsed = parse_options(value).ok_or_else(|| {
                ErrorResponse::fatal(
                    sqlstate::FEATURE_NOT_SUPPORTED,
                    format!("startup option \"{value}\" is not supported in transaction pooling"),
                )
                .with_hint("Only -c name=value settings can be replayed on pooled connections.")
            })?;
            settings.extend(parsed);
        } else if name == "replication" {
            return Err(ErrorResponse::fatal(
                sqlstate::FEATURE_NOT_SUPPORTED,
                "replication connections are not supported through pgmemo",
            ));
        } else if valid_name(name) {
            settings.push((name.clone(), value.clone()));
        } else {
            return Err(ErrorResponse::fatal(
                sqlstate::FEATURE_NOT_SUPPORTED,
                format!("startup parameter \"{name}\" cannot be replayed in transaction pooling"),
            ));
        }
    }
    let temp_path = settings.iter().any(|(name, value)| {
        name == "search_path"
            && value
                .split(',')
                .any(|e| commands::names_temp_schema(e.trim().trim_matches('"')))
    });
    if temp_path {
        let mut e = commands::temp_search_path();
        e.severity = "FATAL".into();
        return Err(e);
    }
    let tag = registry.new_client_tag();
    Ok(ClientState {
        tag,
        statements: Map::default(),
        effects: Map::default(),
        described: Map::default(),
        row_shapes: Map::default(),
        unnamed: None,
        parses: 0,
        settings: ClientSettings::from_startup(&settings),
        verify: Vec::new(),
        unrun: Vec::new(),
        withdrawn: Vec::new(),
        status: TransactionStatus::Idle,
    })
}

/// Applies the client's startup settings on its login connection before the client sees
/// the server's parameters, so ParameterStatus shows the client's own values.
pub async fn prepare_login_server(
    state: &ClientState,
    server: &mut ServerConn,
) -> Result<(), ClientError> {
    if let Some(sql) = sync_sql(&state.settings, &mut server.session.settings) {
        if let Err(e) = server.simple_query(&sql).await {
            server.session.settings.unknown = true;
            return Err(match e {
                crate::pool::ServerError::Server(mut e) => {
                    e.severity = "FATAL".into();
                    ClientError::Refused(e)
                }
                other => other.into(),
            });
        }
    }
    Ok(())
}

/// How an attachment ended.
enum Attached {
    /// The transaction is over; the server goes back to the pool.
    Released,
    /// The session is over.
    Ended(End),
}

/// Serves a logged-in client until it leaves. Servers are taken from the pool per
/// transaction and given back at once after it.
pub async fn run(
    client: &mut ClientConn,
    shared: &Arc<Shared>,
    route: &Route,
    state: &mut ClientState,
    cancel: &Arc<CancelSlot>,
) -> End {
    // Built once per session: a fresh cancellation future per transaction would take the
    // token's lock and allocate every time.
    let stop_token = shared.stop_accepting.child_token();
    let terminate_token = shared.terminate_sessions.child_token();
    let mut stopped = Quiet::new(stop_token.cancelled());
    let mut terminated = Quiet::new(terminate_token.cancelled());
    let max_message = shared.config().max_message_size.0;
    let mut checkout = Checkout::new(shared, route);
    checkout.top_up(shared, route);
    let mut buffers = Buffers::default();
    let mut cache = shared
        .config()
        .cache_on_for(&route.client_database)
        .then(|| {
            let db = shared
                .cache
                .database(&route.key.host, route.key.port, &route.key.database);
            TxnCache::new(Arc::clone(shared), db, &route.client_database)
        });
    let _untracked = cache.is_none().then(|| {
        shared
            .cache
            .untracked_session(&route.key.host, route.key.port, &route.key.database)
    });
    loop {
        match wait_for_request(client, max_message, &mut stopped).await {
            Ok(()) => {}
            Err(end) => return end,
        }
        if client.buf.first() == Some(&wire::frontend::tag::FLUSH)
            && state.status == TransactionStatus::Idle
        {
            // Nothing is pending while detached: a Flush has nothing to flush. One with a
            // body goes to a server, which fails it (08P01) and skips to the next Sync.
            if let Ok(Some(h)) = FrameHeader::peek(&client.buf, max_message) {
                if h.frame_len == FrameHeader::SIZE {
                    let _ = client.buf.split_to(h.frame_len);
                    continue;
                }
            }
        }
        // A reload takes effect from the next request on (one integer comparison each).
        checkout.refresh(shared, route);
        if let Some(cache) = cache.as_mut() {
            cache.configure(&checkout.config, checkout.generation);
        }
        if let Some(answer) = local::answer(
            &mut client.buf,
            state,
            &shared.pools.statements,
            max_message,
        ) {
            if let Err(e) = client.send(&answer).await {
                return match e {
                    ClientError::Io(e) => End::ClientGone(Some(e)),
                    _ => End::ClientGone(None),
                };
            }
            continue;
        }
        let mut request = None;
        if let Some(cache) = cache.as_mut() {
            match cache.detached(&mut client.buf, state, max_message) {
                Detached::Answered(bytes) => {
                    if let Err(end) = answer(client, cache, bytes).await {
                        return end;
                    }
                    continue;
                }
                Detached::Attach(Some(r)) => {
                    // Waiting for another client's identical query is waiting too: a cancel
                    // answers the request at once.
                    cancel.await_server();
                    let answerable = answers_cancel(&client.buf, max_message);
                    let joined = tokio::select! {
                        biased;
                        joined = cache.join_flight(&mut client.buf, &r, state) => Some(joined),
                        () = cancel.cancel_kept(), if answerable => None,
                    };
                    match joined {
                        Some(Some(bytes)) => {
                            let _ = cancel.detach();
                            if let Err(end) = answer(client, cache, bytes).await {
                                return end;
                            }
                            continue;
                        }
                        Some(None) => request = Some(r),
                        None => {
                            if let Err(end) =
                                cancelled(client, Some(cache), cancel, max_message, &mut stopped)
                                    .await
                            {
                                return end;
                            }
                            continue;
                        }
                    }
                }
                Detached::Attach(None) => {}
            }
        }
        // From here until it is sent, the request waits: a cancel for it is kept.
        cancel.await_server();

        // Queued for a place (or waiting for a new connection), the client is watched: one
        // that closes its connection leaves the queue at once instead of taking a server for
        // nobody when its turn comes, as at login. Polled only when no place is free at once.
        // A cancel while queued answers the request at once, as PostgreSQL would have been
        // running it, unless it is a message pgmemo cannot answer so (the cancel is then
        // forwarded once the request is sent).
        let answerable = answers_cancel(&client.buf, max_message);
        let attached = tokio::select! {
            biased;
            attached = checkout.attach(shared, route) => Some(attached),
            gone = client.gone(super::login::MAX_AHEAD_WHILE_QUEUED) => Some(Err(gone)),
            () = cancel.cancel_kept(), if answerable => None,
        };
        let Some(attached) = attached else {
            if let Err(end) =
                cancelled(client, cache.as_mut(), cancel, max_message, &mut stopped).await
            {
                return end;
            }
            continue;
        };
        let (lease, mut server) = match attached {
            Ok(v) => v,
            Err(e) => {
                if let Some(err) = e.to_error_response() {
                    client.send_error(&err).await;
                }
                return End::ClientGone(None);
            }
        };
        tracing::trace!(client = state.tag, server = ?server.key.map(|k| k.process_id), "attach");
        if let Some(cache) = cache.as_mut() {
            if let Some(bytes) = cache
                .attached(request, &mut server, state, &mut client.buf)
                .await
            {
                // A hit once the context was read: the server goes back unused (and a
                // cancel kept meanwhile is dropped: the request is answered).
                let _ = cancel.detach();
                lease.return_idle(server, true);
                if let Err(end) = answer(client, cache, bytes).await {
                    return end;
                }
                continue;
            }
        }
        if answerable && cancel.is_kept() {
            // A cancel came while the cache readied the server (the context read, catalog
            // lookups): the request is answered as cancelled, and the server, idle, goes back.
            lease.return_idle(server, true);
            if let Err(end) =
                cancelled(client, cache.as_mut(), cancel, max_message, &mut stopped).await
            {
                return end;
            }
            continue;
        }
        server.stage_cancel(cancel);
        let idle_timeout = checkout.config.idle_transaction_timeout.0;
        let max_prepared = checkout.config.max_prepared_statements;
        let max_promoted = checkout.config.max_promoted_statements;
        let before = (
            server.session.statements.hits,
            server.session.statements.misses,
        );
        let promoted_before = (
            server.session.promoted.uses,
            server.session.promoted.prepares,
        );
        let (attached, at_boundary) = serve_attached(
            client,
            &mut server,
            state,
            shared,
            AttachOptions {
                max_message,
                max_prepared,
                max_promoted,
                idle_timeout,
            },
            &mut buffers,
            &mut terminated,
            cache.as_mut(),
            cancel,
        )
        .await;
        // A cancel on its way to this server must not reach the next client's query.
        let cancel_settled = !cancel.detach() || cancel.settle().await;
        server.status = state.status;
        // Shared by every session: written only when there is something to add.
        let stats = &shared.stats;
        let (hits, misses) = (
            server.session.statements.hits - before.0,
            server.session.statements.misses - before.1,
        );
        if hits > 0 {
            stats
                .prepared_hits
                .fetch_add(hits, std::sync::atomic::Ordering::Relaxed);
        }
        if misses > 0 {
            stats
                .prepared_misses
                .fetch_add(misses, std::sync::atomic::Ordering::Relaxed);
        }
        let promoted = &server.session.promoted;
        for (counter, now, before) in [
            (&stats.promoted_uses, promoted.uses, promoted_before.0),
            (
                &stats.promoted_prepares,
                promoted.prepares,
                promoted_before.1,
            ),
        ] {
            if now > before {
                counter.fetch_add(now - before, std::sync::atomic::Ordering::Relaxed);
            }
        }
        if hits > 0 || misses > 0 {
            if let Some(listing) = &server.listing {
                listing.note_prepared(server.session.statements.len(), hits, misses);
            }
        }
        tracing::trace!(
            client = state.tag,
            server = ?server.key.map(|k| k.process_id),
            status = ?state.status,
            released = matches!(attached, Attached::Released),
            "detach"
        );
        match attached {
            Attached::Released if !cancel_settled => {
                lease.discard(server);
            }
            Attached::Released => {
                if !state.verify.is_empty() {
                    verify_settings(&mut server, state).await;
                }
                if let Some(cache) = cache.as_mut() {
                    cache.plan_after(&mut server, state).await;
                }
                lease.return_idle(server, true);
                checkout.top_up(shared, route);
            }
            Attached::Ended(end) => {
                let after_running = cache.as_mut().and_then(|cache| cache.abandoned());
                if let (Some((shared, db)), false) = (after_running, at_boundary) {
                    if !matches!(end, End::ServerGone { .. }) {
                        Stats::bump(&shared.stats.servers_closed_dirty);
                        lease.discard_after_running(
                            server,
                            super::session::UNANSWERED_WRITE_LIMIT,
                            move || super::cached::invalidate_everything(&shared, &db),
                        );
                        return end;
                    }
                }
                finish(
                    lease,
                    server,
                    &end,
                    at_boundary && cancel_settled,
                    state.status,
                    shared,
                );
                return end;
            }
        }
    }
}

/// Reads back from the server the settings a ROLLBACK TO SAVEPOINT may have undone before
/// the transaction committed, or that a `set_config` call named, and makes their values the
/// client's own. The server's settings are unknown since, so it is brought in line before
/// its next use anyway.
async fn verify_settings(server: &mut ServerConn, state: &mut ClientState) {
    let names = std::mem::take(&mut state.verify);
    let columns: Vec<String> = names
        .iter()
        .map(|n| format!("pg_catalog.current_setting({})", quote_literal(n)))
        .collect();
    let sql = format!("SELECT {}", columns.join(", "));
    if !server.session.settings.unknown {
        // Brought in line with the client's records since the ROLLBACK TO SAVEPOINT or the
        // `set_config` (a request pipelined behind them and sent before their answers came;
        // one held for their answers waits for this read instead, see
        // `Link::read_back_due`), or another server after a discard: it shows those
        // records, not what the transaction committed. The records stay as they are.
        tracing::debug!(?names, "settings to read back were synced over");
        return;
    }
    match server.query_text_rows(&sql).await {
        Ok(rows) => {
            let Some(row) = rows.first() else { return };
            for (name, value) in names.iter().zip(row) {
                if let Some(value) = value {
                    let change = TrackedChange {
                        change: SettingChange::Set(name.clone(), set_raw_sql(name, value)),
                        real: false,
                    };
                    commit(&[change], &mut state.settings, &mut server.session.settings);
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, ?names, "cannot read settings back")
        }
    }
}

/// Whether the client's first message (whole in `buf`) starts a request pgmemo can answer
/// as cancelled without a server: a simple Query or a FunctionCall, or an extended-protocol
/// message (the error then skips the batch to its Sync, as PostgreSQL's does).
fn answers_cancel(buf: &[u8], max_message: usize) -> bool {
    use wire::frontend::tag;
    matches!(
        FrameHeader::peek(buf, max_message),
        Ok(Some(h)) if buf.len() >= h.frame_len
            && matches!(
                h.tag,
                tag::QUERY
                    | tag::FUNCTION_CALL
                    | tag::PARSE
                    | tag::BIND
                    | tag::DESCRIBE
                    | tag::EXECUTE
                    | tag::CLOSE
            )
    )
}

/// Whether the client's first message is a request answered by ReadyForQuery on its own (a
/// simple Query or a FunctionCall), rather than the start of an extended-protocol batch.
fn stands_alone(buf: &[u8]) -> bool {
    use wire::frontend::tag;
    matches!(buf.first(), Some(&(tag::QUERY | tag::FUNCTION_CALL)))
}

/// A cancel came while the client's request waited for a server or another client's fill:
/// the request is answered as cancelled and forgotten.
async fn cancelled(
    client: &mut ClientConn,
    cache: Option<&mut TxnCache>,
    cancel: &CancelSlot,
    max_message: usize,
    stopped: &mut (impl Future<Output = ()> + Unpin),
) -> Result<(), End> {
    let _ = cancel.detach();
    if let Some(cache) = cache {
        cache.forget_request();
    }
    answer_cancelled(client, max_message, stopped).await
}

/// Answers the client's first request (see [`answers_cancel`]) as PostgreSQL answers a
/// statement cancelled before it produced anything: the error, then, for a simple Query or a
/// FunctionCall, at once ReadyForQuery; for an extended-protocol batch, its messages skipped up to its Sync
/// (read as they come), then ReadyForQuery. Nothing of it ran, so the session is unchanged.
async fn answer_cancelled(
    client: &mut ClientConn,
    max_message: usize,
    stopped: &mut (impl Future<Output = ()> + Unpin),
) -> Result<(), End> {
    let error = crate::cancel::cancelled_error();
    let sent = |r: Result<(), ClientError>| {
        r.map_err(|e| match e {
            ClientError::Io(e) => End::ClientGone(Some(e)),
            _ => End::ClientGone(None),
        })
    };
    let simple = stands_alone(&client.buf);
    if simple {
        let len = FrameHeader::peek(&client.buf, max_message)
            .ok()
            .flatten()
            .map_or(0, |h| h.frame_len);
        client.buf.advance(len);
    } else {
        // The error goes out at once: the client may wait for it behind a Flush.
        sent(client.send(&error.encode()).await)?;
        loop {
            wait_for_request(client, max_message, stopped).await?;
            let Ok(Some(h)) = FrameHeader::peek(&client.buf, max_message) else {
                return Err(End::ClientGone(None));
            };
            client.buf.advance(h.frame_len);
            if h.tag == wire::frontend::tag::SYNC {
                break;
            }
        }
    }
    let mut out = BytesMut::new();
    if simple {
        error.encode_into(&mut out);
    }
    out.extend_from_slice(&wire::backend::ready_for_query(TransactionStatus::Idle));
    sent(client.send(&out).await)
}

/// Sends a detached client the cache's answer.
async fn answer(client: &mut ClientConn, cache: &mut TxnCache, bytes: Vec<u8>) -> Result<(), End> {
    let sent = client.send(&bytes).await;
    cache.recycle(bytes);
    sent.map_err(|e| match e {
        ClientError::Io(e) => End::ClientGone(Some(e)),
        _ => End::ClientGone(None),
    })
}

/// Gives the server back (or closes it) when the session ends while attached.
fn finish(
    lease: Lease,
    server: Box<ServerConn>,
    end: &End,
    at_boundary: bool,
    status: TransactionStatus,
    shared: &Shared,
) {
    if matches!(end, End::ServerGone { .. }) || !at_boundary {
        if !at_boundary {
            Stats::bump(&shared.stats.servers_closed_dirty);
        }
        lease.discard(server);
    } else if status == TransactionStatus::Idle {
        lease.return_idle(server, true);
    } else {
        // Rolled back in the background; settings are tracked, so no reset query is needed.
        let mut settings = pool_settings(&shared.config());
        settings.server_reset_query.clear();
        lease.release(server, ReleaseState::Boundary(status), settings);
    }
}

/// Waits until the client has sent a whole message (or leaves, or pgmemo shuts down while
/// the client is between transactions).
async fn wait_for_request(
    client: &mut ClientConn,
    max_message: usize,
    stopped: &mut (impl Future<Output = ()> + Unpin),
) -> Result<(), End> {
    loop {
        match FrameHeader::peek(&client.buf, max_message) {
            Err(e) => return Err(End::ClientProtocol(e)),
            Ok(Some(h)) if h.tag == wire::frontend::tag::TERMINATE => {
                return Err(End::ClientTerminated)
            }
            Ok(Some(h)) if client.buf.len() >= h.frame_len => return Ok(()),
            Ok(Some(h)) => wire::frame::reserve_toward(&mut client.buf, h.frame_len),
            Ok(None) => {}
        }
        refill_position(&mut client.buf);
        tokio::select! {
            biased;
            r = client.stream.read_buf(&mut client.buf) => match r {
                Ok(0) => return Err(End::ClientGone(None)),
                Ok(_) => {}
                Err(e) => return Err(End::ClientGone(Some(e))),
            },
            _ = &mut *stopped => return Err(End::Shutdown),
        }
    }
}

/// Whether `buf` holds only whole messages, none of them Terminate (which the pumps handle).
fn whole_requests(buf: &[u8], max_message: usize) -> bool {
    let mut at = 0;
    while at < buf.len() {
        match FrameHeader::peek(&buf[at..], max_message) {
            Ok(Some(h))
                if h.tag != wire::frontend::tag::TERMINATE && buf.len() - at >= h.frame_len =>
            {
                at += h.frame_len
            }
            _ => return false,
        }
    }
    at > 0
}

/// What taking a server needs, derived from the configuration once and again only after a
/// reload (building it per transaction would lock the pool map and copy strings every time).
struct Checkout {
    /// `Shared::config_generation` when `config` was read.
    generation: u64,
    config: Arc<Config>,
    pool: Arc<Pool>,
    settings: PoolSettings,
    wait_timer: WaitTimer,
    /// The server this client had last: it gets that one again when it is idle.
    last_server: Option<wire::startup::CancelKey>,
}

impl Checkout {
    fn new(shared: &Shared, route: &Route) -> Checkout {
        let generation = shared.config_generation();
        let config = shared.config().clone();
        let pool = shared.pools.get(
            &route.key,
            config.pool_size_for(&route.client_database, &route.key.user),
            generation,
        );
        Checkout {
            generation,
            settings: pool_settings(&config),
            pool,
            config,
            wait_timer: WaitTimer::default(),
            last_server: None,
        }
    }

    /// Opens a connection in the background while the pool holds fewer than
    /// `min_pool_size`, one per call, so a burst of clients finds servers ready. It holds a
    /// place of the pool while it opens (see `Pool::reserve_spare`).
    fn top_up(&self, shared: &Arc<Shared>, route: &Route) {
        let min = self.config.min_pool_size;
        if min == 0 {
            return;
        }
        let Some(lease) = self.pool.reserve_spare(min) else {
            return;
        };
        let (shared, route) = (shared.clone(), route.clone());
        tokio::spawn(async move {
            match open_authenticated(&shared, &route).await {
                Ok(conn) => lease.return_idle(conn, true),
                Err(e) => {
                    tracing::warn!(error = %e, "opening a server connection for min_pool_size failed");
                }
            }
        });
    }

    /// Follows a reloaded configuration.
    fn refresh(&mut self, shared: &Shared, route: &Route) {
        if shared.config_generation() != self.generation {
            *self = Checkout::new(shared, route);
        }
    }

    /// Takes a server connection for one transaction: an idle one of the pool, or a new one.
    async fn attach(
        &mut self,
        shared: &Arc<Shared>,
        route: &Route,
    ) -> Result<(Lease, Box<ServerConn>), ClientError> {
        let wait = self.config.query_wait_timeout.0;
        let mut lease = self
            .pool
            .acquire_timed(wait, &mut self.wait_timer)
            .await
            .inspect_err(|_| {
                Stats::bump(&shared.stats.pool_wait_timeouts);
            })?;
        if let Some(conn) = lease
            .take_idle(route.fingerprint, &self.settings, self.last_server)
            .await
        {
            self.last_server = conn.key;
            return Ok((lease, conn));
        }
        lease.reserve_new();
        // Boxed: opening a connection is rare once the pool is warm, and its future is large.
        let conn = Box::pin(open_authenticated(shared, route)).await?;
        self.last_server = conn.key;
        Ok((lease, conn))
    }
}

/// A signal between the two pumps. Both run in one task and `select!` polls every pending
/// branch on each wake-up, so a raised flag is seen without a waker: by the server pump in
/// the same pass (it is polled after the client pump), by the client pump once the raising
/// pump yields (`raise` wakes the task for that).
#[derive(Default)]
struct Flag(std::sync::atomic::AtomicBool);

impl Flag {
    fn raise(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Completes when the flag is raised (and lowers it). Registers no waker.
    fn raised(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |_| {
            if self.0.swap(false, std::sync::atomic::Ordering::Relaxed) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
    }
}

/// Allocations a session reuses from one transaction to the next.
#[derive(Default)]
struct Buffers {
    client_out: BytesMut,
    server_out: BytesMut,
    queue: VecDeque<link::Entry>,
    batch: link::BatchLog,
    /// A promoted batch as the client sent it (`promote`).
    promoted_batch: BytesMut,
    /// Kept for its hasher: a new map draws random keys (a tenth of the relay's own work
    /// on a short transaction).
    portals: Map<bytes::Bytes, Arc<commands::Outcome>>,
}

struct AttachOptions {
    max_message: usize,
    max_prepared: usize,
    max_promoted: usize,
    idle_timeout: Duration,
}

/// Relays one transaction. Returns how it ended and whether the server was at a clean
/// protocol boundary.
#[allow(clippy::too_many_arguments)]
async fn serve_attached(
    client: &mut ClientConn,
    server: &mut ServerConn,
    state: &mut ClientState,
    shared: &Shared,
    opts: AttachOptions,
    buffers: &mut Buffers,
    terminated: &mut (impl Future<Output = ()> + Unpin),
    cache: Option<&mut TxnCache>,
    cancel: &Arc<CancelSlot>,
) -> (Attached, bool) {
    let ServerConn {
        stream,
        read_buf,
        params,
        session,
        ..
    } = server;
    let link = Mutex::new(Link {
        client: state,
        cache,
        server: session,
        queue: &mut buffers.queue,
        plain: None,
        plain_parse: false,
        portals: &mut buffers.portals,
        txn: TxnTrack::default(),
        mid_batch: false,
        doomed: false,
        holding: false,
        probed: None,
        refuse_bind: false,
        last_bound: None,
        read_back_due: false,
        max_prepared: opts.max_prepared,
        max_promoted: opts.max_promoted,
        promoting: None,
        batch: &mut buffers.batch,
        promoted_batch: &mut buffers.promoted_batch,
        retry: None,
        retried: false,
        skip_parameter_description: false,
        copy_in: false,
        held_error: None,
        fatal_forwarded: false,
    });
    let wake = Flag::default();
    let retry = Flag::default();
    let attached = {
        let pumps = Pumps {
            link: &link,
            wake: &wake,
            retry: &retry,
            registry: &shared.pools.statements,
            opts: &opts,
            cancel,
        };
        match (&mut client.stream, stream) {
            (MaybeTls::Plain(c), MaybeTls::Plain(s)) => {
                let (mut cr, mut cw) = (&*c, &*c);
                let (mut sr, mut sw) = (&*s, &*s);
                pumps
                    .run(
                        &mut cr,
                        &mut cw,
                        &mut sr,
                        &mut sw,
                        (&mut client.buf, read_buf),
                        (&mut buffers.client_out, &mut buffers.server_out),
                        params,
                        terminated,
                    )
                    .await
            }
            (c, s) => {
                let (mut cr, mut cw) = tokio::io::split(c);
                let (mut sr, mut sw) = tokio::io::split(s);
                pumps
                    .run(
                        &mut cr,
                        &mut cw,
                        &mut sr,
                        &mut sw,
                        (&mut client.buf, read_buf),
                        (&mut buffers.client_out, &mut buffers.server_out),
                        params,
                        terminated,
                    )
                    .await
            }
        }
    };
    let mut link = link.into_inner().unwrap_or_else(|e| e.into_inner());
    let at_boundary = link.owes_nothing() && !link.mid_batch;
    // Requests whose answers never began: their effects were to count on arrival.
    let Link { cache, queue, .. } = &mut link;
    if let Some(cache) = cache.as_deref_mut() {
        for effects in queue.iter_mut().filter_map(|e| e.effects.take()) {
            cache.unanswered(&effects);
        }
    }
    link.queue.clear();
    link.batch.clear();
    link.portals.clear();
    (attached, at_boundary)
}

struct Pumps<'p, 'l> {
    link: &'p Mutex<Link<'l>>,
    /// pgmemo queued an answer of its own: the server pump sends it without waiting for the
    /// server.
    wake: &'p Flag,
    /// Makes the client pump replay a batch (see `Link::retry`).
    retry: &'p Flag,
    registry: &'p StatementRegistry,
    opts: &'p AttachOptions,
    /// Told of every write of requests to the server, to forward a cancel that came while
    /// the transaction's first request waited.
    cancel: &'p Arc<CancelSlot>,
}

enum PumpError {
    Client(std::io::Error),
    Server(std::io::Error),
    Protocol(WireError),
    ServerProtocol(WireError),
    IdleTimeout,
}

impl Pumps<'_, '_> {
    #[allow(clippy::too_many_arguments)]
    async fn run<CR, CW, SR, SW>(
        &self,
        cr: &mut CR,
        cw: &mut CW,
        sr: &mut SR,
        sw: &mut SW,
        (client_buf, server_buf): (&mut BytesMut, &mut BytesMut),
        (client_out, server_out): (&mut BytesMut, &mut BytesMut),
        params: &mut Vec<(String, String)>,
        terminated: &mut (impl Future<Output = ()> + Unpin),
    ) -> Attached
    where
        CR: AsyncRead + Unpin,
        CW: AsyncWrite + Unpin,
        SR: AsyncRead + Unpin,
        SW: AsyncWrite + Unpin,
    {
        if let Some(outcome) = self
            .sequential(
                (cr, cw, sr, sw),
                (client_buf, server_buf),
                (client_out, server_out),
                params,
                terminated,
            )
            .await
        {
            return match outcome {
                Ok(()) => Attached::Released,
                Err(end) => Attached::Ended(end),
            };
        }
        let outcome = tokio::select! {
            biased;
            r = self.client_to_server(cr, client_buf, sw, server_out) => match r {
                Ok(true) => Err(End::ClientTerminated),
                Ok(false) => Err(End::ClientGone(None)),
                Err(e) => Err(self.end_for(e, cw).await),
            },
            r = self.server_to_client(sr, server_buf, cw, params, client_out) => match r {
                Ok(()) => Ok(()),
                Err(e) => Err(self.end_for(e, cw).await),
            },
            _ = terminated => Err(End::Shutdown),
        };
        match outcome {
            Ok(()) => Attached::Released,
            Err(end) => Attached::Ended(end),
        }
    }

    /// The common case without the two pumps: the client's request arrived whole, so it is
    /// translated and sent at once, and then only the answers are relayed, one read of the
    /// server after another, while the client is merely watched for more input. Running both
    /// pumps costs a task wake-up's worth of polling on each side for every message. `None`
    /// hands the transaction to the pumps from where it stands: the client sent more (or only
    /// part of a message, or Terminate), a COPY wants the client's data, a batch is to be
    /// replayed, or the client is to speak next inside its transaction.
    #[allow(clippy::too_many_arguments)]
    async fn sequential<CR, CW, SR, SW>(
        &self,
        (cr, cw, sr, sw): (&mut CR, &mut CW, &mut SR, &mut SW),
        (client_buf, server_buf): (&mut BytesMut, &mut BytesMut),
        (client_out, server_out): (&mut BytesMut, &mut BytesMut),
        params: &mut Vec<(String, String)>,
        terminated: &mut (impl Future<Output = ()> + Unpin),
    ) -> Option<Result<(), End>>
    where
        CR: AsyncRead + Unpin,
        CW: AsyncWrite + Unpin,
        SR: AsyncRead + Unpin,
        SW: AsyncWrite + Unpin,
    {
        if !whole_requests(client_buf, self.opts.max_message) {
            return None;
        }
        server_out.clear();
        let translated = {
            let mut link = self.link.lock().unwrap_or_else(|e| e.into_inner());
            let mut translated = Ok(false);
            loop {
                if link.holds_input() {
                    link.holding = true;
                    break;
                }
                if requests::batch_hit_in_block(client_buf, &mut link, self.opts.max_message)
                    || requests::pipelined_read(client_buf, &mut link, self.opts.max_message)
                {
                    translated = Ok(true);
                    continue;
                }
                if plain::request(client_buf, &mut link, self.opts.max_message, server_out) {
                    continue;
                }
                // Waiting first, as in `client_to_server`.
                if requests::must_wait(client_buf, &link)
                    || requests::probe_shape(client_buf, &mut link, server_out)
                {
                    link.holding = true;
                    break;
                }
                let Ok(Some(frame)) = Frame::decode(client_buf, self.opts.max_message) else {
                    break;
                };
                translated = requests::translate(frame, &mut link, self.registry, server_out);
                if translated.is_err() {
                    break;
                }
            }
            translated
        };
        if let Err(e) = translated {
            return Some(Err(self.end_for(PumpError::Protocol(e), cw).await));
        }
        if !server_out.is_empty() {
            let sent = async {
                sw.write_all(server_out).await?;
                sw.flush().await
            };
            if let Err(e) = sent.await {
                return Some(Err(self.end_for(PumpError::Server(e), cw).await));
            }
            self.cancel.request_sent();
            server_out.clear();
        }
        client_out.clear();
        // Before the server has said anything, a pass over its bytes finds something to do
        // only when pgmemo's own answers come first: otherwise the first step is to read.
        let mut read_first = server_buf.is_empty() && {
            let link = self.link.lock().unwrap_or_else(|e| e.into_inner());
            link.waits_for_server()
                && (link.plain.is_some()
                    || link
                        .queue
                        .front()
                        .is_some_and(|e| e.expect != link::Expect::Local))
        };
        loop {
            if !std::mem::take(&mut read_first) {
                let processed = match self.relay_answers(server_buf, cw, params, client_out).await {
                    Ok(p) => p,
                    Err(e) => return Some(Err(self.end_for(e, cw).await)),
                };
                {
                    let link = self.link.lock().unwrap_or_else(|e| e.into_inner());
                    if processed.released && link.releasable() {
                        return Some(Ok(()));
                    }
                    // A held message may go now (its server may owe nothing more until it
                    // does): the pumps look at the client's input again.
                    if !link.waits_for_server() || link.holding {
                        return None;
                    }
                }
                wire::frame::reserve_toward(server_buf, processed.need);
            }
            refill_position(server_buf);
            refill_position(client_buf);
            tokio::select! {
                biased;
                r = sr.read_buf(server_buf) => match r {
                    Ok(0) => {
                        let e = std::io::ErrorKind::UnexpectedEof.into();
                        return Some(Err(self.end_for(PumpError::Server(e), cw).await));
                    }
                    Ok(_) => {}
                    Err(e) => return Some(Err(self.end_for(PumpError::Server(e), cw).await)),
                },
                r = cr.read_buf(client_buf) => match r {
                    Ok(0) => return Some(Err(End::ClientGone(None))),
                    Ok(_) => return None,
                    Err(e) => return Some(Err(End::ClientGone(Some(e)))),
                },
                _ = &mut *terminated => return Some(Err(End::Shutdown)),
            }
        }
    }

    /// One pass over the server's bytes: matches them with what the client is owed, writes
    /// the client's share and consumes them.
    async fn relay_answers<W: AsyncWrite + Unpin>(
        &self,
        buf: &mut BytesMut,
        client: &mut W,
        params: &mut Vec<(String, String)>,
        out: &mut BytesMut,
    ) -> Result<responses::Processed, PumpError> {
        let processed = {
            let mut link = self.link.lock().unwrap_or_else(|e| e.into_inner());
            responses::process(buf, &mut link, params, out).map_err(PumpError::ServerProtocol)?
        };
        let answer: &[u8] = if processed.verbatim {
            &buf[..processed.consumed]
        } else {
            out
        };
        if !answer.is_empty() {
            client.write_all(answer).await.map_err(PumpError::Client)?;
        }
        if processed.consumed > 0 || !processed.verbatim {
            client.flush().await.map_err(PumpError::Client)?;
        }
        out.clear();
        buf.advance(processed.consumed);
        Ok(processed)
    }

    async fn end_for<CW: AsyncWrite + Unpin>(&self, e: PumpError, cw: &mut CW) -> End {
        match e {
            PumpError::Client(e) => End::ClientGone(Some(e)),
            PumpError::Protocol(e) => End::ClientProtocol(e),
            PumpError::Server(e) => {
                tracing::debug!(error = %e, "server connection failed");
                let link = self.link.lock().unwrap_or_else(|e| e.into_inner());
                End::ServerGone {
                    fatal_forwarded: link.fatal_forwarded,
                }
            }
            PumpError::ServerProtocol(e) => {
                tracing::warn!(error = %e, "invalid data from server");
                End::ServerGone {
                    fatal_forwarded: false,
                }
            }
            PumpError::IdleTimeout => {
                let err = ErrorResponse::fatal(
                    sqlstate::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
                    "terminating connection due to idle-in-transaction timeout",
                )
                .with_detail("pgmemo's idle_transaction_timeout was reached.");
                // Best effort, while the server is still held.
                let farewell = async {
                    cw.write_all(&err.encode()).await?;
                    cw.flush().await
                };
                let _ = tokio::time::timeout(super::session::FAREWELL_TIMEOUT, farewell).await;
                End::ClientGone(None)
            }
        }
    }

    /// Translates client messages; `Ok(true)` on Terminate, `Ok(false)` on EOF.
    async fn client_to_server<R, W>(
        &self,
        reader: &mut R,
        buf: &mut BytesMut,
        server: &mut W,
        out: &mut BytesMut,
    ) -> Result<bool, PumpError>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        out.clear();
        loop {
            let mut terminate = false;
            let mut wake = false;
            {
                // Nothing below waits: the lock is held for the whole pass over the input.
                let mut link = self.link.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(from) = link.retry.take() {
                    let mut frames = link.batch.split_off(from).into_iter();
                    while let Some(frame) = frames.next() {
                        // A replayed Bind is checked like a new one (`probe_shape`); while
                        // it waits, the rest stays in the log to replay from there.
                        let ahead = (frame.tag() == wire::frontend::tag::BIND
                            && !link.client.row_shapes.is_empty())
                        .then(|| {
                            let mut ahead = BytesMut::from(&frame.raw()[..]);
                            frames
                                .clone()
                                .for_each(|f| ahead.extend_from_slice(f.raw()));
                            ahead
                        });
                        if ahead.is_some_and(|a| requests::probe_shape(&a, &mut link, out)) {
                            let at = link.batch.len();
                            link.batch.push(&frame);
                            frames.for_each(|f| link.batch.push(&f));
                            link.retry = Some(at);
                            link.holding = true;
                            break;
                        }
                        wake |= requests::translate(frame, &mut link, self.registry, out)
                            .map_err(PumpError::Protocol)?;
                    }
                    link.retried = true;
                }
                while link.retry.is_none() {
                    if link.holds_input() {
                        link.holding = true;
                        break;
                    }
                    if requests::batch_hit_in_block(buf, &mut link, self.opts.max_message)
                        || requests::pipelined_read(buf, &mut link, self.opts.max_message)
                    {
                        wake = true;
                        continue;
                    }
                    if plain::request(buf, &mut link, self.opts.max_message, out) {
                        continue;
                    }
                    // Waiting comes first: a probe prepares the statement on this server
                    // now, which must not happen before the answers to a batch that may
                    // have closed it or not (an eviction the server then skipped).
                    link.holding = requests::must_wait(buf, &link)
                        || requests::probe_shape(buf, &mut link, out);
                    if link.holding {
                        break;
                    }
                    let frame = match Frame::decode(buf, self.opts.max_message) {
                        Ok(Some(frame)) => frame,
                        Ok(None) => break,
                        Err(e) => return Err(PumpError::Protocol(e)),
                    };
                    if frame.tag() == wire::frontend::tag::TERMINATE {
                        terminate = true;
                        break;
                    }
                    wake |= requests::translate(frame, &mut link, self.registry, out)
                        .map_err(PumpError::Protocol)?;
                }
            }
            // The server pump times a client idle inside its transaction while the server owes
            // nothing: a request sent now must stop that timer, or a statement running longer
            // than `idle_transaction_timeout` would end the session as if the client were idle.
            if wake || (!out.is_empty() && !self.opts.idle_timeout.is_zero()) {
                self.wake.raise();
            }
            if !out.is_empty() {
                server.write_all(out).await.map_err(PumpError::Server)?;
                server.flush().await.map_err(PumpError::Server)?;
                self.cancel.request_sent();
                out.clear();
            }
            if terminate {
                return Ok(true);
            }
            refill_position(buf);
            tokio::select! {
                biased;
                r = reader.read_buf(buf) => {
                    if r.map_err(PumpError::Client)? == 0 {
                        return Ok(false);
                    }
                }
                _ = self.retry.raised() => {}
            }
        }
    }

    /// Relays answers until the server can be released.
    async fn server_to_client<R, W>(
        &self,
        reader: &mut R,
        buf: &mut BytesMut,
        client: &mut W,
        params: &mut Vec<(String, String)>,
        out: &mut BytesMut,
    ) -> Result<(), PumpError>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        out.clear();
        loop {
            let processed = self.relay_answers(buf, client, params, out).await?;
            let (replay, idle_in_txn) = {
                let link = self.link.lock().unwrap_or_else(|e| e.into_inner());
                let replay = link.retry.is_some();
                // A held message may go now: the client pump looks again.
                let replay = replay || link.holding;
                if replay {
                    self.retry.raise();
                }
                let idle_in_txn =
                    link.owes_nothing() && link.client.status != TransactionStatus::Idle;
                (replay, idle_in_txn)
            };
            if replay {
                // The client pump runs first in each pass: let it see the flag now.
                tokio::task::yield_now().await;
            }
            // The client pump may have sent a new request while the answer was being written:
            // release only if the server is still owed nothing.
            if processed.released
                && self
                    .link
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .releasable()
            {
                return Ok(());
            }
            wire::frame::reserve_toward(buf, processed.need);
            refill_position(buf);
            let idle = self.opts.idle_timeout;
            let timer = async {
                if idle_in_txn && !idle.is_zero() {
                    tokio::time::sleep(idle).await
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                biased;
                r = reader.read_buf(buf) => {
                    if r.map_err(PumpError::Server)? == 0 {
                        return Err(PumpError::Server(std::io::ErrorKind::UnexpectedEof.into()));
                    }
                }
                _ = self.wake.raised() => {}
                _ = timer => return Err(PumpError::IdleTimeout),
            }
        }
    }
}

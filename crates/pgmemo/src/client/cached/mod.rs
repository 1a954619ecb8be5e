//! The relay of a session with the result cache on. Same two-pump shape as the plain relay
//! (`super::relay`), but the client pump reads whole requests and routes them: a hit is
//! answered from memory without touching the server; a miss is forwarded with a directive
//! telling the server pump to capture the response for the store; any request is forwarded
//! with the effects its commit will have (invalidations, settings changed). The client pump
//! may also put its own catalog and context queries on the session's server connection, whose
//! answers the server pump keeps from the client.
//!
//! Responses come back in request order, so directives are matched to responses by sequence
//! number: the n-th ReadyForQuery ends the n-th request.

pub(crate) mod messages;
mod planning;
mod requests;
mod responses;
mod session;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncWrite};

use session::close_unnamed;
pub use session::CacheSession;

use super::quiet::Quiet;
use super::relay::{End, RelayState};
use super::ClientConn;
pub(crate) use crate::cache::capture::Capture;
use crate::cache::catalog::Row;
use crate::cache::plan::Effects;
use crate::net::MaybeTls;
use crate::pool::{ReleaseState, ServerConn};
use crate::shared::Shared;

/// The client's write half, shared by the two pumps: the server pump forwards responses, the
/// client pump answers hits. Both run in one task and never wait for each other but while one
/// is mid-write, so the lock is futures' (an atomic flag) rather than tokio's semaphore, which
/// cost a tenth of a cache miss's instructions.
pub(crate) type ClientWriter<W> = futures_util::lock::Mutex<W>;

/// What the server pump does with one response.
pub(crate) enum Action {
    /// Forward it.
    Forward,
    /// Forward it and store it under `key` if it completes cleanly.
    Capture(Box<Capture>),
    /// Keep it from the client and hand its rows (or `None` on error) to the client pump.
    Internal(tokio::sync::oneshot::Sender<Option<Vec<Row>>>),
    /// No response comes from the server: a pipelined request answered from the cache. The
    /// server pump writes these bytes, then ReadyForQuery, when the responses before it are out.
    Hit(Vec<u8>),
}

/// One request's instructions for the server pump.
pub(crate) struct Directive {
    /// Index of the request among those answered by a ReadyForQuery.
    pub seq: u64,
    pub action: Action,
    pub effects: Effects,
    /// The response starts with an answer the client must not see, of this tag: pgmemo sent
    /// the server a Parse of the unnamed statement that the client had sent earlier in a batch
    /// answered from the cache (ParseComplete), or a Close of the unnamed statement that a
    /// Query answered from the cache dropped for the client (CloseComplete).
    pub swallow_first: Option<u8>,
    /// The request's cancel came before it was sent: pgmemo put a Parse the server refuses
    /// ahead of it ([`wire::frontend::refused_parse`]), so the response's first
    /// ErrorResponse is that Parse's, and the client gets the cancel's error (57014) instead.
    pub cancelled: bool,
    /// The client's Parses and Binds in this request, which their completions confirm.
    pub confirms: session::Confirmations,
}

impl Directive {
    /// Folds a later directive for the same request into this one.
    pub(crate) fn merge(&mut self, other: Directive) {
        self.effects.merge(&other.effects);
        self.swallow_first = self.swallow_first.or(other.swallow_first);
        self.cancelled |= other.cancelled;
        self.confirms.extend(other.confirms);
        if !matches!(other.action, Action::Forward) {
            self.action = other.action;
        }
    }
}

/// What the two pumps share beyond [`RelayState`]. Both run in one task, so the mutex is never
/// contended.
pub(crate) struct Link {
    directives: Mutex<VecDeque<Directive>>,
    /// `seq` of the directive at the front of `directives` (`u64::MAX`: none), so the server
    /// pump, which asks at every response, learns that there is none for it without locking.
    front: AtomicU64,
    /// Requests sent that a ReadyForQuery will answer (the next request's `seq`).
    pub sent: AtomicU64,
    /// The open transaction has written: its reads must bypass the cache.
    pub txn_wrote: AtomicBool,
    /// The open transaction runs under REPEATABLE READ or SERIALIZABLE.
    pub txn_snapshot: AtomicBool,
    /// Settings in the key may have changed since the context was read.
    pub context_stale: AtomicBool,
    /// Requests fully answered to the client (their ReadyForQuery written).
    pub answered: AtomicU64,
    /// One more than the sequence number of the last request sent that is not an inert read
    /// (0: none). Pipelined requests may be answered from the cache only once it is answered.
    pub last_non_inert: AtomicU64,
    /// A commit left writes to the replication feed: the session must learn the WAL position
    /// to wait for before it may use the cache again.
    pub await_feed: AtomicBool,
}

impl Link {
    fn new() -> Link {
        Link {
            directives: Mutex::new(VecDeque::new()),
            front: AtomicU64::new(u64::MAX),
            sent: AtomicU64::new(0),
            txn_wrote: AtomicBool::new(false),
            txn_snapshot: AtomicBool::new(false),
            context_stale: AtomicBool::new(true),
            await_feed: AtomicBool::new(false),
            answered: AtomicU64::new(0),
            last_non_inert: AtomicU64::new(0),
        }
    }

    /// Queues a directive, or merges it into the one queued last for the same request (a
    /// request's directive can be made in two steps: a restored Parse, then its Sync).
    pub(crate) fn push_or_merge(&self, directive: Directive) {
        let mut d = self.directives.lock().unwrap_or_else(|e| e.into_inner());
        match d.back_mut() {
            Some(last) if last.seq == directive.seq => last.merge(directive),
            _ => d.push_back(directive),
        }
        self.note_front(&d);
    }

    fn note_front(&self, d: &VecDeque<Directive>) {
        let front = d.front().map_or(u64::MAX, |x| x.seq);
        self.front.store(front, Ordering::Relaxed);
    }

    /// The bytes of the pipelined hit that answers request `seq`, if that is one. Inlined
    /// check, out-of-line lock: the server pump asks at every response.
    #[inline(always)]
    fn take_hit(&self, seq: u64) -> Option<Vec<u8>> {
        if self.front.load(Ordering::Relaxed) != seq {
            return None;
        }
        self.take_hit_locked(seq)
    }

    #[inline(never)]
    fn take_hit_locked(&self, seq: u64) -> Option<Vec<u8>> {
        let mut d = self.directives.lock().unwrap_or_else(|e| e.into_inner());
        if !d
            .front()
            .is_some_and(|x| x.seq == seq && matches!(x.action, Action::Hit(_)))
        {
            return None;
        }
        let hit = d.pop_front().map(|x| x.action);
        self.note_front(&d);
        match hit {
            Some(Action::Hit(bytes)) => Some(bytes),
            _ => None,
        }
    }

    /// The directive of request `seq`, if it has one. Inlined check, out-of-line lock: the
    /// server pump asks at every message while no directive is in flight.
    #[inline(always)]
    fn take(&self, seq: u64) -> Option<Directive> {
        if self.front.load(Ordering::Relaxed) != seq {
            return None;
        }
        self.take_locked(seq)
    }

    #[inline(never)]
    fn take_locked(&self, seq: u64) -> Option<Directive> {
        let mut d = self.directives.lock().unwrap_or_else(|e| e.into_inner());
        if d.front().is_none_or(|x| x.seq != seq) {
            return None;
        }
        let taken = d.pop_front();
        self.note_front(&d);
        taken
    }
}

/// Relays a caching session until one side ends, like [`super::relay::run`].
pub async fn run(
    client: &mut ClientConn,
    server: &mut ServerConn,
    shared: &Shared,
    max_message: usize,
    session: &mut CacheSession,
) -> (End, ReleaseState) {
    let st = RelayState::new(server.status);
    let link = Link::new();
    let end = match (&mut client.stream, &mut server.stream) {
        (MaybeTls::Plain(c), MaybeTls::Plain(s)) => {
            let (mut cr, cw) = (&*c, &*c);
            let (mut sr, mut sw) = (&*s, &*s);
            let cw = ClientWriter::new(cw);
            pumps(
                &mut cr,
                &cw,
                &mut sr,
                &mut sw,
                &mut client.buf,
                &mut server.read_buf,
                &st,
                &link,
                shared,
                max_message,
                session,
            )
            .await
        }
        (c, s) => {
            let (mut cr, cw) = tokio::io::split(c);
            let (mut sr, mut sw) = tokio::io::split(s);
            let cw = ClientWriter::new(cw);
            pumps(
                &mut cr,
                &cw,
                &mut sr,
                &mut sw,
                &mut client.buf,
                &mut server.read_buf,
                &st,
                &link,
                shared,
                max_message,
                session,
            )
            .await
        }
    };
    server.status = st.status();
    // Requests that may write were unanswered when the relay ended (the client left, the
    // server failed): they may commit yet, and the server pump, which applies a request's
    // effects when its answer arrives, is gone. Everything of the database goes now, and
    // again once the server has ended them (see `session`).
    if link.last_non_inert.load(Ordering::Relaxed) > link.answered.load(Ordering::Relaxed) {
        invalidate_everything(shared, &session.db);
        session.writes_unanswered = true;
    }
    (end, st.release_state())
}

/// Invalidates every result and plan of `db`: writes of unknown extent may have committed.
pub fn invalidate_everything(shared: &Shared, db: &crate::cache::DatabaseCache) {
    let all = Effects {
        database_wide: true,
        ddl: true,
        ..Effects::default()
    };
    crate::invalidate::proxy::apply_commit(&all, shared, db);
}

#[allow(clippy::too_many_arguments)]
async fn pumps<CR, CW, SR, SW>(
    cr: &mut CR,
    cw: &ClientWriter<CW>,
    sr: &mut SR,
    sw: &mut SW,
    client_buf: &mut bytes::BytesMut,
    server_buf: &mut bytes::BytesMut,
    st: &RelayState,
    link: &Link,
    shared: &Shared,
    max_message: usize,
    session: &mut CacheSession,
) -> End
where
    CR: AsyncRead + Unpin,
    CW: AsyncWrite + Unpin,
    SR: AsyncRead + Unpin,
    SW: AsyncWrite + Unpin,
{
    let db = Arc::clone(&session.db);
    let requests = requests::Requests {
        buf: client_buf,
        st,
        link,
        shared,
        max_message,
        session,
    };
    // As in the plain relay, each pump is polled only after something it waits on woke the
    // task (both wait only on wakers: sockets, the client writer's lock, oneshots, flights).
    tokio::select! {
        biased;
        r = Quiet::new(requests.run(cr, cw, sw)) => super::relay::client_pump_end(r, st),
        r = Quiet::new(responses::run(sr, server_buf, cw, st, link, shared, &db)) => {
            super::relay::server_pump_end(r, st)
        }
        _ = Quiet::new(super::relay::shutdown_when_idle(st, shared)) => End::Shutdown,
    }
}

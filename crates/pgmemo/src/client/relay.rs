//! The steady state of a session-pooled client: bytes flow both ways at once (two pumps in one
//! task, so a client that pipelines while the server streams a result can never deadlock the
//! proxy), while pgmemo tracks just enough to know whether the server connection is at a clean
//! boundary: requests awaiting ReadyForQuery, unsynced extended-protocol messages, partial
//! messages, and the transaction status.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;
use wire::backend::TransactionStatus;
use wire::{ErrorResponse, WireError};

use super::quiet::Quiet;
use super::scan::{Scanner, Verdict};
use super::ClientConn;
use crate::net::MaybeTls;
use crate::pool::{ReleaseState, ServerConn};
use crate::shared::Shared;
use tokio_util::sync::CancellationToken;

/// Read buffers grow to at least this much free space before a read.
pub(crate) const READ_CHUNK: usize = 32 * 1024;
/// Largest message a server may send that pgmemo itself must parse (errors, status).
pub(crate) const MAX_SERVER_FRAME: usize = 1 << 30;
/// Largest ErrorResponse read whole to see whether it is FATAL. A longer one (an error quoting
/// a huge input value) streams through like a row: a FATAL is never that long, and holding it
/// whole would take as much memory as the value.
pub(crate) const MAX_WHOLE_ERROR: usize = 64 * 1024;

/// How a relay ended.
#[derive(Debug)]
pub enum End {
    /// The client sent Terminate.
    ClientTerminated,
    /// The client closed its socket (or it failed).
    ClientGone(Option<std::io::Error>),
    /// The client sent bytes that are not valid protocol.
    ClientProtocol(WireError),
    /// The server closed the connection or it failed; `fatal_forwarded` says whether the
    /// client already received the server's FATAL error explaining why.
    ServerGone { fatal_forwarded: bool },
    /// pgmemo is shutting down and the session was between transactions (or out of time).
    Shutdown,
}

/// What the two pumps share. Atomics, not locks: both run in the same task, so nothing here
/// is ever contended; atomics just keep the task `Send`.
pub(crate) struct RelayState {
    pub(crate) pending: AtomicU32,
    pub(crate) unsynced: AtomicBool,
    pub(crate) client_mid_message: AtomicBool,
    pub(crate) status: AtomicU8,
    pub(crate) server_fatal: AtomicBool,
    /// The server sent CopyInResponse: it is in copy-in mode until the client's CopyDone or
    /// CopyFail, and ignores Syncs meanwhile. A CopyDone or CopyFail outside it is ignored by
    /// the server and must not change what the pumps expect.
    pub(crate) copy_in: AtomicBool,
    pub(crate) watch_idle: AtomicBool,
    pub(crate) idle: Notify,
}

impl RelayState {
    pub(crate) fn new(status: TransactionStatus) -> Self {
        RelayState {
            pending: AtomicU32::new(0),
            unsynced: AtomicBool::new(false),
            client_mid_message: AtomicBool::new(false),
            status: AtomicU8::new(status.as_byte()),
            server_fatal: AtomicBool::new(false),
            copy_in: AtomicBool::new(false),
            watch_idle: AtomicBool::new(false),
            idle: Notify::new(),
        }
    }

    pub(crate) fn status(&self) -> TransactionStatus {
        TransactionStatus::from_byte(self.status.load(Ordering::Relaxed))
            .unwrap_or(TransactionStatus::Failed)
    }

    /// Every request answered, nothing half-sent: the server waits for the next request.
    pub(crate) fn at_boundary(&self) -> bool {
        self.pending.load(Ordering::Relaxed) == 0
            && !self.unsynced.load(Ordering::Relaxed)
            && !self.client_mid_message.load(Ordering::Relaxed)
    }

    pub(crate) fn release_state(&self) -> ReleaseState {
        if self.at_boundary() {
            ReleaseState::Boundary(self.status())
        } else {
            ReleaseState::Dirty
        }
    }
}

/// Relays until one side ends; returns how, and in which state the server connection is.
pub async fn run(
    client: &mut ClientConn,
    server: &mut ServerConn,
    shared: &Shared,
    max_message: usize,
) -> (End, ReleaseState) {
    let st = RelayState::new(server.status);
    let end = match (&mut client.stream, &mut server.stream) {
        (MaybeTls::Plain(c), MaybeTls::Plain(s)) => {
            let (mut cr, mut cw) = (&*c, &*c);
            let (mut sr, mut sw) = (&*s, &*s);
            let pumps = Pumps {
                client_buf: &mut client.buf,
                server_buf: &mut server.read_buf,
                st: &st,
                max_message,
            };
            pumps.run(&mut cr, &mut cw, &mut sr, &mut sw, shared).await
        }
        (c, s) => {
            let (mut cr, mut cw) = tokio::io::split(c);
            let (mut sr, mut sw) = tokio::io::split(s);
            let pumps = Pumps {
                client_buf: &mut client.buf,
                server_buf: &mut server.read_buf,
                st: &st,
                max_message,
            };
            pumps.run(&mut cr, &mut cw, &mut sr, &mut sw, shared).await
        }
    };
    server.status = st.status();
    (end, st.release_state())
}

struct Pumps<'a> {
    client_buf: &'a mut BytesMut,
    server_buf: &'a mut BytesMut,
    st: &'a RelayState,
    max_message: usize,
}

pub(crate) enum PumpError {
    Client(std::io::Error),
    Server(std::io::Error),
    Protocol(WireError),
}

impl Pumps<'_> {
    async fn run<CR, CW, SR, SW>(
        self,
        cr: &mut CR,
        cw: &mut CW,
        sr: &mut SR,
        sw: &mut SW,
        shared: &Shared,
    ) -> End
    where
        CR: AsyncRead + Unpin,
        CW: AsyncWrite + Unpin,
        SR: AsyncRead + Unpin,
        SW: AsyncWrite + Unpin,
    {
        let st = self.st;
        // Fixed polling order: each branch is a loop that runs for the whole session, so
        // select!'s random start (a thread-local RNG draw per wake-up) buys no fairness here.
        // Each pump is polled only after its own socket (or a write it waits on) woke the
        // task: select! alone would poll the other pump's socket for nothing at every message.
        tokio::select! {
            biased;
            r = Quiet::new(client_to_server(cr, self.client_buf, sw, st, self.max_message)) => {
                client_pump_end(r, st)
            }
            r = Quiet::new(server_to_client(sr, self.server_buf, cw, st)) => server_pump_end(r, st),
            _ = Quiet::new(shutdown_when_idle(st, shared)) => End::Shutdown,
        }
    }
}

/// How a session ended when its client pump stopped (`Ok(true)`: Terminate, `Ok(false)`: EOF).
/// Shared by the pass-through and the caching relay.
pub(crate) fn client_pump_end(r: Result<bool, PumpError>, st: &RelayState) -> End {
    match r {
        Ok(true) => End::ClientTerminated,
        Ok(false) => End::ClientGone(None),
        Err(PumpError::Client(e)) => End::ClientGone(Some(e)),
        Err(PumpError::Protocol(e)) => End::ClientProtocol(e),
        Err(PumpError::Server(e)) => {
            tracing::debug!(error = %e, "writing to server failed");
            End::ServerGone {
                fatal_forwarded: st.server_fatal.load(Ordering::Relaxed),
            }
        }
    }
}

/// How a session ended when its server pump stopped.
pub(crate) fn server_pump_end(r: Result<(), PumpError>, st: &RelayState) -> End {
    let fatal_forwarded = st.server_fatal.load(Ordering::Relaxed);
    match r {
        Err(PumpError::Client(e)) => End::ClientGone(Some(e)),
        Err(PumpError::Server(e)) => {
            tracing::debug!(error = %e, "reading from server failed");
            End::ServerGone { fatal_forwarded }
        }
        Err(PumpError::Protocol(e)) => {
            tracing::warn!(error = %e, "invalid data from server");
            End::ServerGone { fatal_forwarded }
        }
        Ok(()) => End::ServerGone { fatal_forwarded },
    }
}

/// Forwards client bytes; returns `Ok(true)` on Terminate and `Ok(false)` on EOF.
async fn client_to_server<R, W>(
    reader: &mut R,
    buf: &mut BytesMut,
    server: &mut W,
    st: &RelayState,
    max_message: usize,
) -> Result<bool, PumpError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut scanner = Scanner::default();
    // Syncs sent since the last Execute/Query. The server ignores Sync in copy-in mode, so the
    // ones between a COPY's Execute and its CopyDone/CopyFail get no ReadyForQuery (libpq and
    // tokio-postgres send Sync right after the Execute and again after CopyDone).
    let mut syncs_since_request: u32 = 0;
    loop {
        if !buf.is_empty() {
            let scanned = scanner
                .scan(
                    buf,
                    max_message,
                    |_, _| false,
                    |tag, _| match tag {
                        b'X' => Verdict::StopBefore,
                        b'Q' | b'F' => {
                            st.pending.fetch_add(1, Ordering::Relaxed);
                            syncs_since_request = 0;
                            Verdict::Forward
                        }
                        b'S' => {
                            st.pending.fetch_add(1, Ordering::Relaxed);
                            st.unsynced.store(false, Ordering::Relaxed);
                            syncs_since_request += 1;
                            Verdict::Forward
                        }
                        b'c' | b'f' => {
                            let ignored = std::mem::take(&mut syncs_since_request);
                            if st.copy_in.swap(false, Ordering::Relaxed) {
                                let _ = st.pending.fetch_update(
                                    Ordering::Relaxed,
                                    Ordering::Relaxed,
                                    |p| Some(p.saturating_sub(ignored)),
                                );
                            }
                            Verdict::Forward
                        }
                        b'P' | b'B' | b'D' | b'E' | b'C' => {
                            if tag == b'E' {
                                syncs_since_request = 0;
                            }
                            st.unsynced.store(true, Ordering::Relaxed);
                            Verdict::Forward
                        }
                        _ => Verdict::Forward,
                    },
                )
                .map_err(PumpError::Protocol)?;
            st.client_mid_message
                .store(scanner.mid_message(), Ordering::Relaxed);
            if scanned.forward > 0 {
                server
                    .write_all(&buf[..scanned.forward])
                    .await
                    .map_err(PumpError::Server)?;
                server.flush().await.map_err(PumpError::Server)?;
                buf.advance(scanned.forward);
            }
            if scanned.stopped {
                return Ok(true);
            }
        }
        refill_position(buf);
        if reader.read_buf(buf).await.map_err(PumpError::Client)? == 0 {
            return Ok(false);
        }
    }
}

/// Forwards server bytes, noting ReadyForQuery status and FATAL errors.
async fn server_to_client<R, W>(
    reader: &mut R,
    buf: &mut BytesMut,
    client: &mut W,
    st: &RelayState,
) -> Result<(), PumpError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut scanner = Scanner::default();
    loop {
        if !buf.is_empty() {
            let mut became_idle = false;
            let scanned = scanner
                .scan(
                    buf,
                    MAX_SERVER_FRAME,
                    |t, len| t == b'Z' || (t == b'E' && len <= MAX_WHOLE_ERROR),
                    |tag, frame| {
                        match (tag, frame) {
                            (b'Z', Some(f)) if f.len() == 6 => {
                                st.status.store(f[5], Ordering::Relaxed);
                                let left = st.pending.load(Ordering::Relaxed).saturating_sub(1);
                                st.pending.store(left, Ordering::Relaxed);
                                became_idle = left == 0;
                            }
                            (b'E', Some(f))
                                if ErrorResponse::parse(&f[5..]).is_ok_and(|e| e.is_fatal()) =>
                            {
                                st.server_fatal.store(true, Ordering::Relaxed);
                            }
                            (b'G', _) => st.copy_in.store(true, Ordering::Relaxed),
                            _ => {}
                        }
                        Verdict::Forward
                    },
                )
                .map_err(PumpError::Protocol)?;
            if scanned.forward > 0 {
                client
                    .write_all(&buf[..scanned.forward])
                    .await
                    .map_err(PumpError::Client)?;
                client.flush().await.map_err(PumpError::Client)?;
                buf.advance(scanned.forward);
            }
            if became_idle && st.watch_idle.load(Ordering::Relaxed) {
                st.idle.notify_waiters();
            }
        }
        refill_position(buf);
        if reader.read_buf(buf).await.map_err(PumpError::Server)? == 0 {
            return Err(PumpError::Server(std::io::ErrorKind::UnexpectedEof.into()));
        }
    }
}

/// Makes room for the next read. An emptied buffer starts again at the front of its allocation
/// (`reserve` on an empty, unshared BytesMut moves no bytes), so a session keeps reading into the
/// same few cache lines instead of walking through its whole buffer message by message: with
/// many sessions that walk costs cache misses on every message.
pub(crate) fn refill_position(buf: &mut BytesMut) {
    if buf.is_empty() || buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
}

/// Completes once pgmemo is shutting down and the session sits between transactions, or at
/// once when the shutdown grace period is over.
///
/// The tokens are per-session children of the process-wide ones: every wake-up of the session
/// polls them, and polling a token takes its lock, so sharing one token between sessions would
/// serialize all clients on it.
pub(crate) async fn shutdown_when_idle(st: &RelayState, shared: &Shared) {
    let stop: CancellationToken = shared.stop_accepting.child_token();
    let terminate: CancellationToken = shared.terminate_sessions.child_token();
    let idle_between_transactions = async {
        stop.cancelled().await;
        st.watch_idle.store(true, Ordering::Relaxed);
        loop {
            let notified = st.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if st.at_boundary() && st.status() == TransactionStatus::Idle {
                return;
            }
            notified.await;
        }
    };
    tokio::select! {
        _ = terminate.cancelled() => {}
        _ = idle_between_transactions => {}
    }
}

//! The server pump of a caching session: forwards responses, captures the ones a directive
//! asks for and stores them if they complete cleanly and no write committed meanwhile, keeps
//! pgmemo's own queries' answers from the client, and applies each request's effects when its
//! ReadyForQuery arrives: at once for autocommit statements, at COMMIT for transactions (before
//! the client can see the COMMIT's result), never for a ROLLBACK.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use wire::backend::TransactionStatus;
use wire::{ErrorResponse, FrameHeader};

use super::{Action, ClientWriter, Directive, Link};
use crate::cache::capture::Filling;
use crate::cache::catalog::Row;
use crate::cache::plan::{Effects, Refusal};
use crate::cache::DatabaseCache;
use crate::client::relay::{
    refill_position, PumpError, RelayState, MAX_SERVER_FRAME, MAX_WHOLE_ERROR,
};
use crate::shared::Shared;

/// What the pump tracks about the response in flight.
#[derive(Default)]
struct InFlight {
    directive: Option<Directive>,
    filling: Option<Filling>,
    internal_rows: Vec<Row>,
    error: bool,
    swallowed: bool,
    /// The error of pgmemo's refused Parse ahead of a cancelled request was replaced (see
    /// `Directive::cancelled`).
    replaced: bool,
    /// The client's ParseCompletes seen so far.
    parsed: usize,
    /// The client's BindCompletes seen so far.
    bound: usize,
    /// A COMMIT completed in this response: its writes are visible to everyone even when
    /// the session is still in a transaction at the end (`COMMIT AND CHAIN`, or more
    /// statements after it in the same Query).
    committed: bool,
}

/// Runs the server pump until the server closes or fails.
pub(super) async fn run<R, W>(
    reader: &mut R,
    buf: &mut BytesMut,
    client: &ClientWriter<W>,
    st: &RelayState,
    link: &Link,
    shared: &Shared,
    db: &Arc<DatabaseCache>,
) -> Result<(), PumpError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut done: u64 = 0;
    let mut body_left = 0usize;
    let mut flight = InFlight::default();
    let mut txn = Effects::default();
    // Lent to each capture in turn (see `Filling`).
    let mut scratch = Vec::new();
    loop {
        if !buf.is_empty() {
            let mut pos = 0;
            let mut fwd_start = 0;
            let mut answered = 0u32;
            let mut writer = client.lock().await;
            loop {
                if body_left > 0 {
                    let n = body_left.min(buf.len() - pos);
                    pos += n;
                    body_left -= n;
                    if body_left > 0 {
                        break;
                    }
                }
                if flight.directive.is_none() {
                    if let Some(d) = link.take(done) {
                        if let Action::Capture(_) = &d.action {
                            start_filling(&mut flight, d, std::mem::take(&mut scratch));
                        } else {
                            flight.directive = Some(d);
                        }
                    }
                }
                let Some(header) = FrameHeader::peek(&buf[pos..], MAX_SERVER_FRAME)
                    .map_err(PumpError::Protocol)?
                else {
                    break;
                };
                let tag = header.tag;
                let len = header.frame_len;
                if tag == b'Z' && len != 6 {
                    return Err(PumpError::Protocol(wire::WireError::Malformed(
                        "ReadyForQuery of the wrong length",
                    )));
                }
                let internal = matches!(
                    flight.directive.as_ref().map(|d| &d.action),
                    Some(Action::Internal(_))
                );
                if let Some(f) = flight.filling.as_mut() {
                    if !f.fits(len) {
                        f.abort(Refusal::TooLarge);
                    }
                }
                let capturing = flight.filling.as_ref().is_some_and(Filling::is_ok);
                let swallow = !flight.swallowed
                    && flight
                        .directive
                        .as_ref()
                        .is_some_and(|d| d.swallow_first == Some(tag));
                // An error too long to read whole (see MAX_WHOLE_ERROR) still fails the request.
                let long_error = tag == b'E' && len > MAX_WHOLE_ERROR;
                if long_error {
                    flight.error = true;
                }
                let need_whole =
                    tag == b'Z' || (tag == b'E' && !long_error) || internal || capturing || swallow;
                let available = buf.len() - pos;
                if available < len {
                    if need_whole {
                        break;
                    }
                    pos = buf.len();
                    body_left = len - available;
                    break;
                }
                let frame = &buf[pos..pos + len];
                if internal {
                    // pgmemo's own query: the client sees only notifications and parameter
                    // changes that happen to arrive with it.
                    if !matches!(tag, b'A' | b'S') {
                        write(&mut *writer, &buf[fwd_start..pos]).await?;
                        fwd_start = pos + len;
                    }
                    match tag {
                        b'D' => flight.internal_rows.push(text_columns(&frame[5..])),
                        b'E' => flight.error = true,
                        // A setting reported with pgmemo's own query (a reload of the
                        // server's configuration is reported at the next query, whichever
                        // it is) changes the context as much as one reported with the
                        // client's.
                        b'S' => link.context_stale.store(true, Ordering::Relaxed),
                        b'Z' => {
                            st.status.store(frame[5], Ordering::Relaxed);
                            answered += 1;
                            done += 1;
                            let d = flight.directive.take();
                            let rows = std::mem::take(&mut flight.internal_rows);
                            if let Some(Directive {
                                action: Action::Internal(reply),
                                ..
                            }) = d
                            {
                                let _ = reply.send((!flight.error).then_some(rows));
                            }
                            flight = InFlight::default();
                        }
                        _ => {}
                    }
                    pos += len;
                    continue;
                }
                if tag == b'E'
                    && !flight.replaced
                    && flight.directive.as_ref().is_some_and(|d| d.cancelled)
                {
                    write(&mut *writer, &buf[fwd_start..pos]).await?;
                    write(&mut *writer, &crate::cancel::cancelled_error().encode()).await?;
                    fwd_start = pos + len;
                    flight.replaced = true;
                    flight.error = true;
                    pos += len;
                    continue;
                }
                if swallow {
                    write(&mut *writer, &buf[fwd_start..pos]).await?;
                    fwd_start = pos + len;
                    flight.swallowed = true;
                    pos += len;
                    continue;
                }
                if let Some(f) = flight.filling.as_mut() {
                    if tag != b'Z' {
                        f.add(tag, frame);
                    }
                }
                match tag {
                    b'1' => {
                        if let Some(p) = flight
                            .directive
                            .as_ref()
                            .and_then(|d| d.confirms.parses.get(flight.parsed))
                        {
                            p.confirm();
                        }
                        flight.parsed += 1;
                    }
                    b'2' => {
                        if let Some(b) = flight
                            .directive
                            .as_ref()
                            .and_then(|d| d.confirms.binds.get(flight.bound))
                        {
                            b.confirm();
                        }
                        flight.bound += 1;
                    }
                    b'E' => {
                        flight.error = true;
                        if ErrorResponse::parse(&frame[5..]).is_ok_and(|e| e.is_fatal()) {
                            st.server_fatal.store(true, Ordering::Relaxed);
                        }
                    }
                    b'S' => link.context_stale.store(true, Ordering::Relaxed),
                    b'G' => st.copy_in.store(true, Ordering::Relaxed),
                    b'C' if &frame[5..] == b"COMMIT\0" => flight.committed = true,
                    b'Z' => {
                        // Directives made for this request after its response had begun (its
                        // Sync came after a Flush-driven answer started) join the one in use.
                        while let Some(late) = link.take(done) {
                            match flight.directive.as_mut() {
                                Some(d) => d.merge(late),
                                None => flight.directive = Some(late),
                            }
                        }
                        let status = frame[5];
                        st.status.store(status, Ordering::Relaxed);
                        let status = TransactionStatus::from_byte(status)
                            .unwrap_or(TransactionStatus::Failed);
                        if let Some(f) = flight.filling.take() {
                            scratch = f.finish(flight.error, &shared.cache, &shared.upstream_time);
                        }
                        finish(&mut flight, status, &mut txn, link, shared, db);
                        answered += 1;
                        done += 1;
                        flight = InFlight::default();
                        // Pipelined requests answered from the cache come right after.
                        if let Some(first) = link.take_hit(done) {
                            write(&mut *writer, &buf[fwd_start..pos + len]).await?;
                            fwd_start = pos + len;
                            let mut hit = Some(first);
                            while let Some(bytes) = hit {
                                write_hit(&mut *writer, &bytes, frame_status(st)).await?;
                                answered += 1;
                                done += 1;
                                hit = link.take_hit(done);
                            }
                        }
                    }
                    _ => {}
                }
                pos += len;
            }
            write(&mut *writer, &buf[fwd_start..pos]).await?;
            // Hits queued while this pump was writing.
            while let Some(bytes) = link.take_hit(done) {
                write_hit(&mut *writer, &bytes, frame_status(st)).await?;
                answered += 1;
                done += 1;
            }
            drop(writer);
            link.answered.store(done, Ordering::Relaxed);
            buf.advance(pos);
            if answered > 0 {
                let left = st.pending.load(Ordering::Relaxed).saturating_sub(answered);
                st.pending.store(left, Ordering::Relaxed);
                if left == 0 && st.watch_idle.load(Ordering::Relaxed) {
                    st.idle.notify_waiters();
                }
            }
        }
        refill_position(buf);
        if reader.read_buf(buf).await.map_err(PumpError::Server)? == 0 {
            return Err(PumpError::Server(std::io::ErrorKind::UnexpectedEof.into()));
        }
    }
}

fn start_filling(flight: &mut InFlight, d: Directive, scratch: Vec<u8>) {
    let Directive {
        seq,
        action,
        effects,
        swallow_first,
        cancelled,
        confirms,
    } = d;
    if let Action::Capture(capture) = action {
        flight.filling = Some(Filling::new(capture, scratch));
    }
    flight.directive = Some(Directive {
        seq,
        action: Action::Forward,
        effects,
        swallow_first,
        cancelled,
        confirms,
    });
}

fn frame_status(st: &RelayState) -> u8 {
    st.status.load(Ordering::Relaxed)
}

/// Writes a pipelined hit's bytes and its ReadyForQuery.
async fn write_hit<W: AsyncWrite + Unpin>(
    w: &mut W,
    bytes: &[u8],
    status: u8,
) -> Result<(), PumpError> {
    w.write_all(bytes).await.map_err(PumpError::Client)?;
    w.write_all(&[b'Z', 0, 0, 0, 5, status])
        .await
        .map_err(PumpError::Client)?;
    w.flush().await.map_err(PumpError::Client)
}

async fn write<W: AsyncWrite + Unpin>(w: &mut W, bytes: &[u8]) -> Result<(), PumpError> {
    if bytes.is_empty() {
        return Ok(());
    }
    w.write_all(bytes).await.map_err(PumpError::Client)?;
    w.flush().await.map_err(PumpError::Client)
}

/// The columns of a DataRow body as text.
fn text_columns(body: &[u8]) -> Row {
    let mut row = Vec::new();
    let Some(count) = body.get(..2) else {
        return row;
    };
    let count = u16::from_be_bytes([count[0], count[1]]);
    let mut rest = &body[2..];
    for _ in 0..count {
        if rest.len() < 4 {
            break;
        }
        let n = i32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
        rest = &rest[4..];
        if n < 0 {
            row.push(None);
            continue;
        }
        let n = (n as usize).min(rest.len());
        row.push(Some(String::from_utf8_lossy(&rest[..n]).into_owned()));
        rest = &rest[n..];
    }
    row
}

/// A response ended with ReadyForQuery(`status`) (its capture already finished): apply its
/// effects.
fn finish(
    flight: &mut InFlight,
    status: TransactionStatus,
    txn: &mut Effects,
    link: &Link,
    shared: &Shared,
    db: &DatabaseCache,
) {
    let Some(d) = flight.directive.take() else {
        if status == TransactionStatus::Idle {
            end_transaction(txn, link, shared, db);
        } else if flight.committed {
            commit_within(txn, (false, false), link, shared, db);
        }
        return;
    };
    let e = d.effects;
    tracing::debug!(seq = d.seq, ?status, effects = ?e, "response complete");
    // A ROLLBACK in a response that also committed (`COMMIT; ROLLBACK` in one Query) may
    // have come after the COMMIT: the committed writes stay.
    if e.rollback && !flight.committed {
        *txn = Effects::default();
        link.txn_wrote.store(false, Ordering::Relaxed);
    }
    txn.merge(&e);
    if e.settings {
        link.context_stale.store(true, Ordering::Relaxed);
    }
    if status == TransactionStatus::Idle {
        end_transaction(txn, link, shared, db);
    } else if flight.committed {
        // Which of the response's writes came after the COMMIT is not known: all of them
        // go now, and any of them may belong to the transaction still open.
        commit_within(txn, (e.writes_data(), e.snapshot), link, shared, db);
    } else {
        if e.writes_data() {
            link.txn_wrote.store(true, Ordering::Relaxed);
        }
        if e.snapshot {
            link.txn_snapshot.store(true, Ordering::Relaxed);
        }
    }
}

/// A COMMIT completed but the session is in a transaction again: the committed writes go as
/// at the end of a transaction. What the response says of the new one (`wrote`: it may have
/// written; `snapshot`: a `BEGIN` in it asked for REPEATABLE READ or SERIALIZABLE) is
/// added to what held for the old one, which `AND CHAIN` keeps (its isolation level).
fn commit_within(
    txn: &mut Effects,
    (wrote, snapshot): (bool, bool),
    link: &Link,
    shared: &Shared,
    db: &DatabaseCache,
) {
    let snapshot = snapshot || link.txn_snapshot.load(Ordering::Relaxed);
    end_transaction(txn, link, shared, db);
    link.txn_snapshot.store(snapshot, Ordering::Relaxed);
    link.txn_wrote.store(wrote, Ordering::Relaxed);
}

/// The transaction is over (committed, or rolled back with `txn` already emptied): its writes
/// become visible to everyone, so results depending on them go.
fn end_transaction(txn: &mut Effects, link: &Link, shared: &Shared, db: &DatabaseCache) {
    let e = std::mem::take(txn);
    link.txn_wrote.store(false, Ordering::Relaxed);
    link.txn_snapshot.store(false, Ordering::Relaxed);
    if crate::invalidate::proxy::apply_commit(&e, shared, db) {
        link.await_feed.store(true, Ordering::Relaxed);
    }
}

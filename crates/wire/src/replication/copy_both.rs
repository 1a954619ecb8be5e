//! The CopyData payloads of the streaming-replication protocol (CopyBoth mode after
//! `START_REPLICATION`): the walsender's XLogData and keepalive, and the client's status update.
//!
//! The replication consumer reads every server CopyData through [`WalSenderMessage::decode`],
//! hands the XLogData payload to [`super::pgoutput`], and answers keepalives (and reports
//! progress) with a [`StandbyStatusUpdate`] frame.

use bytes::{BufMut, Bytes, BytesMut};

use super::lsn::Lsn;
use crate::buf::{put_message, BodyReader};
use crate::frame::WireError;

/// The first byte of each replication CopyData payload, so that a consumer can route payloads
/// without decoding them.
pub mod tag {
    /// XLogData (server to client): WAL, or one pgoutput message in logical replication.
    pub const XLOG_DATA: u8 = b'w';
    /// Primary keepalive (server to client).
    pub const PRIMARY_KEEPALIVE: u8 = b'k';
    /// Standby status update (client to server).
    pub const STANDBY_STATUS_UPDATE: u8 = b'r';
    /// The CopyData frame that carries all of them.
    pub const COPY_DATA: u8 = b'd';
}

/// What a walsender streams inside CopyData. Kept separate from the client's messages because
/// each side sends different ones under overlapping bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WalSenderMessage {
    /// WAL data; in logical replication, one output plugin message.
    XLogData(XLogData),
    /// A heartbeat, possibly demanding an immediate status update.
    PrimaryKeepalive(PrimaryKeepalive),
}

/// XLogData: a chunk of WAL or, for a logical slot, exactly one output plugin message (decode it
/// with [`super::LogicalMessage::decode`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XLogData {
    /// Where the data starts in the WAL. A logical walsender puts the LSN of the decoded record
    /// here (the end of the transaction for Commit).
    pub wal_start: Lsn,
    /// The current end of WAL on the server (a logical walsender repeats `wal_start`).
    pub wal_end: Lsn,
    /// The server's clock at transmission, µs since 2000-01-01 (see [`super::pg_time_to_system`]).
    pub send_time: i64,
    /// The payload, zero-copy.
    pub data: Bytes,
}

/// Primary keepalive: tells an idle consumer how far the server's WAL goes, and may ask for a
/// [`StandbyStatusUpdate`] at once (the server disconnects after `wal_sender_timeout` without
/// one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrimaryKeepalive {
    /// The current end of WAL on the server.
    pub wal_end: Lsn,
    /// The server's clock at transmission, µs since 2000-01-01.
    pub send_time: i64,
    /// The server wants a status update now.
    pub reply_requested: bool,
}

/// Standby status update: how far the consumer has written, flushed and applied the stream. The
/// flushed position is what a logical slot's `confirmed_flush_lsn` advances to, letting the server
/// recycle WAL; replies also keep the connection from timing out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StandbyStatusUpdate {
    /// Last WAL byte + 1 received and written.
    pub written: Lsn,
    /// Last WAL byte + 1 flushed (for pgmemo: processed, nothing to redo after a restart).
    pub flushed: Lsn,
    /// Last WAL byte + 1 applied.
    pub applied: Lsn,
    /// The client's clock, µs since 2000-01-01 (see [`super::system_to_pg_time`]).
    pub client_time: i64,
    /// Asks the server to answer at once with a keepalive (used to probe the connection).
    pub reply_requested: bool,
}

impl WalSenderMessage {
    /// Decodes the payload of a server CopyData (the body of
    /// [`crate::backend::BackendMessage::CopyData`]). Truncation, a bad flag byte or trailing
    /// bytes after a keepalive are errors; an unknown first byte is
    /// [`WireError::UnexpectedTag`].
    pub fn decode(payload: Bytes) -> Result<WalSenderMessage, WireError> {
        let mut r = BodyReader::new(payload);
        match r.u8()? {
            tag::XLOG_DATA => Ok(WalSenderMessage::XLogData(XLogData {
                wal_start: Lsn(r.u64()?),
                wal_end: Lsn(r.u64()?),
                send_time: r.i64()?,
                data: r.rest(),
            })),
            tag::PRIMARY_KEEPALIVE => {
                let msg = PrimaryKeepalive {
                    wal_end: Lsn(r.u64()?),
                    send_time: r.i64()?,
                    reply_requested: flag(r.u8()?)?,
                };
                r.finish("trailing bytes after primary keepalive")?;
                Ok(WalSenderMessage::PrimaryKeepalive(msg))
            }
            other => Err(WireError::UnexpectedTag(other)),
        }
    }

    /// Appends a whole CopyData frame carrying this message, as a walsender would send it (for
    /// test servers and round trips).
    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            WalSenderMessage::XLogData(x) => x.encode(out),
            WalSenderMessage::PrimaryKeepalive(k) => k.encode(out),
        }
    }
}

impl XLogData {
    /// Appends a whole CopyData frame carrying this XLogData.
    pub fn encode(&self, out: &mut BytesMut) {
        put_message(out, tag::COPY_DATA, |b| {
            b.put_u8(tag::XLOG_DATA);
            b.put_u64(self.wal_start.0);
            b.put_u64(self.wal_end.0);
            b.put_i64(self.send_time);
            b.extend_from_slice(&self.data);
        });
    }
}

impl PrimaryKeepalive {
    /// Appends a whole CopyData frame carrying this keepalive.
    pub fn encode(&self, out: &mut BytesMut) {
        put_message(out, tag::COPY_DATA, |b| {
            b.put_u8(tag::PRIMARY_KEEPALIVE);
            b.put_u64(self.wal_end.0);
            b.put_i64(self.send_time);
            b.put_u8(self.reply_requested.into());
        });
    }
}

impl StandbyStatusUpdate {
    /// Appends the whole CopyData frame (`'d'`, length, payload) the consumer writes to the
    /// replication connection.
    pub fn encode(&self, out: &mut BytesMut) {
        put_message(out, tag::COPY_DATA, |b| {
            b.put_u8(tag::STANDBY_STATUS_UPDATE);
            b.put_u64(self.written.0);
            b.put_u64(self.flushed.0);
            b.put_u64(self.applied.0);
            b.put_i64(self.client_time);
            b.put_u8(self.reply_requested.into());
        });
    }

    /// Decodes the payload of a client CopyData (the body of
    /// [`crate::frontend::FrontendMessage::CopyData`]), for test servers and round trips.
    pub fn decode(payload: Bytes) -> Result<StandbyStatusUpdate, WireError> {
        let mut r = BodyReader::new(payload);
        match r.u8()? {
            tag::STANDBY_STATUS_UPDATE => {}
            other => return Err(WireError::UnexpectedTag(other)),
        }
        let msg = StandbyStatusUpdate {
            written: Lsn(r.u64()?),
            flushed: Lsn(r.u64()?),
            applied: Lsn(r.u64()?),
            client_time: r.i64()?,
            reply_requested: flag(r.u8()?)?,
        };
        r.finish("trailing bytes after standby status update")?;
        Ok(msg)
    }
}

/// The WAL position a consumer has received once it has read `xlog`: the larger of its start and
/// end, as PostgreSQL's own logical apply worker counts `last_received`. A logical walsender puts
/// the same LSN in both fields, so this is the position of the decoded record; which position to
/// acknowledge as flushed (e.g. only Commit ends) is the consumer's decision.
pub fn lsn_of_xlog(xlog: &XLogData) -> Lsn {
    xlog.wal_start.max(xlog.wal_end)
}

/// A boolean byte: PostgreSQL writes exactly 0 or 1, anything else is not this protocol.
fn flag(b: u8) -> Result<bool, WireError> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(WireError::Malformed(
            "reply-requested flag is neither 0 nor 1",
        )),
    }
}

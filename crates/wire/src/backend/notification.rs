//! NotificationResponse: a NOTIFY delivered to a session that ran LISTEN.
//!
//! It arrives asynchronously, between or even inside query results, so the relay must recognise
//! it wherever it appears; a cache capturing a result must pass it through, not store it.

use bytes::{BufMut, Bytes, BytesMut};

use super::tag;
use crate::buf::{as_text, put_cbytes, put_message, BodyReader};
use crate::frame::WireError;

/// A NOTIFY from another session (or this one).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NotificationResponse {
    /// Process id of the notifying backend.
    pub pid: i32,
    /// The channel name, in the client's encoding.
    pub channel: Bytes,
    /// The payload string, empty when none was given.
    pub payload: Bytes,
}

impl NotificationResponse {
    /// Decodes a NotificationResponse body.
    pub fn decode(body: Bytes) -> Result<NotificationResponse, WireError> {
        let mut r = BodyReader::new(body);
        let msg = NotificationResponse {
            pid: r.i32()?,
            channel: r.cstr()?,
            payload: r.cstr()?,
        };
        r.finish("trailing bytes after NotificationResponse")?;
        Ok(msg)
    }

    /// Appends the NotificationResponse frame to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        put_message(out, tag::NOTIFICATION_RESPONSE, |b| {
            b.put_i32(self.pid);
            put_cbytes(b, &self.channel);
            put_cbytes(b, &self.payload);
        });
    }

    /// The channel name when it is UTF-8.
    pub fn channel_str(&self) -> Option<&str> {
        as_text(&self.channel)
    }

    /// The payload when it is UTF-8.
    pub fn payload_str(&self) -> Option<&str> {
        as_text(&self.payload)
    }
}

//! Framing of regular (tagged) protocol messages: one type byte, a 4-byte length that counts
//! itself, then the body.
//!
//! pgmemo relays most messages without decoding them, so framing is split in two: a cheap
//! [`FrameHeader`] peek that lets a relay forward bodies as they stream in, and a whole-[`Frame`]
//! decoder for the few messages pgmemo must read.

use bytes::{Buf, Bytes, BytesMut};

/// Errors found while decoding protocol bytes. Each maps to an `08P01` protocol violation at the
/// client edge.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("invalid message length {0}")]
    InvalidLength(i64),
    #[error("message of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("message truncated")]
    Truncated,
    #[error("missing string terminator")]
    MissingTerminator,
    #[error("invalid UTF-8 in message")]
    InvalidUtf8,
    #[error("unexpected message type '{}'", char::from(*.0))]
    UnexpectedTag(u8),
    #[error("invalid startup packet layout: {0}")]
    InvalidStartup(&'static str),
    #[error("unsupported frontend protocol {major}.{minor}")]
    UnsupportedProtocol { major: u16, minor: u16 },
    #[error("invalid authentication message: {0}")]
    InvalidAuth(&'static str),
    /// A body that does not match the layout its tag promises: bad counts, bad enum bytes or
    /// bytes left over after the last field.
    #[error("malformed message: {0}")]
    Malformed(&'static str),
}

/// The fixed 5-byte prefix of a tagged message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The message type byte.
    pub tag: u8,
    /// Length of the whole frame including the tag byte (`1 + length field`).
    pub frame_len: usize,
}

impl FrameHeader {
    /// Size of the tag plus length field.
    pub const SIZE: usize = 5;

    /// Reads the header at the start of `buf` without consuming it. `Ok(None)` means more bytes
    /// are needed; a length below 4 or above `max_frame` is an error so that a hostile peer cannot
    /// make the relay allocate or wait for gigabytes.
    pub fn peek(buf: &[u8], max_frame: usize) -> Result<Option<FrameHeader>, WireError> {
        if buf.len() < Self::SIZE {
            return Ok(None);
        }
        let len = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
        if len < 4 {
            return Err(WireError::InvalidLength(len.into()));
        }
        let frame_len = 1 + len as usize;
        if frame_len > max_frame {
            return Err(WireError::TooLarge {
                len: frame_len,
                max: max_frame,
            });
        }
        Ok(Some(FrameHeader {
            tag: buf[0],
            frame_len,
        }))
    }
}

/// One whole tagged message, kept as the exact bytes received so it can be forwarded untouched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    raw: Bytes,
}

/// Most a buffer grows ahead of the bytes that arrived, on a frame header's word alone.
const RESERVE_AHEAD: usize = 64 * 1024;

/// Makes room in `buf` toward `total` bytes (a frame whose header arrived): at most as much
/// again as `buf` holds, and at least [`RESERVE_AHEAD`]. A header may claim up to the size
/// limit; reserving all of it at once would let a peer that sends only headers make pgmemo
/// allocate that much per connection. Growing with what actually arrives still reads a large
/// frame in few reallocations (the room at least doubles each time).
pub fn reserve_toward(buf: &mut BytesMut, total: usize) {
    let missing = total.saturating_sub(buf.len());
    buf.reserve(missing.min(buf.len().max(RESERVE_AHEAD)));
}

impl Frame {
    /// Splits one complete frame off the front of `buf`, or returns `Ok(None)` when it has not
    /// fully arrived yet.
    pub fn decode(buf: &mut BytesMut, max_frame: usize) -> Result<Option<Frame>, WireError> {
        match FrameHeader::peek(buf, max_frame)? {
            Some(h) if buf.len() >= h.frame_len => Ok(Some(Frame {
                raw: buf.split_to(h.frame_len).freeze(),
            })),
            Some(h) => {
                reserve_toward(buf, h.frame_len);
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// Wraps bytes that are known to hold exactly one frame (built by this crate).
    pub fn from_raw(raw: Bytes) -> Frame {
        debug_assert!(raw.len() >= FrameHeader::SIZE);
        Frame { raw }
    }

    /// The message type byte.
    pub fn tag(&self) -> u8 {
        self.raw[0]
    }

    /// The body after the length field.
    pub fn body(&self) -> &[u8] {
        &self.raw[FrameHeader::SIZE..]
    }

    /// The body as shared bytes, without copying.
    pub fn body_bytes(&self) -> Bytes {
        let mut b = self.raw.clone();
        b.advance(FrameHeader::SIZE);
        b
    }

    /// The whole frame as received, for forwarding.
    pub fn raw(&self) -> &Bytes {
        &self.raw
    }

    /// Consumes the frame into its bytes.
    pub fn into_raw(self) -> Bytes {
        self.raw
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_complete_frame_and_leaves_rest() {
        let mut buf = BytesMut::from(&b"Z\0\0\0\x05IQ\0\0"[..]);
        let f = Frame::decode(&mut buf, 1024).unwrap().unwrap();
        assert_eq!(f.tag(), b'Z');
        assert_eq!(f.body(), b"I");
        assert_eq!(&buf[..], b"Q\0\0");
        assert_eq!(Frame::decode(&mut buf, 1024).unwrap(), None);
    }

    #[test]
    fn a_large_header_alone_reserves_little() {
        // A header claiming 200 MB reserves tens of kilobytes, not the whole frame.
        let mut buf = BytesMut::from(&b"Q\x0b\xeb\xc2\x00"[..]);
        assert_eq!(Frame::decode(&mut buf, 256 << 20).unwrap(), None);
        assert!(buf.capacity() <= 128 * 1024, "{}", buf.capacity());
        // As bytes arrive the room keeps growing, at least doubling.
        let mut buf = BytesMut::with_capacity(0);
        buf.resize(1 << 20, 0);
        let before = buf.capacity();
        reserve_toward(&mut buf, 200 << 20);
        assert!(
            buf.capacity() >= 2 * before,
            "{before} -> {}",
            buf.capacity()
        );
        // Nothing is reserved for a frame that is all there.
        let mut buf = BytesMut::from(&b"Z\0\0\0\x05I"[..]);
        let cap = buf.capacity();
        reserve_toward(&mut buf, 6);
        assert_eq!(buf.capacity(), cap);
    }

    #[test]
    fn rejects_short_and_oversized_lengths() {
        assert_eq!(
            FrameHeader::peek(b"Q\0\0\0\x03", 100),
            Err(WireError::InvalidLength(3))
        );
        assert!(matches!(
            FrameHeader::peek(b"Q\x7f\xff\xff\xff", 100),
            Err(WireError::TooLarge { .. })
        ));
        assert!(matches!(
            FrameHeader::peek(b"Q\xff\xff\xff\xff", 100),
            Err(WireError::InvalidLength(-1))
        ));
    }

    proptest::proptest! {
        #[test]
        fn decode_never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let mut buf = BytesMut::from(&data[..]);
            while let Ok(Some(_)) = Frame::decode(&mut buf, 64) {}
        }
    }
}

//! Test helpers shared by the message tests: framing of encoded bytes, hex goldens and proptest
//! strategies for the field types every message uses.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use crate::frame::Frame;

/// Largest frame the tests accept; generous so that any generated message fits.
pub(crate) const MAX_FRAME: usize = 1 << 20;

/// Splits `raw` into frames, asserting that it holds only whole frames.
pub(crate) fn frames(raw: &[u8]) -> Vec<Frame> {
    let mut buf = BytesMut::from(raw);
    let mut out = Vec::new();
    while let Some(f) = Frame::decode(&mut buf, MAX_FRAME).expect("valid framing") {
        out.push(f);
    }
    assert!(buf.is_empty(), "{} bytes after the last frame", buf.len());
    out
}

/// Frames one message body under `tag`, as a peer would send it.
pub(crate) fn frame_of(tag: u8, body: &[u8]) -> Frame {
    let mut raw = vec![tag];
    raw.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
    raw.extend_from_slice(body);
    let mut f = frames(&raw);
    f.pop().expect("one frame")
}

/// Bytes from a hex string (whitespace ignored), for goldens copied from captures.
pub(crate) fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

/// A protocol string: any bytes but NUL, not necessarily UTF-8.
pub(crate) fn name() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(1u8..=255, 0..12).prop_map(Bytes::from)
}

/// Arbitrary payload bytes.
pub(crate) fn payload() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..24).prop_map(Bytes::from)
}

/// A parameter or column value, `None` for NULL.
pub(crate) fn value() -> impl Strategy<Value = Option<Bytes>> {
    prop::option::of(payload())
}

/// A list of format codes.
pub(crate) fn formats() -> impl Strategy<Value = Vec<i16>> {
    prop::collection::vec(any::<i16>(), 0..4)
}

/// Arbitrary bytes with a random type byte: input for "decode never panics".
pub(crate) fn any_frame() -> impl Strategy<Value = Frame> {
    (any::<u8>(), prop::collection::vec(any::<u8>(), 0..64))
        .prop_map(|(tag, body)| frame_of(tag, &body))
}

/// A valid encoding damaged by truncating its body, flipping one byte and/or appending bytes,
/// which reaches deeper into the decoders than random bytes do.
pub(crate) fn damaged(raw: &[u8], cut: usize, flip: Option<(usize, u8)>, extra: &[u8]) -> Frame {
    let mut body = raw[5..].to_vec();
    body.truncate(body.len().saturating_sub(cut));
    if let Some((at, x)) = flip {
        if !body.is_empty() {
            let at = at % body.len();
            body[at] ^= x;
        }
    }
    body.extend_from_slice(extra);
    frame_of(raw[0], &body)
}

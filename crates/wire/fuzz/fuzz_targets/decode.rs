//! Fuzz target: arbitrary client or server bytes through every decoder of `wire`.
//!
//! The bytes are split into frames the way the relay does it, and each frame is decoded as both
//! a frontend and a backend message, and CopyData bodies also as replication payloads (walsender
//! messages, standby status updates, pgoutput messages); the same bytes are also read as a startup
//! packet. Nothing may panic, and a message that decodes strictly must re-encode to exactly the bytes received
//! (the property pgmemo relies on when it rewrites a message and forwards the rest untouched).
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use wire::backend::BackendMessage;
use wire::frontend::FrontendMessage;
use wire::replication::{LogicalMessage, StandbyStatusUpdate, WalSenderMessage};
use wire::startup::StartupPacket;
use wire::Frame;

/// Small, so that length fields near the limit get exercised too.
const MAX_FRAME: usize = 1 << 16;

/// Backend messages whose decoders tolerate trailing bytes or skip fields, as they did before
/// typed decoding: a successful decode need not re-encode byte for byte.
const LENIENT_BACKEND_TAGS: &[u8] = b"RSKZENv";

fuzz_target!(|data: &[u8]| {
    let mut startup = BytesMut::from(data);
    while let Ok(Some(_)) = StartupPacket::decode(&mut startup) {}

    let mut buf = BytesMut::from(data);
    while let Ok(Some(frame)) = Frame::decode(&mut buf, MAX_FRAME) {
        let raw = frame.raw().clone();
        if frame.tag() == b'd' {
            replication(frame.body_bytes(), &raw);
        }
        if let Ok(msg) = FrontendMessage::decode(frame.clone()) {
            let mut out = BytesMut::new();
            msg.encode(&mut out);
            assert_eq!(&out[..], &raw[..], "frontend re-encoding differs: {msg:?}");
        }
        if let Ok(msg) = BackendMessage::decode(frame) {
            if !LENIENT_BACKEND_TAGS.contains(&raw[0]) {
                let mut out = BytesMut::new();
                msg.encode(&mut out);
                assert_eq!(&out[..], &raw[..], "backend re-encoding differs: {msg:?}");
            }
        }
    }
});

/// A CopyData body read as the replication sub-protocol. Walsender messages and status updates
/// re-encode to the whole frame; pgoutput is tried both inside XLogData and on the body itself,
/// so that the fuzzer reaches it without first finding the 25-byte XLogData header.
fn replication(payload: Bytes, raw: &[u8]) {
    if let Ok(msg) = WalSenderMessage::decode(payload.clone()) {
        let mut out = BytesMut::new();
        msg.encode(&mut out);
        assert_eq!(&out[..], raw, "walsender re-encoding differs: {msg:?}");
        if let WalSenderMessage::XLogData(x) = msg {
            logical(x.data);
        }
    }
    if let Ok(msg) = StandbyStatusUpdate::decode(payload.clone()) {
        let mut out = BytesMut::new();
        msg.encode(&mut out);
        assert_eq!(&out[..], raw, "status update re-encoding differs: {msg:?}");
    }
    logical(payload);
}

/// A pgoutput message must re-encode to exactly the bytes it was decoded from.
fn logical(data: Bytes) {
    if let Ok(msg) = LogicalMessage::decode(data.clone()) {
        let mut out = BytesMut::new();
        msg.encode(&mut out);
        assert_eq!(&out[..], &data[..], "pgoutput re-encoding differs: {msg:?}");
    }
}

//! Tests of the replication decoders: goldens built field by field from PostgreSQL's "Streaming
//! Replication Protocol" ([`stream`]) and "Logical Replication Message Formats" ([`logical`])
//! pages, then proptest round trips and robustness ([`props`]).

use bytes::{Bytes, BytesMut};

use super::*;

mod logical;
mod props;
mod stream;

/// Concatenates golden pieces, one protocol field each.
fn cat(parts: &[&[u8]]) -> Bytes {
    Bytes::from(parts.concat())
}

/// The CopyData frame a peer sends around `payload`.
fn copy_data(payload: &[u8]) -> Vec<u8> {
    let mut raw = vec![b'd'];
    raw.extend_from_slice(&(payload.len() as i32 + 4).to_be_bytes());
    raw.extend_from_slice(payload);
    raw
}

/// Decodes a pgoutput golden and checks that encoding gives the same bytes back.
fn decode_golden(golden: Bytes) -> LogicalMessage {
    let msg = LogicalMessage::decode(golden.clone()).unwrap();
    let mut out = BytesMut::new();
    msg.encode(&mut out);
    assert_eq!(&out[..], &golden[..], "re-encoding differs for {msg:?}");
    msg
}

// 2024-01-01 00:00:00 UTC in µs since 2000-01-01.
const JAN_2024: i64 = 757_382_400_000_000;
const JAN_2024_HEX: &str = "0002B0D5D4E94000";
// The LSN 16/B374D848.
const LSN_HEX: &str = "00000016B374D848";
const LSN: Lsn = Lsn(0x16_B374_D848);

//! Goldens of the streaming-replication envelope: LSN text, timestamps, XLogData, keepalive and
//! StandbyStatusUpdate.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};

use super::*;
use crate::backend::BackendMessage;
use crate::frame::WireError;
use crate::frontend::FrontendMessage;
use crate::testutil::{frames, hex};

#[test]
fn lsn_text_form() {
    let lsn: Lsn = "16/B374D848".parse().unwrap();
    assert_eq!(lsn, LSN);
    assert_eq!(lsn.to_string(), "16/B374D848");
    assert_eq!("0/0".parse::<Lsn>().unwrap(), Lsn::INVALID);
    assert_eq!(Lsn::INVALID.to_string(), "0/0");
    assert!(!Lsn::INVALID.is_valid() && LSN.is_valid());
    assert_eq!("16/b374d848".parse::<Lsn>().unwrap(), LSN);
    assert_eq!("0016/0B374D848".parse::<Lsn>().ok(), None, "9 digits");
    assert_eq!("00000016/B374D848".parse::<Lsn>().unwrap(), LSN);
    assert_eq!("FFFFFFFF/FFFFFFFF".parse::<Lsn>().unwrap(), Lsn(u64::MAX));
    assert_eq!(Lsn(u64::MAX).to_string(), "FFFFFFFF/FFFFFFFF");
    assert_eq!(Lsn(0x1_0000_0000).to_string(), "1/0");
    for bad in [
        "",
        "/",
        "1/",
        "/1",
        "1",
        "123456789/0",
        "0/123456789",
        "+1/0",
        "1/+0",
        "-1/0",
        " 1/0",
        "1/0 ",
        "g/0",
        "1/2/3",
        "1 /0",
        "0x1/0",
    ] {
        assert!(
            matches!(bad.parse::<Lsn>(), Err(WireError::Malformed(_))),
            "{bad:?} parsed"
        );
    }
    assert!(Lsn(1) < Lsn(2) && Lsn(0xFFFF_FFFF) < "1/0".parse().unwrap());
}

#[test]
fn timestamps() {
    let pg_epoch = UNIX_EPOCH + Duration::from_secs(PG_EPOCH_UNIX_SECS);
    assert_eq!(pg_time_to_system(0), Some(pg_epoch));
    assert_eq!(
        pg_time_to_system(JAN_2024),
        Some(UNIX_EPOCH + Duration::from_secs(1_704_067_200))
    );
    assert_eq!(
        pg_time_to_system(-1_000_001),
        Some(pg_epoch - Duration::from_micros(1_000_001))
    );
    assert_eq!(system_to_pg_time(UNIX_EPOCH), -946_684_800_000_000);
    assert_eq!(
        system_to_pg_time(UNIX_EPOCH + Duration::from_secs(1_704_067_200)),
        JAN_2024
    );
    let now = SystemTime::now();
    let back = pg_time_to_system(system_to_pg_time(now)).unwrap();
    assert!(now.duration_since(back).unwrap() < Duration::from_micros(1));
    // Extremes never panic.
    let _ = pg_time_to_system(i64::MIN);
    let _ = pg_time_to_system(i64::MAX);
}

#[test]
fn xlog_data_golden() {
    let payload = cat(&[
        b"w",
        &hex(LSN_HEX),      // start of the WAL data
        &hex(LSN_HEX),      // current end of WAL (a logical walsender repeats the start)
        &hex(JAN_2024_HEX), // server clock
        b"B\x01\x02",       // the data, here the start of a pgoutput message
    ]);
    let expected = XLogData {
        wal_start: LSN,
        wal_end: LSN,
        send_time: JAN_2024,
        data: Bytes::from_static(b"B\x01\x02"),
    };
    let msg = WalSenderMessage::decode(payload.clone()).unwrap();
    assert_eq!(msg, WalSenderMessage::XLogData(expected.clone()));
    assert_eq!(lsn_of_xlog(&expected), LSN);
    let mut out = BytesMut::new();
    msg.encode(&mut out);
    assert_eq!(&out[..], &copy_data(&payload)[..]);
}

#[test]
fn xlog_data_may_be_empty_and_lsn_of_xlog_takes_the_furthest() {
    let payload = cat(&[
        b"w",
        &hex("0000000000000010"),
        &hex("0000000000000020"),
        &[0; 8],
    ]);
    let WalSenderMessage::XLogData(x) = WalSenderMessage::decode(payload).unwrap() else {
        panic!("not XLogData");
    };
    assert!(x.data.is_empty());
    assert_eq!(lsn_of_xlog(&x), Lsn(0x20));
    let x = XLogData {
        wal_start: Lsn(0x30),
        ..x
    };
    assert_eq!(lsn_of_xlog(&x), Lsn(0x30));
}

#[test]
fn primary_keepalive_golden() {
    let payload = cat(&[
        b"k",
        &hex(LSN_HEX),      // current end of WAL
        &hex(JAN_2024_HEX), // server clock
        &[1],               // reply requested
    ]);
    let msg = WalSenderMessage::decode(payload.clone()).unwrap();
    assert_eq!(
        msg,
        WalSenderMessage::PrimaryKeepalive(PrimaryKeepalive {
            wal_end: LSN,
            send_time: JAN_2024,
            reply_requested: true,
        })
    );
    let mut out = BytesMut::new();
    msg.encode(&mut out);
    assert_eq!(&out[..], &copy_data(&payload)[..]);

    let mut bad_flag = payload.to_vec();
    bad_flag[17] = 2;
    assert!(matches!(
        WalSenderMessage::decode(bad_flag.into()),
        Err(WireError::Malformed(_))
    ));
    let trailing = cat(&[&payload, b"x"]);
    assert!(matches!(
        WalSenderMessage::decode(trailing),
        Err(WireError::Malformed(_))
    ));
    assert_eq!(
        WalSenderMessage::decode(payload.slice(..17)),
        Err(WireError::Truncated)
    );
}

#[test]
fn walsender_rejects_empty_and_unknown_payloads() {
    assert_eq!(
        WalSenderMessage::decode(Bytes::new()),
        Err(WireError::Truncated)
    );
    assert_eq!(
        WalSenderMessage::decode(Bytes::from_static(b"r")),
        Err(WireError::UnexpectedTag(b'r'))
    );
}

#[test]
fn standby_status_update_golden_and_round_trip() {
    let update = StandbyStatusUpdate {
        written: LSN,
        flushed: Lsn(0x16_B374_D000),
        applied: Lsn::INVALID,
        client_time: JAN_2024,
        reply_requested: false,
    };
    let mut out = BytesMut::new();
    update.encode(&mut out);
    let golden = cat(&[
        b"d",
        &hex("00000026"), // length: 4 + 1 + 4 * 8 + 1
        b"r",
        &hex(LSN_HEX),            // written
        &hex("00000016B374D000"), // flushed
        &hex("0000000000000000"), // applied
        &hex(JAN_2024_HEX),       // client clock
        &[0],                     // no reply requested
    ]);
    assert_eq!(&out[..], &golden[..]);

    // Through the frontend decoder, as a test server reads it.
    let mut f = frames(&out);
    let FrontendMessage::CopyData(payload) = FrontendMessage::decode(f.pop().unwrap()).unwrap()
    else {
        panic!("not CopyData");
    };
    assert_eq!(
        StandbyStatusUpdate::decode(payload.clone()).unwrap(),
        update
    );
    assert_eq!(
        StandbyStatusUpdate::decode(payload.slice(..payload.len() - 1)),
        Err(WireError::Truncated)
    );
    assert_eq!(
        StandbyStatusUpdate::decode(Bytes::from_static(b"w")),
        Err(WireError::UnexpectedTag(b'w'))
    );
}

#[test]
fn xlog_data_through_the_backend_decoder_to_pgoutput() {
    let commit = cat(&[
        b"C",
        &[0],
        &hex(LSN_HEX),
        &hex("00000016B374D878"),
        &hex(JAN_2024_HEX),
    ]);
    let mut raw = BytesMut::new();
    XLogData {
        wal_start: Lsn(0x16_B374_D878),
        wal_end: Lsn(0x16_B374_D878),
        send_time: JAN_2024,
        data: commit,
    }
    .encode(&mut raw);
    let mut f = frames(&raw);
    let BackendMessage::CopyData(payload) = BackendMessage::decode(f.pop().unwrap()).unwrap()
    else {
        panic!("not CopyData");
    };
    let WalSenderMessage::XLogData(x) = WalSenderMessage::decode(payload).unwrap() else {
        panic!("not XLogData");
    };
    let LogicalMessage::Commit(c) = LogicalMessage::decode(x.data.clone()).unwrap() else {
        panic!("not Commit");
    };
    assert_eq!(c.end_lsn, lsn_of_xlog(&x));
    assert_eq!(c.commit_lsn.to_string(), "16/B374D848");
}

//! Properties: round trips of generated messages, and no panic on arbitrary or damaged input
//! (whatever decodes must re-encode to the same bytes, as the fuzz target checks too).

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use super::*;
use crate::backend::BackendMessage;
use crate::testutil::{frames, name, payload};

fn lsn() -> impl Strategy<Value = Lsn> {
    any::<u64>().prop_map(Lsn)
}

fn tuple_data() -> impl Strategy<Value = TupleData> {
    let value = prop_oneof![
        Just(TupleValue::Null),
        Just(TupleValue::UnchangedToast),
        payload().prop_map(TupleValue::Text),
        payload().prop_map(TupleValue::Binary),
    ];
    prop::collection::vec(value, 0..4).prop_map(|values| TupleData { values })
}

fn old_tuple() -> impl Strategy<Value = OldTuple> {
    prop_oneof![
        tuple_data().prop_map(OldTuple::Key),
        tuple_data().prop_map(OldTuple::Full),
    ]
}

fn relation() -> impl Strategy<Value = Relation> {
    let identity = prop::sample::select(vec![
        ReplicaIdentity::Default,
        ReplicaIdentity::Nothing,
        ReplicaIdentity::Full,
        ReplicaIdentity::Index,
    ]);
    let column = (any::<u8>(), name(), any::<u32>(), any::<i32>()).prop_map(
        |(flags, name, type_oid, type_modifier)| Column {
            flags,
            name,
            type_oid,
            type_modifier,
        },
    );
    (
        any::<u32>(),
        name(),
        name(),
        identity,
        prop::collection::vec(column, 0..4),
    )
        .prop_map(
            |(oid, namespace, name, replica_identity, columns)| Relation {
                oid,
                namespace,
                name,
                replica_identity,
                columns,
            },
        )
}

fn logical_message() -> impl Strategy<Value = LogicalMessage> {
    use LogicalMessage as M;
    prop_oneof![
        (lsn(), any::<i64>(), any::<u32>()).prop_map(|(final_lsn, commit_time, xid)| M::Begin(
            Begin {
                final_lsn,
                commit_time,
                xid
            }
        )),
        (any::<u8>(), lsn(), lsn(), any::<i64>()).prop_map(|(flags, c, e, t)| M::Commit(Commit {
            flags,
            commit_lsn: c,
            end_lsn: e,
            commit_time: t
        })),
        (lsn(), name()).prop_map(|(commit_lsn, name)| M::Origin(Origin { commit_lsn, name })),
        relation().prop_map(M::Relation),
        (any::<u32>(), name(), name()).prop_map(|(oid, namespace, name)| M::Type(DataType {
            oid,
            namespace,
            name
        })),
        (any::<u32>(), tuple_data())
            .prop_map(|(relation, new)| M::Insert(Insert { relation, new })),
        (any::<u32>(), prop::option::of(old_tuple()), tuple_data())
            .prop_map(|(relation, old, new)| M::Update(Update { relation, old, new })),
        (any::<u32>(), old_tuple()).prop_map(|(relation, old)| M::Delete(Delete { relation, old })),
        (any::<u8>(), prop::collection::vec(any::<u32>(), 0..4))
            .prop_map(|(options, relations)| M::Truncate(Truncate { options, relations })),
        (any::<u8>(), lsn(), name(), payload()).prop_map(|(flags, lsn, prefix, content)| {
            M::Message(LogicalDecodingMessage {
                flags,
                lsn,
                prefix,
                content,
            })
        }),
        (
            prop::sample::select(pgoutput::tag::LATER_VERSIONS.to_vec()),
            payload()
        )
            .prop_map(|(tag, body)| M::Unsupported { tag, body }),
    ]
}

/// Truncates, flips one byte of and/or extends a valid encoding, to reach deep into decoders.
fn damage(mut raw: Vec<u8>, cut: usize, flip: Option<(usize, u8)>, extra: &[u8]) -> Bytes {
    raw.truncate(raw.len().saturating_sub(cut));
    if let (Some((at, x)), false) = (flip, raw.is_empty()) {
        let at = at % raw.len();
        raw[at] ^= x;
    }
    raw.extend_from_slice(extra);
    Bytes::from(raw)
}

/// Decodes `data` every way this module can; whatever decodes must re-encode to the same bytes.
fn decode_everything(data: Bytes) {
    if let Ok(msg) = LogicalMessage::decode(data.clone()) {
        let mut out = BytesMut::new();
        msg.encode(&mut out);
        assert_eq!(&out[..], &data[..]);
    }
    if let Ok(msg) = WalSenderMessage::decode(data.clone()) {
        let mut out = BytesMut::new();
        msg.encode(&mut out);
        assert_eq!(&out[5..], &data[..]);
    }
    if let Ok(msg) = StandbyStatusUpdate::decode(data.clone()) {
        let mut out = BytesMut::new();
        msg.encode(&mut out);
        assert_eq!(&out[5..], &data[..]);
    }
}

proptest! {
    #[test]
    fn lsn_display_parse_round_trip(v in any::<u64>()) {
        let lsn = Lsn(v);
        prop_assert_eq!(lsn.to_string().parse::<Lsn>(), Ok(lsn));
    }

    #[test]
    fn lsn_parse_never_panics(s in "[0-9a-fA-F/+ x-]{0,20}") {
        if let Ok(lsn) = s.parse::<Lsn>() {
            prop_assert_eq!(lsn.to_string().to_lowercase().parse::<Lsn>(), Ok(lsn));
        }
    }

    #[test]
    fn logical_round_trip(msg in logical_message()) {
        let mut out = BytesMut::new();
        msg.encode(&mut out);
        prop_assert_eq!(LogicalMessage::decode(out.freeze()), Ok(msg));
    }

    #[test]
    fn walsender_and_status_round_trip(
        start in lsn(), end in lsn(), time in any::<i64>(), data in payload(), reply in any::<bool>()
    ) {
        for msg in [
            WalSenderMessage::XLogData(XLogData { wal_start: start, wal_end: end, send_time: time, data: data.clone() }),
            WalSenderMessage::PrimaryKeepalive(PrimaryKeepalive { wal_end: end, send_time: time, reply_requested: reply }),
        ] {
            let mut out = BytesMut::new();
            msg.encode(&mut out);
            let mut f = frames(&out);
            let BackendMessage::CopyData(payload) = BackendMessage::decode(f.pop().unwrap()).unwrap() else {
                panic!("not CopyData");
            };
            prop_assert_eq!(WalSenderMessage::decode(payload), Ok(msg));
        }
        let update = StandbyStatusUpdate { written: start, flushed: end, applied: Lsn(end.0 / 2), client_time: time, reply_requested: reply };
        let mut out = BytesMut::new();
        update.encode(&mut out);
        prop_assert_eq!(StandbyStatusUpdate::decode(out.freeze().slice(5..)), Ok(update));
    }

    #[test]
    fn decode_arbitrary_bytes_never_panics(
        tag in prop::sample::select(b"BCORYIUDTMSEcAbPKrpwkZ".to_vec()),
        body in prop::collection::vec(any::<u8>(), 0..64),
        raw in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        decode_everything(Bytes::from(raw));
        decode_everything(Bytes::from([&[tag][..], &body].concat()));
    }

    #[test]
    fn decode_damaged_messages_never_panics(
        msg in logical_message(),
        cut in 0usize..8,
        flip in prop::option::of((any::<usize>(), 1u8..)),
        extra in prop::collection::vec(any::<u8>(), 0..4),
    ) {
        let mut out = BytesMut::new();
        msg.encode(&mut out);
        decode_everything(damage(out.to_vec(), cut, flip, &extra));
    }

    #[test]
    fn pg_time_conversions_never_panic(micros in any::<i64>()) {
        if let Some(t) = pg_time_to_system(micros) {
            prop_assert_eq!(system_to_pg_time(t), micros);
        }
    }
}

//! Goldens of every pgoutput version 1 message, and the errors for malformed ones.

use bytes::Bytes;

use super::*;
use crate::frame::WireError;
use crate::testutil::hex;

#[test]
fn begin_commit_origin_goldens() {
    let begin = cat(&[
        b"B",
        &hex(LSN_HEX),      // final LSN of the transaction
        &hex(JAN_2024_HEX), // commit timestamp
        &hex("000002F1"),   // xid 753
    ]);
    assert_eq!(
        decode_golden(begin),
        LogicalMessage::Begin(Begin {
            final_lsn: LSN,
            commit_time: JAN_2024,
            xid: 753,
        })
    );
    let commit = cat(&[
        b"C",
        &[0],                     // flags
        &hex(LSN_HEX),            // commit LSN
        &hex("00000016B374D878"), // end LSN
        &hex(JAN_2024_HEX),       // commit timestamp
    ]);
    assert_eq!(
        decode_golden(commit),
        LogicalMessage::Commit(Commit {
            flags: 0,
            commit_lsn: LSN,
            end_lsn: Lsn(0x16_B374_D878),
            commit_time: JAN_2024,
        })
    );
    let origin = cat(&[b"O", &hex(LSN_HEX), b"node_a\0"]);
    assert_eq!(
        decode_golden(origin),
        LogicalMessage::Origin(Origin {
            commit_lsn: LSN,
            name: Bytes::from_static(b"node_a"),
        })
    );
}

#[test]
fn relation_and_type_goldens() {
    let relation = cat(&[
        b"R",
        &hex("00004000"), // OID 16384
        b"public\0",
        b"accounts\0",
        b"d", // replica identity default
        &hex("0002"),
        // id int4, part of the key
        &[1],
        b"id\0",
        &hex("00000017"),
        &hex("FFFFFFFF"),
        // name varchar(20): typmod 20 + 4
        &[0],
        b"name\0",
        &hex("00000413"),
        &hex("00000018"),
    ]);
    let LogicalMessage::Relation(r) = decode_golden(relation) else {
        panic!("not Relation");
    };
    assert_eq!(
        r,
        Relation {
            oid: 16384,
            namespace: Bytes::from_static(b"public"),
            name: Bytes::from_static(b"accounts"),
            replica_identity: ReplicaIdentity::Default,
            columns: vec![
                Column {
                    flags: 1,
                    name: Bytes::from_static(b"id"),
                    type_oid: 23,
                    type_modifier: -1,
                },
                Column {
                    flags: 0,
                    name: Bytes::from_static(b"name"),
                    type_oid: 1043,
                    type_modifier: 24,
                },
            ],
        }
    );
    assert_eq!(
        (r.namespace_str(), r.name_str()),
        (Some("public"), Some("accounts"))
    );
    assert!(r.columns[0].is_key() && !r.columns[1].is_key());
    assert_eq!(r.columns[1].name_str(), Some("name"));

    let catalog = cat(&[b"R", &hex("00000001"), b"\0", b"t\0", b"f", &hex("0000")]);
    let LogicalMessage::Relation(r) = decode_golden(catalog) else {
        panic!("not Relation");
    };
    assert_eq!(r.namespace_str(), Some("pg_catalog"));
    assert_eq!(r.replica_identity, ReplicaIdentity::Full);
    for (b, ri) in [
        (b'n', ReplicaIdentity::Nothing),
        (b'i', ReplicaIdentity::Index),
    ] {
        assert_eq!(ReplicaIdentity::from_byte(b), Ok(ri));
        assert_eq!(ri.as_byte(), b);
    }
    let bad = cat(&[b"R", &hex("00000001"), b"\0", b"t\0", b"x", &hex("0000")]);
    assert!(matches!(
        LogicalMessage::decode(bad),
        Err(WireError::Malformed(_))
    ));

    let ty = cat(&[b"Y", &hex("00004001"), b"public\0", b"mood\0"]);
    assert_eq!(
        decode_golden(ty),
        LogicalMessage::Type(DataType {
            oid: 16385,
            namespace: Bytes::from_static(b"public"),
            name: Bytes::from_static(b"mood"),
        })
    );
}

/// TupleData with one column of each kind: NULL, unchanged TOAST, text '42', binary int4 7.
fn every_kind_tuple() -> (Vec<u8>, TupleData) {
    let raw = [
        &hex("0004")[..],
        b"n",
        b"u",
        b"t",
        &hex("00000002"),
        b"42",
        b"b",
        &hex("00000004"),
        &hex("00000007"),
    ]
    .concat();
    let tuple = TupleData {
        values: vec![
            TupleValue::Null,
            TupleValue::UnchangedToast,
            TupleValue::Text(Bytes::from_static(b"42")),
            TupleValue::Binary(Bytes::from_static(&[0, 0, 0, 7])),
        ],
    };
    (raw, tuple)
}

#[test]
fn insert_golden() {
    let (tuple_raw, tuple) = every_kind_tuple();
    let insert = cat(&[b"I", &hex("00004000"), b"N", &tuple_raw]);
    let msg = decode_golden(insert);
    assert_eq!(
        msg,
        LogicalMessage::Insert(Insert {
            relation: 16384,
            new: tuple.clone(),
        })
    );
    assert_eq!(msg.written_relations(), &[16384]);
    assert_eq!(tuple.values[2].bytes().map(|b| &b[..]), Some(&b"42"[..]));
    assert_eq!(tuple.values[0].bytes(), None);

    let no_marker = cat(&[b"I", &hex("00004000"), b"K", &tuple_raw]);
    assert!(matches!(
        LogicalMessage::decode(no_marker),
        Err(WireError::Malformed(_))
    ));
    let bad_kind = cat(&[b"I", &hex("00004000"), b"N", &hex("0001"), b"x"]);
    assert!(matches!(
        LogicalMessage::decode(bad_kind),
        Err(WireError::Malformed(_))
    ));
    let negative = cat(&[
        b"I",
        &hex("00004000"),
        b"N",
        &hex("0001"),
        b"t",
        &hex("FFFFFFFF"),
    ]);
    assert!(matches!(
        LogicalMessage::decode(negative),
        Err(WireError::Malformed(_))
    ));
}

#[test]
fn update_goldens() {
    let (tuple_raw, tuple) = every_kind_tuple();
    let key_raw = cat(&[&hex("0001"), b"t", &hex("00000001"), b"1"]);
    let key = TupleData {
        values: vec![TupleValue::Text(Bytes::from_static(b"1"))],
    };
    let cases = [
        (cat(&[b"U", &hex("00004000"), b"N", &tuple_raw]), None),
        (
            cat(&[b"U", &hex("00004000"), b"K", &key_raw, b"N", &tuple_raw]),
            Some(OldTuple::Key(key.clone())),
        ),
        (
            cat(&[b"U", &hex("00004000"), b"O", &key_raw, b"N", &tuple_raw]),
            Some(OldTuple::Full(key.clone())),
        ),
    ];
    for (golden, old) in cases {
        assert_eq!(
            decode_golden(golden),
            LogicalMessage::Update(Update {
                relation: 16384,
                old,
                new: tuple.clone(),
            })
        );
    }
    let old_only = cat(&[b"U", &hex("00004000"), b"K", &key_raw]);
    assert_eq!(LogicalMessage::decode(old_only), Err(WireError::Truncated));
    let two_olds = cat(&[b"U", &hex("00004000"), b"K", &key_raw, b"O", &key_raw]);
    assert!(matches!(
        LogicalMessage::decode(two_olds),
        Err(WireError::Malformed(_))
    ));
}

#[test]
fn delete_goldens() {
    let key_raw = cat(&[&hex("0001"), b"t", &hex("00000001"), b"1"]);
    let key = TupleData {
        values: vec![TupleValue::Text(Bytes::from_static(b"1"))],
    };
    let msg = decode_golden(cat(&[b"D", &hex("00004000"), b"K", &key_raw]));
    assert_eq!(
        msg,
        LogicalMessage::Delete(Delete {
            relation: 16384,
            old: OldTuple::Key(key.clone()),
        })
    );
    assert_eq!(msg.written_relations(), &[16384]);
    let LogicalMessage::Delete(d) = decode_golden(cat(&[b"D", &hex("00004000"), b"O", &key_raw]))
    else {
        panic!("not Delete");
    };
    assert_eq!(d.old, OldTuple::Full(key.clone()));
    assert_eq!(d.old.tuple(), &key);
    let new_marker = cat(&[b"D", &hex("00004000"), b"N", &key_raw]);
    assert!(matches!(
        LogicalMessage::decode(new_marker),
        Err(WireError::Malformed(_))
    ));
}

#[test]
fn truncate_golden() {
    let golden = cat(&[
        b"T",
        &hex("00000002"), // two relations
        &[3],             // CASCADE | RESTART IDENTITY
        &hex("00004000"),
        &hex("00004002"),
    ]);
    let msg = decode_golden(golden);
    let LogicalMessage::Truncate(t) = &msg else {
        panic!("not Truncate");
    };
    assert_eq!(t.relations, vec![16384, 16386]);
    assert!(t.cascade() && t.restart_identity());
    assert_eq!(msg.written_relations(), &[16384, 16386]);
    // A huge count with few bytes is truncation, not an allocation.
    let huge = cat(&[b"T", &hex("7FFFFFFF"), &[0], &hex("00004000")]);
    assert_eq!(LogicalMessage::decode(huge), Err(WireError::Truncated));
}

#[test]
fn message_golden() {
    let golden = cat(&[
        b"M",
        &[1], // transactional
        &hex(LSN_HEX),
        b"pgmemo\0",
        &hex("00000005"),
        b"hello",
    ]);
    let msg = decode_golden(golden);
    let LogicalMessage::Message(m) = &msg else {
        panic!("not Message");
    };
    assert!(m.is_transactional());
    assert_eq!(m.prefix_str(), Some("pgmemo"));
    assert_eq!(&m.content[..], b"hello");
    assert_eq!(m.lsn, LSN);
    assert!(msg.written_relations().is_empty());
    let null = cat(&[b"M", &[0], &hex(LSN_HEX), b"p\0", &hex("FFFFFFFF")]);
    assert!(matches!(
        LogicalMessage::decode(null),
        Err(WireError::Malformed(_))
    ));
}

#[test]
fn later_versions_are_unsupported_not_errors() {
    // Stream Start (protocol 2): xid, first-segment flag.
    let stream_start = cat(&[b"S", &hex("000002F1"), &[1]]);
    assert_eq!(
        decode_golden(stream_start),
        LogicalMessage::Unsupported {
            tag: b'S',
            body: Bytes::from_static(&[0, 0, 2, 0xF1, 1]),
        }
    );
    assert_eq!(pgoutput::tag::LATER_VERSIONS, b"SEcAbPKrp");
    for &t in pgoutput::tag::LATER_VERSIONS {
        assert!(matches!(
            LogicalMessage::decode(Bytes::copy_from_slice(&[t])),
            Ok(LogicalMessage::Unsupported { tag, .. }) if tag == t
        ));
    }
    assert_eq!(
        LogicalMessage::decode(Bytes::from_static(b"Z")),
        Err(WireError::UnexpectedTag(b'Z'))
    );
    assert_eq!(
        LogicalMessage::decode(Bytes::new()),
        Err(WireError::Truncated)
    );
    let trailing = cat(&[b"Y", &hex("00004001"), b"public\0", b"mood\0", b"!"]);
    assert!(matches!(
        LogicalMessage::decode(trailing),
        Err(WireError::Malformed(_))
    ));
}

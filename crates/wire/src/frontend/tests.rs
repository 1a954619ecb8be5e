//! Tests of the frontend messages: goldens captured from libpq 15, malformed bodies, and
//! proptest round trips and robustness over every message type.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use super::*;
use crate::testutil::{any_frame, damaged, formats, frame_of, frames, hex, name, payload, value};

fn decode_all(raw: &[u8]) -> Vec<FrontendMessage> {
    frames(raw)
        .into_iter()
        .map(|f| FrontendMessage::decode(f).unwrap())
        .collect()
}

fn encode_all(msgs: &[FrontendMessage]) -> BytesMut {
    let mut out = BytesMut::new();
    for m in msgs {
        m.encode(&mut out);
    }
    out
}

#[test]
fn sasl_initial_round_trip() {
    let raw = sasl_initial_response("SCRAM-SHA-256", b"n,,n=,r=abc");
    let s = SaslInitialResponse::parse(&raw[5..]).unwrap();
    assert_eq!(s.mechanism, "SCRAM-SHA-256");
    assert_eq!(s.data, b"n,,n=,r=abc");
    assert!(SaslInitialResponse::parse(b"SCRAM\0\0\0\0\x09abc").is_err());
}

#[test]
fn query_decodes() {
    let msgs = decode_all(&query("select 1"));
    assert_eq!(
        msgs,
        [FrontendMessage::Query(Query {
            sql: Bytes::from_static(b"select 1")
        })]
    );
    let FrontendMessage::Query(q) = &msgs[0] else {
        unreachable!()
    };
    assert_eq!(q.sql_str(), Some("select 1"));
    assert_eq!(parse_password(b"pw\0").unwrap(), "pw");
    assert!(parse_password(b"pw").is_err());
    assert_eq!(decode_all(&sync()), [FrontendMessage::Sync]);
    assert_eq!(decode_all(&terminate()), [FrontendMessage::Terminate]);
}

/// What libpq 15 sends for `PQexecParams(conn, "SELECT $1::int", 1, NULL, {"42"}, NULL, NULL,
/// 0)`, captured on the wire: Parse, Bind, Describe portal, Execute, Sync in one write.
const LIBPQ_EXEC_PARAMS: &[u8] = b"P\0\0\0\x16\0SELECT $1::int\0\0\0\
B\0\0\0\x14\0\0\0\0\0\x01\0\0\0\x0242\0\x01\0\0\
D\0\0\0\x06P\0\
E\0\0\0\x09\0\0\0\0\0\
S\0\0\0\x04";

#[test]
fn golden_libpq_exec_params() {
    let msgs = decode_all(LIBPQ_EXEC_PARAMS);
    let expected = [
        FrontendMessage::Parse(Parse {
            name: Bytes::new(),
            query: Bytes::from_static(b"SELECT $1::int"),
            param_types: vec![],
        }),
        FrontendMessage::Bind(Bind {
            portal: Bytes::new(),
            statement: Bytes::new(),
            param_formats: vec![],
            params: vec![Some(Bytes::from_static(b"42"))],
            result_formats: vec![0],
        }),
        FrontendMessage::Describe(Describe {
            target: Target::Portal,
            name: Bytes::new(),
        }),
        FrontendMessage::Execute(Execute {
            portal: Bytes::new(),
            max_rows: 0,
        }),
        FrontendMessage::Sync,
    ];
    assert_eq!(msgs, expected);
    assert_eq!(&encode_all(&expected)[..], LIBPQ_EXEC_PARAMS);
}

#[test]
fn bind_values_are_slices_of_the_frame() {
    let frame = frames(LIBPQ_EXEC_PARAMS).swap_remove(1);
    let raw = frame.raw().clone();
    let FrontendMessage::Bind(bind) = FrontendMessage::decode(frame).unwrap() else {
        panic!("not a Bind")
    };
    let value = bind.params[0].as_ref().unwrap();
    let range = raw.as_ptr() as usize..raw.as_ptr() as usize + raw.len();
    assert!(
        range.contains(&(value.as_ptr() as usize)),
        "value was copied"
    );
}

/// More libpq 15 captures: PQprepare with a name, PQdescribePrepared, an empty PQexec, COPY
/// FROM STDIN data, end and failure, PQfn(int4pl, 2, 3) and PQfinish.
#[test]
fn golden_libpq_other_messages() {
    let cases: Vec<(&str, FrontendMessage)> = vec![
        (
            "5000000023733100 53454c4543542024313a3a696e74342c2024323a3a7465787400 0000",
            FrontendMessage::Parse(Parse {
                name: Bytes::from_static(b"s1"),
                query: Bytes::from_static(b"SELECT $1::int4, $2::text"),
                param_types: vec![],
            }),
        ),
        (
            "440000000853733100",
            FrontendMessage::Describe(Describe {
                target: Target::Statement,
                name: Bytes::from_static(b"s1"),
            }),
        ),
        (
            "510000000500",
            FrontendMessage::Query(Query { sql: Bytes::new() }),
        ),
        (
            "64000000083109780a",
            FrontendMessage::CopyData(Bytes::from_static(b"1\tx\n")),
        ),
        ("6300000004", FrontendMessage::CopyDone),
        (
            "66000000096f6f707300",
            FrontendMessage::CopyFail(CopyFail {
                message: Bytes::from_static(b"oops"),
            }),
        ),
        (
            "4600000020 000000b1 0001 0001 0002 00000004 00000002 00000004 00000003 0001",
            FrontendMessage::FunctionCall(FunctionCall {
                oid: 177,
                arg_formats: vec![1],
                args: vec![
                    Some(Bytes::from_static(&[0, 0, 0, 2])),
                    Some(Bytes::from_static(&[0, 0, 0, 3])),
                ],
                result_format: 1,
            }),
        ),
        ("5800000004", FrontendMessage::Terminate),
    ];
    for (raw, expected) in cases {
        let raw = hex(raw);
        assert_eq!(
            decode_all(&raw),
            std::slice::from_ref(&expected),
            "{raw:02x?}"
        );
        assert_eq!(&encode_all(&[expected])[..], &raw[..]);
    }
}

#[test]
fn non_utf8_text_is_accepted() {
    // "SELECT 'é'" in LATIN1: not UTF-8, still a valid query for the server.
    let raw = frame_of(tag::QUERY, b"SELECT '\xe9'\0");
    let FrontendMessage::Query(q) = FrontendMessage::decode(raw).unwrap() else {
        panic!("not a Query")
    };
    assert_eq!(q.sql_str(), None);
    assert_eq!(&q.sql[..], b"SELECT '\xe9'");
    let parse = Parse::decode(Bytes::from_static(b"st\xff\0SELECT 1\0\0\0")).unwrap();
    assert_eq!(parse.name_str(), None);
    assert_eq!(parse.query_str(), Some("SELECT 1"));
}

#[test]
fn malformed_bodies_are_errors() {
    let cases: &[(u8, &[u8], WireError)] = &[
        (tag::QUERY, b"select 1", WireError::MissingTerminator),
        (
            tag::QUERY,
            b"select 1\0x",
            WireError::Malformed("trailing bytes after Query"),
        ),
        (tag::PARSE, b"\0SELECT 1\0\0", WireError::Truncated),
        (tag::PARSE, b"\0SELECT 1\0\0\x01\0\0", WireError::Truncated),
        (
            tag::PARSE,
            b"\0q\0\0\0\0",
            WireError::Malformed("trailing bytes after Parse"),
        ),
        // Two parameters announced, one sent.
        (
            tag::BIND,
            b"\0\0\0\0\0\x02\0\0\0\x0242",
            WireError::Truncated,
        ),
        (
            tag::BIND,
            b"\0\0\0\0\0\x01\xff\xff\xff\xfe\0\0",
            WireError::Malformed("negative value length"),
        ),
        (
            tag::BIND,
            b"\0\0\0\0\0\0\0\0\0",
            WireError::Malformed("trailing bytes after Bind"),
        ),
        (
            tag::DESCRIBE,
            b"X\0",
            WireError::Malformed("target must be 'S' or 'P'"),
        ),
        (tag::CLOSE, b"S", WireError::MissingTerminator),
        (tag::EXECUTE, b"\0\0\0", WireError::Truncated),
        (
            tag::SYNC,
            b"x",
            WireError::Malformed("unexpected body in a message without fields"),
        ),
        (
            tag::FUNCTION_CALL,
            b"\0\0\0\xb1\0\0\0\0",
            WireError::Truncated,
        ),
    ];
    for (tag, body, err) in cases {
        let got = FrontendMessage::decode(frame_of(*tag, body));
        assert_eq!(got.as_ref(), Err(err), "{} {body:?}", char::from(*tag));
    }
}

#[test]
fn unknown_tags_stay_raw() {
    let f = frame_of(b'?', b"abc");
    let msg = FrontendMessage::decode(f.clone()).unwrap();
    assert_eq!(msg, FrontendMessage::Other(f.clone()));
    assert_eq!(msg.tag(), b'?');
    assert_eq!(&encode_all(&[msg])[..], &f.raw()[..]);
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![Just(Target::Statement), Just(Target::Portal)]
}

const KNOWN_TAGS: &[u8] = b"QPBDECSHFdcfpX";

fn message() -> impl Strategy<Value = FrontendMessage> {
    use FrontendMessage as M;
    let values = || prop::collection::vec(value(), 0..4);
    prop_oneof![
        name().prop_map(|sql| M::Query(Query { sql })),
        (name(), name(), prop::collection::vec(any::<u32>(), 0..4)).prop_map(
            |(name, query, param_types)| M::Parse(Parse {
                name,
                query,
                param_types
            })
        ),
        (name(), name(), formats(), values(), formats()).prop_map(
            |(portal, statement, param_formats, params, result_formats)| M::Bind(Bind {
                portal,
                statement,
                param_formats,
                params,
                result_formats,
            })
        ),
        (target(), name()).prop_map(|(target, name)| M::Describe(Describe { target, name })),
        (name(), any::<i32>())
            .prop_map(|(portal, max_rows)| M::Execute(Execute { portal, max_rows })),
        (target(), name()).prop_map(|(target, name)| M::Close(Close { target, name })),
        Just(M::Sync),
        Just(M::Flush),
        payload().prop_map(M::CopyData),
        Just(M::CopyDone),
        name().prop_map(|message| M::CopyFail(CopyFail { message })),
        (any::<u32>(), formats(), values(), any::<i16>()).prop_map(
            |(oid, arg_formats, args, result_format)| M::FunctionCall(FunctionCall {
                oid,
                arg_formats,
                args,
                result_format,
            })
        ),
        payload().prop_map(|body| M::Password { body }),
        Just(M::Terminate),
        (
            any::<u8>().prop_filter("unknown tag", |t| !KNOWN_TAGS.contains(t)),
            payload()
        )
            .prop_map(|(tag, body)| M::Other(frame_of(tag, &body))),
    ]
}

proptest! {
    /// encode -> Frame::decode -> decode gives back the message, also when pipelined.
    #[test]
    fn round_trip(msgs in prop::collection::vec(message(), 1..8)) {
        let raw = encode_all(&msgs);
        prop_assert_eq!(decode_all(&raw), msgs.clone());
        for m in &msgs {
            let mut one = BytesMut::new();
            m.encode(&mut one);
            prop_assert_eq!(one[0], m.tag());
        }
    }

    /// Arbitrary bodies under any type byte: an error or a message, never a panic; and whatever
    /// decodes re-encodes to the same bytes.
    #[test]
    fn decode_never_panics(frame in any_frame()) {
        check_decode(frame)?;
    }

    /// The same over damaged valid encodings, which get past the first fields.
    #[test]
    fn decode_damaged_never_panics(
        msg in message(),
        cut in 0usize..8,
        flip in prop::option::of((any::<usize>(), 1u8..=255)),
        extra in prop::collection::vec(any::<u8>(), 0..4),
    ) {
        let mut raw = BytesMut::new();
        msg.encode(&mut raw);
        check_decode(damaged(&raw, cut, flip, &extra))?;
    }
}

fn check_decode(frame: crate::frame::Frame) -> Result<(), TestCaseError> {
    let raw = frame.raw().clone();
    if let Ok(msg) = FrontendMessage::decode(frame) {
        prop_assert_eq!(&encode_all(&[msg])[..], &raw[..]);
    }
    Ok(())
}

proptest! {
    /// The borrowed portal and row-limit readers accept exactly what `Execute::decode`
    /// accepts, with the same portal, row limit and error.
    #[test]
    fn execute_portal_of_agrees_with_decode(body in prop::collection::vec(
        prop_oneof![Just(0u8), any::<u8>()], 0..12,
    )) {
        let decoded = Execute::decode(Bytes::from(body.clone()));
        let borrowed = Execute::portal_of(&body).and_then(|p| Ok((p, Execute::max_rows_of(&body)?)));
        match (decoded, borrowed) {
            (Ok(msg), Ok((portal, max_rows))) => {
                prop_assert_eq!(&msg.portal[..], portal);
                prop_assert_eq!(msg.max_rows, max_rows);
            }
            (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
            (a, b) => prop_assert!(false, "decode {:?} but portal_of {:?}", a, b),
        }
    }

    /// The borrowed Describe reader accepts exactly what `Describe::decode` accepts, with the
    /// same target and name and the same error.
    #[test]
    fn describe_target_of_agrees_with_decode(body in prop::collection::vec(
        prop_oneof![Just(0u8), Just(b'P'), Just(b'S'), any::<u8>()], 0..8,
    )) {
        let decoded = Describe::decode(Bytes::from(body.clone()));
        let borrowed = Describe::target_of(&body);
        match (decoded, borrowed) {
            (Ok(msg), Ok((target, name))) => {
                prop_assert_eq!(msg.target, target);
                prop_assert_eq!(&msg.name[..], name);
            }
            (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
            (a, b) => prop_assert!(false, "decode {:?} but target_of {:?}", a, b),
        }
    }
}

#[test]
fn own_queries_leave_the_unnamed_statement_and_portal_alone() {
    let raw = own_queries(&["SELECT 1", "SELECT 2"]);
    let msgs = decode_all(&raw);
    assert_eq!(msgs.len(), 13, "{msgs:?}");
    for m in &msgs {
        match m {
            FrontendMessage::Parse(p) => assert_eq!(&p.name[..], OWN_STATEMENT.as_bytes()),
            FrontendMessage::Bind(b) => {
                assert_eq!(&b.portal[..], OWN_STATEMENT.as_bytes());
                assert_eq!(&b.statement[..], OWN_STATEMENT.as_bytes());
            }
            FrontendMessage::Execute(e) => assert_eq!(&e.portal[..], OWN_STATEMENT.as_bytes()),
            FrontendMessage::Close(c) => assert_eq!(&c.name[..], OWN_STATEMENT.as_bytes()),
            FrontendMessage::Sync => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(matches!(msgs.last(), Some(FrontendMessage::Sync)));
    let texts: Vec<_> = msgs
        .iter()
        .filter_map(|m| match m {
            FrontendMessage::Parse(p) => Some(p.query.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, [Bytes::from("SELECT 1"), Bytes::from("SELECT 2")]);
}

#[test]
fn a_refused_parse_is_one_named_parse_of_a_text_that_is_not_sql() {
    let msgs = decode_all(&refused_parse());
    let [FrontendMessage::Parse(p)] = &msgs[..] else {
        panic!("{msgs:?}");
    };
    assert_eq!(
        &p.name[..],
        OWN_STATEMENT.as_bytes(),
        "never the unnamed statement"
    );
    assert!(p.query.starts_with(b"pgmemo: "), "{:?}", p.query);
    assert!(p.param_types.is_empty());
}

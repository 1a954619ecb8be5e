//! Promotion of unnamed statements (`max_promoted_statements`, see `pool::promoted`): a plain
//! batch `Parse("") Bind("", "") [Describe(portal "")] Execute("") Sync` sent between
//! transactions, whose text the server connection has seen before, binds a statement pgmemo
//! prepared there under its own name instead of parsing the text again (the second sighting
//! prepares it, in place of the client's Parse).
//!
//! The client must not be able to tell. PostgreSQL would parse the text now; a statement
//! prepared earlier is analysed again only when DDL invalidated it, and then fails where the
//! client's Parse would have succeeded (`cached plan must not change result type`) or fails
//! at Bind where PostgreSQL would have failed at Parse. So until the server has answered the
//! Bind, pgmemo holds back the answers (ParseComplete is its own, sent with the
//! BindComplete) and the client's further input; if anything goes wrong before it, which can
//! only be before anything ran, the server's error and ReadyForQuery are swallowed, the
//! statement is forgotten (and closed before the next request), and the client's batch is
//! sent again as the client sent it (`Link::retry`), which answers exactly as PostgreSQL
//! does. Notices raised while preparing or binding go out before the ParseComplete, and a
//! text whose preparation raised one is not promoted again (binding it would not repeat
//! a notice of its parsing).

use bytes::{Bytes, BytesMut};
use wire::backend::{self, TransactionStatus};
use wire::frontend::tag;
use wire::FrameHeader;

use super::link::{Link, Unnamed};
use super::responses::Action;
use crate::pool::Promotion;

/// The answers to the client's Parse and Bind: ParseComplete, then BindComplete (both
/// without a body).
const PARSE_AND_BIND_COMPLETE: [u8; 10] = [
    backend::tag::PARSE_COMPLETE,
    0,
    0,
    0,
    4,
    backend::tag::BIND_COMPLETE,
    0,
    0,
    0,
    4,
];

/// A promoted batch whose Bind the server has not answered yet.
#[derive(Debug)]
pub struct Promoting {
    key: u64,
    /// pgmemo's name of the statement on the server.
    name: Bytes,
    /// pgmemo's Parse of the text goes ahead of the Bind.
    create: bool,
    /// That Parse succeeded.
    parsed: bool,
    /// The server refused the Parse or the Bind: the batch is sent again as it was.
    failed: bool,
    /// The client's Parse when it replaces the client's unnamed statement (`None`: the same
    /// as the one the client has).
    parse: Option<Bytes>,
    /// Notices raised before the BindComplete, sent ahead of the ParseComplete.
    notices: Option<BytesMut>,
}

/// Rewrites the plain batch `batch` (the whole of it, see `plain`) into `out` when its text
/// is to be promoted; `false` leaves it to be sent as it is. `same_parse`: the Parse is the
/// client's current unnamed statement.
pub fn request(batch: &[u8], same_parse: bool, link: &mut Link<'_>, out: &mut BytesMut) -> bool {
    if link.client.status != TransactionStatus::Idle {
        return false;
    }
    // Kept whole to be sent again, or not promoted.
    if batch.len() > super::link::BatchLog::MAX_BYTES {
        return false;
    }
    let Some(parts) = Parts::of(batch) else {
        return false;
    };
    let parse_body = &batch[parts.parse.start + FrameHeader::SIZE..parts.parse.end];
    // After the empty statement name: the text and parameter types.
    let definition = &parse_body[1..];
    if !promotable_text(definition) {
        return false;
    }
    let promotion = link.server.promoted.consider(
        definition,
        link.client.settings.parse_digest(),
        link.max_promoted,
        &mut link.server.stale,
    );
    let (key, name, create) = match promotion {
        Promotion::Plain => return false,
        Promotion::Create { key, name } => (key, name, true),
        Promotion::Use { key, name } => (key, name, false),
    };
    if create {
        frame(out, tag::PARSE, &[&name, b"\0", definition]);
    }
    let bind_body = &batch[parts.bind.start + FrameHeader::SIZE..parts.bind.end];
    // The unnamed portal, then the statement's name, then the rest of the client's Bind.
    frame(out, tag::BIND, &[b"\0", &name, b"\0", &bind_body[2..]]);
    out.extend_from_slice(&batch[parts.bind.end..]);
    // Kept to be sent again as it was.
    link.promoted_batch.clear();
    link.promoted_batch.extend_from_slice(batch);
    link.promoting = Some(Promoting {
        key,
        name,
        create,
        parsed: false,
        failed: false,
        parse: (!same_parse).then(|| Bytes::copy_from_slice(&batch[parts.parse.clone()])),
        notices: None,
    });
    true
}

/// One answer to a promoted batch before its BindComplete: what becomes of it and whether it
/// was the ReadyForQuery that ends the batch, or `None` for an answer the plain path handles
/// as any other (a ParameterStatus, which no Parse or Bind causes).
pub fn on_message(tag: u8, frame: &[u8], link: &mut Link<'_>) -> Option<(Action, bool)> {
    let p = link.promoting.as_mut()?;
    Some(match tag {
        backend::tag::PARSE_COMPLETE => {
            p.parsed = true;
            (Action::Swallow, false)
        }
        backend::tag::NOTICE_RESPONSE => {
            p.notices
                .get_or_insert_with(BytesMut::new)
                .extend_from_slice(frame);
            (Action::Swallow, false)
        }
        backend::tag::BIND_COMPLETE if !p.failed => {
            let p = link.promoting.take().expect("promoting");
            client_parsed(link, p.parse, true);
            if p.notices.is_none() {
                if let Some(unnamed) = link.client.unnamed.as_mut() {
                    unnamed.promoted = Some((p.key, p.name));
                }
            }
            match p.notices {
                Some(mut notices) => {
                    let promoted = &mut link.server.promoted;
                    promoted.forget(p.key, true, &mut link.server.stale);
                    notices.extend_from_slice(&PARSE_AND_BIND_COMPLETE);
                    (Action::Replace(notices), false)
                }
                None => (Action::ReplaceStatic(&PARSE_AND_BIND_COMPLETE), false),
            }
        }
        backend::tag::ERROR_RESPONSE if !p.failed => {
            let (key, create, parsed) = (p.key, p.create, p.parsed);
            let error = wire::ErrorResponse::parse(&frame[5..]);
            let fatal = error.as_ref().is_ok_and(|e| e.is_fatal());
            let cancelled = error
                .as_ref()
                .is_ok_and(|e| e.code == wire::sqlstate::QUERY_CANCELED);
            let promoted = &mut link.server.promoted;
            if create && !parsed {
                promoted.refuse_unprepared(key);
            } else {
                promoted.forget(key, false, &mut link.server.stale);
            }
            if fatal || cancelled {
                // The connection ends, or the client (or statement_timeout) cancelled the
                // request: it is not run again. A cancel while binding reads as one while
                // PostgreSQL bound the client's statement.
                let p = link.promoting.take().expect("promoting");
                let mut answer = p.notices.unwrap_or_default();
                let parse_ok = !create || parsed;
                if parse_ok {
                    answer.extend_from_slice(&[backend::tag::PARSE_COMPLETE, 0, 0, 0, 4]);
                }
                answer.extend_from_slice(frame);
                client_parsed(link, p.parse, parse_ok);
                link.txn.failed = true;
                return Some((Action::Replace(answer), false));
            }
            p.failed = true;
            (Action::Swallow, false)
        }
        backend::tag::READY_FOR_QUERY if p.failed => {
            link.promoting = None;
            link.plain = None;
            link.batch.clear();
            let batch = &link.promoted_batch[..];
            let mut at = 0;
            while at < batch.len() {
                let len = FrameHeader::SIZE - 4 + frame_len(&batch[at..]);
                link.batch.push_raw(&batch[at..at + len]);
                at += len;
            }
            // The failed attempt ran nothing: the client's batch goes again, as it was.
            link.retry = Some(0);
            link.retried = true;
            (Action::Swallow, true)
        }
        backend::tag::READY_FOR_QUERY => {
            // Not without an answer to the Bind; should it come, nothing is held any more.
            link.promoting = None;
            return None;
        }
        _ => return None,
    })
}

/// The server's name of the statement a Bind or Describe of the client's unnamed statement
/// is to use, when the client's last Parse of it was promoted and this server holds that
/// statement: PostgreSQL's would be the statement as analysed then (failing with `cached
/// plan must not change result type` after DDL changed its rows), which the promoted one is
/// and a Parse of the text now would not be.
pub fn unnamed_in_use(link: &Link<'_>) -> Option<Bytes> {
    if link.cache.is_some() {
        return None;
    }
    let unnamed = link.client.unnamed.as_ref()?;
    if link.server.unnamed == Some((link.client.tag, unnamed.seq)) {
        return None;
    }
    let (key, name) = unnamed.promoted.as_ref()?;
    link.server.promoted.holds(*key, name).then(|| name.clone())
}

/// The client's records after its Parse, as the general path keeps them: its unnamed
/// statement is the text parsed (`parse`, or the one it had when it sent the same again), or
/// none when the Parse failed. The server's unnamed statement is what it was.
fn client_parsed(link: &mut Link<'_>, parse: Option<Bytes>, ok: bool) {
    if !ok {
        link.client.unnamed = None;
        return;
    }
    // A new number even for the same text: a server's unnamed statement parsed from it
    // earlier is not the one the client has now (DDL may have come between).
    link.client.parses += 1;
    let seq = link.client.parses;
    match (parse, link.client.unnamed.as_mut()) {
        (None, Some(unnamed)) => {
            unnamed.seq = seq;
            unnamed.promoted = None;
        }
        (parse, _) => {
            link.client.unnamed = parse.map(|parse| Unnamed {
                seq,
                parse,
                outcome: None,
                plain: true,
                promoted: None,
            })
        }
    }
}

/// Where the Parse and the Bind of a promotable batch are.
struct Parts {
    parse: std::ops::Range<usize>,
    bind: std::ops::Range<usize>,
}

impl Parts {
    /// A batch of exactly Parse, Bind, an optional Describe of the unnamed portal, Execute
    /// and Sync, all of the unnamed statement and portal (`plain` checked the frames).
    fn of(batch: &[u8]) -> Option<Parts> {
        let mut at = 0;
        let mut next = |expect: &[u8]| -> Option<(u8, std::ops::Range<usize>)> {
            let t = *batch.get(at)?;
            if !expect.contains(&t) {
                return None;
            }
            let end = at + FrameHeader::SIZE - 4 + frame_len(batch.get(at..)?);
            let range = at..end;
            at = end;
            Some((t, range))
        };
        let (_, parse) = next(&[tag::PARSE])?;
        let (_, bind) = next(&[tag::BIND])?;
        let (t, describe) = next(&[tag::DESCRIBE, tag::EXECUTE])?;
        let execute = if t == tag::DESCRIBE {
            if batch[describe.start + FrameHeader::SIZE..describe.end] != [b'P', 0] {
                return None;
            }
            next(&[tag::EXECUTE])?.1
        } else {
            describe
        };
        let (_, sync) = next(&[tag::SYNC])?;
        let bind_body = &batch[bind.start + FrameHeader::SIZE..bind.end];
        let unnamed = bind_body.starts_with(&[0, 0])
            && batch.get(execute.start + FrameHeader::SIZE) == Some(&0)
            && sync.end == batch.len();
        unnamed.then_some(Parts { parse, bind })
    }
}

/// The length field of the frame at the front of `bytes` (the whole frame less its tag).
fn frame_len(bytes: &[u8]) -> usize {
    bytes
        .get(1..5)
        .map_or(4, |l| u32::from_be_bytes([l[0], l[1], l[2], l[3]]) as usize)
}

/// Appends a frame of type `tag` whose body is `parts` in order.
fn frame(out: &mut BytesMut, tag: u8, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    out.reserve(FrameHeader::SIZE + len);
    out.extend_from_slice(&[tag]);
    out.extend_from_slice(&((len + 4) as u32).to_be_bytes());
    for part in parts {
        out.extend_from_slice(part);
    }
}

/// Whether a statement's definition (text, then parameter types) starts with a keyword of a
/// query or data change: statements that control transactions or the session, or that
/// create objects, are never promoted.
fn promotable_text(definition: &[u8]) -> bool {
    let text = definition.trim_ascii_start();
    let word_end = text
        .iter()
        .position(|b| !b.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let word = &text[..word_end];
    [
        "select", "with", "values", "table", "insert", "update", "delete",
    ]
    .iter()
    .any(|k| word.eq_ignore_ascii_case(k.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_queries_and_data_changes_are_promoted() {
        assert!(promotable_text(b"  SELECT 1\0\0\0"));
        assert!(promotable_text(
            b"with x as (select 1) select * from x\0\0\0"
        ));
        assert!(promotable_text(b"Update t set a = $1\0\0\x01\0\0\0\x17"));
        assert!(!promotable_text(b"BEGIN\0\0\0"));
        assert!(!promotable_text(b"selectx\0\0\0"));
        assert!(!promotable_text(b"CREATE TABLE t ()\0\0\0"));
        assert!(!promotable_text(b"/* c */ SELECT 1\0\0\0"));
    }

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn a_promotable_batch_is_one_unnamed_statement_run_once() {
        let parse = msg(b'P', b"\0SELECT 1\0\0\0");
        let bind = msg(b'B', b"\0\0\0\0\0\0\0\0");
        let describe = msg(b'D', b"P\0");
        let execute = msg(b'E', b"\0\0\0\0\0");
        let sync = msg(b'S', b"");
        let batch = |parts: &[&Vec<u8>]| parts.iter().flat_map(|p| p.iter().copied()).collect();
        let all: Vec<u8> = batch(&[&parse, &bind, &describe, &execute, &sync]);
        let parts = Parts::of(&all).expect("promotable");
        assert_eq!(parts.parse, 0..parse.len());
        assert_eq!(parts.bind, parse.len()..parse.len() + bind.len());
        assert!(Parts::of(&batch(&[&parse, &bind, &execute, &sync])).is_some());
        assert!(Parts::of(&batch(&[&parse, &bind, &sync])).is_none());
        assert!(Parts::of(&batch(&[
            &parse,
            &bind,
            &msg(b'D', b"S\0"),
            &execute,
            &sync
        ]))
        .is_none());
        assert!(Parts::of(&batch(&[
            &parse,
            &msg(b'B', b"p\0\0\0\0\0\0\0\0"),
            &execute,
            &sync
        ]))
        .is_none());
    }
}

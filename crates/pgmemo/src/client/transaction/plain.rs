//! The plain path of transaction pooling: a request that needs nothing from pgmemo goes to
//! the server exactly as the client sent it, in one copy, and its answers are relayed by
//! looking at message types only, without a queue entry per message.
//!
//! Most requests of a busy application are such: a simple Query that cannot touch session
//! state, or an extended-protocol batch on the unnamed statement (Parse, Bind, Describe,
//! Execute, Sync, as pgbench `-M extended`, JDBC's first executions and many drivers send
//! them). Matching each of their answers with a queue entry cost about as much as the rest
//! of the relay together; none of that matching changes what the client receives.
//!
//! A request is plain when, before it, nothing is owed to the client (so its answers come
//! first), the cache is off for the client's database, no COPY is reading data, the server's
//! settings are in line with the client's and:
//! - a Query's text cannot affect the session (`sql::may_affect_session`, the check that
//!   makes the general path leave a Query untouched);
//! - a batch holds at most one each of Parse, Bind, Describe and Execute, in that order,
//!   then Sync; the Parse is of the unnamed statement and its text cannot affect the
//!   session; Bind and Describe use the unnamed statement, which this batch parses or the
//!   server holds for this client already; and no portal of the attachment changes session
//!   state.
//!
//! Everything else takes the general path (`requests`), which keeps the same records for a
//! plain request as this one does.

use bytes::{Buf, Bytes, BytesMut};
use wire::frontend::{tag, Describe, Execute, Target};
use wire::FrameHeader;

use super::link::{Link, Unnamed};
use super::requests::sync_settings;

/// A plain request in flight: what its answers end with, and what they may need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plain {
    /// A simple Query: answered up to its ReadyForQuery.
    Query,
    /// An extended-protocol batch: answered up to the ReadyForQuery of its Sync. Its Execute
    /// may start a COPY FROM STDIN, in which the server ignores that Sync.
    Batch,
}

/// Takes the plain request at the front of `buf`, if there is one, and appends it to `out`
/// (`true`). Asked before every message: only the checks that rule it out are inlined.
#[inline(always)]
pub fn request(
    buf: &mut BytesMut,
    link: &mut Link<'_>,
    max_message: usize,
    out: &mut BytesMut,
) -> bool {
    if link.cache.is_some()
        || link.plain.is_some()
        || link.mid_batch
        || link.copy_in
        || link.retry.is_some()
        || !link.queue.is_empty()
        || !matches!(
            buf.first(),
            Some(&(tag::QUERY | tag::PARSE | tag::BIND | tag::DESCRIBE | tag::EXECUTE))
        )
        || named_bind(buf)
    {
        return false;
    }
    take_plain(buf, link, max_message, out)
}

/// A Bind of the unnamed portal to a named statement (as drivers that prepare send them): the
/// commonest request that is not plain, told from its first bytes.
#[inline(always)]
fn named_bind(buf: &[u8]) -> bool {
    buf.first() == Some(&tag::BIND)
        && buf.get(FrameHeader::SIZE) == Some(&0)
        && buf.get(FrameHeader::SIZE + 1).is_some_and(|&b| b != 0)
}

#[inline(never)]
fn take_plain(
    buf: &mut BytesMut,
    link: &mut Link<'_>,
    max_message: usize,
    out: &mut BytesMut,
) -> bool {
    let Some(shape) = shape(buf, link, max_message) else {
        return false;
    };
    // As the general path does before a request: the server's settings brought in line,
    // statements with stale plans closed. Whatever that sends is pgmemo's own, with queue
    // entries, and the request then follows the general path behind it.
    sync_settings(link, out);
    if !link.queue.is_empty() {
        return false;
    }
    let parses = shape.parse.is_some();
    if link.max_promoted > 0
        && parses
        && shape.kind == Plain::Batch
        && super::promote::request(&buf[..shape.len], shape.same_parse, link, out)
    {
        buf.advance(shape.len);
        link.plain = Some(Plain::Batch);
        link.plain_parse = false;
        return true;
    }
    match (shape.kind, shape.parse) {
        (Plain::Query, _) => link.query_sent(),
        (Plain::Batch, Some(_)) if shape.same_parse => link.unnamed_parsed(None),
        (Plain::Batch, Some(parse)) => link.unnamed_parsed(Some(Unnamed {
            seq: 0,
            parse: Bytes::copy_from_slice(&buf[parse]),
            outcome: None,
            plain: true,
            promoted: None,
        })),
        (Plain::Batch, None) => {}
    }
    out.extend_from_slice(&buf[..shape.len]);
    buf.advance(shape.len);
    link.plain = Some(shape.kind);
    link.plain_parse = parses;
    true
}

/// A plain request found at the front of the client's bytes.
struct Shape {
    kind: Plain,
    /// Its size in bytes.
    len: usize,
    /// Where its Parse is.
    parse: Option<std::ops::Range<usize>>,
    /// The Parse is byte for byte the client's current plain unnamed statement.
    same_parse: bool,
}

/// Whether the request at the front of `buf` is plain (see the module's description).
/// Malformed messages are never: the general path reports them.
fn shape(buf: &[u8], link: &Link<'_>, max_message: usize) -> Option<Shape> {
    let header = FrameHeader::peek(buf, max_message).ok()??;
    if buf.len() < header.frame_len {
        return None;
    }
    if header.tag == tag::QUERY {
        let text = buf[FrameHeader::SIZE..header.frame_len].strip_suffix(b"\0")?;
        return (!sql::may_affect_session(text)).then_some(Shape {
            kind: Plain::Query,
            len: header.frame_len,
            parse: None,
            same_parse: false,
        });
    }
    if !link.portals.is_empty() {
        return None;
    }
    let mut at = 0;
    let mut last_rank = 0;
    let mut parse = None;
    let mut same_parse = false;
    let mut uses_unnamed = false;
    loop {
        let header = FrameHeader::peek(&buf[at..], max_message).ok()??;
        let end = at + header.frame_len;
        if buf.len() < end {
            return None;
        }
        let body = &buf[at + FrameHeader::SIZE..end];
        let rank = match header.tag {
            tag::PARSE => 1,
            tag::BIND => 2,
            tag::DESCRIBE => 3,
            tag::EXECUTE => 4,
            tag::SYNC => 5,
            _ => return None,
        };
        if rank <= last_rank {
            return None;
        }
        last_rank = rank;
        match header.tag {
            tag::PARSE => {
                let raw = &buf[at..end];
                same_parse = link
                    .client
                    .unnamed
                    .as_ref()
                    .is_some_and(|u| u.plain && u.parse[..] == *raw);
                if !same_parse && !plain_unnamed_parse(body) {
                    return None;
                }
                parse = Some(at..end);
            }
            tag::BIND => {
                let portal_end = body.iter().position(|&b| b == 0)?;
                // The statement's name, up to its terminator, is empty.
                if body.get(portal_end + 1) != Some(&0) {
                    return None;
                }
                uses_unnamed = true;
            }
            tag::DESCRIBE => match body {
                // The unnamed portal and statement, told apart without a search.
                [b'P', 0] => {}
                [b'S', 0] => uses_unnamed = true,
                _ => match Describe::target_of(body).ok()? {
                    (Target::Portal, _) => {}
                    (Target::Statement, b"") => uses_unnamed = true,
                    (Target::Statement, _) => return None,
                },
            },
            tag::EXECUTE => {
                Execute::portal_of(body).ok()?;
            }
            _ => {
                if !body.is_empty() {
                    return None;
                }
                at = end;
                break;
            }
        }
        at = end;
    }
    if uses_unnamed && parse.is_none() {
        // The server must hold the client's own unnamed statement, one that changes nothing
        // when run: otherwise the general path prepares it there first or tracks its effect.
        let client = &*link.client;
        let held = client.unnamed.as_ref().is_some_and(|u| {
            u.plain && u.outcome.is_none() && link.server.unnamed == Some((client.tag, u.seq))
        });
        if !held {
            return None;
        }
    }
    Some(Shape {
        kind: Plain::Batch,
        len: at,
        parse,
        same_parse,
    })
}

/// Whether a Parse body is a well-formed Parse of the unnamed statement whose text cannot
/// affect the session: the general path would send it as it is and track nothing.
fn plain_unnamed_parse(body: &[u8]) -> bool {
    let Some((&0, rest)) = body.split_first() else {
        return false;
    };
    let Some(text_end) = rest.iter().position(|&b| b == 0) else {
        return false;
    };
    let (text, types) = (&rest[..text_end], &rest[text_end + 1..]);
    let Some(count) = types.get(..2).map(|c| i16::from_be_bytes([c[0], c[1]])) else {
        return false;
    };
    count >= 0
        && types.len() == 2 + 4 * count as usize
        && std::str::from_utf8(text).is_ok()
        && !sql::may_affect_session(text)
}

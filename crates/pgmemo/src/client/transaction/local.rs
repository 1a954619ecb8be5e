//! Requests a detached client can have answered without a server: a batch of named Parses of
//! statements some server already accepted, Closes of statements, and the Sync that ends it.
//! Drivers that prepare synchronously (pgbench, many ORMs) would otherwise wait for a server
//! while the clients holding every server wait for them.

use std::sync::atomic::Ordering;

use bytes::BytesMut;
use wire::backend::{self, TransactionStatus};
use wire::frontend::{self, Close, Parse, Target};
use wire::FrameHeader;

use super::link::ClientState;
use crate::pool::{ParamTypes, StatementKey, StatementRegistry};

/// If the buffered messages up to the first Sync can all be answered locally, consumes them
/// and returns the answers.
pub fn answer(
    buf: &mut BytesMut,
    state: &mut ClientState,
    registry: &StatementRegistry,
    max_message: usize,
) -> Option<BytesMut> {
    if state.status != TransactionStatus::Idle {
        return None;
    }
    // Whether every message up to the Sync is a named Parse or a Close, from the headers and
    // names alone: nearly every request is not (an unnamed Parse, a Bind), and is out here
    // without a copy or a decode.
    let mut at = 0;
    loop {
        let header = FrameHeader::peek(&buf[at..], max_message).ok()??;
        if buf.len() - at < header.frame_len {
            return None;
        }
        let body = &buf[at + FrameHeader::SIZE..at + header.frame_len];
        match header.tag {
            // A Sync with a body: the server fails it (08P01) and rolls back.
            frontend::tag::SYNC if !body.is_empty() => return None,
            frontend::tag::SYNC => break,
            frontend::tag::PARSE if body.first().is_some_and(|&c| c != 0) => {}
            frontend::tag::CLOSE => {}
            _ => return None,
        }
        at += header.frame_len;
    }
    // Then decode: look without consuming.
    let mut at = 0;
    let mut plan = Vec::new();
    loop {
        let header = FrameHeader::peek(&buf[at..], max_message).ok()??;
        if buf.len() - at < header.frame_len {
            return None;
        }
        let body =
            bytes::Bytes::copy_from_slice(&buf[at + FrameHeader::SIZE..at + header.frame_len]);
        at += header.frame_len;
        match header.tag {
            frontend::tag::SYNC => break,
            frontend::tag::PARSE => {
                let parse = Parse::decode(body).ok()?;
                let name = std::str::from_utf8(&parse.name).ok()?.to_owned();
                let sql = std::str::from_utf8(&parse.query).ok()?;
                if name.is_empty()
                    || state.statements.contains_key(&name)
                    || plan.iter().any(|(n, _)| *n == name)
                    || sql::may_affect_session(sql)
                {
                    return None;
                }
                let key = StatementKey {
                    text: sql.into(),
                    types: ParamTypes::Oids(parse.param_types.into_boxed_slice()),
                    settings: state.settings.parse_digest().clone(),
                };
                let statement = registry.get(&key)?;
                if !statement.validated.load(Ordering::Relaxed) {
                    return None;
                }
                plan.push((name, Some(statement)));
            }
            frontend::tag::CLOSE => {
                let close = Close::decode(body).ok()?;
                let name = std::str::from_utf8(&close.name).ok()?.to_owned();
                if close.target != Target::Statement || name.is_empty() {
                    return None;
                }
                plan.push((name, None));
            }
            _ => return None,
        }
    }
    let mut out = BytesMut::with_capacity(plan.len() * 5 + 6);
    for (name, statement) in plan {
        match statement {
            Some(statement) => {
                state.described.remove(&statement.id);
                state.row_shapes.remove(&statement.id);
                state.statements.insert(name, statement);
                out.extend_from_slice(&super::requests::parse_complete());
            }
            None => {
                state.statements.remove(&name);
                state.effects.remove(&name);
                out.extend_from_slice(&super::requests::close_complete());
            }
        }
    }
    out.extend_from_slice(&backend::ready_for_query(TransactionStatus::Idle));
    let _ = buf.split_to(at);
    Some(out)
}

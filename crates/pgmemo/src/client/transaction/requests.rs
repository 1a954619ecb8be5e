//! Client to server, transaction pooling: each client message is translated for the server
//! it is attached to now. Statement names become pgmemo's (preparing the statement there
//! first when the server lacks it), the client's unnamed statement is restored when another
//! client replaced it, the server's settings are brought in line before each request, and
//! session commands are tracked or refused. Every message that gets an answer adds a queue
//! entry, in order, before any byte is written.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use sql::StatementKind;
use wire::frontend::{self, Bind, Close, Describe, Execute, Parse, Target};
use wire::sqlstate::PROTOCOL_VIOLATION;
use wire::{ErrorResponse, Frame, WireError};

use super::cache::{Pipelined, TxnCache};
use super::commands::{
    discard_in_pipeline, duplicate, ensure_on, missing, not_utf8, raise_sql, run_late, Effect,
    Outcome, Plan, Planner, Protocol, ServerPrep,
};
use super::link::{Described, Entry, Expect, Link, Revert, Unnamed, OWN_UNNAMED};
use super::shape;
use crate::cache::plan::Effects;
use crate::pool::settings::{analysis_switch, lexes_as_default, sync_sql, UNKNOWN_PARSE_SETTINGS};
use crate::pool::{
    ParamTypes, PreparedStatement, StatementKey, StatementRegistry, StatementSource,
};

/// Translates one client message (not Terminate) into `out`. Returns whether pgmemo queued
/// an answer of its own that the server pump must send without waiting for the server.
pub fn translate(
    frame: Frame,
    link: &mut Link<'_>,
    registry: &StatementRegistry,
    out: &mut BytesMut,
) -> Result<bool, WireError> {
    let tag = frame.tag();
    if matches!(
        tag,
        frontend::tag::PARSE
            | frontend::tag::BIND
            | frontend::tag::DESCRIBE
            | frontend::tag::EXECUTE
            | frontend::tag::CLOSE
            | frontend::tag::SYNC
    ) {
        if !link.mid_batch {
            link.batch.begin(!link.queue.is_empty());
            link.retried = false;
        }
        link.batch.push(&frame);
        if link.doomed && tag != frontend::tag::SYNC {
            return Ok(false);
        }
    }
    match tag {
        frontend::tag::QUERY => {
            // The Query drops the unnamed statement and portal: what they would have run
            // never runs.
            link.withdraw_unrun();
            if let Some(answer) = hit_in_block(&frame, link) {
                link.queue.push_back(Entry::local(answer));
                return Ok(true);
            }
            query(&frame, link, registry, out)?;
            Ok(false)
        }
        frontend::tag::PARSE => {
            batch_start(link, out);
            parse(&frame, link, registry, out).or_else(|e| malformed(e, &frame, link, out))
        }
        frontend::tag::BIND => {
            batch_start(link, out);
            match bind(&frame, link, registry, out) {
                Ok(()) => Ok(false),
                Err(e) => malformed(e, &frame, link, out),
            }
        }
        frontend::tag::DESCRIBE => {
            batch_start(link, out);
            let (target, name) = match Describe::target_of(frame.body()) {
                Ok(described) => described,
                Err(e) => return malformed(e, &frame, link, out),
            };
            match target {
                Target::Portal => {
                    out.extend_from_slice(frame.raw());
                    let mut entry = Entry::forward(Expect::DescribePortal);
                    // Its answer tells the client the shape of the statement's rows.
                    entry.uses = match &link.last_bound {
                        Some((portal, statement)) if portal[..] == *name => {
                            Some(Arc::clone(statement))
                        }
                        _ => None,
                    };
                    link.queue.push_back(entry);
                }
                Target::Statement => {
                    let Ok(name) = text(name) else {
                        return Ok(not_utf8_name(&frame, Expect::DescribeStatement, link, out));
                    };
                    // The statement the Describe is to run, before what the client was told
                    // of it is looked up.
                    statement_to_run(name, link, registry);
                    let recorded = recorded_description(name, link);
                    if let Some(Described {
                        parameters,
                        rows: Some(false),
                    }) = &recorded
                    {
                        // Nothing to analyse again: PostgreSQL answers from what it kept.
                        let mut answer = BytesMut::with_capacity(parameters.len() + 5);
                        answer.extend_from_slice(parameters);
                        answer.extend_from_slice(&no_data());
                        link.queue.push_back(Entry::local(answer.freeze()));
                        return Ok(true);
                    }
                    if name.is_empty() {
                        if let Some(server_name) = super::promote::unnamed_in_use(link) {
                            Describe {
                                target: Target::Statement,
                                name: server_name,
                            }
                            .encode(out);
                            link.queue
                                .push_back(Entry::forward(Expect::DescribeStatement));
                            return Ok(false);
                        }
                    }
                    let parameters = recorded
                        .filter(|d| d.rows == Some(true) && !link.may_be_aborted())
                        .map(|d| d.parameters);
                    let Some(statement) = statement_for_use(name, None, link, registry, out) else {
                        return Ok(false);
                    };
                    if let (Some(parameters), Some(statement)) = (parameters, &statement) {
                        before_prep_error(statement, parameters, link);
                    }
                    match &statement {
                        None => out.extend_from_slice(frame.raw()),
                        Some(statement) => Describe {
                            target: Target::Statement,
                            name: Bytes::copy_from_slice(statement.name.as_bytes()),
                        }
                        .encode(out),
                    }
                    let mut entry = Entry::forward(Expect::DescribeStatement);
                    if statement.is_some() {
                        entry.uses = statement;
                        (entry.batch, entry.frame) = link.batch.position();
                    }
                    link.queue.push_back(entry);
                }
            }
            Ok(false)
        }
        frontend::tag::EXECUTE => {
            batch_start(link, out);
            let portal = match Execute::portal_of(frame.body()) {
                Ok(portal) => portal,
                Err(e) => return malformed(e, &frame, link, out),
            };
            let mut entry = Entry::forward(Expect::Execute);
            if !link.portals.is_empty() {
                // A utility statement's portal runs once (a second Execute fails with 55000
                // and must not undo what the first did): only a query's portal, which may
                // be executed row batch by row batch, keeps its outcome for the next one.
                let runs_again = |o: &Outcome| matches!(o.effect, Effect::SettingsUnknown { .. });
                let outcome = match link.portals.get(portal) {
                    Some(o) if runs_again(o) => Some(Arc::clone(o)),
                    Some(_) => link.portals.remove(portal),
                    None => None,
                };
                if let Some(outcome) = outcome {
                    if !names_change_runs(&outcome, link, out) {
                        return Ok(false);
                    }
                    if let Effect::Prepared {
                        statement,
                        client_name,
                        ran,
                        ..
                    } = &outcome.effect
                    {
                        // Not the first run of this PREPARE (its unnamed statement bound
                        // again): the name is taken unless something deallocated it since.
                        if ran.swap(true, Ordering::Relaxed) {
                            if link.client.statements.contains_key(client_name) {
                                emit_refusal(&duplicate(client_name), link, out);
                                return Ok(false);
                            }
                            link.client
                                .statements
                                .insert(client_name.clone(), Arc::clone(statement));
                        }
                    }
                    entry.raised = matches!(outcome.effect, Effect::Raises);
                    entry.outcomes.push(Outcome::clone(&outcome));
                }
            }
            if let Some(cache) = link.cache.as_deref_mut() {
                entry.effects = Some(Box::new(cache.portal_effects(portal)));
                let max_rows = Execute::max_rows_of(frame.body())?;
                let first = !link
                    .batch
                    .executed_before(link.batch.len().saturating_sub(1));
                cache.executed(portal, max_rows, first, link.client);
            }
            out.extend_from_slice(frame.raw());
            link.queue.push_back(entry);
            Ok(false)
        }
        frontend::tag::CLOSE => {
            batch_start(link, out);
            close(&frame, link, out).or_else(|e| malformed(e, &frame, link, out))
        }
        frontend::tag::SYNC => {
            link.withdraw_unrun();
            out.extend_from_slice(frame.raw());
            // In copy-in mode the server ignores Sync (libpq and tokio-postgres send one right
            // after the COPY's Execute): no ReadyForQuery will answer it.
            if !link.copy_in {
                link.queue.push_back(Entry::forward(Expect::Sync));
            }
            link.mid_batch = false;
            link.doomed = false;
            Ok(false)
        }
        frontend::tag::FLUSH if !frame.body().is_empty() && !link.doomed => {
            // The server fails it (08P01) and skips to the next Sync; it flushes nothing.
            // (A server already skipping to the Sync ignores it, as any other Flush.)
            malformed(
                WireError::Malformed("a Flush with a body"),
                &frame,
                link,
                out,
            )
        }
        frontend::tag::FLUSH => {
            // A Flush with nothing pending (psycopg sends one after each Sync) must not keep
            // the server attached.
            out.extend_from_slice(frame.raw());
            Ok(true)
        }
        frontend::tag::FUNCTION_CALL => {
            sync_settings(link, out);
            out.extend_from_slice(frame.raw());
            // A function called by OID (set_config, an advisory lock, anything) may change
            // session state pgmemo cannot see, as a `DO` block may: once it returned, the
            // server is reset before its next use, and a `set_config` call's setting is read
            // back from it to follow the client (a request pipelined behind still finds the
            // server as the call left it).
            let mut entry = Entry::forward(Expect::Query);
            entry.outcomes.push(Outcome {
                effect: Effect::SettingsUnknown {
                    verify: set_config_by_oid(frame.body()).into_iter().collect(),
                },
                tag: None,
                uses: None,
            });
            if link.cache.is_some() {
                entry.effects = Some(Box::new(writes_anything()));
            }
            link.queue.push_back(entry);
            Ok(false)
        }
        frontend::tag::COPY_DONE | frontend::tag::COPY_FAIL => {
            link.copy_in = false;
            out.extend_from_slice(frame.raw());
            Ok(false)
        }
        // COPY data and anything else: the server judges it.
        _ => {
            out.extend_from_slice(frame.raw());
            Ok(false)
        }
    }
}

/// Whether an Execute of a portal whose statement changes the client's statement names
/// (`ClientState::unrun`) may run: not one withdrawn at an earlier batch's Sync (refused,
/// `run_late`), nor a `DISCARD ALL` after another Execute of its batch, which PostgreSQL
/// refuses (25001) once a statement of the implicit transaction completed. Otherwise the
/// Execute's entry takes over undoing it should the server skip or refuse it.
fn names_change_runs(outcome: &Arc<Outcome>, link: &mut Link<'_>, out: &mut BytesMut) -> bool {
    if link.client.withdrawn.is_empty() && link.client.unrun.is_empty() {
        return true;
    }
    if link
        .client
        .withdrawn
        .iter()
        .any(|w| Arc::ptr_eq(w, outcome))
    {
        emit_refusal(&run_late(), link, out);
        return false;
    }
    if matches!(outcome.effect, Effect::Discarded { .. })
        && link
            .batch
            .executed_before(link.batch.len().saturating_sub(1))
    {
        // Left in `unrun`: the Sync gives back what its planning took.
        emit_raise(&discard_in_pipeline(), link, out);
        return false;
    }
    link.client.unrun.retain(|u| !Arc::ptr_eq(u, outcome));
    true
}

/// The setting a FunctionCall of `set_config` (OID 2078) names, lowercased: its first
/// argument (text, the same bytes in either format).
fn set_config_by_oid(body: &[u8]) -> Option<String> {
    const SET_CONFIG: u32 = 2078;
    let oid = u32::from_be_bytes(body.get(..4)?.try_into().ok()?);
    if oid != SET_CONFIG {
        return None;
    }
    let formats = usize::from(u16::from_be_bytes(body.get(4..6)?.try_into().ok()?));
    let at = 6 + 2 * formats + 2;
    let len = i32::from_be_bytes(body.get(at..at + 4)?.try_into().ok()?);
    let name = body.get(at + 4..at + 4 + usize::try_from(len).ok()?)?;
    Some(std::str::from_utf8(name).ok()?.to_ascii_lowercase())
}

/// Whether the message at the front of `buf` must wait for the answers to the batches
/// pipelined before it: it uses one of the client's statement names that an earlier batch,
/// still unanswered, gave or took away (a Parse, a Close, `DEALLOCATE`, `DISCARD ALL`). The
/// server skips that batch's messages after an error in it, and PostgreSQL then treats the
/// name as it was before; pgmemo, which answers a Close or a known Parse itself and refuses
/// a duplicate or unknown name itself, must know which it was. A Bind or Describe waits only
/// behind a name taken away, behind a name given to a statement the server held already, or
/// behind pgmemo's own Parse (or Close) of its statement on this server (the first use on a
/// server, in a pipeline). One behind a name given by a Parse the server runs goes to the
/// server, which reports a skipped Parse's statement missing itself, so that drivers that
/// pipeline a new statement's Parse and its executions in separate batches keep their
/// pipeline. SQL text (a Query, an unnamed Parse) waits behind SQL-level name changes
/// (`sql_names_in_flight`).
#[inline]
pub fn must_wait(buf: &[u8], link: &Link<'_>) -> bool {
    if link.queue.is_empty() && !link.plain_parse && link.plain.is_none() {
        return false;
    }
    match buf.first() {
        Some(
            &(frontend::tag::PARSE
            | frontend::tag::CLOSE
            | frontend::tag::BIND
            | frontend::tag::QUERY),
        ) => {}
        Some(&frontend::tag::DESCRIBE) if buf.get(5) == Some(&b'S') => {}
        _ => return false,
    }
    waits_on_earlier_batch(buf, link)
}

#[cold]
fn waits_on_earlier_batch(buf: &[u8], link: &Link<'_>) -> bool {
    let Ok(Some(header)) = wire::FrameHeader::peek(buf, usize::MAX) else {
        return false;
    };
    let Some(body) = buf.get(wire::FrameHeader::SIZE..header.frame_len) else {
        return false;
    };
    let cstr = |b: &[u8]| b.iter().position(|&c| c == 0).map(|end| b[..end].to_vec());
    if header.tag == frontend::tag::QUERY
        || (header.tag == frontend::tag::PARSE && body.first() == Some(&0))
    {
        // SQL text, which may name the client's statements (`EXECUTE q1`, `PREPARE q1`):
        // planned once no earlier batch can still give or take away a name. A `DISCARD
        // ALL` or `DEALLOCATE` waits for every earlier request: whether one opened a
        // transaction block (where DISCARD ALL fails), and which names an earlier Parse
        // really gave (dropped now, one the server then refuses would come back when the
        // drop is undone).
        return sql_names_in_flight(link)
            || ((earlier_batches(link) > 0 || link.plain.is_some()) && mentions_name_drop(body));
    }
    let (name, given_counts) = match header.tag {
        frontend::tag::PARSE => (cstr(body), true),
        frontend::tag::CLOSE if body.first() == Some(&b'S') => (cstr(&body[1..]), true),
        frontend::tag::DESCRIBE => (cstr(&body[1..]), false),
        frontend::tag::BIND => {
            let Some(portal) = cstr(body) else {
                return false;
            };
            (cstr(&body[portal.len() + 1..]), false)
        }
        _ => return false,
    };
    let Some(name) = name else {
        return false;
    };
    let earlier = earlier_batches(link);
    if name.is_empty() {
        return header.tag != frontend::tag::PARSE && unnamed_undecided(link, earlier);
    }
    let Ok(name) = std::str::from_utf8(&name) else {
        return false;
    };
    // A Bind or Describe of a statement pgmemo prepares (or evicts) on this server in an
    // earlier batch: if the server skips that, it lacks the statement (or still has it), and
    // the message, sent as if it had run, would fail where PostgreSQL's would not.
    let used = if given_counts {
        None
    } else {
        link.client.statements.get(name)
    };
    if used.is_some_and(|statement| waits_to_switch(statement, link, earlier)) {
        return true;
    }
    link.queue.iter().take(earlier).any(|entry| {
        let given = entry
            .revert
            .as_ref()
            .is_some_and(|r| r.client_name.as_deref() == Some(name));
        let prepared_for_use = used.is_some_and(|statement| {
            entry
                .revert
                .as_ref()
                .is_some_and(|r| r.client_name.is_none() && Arc::ptr_eq(&r.statement, statement))
        });
        // A name given to a statement the server held already: skipped, the name is gone,
        // but the server would still run the statement.
        let given_held = given && entry.revert.as_ref().is_some_and(|r| !r.on_server);
        prepared_for_use
            || given_held
            || (given_counts && given)
            || entry.outcomes.iter().any(|o| match &o.effect {
                Effect::Prepared { client_name, .. } => given_counts && client_name == name,
                Effect::Deallocated(names) => names.iter().any(|(n, _)| n == name),
                Effect::Discarded { .. } => true,
                _ => false,
            })
    })
}

/// Whether SQL text mentions `DISCARD` or `DEALLOCATE` (in any case), told without a parse.
fn mentions_name_drop(text: &[u8]) -> bool {
    text.windows(7).any(|w| w.eq_ignore_ascii_case(b"discard"))
        || text
            .windows(10)
            .any(|w| w.eq_ignore_ascii_case(b"deallocate"))
}

/// How many queue entries belong to earlier batches: those up to the last Sync; the ones
/// after it belong to the batch the client's next message is part of, whose earlier error
/// would make the server skip that message as well.
fn earlier_batches(link: &Link<'_>) -> usize {
    if link.mid_batch {
        link.queue
            .iter()
            .rposition(|e| e.expect == Expect::Sync)
            .map_or(0, |i| i + 1)
    } else {
        link.queue.len()
    }
}

/// Whether an earlier batch, still unanswered, planned a `PREPARE`, `DEALLOCATE` or `DISCARD
/// ALL` of SQL text: should the server skip or refuse it (an error before it in its batch),
/// the client's names are not what planning assumed, and a statement pipelined behind that
/// names one must be planned with the names as PostgreSQL will have them. Rare (such
/// statements are seldom pipelined), so such a statement simply waits for those answers.
#[cold]
fn sql_names_in_flight(link: &Link<'_>) -> bool {
    link.queue.iter().take(earlier_batches(link)).any(|entry| {
        entry.unnamed.as_ref().is_some_and(|u| u.unrun.is_some())
            || entry.outcomes.iter().any(|o| {
                matches!(
                    o.effect,
                    Effect::Prepared { .. } | Effect::Deallocated(_) | Effect::Discarded { .. }
                )
            })
    })
}

/// Whether a Bind or Describe of `statement` waits for the answers to the first `earlier`
/// queue entries because one of them changes settings and the server lacks the statement:
/// prepared again once that change is settled, the server can be switched to the settings
/// the statement was read under and back to those the change left (`analysis_switch_for`);
/// before, switching back would undo the change.
fn waits_to_switch(statement: &PreparedStatement, link: &Link<'_>, earlier: usize) -> bool {
    link.queue.iter().take(earlier).any(Entry::changes_settings)
        && statement.read_under() != UNKNOWN_PARSE_SETTINGS
        && !link.server.statements.holds(statement)
}

/// Whether a Bind or Describe of the unnamed statement depends on an earlier batch's Parse
/// or Close of it (the client's, or one pgmemo sent to give the server the client's unnamed
/// statement, or none of another client's): skipped after an error there, it leaves the
/// server another unnamed statement than pgmemo assumed, which the Bind would run. A Parse
/// of it earlier in the message's own batch decides it alone (drivers in pipeline mode send
/// Parse, Bind and Execute of the unnamed statement in every batch, and keep their pipeline).
/// A batch on the plain path whose unnamed Parse is unanswered (`Link::plain_parse`) counts
/// as such an earlier batch: it has no queue entries to look at.
fn unnamed_undecided(link: &Link<'_>, earlier: usize) -> bool {
    let parsed_here = link
        .queue
        .iter()
        .skip(earlier)
        .any(|e| e.unnamed.as_ref().is_some_and(|u| u.client.is_some()));
    !parsed_here
        && (link.plain_parse || link.queue.iter().take(earlier).any(|e| e.unnamed.is_some()))
}

/// An extended-protocol message whose layout is wrong (a missing terminator, too few or too
/// many bytes, a bad Describe or Close target, a Flush with a body): it goes to the server as
/// the client sent it, which fails it with PostgreSQL's own error (08P01, `insufficient data
/// left in message`, `invalid DESCRIBE message subtype 88`, ...) and skips the batch to its
/// Sync, as it would without pgmemo. PostgreSQL reads the whole message before it looks at any name in it, and
/// checks the same layout pgmemo's decoders check, so such a message never acts on the
/// server. Other errors (a name that is not UTF-8) stay the caller's.
#[cold]
fn malformed(
    error: WireError,
    frame: &Frame,
    link: &mut Link<'_>,
    out: &mut BytesMut,
) -> Result<bool, WireError> {
    if !matches!(
        error,
        WireError::Truncated | WireError::MissingTerminator | WireError::Malformed(_)
    ) {
        return Err(error);
    }
    tracing::debug!(%error, "a malformed message goes to the server, which refuses it");
    out.extend_from_slice(frame.raw());
    let expect = match frame.tag() {
        frontend::tag::PARSE => Expect::Parse,
        frontend::tag::BIND => Expect::Bind,
        frontend::tag::EXECUTE => Expect::Execute,
        frontend::tag::CLOSE => Expect::Close,
        // A Describe or a Flush: an entry that only the error answers.
        _ => Expect::DescribePortal,
    };
    link.queue.push_back(Entry::forward(expect));
    link.doomed = true;
    Ok(false)
}

/// A Bind, Describe or Close of a statement name that is not UTF-8: pgmemo never creates
/// such a statement on a server (its Parse is refused, see `not_utf8`), so the message goes
/// there as the client sent it and gets PostgreSQL's own answer: 22021 for a UTF-8 client,
/// otherwise 26000 for a Bind or Describe and CloseComplete for a Close. Returns `false`: no
/// answer of pgmemo's is queued.
#[cold]
fn not_utf8_name(frame: &Frame, expect: Expect, link: &mut Link<'_>, out: &mut BytesMut) -> bool {
    out.extend_from_slice(frame.raw());
    link.queue.push_back(Entry::forward(expect));
    false
}

/// A named Parse whose name or text is not UTF-8, refused (`not_utf8`). The server reads it
/// first as the unnamed statement: a UTF-8 client gets PostgreSQL's 22021 for the bytes (a
/// name's first, as PostgreSQL reads the name first); in another client_encoding that Parse
/// passes (a name goes as a comment) or fails as PostgreSQL's would, and pgmemo refuses the
/// statement after it.
#[cold]
fn not_utf8_parse(msg: &Parse, link: &mut Link<'_>, out: &mut BytesMut) {
    match text(&msg.name) {
        Ok(_) => probe_unreadable(msg.query.clone(), msg.param_types.clone(), link, out),
        Err(_) => probe_unreadable(as_comment(&msg.name), Vec::new(), link, out),
    }
    emit_refusal(&not_utf8(), link, out);
}

/// A Bind's portal name that is not UTF-8: PostgreSQL reads it before anything else in the
/// Bind and fails a UTF-8 client's with 22021, ahead of any check pgmemo makes itself (an
/// unknown statement, a wrong parameter count). The server reads the same bytes first (see
/// [`probe_unreadable`]): that fails as the Bind would and skips the batch, or passes in
/// another client_encoding, where the Bind goes on.
#[cold]
fn probe_portal_name(portal: &[u8], link: &mut Link<'_>, out: &mut BytesMut) {
    probe_unreadable(as_comment(portal), Vec::new(), link, out);
}

/// Sends `query`, bytes that may not be valid in the client's encoding, as pgmemo's own Parse
/// of the unnamed statement (answer swallowed), so that the server reads them as PostgreSQL
/// would have read the client's message. When it refuses them while reading (22021), it keeps
/// the unnamed statement it had, which a Bind of the unnamed statement would otherwise find
/// (seed 60 of the damaged-messages fuzzer): the undo says so (`UnnamedUndo::unreadable`).
fn probe_unreadable(query: Bytes, param_types: Vec<u32>, link: &mut Link<'_>, out: &mut BytesMut) {
    Parse {
        name: Bytes::new(),
        query,
        param_types,
    }
    .encode(out);
    let mut undo = link.unnamed_undo(false);
    undo.unreadable = true;
    let mut entry = Entry::swallow(Expect::Parse);
    entry.unnamed = Some(undo);
    link.server.unnamed = Some(OWN_UNNAMED);
    link.queue.push_back(entry);
}

/// `bytes` as the text of an SQL comment: line breaks, which would end it, become blanks.
fn as_comment(bytes: &[u8]) -> Bytes {
    let line = bytes.iter().map(|&b| match b {
        b'\n' | b'\r' => b' ',
        b => b,
    });
    b"-- ".iter().copied().chain(line).collect()
}

fn text(bytes: &[u8]) -> Result<&str, WireError> {
    std::str::from_utf8(bytes).map_err(|_| WireError::InvalidUtf8)
}

/// Before the first message of an extended-protocol batch: settings in line.
fn batch_start(link: &mut Link<'_>, out: &mut BytesMut) {
    if !link.mid_batch {
        sync_settings(link, out);
        link.mid_batch = true;
    }
}

/// Brings the server's session settings in line with the client's (a swallowed Query), and
/// closes statements whose plans went stale.
pub(super) fn sync_settings(link: &mut Link<'_>, out: &mut BytesMut) {
    for name in std::mem::take(&mut link.server.stale) {
        Close {
            target: Target::Statement,
            name: Bytes::from(name),
        }
        .encode(out);
        link.queue.push_back(Entry::swallow(Expect::Close));
        out.extend_from_slice(&frontend::sync());
        link.queue.push_back(Entry::swallow(Expect::Sync));
    }
    // Inside a transaction block the server already runs with the client's settings (they
    // change only at commit), and a reset there would undo the block's own SETs.
    if link.client.status != wire::backend::TransactionStatus::Idle {
        return;
    }
    if let Some(sql) = sync_sql(&link.client.settings, &mut link.server.settings) {
        tracing::trace!(%sql, "settings brought in line");
        out.extend_from_slice(&frontend::query(&sql));
        link.queue.push_back(Entry::swallow(Expect::Query));
        link.server.unnamed = None;
    }
}

fn planner<'l>(link: &'l mut Link<'_>, registry: &'l StatementRegistry) -> Planner<'l> {
    let settings_changed = link.settings_unsettled();
    Planner {
        registry,
        in_block: link.client.status != wire::backend::TransactionStatus::Idle,
        state: &mut *link.client,
        server: &mut link.server.statements,
        max_prepared: link.max_prepared,
        settings_changed,
        at_use: Default::default(),
    }
}

/// Sends the client's unnamed statement (`parse`) and records it as the one the client and
/// this server now hold. `unreadable`: its text is not UTF-8 (see `UnnamedUndo::unreadable`).
fn send_unnamed_parse(
    link: &mut Link<'_>,
    parse: Bytes,
    outcome: Option<Arc<Outcome>>,
    (plain, unreadable): (bool, bool),
    out: &mut BytesMut,
) {
    let mut undo = link.unnamed_undo(true);
    undo.unreadable = unreadable;
    // What planning the statement changed in the client's names (a `PREPARE`, `DEALLOCATE`
    // or `DISCARD ALL`) is undone should the server skip or refuse the Parse, or should
    // nothing execute it (`Link::withdraw_unrun`).
    if let Some(o) = &outcome {
        if matches!(
            o.effect,
            Effect::Prepared { .. } | Effect::Deallocated(_) | Effect::Discarded { .. }
        ) {
            link.client.unrun.push(Arc::clone(o));
            undo.unrun = Some(Arc::clone(o));
        }
    }
    out.extend_from_slice(&parse);
    let mut entry = Entry::forward(Expect::Parse);
    entry.unnamed = Some(undo);
    link.unnamed_parsed(Some(Unnamed {
        seq: 0,
        parse,
        outcome,
        plain,
        promoted: None,
    }));
    link.queue.push_back(entry);
}

/// A simple Query inside a transaction block answered from the cache, when nothing is owed
/// to the client before it (so the answer goes out in order) and no SET is pending.
fn hit_in_block(frame: &Frame, link: &mut Link<'_>) -> Option<Bytes> {
    if !in_block_between_requests(link) {
        return None;
    }
    let text = frame.body().strip_suffix(b"\0")?;
    let answer = link.cache.as_deref_mut()?.hit_in_block(text, link.client)?;
    // A simple Query drops the client's unnamed statement, answered here or by the server.
    link.client.unnamed = None;
    Some(answer)
}

/// Answers the extended-protocol read at the front of `buf` from the cache when the client
/// is inside a transaction block under the conditions of [`hit_in_block`]: the batch is taken
/// from `buf` and its answer queued as pgmemo's own (`true`: the server pump must send it).
/// Called before the batch's first message is decoded, since a hit needs the whole batch.
/// Asked before every message: only the checks that rule it out are inlined.
#[inline(always)]
pub fn batch_hit_in_block(buf: &mut BytesMut, link: &mut Link<'_>, max_message: usize) -> bool {
    if link.cache.is_none()
        || link.client.status != wire::backend::TransactionStatus::InTransaction
        || !matches!(
            buf.first(),
            Some(&(frontend::tag::PARSE | frontend::tag::BIND))
        )
    {
        return false;
    }
    answer_batch_in_block(buf, link, max_message)
}

#[inline(never)]
fn answer_batch_in_block(buf: &mut BytesMut, link: &mut Link<'_>, max_message: usize) -> bool {
    if !in_block_between_requests(link) {
        return false;
    }
    let Some(cache) = link.cache.as_deref_mut() else {
        return false;
    };
    let Some(answer) = cache.batch_hit_in_block(buf, link.client, max_message) else {
        return false;
    };
    link.queue.push_back(Entry::local(answer));
    true
}

/// Looks at the request at the front of `buf` when it starts (no batch begun) with the cache
/// on, for [`TxnCache::pipelined`]:
/// a read pipelined behind inert reads only is answered from the cache (queued as pgmemo's
/// own answer; `true`: the server pump must send it) or captured.
/// Asked before every message: only the check that there is nothing to do is inlined.
#[inline(always)]
pub fn pipelined_read(buf: &mut BytesMut, link: &mut Link<'_>, max_message: usize) -> bool {
    if link.mid_batch
        || buf.is_empty()
        || !link
            .cache
            .as_deref()
            .is_some_and(TxnCache::watches_pipeline)
    {
        return false;
    }
    look_at_pipelined(buf, link, max_message)
}

#[inline(never)]
fn look_at_pipelined(buf: &mut BytesMut, link: &mut Link<'_>, max_message: usize) -> bool {
    let Some(cache) = link.cache.as_deref_mut() else {
        return false;
    };
    let at = Pipelined {
        first: link.queue.is_empty() && link.plain.is_none(),
        excluded: link.copy_in || !link.txn.pending.is_empty(),
        // The answers to pgmemo's own statements are kept from the client.
        ahead: link
            .queue
            .iter()
            .filter(|e| e.forward && matches!(e.expect, Expect::Sync | Expect::Query))
            .count(),
    };
    let Some(answer) = cache.pipelined(buf, link.client, max_message, at) else {
        return false;
    };
    link.queue.push_back(Entry::local(answer));
    true
}

/// Inside a transaction block, nothing owed to the client, no batch begun, no SET pending.
fn in_block_between_requests(link: &Link<'_>) -> bool {
    link.client.status == wire::backend::TransactionStatus::InTransaction
        && link.owes_nothing()
        && !link.mid_batch
        && link.txn.pending.is_empty()
}

fn query(
    frame: &Frame,
    link: &mut Link<'_>,
    registry: &StatementRegistry,
    out: &mut BytesMut,
) -> Result<(), WireError> {
    sync_settings(link, out);
    link.query_sent();
    // A text with bytes after its terminator is malformed: PostgreSQL refuses the message
    // (08P01) before it runs any of it.
    let text = frame
        .body()
        .strip_suffix(b"\0")
        .filter(|text| !text.contains(&0));
    let plan = match text {
        Some(text) => planner(link, registry).plan(text, Protocol::Simple),
        None => Plan::Plain,
    };
    let mut entry = Entry::forward(Expect::Query);
    match plan {
        Plan::Plain => out.extend_from_slice(frame.raw()),
        Plan::Refused(e) => {
            out.extend_from_slice(&frontend::query(&raise_sql(&e)));
            entry.raised = true;
        }
        Plan::Tracked {
            text,
            outcomes,
            prep,
            raises,
        } => {
            if !link.mid_batch && outcomes.iter().any(|o| o.uses.is_some()) {
                // Kept to run again should a statement it executes turn out stale or gone
                // on this server (see `responses::note_stale_plan`).
                link.batch.clear();
                link.retried = false;
                link.batch.push(frame);
            }
            let closed = !link.mid_batch && close_before_sql_prepare(&outcomes, link, out);
            emit_prep(&prep, false, link, out);
            if closed && prep.is_empty() {
                end_injected(link, out);
            }
            entry.raised = raises;
            match text {
                Some(text) => out.extend_from_slice(&frontend::query(&text)),
                None => out.extend_from_slice(frame.raw()),
            }
            entry.outcomes = outcomes;
        }
    }
    let settings_pending = !link.txn.pending.is_empty();
    if let Some(cache) = link.cache.as_deref_mut() {
        let effects = match text.and_then(|b| std::str::from_utf8(b).ok()) {
            Some(sql) => cache.effects_of(sql, None, link.client, settings_pending),
            None => writes_anything(),
        };
        entry.effects = Some(Box::new(effects));
    }
    link.queue.push_back(entry);
    Ok(())
}

/// The effects of a statement pgmemo cannot read.
fn writes_anything() -> Effects {
    Effects {
        database_wide: true,
        ..Effects::default()
    }
}

fn parse(
    frame: &Frame,
    link: &mut Link<'_>,
    registry: &StatementRegistry,
    out: &mut BytesMut,
) -> Result<bool, WireError> {
    // Drivers parse the same unnamed statement again for every query: when it is the one
    // that went out last time as the client sent it, it needs no decoding or planning.
    if let Some(unnamed) = link
        .client
        .unnamed
        .as_ref()
        .filter(|u| u.plain && u.parse[..] == *frame.raw())
    {
        out.extend_from_slice(&unnamed.parse);
        let mut entry = Entry::forward(Expect::Parse);
        entry.unnamed = Some(link.unnamed_undo(true));
        link.unnamed_parsed(None);
        link.queue.push_back(entry);
        return Ok(false);
    }
    let msg = Parse::decode(frame.body_bytes())?;
    let named = !msg.name.is_empty();
    // An unnamed statement's text goes to the server as the client sent it, in whatever
    // `client_encoding` (planning refuses what it cannot read); a named one's keys the
    // registry, and its name the client's records.
    let sql = match text(&msg.query) {
        Err(_) if !named => Ok(""),
        sql => sql,
    };
    let (Ok(name), Ok(sql)) = (text(&msg.name), sql) else {
        not_utf8_parse(&msg, link, out);
        return Ok(false);
    };
    let name = name.to_owned();
    if named && link.client.statements.contains_key(&name) {
        // PostgreSQL parses and analyses the text before it looks at the name: a syntax
        // error, several statements, a missing table or an aborted block (unless the text
        // is ROLLBACK or COMMIT) is reported instead of 42P05. The server analyses it as the
        // unnamed statement (nobody's afterwards), then the batch fails with 42P05.
        out.extend_from_slice(&encode_parse("", sql, &msg.param_types));
        let mut entry = Entry::swallow(Expect::Parse);
        entry.unnamed = Some(link.unnamed_undo(false));
        link.server.unnamed = Some(OWN_UNNAMED);
        link.queue.push_back(entry);
        emit_refusal(&duplicate(&name), link, out);
        return Ok(false);
    }
    let mut tracked = true;
    let plan = planner(link, registry).plan(&msg.query, Protocol::Extended { named });
    let (sql, outcome) = match plan {
        Plan::Plain => {
            tracked = false;
            (None, None)
        }
        Plan::Refused(e) if !named => {
            // PostgreSQL looks up the names an EXECUTE, DEALLOCATE or PREPARE uses when the
            // statement runs: the unnamed statement is one that raises the error when it is
            // executed (its Parse, Bind and Describe succeed, as they would there).
            let parse = encode_parse("", &raise_sql(&e), &msg.param_types);
            let raises = Some(Arc::new(Outcome::raises()));
            send_unnamed_parse(link, parse, raises, (false, false), out);
            return Ok(false);
        }
        Plan::Refused(e) => {
            emit_raise(&e, link, out);
            return Ok(false);
        }
        Plan::Tracked {
            text,
            outcomes,
            prep,
            ..
        } => {
            emit_prep(&prep, true, link, out);
            (text, outcomes.into_iter().next().map(Arc::new))
        }
    };
    if !named {
        // A copy: a slice of the read buffer would pin it until the next Parse.
        let plain = !tracked;
        // The text as the client sent it goes out, unless pgmemo rewrote it (in UTF-8).
        let unreadable = sql.is_none() && text(&msg.query).is_err();
        let parse = match &sql {
            None => Bytes::copy_from_slice(frame.raw()),
            Some(sql) => encode_parse("", sql, &msg.param_types),
        };
        send_unnamed_parse(link, parse, outcome, (plain, unreadable), out);
        return Ok(false);
    }
    let final_sql = sql
        .as_deref()
        .unwrap_or(std::str::from_utf8(&msg.query).unwrap_or_default());
    // The settings the server analyses it under: the committed ones, unless something in
    // the open transaction or pipelined ahead changed them (see `settings_unsettled`: such a
    // statement is never shared).
    let unshared = link.settings_unsettled();
    let settings = if unshared {
        Arc::from(UNKNOWN_PARSE_SETTINGS)
    } else {
        link.client.settings.parse_digest().clone()
    };
    let key = StatementKey {
        text: final_sql.into(),
        types: ParamTypes::Oids(msg.param_types.clone().into_boxed_slice()),
        settings,
    };
    let create = |server_name: &str| {
        StatementSource::Parse(encode_parse(server_name, final_sql, &msg.param_types))
    };
    let statement = if unshared {
        registry.register_unshared(key, create)
    } else {
        registry.get_or_register(key, create)
    };
    link.client
        .statements
        .insert(name.clone(), statement.clone());
    // A new statement in PostgreSQL's eyes, analysed anew: described anew too.
    if !link.client.described.is_empty() {
        link.client.described.remove(&statement.id);
    }
    if !link.client.row_shapes.is_empty() {
        link.client.row_shapes.remove(&statement.id);
    }
    if let Some(outcome) = outcome {
        link.client
            .effects
            .insert(name.clone(), (statement.clone(), outcome));
    }
    let held = link.server.statements.touch(&statement);
    let revert = |statement, on_server| {
        Some(Box::new(Revert {
            statement,
            client_name: Some(name),
            on_server,
            closed: false,
            kept: false,
        }))
    };
    if held {
        // The server holds it already. The same text goes as the unnamed statement: the
        // server accepts or refuses it just as PostgreSQL would the client's Parse (in an
        // aborted block it refuses one that is not of ROLLBACK or COMMIT, 25P02, and the name
        // is then not taken), and analysing it takes the snapshot PostgreSQL's analysis takes
        // (a `BEGIN ISOLATION LEVEL` run after it in the same transaction fails with 25001;
        // a REPEATABLE READ block reads as of it). Its answer is the client's; the client's
        // record goes with an error.
        let mut entry = Entry::forward(Expect::Parse);
        entry.revert = revert(statement, false);
        entry.unnamed = Some(link.unnamed_undo(false));
        link.server.unnamed = Some(OWN_UNNAMED);
        out.extend_from_slice(&encode_parse("", final_sql, &msg.param_types));
        link.queue.push_back(entry);
        return Ok(false);
    }
    if !held {
        let evicted = link
            .server
            .statements
            .insert(statement.clone(), link.max_prepared);
        let drops: Vec<ServerPrep> = evicted.into_iter().map(ServerPrep::Drop).collect();
        emit_prep(&drops, true, link, out);
    }
    let StatementSource::Parse(create) = &statement.create else {
        unreachable!("protocol-level statements are created with Parse")
    };
    close_if_closing(&statement, link, out);
    out.extend_from_slice(create);
    let learn = statement.clone();
    let mut entry = Entry::forward(Expect::Parse);
    entry.revert = revert(statement, !held);
    link.queue.push_back(entry);
    learn_types(learn, link, out);
    Ok(false)
}

/// Describes the statement a client's Parse just created on the server, answer swallowed and
/// noted as the client's description of it (`ClientState::described`): the parameter types
/// the server resolved are those PostgreSQL keeps for the statement, which preparing it
/// again on another server must give ([`create_parse`]). Skipped with the Parse should it
/// fail.
fn learn_types(statement: Arc<PreparedStatement>, link: &mut Link<'_>, out: &mut BytesMut) {
    Describe {
        target: Target::Statement,
        name: Bytes::from(statement.name.clone()),
    }
    .encode(out);
    let mut entry = Entry::swallow(Expect::DescribeStatement);
    entry.uses = Some(statement);
    link.queue.push_back(entry);
}

fn bind(
    frame: &Frame,
    link: &mut Link<'_>,
    registry: &StatementRegistry,
    out: &mut BytesMut,
) -> Result<(), WireError> {
    let body = frame.body();
    let portal_end = body
        .iter()
        .position(|&b| b == 0)
        .ok_or(WireError::MissingTerminator)?;
    let rest = &body[portal_end + 1..];
    let stmt_end = rest
        .iter()
        .position(|&b| b == 0)
        .ok_or(WireError::MissingTerminator)?;
    let portal = &body[..portal_end];
    link.last_bound = None;
    if std::str::from_utf8(portal).is_err() {
        probe_portal_name(portal, link, out);
    }
    let Ok(name) = std::str::from_utf8(&rest[..stmt_end]) else {
        not_utf8_name(frame, Expect::Bind, link, out);
        return Ok(());
    };
    if std::mem::take(&mut link.refuse_bind) {
        // The client would decode rows of another shape than the one it learnt.
        emit_refusal_frame(shape::changed_error(), link, out);
        return Ok(());
    }
    let tail = Some(&rest[stmt_end + 1..]);
    if name.is_empty() {
        let tail = &rest[stmt_end + 1..];
        // Only a Bind whose counts fit goes to the promoted statement: PostgreSQL's errors
        // about them name the statement, which is "" for the client.
        let promoted =
            super::promote::unnamed_in_use(link).filter(|_| unnamed_bind_counts_fit(link, tail));
        if let Some(server_name) = promoted {
            bind_renamed(portal, &server_name, tail, out);
            if !link.portals.is_empty() {
                link.portals.remove(portal);
            }
            link.queue.push_back(Entry::forward(Expect::Bind));
            return Ok(());
        }
    }
    let Some(statement) = statement_for_use(name, tail, link, registry, out) else {
        return Ok(());
    };
    if let Some(statement) = &statement {
        link.last_bound = Some((Bytes::copy_from_slice(portal), Arc::clone(statement)));
    }
    match &statement {
        None => out.extend_from_slice(frame.raw()),
        Some(statement) => bind_renamed(
            portal,
            statement.name.as_bytes(),
            &rest[stmt_end + 1..],
            out,
        ),
    }
    let outcome = if name.is_empty() {
        link.client.unnamed.as_ref().and_then(|u| u.outcome.clone())
    } else {
        link.client.effect_of(name).cloned()
    };
    match outcome {
        Some(o) => {
            link.portals.insert(Bytes::copy_from_slice(portal), o);
        }
        None if !link.portals.is_empty() => {
            link.portals.remove(portal);
        }
        None => {}
    }
    if link.cache.is_some() {
        bound(portal, name, link);
    }
    let mut entry = Entry::forward(Expect::Bind);
    if statement.is_some() {
        entry.uses = statement;
        (entry.batch, entry.frame) = link.batch.position();
    }
    link.queue.push_back(entry);
    Ok(())
}

/// Before a Bind at the head of `buf` goes to the server: when the client will decode its
/// rows with a shape it learnt earlier (it described the statement, and does not describe
/// the portal again before executing it), the server's statement must have that shape, as
/// PostgreSQL's would or fail with `cached plan must not change result type`. A statement
/// this server described with the client's shape goes as it is; otherwise pgmemo prepares it
/// afresh here, describes it, and holds the Bind (returns `true`) until the answer tells the
/// shape: the same, the Bind goes; another, it fails as PostgreSQL's would
/// (`Link::refuse_bind`). Nothing to do for clients that never described a statement.
#[inline]
pub fn probe_shape(buf: &[u8], link: &mut Link<'_>, out: &mut BytesMut) -> bool {
    link.refuse_bind = false;
    if buf.first() != Some(&frontend::tag::BIND) || link.client.row_shapes.is_empty() || link.doomed
    {
        return false;
    }
    // The unnamed portal, described right after it (libpq's prepared executions, pgbench
    // `-M prepared`): the client learns the shape anew.
    let bind_len = buf.get(1..5).map_or(0, |l| {
        u32::from_be_bytes([l[0], l[1], l[2], l[3]]) as usize + 1
    });
    if buf.get(5) == Some(&0)
        && buf.get(bind_len) == Some(&frontend::tag::DESCRIBE)
        && buf.get(bind_len + 5..bind_len + 7) == Some(b"P\0")
    {
        return false;
    }
    probe_bind(buf, link, out)
}

#[cold]
fn probe_bind(buf: &[u8], link: &mut Link<'_>, out: &mut BytesMut) -> bool {
    let Ok(Some(header)) = wire::FrameHeader::peek(buf, usize::MAX) else {
        return false;
    };
    let Some(body) = buf.get(wire::FrameHeader::SIZE..header.frame_len) else {
        return false;
    };
    fn cstr(b: &[u8]) -> Option<&[u8]> {
        b.iter().position(|&c| c == 0).map(|end| &b[..end])
    }
    let Some(portal) = cstr(body) else {
        return false;
    };
    let Some(name) = cstr(&body[portal.len() + 1..]) else {
        return false;
    };
    let Some(statement) = std::str::from_utf8(name)
        .ok()
        .filter(|n| !n.is_empty())
        .and_then(|n| link.client.statements.get(n))
    else {
        return false;
    };
    let Some(&learnt) = link.client.row_shapes.get(&statement.id) else {
        return false;
    };
    if shape::describes_portal_next(&buf[header.frame_len..], portal) || link.may_be_aborted() {
        return false;
    }
    let statement = Arc::clone(statement);
    let probed = link.probed == Some(statement.id);
    if probed && link.queue.iter().any(|e| e.probe) {
        return true;
    }
    // PostgreSQL checks a Bind's counts before it analyses the statement again: a wrong count
    // is the Bind's error (`bind_count_error`), before anything is prepared or refused here
    // (the server reports it, or pgmemo does when the server lacks the statement; seed 19670).
    // Checked only where pgmemo would refuse or probe, off the path of a statement run as
    // the client learnt it.
    let tail = &body[portal.len() + name.len() + 2..];
    let client_name = std::str::from_utf8(name).unwrap_or_default();
    let wrong_count =
        |link: &Link<'_>| bind_count_error(client_name, &statement, link, tail).is_some();
    match link.server.statements.shape(&statement) {
        // The client's shape.
        Some(here) if here == learnt => {
            link.probed = None;
            false
        }
        // Described afresh as another shape: the client's statement has another shape now,
        // unless the Bind fails first on its counts.
        Some(_) if probed => {
            link.probed = None;
            link.refuse_bind = !wrong_count(link);
            false
        }
        // The probe failed (the client has its error, and the server skips to the Sync).
        None if probed => {
            link.probed = None;
            false
        }
        _ if wrong_count(link) => false,
        // Not described here, or as another shape: a statement this server prepared before
        // DDL may be stale, one prepared after it has the new shape; neither tells the shape
        // the client's statement has now. Prepared afresh and described.
        _ => {
            if !link.mid_batch {
                link.batch.begin(!link.queue.is_empty());
                link.retried = false;
            }
            batch_start(link, out);
            if link.server.statements.holds(&statement) {
                link.server.statements.remove(statement.id);
                emit_prep(&[ServerPrep::Drop(Arc::clone(&statement))], true, link, out);
            }
            ensure(&statement, link, out);
            Describe {
                target: Target::Statement,
                name: Bytes::copy_from_slice(statement.name.as_bytes()),
            }
            .encode(out);
            out.extend_from_slice(&frontend::flush());
            let mut entry = Entry::swallow(Expect::DescribeStatement);
            entry.uses = Some(statement.clone());
            entry.probe = true;
            link.queue.push_back(entry);
            link.probed = Some(statement.id);
            true
        }
    }
}

/// PostgreSQL's checks of a Bind's parameter counts, made by pgmemo when the server lacks the
/// client's statement `name`: preparing it there first can fail (an aborted block refuses
/// the Parse with 25P02, another `search_path` finds no table) where PostgreSQL reports a
/// wrong count first (08P01), as it checks the counts before it plans the statement again.
/// `tail`: the Bind after the statement name.
fn bind_count_error(
    name: &str,
    statement: &PreparedStatement,
    link: &Link<'_>,
    tail: &[u8],
) -> Option<ErrorResponse> {
    // What a server told the client when it described the statement: exact, whatever
    // settings the statement was read under.
    let told = link.client.described.get(&statement.id).and_then(|d| {
        let count = d.parameters.get(5..7)?;
        usize::try_from(i16::from_be_bytes([count[0], count[1]])).ok()
    });
    count_error(name, tail, || {
        if told.is_some() {
            return told;
        }
        let ParamTypes::Oids(types) = &statement.key.types else {
            return None;
        };
        lexed_count(&statement.key.text, types, statement.read_under())
    })
}

/// The client's unnamed statement, as its Parse, when the server's unnamed statement is
/// another (pgmemo would parse it there again before using it).
fn unnamed_elsewhere(link: &Link<'_>) -> Option<Parse> {
    let unnamed = link.client.unnamed.as_ref()?;
    if link.server.unnamed == Some((link.client.tag, unnamed.seq)) {
        return None;
    }
    Parse::decode(unnamed.parse.slice(5..)).ok()
}

/// The client's Bind of `portal` to the server's statement `server_name` (`tail`: the Bind
/// after the statement name, as the client sent it).
fn bind_renamed(portal: &[u8], server_name: &[u8], tail: &[u8], out: &mut BytesMut) {
    let len = 4 + portal.len() + 1 + server_name.len() + 1 + tail.len();
    out.reserve(1 + len);
    out.put_u8(frontend::tag::BIND);
    out.put_u32(len as u32);
    out.put_slice(portal);
    out.put_u8(0);
    out.put_slice(server_name);
    out.put_u8(0);
    out.put_slice(tail);
}

/// Whether a Bind of the client's unnamed statement (`tail`: after the statement name)
/// supplies as many parameters as its text requires, with as many formats, as far as lexing
/// the text tells (`false` when it cannot tell).
fn unnamed_bind_counts_fit(link: &Link<'_>, tail: &[u8]) -> bool {
    let count_at = |at: usize| {
        tail.get(at..at + 2)
            .map(|c| usize::from(u16::from_be_bytes([c[0], c[1]])))
    };
    let Some(formats) = count_at(0) else {
        return false;
    };
    let Some(params) = count_at(2 + 2 * formats) else {
        return false;
    };
    let Some(parse) = link
        .client
        .unnamed
        .as_ref()
        .and_then(|u| Parse::decode(u.parse.slice(5..)).ok())
    else {
        return false;
    };
    let Ok(text) = std::str::from_utf8(&parse.query) else {
        return false;
    };
    let settings = link.client.settings.parse_digest();
    (formats <= 1 || formats == params)
        && lexed_count(text, &parse.param_types, settings) == Some(params)
}

/// [`bind_count_error`] for the client's unnamed statement, when the server lacks it.
fn unnamed_bind_count_error(link: &Link<'_>, tail: &[u8]) -> Option<ErrorResponse> {
    let parse = unnamed_elsewhere(link)?;
    let text = std::str::from_utf8(&parse.query).ok()?;
    let settings = link.client.settings.parse_digest();
    count_error("", tail, || lexed_count(text, &parse.param_types, settings))
}

/// The parameters a statement with `text`, the parameter `types` its Parse gave and the parse
/// `settings` (`StatementKey::settings`) it was read under requires, as far as lexing its text
/// tells (not under settings that lex strings otherwise).
fn lexed_count(text: &str, types: &[u32], settings: &str) -> Option<usize> {
    if !lexes_as_default(settings) {
        return None;
    }
    sql::parameter_count(text, types.len(), sql::ParseOptions::default())
}

/// The count checks of [`bind_count_error`] for the statement `name`, which requires
/// `required()` parameters (`None`: not known, only the formats are checked against the
/// values, which PostgreSQL checks whatever the statement).
fn count_error(
    name: &str,
    tail: &[u8],
    required: impl FnOnce() -> Option<usize>,
) -> Option<ErrorResponse> {
    let count_at = |at: usize| {
        let n = i16::from_be_bytes(tail.get(at..at + 2)?.try_into().ok()?);
        usize::try_from(n).ok()
    };
    let formats = count_at(0)?;
    let params = count_at(2 + 2 * formats)?;
    if formats > 1 && formats != params {
        return Some(ErrorResponse::error(
            PROTOCOL_VIOLATION,
            format!("bind message has {formats} parameter formats but {params} parameters"),
        ));
    }
    let required = required()?;
    (params != required).then(|| {
        ErrorResponse::error(
            PROTOCOL_VIOLATION,
            format!(
                "bind message supplies {params} parameters, but prepared statement \"{name}\" \
                 requires {required}"
            ),
        )
    })
}

/// With the cache on: notes what executing `portal` (bound to the client's statement `name`)
/// will write.
fn bound(portal: &[u8], name: &str, link: &mut Link<'_>) {
    let settings_pending = !link.txn.pending.is_empty();
    let Some(cache) = link.cache.as_deref_mut() else {
        return;
    };
    let client = &*link.client;
    if name.is_empty() {
        let parse = client
            .unnamed
            .as_ref()
            .and_then(|u| Parse::decode(u.parse.slice(5..)).ok());
        let text = parse
            .as_ref()
            .and_then(|p| std::str::from_utf8(&p.query).ok());
        cache.bound(portal, text.map(|t| (t, None)), client, settings_pending);
    } else {
        let statement = client.statements.get(name);
        let text = statement.map(|s| (&*s.key.text, Some(s.id)));
        cache.bound(portal, text, client, settings_pending);
    }
}

/// Gets the statement a Bind or Describe names ready on the server. `None`: the name is
/// unknown, or the Bind's parameter counts are wrong for a statement the server lacks
/// (`bind`: the Bind after the statement name), and an error was raised instead;
/// `Some(None)`: use the message as it is (the unnamed statement); `Some(Some(statement))`:
/// use pgmemo's statement (and its name).
fn statement_for_use(
    name: &str,
    bind: Option<&[u8]>,
    link: &mut Link<'_>,
    registry: &StatementRegistry,
    out: &mut BytesMut,
) -> Option<Option<Arc<PreparedStatement>>> {
    if name.is_empty() {
        if let Some(e) = bind.and_then(|tail| unnamed_bind_count_error(link, tail)) {
            emit_refusal(&e, link, out);
            return None;
        }
        restore_unnamed(link, out);
        return Some(None);
    }
    let Some(statement) = statement_to_run(name, link, registry) else {
        emit_missing(name, link, out);
        return None;
    };
    if let Some(tail) = bind.filter(|_| !link.server.statements.holds(&statement)) {
        if let Some(e) = bind_count_error(name, &statement, link, tail) {
            emit_refusal(&e, link, out);
            return None;
        }
    }
    ensure(&statement, link, out);
    Some(Some(statement))
}

/// The client's statement `name`, to be bound or described now: a copy of its own when its
/// analysis settings moved since it registered a shared one (`ClientState::own_copy_of`), not
/// while pgmemo cannot tell the settings the server analyses under.
fn statement_to_run(
    name: &str,
    link: &mut Link<'_>,
    registry: &StatementRegistry,
) -> Option<Arc<PreparedStatement>> {
    let statement = link.client.statements.get(name)?;
    if !statement.drifted_from(link.client.settings.parse_digest()) || link.settings_unsettled() {
        return Some(Arc::clone(statement));
    }
    let statement = Arc::clone(statement);
    Some(link.client.own_copy_of(name, &statement, registry))
}

/// What PostgreSQL would describe the client's statement `name` as without analysing it
/// again, when the server lacks the statement (a Describe of it then prepares it there
/// again): what a server first told the client, or else what its Parse fixed (see
/// [`described_by_parse`]).
fn recorded_description(name: &str, link: &Link<'_>) -> Option<Described> {
    if name.is_empty() {
        // The client's unnamed statement, on a server whose unnamed statement is another
        // (pgmemo would parse it there again, which fails in an aborted block where
        // PostgreSQL describes a statement that returns no rows; seed 11706).
        let parse = unnamed_elsewhere(link)?;
        let text = std::str::from_utf8(&parse.query).ok()?;
        let settings = link.client.settings.parse_digest();
        return described_by(text, &parse.param_types, settings);
    }
    let statement = link.client.statements.get(name)?;
    if link.server.statements.holds(statement) {
        return None;
    }
    match link.client.described.get(&statement.id) {
        Some(d) => Some(Described {
            parameters: d.parameters.clone(),
            rows: d.rows,
        }),
        None => described_by_parse(statement),
    }
}

/// A protocol-level statement whose Parse gave every parameter's type (or that has none):
/// its ParameterDescription lists those types, and whether RowDescription or NoData follows
/// shows in its text (`sql::returns_rows`).
fn described_by_parse(statement: &PreparedStatement) -> Option<Described> {
    let (StatementSource::Parse(_), ParamTypes::Oids(types)) =
        (&statement.create, &statement.key.types)
    else {
        return None;
    };
    described_by(&statement.key.text, types, statement.read_under())
}

/// [`described_by_parse`] for a Parse of `text` with `types`, read under the parse
/// `settings` (`StatementKey::settings`).
fn described_by(text: &str, types: &[u32], settings: &str) -> Option<Described> {
    if types.contains(&0) || !lexes_as_default(settings) {
        return None;
    }
    let options = sql::ParseOptions::default();
    if sql::parameter_count(text, types.len(), options)? != types.len() {
        return None;
    }
    let rows = sql::returns_rows(text, options)?;
    // A Parse holds at most 65535 types (an Int16 count), as ParameterDescription does.
    let mut parameters = BytesMut::new();
    wire::backend::ParameterDescription {
        types: types.to_vec(),
    }
    .encode(&mut parameters);
    Some(Described {
        parameters: parameters.freeze(),
        rows: Some(rows),
    })
}

/// A Describe of a statement that returns rows, on a server that lacks it: should preparing
/// it again fail (its table was dropped, the `search_path` no longer finds it), the client
/// gets the statement's ParameterDescription before the error, as PostgreSQL sends one
/// before it finds that out. Not in a block that may be aborted, where PostgreSQL refuses
/// to describe such a statement at all.
fn before_prep_error(statement: &Arc<PreparedStatement>, parameters: Bytes, link: &mut Link<'_>) {
    let prep = link.queue.iter_mut().rev().find(|e| {
        e.expect == Expect::Parse
            && !e.forward
            && e.revert
                .as_ref()
                .is_some_and(|r| r.on_server && Arc::ptr_eq(&r.statement, statement))
    });
    if let Some(entry) = prep {
        entry.synthetic = Some(parameters);
    }
}

fn ensure(statement: &Arc<PreparedStatement>, link: &mut Link<'_>, out: &mut BytesMut) {
    let mut prep = Vec::new();
    ensure_on(
        &mut link.server.statements,
        link.max_prepared,
        statement,
        &mut prep,
    );
    emit_prep(&prep, true, link, out);
}

/// Makes the server's unnamed statement the client's own again (or none, so that the server
/// reports it missing just as PostgreSQL would).
fn restore_unnamed(link: &mut Link<'_>, out: &mut BytesMut) {
    let tag = link.client.tag;
    match &link.client.unnamed {
        Some(u) if link.server.unnamed != Some((tag, u.seq)) => {
            out.extend_from_slice(&u.parse);
            let mut entry = Entry::swallow(Expect::Parse);
            entry.unnamed = Some(link.unnamed_undo(false));
            link.server.unnamed = Some((tag, u.seq));
            link.queue.push_back(entry);
        }
        Some(_) => {}
        None if link.server.unnamed.is_some() => {
            Close {
                target: Target::Statement,
                name: Bytes::new(),
            }
            .encode(out);
            let mut entry = Entry::swallow(Expect::Close);
            entry.unnamed = Some(link.unnamed_undo(false));
            link.server.unnamed = None;
            link.queue.push_back(entry);
        }
        None => {}
    }
}

fn close(frame: &Frame, link: &mut Link<'_>, out: &mut BytesMut) -> Result<bool, WireError> {
    let msg = Close::decode(frame.body_bytes())?;
    if msg.target == Target::Portal {
        link.portals.remove(&msg.name);
        out.extend_from_slice(frame.raw());
        link.queue.push_back(Entry::forward(Expect::Close));
        return Ok(false);
    }
    let Ok(name) = text(&msg.name) else {
        return Ok(not_utf8_name(frame, Expect::Close, link, out));
    };
    if name.is_empty() {
        // Put back if the server skips the Close (an error earlier in the batch), as
        // PostgreSQL then keeps the statement: otherwise the server would hold a statement
        // pgmemo takes for gone, which the next client's Bind of its unnamed one would run.
        let undo = link.unnamed_undo(true);
        let own = link.client.unnamed.take();
        if own.is_some_and(|u| link.server.unnamed == Some((link.client.tag, u.seq))) {
            link.server.unnamed = None;
            out.extend_from_slice(frame.raw());
            let mut entry = Entry::forward(Expect::Close);
            entry.unnamed = Some(undo);
            link.queue.push_back(entry);
            return Ok(false);
        }
        let mut entry = Entry::local(close_complete());
        entry.unnamed = Some(undo);
        link.queue.push_back(entry);
        return Ok(true);
    }
    let mut entry = Entry::local(close_complete());
    if let Some(statement) = link.client.statements.remove(name) {
        // Given back if the server skips the batch from an earlier error on, as PostgreSQL
        // then skips this Close.
        entry.outcomes.push(Outcome {
            effect: Effect::Deallocated(vec![(name.to_owned(), statement)]),
            tag: None,
            uses: None,
        });
    }
    link.queue.push_back(entry);
    Ok(true)
}

/// Before a message that creates `statement` on the server: a Close of it when an eviction
/// of it is still unanswered. The server skips that eviction if an error came earlier in its
/// batch, and would then refuse to create the statement again (42P05 on pgmemo's own name);
/// closing a statement the server lacks is no error. See `Revert::kept` for the records.
/// Whether it sent the Close.
fn close_if_closing(
    statement: &PreparedStatement,
    link: &mut Link<'_>,
    out: &mut BytesMut,
) -> bool {
    let closing = link.queue.iter().any(|e| {
        e.revert
            .as_ref()
            .is_some_and(|r| r.closed && r.statement.id == statement.id)
    });
    if closing {
        Close {
            target: Target::Statement,
            name: Bytes::from(statement.name.clone()),
        }
        .encode(out);
        link.queue.push_back(Entry::swallow(Expect::Close));
    }
    closing
}

/// Sends what `prep` asks for; in the simple protocol a Sync closes the injected messages.
fn emit_prep(prep: &[ServerPrep], extended: bool, link: &mut Link<'_>, out: &mut BytesMut) {
    for p in prep {
        match p {
            ServerPrep::Drop(statement) => {
                Close {
                    target: Target::Statement,
                    name: Bytes::from(statement.name.clone()),
                }
                .encode(out);
                let mut entry = Entry::swallow(Expect::Close);
                entry.revert = Some(Box::new(Revert {
                    statement: Arc::clone(statement),
                    client_name: None,
                    on_server: false,
                    closed: true,
                    kept: false,
                }));
                link.queue.push_back(entry);
            }
            ServerPrep::Create(statement) => {
                let switch = analysis_switch_for(statement, link);
                if let Some((to, _)) = &switch {
                    emit_own_run(to, None, link, out);
                }
                // Recorded as on the server already: if the server skips or refuses it (an
                // error earlier in the batch, an aborted block, a dropped table), the record
                // goes, or every later use on this server would name a statement it lacks.
                let revert = Box::new(Revert {
                    statement: Arc::clone(statement),
                    client_name: None,
                    on_server: true,
                    closed: false,
                    kept: false,
                });
                close_if_closing(statement, link, out);
                match &statement.create {
                    StatementSource::Parse(parse) => {
                        let parse = create_parse(statement, parse, link);
                        out.extend_from_slice(&parse);
                        let mut entry = Entry::swallow(Expect::Parse);
                        entry.revert = Some(revert);
                        link.queue.push_back(entry);
                    }
                    StatementSource::Sql(sql) => emit_own_run(sql, Some(revert), link, out),
                }
                if let Some((_, back)) = &switch {
                    emit_own_run(back, None, link, out);
                }
            }
        }
    }
    if !extended && !prep.is_empty() {
        end_injected(link, out);
    }
}

/// The Sync that closes messages pgmemo sends ahead of a client's Query.
fn end_injected(link: &mut Link<'_>, out: &mut BytesMut) {
    out.extend_from_slice(&frontend::sync());
    let mut sync = Entry::swallow(Expect::Sync);
    sync.holds_error = true;
    link.queue.push_back(sync);
}

/// [`close_if_closing`] for the statements a Query's SQL-level `PREPARE`s create on the
/// server: the Close goes ahead of the Query, in a batch of its own (the caller ends it with
/// a Sync), so the server runs it whatever became of the eviction. Whether any was sent.
fn close_before_sql_prepare(outcomes: &[Outcome], link: &mut Link<'_>, out: &mut BytesMut) -> bool {
    let mut closed = false;
    for outcome in outcomes {
        if let Effect::Prepared {
            statement,
            created: true,
            ..
        } = &outcome.effect
        {
            closed |= close_if_closing(statement, link, out);
        }
    }
    closed
}

/// The Parse (`parse`, the statement's own) that prepares the client's `statement` again on
/// a server that lacks it: with the parameter types a server described to the client
/// ([`learn_types`]) where the client's Parse left some to the server. PostgreSQL keeps
/// those types for good and analyses the statement again with them after a `search_path`
/// change or DDL (`function f(integer) does not exist`), where a Parse that leaves them
/// open would resolve them anew.
fn create_parse(statement: &PreparedStatement, parse: &Bytes, link: &Link<'_>) -> Bytes {
    const UNKNOWN_OID: u32 = 705;
    let ParamTypes::Oids(given) = &statement.key.types else {
        return parse.clone();
    };
    let described =
        link.client.described.get(&statement.id).and_then(|d| {
            wire::backend::ParameterDescription::decode(d.parameters.slice(5..)).ok()
        });
    match described {
        Some(d) if *d.types != **given && !d.types.iter().any(|&t| t == 0 || t == UNKNOWN_OID) => {
            encode_parse(&statement.name, &statement.key.text, &d.types)
        }
        _ => parse.clone(),
    }
}

/// The `DO` blocks around preparing `statement` again on this server that make the server
/// read it under the settings it was first prepared under (`settings::analysis_switch`).
/// Only while the server's settings are the client's committed ones: after a `SET` in the
/// open transaction or batch (or code pgmemo cannot see into) it reads under those in force.
fn analysis_switch_for(statement: &PreparedStatement, link: &Link<'_>) -> Option<(String, String)> {
    if link.settings_unsettled() {
        return None;
    }
    let switch = analysis_switch(statement.read_under(), &link.client.settings)?;
    // Only queries are analysed at Parse, literals and all (a SQL-level PREPARE holds one). A
    // utility statement reads its text when it runs, and the blocks would be the
    // transaction's first query, which `BEGIN ISOLATION LEVEL` or `SET TRANSACTION` must
    // come before.
    let query = match &statement.create {
        StatementSource::Sql(_) => true,
        StatementSource::Parse(_) => sql::analyze(&statement.key.text).is_ok_and(|a| {
            matches!(
                a.statements.as_slice(),
                [one] if matches!(
                    one.kind,
                    StatementKind::Select
                        | StatementKind::Insert
                        | StatementKind::Update
                        | StatementKind::Delete
                        | StatementKind::Merge
                        | StatementKind::Values
                )
            )
        }),
    };
    query.then_some(switch)
}

/// The portal pgmemo runs its own statements through in the middle of a client's batch
/// (closed right after): the client's unnamed portal, which the batch may have bound before
/// and execute after, stays the client's.
const OWN_PORTAL: &str = "pgmemo_own";

/// Runs `sql` on pgmemo's behalf as the unnamed statement, through [`OWN_PORTAL`], answers
/// swallowed (errors still reach the client). `revert` goes on the Execute (a SQL-level
/// `PREPARE` that creates a statement).
fn emit_own_run(sql: &str, revert: Option<Box<Revert>>, link: &mut Link<'_>, out: &mut BytesMut) {
    encode_run(sql, OWN_PORTAL, out);
    Close {
        target: Target::Portal,
        name: Bytes::from_static(OWN_PORTAL.as_bytes()),
    }
    .encode(out);
    let mut parse = Entry::swallow(Expect::Parse);
    parse.unnamed = Some(link.unnamed_undo(false));
    link.server.unnamed = Some(OWN_UNNAMED);
    link.queue.push_back(parse);
    link.queue.push_back(Entry::swallow(Expect::Bind));
    let mut execute = Entry::swallow(Expect::Execute);
    execute.revert = revert;
    link.queue.push_back(execute);
    link.queue.push_back(Entry::swallow(Expect::Close));
}

/// Runs `sql` as the unnamed statement and portal: Parse and Bind are pgmemo's, the
/// Execute's answer goes to the client.
fn emit_unnamed_run(sql: &str, link: &mut Link<'_>, out: &mut BytesMut) {
    encode_run(sql, "", out);
    // Recorded on the Parse's entry too, so that undoing an earlier batch's skipped Parse or
    // Close of the unnamed statement leaves this one in the records (`Link::undo_unnamed`).
    let mut entry = Entry::swallow(Expect::Parse);
    entry.unnamed = Some(link.unnamed_undo(false));
    link.server.unnamed = Some(OWN_UNNAMED);
    link.queue.push_back(entry);
    link.queue.push_back(Entry::swallow(Expect::Bind));
    link.queue.push_back(Entry::forward(Expect::Execute));
}

/// Parse of `sql` as the unnamed statement, Bind of it to `portal`, Execute of that portal.
fn encode_run(sql: &str, portal: &'static str, out: &mut BytesMut) {
    out.extend_from_slice(&encode_parse("", sql, &[]));
    Bind {
        portal: Bytes::from_static(portal.as_bytes()),
        statement: Bytes::new(),
        param_formats: Vec::new(),
        params: Vec::new(),
        result_formats: Vec::new(),
    }
    .encode(out);
    Execute {
        portal: Bytes::from_static(portal.as_bytes()),
        max_rows: 0,
    }
    .encode(out);
}

/// A statement name no server ever holds: longer than PostgreSQL's identifiers (63 bytes),
/// so no SQL-level `PREPARE` can create it, and pgmemo's own Parses use `pgmemo_<n>`.
const NEVER_PREPARED: &str =
    "pgmemo_never_prepared_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";

/// Answers a Bind or Describe of the client's statement `name`, which it does not have
/// (see [`emit_refusal`]).
fn emit_missing(name: &str, link: &mut Link<'_>, out: &mut BytesMut) {
    emit_refusal(&missing(name), link, out);
}

/// Fails the batch here with `error`, which pgmemo decides on for a statement name (one the
/// client does not have, or has already): the server is asked to describe a statement it
/// cannot have, so that it fails where PostgreSQL would, also in an aborted block (where a
/// raising `DO` block fails with 25P02 instead), and skips the rest of the batch; the client
/// gets `error` instead of the server's 26000.
fn emit_refusal(error: &ErrorResponse, link: &mut Link<'_>, out: &mut BytesMut) {
    emit_refusal_frame(error.encode(), link, out);
}

/// [`emit_refusal`] with the client's error as a whole ErrorResponse frame.
fn emit_refusal_frame(error: Bytes, link: &mut Link<'_>, out: &mut BytesMut) {
    Describe {
        target: Target::Statement,
        name: Bytes::from_static(NEVER_PREPARED.as_bytes()),
    }
    .encode(out);
    let mut entry = Entry::forward(Expect::DescribeStatement);
    entry.raised = true;
    entry.synthetic = Some(error);
    link.queue.push_back(entry);
    link.doomed = true;
}

/// Makes the server raise `error` as the answer to the client's current message, so that
/// the batch and the transaction fail exactly as PostgreSQL would make them fail.
fn emit_raise(error: &ErrorResponse, link: &mut Link<'_>, out: &mut BytesMut) {
    emit_unnamed_run(&raise_sql(error), link, out);
    link.queue.back_mut().expect("just queued").raised = true;
    link.doomed = true;
}

fn encode_parse(name: &str, sql: &str, types: &[u32]) -> Bytes {
    let mut out = BytesMut::with_capacity(sql.len() + name.len() + 16);
    Parse {
        name: Bytes::copy_from_slice(name.as_bytes()),
        query: Bytes::copy_from_slice(sql.as_bytes()),
        param_types: types.to_vec(),
    }
    .encode(&mut out);
    out.freeze()
}

/// ParseComplete, for a Parse pgmemo answers itself.
pub(super) fn parse_complete() -> Bytes {
    Bytes::from_static(b"1\0\0\0\x04")
}

/// NoData, for a Describe pgmemo answers itself.
fn no_data() -> Bytes {
    Bytes::from_static(b"n\0\0\0\x04")
}

/// CloseComplete, for a Close pgmemo answers itself.
pub(super) fn close_complete() -> Bytes {
    Bytes::from_static(b"3\0\0\0\x04")
}

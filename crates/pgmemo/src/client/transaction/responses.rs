//! Server to client, transaction pooling: each answer is matched with the queue entry of the
//! message it answers. Answers to pgmemo's own messages are swallowed (errors excepted: the
//! client must learn its request failed), pgmemo's own answers are inserted where they belong,
//! command tags of statements pgmemo ran in another form are restored, and session-setting
//! changes count once their transaction commits. ReadyForQuery with status Idle and nothing
//! owed releases the server.

use bytes::BytesMut;
use wire::backend::{self, TransactionStatus};
use wire::{FrameHeader, WireError};

use super::commands::{Effect, Outcome};
use super::link::{ClientState, Entry, Expect, Link, UnnamedUndo};
use super::plain::Plain;
use super::shape;
use crate::client::relay::MAX_SERVER_FRAME;
use crate::pool::settings::{
    commit, set_raw_sql, SettingChange, TrackedChange, UNKNOWN_PARSE_SETTINGS,
};

/// What one pass over the server's bytes produced.
pub struct Processed {
    /// Bytes at the front of the read buffer that were examined.
    pub consumed: usize,
    /// The client gets `buf[..consumed]` unchanged (nothing swallowed, replaced or inserted);
    /// otherwise it gets `out`.
    pub verbatim: bool,
    /// The server can go back to the pool.
    pub released: bool,
    /// Size of an incomplete frame at the end, to make room for.
    pub need: usize,
}

pub(super) enum Action {
    Forward,
    Swallow,
    Replace(BytesMut),
    /// pgmemo's own bytes in place of the message.
    ReplaceStatic(&'static [u8]),
}

/// Processes the complete frames in `buf` (and pgmemo's own answers that are due).
pub fn process(
    buf: &[u8],
    link: &mut Link<'_>,
    params: &mut Vec<(String, String)>,
    out: &mut BytesMut,
) -> Result<Processed, WireError> {
    let mut at = 0;
    let mut verbatim = true;
    let mut released = false;
    let mut need = 0;
    loop {
        if link.plain.is_none()
            && emit_local(link, out, &buf[..at], &mut verbatim)
            && link.releasable()
        {
            released = true;
            break;
        }
        let Some(header) = FrameHeader::peek(&buf[at..], MAX_SERVER_FRAME)? else {
            need = FrameHeader::SIZE;
            break;
        };
        if buf.len() - at < header.frame_len {
            need = header.frame_len;
            break;
        }
        if header.tag == backend::tag::DATA_ROW
            && verbatim
            && link.cache.is_none()
            && (link.plain.is_some() || link.queue.front().is_some_and(|e| e.forward))
        {
            // Most of a result: forwarded as it is, changing nothing (the cache, when on,
            // captures rows; a swallowed answer or a rewritten stream copies them).
            at += header.frame_len;
            continue;
        }
        let frame = &buf[at..at + header.frame_len];
        let promoted = match link.promoting {
            Some(_) => super::promote::on_message(header.tag, frame, link),
            None => None,
        };
        let (action, ready) = match (promoted, link.plain) {
            (Some(answer), _) => answer,
            (None, Some(plain)) => (
                Action::Forward,
                on_plain_message(plain, header.tag, frame, link, params),
            ),
            (None, None) => on_message(header.tag, frame, link, params),
        };
        if header.tag == backend::tag::ERROR_RESPONSE && !matches!(action, Action::Swallow) {
            note_fatal(frame, link);
        }
        if let Some(cache) = link.cache.as_deref_mut() {
            match &action {
                Action::Forward => {
                    let status = ready.then_some(link.client.status);
                    cache.observe(header.tag, frame, status);
                }
                // Not what the server said: never stored.
                Action::Replace(_) | Action::ReplaceStatic(_) => cache.observe(b'?', frame, None),
                Action::Swallow => {}
            }
        }
        match action {
            Action::Forward if verbatim => {}
            Action::Forward => out.extend_from_slice(frame),
            Action::Swallow | Action::Replace(_) | Action::ReplaceStatic(_) => {
                if verbatim {
                    out.extend_from_slice(&buf[..at]);
                    verbatim = false;
                }
                match action {
                    Action::Replace(bytes) => out.extend_from_slice(&bytes),
                    Action::ReplaceStatic(bytes) => out.extend_from_slice(bytes),
                    _ => {}
                }
            }
        }
        at += header.frame_len;
        if ready {
            // Answers pgmemo owes right after this ReadyForQuery go out with it.
            emit_local(link, out, &buf[..at], &mut verbatim);
            if link.releasable() {
                released = true;
                break;
            }
        }
    }
    Ok(Processed {
        consumed: at,
        verbatim,
        released,
        need,
    })
}

/// Notes a FATAL error on its way to the client: the server closes the connection after it,
/// and the client must not get a second error about that.
#[cold]
fn note_fatal(frame: &[u8], link: &mut Link<'_>) {
    if wire::ErrorResponse::parse(&frame[5..]).is_ok_and(|e| e.is_fatal()) {
        link.fatal_forwarded = true;
    }
}

/// Sends pgmemo's own answers that are at the front of the queue. Returns whether any was.
/// Asked before every message, answered "none" almost always: only that check is inlined.
#[inline(always)]
fn emit_local(
    link: &mut Link<'_>,
    out: &mut BytesMut,
    forwarded: &[u8],
    verbatim: &mut bool,
) -> bool {
    if link.queue.front().is_none_or(|e| e.expect != Expect::Local) {
        return false;
    }
    emit_due_local(link, out, forwarded, verbatim)
}

#[inline(never)]
fn emit_due_local(
    link: &mut Link<'_>,
    out: &mut BytesMut,
    forwarded: &[u8],
    verbatim: &mut bool,
) -> bool {
    let mut any = false;
    while link
        .queue
        .front()
        .is_some_and(|e| e.expect == Expect::Local)
    {
        let entry = link.queue.pop_front().expect("checked");
        if *verbatim {
            out.extend_from_slice(forwarded);
            *verbatim = false;
        }
        if let Some(bytes) = entry.synthetic {
            out.extend_from_slice(&bytes);
        }
        any = true;
    }
    any
}

/// Handles one server message; the flag says it was a ReadyForQuery.
fn on_message(
    tag: u8,
    frame: &[u8],
    link: &mut Link<'_>,
    params: &mut Vec<(String, String)>,
) -> (Action, bool) {
    if let Some(cache) = link.cache.as_deref_mut() {
        // The statement(s) this answers ran, or began to: their writes count from now on.
        if let Some(effects) = link.queue.front_mut().and_then(|e| e.effects.take()) {
            if effects.hidden_settings {
                link.server.settings.unknown = true;
            }
            cache.answered(&effects);
        }
    }
    let forwarding = |link: &Link<'_>| {
        if link.queue.front().is_none_or(|e| e.forward) {
            Action::Forward
        } else {
            Action::Swallow
        }
    };
    match tag {
        backend::tag::NOTICE_RESPONSE | backend::tag::NOTIFICATION_RESPONSE => {
            (forwarding(link), false)
        }
        backend::tag::PARAMETER_STATUS => {
            // pgmemo's own statements (settings brought in line) are its business.
            let own = link.queue.front().is_some_and(|e| !e.forward);
            parameter_status(frame, !own, link, params);
            (forwarding(link), false)
        }
        backend::tag::ERROR_RESPONSE => {
            let (raised, instead) = match link.queue.front_mut() {
                Some(e) if e.raised => (true, e.synthetic.take()),
                _ => (false, None),
            };
            // pgmemo's Parse of a statement the client describes: PostgreSQL describes the
            // parameters before it finds that the statement no longer analyses.
            let before = match link.queue.front_mut() {
                Some(e) if e.expect == Expect::Parse && !e.forward => e.synthetic.take(),
                _ => None,
            };
            let retry = note_stale_plan(&frame[5..], link);
            // Before `on_error` drops the entry the error answers.
            let renamed = if retry.is_none() && !raised {
                renamed_error(frame, link)
            } else {
                None
            };
            on_error(link, unreadable_bytes(&frame[5..]));
            if let Some(from) = retry {
                // The ReadyForQuery of the Sync (or of the Query) belongs to the failed
                // attempt: swallowed.
                if let Some(sync) = link.queue.front_mut() {
                    sync.forward = false;
                }
                link.retry = Some(from);
                link.retried = true;
                return (Action::Swallow, false);
            }
            match link.queue.front() {
                // What pgmemo prepared for the Query failed: the Query then fails on the
                // missing statement, and the client is told this error instead.
                Some(e) if e.holds_error => {
                    link.held_error = Some(BytesMut::from(frame));
                    return (Action::Swallow, false);
                }
                Some(e) if e.expect == Expect::Query && e.forward => {
                    if let Some(held) = link.held_error.take() {
                        let missing = wire::ErrorResponse::parse(&frame[5..])
                            .is_ok_and(|e| e.code == wire::sqlstate::INVALID_SQL_STATEMENT_NAME);
                        if missing {
                            return (Action::Replace(held), false);
                        }
                    }
                }
                _ => {}
            }
            if let Some(instead) = instead {
                return (Action::Replace(BytesMut::from(&instead[..])), false);
            }
            if let Some(before) = before {
                let mut out = BytesMut::from(&before[..]);
                out.extend_from_slice(frame);
                return (Action::Replace(out), false);
            }
            if raised {
                if let Ok(e) = wire::ErrorResponse::parse(&frame[5..]) {
                    let mut out = BytesMut::new();
                    e.encode_into(&mut out);
                    return (Action::Replace(out), false);
                }
            }
            match renamed {
                Some(renamed) => (Action::Replace(renamed), false),
                None => (Action::Forward, false),
            }
        }
        backend::tag::READY_FOR_QUERY => {
            let status = ready_status(frame);
            let action = match link.queue.pop_front() {
                Some(e) if !e.forward => Action::Swallow,
                _ => {
                    link.held_error = None;
                    Action::Forward
                }
            };
            link.client.status = status;
            on_ready(link, status);
            if let Some(cache) = link.cache.as_deref_mut() {
                cache.ready(status);
            }
            (action, true)
        }
        _ => (on_answer(tag, frame, link), false),
    }
}

/// Handles one answer to a plain request (see `plain`): it goes to the client as it is, and
/// only what the general path would note for it is noted. Returns whether it was the
/// ReadyForQuery that ends the request.
fn on_plain_message(
    plain: Plain,
    tag: u8,
    frame: &[u8],
    link: &mut Link<'_>,
    params: &mut Vec<(String, String)>,
) -> bool {
    match tag {
        backend::tag::READY_FOR_QUERY => {
            let status = ready_status(frame);
            link.plain = None;
            link.client.status = status;
            on_ready(link, status);
            true
        }
        backend::tag::COMMAND_COMPLETE => {
            completed(&frame[5..], None, link);
            false
        }
        backend::tag::PARSE_COMPLETE => {
            link.plain_parse = false;
            false
        }
        backend::tag::ERROR_RESPONSE => {
            link.txn.failed = true;
            if std::mem::take(&mut link.plain_parse) {
                // The batch's Parse of the unnamed statement failed: PostgreSQL then has
                // none (the one before was dropped when the Parse began). A batch pipelined
                // behind may have changed the records since: they keep what it did.
                link.undo_unnamed(
                    UnnamedUndo {
                        client: Some(None),
                        server: None,
                        unreadable: false,
                        unrun: None,
                    },
                    true,
                );
            }
            false
        }
        backend::tag::PARAMETER_STATUS => {
            parameter_status(frame, true, link, params);
            false
        }
        backend::tag::COPY_IN_RESPONSE if plain == Plain::Batch => {
            // The batch's Execute started a COPY FROM STDIN: from here on it is the general
            // path's, which knows that the server ignores Syncs until the copy ends.
            link.plain = None;
            link.queue.push_front(Entry::forward(Expect::Execute));
            on_answer(tag, frame, link);
            false
        }
        _ => false,
    }
}

/// The transaction status a ReadyForQuery reports (Failed when it cannot be read).
#[inline]
fn ready_status(frame: &[u8]) -> TransactionStatus {
    frame
        .get(5)
        .and_then(|b| TransactionStatus::from_byte(*b).ok())
        .unwrap_or(TransactionStatus::Failed)
}

/// A ParameterStatus: the server's parameter list follows it, and unless pgmemo's own
/// statement caused it (`clients` false), the client's settings may too.
fn parameter_status(
    frame: &[u8],
    clients: bool,
    link: &mut Link<'_>,
    params: &mut Vec<(String, String)>,
) {
    if let Some((name, value)) = parameter(&frame[5..]) {
        if clients {
            reported(link, &name, &value);
        }
        match params.iter_mut().find(|(k, _)| *k == name) {
            Some(slot) => slot.1 = value,
            None => params.push((name, value)),
        }
    }
}

#[inline(always)]
fn on_answer(tag: u8, frame: &[u8], link: &mut Link<'_>) -> Action {
    let Some(entry) = link.queue.front_mut() else {
        return Action::Forward;
    };
    let action = if entry.forward {
        Action::Forward
    } else {
        Action::Swallow
    };
    if (entry.expect, tag) == (Expect::Execute, backend::tag::COPY_IN_RESPONSE) {
        // Syncs the client sent after this Execute are ignored by the server until the copy
        // ends, and so are the ones it sends before CopyDone.
        link.copy_in = true;
        let mut i = 1;
        while i < link.queue.len() {
            if link.queue[i].expect == Expect::Sync {
                link.queue.remove(i);
            } else {
                i += 1;
            }
        }
        return Action::Forward;
    }
    // The client's Describe, or pgmemo's behind the client's Parse (`learn_types`).
    if entry.expect == Expect::DescribeStatement && !entry.raised {
        if let Some(statement) = &entry.uses {
            link.client.note_description(statement, tag, frame);
        }
    }
    // The shape of the statement's rows, on this server and as the client knows it: both
    // fixed from the first description on (PostgreSQL keeps a statement's result type, and
    // fails an execution that would change it until the client parses it again, which
    // forgets the client's record), so only a first one is read.
    if matches!(
        entry.expect,
        Expect::DescribeStatement | Expect::DescribePortal
    ) && !entry.raised
    {
        if let Some(statement) = &entry.uses {
            let client = entry.forward && !link.client.row_shapes.contains_key(&statement.id);
            let server = link.server.statements.shape(statement).is_none();
            if client || server {
                if let Some(shape) = shape::shape_of(tag, frame) {
                    if server {
                        link.server.statements.note_shape(statement, shape);
                    }
                    if client {
                        link.client.note_row_shape(statement, shape);
                    }
                }
            }
        }
    }
    if (entry.expect, tag)
        == (
            Expect::DescribeStatement,
            backend::tag::PARAMETER_DESCRIPTION,
        )
    {
        entry.described = true;
        if entry.forward && std::mem::take(&mut link.skip_parameter_description) {
            return Action::Swallow;
        }
    }
    let done = match (entry.expect, tag) {
        (Expect::Parse, backend::tag::PARSE_COMPLETE)
        | (Expect::Bind, backend::tag::BIND_COMPLETE)
        | (Expect::Close, backend::tag::CLOSE_COMPLETE)
        | (Expect::DescribeStatement | Expect::DescribePortal, backend::tag::ROW_DESCRIPTION)
        | (Expect::DescribeStatement | Expect::DescribePortal, backend::tag::NO_DATA)
        | (Expect::Execute, backend::tag::EMPTY_QUERY_RESPONSE) => true,
        (Expect::Execute, backend::tag::PORTAL_SUSPENDED) => {
            // The portal ran part way: settings its code changed unseen (`set_config` in a
            // query) count from now on, as they would at its CommandComplete; a `SET` the
            // same transaction ran does not account for the report of such a change.
            let outcome = entry.outcomes.get(entry.next).cloned();
            if outcome
                .as_ref()
                .is_some_and(|o| matches!(o.effect, Effect::SettingsUnknown { .. }))
            {
                completed(b"", outcome, link);
            }
            true
        }
        (Expect::Query, backend::tag::EMPTY_QUERY_RESPONSE) => {
            entry.next += 1;
            false
        }
        (Expect::Query, backend::tag::FUNCTION_CALL_RESPONSE) => {
            // A FunctionCall returned: what it may have changed counts from now on.
            let outcome = entry.outcomes.get(entry.next).cloned();
            entry.next += 1;
            completed(b"", outcome, link);
            false
        }
        (Expect::Execute | Expect::Query, backend::tag::COMMAND_COMPLETE) => {
            let outcome = entry.outcomes.get(entry.next).cloned();
            entry.next += 1;
            let done = entry.expect == Expect::Execute;
            let forward = entry.forward;
            if done {
                link.queue.pop_front();
            }
            let replaced = completed(&frame[5..], outcome, link);
            return match (forward, replaced) {
                (false, _) => Action::Swallow,
                (true, Some(bytes)) => Action::Replace(bytes),
                (true, None) => Action::Forward,
            };
        }
        _ => false,
    };
    if done {
        if let Some(entry) = link.queue.pop_front() {
            if let (Expect::Parse, Some(revert)) = (entry.expect, entry.revert) {
                let statement = &revert.statement;
                statement
                    .validated
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                // The client's own Parse of a statement prepared while its settings were
                // unsettled: what was ahead of it has been answered, and if nothing moved
                // the settings, the server read it under the client's committed ones.
                if entry.forward
                    && revert.on_server
                    && *statement.key.settings == *UNKNOWN_PARSE_SETTINGS
                    && !link.settings_moved()
                {
                    statement.settle_under(link.client.settings.parse_digest().clone());
                }
            }
        }
    }
    action
}

/// A statement completed: its effect counts, COMMIT and ROLLBACK settle pending settings.
/// Returns the CommandComplete to send instead, when the client expects another tag.
fn completed(body: &[u8], outcome: Option<Outcome>, link: &mut Link<'_>) -> Option<BytesMut> {
    let tag = body.strip_suffix(b"\0").unwrap_or(body);
    match tag {
        // PostgreSQL settles settings at PREPARE TRANSACTION as at COMMIT: the session keeps
        // them, whatever becomes of the prepared transaction.
        b"COMMIT" | b"PREPARE TRANSACTION" => {
            let pending = std::mem::take(&mut link.txn.pending);
            commit(
                &pending,
                &mut link.client.settings,
                &mut link.server.settings,
            );
            link.read_back_due |= verify_later(
                &pending,
                std::mem::take(&mut link.txn.uncertain),
                link.client,
            );
            link.txn.failed = false;
            // A ROLLBACK TO SAVEPOINT before it is settled with it.
            link.txn.rolled_back = None;
            if let (Some(cache), b"COMMIT") = (link.cache.as_deref_mut(), tag) {
                cache.committed();
            }
        }
        b"ROLLBACK" => {
            link.txn.rolled_back = Some(link.txn.pending.len());
            // An error before it failed what it rolls back; one after it fails what follows.
            link.txn.failed = false;
            if !link.txn.pending.is_empty() {
                // A ROLLBACK TO SAVEPOINT undid some of them, or a ROLLBACK all (a COMMIT
                // after it in the same Query still commits them here): which, pgmemo cannot
                // tell, so what commits is read back from the server.
                link.txn.uncertain = true;
                link.server.settings.unknown = true;
            }
            if let Some(cache) = link.cache.as_deref_mut() {
                cache.rollback_completed();
            }
        }
        _ => {}
    }
    let outcome = outcome?;
    match outcome.effect {
        Effect::Setting(change) => {
            link.txn.explained.add(match &change.change {
                SettingChange::Set(name, _) | SettingChange::Reset(name) => Some(name),
                SettingChange::ResetAll => None,
            });
            link.txn.pending.push(change)
        }
        Effect::Discarded { reset, .. } => {
            // PostgreSQL commits as soon as DISCARD ALL completes (it cannot run inside a
            // transaction block): its reset, and what ran before it, stay even when the
            // rest of an extended-protocol batch then fails.
            link.txn.explained.add(None);
            link.txn.pending.push(reset);
            on_ready(link, TransactionStatus::Idle);
            link.txn.explained.add(None);
        }
        Effect::Settings(changes) => {
            link.txn.explained.add(None);
            link.txn.pending.extend(changes);
        }
        Effect::SettingsUnknown { verify } => {
            // A report later in this request may be this code's, not a `SET`'s before it.
            link.txn.explained.reported();
            link.server.settings.unknown = true;
            for name in &verify {
                link.client.read_back_later(name);
            }
            link.read_back_due |= !verify.is_empty();
        }
        Effect::LocalSetting(name) => link.txn.explained.add(name.as_deref()),
        Effect::Prepared { .. } | Effect::Deallocated(_) | Effect::None | Effect::Raises => {}
    }
    outcome.tag.map(|t| {
        let mut out = BytesMut::with_capacity(t.len() + 6);
        backend::command_complete(t, &mut out);
        out
    })
}

/// After DDL changed a table's row type, a statement prepared before it fails at Bind (or at
/// a SQL-level `EXECUTE`) with "cached plan must not change result type" on every use: pgmemo
/// forgets it on this server and closes it before the next request. A statement pgmemo
/// prepared may also be gone from the server behind its back (`DEALLOCATE ALL` run by another
/// client through a function or `DO`): pgmemo forgets it there too, and prepares it again at
/// its next use. When the failed request ran nothing before that statement, is not inside a
/// transaction block and nothing was sent after it, it is retried once (returns where the
/// replay starts in `Link::batch`); otherwise the client sees the error and its next
/// execution succeeds.
fn note_stale_plan(body: &[u8], link: &mut Link<'_>) -> Option<usize> {
    let entry = link.queue.front()?;
    let sql_level = matches!(entry.expect, Expect::Query | Expect::Execute);
    let statement = if sql_level {
        entry.outcomes.get(entry.next)?.uses.clone()?
    } else {
        entry.uses.clone()?
    };
    let (expect, next, from, described) = (
        entry.expect,
        entry.next,
        entry.frame as usize,
        entry.described,
    );
    let error = wire::ErrorResponse::parse(body).ok()?;
    let plan_changed = error.code == wire::sqlstate::FEATURE_NOT_SUPPORTED
        && error.message == "cached plan must not change result type";
    let vanished = error.code == wire::sqlstate::INVALID_SQL_STATEMENT_NAME
        && error.message == format!("prepared statement \"{}\" does not exist", statement.name);
    if !plan_changed && !vanished {
        return None;
    }
    link.server.statements.remove(statement.id);
    if plan_changed {
        link.server.stale.push(statement.name.clone());
    }
    // pgmemo's own Describe of a statement a Bind waits for (`requests::probe_shape`) leaves
    // nothing of the client's to replay.
    let probe = entry.probe;
    let replayable = !link.retried
        && !probe
        && link.batch.replayable()
        && link.client.status == TransactionStatus::Idle;
    let retry = match expect {
        // The Query's first statement (nothing of it reached the client), and the Query is
        // the one kept in the log (nothing was sent after it).
        Expect::Query => {
            next == 0
                && link.queue.len() == 1
                && link.batch.len() == 1
                && link.batch.last_tag() == Some(wire::frontend::tag::QUERY)
        }
        // An unnamed statement's `EXECUTE`: it was bound (and its statement prepared) by
        // messages before it, so it is left to the client to run again.
        Expect::Execute => false,
        _ => {
            let sync_is_last = link
                .queue
                .iter()
                .position(|e| e.expect == Expect::Sync)
                .is_some_and(|i| i + 1 == link.queue.len());
            sync_is_last
                && !link.batch.executed_before(from)
                && link.batch.last_tag() == Some(wire::frontend::tag::SYNC)
        }
    };
    let retry = replayable && retry;
    if retry {
        link.skip_parameter_description = described;
    }
    retry.then_some(from)
}

/// An error about one of pgmemo's server-side statements (`bind message supplies 1
/// parameters, but prepared statement "pgmemo_7" requires 0`, `wrong number of parameters
/// for prepared statement "pgmemo_7"`) with the name the client gave it, as PostgreSQL
/// would have said it; `None` when the error names none.
#[cold]
fn renamed_error(frame: &[u8], link: &Link<'_>) -> Option<BytesMut> {
    let entry = link.queue.front()?;
    let statement = match entry.expect {
        Expect::Bind | Expect::DescribeStatement => entry.uses.as_ref()?,
        Expect::Query | Expect::Execute => entry.outcomes.get(entry.next)?.uses.as_ref()?,
        _ => return None,
    };
    let quoted = format!("\"{}\"", statement.name);
    if !frame.windows(quoted.len()).any(|w| w == quoted.as_bytes()) {
        return None;
    }
    // The name the client used in this message, if the batch still holds it; else any name
    // of the client's for this statement.
    let sent = match entry.expect {
        Expect::Bind => link
            .batch
            .frame(entry.batch, entry.frame)
            .and_then(bound_statement),
        Expect::DescribeStatement => link
            .batch
            .frame(entry.batch, entry.frame)
            .and_then(|f| f.get(6..)?.split(|&b| b == 0).next())
            .and_then(|n| std::str::from_utf8(n).ok()),
        _ => None,
    };
    // The client may have closed the name since, later in the same batch.
    let name = match sent {
        Some(name) => name.to_owned(),
        None => link
            .client
            .statements
            .iter()
            .find(|(_, s)| std::sync::Arc::ptr_eq(s, statement))
            .map(|(n, _)| n.clone())?,
    };
    let replacement = format!("\"{name}\"");
    let mut out = BytesMut::with_capacity(frame.len() + name.len());
    out.extend_from_slice(&frame[..5]);
    let mut rest = &frame[5..];
    while let Some((&kind, tail)) = rest.split_first() {
        out.extend_from_slice(&[kind]);
        if kind == 0 {
            break;
        }
        let end = tail.iter().position(|&b| b == 0)?;
        let value = &tail[..end];
        if matches!(kind, b'M' | b'D' | b'H') {
            let text = String::from_utf8_lossy(value).replace(&quoted, &replacement);
            out.extend_from_slice(text.as_bytes());
        } else {
            out.extend_from_slice(value);
        }
        out.extend_from_slice(&[0]);
        rest = &tail[end + 1..];
    }
    let len = (out.len() - 1) as u32;
    out[1..5].copy_from_slice(&len.to_be_bytes());
    Some(out)
}

/// The statement name of a Bind message (its raw bytes, header included).
fn bound_statement(frame: &[u8]) -> Option<&str> {
    let body = frame.get(5..)?;
    let portal_end = body.iter().position(|&b| b == 0)?;
    let rest = &body[portal_end + 1..];
    let end = rest.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&rest[..end]).ok()
}

/// Whether an error is PostgreSQL's `invalid byte sequence` (22021), as reading a message
/// whose text is not valid in the client's encoding raises it.
fn unreadable_bytes(body: &[u8]) -> bool {
    wire::ErrorResponse::parse(body)
        .is_ok_and(|e| e.code == wire::sqlstate::CHARACTER_NOT_IN_REPERTOIRE)
}

/// An error ends the message it answers; in the extended protocol the server then skips
/// everything up to Sync, so those entries are dropped (undoing what they assumed).
/// `unreadable`: the error is 22021, which a Parse of a text that is not UTF-8 gets before
/// PostgreSQL acts on it (see `UnnamedUndo::unreadable`).
fn on_error(link: &mut Link<'_>, unreadable: bool) {
    link.txn.failed = true;
    let Some(front) = link.queue.front_mut() else {
        return;
    };
    if front.expect == Expect::Query {
        let skipped = front
            .outcomes
            .split_off(front.next.min(front.outcomes.len()));
        if !front.forward {
            link.server.settings.unknown = true;
        }
        link.revert_outcomes(&skipped);
        return;
    }
    if front.expect == Expect::Sync {
        // Raised by the Sync itself (committing the implicit transaction: a deferred
        // constraint, a serialization failure): nothing is skipped, the ReadyForQuery follows,
        // and what the client pipelined after it runs normally.
        return;
    }
    let mut skipped = Vec::new();
    while let Some(entry) = link.queue.front() {
        if !skipped.is_empty() && entry.expect == Expect::Sync {
            break;
        }
        skipped.push(link.queue.pop_front().expect("checked"));
    }
    if link.queue.is_empty() && link.mid_batch {
        // The batch's Sync is still to come (a message of it was held, or not sent yet):
        // the server skips what the client sends until then.
        link.doomed = true;
    }
    // Undone last first: a Close and a Parse of one name are undone back to the first. The
    // first entry is the message that failed; the others were skipped.
    for (i, entry) in skipped.into_iter().enumerate().rev() {
        if let (Expect::Bind, Some(statement)) = (entry.expect, &entry.uses) {
            link.forget_bound(statement);
        }
        link.revert_outcomes(&entry.outcomes[entry.next.min(entry.outcomes.len())..]);
        if let Some(revert) = entry.revert {
            link.revert(*revert, i != 0);
        }
        if let Some(undo) = entry.unnamed {
            if let Some(outcome) = &undo.unrun {
                link.revert_unrun(outcome);
            }
            let failed = i == 0 && !(unreadable && undo.unreadable);
            link.undo_unnamed(*undo, failed);
        }
    }
}

/// ReadyForQuery: a transaction that ended settles its setting changes; a ROLLBACK TO
/// SAVEPOINT may have undone some of them, which pgmemo cannot tell apart.
fn on_ready(link: &mut Link<'_>, status: TransactionStatus) {
    link.txn.explained.reported();
    match status {
        TransactionStatus::Idle => {
            let mut txn = std::mem::take(&mut link.txn);
            if let Some(before) = txn.rolled_back {
                // Idle with no COMMIT since: that was a ROLLBACK (one TO SAVEPOINT leaves the
                // block open), which undid the changes before it. Those after it ran in an
                // implicit transaction of their own, which no ROLLBACK TO SAVEPOINT can reach.
                txn.pending.drain(..before.min(txn.pending.len()));
                txn.uncertain = false;
            }
            if !txn.failed {
                commit(
                    &txn.pending,
                    &mut link.client.settings,
                    &mut link.server.settings,
                );
                link.read_back_due |= verify_later(&txn.pending, txn.uncertain, link.client);
            }
        }
        TransactionStatus::InTransaction if link.txn.rolled_back.is_some() => {
            if !link.txn.pending.is_empty() {
                link.server.settings.unknown = true;
                link.txn.uncertain = true;
            }
            link.txn.rolled_back = None;
        }
        _ => {}
    }
}

/// Notes the settings of `committed` for reading back from the server (`uncertain`: a ROLLBACK
/// TO SAVEPOINT in the transaction may have undone some of them); says whether it noted any.
fn verify_later(committed: &[TrackedChange], uncertain: bool, client: &mut ClientState) -> bool {
    if !uncertain {
        return false;
    }
    let mut noted = false;
    for c in committed {
        if let SettingChange::Set(name, _) | SettingChange::Reset(name) = &c.change {
            client.read_back_later(name);
            noted = true;
        }
    }
    noted
}

/// Reported settings a client can set, and so may keep as its own when code it ran changed
/// them (the others report the server or the session's user).
const ADOPTABLE: [&str; 8] = [
    "application_name",
    "client_encoding",
    "datestyle",
    "intervalstyle",
    "timezone",
    "standard_conforming_strings",
    "default_transaction_read_only",
    "search_path",
];

/// A ParameterStatus: a setting changed. Unless the client's own `SET`s explain it, code
/// pgmemo could not see into changed it (a function, `DO`, `CALL`, `set_config`), and may
/// have changed unreported settings too: the server is reset before its next use, so nothing
/// of it reaches another client. The client was told of the new value, so a setting it can
/// set becomes its own, as if it had run `SET`, and follows it to other servers once the
/// transaction commits (a rollback or error drops it, as PostgreSQL does).
fn reported(link: &mut Link<'_>, name: &str, value: &str) {
    if link.txn.explained.covers(name) {
        return;
    }
    link.server.settings.unknown = true;
    let name = name.to_ascii_lowercase();
    if ADOPTABLE.contains(&name.as_str()) {
        let replay = set_raw_sql(&name, value);
        link.txn.pending.push(TrackedChange {
            change: SettingChange::Set(name, replay),
            real: true,
        });
    }
}

fn parameter(body: &[u8]) -> Option<(String, String)> {
    let mut parts = body.split(|&b| b == 0);
    let name = std::str::from_utf8(parts.next()?).ok()?;
    let value = std::str::from_utf8(parts.next()?).ok()?;
    Some((name.to_owned(), value.to_owned()))
}

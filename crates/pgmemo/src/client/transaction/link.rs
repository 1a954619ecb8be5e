//! What the two pumps of an attached transaction-pooled client share: the client's lasting
//! state, the server's session state, and the queue of answers still owed, one entry per
//! message sent to the server (or answered by pgmemo), in order. The server pump walks the
//! queue to know which answers to forward, which to swallow (pgmemo's own messages) and where
//! to insert pgmemo's own answers.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use wire::backend::TransactionStatus;

use super::cache::TxnCache;
use super::commands::{Effect, Outcome};
use super::plain::Plain;
use crate::cache::plan::Effects;
use crate::hash::Map;
use crate::pool::settings::{ClientSettings, TrackedChange};
use crate::pool::{PreparedStatement, ServerSession, StatementRegistry};

/// A client's unnamed statement: the Parse to send again to a server that does not hold it.
#[derive(Clone)]
pub struct Unnamed {
    pub seq: u64,
    pub parse: Bytes,
    pub outcome: Option<Arc<Outcome>>,
    /// `parse` is the client's own message, which planning found plain (nothing to track or
    /// rewrite): an identical Parse needs no decoding or planning.
    pub plain: bool,
    /// The statement pgmemo bound in place of this one (`promote`): (key, name) on the server
    /// it was promoted on.
    pub promoted: Option<(u64, Bytes)>,
}

/// `ServerSession::unnamed` of a server whose unnamed statement is pgmemo's own (the `DO`
/// block of an error it makes the server raise): no client's, so a client's Bind or Describe
/// of the unnamed statement closes it (the client has none) or replaces it, and never runs it.
/// Client tags start at 1.
pub const OWN_UNNAMED: (u64, u64) = (0, 0);

/// Everything about a client that outlives its transactions.
pub struct ClientState {
    /// Tells server connections whose unnamed statement they hold.
    pub tag: u64,
    /// The client's statement names.
    pub statements: Map<String, Arc<PreparedStatement>>,
    /// Named statements whose execution changes session state (rare: `SET` prepared by name),
    /// with the statement the name stood for when recorded: a name dropped and parsed again
    /// for another statement has none (and one whose drop the server skipped keeps its own).
    pub effects: Map<String, (Arc<PreparedStatement>, Arc<Outcome>)>,
    pub unnamed: Option<Unnamed>,
    /// What a server first said when the client described a statement, by statement id:
    /// PostgreSQL describes a prepared statement's parameters (and whether it returns rows)
    /// as they were when it was prepared, without looking at the catalog again, so pgmemo can
    /// tell the same on a server that lacks the statement where preparing it again fails.
    pub described: Map<u64, Described>,
    /// The shape of the rows of each statement the client learnt from the first answer to a
    /// Describe of it since it parsed it (`shape::shape_of`), by statement id: rows of its
    /// executions that describe nothing anew are decoded with it, so they must have that
    /// shape.
    pub row_shapes: Map<u64, u64>,
    pub parses: u64,
    pub settings: ClientSettings,
    /// Settings whose committed value pgmemo cannot tell (a ROLLBACK TO SAVEPOINT undid some
    /// of the transaction's SETs, but which; a `set_config` call set them): read back from
    /// the server after the transaction, before it goes back to the pool.
    pub verify: Vec<String>,
    /// From the last ReadyForQuery the client received.
    pub status: TransactionStatus,
    /// Outcomes of the client's unnamed Parses of `PREPARE`, `DEALLOCATE` or `DISCARD ALL`
    /// not executed yet: planning applied them to the client's names at the Parse (so the
    /// statements after it in a pipeline see them), but PostgreSQL applies them only when the
    /// statement runs. Those the batch does not execute are withdrawn at its Sync
    /// ([`Link::withdraw_unrun`]).
    pub unrun: Vec<Arc<Outcome>>,
    /// Withdrawn outcomes that the client could still execute (its unnamed statement, a
    /// portal of it): such an execution is refused (`commands::run_late`).
    pub withdrawn: Vec<Arc<Outcome>>,
}

/// Drops from a per-statement record (`ClientState::described`, `row_shapes`) the statements
/// the client no longer names, once it holds many more than the client names.
fn forget_unnamed_ids<V>(
    records: &mut Map<u64, V>,
    statements: &Map<String, Arc<PreparedStatement>>,
) {
    if records.len() > 2 * statements.len() + 64 {
        let live: std::collections::HashSet<u64, ahash::RandomState> =
            statements.values().map(|s| s.id).collect();
        records.retain(|id, _| live.contains(id));
    }
}

/// A statement's description as a server first gave it to the client.
pub struct Described {
    /// The ParameterDescription message, whole.
    pub parameters: Bytes,
    /// RowDescription (`true`) or NoData came after it; `None` until it has.
    pub rows: Option<bool>,
}

impl ClientState {
    /// Notes a server's answer to the client's Describe of `statement` (its
    /// ParameterDescription, then `RowDescription` or `NoData`); the first answer stays.
    pub fn note_description(&mut self, statement: &PreparedStatement, tag: u8, frame: &[u8]) {
        match tag {
            wire::backend::tag::PARAMETER_DESCRIPTION => {
                forget_unnamed_ids(&mut self.described, &self.statements);
                self.described.entry(statement.id).or_insert(Described {
                    parameters: Bytes::copy_from_slice(frame),
                    rows: None,
                });
            }
            wire::backend::tag::ROW_DESCRIPTION | wire::backend::tag::NO_DATA => {
                if let Some(d) = self.described.get_mut(&statement.id) {
                    d.rows
                        .get_or_insert(tag == wire::backend::tag::ROW_DESCRIPTION);
                }
            }
            _ => {}
        }
    }

    /// Notes the shape of `statement`'s rows that the first answer to a Describe of it told
    /// the client.
    pub fn note_row_shape(&mut self, statement: &PreparedStatement, shape: u64) {
        forget_unnamed_ids(&mut self.row_shapes, &self.statements);
        self.row_shapes.insert(statement.id, shape);
    }

    /// Puts a copy of its own in place of the client's statement `name`, the shared
    /// `statement` registered under analysis settings the client's have moved from
    /// ([`PreparedStatement::drifted_from`]); what the client learnt of the statement holds
    /// for the copy.
    pub fn own_copy_of(
        &mut self,
        name: &str,
        statement: &Arc<PreparedStatement>,
        registry: &StatementRegistry,
    ) -> Arc<PreparedStatement> {
        let copy = registry.own_copy(statement);
        self.statements.insert(name.to_owned(), Arc::clone(&copy));
        // Copied, not moved: another of the client's names may stand for the old statement.
        if let Some(d) = self.described.get(&statement.id) {
            let (parameters, rows) = (d.parameters.clone(), d.rows);
            self.described
                .insert(copy.id, Described { parameters, rows });
        }
        if let Some(&shape) = self.row_shapes.get(&statement.id) {
            self.row_shapes.insert(copy.id, shape);
        }
        if let Some((recorded, _)) = self.effects.get_mut(name) {
            if Arc::ptr_eq(recorded, statement) {
                *recorded = Arc::clone(&copy);
            }
        }
        copy
    }

    /// Notes `name` for reading back after the transaction (`verify`), once.
    pub fn read_back_later(&mut self, name: &str) {
        if !self.verify.iter().any(|n| n == name) {
            self.verify.push(name.to_owned());
        }
    }

    /// What executing the client's statement `name` changes in its session, if anything.
    pub fn effect_of(&self, name: &str) -> Option<&Arc<Outcome>> {
        if self.effects.is_empty() {
            return None;
        }
        // Recorded for the statement the name stood for then: not for one parsed under the
        // name since (after a DEALLOCATE, a DISCARD ALL or a Close).
        let current = self.statements.get(name)?;
        self.effects
            .get(name)
            .filter(|(recorded, _)| Arc::ptr_eq(current, recorded))
            .map(|(_, outcome)| outcome)
    }
}

/// The messages whose answers a queue entry stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Parse,
    Bind,
    Close,
    DescribeStatement,
    DescribePortal,
    Execute,
    Sync,
    /// A simple Query or a FunctionCall: everything up to ReadyForQuery.
    Query,
    /// Answered by pgmemo: `Entry::synthetic` is sent when the entry reaches the front.
    Local,
}

/// What to undo when a Parse (or SQL PREPARE) fails or is skipped after an earlier error,
/// or when the server skips pgmemo's Close of a statement.
#[derive(Clone)]
pub struct Revert {
    pub statement: Arc<PreparedStatement>,
    /// The client's name that the message gave the statement: forgotten again.
    pub client_name: Option<String>,
    /// The message was to create the statement on the server: it is not there.
    pub on_server: bool,
    /// The message was pgmemo's Close of the statement (an eviction): the server still has
    /// it, and preparing it again there would fail with 42P05.
    pub closed: bool,
    /// For a message that creates the statement (`on_server`): an eviction of it pipelined
    /// ahead was skipped ([`Link::revert`]), so the server holds the statement whether this
    /// message runs or is skipped too (it is sent behind a Close of its own, see
    /// `requests::close_if_closing`); only its own failure leaves the server without it.
    pub kept: bool,
}

/// What a Parse or Close of the unnamed statement changed in pgmemo's records: put back when
/// the server skips the message (an error earlier in the batch, as PostgreSQL then keeps the
/// statement it had); when the message itself fails, the server holds no unnamed statement,
/// unless it failed while PostgreSQL read it (`unreadable`).
pub struct UnnamedUndo {
    /// The client's unnamed statement before, when the message was the client's own Parse
    /// or Close.
    pub client: Option<Option<Unnamed>>,
    /// The server's before.
    pub server: Option<(u64, u64)>,
    /// The client's Parse of a text that is not UTF-8: a UTF-8 client's gets 22021 while
    /// PostgreSQL reads the message, before it drops the unnamed statement it had, so that
    /// error puts back what was (any other failure leaves none).
    pub unreadable: bool,
    /// What planning the Parse changed in the client's names (`ClientState::unrun`): undone
    /// should the server skip or refuse the Parse, unless the Sync withdrew it already.
    pub unrun: Option<Arc<Outcome>>,
}

/// One answer (or group of answers) owed to the client.
pub struct Entry {
    pub expect: Expect,
    /// Forward the server's answers (false: pgmemo's own message; errors still go through).
    pub forward: bool,
    /// pgmemo's own answer (`Expect::Local`), or, on an entry that is `raised`, the error the
    /// client gets in place of the server's; on pgmemo's Parse of a statement the client
    /// describes, the ParameterDescription the client gets before that Parse's error.
    pub synthetic: Option<Bytes>,
    /// Per statement of a Query (or the one of an Execute), in order.
    pub outcomes: Vec<Outcome>,
    pub next: usize,
    /// Boxed: set only on Parse entries, and entries are moved several times per message
    /// (a smaller entry is copied inline rather than through `memcpy`).
    pub revert: Option<Box<Revert>>,
    /// The server-side statement a Bind or Describe uses: closed and prepared again when the
    /// server says its plan no longer matches the table (`cached plan must not change result
    /// type`). Those a Query or an Execute runs (SQL-level `EXECUTE`) are in `outcomes`.
    pub uses: Option<Arc<PreparedStatement>>,
    /// For a Bind or Describe: its position in `Link::batch`, and which batch that was
    /// (`BatchLog::id`: a batch pipelined behind it may have replaced the log since).
    pub frame: u32,
    pub batch: u32,
    /// The answer is an error pgmemo made the server raise: sent without the PL/pgSQL
    /// context line, as PostgreSQL itself would have reported it.
    pub raised: bool,
    /// A Describe of a statement whose ParameterDescription went out already.
    pub described: bool,
    /// The Sync ending what pgmemo prepares ahead of a simple Query: an error raised there is
    /// held back (`Link::held_error`) and told in place of the Query's own error about the
    /// statement that then does not exist, as PostgreSQL reports one error per Query.
    pub holds_error: bool,
    /// With the cache on: what the statement(s) of a Query or Execute write, counted once
    /// their answer arrives.
    pub effects: Option<Box<Effects>>,
    /// Set on Parse and Close entries of the unnamed statement, also a Close pgmemo answers
    /// itself (boxed, as `revert`).
    pub unnamed: Option<Box<UnnamedUndo>>,
    /// pgmemo's Describe of the statement a held Bind uses, to learn its shape on this server
    /// (`requests::probe_shape`): never a reason to replay anything.
    pub probe: bool,
}

impl Entry {
    /// An entry whose answers go to the client.
    pub fn forward(expect: Expect) -> Entry {
        Entry {
            expect,
            forward: true,
            synthetic: None,
            outcomes: Vec::new(),
            next: 0,
            revert: None,
            uses: None,
            frame: 0,
            batch: 0,
            raised: false,
            described: false,
            holds_error: false,
            effects: None,
            unnamed: None,
            probe: false,
        }
    }

    /// An entry for a message pgmemo sent on its own behalf.
    pub fn swallow(expect: Expect) -> Entry {
        Entry {
            forward: false,
            ..Entry::forward(expect)
        }
    }

    /// pgmemo's own answer.
    pub fn local(bytes: Bytes) -> Entry {
        Entry {
            synthetic: Some(bytes),
            ..Entry::forward(Expect::Local)
        }
    }

    /// Whether a statement of the entry still to be answered changes settings.
    pub fn changes_settings(&self) -> bool {
        self.outcomes
            .get(self.next..)
            .is_some_and(|rest| rest.iter().any(|o| o.effect.changes_settings()))
    }
}

/// Session-setting changes of the transaction in progress.
#[derive(Default)]
pub struct TxnTrack {
    pub pending: Vec<TrackedChange>,
    /// A ROLLBACK TO SAVEPOINT came after some of `pending`: it may have undone any of them,
    /// so their names are verified once the transaction commits (`ClientState::verify`).
    pub uncertain: bool,
    /// An error happened since the transaction began (or since the last COMMIT or ROLLBACK).
    pub failed: bool,
    /// A ROLLBACK (or ROLLBACK TO SAVEPOINT: the command tag is the same) completed, the last
    /// one when `pending` held this many changes. Which of the two it was shows only at the
    /// next ReadyForQuery; the statements after it in the same request (`ROLLBACK; SET ...`)
    /// run in a transaction of their own when it was a ROLLBACK, so they must not be dropped
    /// with it.
    pub rolled_back: Option<usize>,
    /// The settings whose ParameterStatus the transaction's own `SET`s explain.
    pub explained: Explained,
}

/// Which ParameterStatus messages the client's own statements account for; any other
/// comes from code pgmemo cannot see into (a function, `DO`, `CALL`, `set_config`) or from a
/// configuration reload on the server.
///
/// PostgreSQL reports the settings a request changed just before its ReadyForQuery, so a
/// `SET` accounts only for reports before the next ReadyForQuery: a function that sets the
/// same setting in a later request of the transaction is reported, and counts, as code
/// pgmemo cannot see into (its value is the one that commits).
#[derive(Default)]
pub struct Explained {
    /// Settings the transaction's statements changed, by name.
    names: Vec<String>,
    /// A statement changed settings pgmemo does not name (`RESET ALL`, a role).
    all: bool,
    /// `names` and `all` of the changes since the last ReadyForQuery.
    recent: Vec<String>,
    recent_all: bool,
}

impl Explained {
    /// Whether the transaction's statements changed any setting.
    pub fn any(&self) -> bool {
        self.all || !self.names.is_empty()
    }

    /// Counts a change to `name` (every setting: `None`).
    pub fn add(&mut self, name: Option<&str>) {
        match name {
            Some(n) => {
                if !self.all {
                    self.names.push(n.to_owned());
                }
                if !self.recent_all {
                    self.recent.push(n.to_owned());
                }
            }
            None => {
                self.all = true;
                self.recent_all = true;
            }
        }
    }

    /// Whether a report of `name` is accounted for: a change since the last ReadyForQuery.
    pub fn covers(&self, name: &str) -> bool {
        self.recent_all || self.recent.iter().any(|n| n.eq_ignore_ascii_case(name))
    }

    /// A ReadyForQuery came: the reports of the changes before it came with it.
    pub fn reported(&mut self) {
        self.recent.clear();
        self.recent_all = false;
    }
}

/// The shared state of one attachment.
pub struct Link<'a> {
    pub client: &'a mut ClientState,
    /// The client's cache state, when the cache is on for its database.
    pub cache: Option<&'a mut TxnCache>,
    pub server: &'a mut ServerSession,
    pub queue: &'a mut VecDeque<Entry>,
    /// A plain request whose answers come before every queue entry's (see `plain`).
    pub plain: Option<Plain>,
    /// The plain batch in flight parses the unnamed statement and its ParseComplete has not
    /// come yet: an error before it means the Parse failed, and neither the client nor the
    /// server has an unnamed statement then.
    pub plain_parse: bool,
    /// Portals whose statement changes session state.
    pub portals: &'a mut Map<Bytes, Arc<Outcome>>,
    pub txn: TxnTrack,
    /// Extended-protocol messages were sent since the last Sync.
    pub mid_batch: bool,
    /// pgmemo made the server raise an error in this batch (a duplicate or unknown statement
    /// name): the server skips the client's messages up to the Sync, so they are not sent
    /// and change nothing in pgmemo's records (a Close or Parse after it must not count).
    pub doomed: bool,
    /// A client message waits for the answers to batches pipelined before it
    /// (`requests::must_wait`): the server pump wakes the client pump as answers come.
    pub holding: bool,
    /// The statement pgmemo prepared afresh and described on this server for the Bind the
    /// client pump holds (`requests::probe_shape`).
    pub probed: Option<u64>,
    /// `requests::probe_shape` found that the Bind it let go would send rows of another
    /// shape than the client learnt: the Bind fails as PostgreSQL's would.
    pub refuse_bind: bool,
    /// The portal and statement of the client's last Bind: a Describe of that portal tells
    /// the client the statement's shape.
    pub last_bound: Option<(Bytes, Arc<PreparedStatement>)>,
    /// A statement of this attachment left the server's settings unknown with values to read
    /// back (`ClientState::verify`): the next request waits for the server to go back to
    /// the pool, which reads them first, as the sync before a request would reset them.
    pub read_back_due: bool,
    pub max_prepared: usize,
    /// `max_promoted_statements` (0: unnamed statements are never promoted).
    pub max_promoted: usize,
    /// A promoted batch waits for the answer to its Bind (`promote`): the client's further
    /// input waits too, as the batch may have to be sent again before it.
    pub promoting: Option<super::promote::Promoting>,
    /// The client's messages of the current extended-protocol batch, or the simple Query
    /// that runs a SQL-level prepared statement, kept for a retry.
    pub batch: &'a mut BatchLog,
    /// The promoted batch in flight as the client sent it, to send again should it fail
    /// (`promote`): copied whole, split into `batch` only then.
    pub promoted_batch: &'a mut bytes::BytesMut,
    /// Replay `batch[n..]`: a statement's plan went stale and the batch is retried once.
    pub retry: Option<usize>,
    /// This batch was retried already.
    pub retried: bool,
    /// The retried batch restarts at a Describe whose ParameterDescription the client
    /// already has: the replay's is swallowed.
    pub skip_parameter_description: bool,
    /// An extended-protocol COPY FROM STDIN is reading data: the server ignores Syncs.
    pub copy_in: bool,
    /// An error of what pgmemo prepared ahead of the client's Query (see
    /// `Entry::holds_error`), until that Query's answer has ended.
    pub held_error: Option<bytes::BytesMut>,
    /// The client got a FATAL error of the server (terminated by an administrator, a
    /// restart): when the connection then closes, pgmemo has nothing to add, as PostgreSQL
    /// says it once.
    pub fatal_forwarded: bool,
}

impl Link<'_> {
    /// A Bind of `statement` failed or was skipped: the portal it named is not `statement`'s,
    /// so a Describe of that portal, sent after it (`last_bound`, or already queued), tells
    /// the client nothing of `statement`'s rows (differential seed 21831: the NoData of the
    /// portal a `SET` had left was noted as the shape of a query's rows, and the query then
    /// refused with 0A000). A later Bind of the same statement loses its note too: a missed
    /// note only leaves pgmemo not refusing a changed shape the client never learnt.
    pub fn forget_bound(&mut self, statement: &Arc<PreparedStatement>) {
        if self
            .last_bound
            .as_ref()
            .is_some_and(|(_, bound)| Arc::ptr_eq(bound, statement))
        {
            self.last_bound = None;
        }
        for entry in self.queue.iter_mut() {
            if entry.expect == Expect::DescribePortal
                && entry
                    .uses
                    .as_ref()
                    .is_some_and(|u| Arc::ptr_eq(u, statement))
            {
                entry.uses = None;
            }
        }
    }

    /// Undoes what a failed or skipped entry had assumed. `skipped`: the server skipped the
    /// message (an error earlier in its batch) rather than failing it.
    pub fn revert(&mut self, revert: Revert, skipped: bool) {
        if let Some(name) = &revert.client_name {
            if self
                .client
                .statements
                .get(name)
                .is_some_and(|s| Arc::ptr_eq(s, &revert.statement))
            {
                self.client.statements.remove(name);
                self.client.effects.remove(name);
            }
        }
        if revert.on_server && !(skipped && revert.kept) {
            self.server.statements.remove(revert.statement.id);
        }
        if revert.closed {
            let id = revert.statement.id;
            self.server.statements.restore(revert.statement);
            // Messages pipelined behind it that create the statement again: the server has
            // it whatever becomes of them, short of their own failure.
            for entry in self.queue.iter_mut() {
                if let Some(create) = entry.revert.as_deref_mut() {
                    if create.on_server && create.statement.id == id {
                        create.kept = true;
                    }
                }
            }
        }
    }

    /// Withdraws what the client's unnamed Parses of `PREPARE`, `DEALLOCATE` or `DISCARD ALL`
    /// applied to its names when nothing executed them before the batch's Sync (or a simple
    /// Query, which drops the unnamed statement): PostgreSQL never ran them. Called at every
    /// Sync and Query; nearly always nothing to do.
    #[inline]
    pub fn withdraw_unrun(&mut self) {
        if !self.client.unrun.is_empty() || !self.client.withdrawn.is_empty() {
            self.withdraw_unrun_now();
        }
    }

    #[cold]
    fn withdraw_unrun_now(&mut self) {
        let unrun = std::mem::take(&mut self.client.unrun);
        for outcome in unrun.iter().rev() {
            self.revert_outcomes(std::slice::from_ref(&**outcome));
        }
        self.client.withdrawn.extend(unrun);
        let unnamed = self.client.unnamed.as_ref().and_then(|u| u.outcome.clone());
        let portals = &*self.portals;
        self.client.withdrawn.retain(|w| {
            unnamed.as_ref().is_some_and(|u| Arc::ptr_eq(u, w))
                || portals.values().any(|p| Arc::ptr_eq(p, w))
        });
    }

    /// The server skipped or refused the client's Parse whose planning applied `outcome`:
    /// undone, unless withdrawn already (or executed, whose entry then undoes it).
    pub fn revert_unrun(&mut self, outcome: &Arc<Outcome>) {
        if let Some(at) = self
            .client
            .unrun
            .iter()
            .position(|u| Arc::ptr_eq(u, outcome))
        {
            self.client.unrun.remove(at);
            self.revert_outcomes(std::slice::from_ref(&**outcome));
        }
    }

    /// Undoes the effects of statements `from..` of an entry that did not run, last first
    /// (`DEALLOCATE p; PREPARE p AS ...` is undone back to the first `p`). The first of them
    /// is the one that failed, which may have changed settings pgmemo cannot follow before
    /// its error (a `DO` block or procedure that commits, then raises): such a statement
    /// leaves the server's settings unknown whether or not it completed.
    pub fn revert_outcomes(&mut self, outcomes: &[Outcome]) {
        for outcome in outcomes.iter().rev() {
            if matches!(outcome.effect, Effect::SettingsUnknown { .. }) {
                self.server.settings.unknown = true;
                continue;
            }
            if let Effect::Deallocated(statements) | Effect::Discarded { statements, .. } =
                &outcome.effect
            {
                for (name, statement) in statements {
                    self.give_back(name, statement);
                }
                continue;
            }
            if let Effect::Prepared {
                statement,
                client_name,
                created,
                ..
            } = &outcome.effect
            {
                self.revert(
                    Revert {
                        statement: statement.clone(),
                        client_name: Some(client_name.clone()),
                        on_server: *created,
                        closed: false,
                        kept: false,
                    },
                    true,
                );
            }
        }
    }

    /// Gives the client back a statement name that a message the server skipped would have
    /// dropped. A `DEALLOCATE ALL` or `DISCARD ALL` sent after that message (still owed an
    /// answer) drops every name when it runs, this one too, though it was planned while the
    /// name was gone: the name goes to its outcome instead, to come back only should the
    /// server skip that one as well.
    fn give_back(&mut self, name: &str, statement: &Arc<PreparedStatement>) {
        if self.client.statements.contains_key(name) {
            return;
        }
        let mut dropped_later = false;
        for entry in self.queue.iter_mut() {
            let next = entry.next.min(entry.outcomes.len());
            for outcome in &mut entry.outcomes[next..] {
                if !outcome.drops_every_name() {
                    continue;
                }
                if let Effect::Deallocated(all)
                | Effect::Discarded {
                    statements: all, ..
                } = &mut outcome.effect
                {
                    all.push((name.to_owned(), Arc::clone(statement)));
                    dropped_later = true;
                }
            }
        }
        if !dropped_later {
            self.client
                .statements
                .insert(name.to_owned(), Arc::clone(statement));
        }
    }

    /// The records of the unnamed statement a message is about to change (`client`: the
    /// client's own Parse or Close, which replaces or drops the client's statement too).
    pub fn unnamed_undo(&self, client: bool) -> Box<UnnamedUndo> {
        Box::new(UnnamedUndo {
            client: client.then(|| self.client.unnamed.clone()),
            server: self.server.unnamed,
            unreadable: false,
            unrun: None,
        })
    }

    /// Undoes a Parse or Close of the unnamed statement the server skipped, or records what
    /// its failure left (`failed`): no unnamed statement on the server, nor for the client
    /// when the Parse was its own.
    ///
    /// A later batch already sent may have changed the unnamed statement again (the queue
    /// holds its entries): then the records show what that batch left, and what changes is
    /// the state that batch's own undo goes back to, should the server skip it too.
    pub fn undo_unnamed(&mut self, undo: UnnamedUndo, failed: bool) {
        let (server, client) = if failed {
            (None, undo.client.map(|_| None))
        } else {
            (undo.server, undo.client)
        };
        let later = self.queue.iter_mut().find_map(|e| e.unnamed.as_deref_mut());
        match later {
            Some(next) => next.server = server,
            None => self.server.unnamed = server,
        }
        if let Some(client) = client {
            let later = self
                .queue
                .iter_mut()
                .filter_map(|e| e.unnamed.as_deref_mut())
                .find(|u| u.client.is_some());
            match later {
                Some(next) => next.client = Some(client),
                None => self.client.unnamed = client,
            }
        }
    }

    /// The client's unnamed statement was parsed on this server: `new` replaces it (its
    /// `seq` is set here), `None` parses the current one again.
    #[inline]
    pub fn unnamed_parsed(&mut self, new: Option<Unnamed>) {
        self.client.parses += 1;
        let seq = self.client.parses;
        match new {
            Some(u) => self.client.unnamed = Some(Unnamed { seq, ..u }),
            None => {
                if let Some(u) = self.client.unnamed.as_mut() {
                    u.seq = seq;
                    u.promoted = None;
                }
            }
        }
        self.server.unnamed = Some((self.client.tag, seq));
    }

    /// A simple Query went to the server: it drops the unnamed statement, the client's as
    /// the server's, as PostgreSQL does.
    #[inline]
    pub fn query_sent(&mut self) {
        self.server.unnamed = None;
        self.client.unnamed = None;
    }

    /// Whether the server still owes answers the relay can wait for by reading it: not while
    /// a COPY wants the client's data or a batch is to be replayed (the pumps do those).
    pub fn waits_for_server(&self) -> bool {
        !self.owes_nothing() && !self.copy_in && self.retry.is_none()
    }

    /// Whether the server may be in an aborted transaction block when it reaches the next
    /// message: the client's block is (as of its last ReadyForQuery), or a request queued
    /// ahead (a Query, a batch ended by Sync) may leave it so. From outside a block, only a
    /// request of the client's that runs a statement (a `BEGIN`) can: batches of Parse,
    /// Bind, Describe and Close alone, and pgmemo's own settings Query, leave the server as
    /// idle as they found it. An error earlier in the same batch needs no care: the server
    /// then skips the message.
    pub fn may_be_aborted(&self) -> bool {
        if self.client.status == TransactionStatus::Failed || self.plain.is_some() {
            return true;
        }
        let (mut ends, mut runs) = (false, false);
        for e in self.queue.iter() {
            match e.expect {
                Expect::Query if e.forward => return true,
                // pgmemo's own (the client's settings brought in line) starts no block.
                Expect::Query => ends = true,
                Expect::Sync => ends = true,
                Expect::Execute => runs = true,
                _ => {}
            }
        }
        ends && (runs || self.client.status != TransactionStatus::Idle)
    }

    /// Whether the settings the server analyses a statement under may differ from the
    /// client's committed ones: [`Self::settings_moved`], or a statement that changes
    /// settings pipelined ahead whose answer has not come yet (its change counts only then).
    /// A statement prepared now is the client's own, never shared under a settings digest,
    /// and pgmemo does not switch the server's settings around preparing one again.
    pub fn settings_unsettled(&self) -> bool {
        self.settings_moved() || self.queue.iter().any(Entry::changes_settings)
    }

    /// Whether the server's settings may differ from the client's committed ones by what
    /// has been answered so far: a change in the open transaction (`SET`, `SET LOCAL`, a
    /// `ROLLBACK TO SAVEPOINT` after one), or code pgmemo cannot see into.
    pub fn settings_moved(&self) -> bool {
        self.txn.explained.any()
            || self.txn.uncertain
            || !self.txn.pending.is_empty()
            || self.server.settings.unknown
    }

    /// Whether the next request must wait for the server to be released (see
    /// `read_back_due`). Only ever true right after a ReadyForQuery left the server owing
    /// nothing, while the server pump looks whether it may release it.
    pub fn waits_for_read_back(&self) -> bool {
        self.read_back_due
            && self.server.settings.unknown
            && !self.client.verify.is_empty()
            && self.releasable()
    }

    /// Whether the client's next message must wait: for the server to be released
    /// ([`Self::waits_for_read_back`]) or for the answer to a promoted batch's Bind.
    pub fn holds_input(&self) -> bool {
        self.promoting.is_some() || self.waits_for_read_back()
    }

    /// Every answer the server owes was delivered.
    pub fn owes_nothing(&self) -> bool {
        self.queue.is_empty() && self.plain.is_none()
    }

    /// Whether the server may go back to the pool: every answer delivered, the client between
    /// transactions and not in the middle of an extended-protocol batch.
    pub fn releasable(&self) -> bool {
        self.owes_nothing()
            && self.client.status == TransactionStatus::Idle
            && !self.mid_batch
            && self.retry.is_none()
    }
}

/// Copies of the client's messages of the current batch, in one reused buffer: keeping the
/// received frames themselves would pin the session's read buffer, which then has to be
/// reallocated for every request.
///
/// The copies are kept only to replay a batch once (a statement's plan went stale), and only
/// up to [`BatchLog::MAX_BYTES`] or [`BatchLog::MAX_FRAMES`]: a client that streams messages
/// without a Sync would otherwise make pgmemo keep everything it sent. Past either limit the
/// batch is no longer replayable; what else is asked of the log (how many messages, whether
/// one was an Execute, the last one's type) is kept for any length.
#[derive(Default)]
pub struct BatchLog {
    /// Changes at every `clear`: tells the batch an entry's `frame` was counted in.
    id: u32,
    bytes: bytes::BytesMut,
    frames: Vec<std::ops::Range<usize>>,
    /// Messages recorded, including those past the limits.
    count: usize,
    /// The position of the current batch's first Execute.
    first_execute: Option<usize>,
    last_tag: Option<u8>,
    /// The batch went past the limits: `bytes` and `frames` no longer hold it.
    overflowed: bool,
}

impl BatchLog {
    /// Most bytes of messages kept for a replay.
    pub const MAX_BYTES: usize = 1 << 20;
    /// Most messages kept for a replay.
    pub const MAX_FRAMES: usize = 4096;

    /// Starts a new batch. While answers to batches before it are still owed, the log keeps
    /// them too, so that their entries find their messages (`frame`); it starts afresh once
    /// nothing is owed.
    pub fn begin(&mut self, owed: bool) {
        if owed && !self.overflowed {
            self.first_execute = None;
            self.last_tag = None;
        } else {
            self.clear();
        }
    }

    /// Starts afresh. A buffer grown past the limit by one large message is let go.
    pub fn clear(&mut self) {
        self.id = self.id.wrapping_add(1);
        if self.bytes.capacity() > Self::MAX_BYTES {
            self.bytes = bytes::BytesMut::new();
        }
        self.bytes.clear();
        self.frames.clear();
        self.count = 0;
        self.first_execute = None;
        self.last_tag = None;
        self.overflowed = false;
    }

    /// Records one message.
    #[inline]
    pub fn push(&mut self, frame: &wire::Frame) {
        self.push_raw(frame.raw());
    }

    /// Records one message, given as its bytes (a whole frame).
    #[inline]
    pub fn push_raw(&mut self, raw: &[u8]) {
        let tag = raw[0];
        if tag == wire::frontend::tag::EXECUTE && self.first_execute.is_none() {
            self.first_execute = Some(self.count);
        }
        self.count += 1;
        self.last_tag = Some(tag);
        if self.overflowed {
            return;
        }
        if self.bytes.len() + raw.len() > Self::MAX_BYTES || self.frames.len() >= Self::MAX_FRAMES {
            self.overflowed = true;
            self.bytes.clear();
            self.frames.clear();
            return;
        }
        let start = self.bytes.len();
        self.bytes.extend_from_slice(raw);
        self.frames.push(start..self.bytes.len());
    }

    /// The current batch and the position of its last message so far, for an entry to
    /// find that message again (`frame`).
    pub fn position(&self) -> (u32, u32) {
        (self.id, self.count.saturating_sub(1) as u32)
    }

    /// Message `n` of batch `id` as the client sent it, while that batch is the one kept.
    pub fn frame(&self, id: u32, n: u32) -> Option<&[u8]> {
        if id != self.id {
            return None;
        }
        self.frames
            .get(n as usize)
            .map(|range| &self.bytes[range.clone()])
    }

    /// Messages recorded.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether one of the messages before `n` was an Execute.
    pub fn executed_before(&self, n: usize) -> bool {
        self.first_execute.is_some_and(|i| i < n)
    }

    /// The type of the last message.
    pub fn last_tag(&self) -> Option<u8> {
        self.last_tag
    }

    /// Whether the messages are all kept, so the batch can be replayed.
    pub fn replayable(&self) -> bool {
        !self.overflowed
    }

    /// Removes and returns the messages from `n` on (a replayable batch's).
    pub fn split_off(&mut self, n: usize) -> Vec<wire::Frame> {
        debug_assert!(self.replayable());
        let n = n.min(self.frames.len());
        let frames = self
            .frames
            .split_off(n)
            .into_iter()
            .map(|range| wire::Frame::from_raw(Bytes::copy_from_slice(&self.bytes[range])))
            .collect();
        let end = self.frames.last().map_or(0, |f| f.end);
        self.bytes.truncate(end);
        self.count = self.frames.len();
        if self.first_execute.is_some_and(|i| i >= self.count) {
            self.first_execute = None;
        }
        self.last_tag = None;
        frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(tag: u8, body_len: usize) -> wire::Frame {
        let mut raw = vec![tag];
        raw.extend_from_slice(&((body_len + 4) as u32).to_be_bytes());
        raw.resize(5 + body_len, 0);
        wire::Frame::from_raw(Bytes::from(raw))
    }

    #[test]
    fn a_batch_is_kept_for_a_replay() {
        let mut log = BatchLog::default();
        log.push(&frame(b'P', 20));
        log.push(&frame(b'B', 10));
        log.push(&frame(b'E', 9));
        log.push(&frame(b'S', 0));
        assert!(log.replayable());
        assert_eq!(log.len(), 4);
        assert!(!log.executed_before(2) && log.executed_before(3));
        let replay = log.split_off(1);
        assert_eq!(replay.len(), 3);
        assert_eq!(replay[1].tag(), b'E');
        assert_eq!(log.len(), 1);
        assert!(!log.executed_before(1), "the Execute went with the replay");
    }

    #[test]
    fn batches_pipelined_behind_owed_ones_keep_theirs() {
        let mut log = BatchLog::default();
        log.begin(false);
        log.push(&frame(b'B', 10));
        let (first_batch, bind) = log.position();
        log.push(&frame(b'E', 9));
        log.push(&frame(b'S', 0));
        // The next batch comes before the first one's answers: both are kept.
        log.begin(true);
        log.push(&frame(b'B', 12));
        assert_eq!(log.frame(first_batch, bind).map(<[u8]>::len), Some(15));
        assert!(
            !log.executed_before(log.len()),
            "an Execute of the batch before"
        );
        // Once nothing is owed, a batch starts a new log, and old positions find nothing.
        log.begin(false);
        log.push(&frame(b'B', 10));
        assert_eq!(log.frame(first_batch, bind), None);
        assert!(log.frame(log.position().0, 0).is_some());
    }

    #[test]
    fn a_batch_without_end_is_not_kept_whole() {
        let mut log = BatchLog::default();
        // A client streaming Binds and Executes without a Sync.
        for _ in 0..1000 {
            log.push(&frame(b'B', 64 * 1024));
            log.push(&frame(b'E', 9));
        }
        assert!(!log.replayable());
        assert!(log.bytes.capacity() <= 2 * BatchLog::MAX_BYTES);
        assert_eq!(log.len(), 2000);
        assert!(log.executed_before(2));
        assert_eq!(log.last_tag(), Some(b'E'));
        // Many small messages count too.
        log.clear();
        for _ in 0..=BatchLog::MAX_FRAMES {
            log.push(&frame(b'H', 0));
        }
        assert!(!log.replayable());
        assert!(log.frames.capacity() <= 2 * BatchLog::MAX_FRAMES);
        log.clear();
        assert!(log.replayable() && log.len() == 0);
    }
}

//! The client pump of a caching session: reads whole requests and routes each one. A simple
//! Query or an extended batch (`[Parse] Bind [Describe] Execute Sync`) at a request boundary
//! is looked up by key and, on a hit, answered from memory; otherwise it is forwarded, with a
//! capture directive when its result may be stored and with the effects its commit will have.
//! Pipelined requests (sent before the previous answer arrived) are served and stored the same
//! way when every request still in flight before them is an inert read, so they run in the
//! state known now; a pipelined miss never waits for another session's fill of its key (its
//! answer must keep its place). Behind anything else they are forwarded as they are, their
//! effects still tracked.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use wire::backend::TransactionStatus;
use wire::FrameHeader;

use super::messages::{
    bind_has_time_word, bind_message, cacheable_shape, cstr, parse_message, scan_batch,
    session_switch, split_frames, Batch, BindMessage,
};
use super::session::{Confirmation, Confirmations, Statement};
use super::{close_unnamed, Action, CacheSession, Capture, ClientWriter, Directive, Link};
use crate::cache::flight::Flight;
use crate::cache::plan::{Effects, Plan, Refusal, StatementChange};
use crate::cache::store::Described;
use crate::cache::{catalog, context, feed};
use crate::client::relay::{refill_position, PumpError, RelayState};
use crate::config::Config;
use crate::hash::Map;
use crate::shared::Shared;

/// BindComplete, as a hit answers a Bind.
const BIND_COMPLETE: &[u8] = b"2\0\0\0\x04";
/// ParseComplete and BindComplete, as a hit answers a Parse and a Bind.
const PARSE_AND_BIND_COMPLETE: &[u8] = b"1\0\0\0\x042\0\0\0\x04";

/// How a cacheable miss goes on after [`Requests::single_flight`].
enum Flown {
    /// To the server, capturing its result (the fill is this session's, or not shared).
    Send(Box<Capture>),
    /// Answered from the entry another session stored meanwhile.
    Answered,
    /// A cancel came while it waited for another session's fill.
    Cancelled,
}

/// A miss routed by [`Requests::quick_miss`].
struct QuickMiss {
    /// The capture, when the result is to be stored.
    capture: Option<Box<Capture>>,
    /// The request cannot change anything (see [`Requests::request_sent`]).
    inert: bool,
    /// Confirmations of the Parses sent before the request, and of its Bind.
    confirms: Confirmations,
}

/// What one routing step did.
enum Step {
    Continue,
    NeedMore,
    Terminate,
}

pub(crate) struct Requests<'a> {
    pub buf: &'a mut BytesMut,
    pub st: &'a RelayState,
    pub link: &'a Link,
    pub shared: &'a Shared,
    pub max_message: usize,
    pub session: &'a mut CacheSession,
}

/// What a Bind bound a portal to.
#[derive(Clone)]
struct BoundPortal {
    statement: Bytes,
    identity: Option<Bytes>,
}

/// What an Execute of a portal runs, as far as pgmemo knows: `None` when the statement that
/// name stands for now is not the one bound (a Parse replaced it, a Close dropped it since),
/// or pgmemo never knew it.
fn portal_statement<'s>(
    portals: &Map<Bytes, BoundPortal>,
    statements: &'s Map<Bytes, Statement>,
    portal: &[u8],
) -> Option<(&'s Bytes, &'s Statement)> {
    let bound = portals.get(portal)?;
    let (name, st) = statements.get_key_value(bound.statement.as_ref())?;
    (bound.identity.as_ref() == Some(&st.identity)).then_some((name, st))
}

/// The effects of executing what pgmemo cannot name: anything may have been written,
/// defined or set.
fn unknown_effects() -> Effects {
    Effects {
        database_wide: true,
        ddl: true,
        settings: true,
        hidden_settings: true,
        snapshot: true,
        ..Effects::default()
    }
}

/// Per-pump bookkeeping that is not session state.
#[derive(Default)]
struct Pump {
    copy_left: usize,
    syncs_since_request: u64,
    /// Portal name → the statement it was bound to: its name, and its identity at the Bind
    /// (`None` when pgmemo knew no statement of that name). PostgreSQL keeps running what the
    /// portal was bound to after its statement is replaced or closed.
    portals: Map<Bytes, BoundPortal>,
    batch_effects: Effects,
    /// Confirmations of the Parses and Binds sent since the last request was noted.
    confirms: Confirmations,
    /// Reused for the frame boundaries of each batch.
    frames: Vec<std::ops::Range<usize>>,
    /// An Execute was sent since the last Sync: it may have changed the settings the
    /// messages after it run under (see [`Requests::context_at_send`]).
    executed_unsynced: bool,
}

impl Requests<'_> {
    pub(super) async fn run<CR, CW, SW>(
        mut self,
        reader: &mut CR,
        client: &ClientWriter<CW>,
        server: &mut SW,
    ) -> Result<bool, PumpError>
    where
        CR: AsyncRead + Unpin,
        CW: AsyncWrite + Unpin,
        SW: AsyncWrite + Unpin,
    {
        let mut pump = Pump::default();
        loop {
            loop {
                match self.step(&mut pump, client, server).await? {
                    Step::Continue => {}
                    Step::NeedMore => break,
                    Step::Terminate => return Ok(true),
                }
            }
            self.st
                .client_mid_message
                .store(pump.copy_left > 0, Ordering::Relaxed);
            refill_position(self.buf);
            if reader.read_buf(self.buf).await.map_err(PumpError::Client)? == 0 {
                return Ok(false);
            }
        }
    }

    async fn step<CW, SW>(
        &mut self,
        pump: &mut Pump,
        client: &ClientWriter<CW>,
        server: &mut SW,
    ) -> Result<Step, PumpError>
    where
        CW: AsyncWrite + Unpin,
        SW: AsyncWrite + Unpin,
    {
        if self.buf.is_empty() {
            return Ok(Step::NeedMore);
        }
        if pump.copy_left > 0 {
            let n = pump.copy_left.min(self.buf.len());
            send(server, &self.buf[..n]).await?;
            self.buf.advance(n);
            pump.copy_left -= n;
            return Ok(Step::Continue);
        }
        let Some(header) =
            FrameHeader::peek(self.buf, self.max_message).map_err(PumpError::Protocol)?
        else {
            return Ok(Step::NeedMore);
        };
        let (tag, len) = (header.tag, header.frame_len);
        if tag == b'd' && self.buf.len() < len {
            // CopyData streams through: large COPY rows need not fit in memory.
            pump.copy_left = len - self.buf.len();
            let n = self.buf.len();
            send(server, &self.buf[..n]).await?;
            self.buf.advance(n);
            return Ok(Step::Continue);
        }
        if self.buf.len() < len {
            return Ok(Step::NeedMore);
        }
        match tag {
            b'X' => return Ok(Step::Terminate),
            b'Q' => {
                pump.syncs_since_request = 0;
                let frame = self.buf.split_to(len).freeze();
                self.query(frame, client, server).await?;
            }
            b'P' | b'B' | b'D' | b'E' | b'C' | b'H' | b'S' => {
                let status = self.st.status();
                if (self.st.at_boundary() || self.pipelined_hit_allowed(status))
                    && matches!(tag, b'P' | b'B')
                {
                    match scan_batch(self.buf, self.max_message) {
                        Batch::Incomplete => return Ok(Step::NeedMore),
                        Batch::Complete(n) => {
                            let bytes = self.buf.split_to(n).freeze();
                            self.batch(bytes, pump, client, server).await?;
                            return Ok(Step::Continue);
                        }
                        Batch::Other => {}
                    }
                }
                let frame = self.buf.split_to(len).freeze();
                let whole = 0..frame.len();
                if let Some(parse) =
                    self.unnamed_restore(&frame, std::slice::from_ref(&whole), false)
                {
                    let ctx = self.context_at_send(pump);
                    self.restore_unnamed(parse, ctx, server).await?;
                }
                self.extended_passthrough(&frame, pump);
                if tag == b'S' {
                    self.request_sent(
                        std::mem::take(&mut pump.batch_effects),
                        Action::Forward,
                        false,
                        std::mem::take(&mut pump.confirms),
                    );
                    pump.syncs_since_request += 1;
                }
                if tag == b'E' {
                    pump.syncs_since_request = 0;
                    let portal = cstr(&frame[5..]).map(|(p, _)| p).unwrap_or_default();
                    if let Some(plan) = self.portal_plan(portal, pump) {
                        self.count_unkeyed_read(&frame, plan);
                    }
                }
                send(server, &frame).await?;
            }
            b'F' => {
                let frame = self.buf.split_to(len).freeze();
                let effects = Effects {
                    database_wide: true,
                    settings: true,
                    ..Effects::default()
                };
                pump.syncs_since_request = 0;
                self.request_sent(effects, Action::Forward, false, Confirmations::default());
                send(server, &frame).await?;
            }
            b'c' | b'f' => {
                // The server ignores Sync in copy-in mode: the Syncs sent since the COPY's
                // Execute get no ReadyForQuery. Outside copy-in mode the server ignores the
                // CopyDone or CopyFail itself, and the Syncs are answered.
                let mut ignored = std::mem::take(&mut pump.syncs_since_request);
                if !self.st.copy_in.swap(false, Ordering::Relaxed) {
                    ignored = 0;
                }
                let left = self
                    .st
                    .pending
                    .load(Ordering::Relaxed)
                    .saturating_sub(ignored as u32);
                self.st.pending.store(left, Ordering::Relaxed);
                self.link.sent.fetch_sub(
                    ignored.min(self.link.sent.load(Ordering::Relaxed)),
                    Ordering::Relaxed,
                );
                // The ignored Syncs' requests are no longer expected either.
                self.link
                    .last_non_inert
                    .fetch_min(self.link.sent.load(Ordering::Relaxed), Ordering::Relaxed);
                let frame = self.buf.split_to(len).freeze();
                send(server, &frame).await?;
            }
            _ => {
                let frame = self.buf.split_to(len).freeze();
                send(server, &frame).await?;
            }
        }
        Ok(Step::Continue)
    }

    /// Notes a request that a ReadyForQuery will answer, with its directive.
    /// `inert`: the request is a read that cannot change the transaction, the settings or
    /// any data (a cacheable SELECT, or one of pgmemo's own queries).
    fn request_sent(
        &mut self,
        effects: Effects,
        action: Action,
        inert: bool,
        confirms: Confirmations,
    ) {
        let seq = self.link.sent.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(seq, ?effects, inert, "request sent");
        if !inert {
            self.link.last_non_inert.store(seq + 1, Ordering::Relaxed);
        }
        if !effects.is_empty() || !matches!(action, Action::Forward) || !confirms.is_empty() {
            self.link.push_or_merge(Directive {
                seq,
                action,
                effects,
                swallow_first: None,
                cancelled: false,
                confirms,
            });
        }
        self.st.pending.fetch_add(1, Ordering::Relaxed);
        self.st.unsynced.store(false, Ordering::Relaxed);
    }

    /// Sends what the server's unnamed statement lacks (`session.unnamed_behind`: a Parse or
    /// a Close), ahead of the messages that use it; the response of the request they belong
    /// to starts with its ParseComplete or CloseComplete, which the server pump keeps from the
    /// client.
    /// `ctx`: the context the message is sent in ([`Self::context_at_send`]), in which the
    /// server analyses a restored Parse.
    async fn restore_unnamed<SW: AsyncWrite + Unpin>(
        &mut self,
        message: Bytes,
        ctx: Option<u64>,
        server: &mut SW,
    ) -> Result<(), PumpError> {
        let answer = if message.first() == Some(&b'C') {
            b'3'
        } else {
            if let Some(st) = self.session.statements.get_mut(&b""[..]) {
                st.may_analyse_in(ctx);
            }
            b'1'
        };
        self.link.push_or_merge(Directive {
            seq: self.link.sent.load(Ordering::Relaxed),
            action: Action::Forward,
            effects: Effects::default(),
            swallow_first: Some(answer),
            cancelled: false,
            confirms: Confirmations::default(),
        });
        send(server, &message).await
    }

    /// Whether a request sent before the previous answers arrived may still be answered from
    /// the cache (in order, by the server pump): every earlier request that is not an inert
    /// read has been answered, so the transaction status (idle) and the settings it will run
    /// under are the ones known now, and nothing is half-sent.
    fn pipelined_hit_allowed(&self, status: TransactionStatus) -> bool {
        status == TransactionStatus::Idle
            && !self.st.unsynced.load(Ordering::Relaxed)
            && !self.st.client_mid_message.load(Ordering::Relaxed)
            && self.link.last_non_inert.load(Ordering::Relaxed)
                <= self.link.answered.load(Ordering::Relaxed)
    }

    /// Whether results may be served and stored for a request arriving now: at a boundary,
    /// or pipelined behind inert reads only ([`Self::pipelined_hit_allowed`]), where the
    /// request runs in the state known now. A pipelined miss is then stored like any other:
    /// its capture's generations are taken before it is sent, earlier than it runs.
    fn usable_now(
        &self,
        at_boundary: bool,
        status: TransactionStatus,
        config: &Config,
    ) -> Result<(), Refusal> {
        if at_boundary || self.pipelined_hit_allowed(status) {
            self.usable(status, config)
        } else {
            Err(Refusal::Pipelined)
        }
    }

    /// Whether results may be served and stored right now (at a boundary, status `status`).
    fn usable(&self, status: TransactionStatus, config: &Config) -> Result<(), Refusal> {
        if !config.cache_on_for(&self.session.client_database) {
            return Err(Refusal::CacheOff);
        }
        if !self.session.enabled {
            return Err(Refusal::SessionOff);
        }
        if !self.session.db.feed.allows_cache() {
            return Err(Refusal::FeedDown);
        }
        if !self.session.db.sees_relayed_writes() {
            return Err(Refusal::UntrackedSessions);
        }
        if self.session.db.feed.awaits(self.session.bypass_until_lsn)
            || self.link.await_feed.load(Ordering::Relaxed)
        {
            return Err(Refusal::AwaitingFeed);
        }
        let Some(ctx) = self.session.context.as_ref() else {
            return Err(Refusal::SettingsUnknown);
        };
        if self.link.context_stale.load(Ordering::Relaxed) {
            return Err(Refusal::SettingsUnknown);
        }
        if ctx.hears_log_messages() {
            return Err(Refusal::LogMessages);
        }
        match status {
            TransactionStatus::Idle => Ok(()),
            TransactionStatus::Failed => Err(Refusal::TransactionWrote),
            TransactionStatus::InTransaction => {
                if self.link.txn_wrote.load(Ordering::Relaxed) {
                    Err(Refusal::TransactionWrote)
                } else if self.link.txn_snapshot.load(Ordering::Relaxed)
                    || ctx.snapshot_by_default()
                {
                    Err(Refusal::SnapshotIsolation)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// The id of the session context when it is known to be current.
    pub(super) fn trusted_context_id(&self) -> Option<u64> {
        if self.link.context_stale.load(Ordering::Relaxed) {
            return None;
        }
        self.session.context.as_ref().map(|c| c.id)
    }

    /// The id of the context a message sent now runs in, when it is known: the trusted one,
    /// provided every earlier request that may change settings was answered and no Execute
    /// since the last Sync may have changed them. A Parse records it (see
    /// `Statement::parsed_in`): PostgreSQL reads the statement's literals under it.
    fn context_at_send(&self, pump: &Pump) -> Option<u64> {
        let settled = !pump.executed_unsynced
            && self.link.last_non_inert.load(Ordering::Relaxed)
                <= self.link.answered.load(Ordering::Relaxed);
        if !settled {
            return None;
        }
        self.trusted_context_id()
    }

    /// After a commit whose writes only the replication feed will invalidate, reads the WAL
    /// position the session must wait for (read-your-writes): until the feed has applied it,
    /// this session bypasses the cache. One round trip, only after such commits.
    async fn note_feed_position<SW: AsyncWrite + Unpin>(
        &mut self,
        server: &mut SW,
    ) -> Result<(), PumpError> {
        if !self.link.await_feed.load(Ordering::Relaxed)
            || self.st.status() != TransactionStatus::Idle
        {
            return Ok(());
        }
        if let Some(lsn) = feed::wal_insert_position(&mut self.catalog(server)).await? {
            self.session.bypass_until_lsn = self.session.bypass_until_lsn.max(lsn);
            self.link.await_feed.store(false, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Whether, at a boundary, the session's context must be read again or the WAL position
    /// to wait for learnt ([`Self::catch_up`]). Rarely: callers check first and box the work,
    /// whose futures would otherwise be part of every request's.
    fn needs_catch_up(&self) -> bool {
        self.link.context_stale.load(Ordering::Relaxed)
            || self.link.await_feed.load(Ordering::Relaxed)
    }

    /// Reads the session's context again when it may have changed, and the WAL position to
    /// wait for after a commit left to the feed.
    async fn catch_up<SW: AsyncWrite + Unpin>(&mut self, server: &mut SW) -> Result<(), PumpError> {
        self.refresh_context(server).await?;
        self.note_feed_position(server).await
    }

    /// Reads the session context again if it may have changed and the session is idle.
    async fn refresh_context<SW: AsyncWrite + Unpin>(
        &mut self,
        server: &mut SW,
    ) -> Result<(), PumpError> {
        if !self.link.context_stale.load(Ordering::Relaxed)
            || self.st.status() != TransactionStatus::Idle
        {
            return Ok(());
        }
        self.link.context_stale.store(false, Ordering::Relaxed);
        self.shared
            .cache
            .stats
            .context_reads
            .fetch_add(1, Ordering::Relaxed);
        let db = Arc::clone(&self.session.db);
        self.session.context = context::read(&mut self.catalog(server), &db.contexts).await?;
        if self.session.context.is_none() {
            self.link.context_stale.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Runs pgmemo's own statements, in order, on the session's server connection. They go
    /// as one extended-protocol request under pgmemo's own statement name
    /// (`frontend::own_queries`): the client's unnamed statement and portal survive them.
    pub(super) async fn ask<SW: AsyncWrite + Unpin>(
        &mut self,
        server: &mut SW,
        statements: &[&str],
    ) -> Result<Option<Vec<catalog::Row>>, PumpError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.request_sent(
            Effects::default(),
            Action::Internal(tx),
            true,
            Confirmations::default(),
        );
        send(server, &wire::frontend::own_queries(statements)).await?;
        Ok(rx.await.ok().flatten())
    }

    /// Answers a hit, or returns the refusal that made it a miss.
    async fn try_hit<CW: AsyncWrite + Unpin>(
        &mut self,
        client: &ClientWriter<CW>,
        status: TransactionStatus,
        prefix: &[u8],
        described: Described<'_>,
        pipelined: bool,
    ) -> Result<bool, PumpError> {
        let cache = &self.shared.cache;
        let Some(entry) = cache.store.get(&self.session.key) else {
            return Ok(false);
        };
        if !entry.is_servable(Instant::now) || !entry.can_answer(described) {
            return Ok(false);
        }
        if pipelined {
            // Pipelined: the server pump answers it in order, after the responses before it.
            let mut bytes = Vec::new();
            if !entry.answer_into(&mut bytes, prefix, described) {
                return Ok(false);
            }
            self.request_sent(
                Effects::default(),
                Action::Hit(bytes),
                true,
                Confirmations::default(),
            );
        } else {
            let out = &mut self.session.out;
            out.clear();
            if !entry.answer_into(out, prefix, described) {
                return Ok(false);
            }
            out.extend_from_slice(&[b'Z', 0, 0, 0, 5, status.as_byte()]);
            let mut w = client.lock().await;
            w.write_all(out).await.map_err(PumpError::Client)?;
            w.flush().await.map_err(PumpError::Client)?;
        }
        cache.stats.served(&entry);
        Ok(true)
    }

    async fn query<CW, SW>(
        &mut self,
        frame: Bytes,
        client: &ClientWriter<CW>,
        server: &mut SW,
    ) -> Result<(), PumpError>
    where
        CW: AsyncWrite + Unpin,
        SW: AsyncWrite + Unpin,
    {
        let Some(text) = frame.get(5..).and_then(|body| body.strip_suffix(b"\0")) else {
            // Not a string: PostgreSQL answers "invalid string in message" and the session
            // goes on, so the server gets it as it is (nothing is looked up, nothing changes).
            self.request_sent(
                Effects::default(),
                Action::Forward,
                true,
                Confirmations::default(),
            );
            return send(server, &frame).await;
        };
        // A Query drops the unnamed statement, answered here or by the server; when it is
        // answered here the server may still have one, so a Close goes first if the client
        // uses it again (nothing to close when the client never had one).
        let had_unnamed = self.session.statements.remove(&b""[..]).is_some()
            || self.session.unnamed_behind.is_some();
        self.session.unnamed_behind = had_unnamed.then(close_unnamed);
        let at_boundary = self.st.at_boundary();
        if at_boundary && self.needs_catch_up() {
            Box::pin(self.catch_up(server)).await?;
        }
        let status = self.st.status();
        if let Some(on) = session_switch(text) {
            self.session.enabled = on;
            if at_boundary {
                let mut out = BytesMut::with_capacity(32);
                wire::backend::command_complete("SET", &mut out);
                out.extend_from_slice(&wire::backend::ready_for_query(status));
                let mut w = client.lock().await;
                w.write_all(&out).await.map_err(PumpError::Client)?;
                w.flush().await.map_err(PumpError::Client)?;
                return Ok(());
            }
        }
        let config = self.shared.config();
        let usable = self.usable_now(at_boundary, status, &config);
        let mut looked_up = false;
        if usable.is_ok() && self.session.start_key(b'Q').is_some() {
            self.session.key.extend_from_slice(text);
            if self
                .try_hit(client, status, b"", Described::Portal, !at_boundary)
                .await?
            {
                return Ok(());
            }
            looked_up = true;
        }
        let can_ask = at_boundary && status != TransactionStatus::Failed;
        let text = lossy_text(text);
        // The lookup's key is the capture's unless the text was not UTF-8.
        let key_built = looked_up && matches!(text, std::borrow::Cow::Borrowed(_));
        let (plan, time_literal, cancelled) = self.plan_for(&text, can_ask, server).await?;
        if cancelled {
            return self.query_cancelled(status, client, server).await;
        }
        self.apply_statement_changes(&plan);
        let refusal = refusal(&plan, usable, time_literal);
        let capture = match refusal {
            Err(_) => None,
            Ok(()) if key_built => self.capture_built(&plan, &config),
            // Not UTF-8 (a LATIN1 client's text): the lossy text would be a key that other
            // texts share and that no lookup of this one builds. Not stored.
            Ok(()) if matches!(text, std::borrow::Cow::Owned(_)) => None,
            Ok(()) => self.capture(&plan, b'Q', text.as_bytes(), None, &config),
        };
        let action = match refusal {
            Ok(()) => match capture {
                Some(c) => match self
                    .single_flight(c, client, (status, at_boundary), b"", Described::Portal)
                    .await?
                {
                    Flown::Send(c) => Action::Capture(c),
                    Flown::Answered => return Ok(()),
                    Flown::Cancelled => {
                        return self.query_cancelled(status, client, server).await;
                    }
                },
                None => Action::Forward,
            },
            Err(r) => {
                self.shared.cache.stats.refused_query(r, &plan.query);
                Action::Forward
            }
        };
        if matches!(action, Action::Capture(_)) {
            self.shared.cache.stats.missed(&plan.query);
        }
        // A read of the clock is not stored, but changes nothing either.
        let inert = plan.read.is_ok() && plan.effects.is_empty();
        self.request_sent(
            plan.effects.clone(),
            action,
            inert,
            Confirmations::default(),
        );
        self.session.unnamed_behind = None;
        send(server, &frame).await
    }

    /// A capture directive for a cacheable miss; `identity` and `tail` make the key.
    fn capture(
        &mut self,
        plan: &Plan,
        kind: u8,
        identity: &[u8],
        tail: Option<&[u8]>,
        config: &Config,
    ) -> Option<Box<Capture>> {
        plan.read.as_ref().ok()?;
        self.session.start_key(kind)?;
        self.session.key.extend_from_slice(identity);
        if let Some(t) = tail {
            self.session.key.extend_from_slice(t);
        }
        self.capture_built(plan, config)
    }

    /// A capture directive for a cacheable miss whose key is in `session.key` already (built
    /// for the lookup that missed).
    fn capture_built(&self, plan: &Plan, config: &Config) -> Option<Box<Capture>> {
        let read = plan.read.as_ref().ok()?;
        let cache = &self.shared.cache;
        if !cache.admits(&self.session.key, &plan.query, config) {
            // A miss all the same, just not stored.
            cache.stats.missed(&plan.query);
            return None;
        }
        let capture = Capture::for_read(
            &self.session.key,
            read,
            &plan.query,
            &self.session.db,
            config,
        );
        // DDL since the plan was made (its invalidation may already be behind the snapshot).
        (self.session.db.plans_epoch() == plan.epoch).then_some(capture)
    }

    /// Leads the fill of the capture's key, or waits for the session already filling it and
    /// answers from its entry. A pipelined request (not `at_boundary`) never waits: its
    /// answer must keep its place behind the others. The wait happens with the server idle,
    /// where PostgreSQL would ignore a cancel: one that comes meanwhile is kept and ends the
    /// wait ([`Flown::Cancelled`]).
    async fn single_flight<CW: AsyncWrite + Unpin>(
        &mut self,
        mut capture: Box<Capture>,
        client: &ClientWriter<CW>,
        (status, at_boundary): (TransactionStatus, bool),
        prefix: &[u8],
        described: Described<'_>,
    ) -> Result<Flown, PumpError> {
        if !at_boundary || !capture.query.worth_single_flight() {
            return Ok(Flown::Send(capture));
        }
        match self.shared.cache.flights.join(&capture.key) {
            Flight::Leader(guard) => {
                capture.flight = Some(guard);
                Ok(Flown::Send(capture))
            }
            // Boxed, like other rare waits, to keep every request's future small.
            Flight::Follower(done) => {
                Box::pin(async {
                    let slot = Arc::clone(&self.session.cancel);
                    slot.hold();
                    tokio::select! {
                        biased;
                        () = slot.cancel_kept() => {}
                        () = self.shared.cache.wait_for_flight(done) => {}
                    }
                    if slot.resume() {
                        return Ok(Flown::Cancelled);
                    }
                    self.session.key.clear();
                    self.session.key.extend_from_slice(&capture.key);
                    // Single flight happens at a boundary: answer directly.
                    if self
                        .try_hit(client, status, prefix, described, false)
                        .await?
                    {
                        return Ok(Flown::Answered);
                    }
                    Ok(Flown::Send(capture))
                })
                .await
            }
        }
    }

    /// Answers a simple Query whose cancel came while it waited in pgmemo. Outside a
    /// transaction block pgmemo answers it itself: nothing ran, nothing changes. Inside one
    /// the block must fail on the server too ([`Self::send_cancelled`]).
    async fn query_cancelled<CW, SW>(
        &mut self,
        status: TransactionStatus,
        client: &ClientWriter<CW>,
        server: &mut SW,
    ) -> Result<(), PumpError>
    where
        CW: AsyncWrite + Unpin,
        SW: AsyncWrite + Unpin,
    {
        if status == TransactionStatus::Idle {
            answer_cancelled(client).await
        } else {
            self.send_cancelled(&[], &[], server).await
        }
    }

    /// [`Self::send_cancelled`] for a batch tracked message by message: the confirmations
    /// of its Parses and Binds will not come.
    async fn batch_cancelled<SW: AsyncWrite + Unpin>(
        &mut self,
        bytes: &[u8],
        frames: &[std::ops::Range<usize>],
        pump: &mut Pump,
        server: &mut SW,
    ) -> Result<(), PumpError> {
        pump.confirms = Confirmations::default();
        self.send_cancelled(bytes, frames, server).await
    }

    /// Answers a request whose cancel came while it waited in pgmemo, before anything of it
    /// was sent: `batch` (the client's messages up to their Sync; empty for a simple Query,
    /// which is not sent) goes to the server behind a Parse the server refuses, so it runs
    /// none of the batch and aborts an open transaction block, as a cancel landing on the
    /// request's first message would; the client gets 57014 for that Parse's error (see
    /// `Directive::cancelled`). The batch's Parses never reach the server: their statements
    /// are not taken as analysed there (the records of a Parse of a new text stay unconfirmed,
    /// which keeps them from the cache already).
    async fn send_cancelled<SW: AsyncWrite + Unpin>(
        &mut self,
        batch: &[u8],
        frames: &[std::ops::Range<usize>],
        server: &mut SW,
    ) -> Result<(), PumpError> {
        for r in frames {
            let frame = &batch[r.clone()];
            if frame[0] == b'P' {
                if let Some(m) = parse_message(&frame[5..]) {
                    if let Some(st) = self.session.statements.get_mut(m.name) {
                        st.parsed_in = None;
                    }
                }
            }
        }
        tracing::debug!("a request cancelled before it was sent: the server refuses it");
        self.link.push_or_merge(Directive {
            seq: self.link.sent.load(Ordering::Relaxed),
            action: Action::Forward,
            effects: Effects::default(),
            swallow_first: None,
            cancelled: true,
            confirms: Confirmations::default(),
        });
        self.request_sent(
            Effects::default(),
            Action::Forward,
            false,
            Confirmations::default(),
        );
        let mut out = BytesMut::from(&wire::frontend::refused_parse()[..]);
        if batch.is_empty() {
            out.extend_from_slice(&wire::frontend::sync());
        } else {
            out.extend_from_slice(batch);
        }
        send(server, &out).await
    }

    fn apply_statement_changes(&mut self, plan: &Plan) {
        for change in &plan.statements {
            match change {
                StatementChange::Forget(name) => self.session.forget(name.as_bytes()),
                StatementChange::ForgetAll => self.session.statements.clear(),
                // Not worth tracking the context a SQL EXECUTE runs in: the statement is
                // simply no longer tied to the settings of its Parse.
                StatementChange::MayAnalyse(name) => self.may_analyse(name.as_bytes(), None),
            }
        }
    }

    /// A Bind of `portal` to `statement` goes to the server: its BindComplete confirms the
    /// statement (unless it is in doubt) in today's plans epoch (see `session::Confirmed`), and the portal runs the
    /// statement as pgmemo knows it now, whatever later takes its name.
    fn bind_sent(&self, portal: &[u8], statement: &[u8], pump: &mut Pump) {
        let st = self.session.statements.get(statement);
        // A BindComplete shows that the server has a statement of that name, not which: one
        // in doubt (a Parse of another text under its name, which the server may have
        // refused with 42P05, keeping the old one) is confirmed only by its ParseComplete.
        if let Some(st) = st.filter(|st| !st.in_doubt()) {
            let epoch = self.session.db.plans_epoch();
            pump.confirms
                .binds
                .push(Confirmation::new(&st.confirmed, epoch));
        }
        let identity = st.map(|s| s.identity.clone());
        match pump.portals.get_mut(portal) {
            Some(p) if p.statement[..] == *statement => p.identity = identity,
            _ => {
                pump.portals.insert(
                    Bytes::copy_from_slice(portal),
                    BoundPortal {
                        statement: Bytes::copy_from_slice(statement),
                        identity,
                    },
                );
            }
        }
    }

    /// Tracks one extended-protocol message forwarded as it is.
    fn extended_passthrough(&mut self, frame: &[u8], pump: &mut Pump) {
        self.track_message(frame, pump, true);
    }

    /// Tracks one extended-protocol message: statements parsed, portals bound, statements
    /// closed, and (`execute_effects`) what an Execute will write. A routed batch plans its
    /// Executes itself and passes `false`: working the effects out here as well would parse
    /// each statement's text at its first execution on the connection, for nothing.
    fn track_message(&mut self, frame: &[u8], pump: &mut Pump, execute_effects: bool) {
        let body = &frame[5..];
        match frame[0] {
            b'P' => {
                if let Some(p) = parse_message(body) {
                    let ctx = self.context_at_send(pump);
                    // PostgreSQL refuses a Parse of a name in use (42P05) and keeps the
                    // statement it has; one of another text may also be accepted, when the
                    // server dropped the old one unseen (see `Statement::replaced`).
                    let same = self
                        .session
                        .statements
                        .get(p.name)
                        .is_some_and(|st| st.is(p.text, p.param_types));
                    if p.name.is_empty() || !same {
                        // Copies, here and below: a slice would pin the read buffer, which
                        // would then be reallocated for every request.
                        let confirmed = self.session.parsed(
                            Bytes::copy_from_slice(p.name),
                            p.text,
                            p.param_types,
                            ctx,
                        );
                        let epoch = self.session.db.plans_epoch();
                        pump.confirms
                            .parses
                            .push(Confirmation::new(&confirmed, epoch));
                    }
                }
            }
            b'B' => {
                if let Some(b) = bind_message(body) {
                    let ctx = self.context_at_send(pump);
                    self.may_analyse(b.statement, ctx);
                    self.bind_sent(b.portal, b.statement, pump);
                }
            }
            b'D' if body.first() == Some(&b'S') => {
                if let Some((name, _)) = cstr(&body[1..]) {
                    let ctx = self.context_at_send(pump);
                    self.may_analyse(name, ctx);
                }
            }
            b'E' if execute_effects => {
                let portal = cstr(body).map(|(p, _)| p).unwrap_or_default();
                let effects = self
                    .portal_plan(portal, pump)
                    .map(|p| p.effects.clone())
                    .unwrap_or_else(|| self.effects_without_catalog(portal, pump));
                pump.batch_effects.merge(&effects);
            }
            b'C' if body.first() == Some(&b'S') => {
                if let Some((name, _)) = cstr(&body[1..]) {
                    self.session.forget(name);
                }
            }
            _ => {}
        }
        match frame[0] {
            b'E' => pump.executed_unsynced = true,
            b'S' => pump.executed_unsynced = false,
            _ => {}
        }
        if !matches!(frame[0], b'S' | b'H') {
            self.st.unsynced.store(true, Ordering::Relaxed);
        }
    }

    /// A message that makes the server analyse `statement` again if it must (DDL, or a
    /// search_path or role change, since its Parse) is sent in context `ctx`.
    fn may_analyse(&mut self, statement: &[u8], ctx: Option<u64>) {
        if let Some(st) = self.session.statements.get_mut(statement) {
            st.may_analyse_in(ctx);
        }
    }

    /// The current, complete plan of the statement bound to `portal`, if pgmemo has one.
    fn portal_plan(&self, portal: &[u8], pump: &Pump) -> Option<&Arc<Plan>> {
        let epoch = self.session.db.plans_epoch();
        portal_statement(&pump.portals, &self.session.statements, portal)
            .map(|(_, s)| s)
            .filter(|s| !s.in_doubt())
            .and_then(|s| s.plan.as_ref())
            .filter(|(_, e, p, _)| *e == epoch && p.complete)
            .map(|(_, _, p, _)| p)
    }

    /// Counts an Execute relayed outside a batch the cache keys (`[Parse] Bind [Describe]
    /// Execute Sync` of the unnamed portal) when it runs a cacheable read: a row limit
    /// suspends the portal, any other shape is an unsupported batch.
    fn count_unkeyed_read(&self, execute: &[u8], plan: &Plan) {
        if plan.read.is_err() {
            return;
        }
        let reason = match wire::frontend::Execute::max_rows_of(&execute[5..]) {
            Ok(0) => Refusal::UnsupportedBatch,
            _ => Refusal::PortalSuspension,
        };
        self.shared.cache.stats.refused_query(reason, &plan.query);
    }

    /// Effects of executing a portal whose statement has no plan yet (a statement's first
    /// execution on this connection): the memoized plan's when the memo knows the shape, none
    /// when parsing its text shows SELECTs that read no relation (which may be a view calling
    /// a volatile function) and call no function, operator or cast, else assumed to write
    /// anything.
    fn effects_without_catalog(&self, portal: &[u8], pump: &Pump) -> Effects {
        let text = portal_statement(&pump.portals, &self.session.statements, portal)
            .map(|(_, s)| s.text.clone());
        if let Some(text) = text {
            if let Some((plan, _)) = self.memoized_plan(&text) {
                return plan.effects.clone();
            }
            if let Ok(a) = sql::analyze(&text) {
                let only_reads = a.statements.iter().all(|s| {
                    matches!(s.kind, sql::StatementKind::Select)
                        && s.functions.is_empty()
                        && s.reads.is_empty()
                        && s.operators.is_empty()
                        && s.casts.is_empty()
                        && s.attributes.is_empty()
                        && !s.select_into
                        && !s.data_modifying_cte
                });
                if only_reads {
                    return Effects::default();
                }
            }
        }
        unknown_effects()
    }

    /// Routes a whole batch up to its Sync, sent at a boundary.
    async fn batch<CW, SW>(
        &mut self,
        bytes: Bytes,
        pump: &mut Pump,
        client: &ClientWriter<CW>,
        server: &mut SW,
    ) -> Result<(), PumpError>
    where
        CW: AsyncWrite + Unpin,
        SW: AsyncWrite + Unpin,
    {
        let mut frames = std::mem::take(&mut pump.frames);
        split_frames(&bytes, &mut frames);
        let routed = self
            .route_batch(&bytes, &frames, pump, client, server)
            .await;
        pump.frames = frames;
        routed
    }

    /// [`Self::batch`] once its frames are found.
    async fn route_batch<CW, SW>(
        &mut self,
        bytes: &Bytes,
        frames: &[std::ops::Range<usize>],
        pump: &mut Pump,
        client: &ClientWriter<CW>,
        server: &mut SW,
    ) -> Result<(), PumpError>
    where
        CW: AsyncWrite + Unpin,
        SW: AsyncWrite + Unpin,
    {
        let at_boundary = self.st.at_boundary();
        if at_boundary && self.needs_catch_up() {
            Box::pin(self.catch_up(server)).await?;
        }
        let status = self.st.status();
        let config = self.shared.config();
        let shape = cacheable_shape(bytes, frames);
        // The context a Parse restored ahead of the batch is sent in.
        let batch_ctx = self.context_at_send(pump);
        // Pipelined batches are served and stored too, but not planned with the catalog.
        let usable = self.usable_now(at_boundary, status, &config);
        // The identity whose key `session.key` holds after a lookup that missed: a capture
        // of the same statement reuses that key.
        let mut looked_up: Option<Bytes> = None;
        // Hit: Bind [Describe] Execute Sync on a statement prepared earlier, or the same after
        // a Parse of the unnamed statement (which the server then gets only when needed).
        if let (Some(s), Ok(())) = (&shape, usable) {
            let unnamed_parse = s.parse && {
                let p = &bytes[frames[0].clone()];
                parse_message(&p[5..]).is_some_and(|m| m.name.is_empty())
            };
            if !s.parse || unnamed_parse {
                if unnamed_parse {
                    let p = bytes.slice(frames[0].clone());
                    if let Some(m) = parse_message(&p[5..]) {
                        // Answered by pgmemo (from the cache) if at all: nothing to confirm.
                        // The server gets it later, if at all (`unnamed_behind`), and its
                        // context is checked again then.
                        let epoch = self.session.db.plans_epoch();
                        self.session
                            .parsed(Bytes::new(), m.text, m.param_types, batch_ctx)
                            .store(epoch + 1, Ordering::Relaxed);
                    }
                }
                let prefix: &[u8] = if unnamed_parse {
                    PARSE_AND_BIND_COMPLETE
                } else {
                    BIND_COMPLETE
                };
                let bind = &bytes[frames[usize::from(unnamed_parse)].clone()];
                if let Some(b) = bind_message(&bind[5..]) {
                    let epoch = self.session.db.plans_epoch();
                    let ctx = self.trusted_context_id();
                    let identity = self
                        .session
                        .statements
                        .get(b.statement)
                        .filter(|st| st.confirmed_in(epoch) && st.parsed_in_context(ctx))
                        .map(|st| st.identity.clone());
                    if let Some(identity) = identity {
                        if self.session.start_key(b'E').is_some() {
                            self.session.key.extend_from_slice(&identity);
                            self.session.key.extend_from_slice(b.tail);
                            if self
                                .try_hit(client, status, prefix, s.described(bytes), !at_boundary)
                                .await?
                            {
                                if unnamed_parse {
                                    let parse = &bytes[frames[0].clone()];
                                    let same = self
                                        .session
                                        .unnamed_behind
                                        .as_ref()
                                        .is_some_and(|b| b[..] == *parse);
                                    if !same {
                                        self.session.unnamed_behind =
                                            Some(Bytes::copy_from_slice(parse));
                                    }
                                }
                                return Ok(());
                            }
                            if !s.parse {
                                if let Some(miss) = self.quick_miss(&b, &config, pump) {
                                    let described = s.described(bytes);
                                    return self
                                        .forward_quick_miss(
                                            bytes,
                                            miss,
                                            (status, at_boundary),
                                            described,
                                            client,
                                            server,
                                        )
                                        .await;
                                }
                            }
                            looked_up = Some(identity);
                        }
                    }
                }
            }
        }
        // Miss or not cacheable: track every message, plan the executed statements.
        let can_ask = at_boundary && status != TransactionStatus::Failed;
        let mut effects = Effects::default();
        let mut read_ok = false;
        let mut capture = None;
        // A cancel came while lookups or a fill of another session held the batch back.
        let mut cancelled = false;
        for r in frames {
            let frame = &bytes[r.clone()];
            self.track_message(frame, pump, false);
            if frame[0] != b'E' {
                continue;
            }
            let portal = cstr(&frame[5..]).map(|(p, _)| p).unwrap_or_default();
            let Some(stmt_name) = pump.portals.get(portal).map(|b| b.statement.clone()) else {
                effects.merge(&self.effects_without_catalog(portal, pump));
                continue;
            };
            if portal_statement(&pump.portals, &self.session.statements, portal).is_none() {
                // The portal runs a statement its name no longer stands for (replaced or
                // closed since the Bind), or one pgmemo never knew.
                self.shared.cache.stats.refused(Refusal::UnknownStatement);
                effects.merge(&unknown_effects());
                continue;
            }
            let ctx_id = self.trusted_context_id();
            let epoch = self.session.db.plans_epoch();
            let known = match self.session.statements.get(stmt_name.as_ref()) {
                // Which text the server runs is not known yet: as if no statement was known.
                None => None,
                Some(s) if s.in_doubt() => None,
                Some(s) => match &s.plan {
                    Some((id, e, p, t)) if Some(*id) == ctx_id && *e == epoch && p.complete => {
                        Some(Ok((Arc::clone(p), *t)))
                    }
                    _ => Some(Err(s.text.clone())),
                },
            };
            let (plan, time_literal) = match known {
                None => {
                    self.shared.cache.stats.refused(Refusal::UnknownStatement);
                    effects.database_wide = true;
                    continue;
                }
                Some(Ok(planned)) => planned,
                Some(Err(text)) => {
                    let (plan, time_literal, cancel) =
                        self.plan_for(&text, can_ask, server).await?;
                    cancelled |= cancel;
                    if let (Some(s), Some(id)) =
                        (self.session.statements.get_mut(stmt_name.as_ref()), ctx_id)
                    {
                        s.plan = Some((id, epoch, Arc::clone(&plan), time_literal));
                    }
                    (plan, time_literal)
                }
            };
            effects.merge(&plan.effects);
            self.apply_statement_changes(&plan);
            read_ok = plan.read.is_ok();
            if shape.is_some() {
                let bind =
                    &bytes[frames[usize::from(shape.as_ref().is_some_and(|s| s.parse))].clone()];
                let parsed_here = self
                    .session
                    .statements
                    .get(stmt_name.as_ref())
                    .is_some_and(|s| s.parsed_in_context(ctx_id));
                let refusal = refusal(&plan, usable, time_literal)
                    .and_then(|()| match bind_message(&bind[5..]) {
                        Some(b) if !bind_has_time_word(&b) => Ok(()),
                        Some(_) => Err(Refusal::TimeLiteral),
                        None => Err(Refusal::UnsupportedBatch),
                    })
                    .and_then(|()| parsed_here.then_some(()).ok_or(Refusal::ParsedElsewhere));
                match refusal {
                    Ok(()) => {
                        let b = bind_message(&bind[5..]);
                        let identity = self
                            .session
                            .statements
                            .get(stmt_name.as_ref())
                            .filter(|s| !s.in_doubt())
                            .map(|s| s.identity.clone());

                        if let (Some(b), Some(identity)) = (b, identity) {
                            // The lookup's key is this one when it was the same statement.
                            let built = looked_up.as_ref().is_some_and(|l| {
                                l.as_ptr() == identity.as_ptr() && l.len() == identity.len()
                            });
                            capture = if built {
                                self.capture_built(&plan, &config)
                            } else {
                                self.capture(&plan, b'E', &identity, Some(b.tail), &config)
                            };
                            if let (Some(c), Some(s)) = (capture.as_mut(), shape.as_ref()) {
                                c.statement_formats = s.statement_formats(bytes);
                            }
                        }
                    }
                    Err(r) => {
                        self.shared.cache.stats.refused_query(r, &plan.query);
                    }
                }
            } else if !time_literal {
                self.count_unkeyed_read(frame, &plan);
            }
        }
        pump.batch_effects = Effects::default();
        // The batch's Sync: after an Execute that starts a COPY FROM STDIN it gets no
        // ReadyForQuery (see the CopyDone handling).
        if frames.iter().any(|r| bytes[r.start] == b'E') {
            pump.syncs_since_request = 1;
        } else {
            pump.syncs_since_request += 1;
        }
        let action = match capture {
            _ if cancelled => return self.batch_cancelled(bytes, frames, pump, server).await,
            Some(c) if shape.as_ref().is_some_and(|s| !s.parse) => {
                let described = shape
                    .as_ref()
                    .map_or(Described::Nothing, |s| s.described(bytes));
                match self
                    .single_flight(c, client, (status, at_boundary), BIND_COMPLETE, described)
                    .await?
                {
                    Flown::Send(c) => Action::Capture(c),
                    // Answered from the entry another session just stored; the batch's
                    // messages were noted but never sent.
                    Flown::Answered => {
                        self.st.unsynced.store(false, Ordering::Relaxed);
                        return Ok(());
                    }
                    Flown::Cancelled => {
                        return self.batch_cancelled(bytes, frames, pump, server).await;
                    }
                }
            }
            Some(c) => Action::Capture(c),
            None => Action::Forward,
        };
        if let Action::Capture(c) = &action {
            self.shared.cache.stats.missed(&c.query);
        }
        if let Some(parse) = self.unnamed_restore(bytes, frames, true) {
            self.restore_unnamed(parse, batch_ctx, server).await?;
        }
        let inert = shape.is_some() && read_ok && effects.is_empty();
        let confirms = std::mem::take(&mut pump.confirms);
        self.request_sent(effects, action, inert, confirms);
        send(server, bytes).await
    }

    /// The miss of `Bind [Describe] Execute Sync` on a prepared statement whose plan is known,
    /// current and reads without any effect: the request drivers that prepare send most. It
    /// is routed without the general path's per-message tracking; what that tracking would
    /// record is recorded here (the unnamed portal's statement, the Sync). `None` when the
    /// general path must route it. `session.key` holds the request's key (the lookup that
    /// missed).
    fn quick_miss(
        &mut self,
        bind: &BindMessage<'_>,
        config: &Config,
        pump: &mut Pump,
    ) -> Option<QuickMiss> {
        if bind.statement.is_empty() && self.session.unnamed_behind.is_some() {
            return None;
        }
        let ctx_id = self.trusted_context_id()?;
        let epoch = self.session.db.plans_epoch();
        // Borrowed, not cloned: the plan is shared by every session running the statement,
        // and its reference count would be written by all of them on every miss.
        let st = self
            .session
            .statements
            .get(bind.statement)
            .filter(|st| st.parsed_in_context(Some(ctx_id)))?;
        let (plan, time_literal) = match &st.plan {
            Some((id, e, p, t)) if *id == ctx_id && *e == epoch && p.complete => (&**p, *t),
            _ => return None,
        };
        if !plan.effects.is_empty() || !plan.statements.is_empty() {
            return None;
        }
        pump.batch_effects = Effects::default();
        pump.syncs_since_request = 1;
        self.bind_sent(b"", bind.statement, pump);
        let refused = refusal(plan, Ok(()), time_literal).and_then(|()| {
            if bind_has_time_word(bind) {
                Err(Refusal::TimeLiteral)
            } else {
                Ok(())
            }
        });
        let capture = match refused {
            Ok(()) => self.capture_built(plan, config),
            Err(r) => {
                self.shared.cache.stats.refused_query(r, &plan.query);
                None
            }
        };
        Some(QuickMiss {
            capture,
            inert: plan.read.is_ok(),
            confirms: std::mem::take(&mut pump.confirms),
        })
    }

    /// Sends a request routed by [`Self::quick_miss`], leading or joining the single flight
    /// of its key when its result is to be stored.
    async fn forward_quick_miss<CW, SW>(
        &mut self,
        bytes: &Bytes,
        miss: QuickMiss,
        (status, at_boundary): (TransactionStatus, bool),
        described: Described<'_>,
        client: &ClientWriter<CW>,
        server: &mut SW,
    ) -> Result<(), PumpError>
    where
        CW: AsyncWrite + Unpin,
        SW: AsyncWrite + Unpin,
    {
        let action = match miss.capture {
            Some(c) => match self
                .single_flight(c, client, (status, at_boundary), BIND_COMPLETE, described)
                .await?
            {
                Flown::Send(c) => {
                    self.shared.cache.stats.missed(&c.query);
                    Action::Capture(c)
                }
                // Answered from the entry another session just stored.
                Flown::Answered => {
                    self.st.unsynced.store(false, Ordering::Relaxed);
                    return Ok(());
                }
                // The batch holds no Parse (see `quick_miss`).
                Flown::Cancelled => return self.send_cancelled(bytes, &[], server).await,
            },
            None => Action::Forward,
        };
        self.request_sent(Effects::default(), action, miss.inert, miss.confirms);
        send(server, bytes).await
    }

    /// When the server's unnamed statement is behind the client's and `frames` use it before
    /// parsing a new one, the Parse (or Close) to send first, ahead of `frames[0]`. Forgets
    /// the lag either way once `frames` settle it.
    ///
    /// The lag only ever starts at a request answered from the cache, so `frames[0]` is the
    /// first message of a batch. What goes ahead of it reaches the server whatever the batch
    /// does, while a message later in the batch is skipped when one before it fails. So a new
    /// unnamed Parse makes the lag moot only as the batch's first message, and only when
    /// PostgreSQL reads it without error: one it fails while reading it (trailing bytes, a name
    /// or text that is not UTF-8: 08P01, 22021) keeps the old unnamed statement, which the
    /// client may bind next. `whole_batch`: `frames` is the whole batch, up to its Sync, so
    /// the lag may stay when nothing in it uses the unnamed statement; otherwise (one message
    /// of a batch relayed message by message) what the rest of the batch does is unknown, and
    /// the server gets the client's unnamed statement now.
    fn unnamed_restore(
        &mut self,
        bytes: &[u8],
        frames: &[std::ops::Range<usize>],
        whole_batch: bool,
    ) -> Option<Bytes> {
        self.session.unnamed_behind.as_ref()?;
        let unnamed_parse = |body: &[u8]| parse_message(body).is_some_and(|m| m.name.is_empty());
        let first = frames.first()?;
        let body = &bytes[first.start + 5..first.end];
        if bytes[first.start] == b'P' && unnamed_parse(body) && parse_surely_read(body) {
            self.session.unnamed_behind = None;
            return None;
        }
        if !whole_batch {
            return self.session.unnamed_behind.take();
        }
        for r in frames {
            let body = &bytes[r.start + 5..r.end];
            let uses = match bytes[r.start] {
                b'P' => unnamed_parse(body),
                b'B' => bind_message(body).is_some_and(|b| b.statement.is_empty()),
                b'D' | b'C' => body == b"S\0",
                _ => false,
            };
            if uses {
                return self.session.unnamed_behind.take();
            }
        }
        None
    }
}

/// Whether PostgreSQL reads a Parse body without error (it fails one with trailing bytes, a
/// missing terminator or, for a UTF-8 client, a name or text that is not UTF-8, before it
/// looks at the statement). `false` also where PostgreSQL might read it (a negative type
/// count, a client in another encoding whose bytes are not UTF-8): the caller then only
/// does what is right either way. Reads the body in place: it runs on misses after a hit.
fn parse_surely_read(body: &[u8]) -> bool {
    let Some(p) = parse_message(body) else {
        return false;
    };
    let types_fit = match p.param_types {
        [hi, lo, oids @ ..] => {
            usize::try_from(i16::from_be_bytes([*hi, *lo])).is_ok_and(|n| oids.len() == 4 * n)
        }
        _ => false,
    };
    types_fit && std::str::from_utf8(p.name).is_ok() && std::str::from_utf8(p.text).is_ok()
}

/// Why a request with this plan is not served or stored: the plan's own reason first, then
/// the session's state, then a time literal in the text.
fn refusal(plan: &Plan, usable: Result<(), Refusal>, time_literal: bool) -> Result<(), Refusal> {
    plan.read.as_ref().map_err(|r| *r)?;
    usable?;
    if time_literal {
        return Err(Refusal::TimeLiteral);
    }
    Ok(())
}

/// Answers a simple Query outside a transaction block that was cancelled before it reached
/// the server (see [`crate::cancel::CancelSlot::hold`]): the error PostgreSQL gives, and
/// ReadyForQuery. Nothing of it ran.
async fn answer_cancelled<CW: AsyncWrite + Unpin>(
    client: &ClientWriter<CW>,
) -> Result<(), PumpError> {
    let mut out = BytesMut::with_capacity(96);
    crate::cancel::cancelled_error().encode_into(&mut out);
    out.extend_from_slice(&wire::backend::ready_for_query(TransactionStatus::Idle));
    let mut w = client.lock().await;
    w.write_all(&out).await.map_err(PumpError::Client)?;
    w.flush().await.map_err(PumpError::Client)
}

async fn send<W: AsyncWrite + Unpin>(server: &mut W, bytes: &[u8]) -> Result<(), PumpError> {
    server.write_all(bytes).await.map_err(PumpError::Server)?;
    server.flush().await.map_err(PumpError::Server)
}

/// A query string as text: borrowed when it is valid UTF-8 (checked by `str::from_utf8`,
/// which validates ASCII a word at a time; `from_utf8_lossy` walks it byte by byte, a tenth
/// of a cache-on miss), with replacement characters otherwise.
fn lossy_text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

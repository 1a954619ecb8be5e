//! The result cache under transaction pooling. A detached client's read (a simple Query, or
//! `[Parse] Bind [Describe] Execute Sync` at the unnamed portal) is looked up before any server
//! is taken: a hit is answered from memory and the client never touches the pool. A miss
//! takes a server as usual; before the request goes out, pgmemo brings the server's settings
//! in line with the client's, reads the client's context when it changed, plans the statement
//! (catalog queries run on that server while it is idle, so they can never abort a client's
//! transaction), and captures the response if it may be stored.
//!
//! While attached, every statement contributes its effects when its answer arrives; a COMMIT
//! (or the ReadyForQuery ending an autocommit statement) applies them before the client sees
//! it, a ROLLBACK drops them. Reads inside transaction blocks are neither served nor stored.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use wire::backend::TransactionStatus;
use wire::FrameHeader;

use super::link::{ClientState, Unnamed};
use crate::cache::capture::{Capture, Filling};
use crate::cache::catalog::Row;
use crate::cache::context::Context;
use crate::cache::flight::{self, Flight};
use crate::cache::plan::{Effects, Plan, Refusal};
use crate::cache::planner::{self, Catalog, Planning};
use crate::cache::DatabaseCache;
use crate::client::cached::messages::{
    bind_has_time_word, bind_message, cacheable_shape, parse_message, scan_batch, session_switch,
    short_batch, Batch,
};
use crate::pool::settings::sync_sql;
use crate::pool::{ParamTypes, PreparedStatement, ServerConn, ServerError};
use crate::shared::Shared;

/// Longest a miss waits (detached) for another session running the same query.
const FLIGHT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

const BIND_COMPLETE: &[u8] = b"2\0\0\0\x04";
const PARSE_AND_BIND_COMPLETE: &[u8] = b"1\0\0\0\x042\0\0\0\x04";
const READY_IDLE: &[u8] = b"Z\0\0\0\x05I";
/// Most plans of named statements a client keeps.
const MAX_STATEMENT_PLANS: usize = 1024;
/// Most statements planned after one transaction (each may cost a catalog round trip).
const MAX_PLANNED_AFTER: usize = 8;

/// A transaction-pooled client's cache state, for its whole session.
pub struct TxnCache {
    shared: Arc<Shared>,
    db: Arc<DatabaseCache>,
    /// The client's context and the version of its settings it was read for.
    context: Option<(u64, Arc<Context>)>,
    /// `SET pgmemo.cache`.
    enabled: bool,
    /// The cache is bypassed until the replication feed has applied the WAL up to here.
    bypass_until_lsn: u64,
    /// A commit left writes to the feed: the WAL position to wait for is still to be read.
    await_feed: bool,
    key: Vec<u8>,
    /// The key of the request being looked at, after its context prefix.
    tail: Vec<u8>,
    out: Vec<u8>,
    /// Effects of the statements answered so far in the transaction in progress.
    txn: Effects,
    /// The response being captured (the attachment's first request).
    capture: Option<Filling>,
    /// Effects of executing each bound portal.
    portals: HashMap<Bytes, Effects>,
    /// A `ROLLBACK` tag arrived since the last ReadyForQuery.
    rollback_seen: bool,
    /// The last ReadyForQuery said a transaction block was open.
    in_block: bool,
    /// Statements run while attached whose plans were made without the catalog.
    unplanned: Vec<String>,
    /// The fill this client leads (single flight), taken before its server.
    leading: Option<flight::FlightGuard>,
    /// The plan of the request being served.
    planned: Option<Planned>,
    /// Plans of the client's named statements, by statement id: an execution of a prepared
    /// statement is planned without even a memo lookup.
    statement_plans: HashMap<u64, Planned>,
}

/// A detached client's request as the cache sees it. Its key (after the context prefix) is
/// in [`TxnCache::tail`]; nothing here is allocated, so a hit allocates nothing.
pub struct Request {
    len: usize,
    kind: Kind,
    /// A text parameter reads the clock (`now`, `today`, ...).
    time_word: bool,
}

enum Kind {
    Query,
    Batch {
        describe: bool,
        statement: Statement,
    },
}

/// Where a batch's statement text is.
enum Statement {
    /// In the batch's Parse (of the unnamed statement), at this range of the client's buffer.
    Parse(std::ops::Range<usize>),
    /// The client's unnamed statement.
    Unnamed,
    /// A statement the client prepared by name.
    Named(Arc<PreparedStatement>),
}

/// The plan of the request being served, kept from the detached phase to the attached one and
/// to its effects, so a miss is planned once.
#[derive(Clone)]
struct Planned {
    context_id: u64,
    epoch: u64,
    text: Arc<str>,
    plan: Arc<Plan>,
    time_literal: bool,
}

/// What to do with a detached client's request.
pub enum Detached {
    /// Answered from the cache (these bytes), nothing else to do.
    Answered(Vec<u8>),
    /// Take a server; `Some`: a read the cache may answer or store once it has one.
    Attach(Option<Request>),
}

/// The attached server as the planner's catalog: it is idle, so a failing lookup harms no
/// transaction.
struct ServerCatalog<'s>(&'s mut ServerConn);

impl Catalog for ServerCatalog<'_> {
    type Error = ServerError;

    async fn ask(&mut self, sql: &str) -> Result<Option<Vec<Row>>, ServerError> {
        self.0.session.unnamed = None;
        match self.0.query_text_rows(sql).await {
            Ok(rows) => Ok(Some(rows)),
            Err(ServerError::Server(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl TxnCache {
    /// The cache state of a client of `db`.
    pub fn new(shared: Arc<Shared>, db: Arc<DatabaseCache>) -> TxnCache {
        TxnCache {
            shared,
            db,
            context: None,
            enabled: true,
            bypass_until_lsn: 0,
            await_feed: false,
            key: Vec::with_capacity(256),
            tail: Vec::with_capacity(256),
            out: Vec::with_capacity(1024),
            txn: Effects::default(),
            capture: None,
            portals: HashMap::new(),
            rollback_seen: false,
            in_block: false,
            unplanned: Vec::new(),
            leading: None,
            planned: None,
            statement_plans: HashMap::new(),
        }
    }

    /// The client's context when it was read for its current settings.
    fn context(&self, state: &ClientState) -> Option<&Arc<Context>> {
        self.context
            .as_ref()
            .filter(|(version, _)| *version == state.settings.version())
            .map(|(_, c)| c)
    }

    /// Whether results may be served and stored for this client now (a known context aside).
    fn usable(&self) -> Result<(), Refusal> {
        if !self.shared.config().cache.is_on() {
            return Err(Refusal::CacheOff);
        }
        if !self.enabled {
            return Err(Refusal::SessionOff);
        }
        if !self.db.feed.allows_cache() {
            return Err(Refusal::FeedDown);
        }
        if self.await_feed || self.bypass_until_lsn > self.db.feed.applied_lsn() {
            return Err(Refusal::AwaitingFeed);
        }
        Ok(())
    }

    /// Looks at the request at the front of `buf` while the client is detached: answers
    /// `SET pgmemo.cache` and hits, and says whether a server is needed.
    pub fn detached(
        &mut self,
        buf: &mut BytesMut,
        state: &mut ClientState,
        max_message: usize,
    ) -> Detached {
        self.planned = None;
        if state.status != TransactionStatus::Idle {
            return Detached::Attach(None);
        }
        let Some(request) = self.request(buf, state, max_message) else {
            return Detached::Attach(None);
        };
        if let Kind::Query = request.kind {
            if let Some(on) = may_switch(&self.tail)
                .then(|| session_switch(&self.tail))
                .flatten()
            {
                self.enabled = on;
                let _ = buf.split_to(request.len);
                let mut out = BytesMut::new();
                wire::backend::command_complete("SET", &mut out);
                return Detached::Answered([&out[..], READY_IDLE].concat());
            }
        }
        if self.usable().is_err() || self.context(state).is_none() {
            return Detached::Attach(Some(request));
        }
        if let Some(bytes) = self.hit(&request, state) {
            self.consume(buf, &request, state);
            return Detached::Answered(bytes);
        }
        Detached::Attach(Some(request))
    }

    /// Single flight, before a server is taken: when the memo says the request's result may
    /// be stored, either leads the fill of its key (the guard goes with the capture) or waits
    /// for the client already filling it and answers from its entry. `Some` on a hit.
    pub async fn join_flight(
        &mut self,
        buf: &mut BytesMut,
        request: &Request,
        state: &mut ClientState,
    ) -> Option<Vec<u8>> {
        self.leading = None;
        let context = self.context(state)?.clone();
        self.usable().ok()?;
        let planned = match self.statement_planned(request, &context) {
            Some(p) => p,
            None => {
                let text: Arc<str> = Self::text(request, buf, state)?.into();
                let config = self.shared.config();
                let planning =
                    Planning::in_context(&self.db, &self.shared.cache, &config, Some(&context));
                let (plan, time_literal) = planner::plan_without_catalog(&planning, &text);
                if !plan.complete {
                    return None;
                }
                let planned = Planned {
                    context_id: context.id,
                    epoch: self.db.plans_epoch(),
                    text,
                    plan,
                    time_literal,
                };
                self.remember_statement_plan(request, &planned);
                planned
            }
        };
        let cacheable = planned.plan.read.is_ok()
            && !planned.time_literal
            && !request.time_word
            && planned.plan.query.worth_single_flight();
        self.planned = Some(planned);
        if !cacheable {
            return None;
        }
        self.make_key(request, state)?;
        match self.shared.cache.flights.join(&self.key) {
            Flight::Leader(guard) => {
                self.leading = Some(guard);
                None
            }
            Flight::Follower(done) => {
                flight::wait(done, FLIGHT_WAIT).await;
                self.shared
                    .cache
                    .stats
                    .flight_waits
                    .fetch_add(1, Ordering::Relaxed);
                let bytes = self.hit(request, state)?;
                self.consume(buf, request, state);
                Some(bytes)
            }
        }
    }

    /// The request at the front of `buf`, if it is one the cache may answer; its key tail
    /// goes to `self.tail`.
    fn request(
        &mut self,
        buf: &BytesMut,
        state: &ClientState,
        max_message: usize,
    ) -> Option<Request> {
        let header = FrameHeader::peek(buf, max_message).ok()??;
        let tail = &mut self.tail;
        tail.clear();
        match header.tag {
            b'Q' => {
                let text = buf.get(5..header.frame_len.checked_sub(1)?)?;
                tail.extend_from_slice(text);
                Some(Request {
                    len: header.frame_len,
                    kind: Kind::Query,
                    time_word: false,
                })
            }
            b'P' | b'B' => {
                let Batch::Complete(len) = scan_batch(buf, max_message) else {
                    return None;
                };
                let bytes = &buf[..len];
                let (frames, n) = short_batch(bytes)?;
                let shape = cacheable_shape(bytes, &frames[..n])?;
                let bind = &bytes[frames[usize::from(shape.parse)].clone()];
                let bind = bind_message(&bind[5..])?;
                // The statement: parsed in this batch (unnamed only: a named Parse must
                // reach a server), the client's unnamed one, or one it prepared by name.
                let statement = if shape.parse {
                    let m = parse_message(&bytes[frames[0].start + 5..frames[0].end])?;
                    if !m.name.is_empty() {
                        return None;
                    }
                    identity(tail, m.text, m.param_types);
                    Statement::Parse(frames[0].clone())
                } else if bind.statement.is_empty() {
                    let u = state.unnamed.as_ref().filter(|u| u.outcome.is_none())?;
                    let m = parse_message(&u.parse[5..])?;
                    identity(tail, m.text, m.param_types);
                    Statement::Unnamed
                } else {
                    let name = std::str::from_utf8(bind.statement).ok()?;
                    if state.effects.contains_key(name) {
                        return None;
                    }
                    let s = state.statements.get(name)?;
                    let ParamTypes::Oids(oids) = &s.key.types else {
                        return None;
                    };
                    tail.extend_from_slice(&(s.key.text.len() as u32).to_le_bytes());
                    tail.extend_from_slice(s.key.text.as_bytes());
                    tail.extend_from_slice(&(oids.len() as i16).to_be_bytes());
                    for oid in oids.iter() {
                        tail.extend_from_slice(&oid.to_be_bytes());
                    }
                    Statement::Named(Arc::clone(s))
                };
                tail.extend_from_slice(bind.tail);
                Some(Request {
                    len,
                    kind: Kind::Batch {
                        describe: shape.describe,
                        statement,
                    },
                    time_word: bind_has_time_word(&bind),
                })
            }
            _ => None,
        }
    }

    /// The statement text of `request` (still at the front of `buf`).
    fn text(request: &Request, buf: &[u8], state: &ClientState) -> Option<String> {
        let text: &[u8] = match &request.kind {
            Kind::Query => buf.get(5..request.len - 1)?,
            Kind::Batch { statement, .. } => match statement {
                Statement::Parse(r) => parse_message(buf.get(r.start + 5..r.end)?)?.text,
                Statement::Unnamed => {
                    let u = state.unnamed.as_ref()?;
                    return parse_message(&u.parse[5..])
                        .and_then(|m| std::str::from_utf8(m.text).ok().map(str::to_owned));
                }
                Statement::Named(s) => return Some(s.key.text.to_string()),
            },
        };
        std::str::from_utf8(text).ok().map(str::to_owned)
    }

    /// Builds the key of `request` in `self.key`; `None` without a current context.
    fn make_key(&mut self, request: &Request, state: &ClientState) -> Option<()> {
        let ctx_id = self.context(state)?.id;
        self.key.clear();
        self.key.extend_from_slice(&self.db.id.to_le_bytes());
        self.key.extend_from_slice(&ctx_id.to_le_bytes());
        self.key.push(match request.kind {
            Kind::Query => b'Q',
            Kind::Batch { .. } => b'E',
        });
        self.key.extend_from_slice(&self.tail);
        Some(())
    }

    /// The answer to `request` from the store, with its ReadyForQuery.
    fn hit(&mut self, request: &Request, state: &ClientState) -> Option<Vec<u8>> {
        self.make_key(request, state)?;
        let cache = &self.shared.cache;
        let entry = cache.store.get(&self.key)?;
        let (prefix, describe): (&[u8], bool) = match &request.kind {
            Kind::Query => (b"", true),
            Kind::Batch {
                describe,
                statement,
            } => (
                if matches!(statement, Statement::Parse(_)) {
                    PARSE_AND_BIND_COMPLETE
                } else {
                    BIND_COMPLETE
                },
                *describe,
            ),
        };
        if !entry.is_servable(Instant::now) || (describe && entry.description.is_none()) {
            return None;
        }
        let out = &mut self.out;
        out.clear();
        out.extend_from_slice(prefix);
        if let Some(d) = entry.description.as_ref().filter(|_| describe) {
            out.extend_from_slice(d);
        }
        out.extend_from_slice(&entry.rows);
        out.extend_from_slice(READY_IDLE);
        cache.stats.hits.fetch_add(1, Ordering::Relaxed);
        cache
            .stats
            .saved_micros
            .fetch_add(entry.miss_micros, Ordering::Relaxed);
        entry.query.hit(entry.miss_micros);
        Some(std::mem::take(out))
    }

    /// Gives back the buffer a hit's answer was written in.
    pub fn recycle(&mut self, mut out: Vec<u8>) {
        out.clear();
        self.out = out;
    }

    /// Removes an answered request from the client's buffer; a Parse of the unnamed
    /// statement answered with it becomes the client's unnamed statement (unless it already
    /// is: drivers parse the same text every time).
    fn consume(&mut self, buf: &mut BytesMut, request: &Request, state: &mut ClientState) {
        if let Kind::Batch {
            statement: Statement::Parse(r),
            ..
        } = &request.kind
        {
            let parse = &buf[r.clone()];
            let same = state
                .unnamed
                .as_ref()
                .is_some_and(|u| u.outcome.is_none() && u.parse[..] == *parse);
            if !same {
                state.parses += 1;
                state.unnamed = Some(Unnamed {
                    seq: state.parses,
                    parse: Bytes::copy_from_slice(parse),
                    outcome: None,
                });
            }
        }
        let _ = buf.split_to(request.len);
    }

    /// Readies an attached server for `request`: its settings, the client's context, the
    /// WAL position to wait for, the statement's plan. Returns the answer when the request
    /// turned out to be a hit after all (the context was read only now); otherwise the
    /// response is captured if it may be stored.
    pub async fn attached(
        &mut self,
        request: Option<Request>,
        server: &mut ServerConn,
        state: &mut ClientState,
        buf: &mut BytesMut,
    ) -> Option<Vec<u8>> {
        self.txn = Effects::default();
        self.portals.clear();
        self.capture = None;
        self.rollback_seen = false;
        self.in_block = false;
        self.unplanned.clear();
        // Dropped (ending the flight) on every way out but the capture.
        let mut leading = self.leading.take();
        let request = request?;
        if self.usable().is_err() && !self.await_feed {
            return None;
        }
        let had_context = self.context(state).is_some();
        if !had_context || self.await_feed {
            self.read_session(server, state).await.ok()?;
        }
        let usable = self.usable();
        if usable.is_ok() && !had_context {
            if let Some(bytes) = self.hit(&request, state) {
                self.consume(buf, &request, state);
                return Some(bytes);
            }
        }
        let context = self.context(state)?.clone();
        let epoch = self.db.plans_epoch();
        let known = self
            .planned
            .as_ref()
            .filter(|p| p.context_id == context.id && p.epoch == epoch);
        let (plan, time_literal) = match known {
            Some(p) => (Arc::clone(&p.plan), p.time_literal),
            None => {
                let text: Arc<str> = Self::text(&request, buf, state)?.into();
                let config = self.shared.config();
                let planning =
                    Planning::in_context(&self.db, &self.shared.cache, &config, Some(&context));
                let mut catalog = ServerCatalog(server);
                let (plan, time_literal) = planner::plan(&planning, &text, Some(&mut catalog))
                    .await
                    .ok()?;
                if plan.complete {
                    let planned = Planned {
                        context_id: context.id,
                        epoch,
                        text,
                        plan: Arc::clone(&plan),
                        time_literal,
                    };
                    self.remember_statement_plan(&request, &planned);
                    self.planned = Some(planned);
                }
                (plan, time_literal)
            }
        };
        let refusal = refusal(&plan, usable, time_literal || request.time_word, &context);
        if let Err(r) = refusal {
            self.shared.cache.stats.refused(r);
            plan.query.miss(Some(r));
            return None;
        }
        let read = plan.read.as_ref().ok()?;
        self.make_key(&request, state)?;
        let mut capture = Capture::for_read(
            &self.key,
            read,
            &plan.query,
            &self.db,
            &self.shared.config(),
        );
        // Led since before the server was taken, or from now on (a follower then waits for
        // this fill only if it comes later).
        capture.flight = leading.take().or_else(|| {
            if !plan.query.worth_single_flight() {
                return None;
            }
            match self.shared.cache.flights.join(&capture.key) {
                Flight::Leader(guard) => Some(guard),
                Flight::Follower(_) => None,
            }
        });
        self.shared
            .cache
            .stats
            .misses
            .fetch_add(1, Ordering::Relaxed);
        plan.query.miss(None);
        self.capture = Some(Filling::new(capture));
        None
    }

    /// Brings the server's settings in line with the client's, then reads what the cache
    /// needs from it: the client's context if its settings changed, the WAL position after a
    /// commit left to the feed.
    async fn read_session(
        &mut self,
        server: &mut ServerConn,
        state: &ClientState,
    ) -> Result<(), ServerError> {
        server.session.unnamed = None;
        if let Some(sql) = sync_sql(&state.settings, &mut server.session.settings) {
            if let Err(e) = server.simple_query(&sql).await {
                server.session.settings.unknown = true;
                return Err(e);
            }
        }
        if self.context(state).is_none() {
            let row = server
                .query_text_rows(&crate::cache::context::context_query())
                .await?
                .into_iter()
                .next();
            if let Some(row) = row {
                let values = row.into_iter().map(Option::unwrap_or_default).collect();
                let context = self.db.contexts.intern(values);
                self.context = Some((state.settings.version(), context));
            }
        }
        if self.await_feed {
            let rows = server
                .query_text_rows(
                    "/* pgmemo wal position */ SELECT pg_catalog.pg_current_wal_insert_lsn()",
                )
                .await?;
            let lsn = rows
                .into_iter()
                .next()
                .and_then(|r| r.into_iter().next().flatten())
                .and_then(|t| t.parse::<wire::replication::Lsn>().ok());
            if let Some(lsn) = lsn {
                self.bypass_until_lsn = self.bypass_until_lsn.max(lsn.0);
                self.await_feed = false;
            }
        }
        Ok(())
    }

    /// The kept plan of a request executing one of the client's named statements.
    fn statement_planned(&self, request: &Request, context: &Context) -> Option<Planned> {
        let Kind::Batch {
            statement: Statement::Named(s),
            ..
        } = &request.kind
        else {
            return None;
        };
        let epoch = self.db.plans_epoch();
        self.statement_plans
            .get(&s.id)
            .filter(|p| p.context_id == context.id && p.epoch == epoch)
            .cloned()
    }

    /// Keeps the plan of a request executing a named statement.
    fn remember_statement_plan(&mut self, request: &Request, planned: &Planned) {
        if let Kind::Batch {
            statement: Statement::Named(s),
            ..
        } = &request.kind
        {
            if self.statement_plans.len() >= MAX_STATEMENT_PLANS {
                self.statement_plans.clear();
            }
            self.statement_plans.insert(s.id, planned.clone());
        }
    }

    /// The context id plans may be memoized under while attached: the settings are the
    /// ones the context was read for and no SET is pending in the transaction.
    fn trusted_context(&self, state: &ClientState, settings_pending: bool) -> Option<&Context> {
        if settings_pending {
            return None;
        }
        self.context(state).map(|c| &**c)
    }

    /// What executing `text` does (from the memo, or conservatively without the catalog).
    /// A statement the memo does not know is planned with the catalog after the transaction,
    /// so that its next run invalidates only what it writes.
    /// `statement`: the id of the client's named statement whose text this is.
    pub fn effects_of(
        &mut self,
        text: &str,
        statement: Option<u64>,
        state: &ClientState,
        settings_pending: bool,
    ) -> Effects {
        let context = self.trusted_context(state, settings_pending);
        let context_id = context.map(|c| c.id);
        let epoch = self.db.plans_epoch();
        if let Some(p) = self
            .planned
            .as_ref()
            .filter(|p| Some(p.context_id) == context_id && p.epoch == epoch && *p.text == *text)
        {
            return p.plan.effects.clone();
        }
        if let Some(p) = statement
            .and_then(|id| self.statement_plans.get(&id))
            .filter(|p| Some(p.context_id) == context_id && p.epoch == epoch)
        {
            return p.plan.effects.clone();
        }
        let config = self.shared.config();
        let planning = Planning::in_context(&self.db, &self.shared.cache, &config, context);
        let (plan, _) = planner::plan_without_catalog(&planning, text);
        if !plan.complete
            && context_id.is_some()
            && self.unplanned.len() < MAX_PLANNED_AFTER
            && !self.unplanned.iter().any(|t| t == text)
        {
            self.unplanned.push(text.to_owned());
        }
        plan.effects.clone()
    }

    /// Plans, with the catalog, the statements the transaction ran that the memo did not know
    /// (the server is idle again and still attached). One round trip per new statement shape,
    /// once.
    pub async fn plan_after(&mut self, server: &mut ServerConn, state: &ClientState) {
        if self.unplanned.is_empty() {
            return;
        }
        let texts = std::mem::take(&mut self.unplanned);
        let Some(context) = self.context(state).cloned() else {
            return;
        };
        let config = self.shared.config();
        let planning = Planning::in_context(&self.db, &self.shared.cache, &config, Some(&context));
        let mut catalog = ServerCatalog(server);
        for text in &texts {
            if planner::plan(&planning, text, Some(&mut catalog))
                .await
                .is_err()
            {
                break;
            }
        }
    }

    /// A Bind: executing `portal` will run `text`.
    pub fn bound(&mut self, portal: &[u8], effects: Effects) {
        match self.portals.get_mut(portal) {
            Some(slot) => *slot = effects,
            None => {
                self.portals.insert(Bytes::copy_from_slice(portal), effects);
            }
        }
    }

    /// The effects of executing `portal` (as if it could write anything when unknown).
    pub fn portal_effects(&self, portal: &[u8]) -> Effects {
        self.portals.get(portal).cloned().unwrap_or(Effects {
            database_wide: true,
            ..Effects::default()
        })
    }

    /// A statement's answer arrived: it ran (or began to), so its effects count.
    pub fn answered(&mut self, effects: &Effects) {
        self.txn.merge(effects);
    }

    /// A COMMIT (or the end of an autocommit statement): the transaction's writes are
    /// visible to everyone, so results depending on them go, before the client learns of it.
    pub fn committed(&mut self) {
        self.rollback_seen = false;
        if self.txn.is_empty() {
            return;
        }
        let e = std::mem::take(&mut self.txn);
        if crate::invalidate::proxy::apply_commit(&e, &self.shared, &self.db) {
            self.await_feed = true;
        }
    }

    /// A statement completed with the tag `ROLLBACK`: a ROLLBACK, or a ROLLBACK TO SAVEPOINT
    /// (same tag). Which one shows at the next ReadyForQuery.
    pub fn rollback_completed(&mut self) {
        self.rollback_seen = true;
    }

    /// ReadyForQuery. Idle after a transaction block ended by a ROLLBACK: its writes never
    /// happened. Idle otherwise: an autocommit statement (or anything pgmemo cannot tell
    /// from one, such as `INSERT ...; ROLLBACK` in one Query) committed.
    pub fn ready(&mut self, status: TransactionStatus) {
        if status == TransactionStatus::Idle {
            if self.rollback_seen && self.in_block {
                self.txn = Effects::default();
            } else {
                self.committed();
            }
        }
        self.in_block = status != TransactionStatus::Idle;
        self.rollback_seen = false;
    }

    /// One message of the server's answer, as forwarded to the client. `ready`: it is a
    /// ReadyForQuery with this status, which ends the captured response.
    pub fn observe(&mut self, tag: u8, frame: &[u8], ready: Option<TransactionStatus>) {
        let Some(filling) = self.capture.as_mut() else {
            return;
        };
        match ready {
            None => {
                if !filling.fits(frame.len()) {
                    filling.abort();
                }
                filling.add(tag, frame);
            }
            Some(status) => {
                let filling = self.capture.take().expect("checked");
                if status == TransactionStatus::Idle {
                    filling.finish(false, &self.shared.cache, &self.shared.upstream_time);
                }
            }
        }
    }

    /// The attachment ended without the client seeing the end of its transaction (it left,
    /// the server failed): whatever it may have committed goes from the cache.
    pub fn abandoned(&mut self) {
        self.capture = None;
        self.committed();
    }
}

/// `len`, text and parameter types as a session-mode key names a statement, so that both
/// pool modes share entries.
fn identity(key: &mut Vec<u8>, text: &[u8], param_types: &[u8]) {
    key.extend_from_slice(&(text.len() as u32).to_le_bytes());
    key.extend_from_slice(text);
    key.extend_from_slice(param_types);
}

/// Whether a query text may be `SET`/`RESET pgmemo.cache` (checked fully only then).
fn may_switch(text: &[u8]) -> bool {
    let text = text.trim_ascii_start();
    [&b"set"[..], b"reset"].iter().any(|w| {
        text.get(..w.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(w))
    })
}

/// Why a request with this plan is not stored.
fn refusal(
    plan: &Plan,
    usable: Result<(), Refusal>,
    time_literal: bool,
    context: &Context,
) -> Result<(), Refusal> {
    plan.read.as_ref().map_err(|r| *r)?;
    usable?;
    if context.snapshot_by_default() {
        return Err(Refusal::SnapshotIsolation);
    }
    if time_literal {
        return Err(Refusal::TimeLiteral);
    }
    Ok(())
}

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
//! it, a ROLLBACK drops them. Inside a transaction block that has not written, a simple Query
//! or an extended-protocol read may be answered from the cache (`hit_in_block`,
//! `batch_hit_in_block`), and stored when it missed and its plan is memoized. Reads pipelined
//! behind the first request are served or captured the same way (`pipeline`).

mod effects;
mod pipeline;
mod request;

pub use pipeline::Pipelined;
pub use request::Request;
use request::{may_switch, Kind};

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use wire::backend::TransactionStatus;

use super::link::ClientState;
use crate::cache::capture::{Capture, Filling};
use crate::cache::catalog::Row;
use crate::cache::context::{self, Context};
use crate::cache::feed;
use crate::cache::flight::{self, Flight};
use crate::cache::plan::{Effects, Plan, Refusal};
use crate::cache::planner::{self, Catalog, Planning};
use crate::cache::stats::QueryStats;
use crate::cache::DatabaseCache;
use crate::client::cached::messages::session_switch;
use crate::config::Config;
use crate::hash::Map;
use crate::pool::settings::sync_sql;
use crate::pool::{ServerConn, ServerError};
use crate::shared::Shared;

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
    /// The configuration in force, refreshed by the session once per request
    /// ([`TxnCache::configure`]) rather than loaded at every use.
    config: Arc<Config>,
    /// `Shared::config_generation` when `config` was read.
    generation: u64,
    /// The name the client gave its database: `[databases.NAME]` may turn the cache off.
    client_database: String,
    /// `cache` for the client's database under `config`.
    on: bool,
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
    /// Reused for the plan memo's keys.
    memo_key: Vec<u8>,
    /// The key of the request being looked at, after its context prefix.
    tail: Vec<u8>,
    out: Vec<u8>,
    /// Effects of the statements answered so far in the transaction in progress.
    txn: Effects,
    /// The responses being captured, in request order: the attachment's first request, a
    /// read in a transaction block that has not written, reads pipelined behind it.
    fills: VecDeque<Fill>,
    /// Every request sent during this attachment is a read that cannot change the
    /// transaction, the settings or any data: a read pipelined behind them runs in the state
    /// known now (see `pipeline`).
    inert_so_far: bool,
    /// The attachment's first request, which `attached` looked at, is still to be sent.
    first_unsent: bool,
    /// Lent to each capture in turn (see `Filling`).
    scratch: Vec<u8>,
    /// What executing each bound portal does.
    portals: Map<Bytes, BoundPortal>,
    /// The read executed first in the batch in progress, counted as refused if another
    /// Execute follows in the same batch.
    first_execute: Option<Arc<QueryStats>>,
    /// A `ROLLBACK` tag arrived since the last ReadyForQuery.
    rollback_seen: bool,
    /// The effects of a request that rolls back and also writes (`ROLLBACK; UPDATE ...` in
    /// one Query, or an Execute of a write after one of ROLLBACK in one batch): which of its
    /// statements came after the ROLLBACK is not always known, so its writes count as
    /// committed even when the block is rolled back.
    rollback_request: Option<Effects>,
    /// The last ReadyForQuery said a transaction block was open.
    in_block: bool,
    /// The attachment ended with a request that may write unanswered (see
    /// [`TxnCache::unanswered`]).
    writes_unanswered: bool,
    /// Statements run while attached whose plans were made without the catalog.
    unplanned: Vec<String>,
    /// The fill this client leads (single flight), taken before its server.
    leading: Option<flight::FlightGuard>,
    /// The plan of the request being served.
    planned: Option<Planned>,
    /// Plans of the client's named statements, by statement id: an execution of a prepared
    /// statement is planned without even a memo lookup.
    statement_plans: Map<u64, Planned>,
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

/// What executing a bound portal does, as known when it was bound.
#[derive(Clone)]
struct BoundPortal {
    effects: Effects,
    /// The statement's counters, when it is a read the cache could store in a batch it keys
    /// (an execution in any other batch counts as refused).
    read: Option<Arc<QueryStats>>,
}

/// A response being captured.
struct Fill {
    /// ReadyForQuery messages the client gets before this response begins (the answers to
    /// the requests sent before it).
    ahead: usize,
    filling: Filling,
    /// The status of the ReadyForQuery that ends the response cleanly: `Idle` outside a
    /// transaction block, `InTransaction` for a read in a block.
    ends: TransactionStatus,
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
        match self.0.query_text_rows(sql).await {
            Ok(rows) => Ok(Some(rows)),
            Err(ServerError::Server(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl TxnCache {
    /// The cache state of a client of `db`.
    pub fn new(shared: Arc<Shared>, db: Arc<DatabaseCache>, client_database: &str) -> TxnCache {
        let generation = shared.config_generation();
        let config = shared.config().clone();
        TxnCache {
            generation,
            on: config.cache_on_for(client_database),
            client_database: client_database.to_owned(),
            config,
            shared,
            db,
            context: None,
            enabled: true,
            bypass_until_lsn: 0,
            await_feed: false,
            key: Vec::with_capacity(256),
            memo_key: Vec::new(),
            tail: Vec::with_capacity(256),
            out: Vec::with_capacity(1024),
            txn: Effects::default(),
            fills: VecDeque::new(),
            inert_so_far: false,
            first_unsent: false,
            scratch: Vec::new(),
            portals: Map::default(),
            first_execute: None,
            rollback_seen: false,
            rollback_request: None,
            in_block: false,
            writes_unanswered: false,
            unplanned: Vec::new(),
            leading: None,
            planned: None,
            statement_plans: Map::default(),
        }
    }

    /// Takes the configuration in force, read at `generation` (the session checks for a
    /// reload once per request).
    pub fn configure(&mut self, config: &Arc<Config>, generation: u64) {
        self.generation = generation;
        if !Arc::ptr_eq(&self.config, config) {
            self.config = Arc::clone(config);
            self.on = config.cache_on_for(&self.client_database);
        }
    }

    /// Planning in `context` with the configuration in force, known current at `epoch` (from
    /// [`Self::plans_epoch`]).
    fn planning(&self, context: Option<&Context>, epoch: u64) -> Planning<'_> {
        Planning::in_context(&self.db, &self.shared.cache, &self.config, context, epoch)
    }

    /// The database's plans epoch, with the configuration brought up to date after reading
    /// it: the order [`Planning::epoch`] needs, since a reload stores the new configuration
    /// before it drops the memo (a plan made under the old table lists must not be memoized).
    fn plans_epoch(&mut self) -> u64 {
        let epoch = self.db.plans_epoch();
        let generation = self.shared.config_generation();
        if generation != self.generation {
            let config = Arc::clone(&self.shared.config());
            self.configure(&config, generation);
        }
        epoch
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
        if !self.on {
            return Err(Refusal::CacheOff);
        }
        if !self.enabled {
            return Err(Refusal::SessionOff);
        }
        if !self.db.feed.allows_cache() {
            return Err(Refusal::FeedDown);
        }
        if !self.db.sees_relayed_writes() {
            return Err(Refusal::UntrackedSessions);
        }
        if self.await_feed || self.db.feed.awaits(self.bypass_until_lsn) {
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
        if let Some(bytes) = self.hit(&request, buf, state, TransactionStatus::Idle) {
            self.consume(buf, &request, state);
            return Detached::Answered(bytes);
        }
        Detached::Attach(Some(request))
    }

    /// The request [`TxnCache::detached`] passed on is answered without running it (cancelled
    /// while it waited): a fill it leads or captures ends, so that the clients waiting for it
    /// go on.
    pub fn forget_request(&mut self) {
        self.leading = None;
        self.planned = None;
        self.fills.clear();
        self.first_unsent = false;
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
        let planned = self.plan_without_lookup(request, &context, || {
            Self::text(request, buf, state).map(Arc::from)
        })?;
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
                self.shared.cache.wait_for_flight(done).await;
                let bytes = self.hit(request, buf, state, TransactionStatus::Idle)?;
                self.consume(buf, request, state);
                Some(bytes)
            }
        }
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
        self.fills.clear();
        self.inert_so_far = false;
        self.first_unsent = false;
        self.rollback_seen = false;
        self.rollback_request = None;
        self.in_block = false;
        self.unplanned.clear();
        // Dropped (ending the flight) on every way out but the capture.
        let mut leading = self.leading.take();
        let request = request?;
        if let Err(r) = self.usable() {
            if !self.await_feed {
                self.shared.cache.stats.refused(r);
                return None;
            }
        }
        let had_context = self.context(state).is_some();
        if !had_context || self.await_feed {
            self.read_session(server, state).await.ok()?;
        }
        let usable = self.usable();
        if usable.is_ok() && !had_context {
            if let Some(bytes) = self.hit(&request, buf, state, TransactionStatus::Idle) {
                self.consume(buf, &request, state);
                return Some(bytes);
            }
        }
        let context = self.context(state)?.clone();
        let epoch = self.plans_epoch();
        let known = self
            .planned
            .as_ref()
            .filter(|p| p.context_id == context.id && p.epoch == epoch);
        let (plan, time_literal) = match known {
            Some(p) => (Arc::clone(&p.plan), p.time_literal),
            None => {
                let text: Arc<str> = Self::text(&request, buf, state)?.into();
                // The catalog resolves names with the server's search_path: the client's,
                // not whatever the server's last client left.
                sync_server(server, state).await.ok()?;
                let planning = self.planning(Some(&context), epoch);
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
        self.first_unsent = true;
        self.inert_so_far = plan.complete && plan.read.is_ok() && plan.effects.is_empty();
        let refusal = refusal(&plan, usable, time_literal || request.time_word, &context);
        if let Err(r) = refusal {
            self.shared.cache.stats.refused_query(r, &plan.query);
            return None;
        }
        self.make_key(&request, state)?;
        let formats = request.statement_formats(buf);
        self.start_capture(&plan, leading.take(), TransactionStatus::Idle, formats, 0);
        None
    }

    /// A miss of a read whose `plan` allows storing it, keyed by `self.key`: counted, and
    /// captured unless admission says no. The fill is the one `leading` leads (since before
    /// the server was taken), or one this client leads from now on; when another client
    /// already fills the key, its response is captured all the same and the first to end
    /// is stored. The capture is stored when its response ends with ReadyForQuery(`ends`).
    /// `statement_formats`: the request described its statement (see `Capture`). `ahead`:
    /// the ReadyForQuery messages that end the responses before this one.
    fn start_capture(
        &mut self,
        plan: &Plan,
        leading: Option<flight::FlightGuard>,
        ends: TransactionStatus,
        statement_formats: Option<Box<[u8]>>,
        ahead: usize,
    ) {
        let Ok(read) = plan.read.as_ref() else {
            return;
        };
        let cache = &self.shared.cache;
        cache.stats.missed(&plan.query);
        if !cache.admits(&self.key, &plan.query, &self.config) {
            // A miss all the same, just not stored.
            return;
        }
        let mut capture = Capture::for_read(&self.key, read, &plan.query, &self.db, &self.config);
        // DDL since the plan was made (its invalidation may already be behind the snapshot).
        if self.db.plans_epoch() != plan.epoch {
            return;
        }
        capture.statement_formats = statement_formats;
        // A follower waits for this fill only if it comes later.
        capture.flight = leading.or_else(|| {
            if !plan.query.worth_single_flight() {
                return None;
            }
            match cache.flights.join(&capture.key) {
                Flight::Leader(guard) => Some(guard),
                Flight::Follower(_) => None,
            }
        });
        self.fills.push_back(Fill {
            ahead,
            filling: Filling::new(capture, std::mem::take(&mut self.scratch)),
            ends,
        });
    }

    /// Brings the server's settings in line with the client's, then reads what the cache
    /// needs from it: the client's context if its settings changed, the WAL position after a
    /// commit left to the feed.
    async fn read_session(
        &mut self,
        server: &mut ServerConn,
        state: &ClientState,
    ) -> Result<(), ServerError> {
        sync_server(server, state).await?;
        if self.context(state).is_none() {
            self.shared
                .cache
                .stats
                .context_reads
                .fetch_add(1, Ordering::Relaxed);
            if let Some(context) =
                context::read(&mut ServerCatalog(server), &self.db.contexts).await?
            {
                self.context = Some((state.settings.version(), context));
            }
        }
        if self.await_feed {
            if let Some(lsn) = feed::wal_insert_position(&mut ServerCatalog(server)).await? {
                self.bypass_until_lsn = self.bypass_until_lsn.max(lsn);
                self.await_feed = false;
            }
        }
        Ok(())
    }
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
    if context.hears_log_messages() {
        return Err(Refusal::LogMessages);
    }
    if time_literal {
        return Err(Refusal::TimeLiteral);
    }
    Ok(())
}

/// Brings the server's settings in line with the client's before pgmemo asks the server
/// anything on the client's behalf (its context, the catalog for its statements).
pub(super) async fn sync_server(
    server: &mut ServerConn,
    state: &ClientState,
) -> Result<(), ServerError> {
    if let Some(sql) = sync_sql(&state.settings, &mut server.session.settings) {
        if let Err(e) = server.simple_query(&sql).await {
            server.session.settings.unknown = true;
            return Err(e);
        }
    }
    Ok(())
}

//! While attached: what each statement the client runs will invalidate (from its kept or
//! memoized plan), applied at COMMIT and dropped at ROLLBACK, the captures of responses (the
//! first request's, a read's in a block, pipelined reads'), and the planning of new statements
//! once the transaction is over.

use std::sync::Arc;

use crate::cache::DatabaseCache;
use crate::shared::Shared;

use bytes::Bytes;
use wire::backend::TransactionStatus;

use super::request::{Kind, Request, Statement};
use super::{
    BoundPortal, Planned, ServerCatalog, TxnCache, MAX_PLANNED_AFTER, MAX_STATEMENT_PLANS,
};
use crate::cache::context::Context;
use crate::cache::plan::{Effects, Refusal};
use crate::cache::planner;
use crate::client::transaction::link::ClientState;
use crate::pool::ServerConn;

impl TxnCache {
    /// The kept plan of a request executing one of the client's named statements.
    pub(super) fn statement_planned(
        &self,
        request: &Request,
        context: &Context,
    ) -> Option<Planned> {
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

    /// The plan of `request` as far as it is known without a catalog lookup (none can run
    /// before a server is taken, nor inside the client's block): kept for the client's named
    /// statement, memoized for the statement's shape, or complete without the catalog (a new
    /// one is then kept for the named statement). `text` gives the statement's text, read only
    /// when the named statement's plan is not kept. `None` when the plan needs the catalog.
    pub(super) fn plan_without_lookup(
        &mut self,
        request: &Request,
        context: &Context,
        text: impl FnOnce() -> Option<Arc<str>>,
    ) -> Option<Planned> {
        if let Some(p) = self.statement_planned(request, context) {
            return Some(p);
        }
        let text = text()?;
        let epoch = self.plans_epoch();
        // The memo's key is built in the client's own buffer (lent out while `planning`
        // borrows the rest): no allocation when the memo knows the shape.
        let mut memo_key = std::mem::take(&mut self.memo_key);
        let planning = self.planning(Some(context), epoch);
        let (plan, time_literal) = planner::memoized_with(&planning, &text, &mut memo_key)
            .unwrap_or_else(|| planner::plan_without_catalog(&planning, &text));
        self.memo_key = memo_key;
        if !plan.complete {
            return None;
        }
        let planned = Planned {
            context_id: context.id,
            epoch,
            text,
            plan,
            time_literal,
        };
        self.remember_statement_plan(request, &planned);
        Some(planned)
    }

    /// Keeps the plan of a request executing a named statement.
    pub(super) fn remember_statement_plan(&mut self, request: &Request, planned: &Planned) {
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
    pub(super) fn trusted_context(
        &self,
        state: &ClientState,
        settings_pending: bool,
    ) -> Option<&Context> {
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
        let planned = self.portal_plan(text, statement, state, settings_pending);
        if let (Some(query), Some(reason)) = (&planned.read, self.refused_in_block(state)) {
            self.shared.cache.stats.refused_query(reason, query);
        }
        planned.effects
    }

    /// Why a cacheable read run now is neither served nor stored, when the client is inside
    /// a transaction block the cache may not serve: such reads are counted under the block's
    /// reason (reads in a block it may serve are counted when looked up, reads between
    /// transactions by the lookup).
    fn refused_in_block(&self, state: &ClientState) -> Option<Refusal> {
        if state.status == TransactionStatus::Idle {
            return None;
        }
        self.block_refusal(state).err()
    }

    /// [`Self::effects_of`], and the statement's counters when it is a cacheable read.
    fn portal_plan(
        &mut self,
        text: &str,
        statement: Option<u64>,
        state: &ClientState,
        settings_pending: bool,
    ) -> BoundPortal {
        let known = |p: &Planned| BoundPortal {
            effects: p.plan.effects.clone(),
            read: p.plan.read.is_ok().then(|| Arc::clone(&p.plan.query)),
        };
        let epoch = self.plans_epoch();
        let context = self.trusted_context(state, settings_pending);
        let context_id = context.map(|c| c.id);
        if let Some(p) = self
            .planned
            .as_ref()
            .filter(|p| Some(p.context_id) == context_id && p.epoch == epoch && *p.text == *text)
        {
            return known(p);
        }
        if let Some(p) = statement
            .and_then(|id| self.statement_plans.get(&id))
            .filter(|p| Some(p.context_id) == context_id && p.epoch == epoch)
        {
            return known(p);
        }
        let planning = self.planning(context, epoch);
        let (plan, _) = planner::plan_without_catalog(&planning, text);
        if !plan.complete
            && context_id.is_some()
            && self.unplanned.len() < MAX_PLANNED_AFTER
            && !self.unplanned.iter().any(|t| t == text)
        {
            self.unplanned.push(text.to_owned());
        }
        BoundPortal {
            effects: plan.effects.clone(),
            read: (plan.complete && plan.read.is_ok()).then(|| Arc::clone(&plan.query)),
        }
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
        // As the client's statements ran: with its settings (code it ran may have changed
        // the server's since).
        if super::sync_server(server, state).await.is_err() {
            return;
        }
        let epoch = self.plans_epoch();
        let planning = self.planning(Some(&context), epoch);
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

    /// A Bind: executing `portal` will run `text` (`statement`: the id of the client's named
    /// statement whose text this is; `None` for what `text` is unknown: it may write
    /// anything).
    pub fn bound(
        &mut self,
        portal: &[u8],
        text: Option<(&str, Option<u64>)>,
        state: &ClientState,
        settings_pending: bool,
    ) {
        let bound = match text {
            Some((text, statement)) => self.portal_plan(text, statement, state, settings_pending),
            None => BoundPortal {
                effects: unknown_effects(),
                read: None,
            },
        };
        match self.portals.get_mut(portal) {
            Some(slot) => *slot = bound,
            None => {
                self.portals.insert(Bytes::copy_from_slice(portal), bound);
            }
        }
    }

    /// An Execute of `portal`: a read the cache could have stored is counted as refused
    /// when the batch is not one the cache keys (`[Parse] Bind [Describe] Execute Sync` of
    /// the unnamed portal, without a row limit). `max_rows`: the Execute's row limit;
    /// `first`: no Execute came before it in its batch (the first is counted once a second
    /// shows the batch is not keyed).
    pub fn executed(&mut self, portal: &[u8], max_rows: i32, first: bool, state: &ClientState) {
        let stats = &self.shared.cache.stats;
        if let Some(reason) = self.refused_in_block(state) {
            self.first_execute = None;
            if let Some(query) = self.portals.get(portal).and_then(|p| p.read.as_ref()) {
                stats.refused_query(reason, query);
            }
            return;
        }
        if !first {
            if let Some(query) = self.first_execute.take() {
                stats.refused_query(Refusal::UnsupportedBatch, &query);
            }
        } else {
            self.first_execute = None;
        }
        let Some(query) = self.portals.get(portal).and_then(|p| p.read.as_ref()) else {
            return;
        };
        if max_rows != 0 {
            stats.refused_query(Refusal::PortalSuspension, query);
        } else if !portal.is_empty() || !first {
            stats.refused_query(Refusal::UnsupportedBatch, query);
        } else {
            self.first_execute = Some(Arc::clone(query));
        }
    }

    /// The effects of executing `portal` (as if it could write anything when unknown).
    pub fn portal_effects(&self, portal: &[u8]) -> Effects {
        self.portals
            .get(portal)
            .map_or_else(unknown_effects, |p| p.effects.clone())
    }

    /// A statement's answer arrived: it ran (or began to), so its effects count.
    pub fn answered(&mut self, effects: &Effects) {
        self.txn.merge(effects);
        // Writes of this request after a ROLLBACK it ran (a later Execute of the batch, or a
        // later statement of the Query) commit on their own.
        if (effects.rollback || self.rollback_seen) && effects.writes_data() {
            match &mut self.rollback_request {
                Some(e) => e.merge(effects),
                None => self.rollback_request = Some(effects.clone()),
            }
        }
    }

    /// A COMMIT (or the end of an autocommit statement): the transaction's writes are
    /// visible to everyone, so results depending on them go, before the client learns of it.
    ///
    /// The session may be in a transaction again at once (`COMMIT AND CHAIN`, or a `BEGIN`
    /// after the COMMIT in the same Query): a chained one keeps the isolation level, so
    /// whether it runs under a snapshot stays until ReadyForQuery says Idle.
    pub fn committed(&mut self) {
        self.rollback_seen = false;
        if self.txn.is_empty() {
            return;
        }
        let e = std::mem::take(&mut self.txn);
        self.txn.snapshot = e.snapshot;
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
        let rollback_request = self.rollback_request.take();
        if status == TransactionStatus::Idle {
            if !(self.rollback_seen && self.in_block) {
                self.committed();
            } else if let Some(e) = rollback_request {
                // The block is rolled back, but statements after the ROLLBACK in the same
                // request ran on their own and committed.
                self.txn = e;
                self.committed();
            }
            self.txn = Effects::default();
        }
        self.in_block = status != TransactionStatus::Idle;
        self.rollback_seen = false;
    }

    /// One message of the server's answer, as forwarded to the client. `ready`: it is a
    /// ReadyForQuery with this status, which ends the captured response (stored when the
    /// status is the one the capture expects: a failed block's read is not).
    pub fn observe(&mut self, tag: u8, frame: &[u8], ready: Option<TransactionStatus>) {
        let Some(front) = self.fills.front_mut() else {
            return;
        };
        match ready {
            // Part of an earlier request's response.
            None if front.ahead > 0 => {}
            None => {
                let filling = &mut front.filling;
                if !filling.fits(frame.len()) {
                    filling.abort(Refusal::TooLarge);
                }
                filling.add(tag, frame);
            }
            Some(status) => {
                if front.ahead == 0 {
                    let fill = self.fills.pop_front().expect("checked");
                    if status == fill.ends {
                        self.scratch = fill.filling.finish(
                            false,
                            &self.shared.cache,
                            &self.shared.upstream_time,
                        );
                    }
                }
                for fill in &mut self.fills {
                    fill.ahead -= 1;
                }
            }
        }
    }

    /// A request was sent but its answer never came (the client left, the server failed):
    /// the server may still run and commit it, so its effects count as the transaction's.
    pub fn unanswered(&mut self, effects: &Effects) {
        self.txn.merge(effects);
        self.writes_unanswered |= effects.writes_data() || effects.ddl;
    }

    /// The attachment ended without the client seeing the end of its transaction (it left,
    /// the server failed): whatever it may have committed goes from the cache. Returns what
    /// to invalidate again once the server has ended a write still running (see
    /// `Lease::discard_after_running`), if one may be.
    pub fn abandoned(&mut self) -> Option<(Arc<Shared>, Arc<DatabaseCache>)> {
        self.fills.clear();
        self.committed();
        std::mem::take(&mut self.writes_unanswered)
            .then(|| (Arc::clone(&self.shared), Arc::clone(&self.db)))
    }
}

/// The effects of running a statement pgmemo cannot read: it may write anything.
fn unknown_effects() -> Effects {
    Effects {
        database_wide: true,
        ..Effects::default()
    }
}

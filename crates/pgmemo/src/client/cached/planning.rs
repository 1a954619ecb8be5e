//! Planning inside a caching session: [`crate::cache::planner`] with its catalog queries put on
//! the session's own server connection, between the client's requests.

use std::sync::Arc;

use tokio::io::AsyncWrite;
use wire::backend::TransactionStatus;

use super::requests::Requests;
use crate::cache::catalog::Row;
use crate::cache::plan::Plan;
use crate::cache::planner::{self, Catalog, Planning};
use crate::client::relay::PumpError;

/// The session's server connection as a [`Catalog`]: for the planner's lookups, and for the
/// context and WAL position reads.
pub(super) struct SessionCatalog<'r, 'a, SW> {
    requests: &'r mut Requests<'a>,
    server: &'r mut SW,
}

impl<SW: AsyncWrite + Unpin> Catalog for SessionCatalog<'_, '_, SW> {
    type Error = PumpError;

    /// Inside the client's transaction block the lookup runs in a savepoint: should it fail
    /// (a statement_timeout, say), the client's transaction must not be aborted by it.
    async fn ask(&mut self, sql: &str) -> Result<Option<Vec<Row>>, PumpError> {
        if self.requests.st.status() != TransactionStatus::InTransaction {
            return self.requests.ask(self.server, &[sql]).await;
        }
        let wrapped = [
            "SAVEPOINT pgmemo_lookup",
            sql,
            "RELEASE SAVEPOINT pgmemo_lookup",
        ];
        let rows = self.requests.ask(self.server, &wrapped).await?;
        if rows.is_none() {
            self.requests
                .ask(
                    self.server,
                    &[
                        "ROLLBACK TO SAVEPOINT pgmemo_lookup",
                        "RELEASE SAVEPOINT pgmemo_lookup",
                    ],
                )
                .await?;
        }
        Ok(rows)
    }
}

impl<'a> Requests<'a> {
    /// The session's server connection as a [`Catalog`], answered through the server pump.
    pub(super) fn catalog<'r, SW>(&'r mut self, server: &'r mut SW) -> SessionCatalog<'r, 'a, SW> {
        SessionCatalog {
            requests: self,
            server,
        }
    }

    /// The session side of planning: the context id while it is known current, and how the
    /// session reads string literals.
    fn planning_context(&self) -> (Option<u64>, bool) {
        let standard_conforming_strings = self
            .session
            .context
            .as_ref()
            .is_none_or(|c| c.standard_conforming_strings());
        (self.trusted_context_id(), standard_conforming_strings)
    }

    /// Whether the session is inside a transaction block that reads from one snapshot.
    fn in_snapshot_block(&self) -> bool {
        self.st.status() == TransactionStatus::InTransaction
            && (self
                .link
                .txn_snapshot
                .load(std::sync::atomic::Ordering::Relaxed)
                || self
                    .session
                    .context
                    .as_ref()
                    .is_some_and(|c| c.snapshot_by_default()))
    }

    /// The memoized plan of a statement text, if the memo knows its shape (no catalog, no
    /// parse), and whether the text holds a time literal.
    pub(super) fn memoized_plan(&self, text: &str) -> Option<(Arc<Plan>, bool)> {
        let (context_id, standard_conforming_strings) = self.planning_context();
        let db = &self.session.db;
        let epoch = db.plans_epoch();
        let config = self.shared.config();
        let planning = Planning {
            db,
            cache: &self.shared.cache,
            config: &config,
            context_id,
            standard_conforming_strings,
            epoch,
        };
        planner::memoized(&planning, text)
    }

    /// The plan of a statement text (memoized by shape), whether the text holds a time
    /// literal, and whether a cancel came during its lookups. Catalog lookups run only when
    /// `can_ask` (at a boundary: the server idle but for them). A cancel during the lookups is
    /// kept rather than sent to the server, where it would stop a lookup (or reach nothing),
    /// and the caller answers the statement as cancelled.
    pub(super) async fn plan_for<SW: AsyncWrite + Unpin>(
        &mut self,
        text: &str,
        can_ask: bool,
        server: &mut SW,
    ) -> Result<(Arc<Plan>, bool, bool), PumpError> {
        let (context_id, standard_conforming_strings) = self.planning_context();
        // Under REPEATABLE READ or SERIALIZABLE the catalog would be read as of the
        // transaction's snapshot, which may predate DDL (row security enabled, a trigger
        // added): such a plan would be memoized for everyone. Planned without the catalog it
        // is conservative and not memoized.
        let can_ask = can_ask && !self.in_snapshot_block();
        let db = Arc::clone(&self.session.db);
        let shared = self.shared;
        // Before the configuration: a reload that changes it drops the memo after storing it.
        let epoch = db.plans_epoch();
        let config = shared.config();
        let planning = Planning {
            db: &db,
            cache: &shared.cache,
            config: &config,
            context_id,
            standard_conforming_strings,
            epoch,
        };
        if let Some(found) = planner::memoized_with(&planning, text, &mut self.session.memo_key) {
            return Ok((found.0, found.1, false));
        }
        let slot = can_ask.then(|| Arc::clone(&self.session.cancel));
        if let Some(slot) = &slot {
            slot.hold();
        }
        let mut catalog = self.catalog(server);
        // Boxed: the catalog queries' state would otherwise make every request's future
        // larger, and moving it costs on every request.
        let planned = Box::pin(planner::plan(
            &planning,
            text,
            can_ask.then_some(&mut catalog),
        ))
        .await;
        // Resumed on every way out (a failed lookup's connection error included).
        let cancelled = slot.is_some_and(|slot| slot.resume());
        let (plan, time_literal) = planned?;
        Ok((plan, time_literal, cancelled))
    }
}

//! Planning inside a caching session: [`crate::cache::planner`] with its catalog queries put on
//! the session's own server connection, between the client's requests.

use std::sync::Arc;

use tokio::io::AsyncWrite;

use super::requests::Requests;
use crate::cache::catalog::Row;
use crate::cache::plan::Plan;
use crate::cache::planner::{self, Catalog, Planning};
use crate::client::relay::PumpError;

/// The session's server connection as the planner's catalog.
struct SessionCatalog<'r, 'a, SW> {
    requests: &'r mut Requests<'a>,
    server: &'r mut SW,
}

impl<SW: AsyncWrite + Unpin> Catalog for SessionCatalog<'_, '_, SW> {
    type Error = PumpError;

    async fn ask(&mut self, sql: &str) -> Result<Option<Vec<Row>>, PumpError> {
        self.requests.ask(self.server, sql).await
    }
}

impl Requests<'_> {
    /// The plan of a statement text (memoized by shape), and whether the text holds a time
    /// literal. Catalog lookups run only when `can_ask`.
    pub(super) async fn plan_for<SW: AsyncWrite + Unpin>(
        &mut self,
        text: &str,
        can_ask: bool,
        server: &mut SW,
    ) -> Result<(Arc<Plan>, bool), PumpError> {
        let standard_conforming_strings = self
            .session
            .context
            .as_ref()
            .is_none_or(|c| c.standard_conforming_strings());
        let context_id = self.trusted_context_id();
        let db = Arc::clone(&self.session.db);
        let shared = self.shared;
        let config = shared.config();
        let planning = Planning {
            db: &db,
            cache: &shared.cache,
            config: &config,
            context_id,
            standard_conforming_strings,
        };
        let mut catalog = SessionCatalog {
            requests: self,
            server,
        };
        planner::plan(&planning, text, can_ask.then_some(&mut catalog)).await
    }
}

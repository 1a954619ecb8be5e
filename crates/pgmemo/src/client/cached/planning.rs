//! Planning inside a caching session: the plan of a statement text, from the database's memo
//! (by shape and session context) or by parsing it and resolving its names with a catalog
//! query on the session's own server connection.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::io::AsyncWrite;

use super::requests::Requests;
use crate::cache::catalog::{self, Facts};
use crate::cache::plan::{self, Plan};
use crate::client::relay::PumpError;

impl Requests<'_> {
    /// The plan of a statement text (memoized by shape), and whether the text holds a time
    /// literal. Catalog lookups run only when `can_ask`.
    pub(super) async fn plan_for<SW: AsyncWrite + Unpin>(
        &mut self,
        text: &str,
        can_ask: bool,
        server: &mut SW,
    ) -> Result<(Arc<Plan>, bool), PumpError> {
        let scs = self
            .session
            .context
            .as_ref()
            .is_none_or(|c| c.standard_conforming_strings());
        let ctx_id = self.trusted_context_id();
        let shape = sql::shape(text, scs);
        let memo_key = format!(
            "{}\0{}\0{}",
            ctx_id.unwrap_or(0),
            shape.hints.join(""),
            shape.text
        );
        // Plans are memoized per context: names resolve by search_path. While the settings
        // may have changed (a SET inside a transaction), nothing is memoized or reused.
        if ctx_id.is_some() {
            if let Some(p) = self.session.db.plan(&memo_key) {
                return Ok((p, shape.time_literal));
            }
        }
        let query = self.shared.cache.queries.get(shape.text.trim());
        let options = sql::ParseOptions {
            standard_conforming_strings: scs,
        };
        let analysis = match sql::analyze_with(text, options) {
            Ok(a) => a,
            Err(_) => {
                let p = Arc::new(plan::unparsable(query));
                if ctx_id.is_some() {
                    self.session.db.remember(memo_key, Arc::clone(&p));
                }
                return Ok((p, shape.time_literal));
            }
        };
        let (rels, fns) = plan::names_to_look_up(&analysis.statements);
        let mut facts: Option<Facts> = None;
        let mut view_volatility = None;
        if plan::needs_catalog(&analysis.statements) && can_ask {
            facts = self.look_up(server, &rels, &fns).await?;
            if let Some(f) = &facts {
                view_volatility = self.view_function_volatility(server, f).await?;
            }
        }
        let hints = plan::hints(&shape.hints);
        let config = self.shared.config();
        let excluded = |schema: &str, table: &str| config.table_excluded(schema, table);
        let inputs = plan::Inputs {
            facts: facts.as_ref(),
            relation_names: &rels,
            function_names: &fns,
            view_function_volatility: view_volatility,
            hints: &hints,
            excluded: &excluded,
        };
        let mut p = plan::decide(&analysis.statements, &inputs, query);
        if let Ok(read) = p.read.as_mut() {
            self.session.db.generations.attach(read);
        }
        let p = Arc::new(p);
        if p.complete && ctx_id.is_some() {
            self.session.db.remember(memo_key, Arc::clone(&p));
        }
        Ok((p, shape.time_literal))
    }

    async fn look_up<SW: AsyncWrite + Unpin>(
        &mut self,
        server: &mut SW,
        rels: &[(Option<String>, String)],
        fns: &[(Option<String>, String)],
    ) -> Result<Option<Facts>, PumpError> {
        let names =
            |v: &[(Option<String>, String)]| -> Vec<(Option<String>, String)> { v.to_vec() };
        let rels = names(rels);
        let fns = names(fns);
        let r: Vec<catalog::Name<'_>> = rels
            .iter()
            .map(|(s, n)| (s.as_deref(), n.as_str()))
            .collect();
        let f: Vec<catalog::Name<'_>> = fns
            .iter()
            .map(|(s, n)| (s.as_deref(), n.as_str()))
            .collect();
        let Ok(sql) = catalog::lookup_query(&r, &f) else {
            return Ok(None);
        };
        self.shared
            .cache
            .stats
            .catalog_lookups
            .fetch_add(1, Ordering::Relaxed);
        let rows = self.ask(server, &sql).await?;
        Ok(rows.and_then(|rows| catalog::parse_facts(&rows).ok()))
    }

    /// The worst volatility of the functions the views among `facts` call: `b'?'` when one
    /// cannot be resolved, `None` when no view is involved.
    async fn view_function_volatility<SW: AsyncWrite + Unpin>(
        &mut self,
        server: &mut SW,
        facts: &Facts,
    ) -> Result<Option<u8>, PumpError> {
        let mut fns: Vec<(Option<String>, String)> = Vec::new();
        let mut any_view = false;
        for def in facts
            .relations
            .iter()
            .filter_map(|r| r.view_definition.as_deref())
        {
            any_view = true;
            match sql::analyze(def) {
                Ok(a) => {
                    if a.statements
                        .iter()
                        .any(|s| s.sql_value_functions.iter().any(|f| f.is_time()))
                    {
                        return Ok(Some(b'v'));
                    }
                    let (_, f) = plan::names_to_look_up(&a.statements);
                    fns.extend(f);
                }
                Err(_) => return Ok(Some(b'?')),
            }
        }
        if !any_view {
            return Ok(None);
        }
        if fns.is_empty() {
            return Ok(Some(b'i'));
        }
        fns.sort();
        fns.dedup();
        let Some(f) = self.look_up(server, &[], &fns).await? else {
            return Ok(Some(b'?'));
        };
        let mut worst = b'i';
        for i in 0..fns.len() {
            let found: Vec<u8> = f
                .functions
                .iter()
                .filter(|p| p.name_index == i)
                .map(|p| p.volatility)
                .collect();
            if found.is_empty() {
                return Ok(Some(b'?'));
            }
            for v in found {
                if v == b'v' || (v == b's' && worst == b'i') {
                    worst = v;
                }
            }
        }
        Ok(Some(worst))
    }
}

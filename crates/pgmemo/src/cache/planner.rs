//! Planning a statement text: from the database's memo (by shape and session context) or by
//! parsing it and resolving its names with catalog queries on an upstream connection. Both
//! pool modes plan the same way; they differ only in how a catalog query reaches the server
//! ([`Catalog`]): session pooling puts it on the session's own connection between the
//! client's requests, transaction pooling on the server it attached before the request.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::catalog::{self, Facts, Row};
use super::plan::{self, Plan};
use super::{Cache, DatabaseCache};
use crate::config::Config;

/// Where catalog queries run.
pub trait Catalog {
    /// How running a query can fail (the connection, not the query: a failed query is
    /// `Ok(None)`).
    type Error;

    /// Runs one of pgmemo's catalog queries and returns its rows as text, `None` when the
    /// server answered with an error.
    fn ask(&mut self, sql: &str) -> impl Future<Output = Result<Option<Vec<Row>>, Self::Error>>;
}

/// A [`Catalog`] that is never asked: plans made with it are incomplete unless the statement
/// needs no catalog facts (and so are conservative about what they write).
pub struct NoCatalog;

impl Catalog for NoCatalog {
    type Error = std::convert::Infallible;

    async fn ask(&mut self, _sql: &str) -> Result<Option<Vec<Row>>, Self::Error> {
        Ok(None)
    }
}

/// What planning needs to know about the session and the process.
pub struct Planning<'a> {
    pub db: &'a DatabaseCache,
    pub cache: &'a Cache,
    pub config: &'a Config,
    /// The session context's id while it is known to be current; plans are memoized and
    /// reused only then (names resolve by search_path).
    pub context_id: Option<u64>,
    pub standard_conforming_strings: bool,
    /// The database's plans epoch read before `config` was known to be current: a plan is
    /// memoized only if no reload or DDL dropped the memo since (see
    /// [`DatabaseCache::remember`]).
    pub epoch: u64,
}

impl<'a> Planning<'a> {
    /// Planning in `context` when it is current (`None`: plans are neither memoized nor taken
    /// from the memo, and strings are read as standard-conforming), with `config` known current
    /// at `epoch`.
    pub fn in_context(
        db: &'a DatabaseCache,
        cache: &'a Cache,
        config: &'a Config,
        context: Option<&super::context::Context>,
        epoch: u64,
    ) -> Planning<'a> {
        Planning {
            db,
            cache,
            config,
            context_id: context.map(|c| c.id),
            standard_conforming_strings: context.is_none_or(|c| c.standard_conforming_strings()),
            epoch,
        }
    }
}

/// The plan of a statement text, and whether the text holds a time literal. The catalog is
/// asked only when the memo does not know the shape and the statement names relations or
/// functions; `None` plans without it.
///
/// Callers on a request path try [`memoized`] first: that is the common case, and it needs
/// none of this future's state (which holds the catalog queries').
pub async fn plan<C: Catalog>(
    p: &Planning<'_>,
    text: &str,
    catalog: Option<&mut C>,
) -> Result<(Arc<Plan>, bool), C::Error> {
    let shape = sql::shape(text, p.standard_conforming_strings);
    let memo_key = super::plan_memo_key(p.context_id.unwrap_or(0), &shape.hints, &shape.text);
    if p.context_id.is_some() {
        if let Some(plan) = p.db.plan(&memo_key) {
            return Ok((plan, shape.time_literal));
        }
    }
    let query = p.cache.queries.get(shape.text.trim());
    let options = sql::ParseOptions {
        standard_conforming_strings: p.standard_conforming_strings,
    };
    let analysis = match sql::analyze_with(text, options) {
        Ok(a) => a,
        Err(_) => {
            let plan = Arc::new(plan::unparsable(query));
            if p.context_id.is_some() {
                p.db.remember(memo_key, Arc::clone(&plan), p.epoch);
            }
            return Ok((plan, shape.time_literal));
        }
    };
    let names = plan::names_to_look_up(&analysis.statements);
    let mut facts: Option<Facts> = None;
    let mut views = None;
    if let Some(catalog) = catalog.filter(|_| plan::needs_catalog(&analysis.statements)) {
        facts = look_up(p, catalog, &names).await?;
        if let Some(f) = &facts {
            views = view_facts(p, catalog, f).await?;
        }
    }
    let hints = plan::hints(&shape.hints);
    let excluded = |schema: &str, table: &str| p.config.table_excluded(schema, table);
    let inputs = plan::Inputs {
        facts: facts.as_ref(),
        names: &names,
        view_function_volatility: views.as_ref().map(|v| v.volatility),
        view_functions_may_change_settings: views.as_ref().is_some_and(|v| v.may_change_settings),
        view_locking: views.as_ref().is_some_and(|v| v.locking),
        hints: &hints,
        excluded: &excluded,
    };
    let mut decided = plan::decide(&analysis.statements, &inputs, query);
    decided.epoch = p.epoch;
    if let Ok(read) = decided.read.as_mut() {
        p.db.generations.attach(read);
    }
    let decided = Arc::new(decided);
    if decided.complete && p.context_id.is_some() {
        p.db.remember(memo_key, Arc::clone(&decided), p.epoch);
    }
    Ok((decided, shape.time_literal))
}

/// The plan of a statement text from the memo, and whether the text holds a time literal;
/// `None` when the memo does not know its shape (or plans are not memoized: no context).
pub fn memoized(p: &Planning<'_>, text: &str) -> Option<(Arc<Plan>, bool)> {
    memoized_with(p, text, &mut Vec::with_capacity(16 + text.len()))
}

/// [`memoized`], building the memo key in `scratch`: a buffer the caller keeps from one
/// request to the next, so that a miss whose shape is known allocates nothing here.
pub fn memoized_with(
    p: &Planning<'_>,
    text: &str,
    scratch: &mut Vec<u8>,
) -> Option<(Arc<Plan>, bool)> {
    let context_id = p.context_id?;
    let facts = super::plan_memo_key_into(context_id, text, p.standard_conforming_strings, scratch);
    Some((p.db.plan(scratch)?, facts.time_literal))
}

/// The plan of a statement from the memo, or made without the catalog.
pub fn plan_without_catalog(p: &Planning<'_>, text: &str) -> (Arc<Plan>, bool) {
    let planned = plan(p, text, None::<&mut NoCatalog>);
    // NoCatalog is never awaited on: the future completes on its first poll.
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut planned = std::pin::pin!(planned);
    match planned.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(Ok(done)) => done,
        std::task::Poll::Ready(Err(never)) => match never {},
        std::task::Poll::Pending => unreachable!("planning without a catalog never waits"),
    }
}

async fn look_up<C: Catalog>(
    p: &Planning<'_>,
    catalog: &mut C,
    names: &plan::LookupNames,
) -> Result<Option<Facts>, C::Error> {
    fn borrowed(list: &[(Option<String>, String)]) -> Vec<catalog::Name<'_>> {
        list.iter()
            .map(|(s, n)| (s.as_deref(), n.as_str()))
            .collect()
    }
    let Ok(sql) = catalog::lookup_query(
        &borrowed(&names.relations),
        &borrowed(&names.functions),
        &borrowed(&names.operators),
        &borrowed(&names.casts),
        &borrowed(&names.attributes),
    ) else {
        return Ok(None);
    };
    p.cache
        .stats
        .catalog_lookups
        .fetch_add(1, Ordering::Relaxed);
    let rows = catalog.ask(&sql).await?;
    Ok(rows.and_then(|rows| catalog::parse_facts(&rows).ok()))
}

/// What reading the views among `facts` does besides reading their tables, found from their
/// definitions.
struct ViewFacts {
    /// The worst volatility of the functions (user-defined operators and casts included) the
    /// views call: `b'?'` when a function cannot be resolved.
    volatility: u8,
    /// Whether one of those functions may change the session's settings (unknown ones may).
    may_change_settings: bool,
    /// A view's definition holds a row-locking clause (`FOR UPDATE`, `FOR SHARE`, ...).
    locking: bool,
}

/// [`ViewFacts`] of the views among `facts`; `None` when no view is involved.
async fn view_facts<C: Catalog>(
    p: &Planning<'_>,
    catalog: &mut C,
    facts: &Facts,
) -> Result<Option<ViewFacts>, C::Error> {
    let unknown = ViewFacts {
        volatility: b'?',
        may_change_settings: true,
        locking: false,
    };
    let mut names = plan::LookupNames::default();
    let mut any_view = false;
    let mut locking = false;
    // A view reading the clock or sampling its table gives another answer each time but
    // writes nothing: as a stable function would. So does one whose text casts a special
    // time word at run time (`'today'::text::date`; a `'today'::date` literal was fixed
    // when the view was created).
    let mut floor = b'i';
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
                    .any(|s| s.tablesample || s.sql_value_functions.iter().any(|f| f.is_time()))
                    || sql::shape(def, true).time_literal
                {
                    floor = plan::worse(floor, b's');
                }
                locking |= a.statements.iter().any(|s| s.locking);
                let found = plan::names_to_look_up(&a.statements);
                names.functions.extend(found.functions);
                names.operators.extend(found.operators);
                names.casts.extend(found.casts);
            }
            Err(_) => return Ok(Some(unknown)),
        }
    }
    if !any_view {
        return Ok(None);
    }
    if names.functions.is_empty() && names.operators.is_empty() && names.casts.is_empty() {
        return Ok(Some(ViewFacts {
            volatility: floor,
            may_change_settings: false,
            locking,
        }));
    }
    for list in [&mut names.functions, &mut names.operators, &mut names.casts] {
        list.sort();
        list.dedup();
    }
    let Some(f) = look_up(p, catalog, &names).await? else {
        return Ok(Some(ViewFacts { locking, ..unknown }));
    };
    if (0..names.functions.len()).any(|i| !f.functions.iter().any(|p| p.name_index == i)) {
        return Ok(Some(ViewFacts { locking, ..unknown }));
    }
    let worst = f
        .functions
        .iter()
        .chain(&f.operators)
        .chain(&f.casts)
        .map(|p| p.volatility)
        .fold(floor, plan::worse);
    let named = |p: &catalog::Function| names.functions[p.name_index].1.as_str();
    let settings = f.functions.iter().any(|p| p.may_change_settings(named(p)))
        || f.operators
            .iter()
            .chain(&f.casts)
            .any(|p| p.volatility == b'v');
    Ok(Some(ViewFacts {
        volatility: worst,
        may_change_settings: settings,
        locking,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planning<'a>(db: &'a DatabaseCache, cache: &'a Cache, config: &'a Config) -> Planning<'a> {
        Planning {
            db,
            cache,
            config,
            context_id: Some(1),
            standard_conforming_strings: true,
            epoch: db.plans_epoch(),
        }
    }

    #[test]
    fn a_plan_is_memoized_when_nothing_dropped_the_memo_meanwhile() {
        let (cache, config) = (Cache::new(1 << 20), Config::default());
        let db = cache.database("127.0.0.1", 5432, "test");
        let p = planning(&db, &cache, &config);
        let (plan, _) = plan_without_catalog(&p, "SELECT 1");
        assert!(plan.complete);
        assert!(memoized(&p, "SELECT 1").is_some());
    }

    /// A plan made from facts or table lists read before a DDL or a reload dropped the memo
    /// would otherwise outlive that drop.
    #[test]
    fn a_plan_begun_before_the_memo_was_dropped_is_not_memoized() {
        let (cache, config) = (Cache::new(1 << 20), Config::default());
        let db = cache.database("127.0.0.1", 5432, "test");
        let p = planning(&db, &cache, &config);
        db.forget_plans();
        let (plan, _) = plan_without_catalog(&p, "SELECT 1");
        assert!(plan.complete);
        assert!(memoized(&p, "SELECT 1").is_none());
        let fresh = planning(&db, &cache, &config);
        plan_without_catalog(&fresh, "SELECT 1");
        assert!(memoized(&fresh, "SELECT 1").is_some());
    }

    /// The memo is filled under `plan_memo_key` and read under `plan_memo_key_into`: one shape
    /// must give one key, whatever its literals, and hints must keep keys apart.
    #[test]
    fn a_plan_is_found_by_any_text_of_its_shape_and_hints_tell_shapes_apart() {
        let (cache, config) = (Cache::new(1 << 20), Config::default());
        let db = cache.database("127.0.0.1", 5432, "test");
        let p = planning(&db, &cache, &config);
        // No names (operators are names too): planned completely without the catalog.
        plan_without_catalog(&p, "SELECT 1 /* pgmemo:ttl=5s */, 'a'");
        let mut scratch = b"left over".to_vec();
        assert!(memoized_with(&p, "SELECT 2 /* pgmemo:ttl=5s */, 'b'", &mut scratch).is_some());
        assert!(memoized_with(&p, "SELECT 2, 'b'", &mut scratch).is_none());
        assert!(memoized_with(&p, "SELECT 2 /* pgmemo:nocache */, 'b'", &mut scratch).is_none());
        let shape = sql::shape("SELECT 1 /* pgmemo:ttl=5s */, 'a'", true);
        assert_eq!(db.plans_for_shape(&[], &shape.text).len(), 0);
        assert_eq!(
            db.plans_for_shape(&shape.hints, &shape.text).len(),
            1,
            "{shape:?}"
        );
    }
}

//! `EXPLAIN CACHE <query>`: would this statement be cached, on which tables would its result
//! depend and what would running it invalidate, or why not. The console has no server
//! connection, so names are resolved only for shapes sessions have already run: those plans
//! are shown per database and session context; for a shape never run, the answer comes from
//! the parser alone.

use std::sync::Arc;

use super::table::Table;
use crate::cache::plan::{self, Plan};
use crate::shared::Shared;

/// Builds the table.
pub fn explain_cache(shared: &Shared, sql: &str) -> Table {
    let mut t = Table::new(&[
        "database",
        "role",
        "context",
        "cacheable",
        "reason",
        "depends_on",
        "ttl",
        "invalidates",
        "shape",
    ]);
    let shape = sql::shape(sql, true);
    let mut found = false;
    for db in shared.cache.databases() {
        for (ctx_id, p) in db.plans_for_shape(&shape.hints, &shape.text) {
            found = true;
            let role = db.contexts.by_id(ctx_id).map(|c| c.role().to_owned());
            t.row(row(
                Some(db.name.clone()),
                role,
                Some(ctx_id.to_string()),
                &p,
                shape.time_literal,
                &shape.text,
            ));
        }
    }
    if !found {
        let query = shared.cache.queries.get(shape.text.trim());
        let p = match sql::analyze(sql) {
            Ok(a) => {
                let names = plan::names_to_look_up(&a.statements);
                let h = plan::hints(&shape.hints);
                let no_exclusions = |_: &str, _: &str| false;
                plan::decide(
                    &a.statements,
                    &plan::Inputs {
                        facts: None,
                        names: &names,
                        view_function_volatility: None,
                        view_functions_may_change_settings: false,
                        view_locking: false,
                        hints: &h,
                        excluded: &no_exclusions,
                    },
                    query,
                )
            }
            Err(_) => plan::unparsable(query),
        };
        let mut r = row(
            None,
            None,
            None,
            &Arc::new(p),
            shape.time_literal,
            &shape.text,
        );
        if r[4].as_deref() == Some("catalog_unavailable") {
            r[4] = Some("not analysed yet: run it once through pgmemo to resolve its names".into());
            r[3] = Some("unknown".into());
        }
        t.row(r);
    }
    t
}

fn row(
    database: Option<String>,
    role: Option<String>,
    context: Option<String>,
    p: &Plan,
    time_literal: bool,
    shape: &str,
) -> Vec<Option<String>> {
    let (cacheable, reason, depends, ttl) = match (&p.read, time_literal) {
        (Ok(_), true) => ("no", Some("time_literal".to_owned()), None, None),
        (Ok(r), false) => (
            "yes",
            None,
            Some(
                r.tables
                    .iter()
                    .map(|(_, n)| n.clone())
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            r.ttl.map(|d| format!("{}s", d.as_secs_f64())),
        ),
        (Err(e), _) => ("no", Some(e.name().to_owned()), None, None),
    };
    let e = &p.effects;
    let mut inv = Vec::new();
    if e.database_wide {
        inv.push("the whole database".to_owned());
    }
    if !e.writes.is_empty() {
        inv.push(format!("tables {:?}", e.writes));
    }
    if e.ddl || e.hidden_settings {
        inv.push("memoized plans".to_owned());
    }
    if e.settings {
        inv.push("session settings re-read".to_owned());
    }
    vec![
        database,
        role,
        context,
        Some(cacheable.to_owned()),
        reason,
        depends,
        ttl,
        Some(if inv.is_empty() {
            "nothing".to_owned()
        } else {
            inv.join("; ")
        }),
        Some(shape.trim().to_owned()),
    ]
}

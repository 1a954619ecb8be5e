//! The session side of the key (doctrine rule 2): who asks and under which settings. Sessions
//! whose role and output-relevant settings are equal share one interned context, whose id
//! prefixes their keys, so a hit builds its key without serializing any setting.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::catalog::first_value;
use super::planner::Catalog;
use crate::hash::Map;

/// Settings that change the bytes PostgreSQL returns for the same statement (or how it resolves
/// names), read with `current_setting` when a session starts and after anything that may
/// change them.
pub const KEY_SETTINGS: &[&str] = &[
    "search_path",
    "TimeZone",
    "DateStyle",
    "IntervalStyle",
    "extra_float_digits",
    "bytea_output",
    "client_encoding",
    "standard_conforming_strings",
    "lc_monetary",
    "lc_numeric",
    "lc_time",
    "row_security",
    "default_text_search_config",
    "transform_null_equals",
    "array_nulls",
    "xmloption",
    "xmlbinary",
    "timezone_abbreviations",
    "default_transaction_isolation",
    // Read by quote_ident (immutable) and every identifier PostgreSQL quotes in output.
    "quote_all_identifiers",
    // A GIN index scan returns a random subset of at most this many rows.
    "gin_fuzzy_search_limit",
    // Which notices and warnings a statement sends: a result stored where they were silenced
    // (a capture that meets one stores nothing) must not answer a session that hears them.
    "client_min_messages",
    "escape_string_warning",
    "debug_print_parse",
    "debug_print_rewritten",
    "debug_print_plan",
    "trace_sort",
];

/// The query that reads a session's context: roles first, then [`KEY_SETTINGS`] in order, then
/// the OID of the backend's temporary schema (`0` for a backend that never had one, as almost
/// all pooled backends). A session with temporary tables can read different relations under
/// the same names and settings as another, so it never shares a context (nor, therefore, a
/// result) with any other session; whether a backend that has a temporary schema holds
/// relations in it is asked separately ([`TEMP_RELATIONS_QUERY`]), since planning that
/// catalog scan cost every session start about a third of the context query's time.
pub fn context_query() -> &'static str {
    static QUERY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    QUERY.get_or_init(|| {
        let mut q = String::from("/* pgmemo session context */ SELECT current_user, session_user");
        for s in KEY_SETTINGS {
            q.push_str(", pg_catalog.current_setting('");
            q.push_str(s);
            q.push_str("')");
        }
        q.push_str(", pg_catalog.pg_my_temp_schema()::text");
        q
    })
}

/// Asked after [`context_query`] when the backend has a temporary schema: its OID when it holds
/// relations, else empty (the schema outlives the tables that `DISCARD ALL` dropped).
const TEMP_RELATIONS_QUERY: &str = "/* pgmemo temp relations */ SELECT CASE WHEN EXISTS \
     (SELECT 1 FROM pg_catalog.pg_class WHERE relnamespace = pg_catalog.pg_my_temp_schema()) \
     THEN pg_catalog.pg_my_temp_schema()::text ELSE '' END";

/// Reads the context of the session behind `catalog` (one query; two on a backend that has a
/// temporary schema) and interns it in `contexts`. `None` when the server did not answer.
pub async fn read<C: Catalog>(
    catalog: &mut C,
    contexts: &Contexts,
) -> Result<Option<Arc<Context>>, C::Error> {
    let answer = catalog.ask(context_query()).await?;
    let Some(row) = answer.and_then(|rows| rows.into_iter().next()) else {
        return Ok(None);
    };
    let mut values = context_values(row);
    if values.needs_temp_check {
        let answer = catalog.ask(TEMP_RELATIONS_QUERY).await?;
        values.set_temp(first_value(answer));
    }
    Ok(Some(contexts.intern(values.values)))
}

/// The context values of a row of [`context_query`] (NULLs read as empty), and whether the
/// last one still needs [`TEMP_RELATIONS_QUERY`]'s answer ([`ContextValues::set_temp`]).
fn context_values(row: Vec<Option<String>>) -> ContextValues {
    let mut values: Vec<String> = row.into_iter().map(Option::unwrap_or_default).collect();
    let needs_temp_check = match values.last_mut() {
        Some(temp) if temp == "0" || temp.is_empty() => {
            temp.clear();
            false
        }
        Some(_) => true,
        None => false,
    };
    ContextValues {
        values,
        needs_temp_check,
    }
}

/// A context row being read: see [`context_values`].
#[derive(Debug)]
struct ContextValues {
    values: Vec<String>,
    /// The backend has a temporary schema: ask [`TEMP_RELATIONS_QUERY`] before interning.
    needs_temp_check: bool,
}

impl ContextValues {
    /// Records [`TEMP_RELATIONS_QUERY`]'s answer (`None`: no answer, taken as relations being
    /// there, which only keeps the session's context to itself).
    fn set_temp(&mut self, answer: Option<String>) {
        // Without an answer the schema's OID stays: a context of this backend alone.
        if let (Some(temp), Some(a)) = (self.values.last_mut(), answer) {
            *temp = a;
        }
        self.needs_temp_check = false;
    }
}

/// A session context: role and key settings, interned.
#[derive(Debug)]
pub struct Context {
    /// Process-unique id; the first bytes of every key made in this context.
    pub id: u64,
    /// `current_user`, `session_user`, then the settings' values.
    pub values: Vec<String>,
    /// See [`Context::hears_log_messages`]; worked out once here, as it is asked on every
    /// request the cache sees.
    hears_log_messages: bool,
}

impl Context {
    /// The value of a key setting.
    pub fn setting(&self, name: &str) -> Option<&str> {
        let i = KEY_SETTINGS.iter().position(|s| *s == name)?;
        self.values.get(i + 2).map(String::as_str)
    }

    /// `current_user`.
    pub fn role(&self) -> &str {
        self.values.first().map_or("", String::as_str)
    }

    /// Whether transactions begin under REPEATABLE READ or SERIALIZABLE by default.
    pub fn snapshot_by_default(&self) -> bool {
        matches!(
            self.setting("default_transaction_isolation"),
            Some("repeatable read" | "serializable")
        )
    }

    /// Whether the session hears LOG or DEBUG messages (`client_min_messages` below
    /// `notice`): statements then send messages that depend on more than the statement (its
    /// duration, the server's log settings), which a cached answer cannot reproduce.
    pub fn hears_log_messages(&self) -> bool {
        self.hears_log_messages
    }

    /// How the session reads string literals.
    pub fn standard_conforming_strings(&self) -> bool {
        self.setting("standard_conforming_strings") != Some("off")
    }
}

/// Interns contexts so equal sessions share an id.
#[derive(Debug, Default)]
pub struct Contexts {
    next: AtomicU64,
    known: Mutex<Map<Vec<String>, Arc<Context>>>,
}

impl Contexts {
    /// The context for these values (one row of [`context_query`]).
    pub fn intern(&self, values: Vec<String>) -> Arc<Context> {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = known.get(&values) {
            return Arc::clone(c);
        }
        let level = KEY_SETTINGS
            .iter()
            .position(|s| *s == "client_min_messages")
            .and_then(|i| values.get(i + 2));
        let c = Arc::new(Context {
            id: self.next.fetch_add(1, Ordering::Relaxed) + 1,
            hears_log_messages: level
                .is_some_and(|level| level == "log" || level.starts_with("debug")),
            values: values.clone(),
        });
        known.insert(values, Arc::clone(&c));
        c
    }
}

impl Contexts {
    /// The context with this id, if it is known.
    pub fn by_id(&self, id: u64) -> Option<Arc<Context>> {
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known.values().find(|c| c.id == id).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_a_context() {
        let c = Contexts::default();
        let a = c.intern(vec!["alice".into(), "alice".into(), "public".into()]);
        let b = c.intern(vec!["alice".into(), "alice".into(), "public".into()]);
        let other = c.intern(vec!["bob".into(), "bob".into(), "public".into()]);
        assert_eq!(a.id, b.id);
        assert_ne!(a.id, other.id);
        assert_eq!(a.setting("search_path"), Some("public"));
        assert!(context_query().contains("current_setting('TimeZone')"));
    }

    #[test]
    fn a_backend_without_a_temporary_schema_needs_no_second_query() {
        let row = |temp: &str| vec![Some("alice".into()), None, Some(temp.to_owned())];
        let none = context_values(row("0"));
        assert!(!none.needs_temp_check);
        assert_eq!(none.values, ["alice", "", ""]);
        let mut some = context_values(row("16400"));
        assert!(some.needs_temp_check);
        some.set_temp(Some(String::new()));
        assert_eq!(
            some.values,
            ["alice", "", ""],
            "no relations left: shared context"
        );
        let mut unknown = context_values(row("16400"));
        unknown.set_temp(None);
        assert_eq!(
            unknown.values[2], "16400",
            "no answer: the backend's own context"
        );
    }
}

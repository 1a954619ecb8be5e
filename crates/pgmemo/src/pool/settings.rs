//! Step 5 of the query path, transaction pooling: session settings kept in step per server
//! connection. A client's `SET`s (and the settings in its
//! startup packet) belong to the client, not to whichever server connection ran them: pgmemo
//! remembers them per client ([`ClientSettings`]), remembers what it has set on each server
//! ([`ServerSettings`]), and before each request brings the server in line with the client
//! ([`sync_sql`]). Changes made inside a transaction count only once it commits.

use std::collections::BTreeMap;
use std::sync::Arc;

/// One change to a session setting, as the statement that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingChange {
    /// A new value for `name`, as the statement that sets it again (`SET name TO value`, or
    /// `set_config` for raw values from a startup packet, whose list syntax SET would quote).
    Set(String, String),
    /// `RESET name` or `SET name TO DEFAULT`: back to the session default.
    Reset(String),
    /// `RESET ALL`.
    ResetAll,
}

/// A setting change with where it happened: `real` changes ran on the server; the others
/// (`DISCARD ALL`, answered by pgmemo) change only the client's view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackedChange {
    pub change: SettingChange,
    pub real: bool,
}

/// What one client has set: its startup parameters (the session defaults `RESET` returns to)
/// and its later `SET`s.
#[derive(Debug, Default, Clone)]
pub struct ClientSettings {
    startup: BTreeMap<String, String>,
    overrides: BTreeMap<String, String>,
    /// Bumped by every committed change, so that what depends on the settings (the cache's
    /// session context) knows when to look again.
    version: u64,
    /// The effective [`PARSE_SETTINGS`], written as `digest` is: what a statement prepared
    /// now is analysed under.
    parse_digest: Arc<str>,
    /// The effective settings written out in name order, rebuilt on every change: what a
    /// server records as the settings it is in step with. Clients sharing servers usually have
    /// the same settings, and comparing this costs a pointer or one short `memcmp` where
    /// walking both maps cost a tenth of a pooled transaction's work.
    digest: Arc<str>,
}

impl ClientSettings {
    /// Settings from a client's startup packet: `(name, raw value)`.
    pub fn from_startup(params: &[(String, String)]) -> ClientSettings {
        let mut settings = ClientSettings {
            startup: params
                .iter()
                .map(|(k, v)| {
                    let name = k.to_ascii_lowercase();
                    let replay = set_raw_sql(&name, v);
                    (name, replay)
                })
                .collect(),
            overrides: BTreeMap::new(),
            version: 0,
            digest: Arc::from(""),
            parse_digest: Arc::from(""),
        };
        settings.digest = settings.write_digest();
        settings.parse_digest = settings.write_parse_digest();
        settings
    }

    /// The statements that give the settings of the client's startup packet (name, replay),
    /// its session defaults: what `RESET` returns to.
    pub fn startup(&self) -> impl Iterator<Item = (&String, &String)> {
        self.startup.iter()
    }

    /// Changes whenever the settings do.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// These settings after `change`, uncommitted: what a statement later in the same Query
    /// runs under.
    pub fn after(&self, change: &SettingChange) -> ClientSettings {
        let mut next = self.clone();
        next.apply(change);
        next
    }

    /// The value (as SQL) the client's session has for `name`, if it set one.
    pub fn effective(&self, name: &str) -> Option<&String> {
        self.overrides.get(name).or_else(|| self.startup.get(name))
    }

    fn apply(&mut self, change: &SettingChange) {
        self.version += 1;
        match change {
            SettingChange::Set(name, value) => {
                self.overrides.insert(name.clone(), value.clone());
            }
            SettingChange::Reset(name) => {
                self.overrides.remove(name);
            }
            SettingChange::ResetAll => self.overrides.clear(),
        }
        self.digest = self.write_digest();
        self.parse_digest = self.write_parse_digest();
    }

    /// The client's settings that PostgreSQL reads when it analyses a statement
    /// ([`PARSE_SETTINGS`]): a statement prepared on a server under other values of them reads
    /// its literals differently, so statements are shared between clients only when these
    /// are equal (`StatementKey::settings`).
    pub fn parse_digest(&self) -> &Arc<str> {
        &self.parse_digest
    }

    /// Every effective setting as `len:name len:value`, in name order: equal exactly when
    /// the effective settings are (lengths keep any two lists apart).
    fn write_digest(&self) -> Arc<str> {
        self.digest_of(|_| true)
    }

    /// [`Self::write_digest`] of the [`PARSE_SETTINGS`] only.
    fn write_parse_digest(&self) -> Arc<str> {
        self.digest_of(|name| PARSE_SETTINGS.contains(&name))
    }

    fn digest_of(&self, keep: impl Fn(&str) -> bool) -> Arc<str> {
        use std::fmt::Write;
        let mut out = String::new();
        for name in self.sorted_names().into_iter().filter(|n| keep(n)) {
            let value = self.effective(name).expect("listed names have values");
            let _ = write!(out, "{}:{name}{}:{value}", name.len(), value.len());
        }
        Arc::from(out)
    }

    fn sorted_names(&self) -> Vec<&String> {
        let mut names: Vec<&String> = self.names().collect();
        names.sort();
        names
    }

    fn names(&self) -> impl Iterator<Item = &String> {
        self.startup.keys().chain(
            self.overrides
                .keys()
                .filter(|k| !self.startup.contains_key(*k)),
        )
    }
}

/// Settings (lower case, as client settings are recorded) that PostgreSQL reads when it
/// parses and analyses a statement rather than when it runs it: how date/time literals are
/// read (`'2020-01-01 00:00'::timestamptz` becomes a constant under the session's TimeZone at
/// PREPARE), how string literals are lexed, `= NULL`, which relations the names mean
/// (`search_path`). A prepared statement keeps that reading until its plan is invalidated by
/// DDL or a `search_path` change, whatever the session sets later. With `search_path` among
/// them, a client's Parse under another path is never answered from a statement a server
/// accepted under the first (PostgreSQL would refuse it at Parse when a table is missing
/// there), and clients on different paths (a schema per tenant) do not make one server-side
/// statement be analysed again at every switch.
pub const PARSE_SETTINGS: &[&str] = &[
    "timezone",
    "datestyle",
    "intervalstyle",
    "timezone_abbreviations",
    "standard_conforming_strings",
    "backslash_quote",
    "escape_string_warning",
    "transform_null_equals",
    "client_encoding",
    // Which tables and functions the names mean: PostgreSQL resolves them at Parse (and
    // parses again when a later execution runs under another search_path).
    "search_path",
];

/// What pgmemo has set on one server connection beyond the server's own defaults.
#[derive(Debug, Clone, Default)]
pub struct ServerSettings {
    applied: BTreeMap<String, String>,
    /// A statement changed settings in a way pgmemo cannot follow (`set_config`, a rolled back
    /// savepoint): the next sync starts with `RESET ALL`.
    pub unknown: bool,
    /// The digest of the client settings the server was last brought in line with, while it
    /// has not changed since (`ClientSettings::digest`).
    in_step_with: Option<Arc<str>>,
}

impl ServerSettings {
    fn apply(&mut self, change: &SettingChange) {
        self.in_step_with = None;
        match change {
            SettingChange::Set(name, value) => {
                self.applied.insert(name.clone(), value.clone());
            }
            SettingChange::Reset(name) => {
                self.applied.remove(name);
            }
            SettingChange::ResetAll => self.applied.clear(),
        }
    }
}

/// Applies the changes of a committed transaction to both views.
pub fn commit(changes: &[TrackedChange], client: &mut ClientSettings, server: &mut ServerSettings) {
    for c in changes {
        client.apply(&c.change);
        if c.real {
            server.apply(&c.change);
        }
    }
}

/// What a server whose session state pgmemo lost track of runs before its next use: the
/// user it logged in as (`RESET ALL` leaves the role and session authorization alone), its
/// settings back to their defaults, and no session-level advisory locks or temporary tables
/// (which transaction pooling never lets a client create directly, so any there leaked from
/// code pgmemo could not see into).
const UNKNOWN_STATE_RESET: &str = "SET SESSION AUTHORIZATION DEFAULT;RESET ROLE;RESET ALL;\
     SELECT pg_catalog.pg_advisory_unlock_all();DISCARD TEMP;";

/// The statements that make the server's settings equal the client's, or `None` when they
/// already are. On success the caller records `server` as in step (done here, optimistically:
/// a failure marks the server unknown).
pub fn sync_sql(client: &ClientSettings, server: &mut ServerSettings) -> Option<String> {
    if !server.unknown {
        match &server.in_step_with {
            // Arc's equality compares the pointers first.
            Some(digest) if *digest == client.digest => return None,
            Some(_) => {}
            None if in_step(client, server) => {
                server.in_step_with = Some(client.digest.clone());
                return None;
            }
            None => {}
        }
    }
    server.in_step_with = Some(client.digest.clone());
    let mut sql = String::new();
    if server.unknown {
        // Whatever ran there (set_config, a DO block, a procedure) may also have left session
        // state that transaction pooling refuses to create: advisory locks, temporary tables.
        sql.push_str(UNKNOWN_STATE_RESET);
        server.applied.clear();
        server.unknown = false;
    }
    let stale: Vec<String> = server
        .applied
        .keys()
        .filter(|k| client.effective(k).is_none())
        .cloned()
        .collect();
    for name in stale {
        sql.push_str(&format!("RESET {name};"));
        server.applied.remove(&name);
    }
    for name in client.names() {
        let value = client.effective(name).expect("listed names have values");
        if server.applied.get(name) != Some(value) {
            sql.push_str(value);
            sql.push(';');
            server.applied.insert(name.clone(), value.clone());
        }
    }
    (!sql.is_empty()).then_some(sql)
}

/// Whether the server has exactly the client's settings: one pass over both sorted maps,
/// without allocating (clients sharing servers usually have the same settings).
fn in_step(client: &ClientSettings, server: &ServerSettings) -> bool {
    let mut applied = server.applied.iter();
    let mut startup = client.startup.iter().peekable();
    let mut overrides = client.overrides.iter().peekable();
    loop {
        // The client's next effective setting in name order (an override wins).
        let next = match (startup.peek(), overrides.peek()) {
            (None, None) => None,
            (Some(_), None) => startup.next(),
            (None, Some(_)) => overrides.next(),
            (Some((s, _)), Some((o, _))) => match s.cmp(o) {
                std::cmp::Ordering::Less => startup.next(),
                std::cmp::Ordering::Greater => overrides.next(),
                std::cmp::Ordering::Equal => {
                    startup.next();
                    overrides.next()
                }
            },
        };
        match (next, applied.next()) {
            (None, None) => return true,
            (Some((k, v)), Some((ak, av))) if k == ak && v == av => {}
            _ => return false,
        }
    }
}

/// `StatementKey::settings` of a statement prepared under analysis settings pgmemo cannot
/// tell (after a `SET` earlier in the same Query, or a `SET LOCAL` in the open transaction):
/// never shared, and prepared again under the settings in force then ([`analysis_switch`]
/// gives no switch). Never a digest, which is empty or starts with a length.
pub const UNKNOWN_PARSE_SETTINGS: &str = "?";

/// A statement prepared under `parse_digest` (a `StatementKey::settings`) lexes its text as
/// under PostgreSQL's defaults: `standard_conforming_strings` was not changed (and the
/// settings are known), so pgmemo may read the text itself (parameter counts, whether it
/// returns rows).
pub fn lexes_as_default(parse_digest: &str) -> bool {
    parse_digest != UNKNOWN_PARSE_SETTINGS && !parse_digest.contains("standard_conforming_strings")
}

/// The `DO` blocks that set a server's analysis settings ([`PARSE_SETTINGS`]) to those a
/// statement was first prepared under (`prepared_under`, its `StatementKey::settings`) and
/// back to the client's, around pgmemo preparing it again on a server that lacks it: PostgreSQL
/// reads a statement's literals (`'2024-01-01'::timestamptz`) and resolves its names and
/// parameter types when it prepares it, and keeps that reading after a later `SET`, so the
/// server must read it as the first one did.
///
/// `search_path` included: when the client now runs under a path that resolves to other
/// schemas, PostgreSQL analyses its statement again at execution, under every setting then in
/// force but keeping the parameter types its first analysis resolved (`function f(integer)
/// does not exist`), and the server does the same with the statement prepared this way; one
/// prepared under the current path would resolve them anew (`f(unknown)`).
///
/// `None` when nothing differs from `client` (the server's settings now). Also `None` for a
/// value that would end the block early (it then reads under the current settings).
pub fn analysis_switch(prepared_under: &str, client: &ClientSettings) -> Option<(String, String)> {
    if prepared_under == UNKNOWN_PARSE_SETTINGS {
        return None;
    }
    let then = digest_entries(prepared_under)?;
    let was = |name: &str| then.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
    let (mut to, mut back) = (String::new(), String::new());
    for name in PARSE_SETTINGS {
        let (then, now) = (was(name), client.effective(name).map(String::as_str));
        if then != now {
            to.push_str(&in_block(name, then));
            back.push_str(&in_block(name, now));
        }
    }
    if to.is_empty() || to.contains("$pgmemo$") || back.contains("$pgmemo$") {
        return None;
    }
    let block = |body: &str| format!("DO $pgmemo$BEGIN {body} END$pgmemo$");
    Some((block(&to), block(&back)))
}

/// The PL/pgSQL statement that gives `name` the value a replay sets, or its default.
fn in_block(name: &str, replay: Option<&str>) -> String {
    match replay {
        None => format!("RESET {name};"),
        Some(sql) => set_raw_in_block(sql).unwrap_or_else(|| format!("{sql};")),
    }
}

/// Whether two parse digests (`ClientSettings::parse_digest`) differ in a setting other than
/// `search_path`; `true` when either cannot be read.
pub fn differ_beyond_search_path(a: &str, b: &str) -> bool {
    let rest = |digest| {
        digest_entries(digest).map(|entries| {
            entries
                .into_iter()
                .filter(|(name, _)| *name != "search_path")
                .collect::<Vec<_>>()
        })
    };
    match (rest(a), rest(b)) {
        (Some(a), Some(b)) => a != b,
        _ => true,
    }
}

/// The `(name, replay)` pairs of a digest written by `ClientSettings::digest_of`.
fn digest_entries(mut digest: &str) -> Option<Vec<(&str, &str)>> {
    fn counted(s: &str) -> Option<(&str, &str)> {
        let (len, rest) = s.split_once(':')?;
        let len: usize = len.parse().ok()?;
        Some((rest.get(..len)?, rest.get(len..)?))
    }
    let mut entries = Vec::new();
    while !digest.is_empty() {
        let (name, rest) = counted(digest)?;
        let (value, rest) = counted(rest)?;
        entries.push((name, value));
        digest = rest;
    }
    Some(entries)
}

/// The statement that sets `name` from a raw value, as a startup packet would.
pub fn set_raw_sql(name: &str, value: &str) -> String {
    format!(
        "SELECT pg_catalog.set_config({}, {}, false)",
        quote_literal(name),
        quote_literal(value)
    )
}

/// A replay from [`set_raw_sql`] as a statement of a PL/pgSQL block (`PERFORM`, so that it
/// returns no rows): `None` for anything else.
pub fn set_raw_in_block(replay: &str) -> Option<String> {
    replay
        .strip_prefix("SELECT pg_catalog.set_config(")
        .map(|args| format!("PERFORM pg_catalog.set_config({args};"))
}

/// The statement that replays `SET name TO values`.
pub fn set_sql(name: &str, values: &str) -> String {
    format!("SET {name} TO {values}")
}

/// A setting name safe to splice into `SET name`: letters, digits, `_`, `$` and the dots of
/// custom (`myapp.user`) settings.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b == b'.')
}

/// A string as a SQL literal whatever `standard_conforming_strings` says.
pub fn quote_literal(value: &str) -> String {
    if value.contains('\\') {
        format!("E'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
    } else {
        format!("'{}'", value.replace('\'', "''"))
    }
}

/// Splits a startup `options` value (`-c name=value --name=value`, backslash escapes a space)
/// into settings; `None` when it holds anything else (command-line switches pgmemo cannot
/// replay with SET).
pub fn parse_options(options: &str) -> Option<Vec<(String, String)>> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut chars = options.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => word.extend(chars.next()),
            c if c.is_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    let mut settings = Vec::new();
    let mut iter = words.into_iter();
    while let Some(w) = iter.next() {
        let pair = if w == "-c" {
            iter.next()?
        } else if let Some(rest) = w.strip_prefix("--").or_else(|| w.strip_prefix("-c")) {
            rest.to_owned()
        } else {
            return None;
        };
        let (name, value) = pair.split_once('=')?;
        let name = name.replace('-', "_").to_ascii_lowercase();
        if !valid_name(&name) {
            return None;
        }
        settings.push((name, value.to_owned()));
    }
    Some(settings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_replay_runs_in_a_block() {
        let replay = set_raw_sql("search_path", "a, 'b'");
        assert_eq!(
            set_raw_in_block(&replay).as_deref(),
            Some("PERFORM pg_catalog.set_config('search_path', 'a, ''b''', false);")
        );
        assert_eq!(set_raw_in_block(&set_sql("work_mem", "'8MB'")), None);
    }

    fn set(name: &str, value: &str) -> TrackedChange {
        TrackedChange {
            change: SettingChange::Set(name.into(), value.into()),
            real: true,
        }
    }

    #[test]
    fn a_server_is_brought_in_line_with_each_client() {
        let mut a = ClientSettings::from_startup(&[("application_name".into(), "a".into())]);
        let b = ClientSettings::from_startup(&[]);
        let mut server = ServerSettings::default();
        assert_eq!(
            sync_sql(&a, &mut server).as_deref(),
            Some("SELECT pg_catalog.set_config('application_name', 'a', false);")
        );
        assert_eq!(sync_sql(&a, &mut server), None);
        commit(
            &[set("timezone", "SET timezone TO 'UTC'")],
            &mut a,
            &mut server,
        );
        assert_eq!(sync_sql(&a, &mut server), None);
        assert_eq!(
            sync_sql(&b, &mut server).as_deref(),
            Some("RESET application_name;RESET timezone;")
        );
        assert_eq!(
            sync_sql(&a, &mut server).as_deref(),
            Some(
                "SELECT pg_catalog.set_config('application_name', 'a', false);\
                 SET timezone TO 'UTC';"
            )
        );
    }

    #[test]
    fn a_statement_is_prepared_again_under_the_analysis_settings_it_had() {
        let mut a = ClientSettings::from_startup(&[("datestyle".into(), "ISO".into())]);
        let mut server = ServerSettings::default();
        let first = a.parse_digest().clone();
        assert_eq!(analysis_switch(&first, &a), None);
        commit(
            &[
                set("timezone", "SET timezone TO 'UTC'"),
                set("application_name", "SET application_name TO 'x'"),
            ],
            &mut a,
            &mut server,
        );
        assert_eq!(
            analysis_switch(&first, &a),
            Some((
                "DO $pgmemo$BEGIN RESET timezone; END$pgmemo$".into(),
                "DO $pgmemo$BEGIN SET timezone TO 'UTC'; END$pgmemo$".into()
            ))
        );
        let utc = a.parse_digest().clone();
        commit(
            &[set("datestyle", "SET datestyle TO 'SQL'")],
            &mut a,
            &mut server,
        );
        assert_eq!(
            analysis_switch(&utc, &a),
            Some((
                "DO $pgmemo$BEGIN PERFORM pg_catalog.set_config('datestyle', 'ISO', false); \
                 END$pgmemo$"
                    .into(),
                "DO $pgmemo$BEGIN SET datestyle TO 'SQL'; END$pgmemo$".into()
            ))
        );
        // Another search_path: prepared under the first one too; the server analyses it again
        // at execution, keeping the parameter types that first reading resolved.
        commit(
            &[set("search_path", "SET search_path TO other")],
            &mut a,
            &mut server,
        );
        assert_eq!(
            analysis_switch(&utc, &a),
            Some((
                "DO $pgmemo$BEGIN PERFORM pg_catalog.set_config('datestyle', 'ISO', false);\
                 RESET search_path; END$pgmemo$"
                    .into(),
                "DO $pgmemo$BEGIN SET datestyle TO 'SQL';SET search_path TO other; END$pgmemo$"
                    .into()
            ))
        );
        assert_eq!(analysis_switch("garbage", &a), None);
        assert_eq!(analysis_switch(UNKNOWN_PARSE_SETTINGS, &a), None);
    }

    #[test]
    fn reset_returns_to_the_startup_value_and_discard_is_client_only() {
        let mut a = ClientSettings::from_startup(&[("datestyle".into(), "ISO".into())]);
        let mut server = ServerSettings::default();
        sync_sql(&a, &mut server);
        commit(
            &[set("datestyle", "SET datestyle TO 'SQL'")],
            &mut a,
            &mut server,
        );
        let reset = TrackedChange {
            change: SettingChange::Reset("datestyle".into()),
            real: true,
        };
        commit(&[reset], &mut a, &mut server);
        assert_eq!(
            sync_sql(&a, &mut server).as_deref(),
            Some("SELECT pg_catalog.set_config('datestyle', 'ISO', false);")
        );
        commit(
            &[set("search_path", "SET search_path TO 'x'")],
            &mut a,
            &mut server,
        );
        let discard = TrackedChange {
            change: SettingChange::ResetAll,
            real: false,
        };
        commit(&[discard], &mut a, &mut server);
        assert_eq!(
            sync_sql(&a, &mut server).as_deref(),
            Some("RESET search_path;")
        );
    }

    #[test]
    fn clients_with_the_same_settings_share_a_server_without_sync() {
        let startup = [
            ("application_name".into(), "app".into()),
            ("datestyle".into(), "ISO".into()),
        ];
        let mut a = ClientSettings::from_startup(&startup);
        let mut b = ClientSettings::from_startup(&startup);
        let mut server = ServerSettings::default();
        assert!(sync_sql(&a, &mut server).is_some());
        assert_eq!(
            sync_sql(&b, &mut server),
            None,
            "same settings, another client"
        );
        // An override equal to nothing applied, then one that shadows a startup value.
        commit(
            &[set("timezone", "SET timezone TO 'UTC'")],
            &mut a,
            &mut server,
        );
        assert_eq!(
            sync_sql(&b, &mut server).as_deref(),
            Some("RESET timezone;")
        );
        b.apply(&SettingChange::Set(
            "datestyle".into(),
            "SET datestyle TO 'SQL'".into(),
        ));
        assert_eq!(
            sync_sql(&b, &mut server).as_deref(),
            Some("SET datestyle TO 'SQL';")
        );
        assert_eq!(sync_sql(&b, &mut server), None);
        assert_eq!(
            sync_sql(&a, &mut server).as_deref(),
            Some("SELECT pg_catalog.set_config('datestyle', 'ISO', false);SET timezone TO 'UTC';")
        );
        a.apply(&SettingChange::Reset("timezone".into()));
        assert_eq!(
            sync_sql(&a, &mut server).as_deref(),
            Some("RESET timezone;")
        );
    }

    #[test]
    fn the_digest_tells_apart_settings_that_differ_in_one_value_or_in_where_it_comes_from() {
        let a = ClientSettings::from_startup(&[("timezone".into(), "UTC".into())]);
        let b = ClientSettings::from_startup(&[("timezone".into(), "CET".into())]);
        let mut server = ServerSettings::default();
        assert!(sync_sql(&a, &mut server).is_some());
        assert_eq!(
            sync_sql(&b, &mut server).as_deref(),
            Some("SELECT pg_catalog.set_config('timezone', 'CET', false);")
        );
        // The same effective value, once from the startup packet and once from a SET, is one
        // digest; a SET of the same value by another statement is not.
        let mut c = ClientSettings::from_startup(&[]);
        c.apply(&SettingChange::Set(
            "timezone".into(),
            set_raw_sql("timezone", "CET"),
        ));
        assert_eq!(c.digest, b.digest);
        assert_eq!(sync_sql(&c, &mut server), None);
        c.apply(&SettingChange::Set(
            "timezone".into(),
            "SET timezone TO 'CET'".into(),
        ));
        assert_ne!(c.digest, b.digest);
        assert!(sync_sql(&c, &mut server).is_some());
    }

    #[test]
    fn unknown_server_state_starts_over() {
        let a = ClientSettings::from_startup(&[("timezone".into(), "UTC".into())]);
        let mut server = ServerSettings {
            unknown: true,
            ..Default::default()
        };
        assert_eq!(
            sync_sql(&a, &mut server).as_deref(),
            Some(
                "SET SESSION AUTHORIZATION DEFAULT;RESET ROLE;RESET ALL;\
                 SELECT pg_catalog.pg_advisory_unlock_all();DISCARD TEMP;\
                 SELECT pg_catalog.set_config('timezone', 'UTC', false);"
            )
        );
    }

    #[test]
    fn options_become_settings() {
        assert_eq!(
            parse_options("-c search_path=a,b --statement-timeout=5s -cDateStyle=ISO"),
            Some(vec![
                ("search_path".into(), "a,b".into()),
                ("statement_timeout".into(), "5s".into()),
                ("datestyle".into(), "ISO".into()),
            ])
        );
        assert_eq!(
            parse_options(r"-c application_name=a\ b"),
            Some(vec![("application_name".into(), "a b".into())])
        );
        assert_eq!(parse_options("-B 100"), None);
        assert_eq!(parse_options("-c x;drop=1"), None);
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal(r"a\b"), r"E'a\\b'");
    }
}

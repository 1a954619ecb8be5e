//! The cache policy (doctrine rule 1 and the invalidation rules): from the parser's analysis of
//! a statement and the catalog's facts about its names, decide whether its result may be
//! cached (and on which tables it depends), and what running it does to other results and to
//! the session (tables written, writes pgmemo cannot attribute, settings changed, snapshot
//! isolation begun).

use std::sync::Arc;
use std::time::Duration;

use sql::{
    IsolationLevel, SetCommand, StatementInfo, StatementKind, TransactionCommand, TransactionModes,
};

use super::catalog::{Facts, HiddenCode, Reach};
use super::stats::QueryStats;

macro_rules! refusals {
    ($($variant:ident => $name:literal,)*) => {
        /// Why a result was not served from or stored in the cache. The names appear in
        /// `SHOW CACHE`, `SHOW QUERIES`, `EXPLAIN CACHE` and the metrics.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Refusal { $($variant,)* }

        impl Refusal {
            /// Every reason, in declaration order.
            pub const ALL: &'static [Refusal] = &[$(Refusal::$variant,)*];
            /// How many reasons there are.
            pub const COUNT: usize = Self::ALL.len();

            /// The reason's stable name.
            pub fn name(self) -> &'static str {
                match self { $(Refusal::$variant => $name,)* }
            }
        }
    };
}

refusals! {
    NotARead => "not_a_read",
    MultipleStatements => "multiple_statements",
    ParseError => "parse_error",
    VolatileFunction => "volatile_function",
    StableFunction => "stable_function",
    UnknownFunction => "unknown_function",
    TimeFunction => "time_function",
    TimeLiteral => "time_literal",
    Locking => "locking_clause",
    SelectInto => "select_into",
    DataModifyingCte => "data_modifying_cte",
    Tablesample => "tablesample",
    TempTable => "temp_table",
    UnloggedTable => "unlogged_table",
    SystemCatalog => "system_catalog",
    RowLevelSecurity => "row_level_security",
    Sequence => "sequence",
    ForeignTable => "foreign_table",
    UnknownRelation => "unknown_relation",
    ExcludedTable => "excluded_table",
    Hint => "nocache_hint",
    SessionOff => "session_cache_off",
    CacheOff => "cache_off",
    TransactionWrote => "transaction_wrote",
    SnapshotIsolation => "snapshot_isolation",
    LogMessages => "log_messages",
    SettingsUnknown => "settings_unknown",
    CatalogUnavailable => "catalog_unavailable",
    Pipelined => "pipelined",
    UnsupportedBatch => "unsupported_batch",
    PortalSuspension => "portal_suspension",
    TooLarge => "too_large",
    NotStored => "response_not_cacheable",
    UnknownStatement => "unknown_prepared_statement",
    ParsedElsewhere => "parsed_under_other_settings",
    FeedDown => "invalidation_feed_down",
    AwaitingFeed => "awaiting_own_write_on_feed",
    UntrackedSessions => "untracked_sessions",
}

/// What a cacheable read depends on.
#[derive(Debug, Clone)]
pub struct ReadPlan {
    /// Every relation (OID, `schema.name`) whose change must invalidate the result.
    pub tables: Vec<(u32, String)>,
    /// A `/* pgmemo:ttl=... */` hint.
    pub ttl: Option<Duration>,
    /// The generation records of `tables`, attached once per plan so that a miss snapshots
    /// them without looking them up (see [`super::generation::Generations::attach`]).
    pub generations: Vec<std::sync::Arc<super::generation::TableGeneration>>,
}

/// What running a statement does beyond returning its result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effects {
    /// Tables (OIDs) whose cached results become stale when the write commits.
    pub writes: Vec<u32>,
    /// The statement may write where pgmemo cannot see (DDL, DO, CALL, volatile functions,
    /// triggers, statements it cannot parse): every result of the database becomes stale.
    pub database_wide: bool,
    /// Definitions changed: memoized analyses of the database must go.
    pub ddl: bool,
    /// Roles changed (membership, attributes): they belong to the whole cluster, so the
    /// results of every database must go.
    pub all_databases: bool,
    /// Session settings that are part of the key may have changed.
    pub settings: bool,
    /// Code pgmemo cannot see into (a volatile user-defined function, `DO`, `CALL`, a
    /// statement it cannot classify) may have changed session state on the server. Under
    /// transaction pooling that server is reset before its next use, so the change cannot
    /// reach another client (nor results cached under another client's settings).
    pub hidden_settings: bool,
    /// The transaction now runs under REPEATABLE READ or SERIALIZABLE.
    pub snapshot: bool,
    /// `ROLLBACK`: the transaction's writes never happened.
    pub rollback: bool,
}

impl Effects {
    /// Adds another statement's effects.
    pub fn merge(&mut self, other: &Effects) {
        for oid in &other.writes {
            if !self.writes.contains(oid) {
                self.writes.push(*oid);
            }
        }
        self.database_wide |= other.database_wide;
        self.ddl |= other.ddl;
        self.all_databases |= other.all_databases;
        self.settings |= other.settings;
        self.hidden_settings |= other.hidden_settings;
        self.snapshot |= other.snapshot;
        self.rollback |= other.rollback;
    }

    /// Whether there is anything to do at all.
    pub fn is_empty(&self) -> bool {
        *self == Effects::default()
    }

    /// Whether the statement changes data (so a transaction running it has written).
    pub fn writes_data(&self) -> bool {
        !self.writes.is_empty() || self.database_wide
    }
}

/// The memoized outcome of analysing one statement shape in one session context.
#[derive(Debug)]
pub struct Plan {
    /// Counters of the statement.
    pub query: Arc<QueryStats>,
    /// Whether (and on what) its result may be cached.
    pub read: Result<ReadPlan, Refusal>,
    /// What running it does.
    pub effects: Effects,
    /// Whether this plan is final (catalog answered) and may be memoized.
    pub complete: bool,
    /// Prepared statement names the statement creates or drops.
    pub statements: Vec<StatementChange>,
    /// The plans epoch (`DatabaseCache::plans_epoch`) it was made in. DDL bumps it, and may
    /// have changed what the statement reads (a new partition, a table dropped and created
    /// again): a result is captured under this plan only if the epoch is still the same once
    /// the capture's generation snapshot is taken.
    pub epoch: u64,
}

/// A change to the session's prepared statements made by SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatementChange {
    /// `PREPARE name` or `DEALLOCATE name`: pgmemo no longer knows what `name` means.
    Forget(String),
    /// `DEALLOCATE ALL`, `DISCARD ALL`.
    ForgetAll,
    /// `EXECUTE name`: the server may analyse `name` again (after DDL or a search_path
    /// change), under settings pgmemo does not tie to the statement.
    MayAnalyse(String),
}

fn statement_changes(statements: &[StatementInfo]) -> Vec<StatementChange> {
    statements
        .iter()
        .filter_map(|s| match &s.kind {
            StatementKind::Prepare { name, .. } => Some(StatementChange::Forget(name.clone())),
            StatementKind::Execute { name, .. } => Some(StatementChange::MayAnalyse(name.clone())),
            StatementKind::Deallocate { name: Some(name) } => {
                Some(StatementChange::Forget(name.clone()))
            }
            StatementKind::Deallocate { name: None }
            | StatementKind::Discard(sql::DiscardKind::All) => Some(StatementChange::ForgetAll),
            _ => None,
        })
        .collect()
}

/// Hints found in comments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hints {
    pub nocache: bool,
    pub ttl: Option<Duration>,
}

/// Reads `/* pgmemo:nocache */`, `/* pgmemo:ttl=30s */` and Pgpool-II's `/*NO QUERY CACHE*/`.
pub fn hints(comments: &[String]) -> Hints {
    let mut h = Hints::default();
    for c in comments {
        let lower = c.to_ascii_lowercase();
        if lower.contains("pgmemo:nocache") || lower.contains("no query cache") {
            h.nocache = true;
        }
        if let Some(pos) = lower.find("pgmemo:ttl=") {
            let rest = &lower[pos + "pgmemo:ttl=".len()..];
            let value: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            if let Ok(units) = crate::config::Seconds::parse(&value) {
                h.ttl = Some(units.0);
            }
        }
    }
    h
}

/// A name as (optional schema, name), owned.
pub type OwnedName = (Option<String>, String);

/// The names a statement list needs looked up, each list without repeats; indexes into them
/// are what the catalog's answer ([`Facts`]) refers to.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LookupNames {
    /// Relations read or written.
    pub relations: Vec<OwnedName>,
    pub functions: Vec<OwnedName>,
    pub operators: Vec<OwnedName>,
    /// Target types of explicit casts.
    pub casts: Vec<OwnedName>,
    /// Names that may be attribute-notation calls (`sql::StatementInfo::attributes`),
    /// unqualified.
    pub attributes: Vec<OwnedName>,
}

/// The names `statements` need looked up.
pub fn names_to_look_up(statements: &[StatementInfo]) -> LookupNames {
    fn add(list: &mut Vec<OwnedName>, schema: &Option<String>, name: &str) {
        if !list.iter().any(|(s, n)| s == schema && n == name) {
            list.push((schema.clone(), name.to_owned()));
        }
    }
    let mut names = LookupNames::default();
    for s in statements {
        for r in s.reads.iter().chain(&s.writes) {
            add(&mut names.relations, &r.schema, &r.name);
        }
        for f in &s.functions {
            add(&mut names.functions, &f.schema, &f.name);
        }
        for o in &s.operators {
            add(&mut names.operators, &o.schema, &o.name);
        }
        for c in &s.casts {
            add(&mut names.casts, &c.schema, &c.name);
        }
        for a in &s.attributes {
            add(&mut names.attributes, &None, a);
        }
    }
    names
}

/// Whether the statements need a catalog lookup at all (a SET, BEGIN or SHOW does not).
///
/// Never for a text that sets the transaction's characteristics (`BEGIN ISOLATION LEVEL ...`,
/// `SET TRANSACTION ...`, `SET TRANSACTION SNAPSHOT`): inside a block where nothing has run
/// yet, pgmemo's lookup would be the block's first query, after which PostgreSQL refuses them
/// (25001 "must be called before any query"); such a text is planned conservatively.
pub fn needs_catalog(statements: &[StatementInfo]) -> bool {
    if statements.iter().any(sets_transaction_characteristics) {
        return false;
    }
    statements.iter().any(|s| {
        !s.functions.is_empty()
            || ((!s.operators.is_empty() || !s.casts.is_empty() || !s.attributes.is_empty())
                && is_query(s))
            || (!s.reads.is_empty() && is_query(s))
            || (!s.writes.is_empty()
                && (is_dml(&s.kind) || matches!(s.kind, StatementKind::Copy { from: false, .. })))
    })
}

/// See [`needs_catalog`]: a plain `BEGIN` (no modes) sets nothing.
fn sets_transaction_characteristics(s: &StatementInfo) -> bool {
    match &s.kind {
        StatementKind::Transaction(TransactionCommand::Begin(modes)) => {
            *modes != TransactionModes::default()
        }
        StatementKind::Set(SetCommand::Transaction(_) | SetCommand::TransactionSnapshot { .. }) => {
            true
        }
        _ => false,
    }
}

fn is_query(s: &StatementInfo) -> bool {
    matches!(s.kind, StatementKind::Select | StatementKind::Values)
}

fn is_dml(kind: &StatementKind) -> bool {
    matches!(
        kind,
        StatementKind::Insert
            | StatementKind::Update
            | StatementKind::Delete
            | StatementKind::Merge
            | StatementKind::Truncate { .. }
            | StatementKind::Copy { from: true, .. }
    )
}

/// Everything `decide` needs besides the statements.
pub struct Inputs<'a> {
    pub facts: Option<&'a Facts>,
    /// The names looked up (indexes in `facts` refer to them).
    pub names: &'a LookupNames,
    /// Volatility of the functions views call (worst first), when views were involved.
    pub view_function_volatility: Option<u8>,
    /// Whether a function a view calls may change the session's settings.
    pub view_functions_may_change_settings: bool,
    /// A view read holds a row-locking clause (`CREATE VIEW v AS ... FOR UPDATE`): reading it
    /// locks rows, which a result served from memory would not.
    pub view_locking: bool,
    pub hints: &'a Hints,
    /// Tables (`schema.name`) never cached.
    pub excluded: &'a dyn Fn(&str, &str) -> bool,
}

/// Decides a plan for analysed statements.
pub fn decide(statements: &[StatementInfo], inputs: &Inputs<'_>, query: Arc<QueryStats>) -> Plan {
    let mut effects = Effects::default();
    for s in statements {
        effects.merge(&statement_effects(s, inputs));
    }
    let read = match statements {
        [] => Err(Refusal::NotARead),
        [s] => read_plan(s, inputs),
        _ => Err(Refusal::MultipleStatements),
    };
    let complete = inputs.facts.is_some() || !needs_catalog(statements);
    Plan {
        query,
        read,
        effects,
        complete,
        statements: statement_changes(statements),
        epoch: 0,
    }
}

/// The plan for a statement pgmemo could not parse: the server may still run it (a newer
/// syntax), so it is treated as writing anything and changing settings.
pub fn unparsable(query: Arc<QueryStats>) -> Plan {
    Plan {
        query,
        read: Err(Refusal::ParseError),
        effects: Effects {
            database_wide: true,
            settings: true,
            hidden_settings: true,
            ..Effects::default()
        },
        complete: true,
        statements: vec![StatementChange::ForgetAll],
        epoch: 0,
    }
}

fn name_index(
    names: &[(Option<String>, String)],
    schema: &Option<String>,
    name: &str,
) -> Option<usize> {
    names.iter().position(|(s, n)| s == schema && n == name)
}

/// The worst volatility among the functions a statement calls, its user-defined operators
/// included (`v` > `s` > `i`): `None` when a function name resolves to no function,
/// `Some(b'i')` when it calls none.
fn worst_volatility(s: &StatementInfo, inputs: &Inputs<'_>) -> Option<u8> {
    let facts = inputs.facts?;
    // `OPERATOR(pg_temp.op)` and `::pg_temp.type` name the session's own temporary schema,
    // which the catalog knows as `pg_temp_N`: the lookup finds nothing for them, which would
    // read as a built-in operator or cast. Each session may define them differently.
    let temp = |schema: &Option<String>| schema.as_deref() == Some("pg_temp");
    if s.operators.iter().any(|o| temp(&o.schema)) || s.casts.iter().any(|c| temp(&c.schema)) {
        return None;
    }
    let mut worst = b'i';
    for f in &s.functions {
        let i = name_index(&inputs.names.functions, &f.schema, &f.name)?;
        let mut found = false;
        for p in facts.functions.iter().filter(|p| p.name_index == i) {
            found = true;
            worst = worse(worst, p.volatility);
        }
        if !found {
            return None;
        }
    }
    Some(hidden_calls(s, inputs, facts).fold(worst, worse))
}

/// The volatilities of the functions `s` calls without naming them, as far as the catalog's
/// answer has them: behind its user-defined operators and casts (see `catalog::Facts`; an
/// operator or cast with none is a built-in one).
fn hidden_calls<'a>(
    s: &'a StatementInfo,
    inputs: &'a Inputs<'_>,
    facts: &'a Facts,
) -> impl Iterator<Item = u8> + 'a {
    let operators = s.operators.iter().filter_map(|o| {
        name_index(&inputs.names.operators, &o.schema, &o.name).map(|i| (&facts.operators, i))
    });
    let casts = s.casts.iter().filter_map(|c| {
        name_index(&inputs.names.casts, &c.schema, &c.name).map(|i| (&facts.casts, i))
    });
    let attributes = s.attributes.iter().filter_map(|a| {
        name_index(&inputs.names.attributes, &None, a).map(|i| (&facts.attributes, i))
    });
    operators
        .chain(casts)
        .chain(attributes)
        .flat_map(|(found, i)| {
            found
                .iter()
                .filter(move |p| p.name_index == i)
                .map(|p| p.volatility)
        })
}

/// Whether the catalog's answer shows a volatile function behind a user-defined operator or
/// cast of `s`.
fn calls_volatile_hidden(s: &StatementInfo, inputs: &Inputs<'_>) -> bool {
    inputs
        .facts
        .is_some_and(|facts| hidden_calls(s, inputs, facts).any(|v| v == b'v'))
}

/// The worse of two volatilities (`v` > `s` > `i`; anything else counts as `v`).
pub fn worse(a: u8, b: u8) -> u8 {
    let rank = |v: u8| match v {
        b'i' => 0,
        b's' => 1,
        _ => 2,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

fn statement_effects(s: &StatementInfo, inputs: &Inputs<'_>) -> Effects {
    let mut e = Effects::default();
    match &s.kind {
        StatementKind::Set(_) | StatementKind::Discard(_) => e.settings = true,
        StatementKind::Transaction(TransactionCommand::Begin(modes)) => {
            e.snapshot = matches!(
                modes.isolation,
                Some(IsolationLevel::RepeatableRead | IsolationLevel::Serializable)
            );
        }
        StatementKind::Transaction(TransactionCommand::Rollback { .. }) => e.rollback = true,
        // The prepared transaction may have run anything, DDL included.
        StatementKind::Transaction(TransactionCommand::CommitPrepared { .. }) => {
            e.database_wide = true;
            e.ddl = true;
        }
        StatementKind::Transaction(_)
        | StatementKind::Show { .. }
        | StatementKind::Prepare { .. }
        | StatementKind::Deallocate { .. }
        | StatementKind::Listen { .. }
        | StatementKind::Unlisten { .. }
        | StatementKind::Notify { .. }
        | StatementKind::Fetch { .. }
        | StatementKind::Close { .. }
        | StatementKind::Vacuum
        | StatementKind::Analyze
        | StatementKind::Lock
        | StatementKind::Checkpoint => {}
        // COPY (UPDATE ... RETURNING ...) TO STDOUT writes like the DML it wraps.
        StatementKind::Copy { from: false, .. } => {
            if !s.writes.is_empty() {
                e.merge(&dml_effects(s, inputs));
            }
        }
        StatementKind::Select
        | StatementKind::Values
        | StatementKind::DeclareCursor { .. }
        | StatementKind::Explain { .. } => {
            if s.data_modifying_cte {
                e.merge(&dml_effects(s, inputs));
            }
            // SELECT ... INTO creates a table, as CREATE TABLE AS does.
            if s.select_into {
                ddl_effects(s, &mut e);
            }
            if let StatementKind::Explain {
                analyze: true,
                inner,
            } = &s.kind
            {
                e.merge(&statement_effects(inner, inputs));
            }
        }
        // The tables it empties besides the named ones are known only to the server.
        StatementKind::Truncate { cascade: true } => e.database_wide = true,
        k if is_dml(k) => e.merge(&dml_effects(s, inputs)),
        // Reorder or rebuild storage without changing any row.
        StatementKind::Other(node) if node == "ClusterStmt" || node == "ReindexStmt" => {}
        StatementKind::Ddl => ddl_effects(s, &mut e),
        // EXECUTE: its statement is the session's, planned when it was prepared.
        StatementKind::Execute { .. } => {
            e.database_wide = true;
            e.settings = true;
        }
        // DO, CALL, anything unclassified.
        _ => {
            e.database_wide = true;
            e.settings = true;
            e.hidden_settings = true;
        }
    }
    // A volatile (or unknown) function may write anything; some may change settings. So may
    // one behind a user-defined operator or cast (known only from the catalog: without it,
    // operators and casts are taken for the built-in ones nearly every statement uses).
    if !s.functions.is_empty() && worst_volatility(s, inputs).is_none_or(|v| v == b'v') {
        e.database_wide = true;
        let may = may_change_settings(s, inputs);
        e.settings |= may;
        e.hidden_settings |= may;
    }
    if calls_volatile_hidden(s, inputs) {
        e.database_wide = true;
        e.settings = true;
        e.hidden_settings = true;
    }
    // Without the catalog, any relation read may be a view calling a volatile function, and
    // an operator, cast or attribute may run a volatile user-defined function: such a
    // statement may write anything until it is planned with the catalog.
    if inputs.facts.is_none()
        && (!s.reads.is_empty()
            || !s.operators.is_empty()
            || !s.casts.is_empty()
            || !s.attributes.is_empty())
    {
        e.database_wide = true;
    }
    // So may a volatile (or unresolvable) function a view calls: reading the view runs it.
    if matches!(inputs.view_function_volatility, Some(b'v' | b'?')) {
        e.database_wide = true;
        e.settings |= inputs.view_functions_may_change_settings;
        e.hidden_settings |= inputs.view_functions_may_change_settings;
    }
    e
}

/// What DDL does: anything of the database may read differently now.
fn ddl_effects(s: &StatementInfo, e: &mut Effects) {
    e.database_wide = true;
    e.ddl = true;
    e.all_databases |= s.changes_roles;
    // CREATE TEMP TABLE changes what names mean to this session (see the context).
    e.settings = true;
}

/// Whether a statement calling volatile functions may change the session's settings: one of
/// them may (see [`super::catalog::Function::may_change_settings`]) or is not known.
fn may_change_settings(s: &StatementInfo, inputs: &Inputs<'_>) -> bool {
    let Some(facts) = inputs.facts else {
        return true;
    };
    s.functions.iter().any(|f| {
        let Some(i) = name_index(&inputs.names.functions, &f.schema, &f.name) else {
            return true;
        };
        let mut overloads = facts
            .functions
            .iter()
            .filter(|p| p.name_index == i)
            .peekable();
        overloads.peek().is_none() || overloads.any(|p| p.may_change_settings(&f.name))
    })
}

fn dml_effects(s: &StatementInfo, inputs: &Inputs<'_>) -> Effects {
    let mut e = Effects::default();
    let Some(facts) = inputs.facts else {
        e.database_wide = true;
        return e;
    };
    for w in &s.writes {
        let Some(i) = name_index(&inputs.names.relations, &w.schema, &w.name) else {
            e.database_wide = true;
            continue;
        };
        if facts.unresolved.contains(&i) {
            // Created by the statement (SELECT INTO) or unknown: nothing cached reads it,
            // unless a temporary table of that name exists.
            if facts.temp_shadowed.contains(&i) {
                e.database_wide = true;
            }
            continue;
        }
        for r in facts.relations.iter().filter(|r| r.name_index == i) {
            if r.reach != Reach::Ancestor && !e.writes.contains(&r.oid) {
                e.writes.push(r.oid);
            }
            hidden_code_effects(r.hidden_code, &mut e);
        }
    }
    e
}

/// What the code a write runs unseen may do (see [`HiddenCode`]). Code that may change
/// settings counts as `DO` does: the session's context is read again before its next read is
/// keyed (a temporary table it created gives the session a context of its own), and the
/// memoized plans go unless the feed reports DDL.
fn hidden_code_effects(code: HiddenCode, e: &mut Effects) {
    match code {
        HiddenCode::Nothing => {}
        HiddenCode::Settings => {
            e.settings = true;
            e.hidden_settings = true;
        }
        HiddenCode::Anything => {
            e.database_wide = true;
            e.settings = true;
            e.hidden_settings = true;
        }
    }
}

fn read_plan(s: &StatementInfo, inputs: &Inputs<'_>) -> Result<ReadPlan, Refusal> {
    if inputs.hints.nocache {
        return Err(Refusal::Hint);
    }
    if !is_query(s) {
        return Err(Refusal::NotARead);
    }
    if s.select_into {
        return Err(Refusal::SelectInto);
    }
    if s.data_modifying_cte {
        return Err(Refusal::DataModifyingCte);
    }
    if s.locking || inputs.view_locking {
        return Err(Refusal::Locking);
    }
    if s.tablesample {
        return Err(Refusal::Tablesample);
    }
    if s.sql_value_functions.iter().any(|f| f.is_time()) {
        return Err(Refusal::TimeFunction);
    }
    let needs_facts = !s.reads.is_empty()
        || !s.functions.is_empty()
        || !s.operators.is_empty()
        || !s.casts.is_empty()
        || !s.attributes.is_empty();
    let facts = match inputs.facts {
        Some(f) => f,
        None if needs_facts => return Err(Refusal::CatalogUnavailable),
        None => {
            return Ok(ReadPlan {
                tables: Vec::new(),
                ttl: inputs.hints.ttl,
                generations: Vec::new(),
            })
        }
    };
    match worst_volatility(s, inputs) {
        None => return Err(Refusal::UnknownFunction),
        Some(b'v') => return Err(Refusal::VolatileFunction),
        Some(b's') => return Err(Refusal::StableFunction),
        _ => {}
    }
    match inputs.view_function_volatility {
        Some(b'v') => return Err(Refusal::VolatileFunction),
        Some(b's') => return Err(Refusal::StableFunction),
        Some(b'?') => return Err(Refusal::UnknownFunction),
        _ => {}
    }
    let mut tables = Vec::new();
    for r in &s.reads {
        let i = name_index(&inputs.names.relations, &r.schema, &r.name)
            .ok_or(Refusal::UnknownRelation)?;
        if facts.unresolved.contains(&i) {
            return Err(Refusal::UnknownRelation);
        }
        if facts.temp_shadowed.contains(&i) {
            return Err(Refusal::TempTable);
        }
        for rel in facts.relations.iter().filter(|x| x.name_index == i) {
            if rel.reach == Reach::Cascade {
                continue;
            }
            check_relation(rel, inputs)?;
            if !tables.iter().any(|(oid, _)| *oid == rel.oid) {
                tables.push((rel.oid, format!("{}.{}", rel.schema, rel.name)));
            }
        }
    }
    Ok(ReadPlan {
        tables,
        ttl: inputs.hints.ttl,
        generations: Vec::new(),
    })
}

fn check_relation(rel: &super::catalog::Relation, inputs: &Inputs<'_>) -> Result<(), Refusal> {
    if matches!(
        rel.schema.as_str(),
        "pg_catalog" | "information_schema" | "pg_toast"
    ) || rel.schema.starts_with("pg_toast")
    {
        return Err(Refusal::SystemCatalog);
    }
    match rel.persistence {
        b't' => return Err(Refusal::TempTable),
        b'u' => return Err(Refusal::UnloggedTable),
        _ => {}
    }
    match rel.kind {
        b'S' => return Err(Refusal::Sequence),
        b'f' => return Err(Refusal::ForeignTable),
        b'r' | b'p' | b'v' | b'm' => {}
        _ => return Err(Refusal::UnknownRelation),
    }
    if rel.row_security {
        return Err(Refusal::RowLevelSecurity);
    }
    if (inputs.excluded)(&rel.schema, &rel.name) {
        return Err(Refusal::ExcludedTable);
    }
    Ok(())
}

//! The result types of the analysis step: what pgmemo learns about each statement of a query
//! string on a cache miss, before it decides (elsewhere) whether to cache, forward or invalidate.

use std::fmt;
use std::ops::Range;

use crate::kind::StatementKind;

/// The analysis of one query string, which may hold several statements (simple query protocol).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Analysis {
    /// One entry per statement, in order. Empty for a string holding only whitespace, comments
    /// or semicolons (PostgreSQL answers those with EmptyQueryResponse).
    pub statements: Vec<StatementInfo>,
}

/// What one statement does, as far as the text alone tells.
///
/// Relations and functions are reported by name as written; resolving them to OIDs (and
/// expanding views) needs the catalog and is pgmemo's job. Lists hold each name once, in the
/// order the walk meets them (close to, but not always, textual order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatementInfo {
    /// What kind of statement this is, with the details session tracking needs.
    pub kind: StatementKind,
    /// Byte range of this statement in the analysed string, without the separating semicolon or
    /// surrounding whitespace, so that pgmemo can split multi-statement strings. For the inner
    /// statement of `PREPARE` or `EXPLAIN` it is the range of the inner statement.
    pub source: Range<usize>,
    /// The text at `source`.
    pub text: String,
    /// Relations whose contents the statement reads: FROM items at any depth (joins, subqueries,
    /// CTE bodies, set operations, sublinks, `INSERT ... SELECT`, `UPDATE ... FROM`,
    /// `DELETE ... USING`, MERGE sources, `COPY ... TO`). Names of CTEs in scope are not
    /// relations and are left out. DML targets are in `writes` only.
    pub reads: Vec<RelationName>,
    /// Relations whose contents or definition the statement changes: DML targets (also inside
    /// data-modifying CTEs), all relations of TRUNCATE, the target of `COPY ... FROM`,
    /// `SELECT INTO` and `CREATE TABLE AS`, and for DDL and unclassified utility statements
    /// (`CLUSTER`) every relation they name outside their queries, dropped relations included.
    /// Conservative on purpose: `CREATE INDEX ON t` and `GRANT ... ON t` report `t`. VACUUM,
    /// ANALYZE and LOCK report nothing.
    pub writes: Vec<RelationName>,
    /// Every function called by name anywhere in the statement (select lists, WHERE, ORDER BY,
    /// aggregates, window functions, FROM, VALUES, CALL), including the `pg_catalog` functions
    /// that SQL syntax such as `EXTRACT` or `AT TIME ZONE` stands for. Operators are in
    /// `operators`.
    pub functions: Vec<FunctionName>,
    /// Every operator written in the statement (`a + b`, `x = ANY (...)`, `OPERATOR(s.###)`,
    /// `ORDER BY x USING >`), and the ones SQL syntax stands for: `=` and `<>` of `IN`, `NULLIF`
    /// and `IS [NOT] DISTINCT FROM`, `~~` and `~~*` of `LIKE` and `ILIKE`, `~` of
    /// `SIMILAR TO`, the comparisons of `BETWEEN`. An operator is a function call too, and a
    /// user-defined one may be volatile; implicit ones (`ORDER BY`, `GROUP BY`, `DISTINCT`, join
    /// conditions of `USING`) are not listed.
    pub operators: Vec<OperatorName>,
    /// The target type of every explicit cast (`x::t`, `CAST(x AS t)`, `t 'literal'`), array
    /// bounds and type modifiers dropped: a cast runs a function (the cast's own, or the type's
    /// input function), which a user-defined cast or type may make volatile. Implicit casts
    /// are not listed.
    pub casts: Vec<TypeName>,
    /// The last name of every qualified column reference (`t.f`, `s.t.f`) and every field
    /// selection (`(x).f`): PostgreSQL takes one that is no column of the row for a call of
    /// the function `f` with the row as its argument (attribute notation), which may be
    /// volatile. Most are plain columns; the catalog tells.
    pub attributes: Vec<String>,
    /// SQL-standard niladic functions (`CURRENT_TIMESTAMP`, `CURRENT_USER`, ...), which the
    /// grammar does not turn into named calls: their results depend on time or role.
    pub sql_value_functions: Vec<SqlValueFunction>,
    /// A row-locking clause (`FOR UPDATE`, `FOR NO KEY UPDATE`, `FOR SHARE`, `FOR KEY SHARE`)
    /// appears somewhere, even in a subquery: the statement takes row locks.
    pub locking: bool,
    /// A `WITH` query is an INSERT, UPDATE, DELETE or MERGE: even a SELECT statement writes.
    pub data_modifying_cte: bool,
    /// `SELECT ... INTO table`: a SELECT that creates and fills a table.
    pub select_into: bool,
    /// `TABLESAMPLE` appears: results differ from run to run unless `REPEATABLE` pins the seed.
    pub tablesample: bool,
    /// The statement creates a temporary table, view or sequence that outlives its transaction
    /// (`CREATE TEMP TABLE`, `CREATE TEMP TABLE ... AS`, `SELECT ... INTO TEMP`,
    /// `CREATE TEMP VIEW`, `CREATE TEMP SEQUENCE`, or any of them naming the `pg_temp` schema,
    /// and functions, procedures, types, domains and aggregates created in `pg_temp`),
    /// unless it is `ON COMMIT DROP`; `ON COMMIT DELETE ROWS` keeps the table. Such a relation is
    /// session state: under transaction pooling the client must stay on its server connection.
    /// `PREPARE` and `EXPLAIN` report their statement's value. Read from the text alone: a plain
    /// `CREATE TABLE` also makes a temporary table when `search_path` puts `pg_temp` first, which
    /// only the session's settings tell.
    pub session_temp_table: bool,
    /// The settings its `set_config(name, ...)` calls name, lower-cased, when every such call
    /// names its setting with a string literal; `None` when one names it with an expression.
    /// Empty when it calls no `set_config`. A pooler that cannot see what such a call set can
    /// read these settings back from the server afterwards.
    pub set_config_names: Option<Vec<String>>,
    /// The statement changes roles (`GRANT`/`REVOKE` of a role, `ALTER ROLE`, `DROP ROLE`,
    /// `ALTER USER`, `DROP OWNED`, `REASSIGN OWNED`): roles belong to the whole cluster, so
    /// what any role may read in any database may have changed.
    pub changes_roles: bool,
    /// The prepared statement that `EXPLAIN EXECUTE name` or `CREATE TABLE ... AS EXECUTE
    /// name` runs. Under transaction pooling the name is the client's own, which the server
    /// does not know: pgmemo writes its server-side name in its place.
    pub executes: Option<ExecuteRef>,
}

/// A prepared statement run from inside another statement (see
/// [`StatementInfo::executes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecuteRef {
    /// The statement's name, as the parser folded it.
    pub name: String,
    /// Where the name is written in the analysed string (quotes included), or `None` when the
    /// token scanner could not find it, which only odd inputs could cause.
    pub name_range: Option<Range<usize>>,
}

/// A relation name as written in the statement, identifiers already case-folded (or kept, when
/// quoted) by the parser. A catalog (database) qualifier is dropped.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelationName {
    /// The schema, when the name was qualified.
    pub schema: Option<String>,
    /// The relation's own name.
    pub name: String,
}

/// A function name as written in the call, identifiers case-folded by the parser.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FunctionName {
    /// The schema, when the call was qualified (the parser qualifies the functions behind SQL
    /// syntax with `pg_catalog`).
    pub schema: Option<String>,
    /// The function's own name.
    pub name: String,
}

macro_rules! qualified_name_impls {
    ($ty:ident) => {
        impl $ty {
            /// Builds a name, mostly for comparisons in tests and lookups.
            pub fn new(schema: Option<&str>, name: &str) -> Self {
                Self {
                    schema: schema.map(str::to_owned),
                    name: name.to_owned(),
                }
            }

            /// Builds a name from the parser's list of name parts (`[schema,] name`); a leading
            /// catalog part is dropped.
            pub(crate) fn from_parts(parts: &[&str]) -> Option<Self> {
                let (name, rest) = parts.split_last()?;
                Some(Self::new(rest.last().copied(), name))
            }
        }

        /// `schema.name` or `name`, unquoted: for logs and admin output.
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match &self.schema {
                    Some(schema) => write!(f, "{schema}.{}", self.name),
                    None => f.write_str(&self.name),
                }
            }
        }
    };
}

/// An operator name as written (`+`, `@>`), with its schema when qualified by
/// `OPERATOR(schema.op)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OperatorName {
    /// The schema, when the operator was qualified.
    pub schema: Option<String>,
    /// The operator's own name.
    pub name: String,
}

/// A type name as written in a cast (`int` and other SQL keywords come as `pg_catalog.int4`
/// and the like, as the parser spells them).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TypeName {
    /// The schema, when the name was qualified.
    pub schema: Option<String>,
    /// The type's own name.
    pub name: String,
}

qualified_name_impls!(RelationName);
qualified_name_impls!(TypeName);
qualified_name_impls!(FunctionName);
qualified_name_impls!(OperatorName);

/// The SQL-standard functions with keyword syntax (`CURRENT_DATE`, `CURRENT_USER`, ...), which
/// PostgreSQL's grammar keeps as special nodes instead of named calls, so they have no name to
/// look up in the catalog. A precision (`CURRENT_TIME(3)`) does not change the variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SqlValueFunction {
    CurrentDate,
    CurrentTime,
    CurrentTimestamp,
    LocalTime,
    LocalTimestamp,
    CurrentRole,
    CurrentUser,
    User,
    SessionUser,
    CurrentCatalog,
    CurrentSchema,
}

impl SqlValueFunction {
    /// True for the variants whose value is a point in time (they behave like `now()`).
    pub fn is_time(self) -> bool {
        matches!(
            self,
            Self::CurrentDate
                | Self::CurrentTime
                | Self::CurrentTimestamp
                | Self::LocalTime
                | Self::LocalTimestamp
        )
    }
}

//! `sql`: SQL analysis for pgmemo on pg_query, the real PostgreSQL parser.
//!
//! Where it sits on the query path: after the client session has framed a query and the cache
//! missed (or the statement is a session command pgmemo must understand), the router asks this
//! crate what the text does: the kind of each statement, the relations it reads and writes, the
//! functions it calls, and the details of SET, PREPARE, transaction control and friends. It
//! holds no policy (it never decides "cacheable"), does no I/O and knows no catalog: names are
//! reported as written, and pgmemo resolves them with the upstream. The crate also keeps
//! pg_query's C build away from crates that do not need it.
//!
//! Layout: [`analyze`] parses, then per statement `statement` classifies it, `collect` walks its
//! tree through the generated `children` table and `source` finds its boundaries; `set` and
//! `transaction` read session commands; `temp` spots temporary relations; `stats` gives query
//! identity for statistics. [`may_affect_session`] is a parser-free prefilter that tells when a
//! query string needs the full analysis to track session state.

mod analysis;
mod children;
mod collect;
mod cursor;
mod error;
mod kind;
mod params;
mod prefilter;
mod rows;
mod set;
mod shape;
mod source;
mod statement;
mod stats;
mod temp;
mod text;
mod transaction;

pub use analysis::{
    Analysis, ExecuteRef, FunctionName, OperatorName, RelationName, SqlValueFunction,
    StatementInfo, TypeName,
};
pub use error::SqlError;
pub use kind::{DiscardKind, StatementKind};
pub use params::parameter_count;
pub use prefilter::may_affect_session;
pub use rows::returns_rows;
pub use set::{SetCommand, SetValue};
pub use shape::{has_time_word, shape, shape_into, Shape, ShapeFacts};
pub use stats::{fingerprint, normalize};
pub use transaction::{IsolationLevel, TransactionCommand, TransactionModes};

use error::from_pg_error;

/// The session settings that change how PostgreSQL reads a query string. The analysis must read
/// the text as the upstream will, or it could see different statements than the server runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseOptions {
    /// `standard_conforming_strings`: when off, backslashes escape in ordinary string literals.
    pub standard_conforming_strings: bool,
}

impl Default for ParseOptions {
    /// PostgreSQL's defaults.
    fn default() -> Self {
        Self {
            standard_conforming_strings: true,
        }
    }
}

impl ParseOptions {
    fn bits(self) -> i32 {
        let mut options = pg_query::ParserOptions::DEFAULT;
        if !self.standard_conforming_strings {
            options |= pg_query::ParserOptions::DISABLE_STANDARD_CONFORMING_STRINGS;
        }
        options.bits()
    }
}

/// Analyses a query string (one or several statements) as a session with default settings
/// would read it.
///
/// ```
/// let analysis = sql::analyze("SELECT * FROM orders WHERE placed > now() - interval '1 day'")?;
/// let stmt = &analysis.statements[0];
/// assert_eq!(stmt.kind, sql::StatementKind::Select);
/// assert_eq!(stmt.reads, [sql::RelationName::new(None, "orders")]);
/// assert_eq!(stmt.functions, [sql::FunctionName::new(None, "now")]);
/// # Ok::<(), sql::SqlError>(())
/// ```
pub fn analyze(sql: &str) -> Result<Analysis, SqlError> {
    analyze_with(sql, ParseOptions::default())
}

/// Analyses a query string as a session with the given parse-relevant settings would read it.
pub fn analyze_with(sql: &str, options: ParseOptions) -> Result<Analysis, SqlError> {
    let bits = options.bits();
    let parsed = pg_query::parse(sql, bits).map_err(|e| from_pg_error(e, sql, bits))?;
    let statements = parsed
        .protobuf
        .stmts
        .iter()
        .filter_map(|raw| {
            let node = raw.stmt.as_ref()?.node.as_ref()?;
            let range = source::statement_range(sql, raw.stmt_location, raw.stmt_len);
            Some(statement::analyze_statement(sql, node.to_ref(), range))
        })
        .collect::<Result<_, _>>()?;
    Ok(Analysis { statements })
}

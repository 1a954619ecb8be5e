//! Errors of the analysis step. A [`SqlError::Parse`] means the upstream will reject the text too,
//! so the client edge may answer it locally (`cursor` is the ErrorResponse's `P` field); an
//! [`SqlError::Unsupported`] statement is forwarded without analysis.

/// Why a query string could not be analysed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SqlError {
    /// PostgreSQL's own parser rejected the text, so the upstream will reject it too. Most such
    /// errors are syntax errors (SQLSTATE `42601`); a few are not (`stack depth limit exceeded`),
    /// so forwarding the query is the way to give the client the server's exact error.
    #[error("{message}")]
    Parse {
        /// The parser's message, e.g. `syntax error at or near "FORM"`.
        message: String,
        /// 1-based character position of the error in the whole query string, as PostgreSQL
        /// reports it in the `P` field of an ErrorResponse; `None` when the parser gave none.
        cursor: Option<i32>,
    },
    /// The text may well be valid, but pg_query cannot hand it over or represent a part of it:
    /// its tree decoder stops at 100 levels of nesting (a chain of about 50 `+` or `||` is
    /// enough), which keeps a hostile query from overflowing the stack, and its deparser does
    /// not cover every expression. pgmemo should forward such a statement without analysis.
    #[error("cannot analyse this statement: {message}")]
    Unsupported {
        /// pg_query's message, with what was being done.
        message: String,
    },
}

/// Converts a pg_query error for `sql`, parsed with `parser_options`, into a [`SqlError`].
pub(crate) fn from_pg_error(error: pg_query::Error, sql: &str, parser_options: i32) -> SqlError {
    match error {
        pg_query::Error::Parse(message) => SqlError::Parse {
            cursor: crate::cursor::error_cursor(sql, parser_options),
            message,
        },
        // A Rust string may hold NUL, which a protocol message cannot: report it where it is.
        pg_query::Error::Conversion(nul) => SqlError::Parse {
            message: "query string contains a null character".to_owned(),
            cursor: sql
                .get(..nul.nul_position())
                .and_then(|before| i32::try_from(before.chars().count() + 1).ok()),
        },
        pg_query::Error::Decode(e) if e.to_string().contains("recursion limit") => {
            SqlError::Unsupported {
                message: "the parse tree nests deeper than pg_query's decoder allows".to_owned(),
            }
        }
        other => SqlError::Unsupported {
            message: other.to_string(),
        },
    }
}

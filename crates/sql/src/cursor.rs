//! Recovers the error position of a failed parse, for the `P` field of the ErrorResponse that
//! pgmemo sends when it rejects a query before it reaches the upstream.
//!
//! pg_query's safe API keeps only the message of a parse error and drops libpg_query's
//! `cursorpos`. On that (cold) error path we parse once more through the C API, which pg_query
//! already links into the binary, and read the position from the returned error.

use std::ffi::{c_char, c_int, CString};

/// `PgQueryError` from libpg_query's `pg_query.h`.
#[repr(C)]
struct PgQueryError {
    message: *mut c_char,
    funcname: *mut c_char,
    filename: *mut c_char,
    lineno: c_int,
    cursorpos: c_int,
    context: *mut c_char,
}

/// `PgQueryParseResult` from libpg_query's `pg_query.h`.
#[repr(C)]
struct PgQueryParseResult {
    parse_tree: *mut c_char,
    stderr_buffer: *mut c_char,
    error: *mut PgQueryError,
}

extern "C" {
    fn pg_query_parse_opts(input: *const c_char, parser_options: c_int) -> PgQueryParseResult;
    fn pg_query_free_parse_result(result: PgQueryParseResult);
}

/// The 1-based character position at which PostgreSQL's parser rejects `sql`, if it does and
/// reports one.
pub(crate) fn error_cursor(sql: &str, parser_options: i32) -> Option<i32> {
    let input = CString::new(sql).ok()?;
    // SAFETY: `input` is a valid NUL-terminated string that outlives the call. The result is
    // only read before being handed back to libpg_query's own free function, exactly once.
    unsafe {
        let result = pg_query_parse_opts(input.as_ptr(), parser_options);
        let cursor = if result.error.is_null() {
            None
        } else {
            Some((*result.error).cursorpos).filter(|&pos| pos > 0)
        };
        pg_query_free_parse_result(result);
        cursor
    }
}

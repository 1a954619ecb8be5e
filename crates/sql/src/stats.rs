//! Query identity for per-query statistics (pgmemo's admin SHOW and metrics): queries that
//! differ only in constants share a normalized text and a fingerprint.

use crate::error::from_pg_error;
use crate::SqlError;

/// The query with each constant replaced by `$n`, for showing one line per query shape in
/// statistics. Existing `$n` parameters keep their numbers.
pub fn normalize(sql: &str) -> Result<String, SqlError> {
    pg_query::normalize(sql).map_err(|e| from_pg_error(e, sql, 0))
}

/// pg_query's fingerprint of the query's parse tree, equal for queries that differ only in
/// constants, whitespace or comments. It follows PostgreSQL 18's query ID rules (schema names and
/// digit runs in relation names are ignored, so `s1.orders_2024` and `s2.orders_2025` match),
/// which suits grouping statistics but makes it unfit as a cache key.
pub fn fingerprint(sql: &str) -> Result<u64, SqlError> {
    pg_query::fingerprint(sql, 0, 0)
        .map(|f| f.value)
        .map_err(|e| from_pg_error(e, sql, 0))
}

//! Whether a statement returns rows: what a Describe of it answers with, RowDescription or
//! NoData. PostgreSQL decides it when the statement is prepared (a plan source keeps a result
//! descriptor or none) and answers a later Describe of a statement without rows from that
//! alone, even in an aborted block. pgmemo needs it to answer such a Describe where preparing
//! the statement again on another server would fail.

use pg_query::NodeRef;

use crate::ParseOptions;

/// `Some(true)` when a statement parsed from `sql` returns rows (`SELECT`, `VALUES`, `SHOW`,
/// `EXPLAIN`, a write with `RETURNING`), `Some(false)` when it cannot (other writes,
/// transaction control, `SET`, definitions, cursor and session commands), `None` when that
/// depends on the session or the catalog (`FETCH`, `EXECUTE`, `CALL`), the text holds other
/// than one statement, or it does not parse.
///
/// ```
/// let options = sql::ParseOptions::default();
/// assert_eq!(sql::returns_rows("SELECT 1", options), Some(true));
/// assert_eq!(sql::returns_rows("UPDATE t SET a = 1", options), Some(false));
/// assert_eq!(sql::returns_rows("EXECUTE p", options), None);
/// ```
pub fn returns_rows(sql: &str, options: ParseOptions) -> Option<bool> {
    let parsed = pg_query::parse(sql, options.bits()).ok()?;
    let [raw] = parsed.protobuf.stmts.as_slice() else {
        return None;
    };
    let node = raw.stmt.as_ref()?.node.as_ref()?;
    match node.to_ref() {
        NodeRef::SelectStmt(s) => Some(s.into_clause.is_none()),
        NodeRef::InsertStmt(s) => Some(returning(&s.returning_clause)),
        NodeRef::UpdateStmt(s) => Some(returning(&s.returning_clause)),
        NodeRef::DeleteStmt(s) => Some(returning(&s.returning_clause)),
        // RETURNING on MERGE is PostgreSQL 17's.
        NodeRef::MergeStmt(s) => Some(returning(&s.returning_clause)),
        NodeRef::VariableShowStmt(_) | NodeRef::ExplainStmt(_) => Some(true),
        NodeRef::TransactionStmt(_)
        | NodeRef::VariableSetStmt(_)
        | NodeRef::CreateStmt(_)
        | NodeRef::CreateTableAsStmt(_)
        | NodeRef::AlterTableStmt(_)
        | NodeRef::DropStmt(_)
        | NodeRef::IndexStmt(_)
        | NodeRef::ViewStmt(_)
        | NodeRef::TruncateStmt(_)
        | NodeRef::CommentStmt(_)
        | NodeRef::GrantStmt(_)
        | NodeRef::LockStmt(_)
        | NodeRef::DeclareCursorStmt(_)
        | NodeRef::ClosePortalStmt(_)
        | NodeRef::DeallocateStmt(_)
        | NodeRef::DiscardStmt(_)
        | NodeRef::ListenStmt(_)
        | NodeRef::UnlistenStmt(_)
        | NodeRef::NotifyStmt(_)
        | NodeRef::DoStmt(_)
        | NodeRef::PrepareStmt(_) => Some(false),
        _ => None,
    }
}

fn returning(clause: &Option<pg_query::protobuf::ReturningClause>) -> bool {
    clause.as_ref().is_some_and(|c| !c.exprs.is_empty())
}

#[cfg(test)]
mod tests {
    use super::returns_rows;
    use crate::ParseOptions;

    #[test]
    fn rows_come_from_queries_and_returning() {
        let on = ParseOptions::default();
        for sql in [
            "SELECT 1",
            "VALUES (1)",
            "TABLE t",
            "WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x",
            "INSERT INTO t VALUES (1) RETURNING a",
            "UPDATE t SET a = 1 RETURNING *",
            "DELETE FROM t RETURNING a",
            "SHOW TimeZone",
            "EXPLAIN SELECT 1",
        ] {
            assert_eq!(returns_rows(sql, on), Some(true), "{sql}");
        }
        for sql in [
            "SELECT 1 INTO t2",
            "INSERT INTO t VALUES (1)",
            "UPDATE t SET a = 1",
            "DELETE FROM t",
            "BEGIN ISOLATION LEVEL SERIALIZABLE",
            "RELEASE SAVEPOINT sp",
            "SET TimeZone = 'UTC'",
            "CREATE TABLE t3 AS SELECT 1",
            "CLOSE c1",
            "DECLARE c CURSOR FOR SELECT 1",
            "PREPARE p AS SELECT 1",
        ] {
            assert_eq!(returns_rows(sql, on), Some(false), "{sql}");
        }
        for sql in [
            "FETCH c",
            "MOVE c",
            "EXECUTE p",
            "CALL f()",
            "SELECT 1; SELECT 2",
            "",
            "SELEC",
        ] {
            assert_eq!(returns_rows(sql, on), None, "{sql}");
        }
    }
}

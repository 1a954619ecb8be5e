//! Temporary relations (and other objects created in the temporary schema) that outlive their
//! transaction: under transaction pooling they are session state, so a statement creating one pins the client to its server connection. The
//! [`Collector`](crate::collect::Collector) asks these predicates of every relation-creating
//! node it meets.

use pg_query::protobuf::node::Node as NodeEnum;
use pg_query::protobuf::{CreateStmt, IntoClause, Node, OnCommitAction, RangeVar};

/// `relpersistence` of a relation declared `TEMP`/`TEMPORARY` (`RELPERSISTENCE_TEMP` in
/// PostgreSQL's `pg_class.h`).
const RELPERSISTENCE_TEMP: &str = "t";

/// `CREATE [TEMP] TABLE ...`: a temporary table that survives the commit of its transaction.
pub(crate) fn table(s: &CreateStmt) -> bool {
    s.relation.as_ref().is_some_and(is_temp) && survives_commit(s.oncommit)
}

/// The target of `CREATE TABLE ... AS` or `SELECT ... INTO`: as [`table`].
pub(crate) fn into(into: &IntoClause) -> bool {
    into.rel.as_ref().is_some_and(is_temp) && survives_commit(into.on_commit)
}

/// A temporary view or sequence, which has no `ON COMMIT` clause and so always lives until the
/// session ends (or it is dropped).
pub(crate) fn relation(rel: Option<&RangeVar>) -> bool {
    rel.is_some_and(is_temp)
}

/// True when PostgreSQL creates `rel` as a temporary relation: declared `TEMP`/`TEMPORARY`, or
/// placed in the session's temporary schema by name (`pg_temp.t`, or `pg_temp_3.t` when that is
/// the session's own), which PostgreSQL turns into a temporary relation without the keyword.
fn is_temp(rel: &RangeVar) -> bool {
    rel.relpersistence == RELPERSISTENCE_TEMP || rel.schemaname.starts_with("pg_temp")
}

/// An object other than a relation (a function, procedure, aggregate, operator, type,
/// domain, collation, ...) created under a qualified name in the session's temporary schema
/// (`CREATE FUNCTION pg_temp.f()`): it lives until the session ends.
pub(crate) fn named(names: &[Node]) -> bool {
    let [.., schema, _] = names else {
        return false;
    };
    matches!(&schema.node, Some(NodeEnum::String(s)) if s.sval.starts_with("pg_temp"))
}

/// False only for `ON COMMIT DROP`; `DELETE ROWS` empties the table but keeps it.
fn survives_commit(on_commit: i32) -> bool {
    on_commit != OnCommitAction::OncommitDrop as i32
}

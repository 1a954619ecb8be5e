//! Temporary relations (and other objects created in the temporary schema) that outlive their
//! transaction: under transaction pooling they are session state, so a statement creating one
//! pins the client to its server connection. The [`Collector`](crate::collect::Collector) asks
//! [`created`] of every node it meets, and [`into`] of `INTO` clauses.

use pg_query::protobuf::node::Node as NodeEnum;
use pg_query::protobuf::{CreateStmt, IntoClause, Node, OnCommitAction, RangeVar};
use pg_query::NodeRef;

/// `relpersistence` of a relation declared `TEMP`/`TEMPORARY` (`RELPERSISTENCE_TEMP` in
/// PostgreSQL's `pg_class.h`).
const RELPERSISTENCE_TEMP: &str = "t";

/// Whether `node` creates an object of the session's temporary schema that survives the
/// commit of its transaction: a table, view, sequence or composite type declared `TEMP` or
/// named in `pg_temp`, or a function, procedure, aggregate, operator, type or domain named
/// in `pg_temp`.
pub(crate) fn created(node: NodeRef<'_>) -> bool {
    match node {
        NodeRef::CreateStmt(s) => table(s),
        NodeRef::ViewStmt(s) => relation(s.view.as_ref()),
        NodeRef::CreateSeqStmt(s) => relation(s.sequence.as_ref()),
        NodeRef::CompositeTypeStmt(s) => relation(s.typevar.as_ref()),
        NodeRef::CreateFunctionStmt(s) => named(&s.funcname),
        NodeRef::DefineStmt(s) => named(&s.defnames),
        NodeRef::CreateDomainStmt(s) => named(&s.domainname),
        NodeRef::CreateEnumStmt(s) => named(&s.type_name),
        NodeRef::CreateRangeStmt(s) => named(&s.type_name),
        _ => false,
    }
}

/// `CREATE [TEMP] TABLE ...`: a temporary table that survives the commit of its transaction.
fn table(s: &CreateStmt) -> bool {
    s.relation.as_ref().is_some_and(is_temp) && survives_commit(s.oncommit)
}

/// The target of `CREATE TABLE ... AS` or `SELECT ... INTO`: as [`table`].
pub(crate) fn into(into: &IntoClause) -> bool {
    into.rel.as_ref().is_some_and(is_temp) && survives_commit(into.on_commit)
}

/// A temporary view or sequence, which has no `ON COMMIT` clause and so always lives until the
/// session ends (or it is dropped).
fn relation(rel: Option<&RangeVar>) -> bool {
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
fn named(names: &[Node]) -> bool {
    let [.., schema, _] = names else {
        return false;
    };
    matches!(&schema.node, Some(NodeEnum::String(s)) if s.sval.starts_with("pg_temp"))
}

/// False only for `ON COMMIT DROP`; `DELETE ROWS` empties the table but keeps it.
fn survives_commit(on_commit: i32) -> bool {
    on_commit != OnCommitAction::OncommitDrop as i32
}

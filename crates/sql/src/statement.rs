//! Analysis of one statement: its kind (with session-command details) and, through the
//! [`Collector`], what it reads, writes and calls. Wrapping statements (PREPARE, EXPLAIN) recurse
//! into their inner statement.

use std::ops::Range;

use pg_query::protobuf::{self, node::Node as NodeEnum, DiscardMode};
use pg_query::NodeRef;

use crate::analysis::{ExecuteRef, StatementInfo};
use crate::children::node_name;
use crate::collect::{Collector, Role};
use crate::kind::{DiscardKind, StatementKind};
use crate::set::set_command;
use crate::source::{after_as_range, execute_name_range, inner_range, Wrapper};
use crate::text::{def_elems, expr_sql, option_bool, type_sql};
use crate::transaction::transaction_command;
use crate::SqlError;

/// `CURSOR_OPT_HOLD` from PostgreSQL's `parsenodes.h`.
const CURSOR_OPT_HOLD: i32 = 0x0020;

/// Analyses the statement `node`, found at `source` in `sql`.
pub(crate) fn analyze_statement(
    sql: &str,
    node: NodeRef<'_>,
    source: Range<usize>,
) -> Result<StatementInfo, SqlError> {
    let kind = classify(sql, node, &source)?;
    let mut collector = Collector::default();
    if let Some(role) = root_role(node) {
        collector.visit(node, role);
    }
    let Collector {
        reads,
        writes,
        functions,
        operators,
        casts,
        attributes,
        sql_value_functions,
        locking,
        data_modifying_cte,
        select_into,
        tablesample,
        session_temp_table,
        set_config_names,
        set_config_unknown,
        ..
    } = collector;
    let set_config_names = (!set_config_unknown).then_some(set_config_names);
    // PREPARE walks nothing of its own; EXPLAIN walks its statement already. Either way the
    // wrapper reports what its statement would create, so that one look at the outer
    // statement is enough.
    let session_temp_table = session_temp_table
        || match &kind {
            StatementKind::Prepare { statement, .. } => statement.session_temp_table,
            StatementKind::Explain { inner, .. } => inner.session_temp_table,
            _ => false,
        };
    let executes = executes(sql, node, &kind, &source);
    Ok(StatementInfo {
        executes,
        kind,
        text: sql.get(source.clone()).unwrap_or_default().to_owned(),
        source,
        reads,
        writes,
        functions,
        operators,
        casts,
        attributes,
        sql_value_functions,
        locking,
        data_modifying_cte,
        select_into,
        tablesample,
        session_temp_table,
        set_config_names,
        changes_roles: matches!(
            node,
            NodeRef::GrantRoleStmt(_)
                | NodeRef::AlterRoleStmt(_)
                | NodeRef::AlterRoleSetStmt(_)
                | NodeRef::DropRoleStmt(_)
                | NodeRef::DropOwnedStmt(_)
                | NodeRef::ReassignOwnedStmt(_)
        ),
    })
}

/// The prepared statement run from inside `EXPLAIN` or `CREATE TABLE AS` (see
/// `StatementInfo::executes`).
fn executes(
    sql: &str,
    node: NodeRef<'_>,
    kind: &StatementKind,
    source: &Range<usize>,
) -> Option<ExecuteRef> {
    match (node, kind) {
        (_, StatementKind::Explain { inner, .. }) => match &inner.kind {
            StatementKind::Execute { name, .. } => Some(ExecuteRef {
                name: name.clone(),
                name_range: execute_name_range(sql, inner.source.clone()),
            }),
            _ => None,
        },
        (NodeRef::CreateTableAsStmt(s), _) => match s.query.as_deref()?.node.as_ref()? {
            NodeEnum::ExecuteStmt(e) => Some(ExecuteRef {
                name: e.name.clone(),
                name_range: execute_name_range(sql, after_as_range(sql, source.clone())),
            }),
            _ => None,
        },
        _ => None,
    }
}

/// How relations the statement names directly are to be read, or `None` when the statement
/// itself touches nothing (PREPARE only stores its inner statement).
fn root_role(node: NodeRef<'_>) -> Option<Role> {
    match node {
        NodeRef::PrepareStmt(_) => None,
        NodeRef::VacuumStmt(_) | NodeRef::LockStmt(_) => Some(Role::Ignore),
        NodeRef::SelectStmt(_)
        | NodeRef::ExplainStmt(_)
        | NodeRef::ExecuteStmt(_)
        | NodeRef::DeclareCursorStmt(_)
        | NodeRef::CallStmt(_) => Some(Role::Read),
        // DML and COPY place their own relations; TRUNCATE, DDL and anything unknown change
        // what they name.
        _ => Some(Role::Write),
    }
}

fn classify(
    sql: &str,
    node: NodeRef<'_>,
    source: &Range<usize>,
) -> Result<StatementKind, SqlError> {
    let other = || StatementKind::Other(node_name(node).to_owned());
    let kind = match node {
        NodeRef::SelectStmt(s) if !s.values_lists.is_empty() => StatementKind::Values,
        NodeRef::SelectStmt(_) => StatementKind::Select,
        NodeRef::InsertStmt(_) => StatementKind::Insert,
        NodeRef::UpdateStmt(_) => StatementKind::Update,
        NodeRef::DeleteStmt(_) => StatementKind::Delete,
        NodeRef::MergeStmt(_) => StatementKind::Merge,
        NodeRef::CopyStmt(s) => StatementKind::Copy {
            from: s.is_from,
            stdio: !s.is_program && s.filename.is_empty(),
        },
        NodeRef::TruncateStmt(s) => StatementKind::Truncate {
            cascade: s.behavior() == pg_query::protobuf::DropBehavior::DropCascade,
        },
        NodeRef::TransactionStmt(s) => {
            transaction_command(s).map_or_else(other, StatementKind::Transaction)
        }
        NodeRef::VariableSetStmt(s) => set_command(s)?.map_or_else(other, StatementKind::Set),
        NodeRef::VariableShowStmt(s) => StatementKind::Show {
            name: s.name.to_ascii_lowercase(),
        },
        NodeRef::PrepareStmt(s) => prepare(sql, s, source)?,
        NodeRef::ExecuteStmt(s) => StatementKind::Execute {
            name: s.name.clone(),
            params: s
                .params
                .iter()
                .map(|p| expr_sql(p, "EXECUTE parameter"))
                .collect::<Result<_, _>>()?,
        },
        NodeRef::DeallocateStmt(s) => StatementKind::Deallocate {
            name: (!s.isall).then(|| s.name.clone()),
        },
        NodeRef::DiscardStmt(s) => match s.target() {
            DiscardMode::DiscardAll => StatementKind::Discard(DiscardKind::All),
            DiscardMode::DiscardPlans => StatementKind::Discard(DiscardKind::Plans),
            DiscardMode::DiscardSequences => StatementKind::Discard(DiscardKind::Sequences),
            DiscardMode::DiscardTemp => StatementKind::Discard(DiscardKind::Temp),
            DiscardMode::Undefined => other(),
        },
        NodeRef::ListenStmt(s) => StatementKind::Listen {
            channel: s.conditionname.clone(),
        },
        NodeRef::UnlistenStmt(s) => StatementKind::Unlisten {
            channel: (!s.conditionname.is_empty()).then(|| s.conditionname.clone()),
        },
        NodeRef::NotifyStmt(s) => StatementKind::Notify {
            channel: s.conditionname.clone(),
            payload: s.payload.clone(),
        },
        NodeRef::CallStmt(_) => StatementKind::Call,
        NodeRef::DoStmt(_) => StatementKind::Do,
        NodeRef::ExplainStmt(s) => explain(sql, s, source)?,
        NodeRef::DeclareCursorStmt(s) => StatementKind::DeclareCursor {
            name: s.portalname.clone(),
            hold: s.options & CURSOR_OPT_HOLD != 0,
        },
        NodeRef::FetchStmt(s) => StatementKind::Fetch {
            cursor: s.portalname.clone(),
            is_move: s.ismove,
        },
        NodeRef::ClosePortalStmt(s) => StatementKind::Close {
            cursor: (!s.portalname.is_empty()).then(|| s.portalname.clone()),
        },
        NodeRef::VacuumStmt(s) if s.is_vacuumcmd => StatementKind::Vacuum,
        NodeRef::VacuumStmt(_) => StatementKind::Analyze,
        NodeRef::LockStmt(_) => StatementKind::Lock,
        NodeRef::CheckPointStmt(_) => StatementKind::Checkpoint,
        _ if is_ddl(node) => StatementKind::Ddl,
        _ => other(),
    };
    Ok(kind)
}

fn prepare(
    sql: &str,
    s: &protobuf::PrepareStmt,
    source: &Range<usize>,
) -> Result<StatementKind, SqlError> {
    let param_types = s
        .argtypes
        .iter()
        .filter_map(|n| match &n.node {
            Some(NodeEnum::TypeName(t)) => Some(type_sql(t, "PREPARE parameter type")),
            _ => None,
        })
        .collect::<Result<_, _>>()?;
    Ok(StatementKind::Prepare {
        name: s.name.clone(),
        param_types,
        statement: Box::new(inner(sql, s.query.as_deref(), source, Wrapper::Prepare)?),
    })
}

fn explain(
    sql: &str,
    s: &protobuf::ExplainStmt,
    source: &Range<usize>,
) -> Result<StatementKind, SqlError> {
    let analyze = def_elems(&s.options)
        .filter(|def| def.defname == "analyze")
        .last()
        .is_some_and(|def| option_bool(def.arg.as_deref()));
    Ok(StatementKind::Explain {
        analyze,
        inner: Box::new(inner(sql, s.query.as_deref(), source, Wrapper::Explain)?),
    })
}

fn inner(
    sql: &str,
    query: Option<&protobuf::Node>,
    outer: &Range<usize>,
    wrapper: Wrapper,
) -> Result<StatementInfo, SqlError> {
    let range = inner_range(sql, outer.clone(), wrapper);
    match query.and_then(|q| q.node.as_ref()) {
        Some(q) => analyze_statement(sql, q.to_ref(), range),
        None => Err(SqlError::Unsupported {
            message: "wrapping statement without its inner statement".to_owned(),
        }),
    }
}

/// Statements that change definitions, privileges or configuration rather than rows.
fn is_ddl(node: NodeRef<'_>) -> bool {
    use NodeRef as N;
    matches!(
        node,
        N::AlterCollationStmt(_)
            | N::AlterDatabaseRefreshCollStmt(_)
            | N::AlterDatabaseSetStmt(_)
            | N::AlterDatabaseStmt(_)
            | N::AlterDefaultPrivilegesStmt(_)
            | N::AlterDomainStmt(_)
            | N::AlterEnumStmt(_)
            | N::AlterEventTrigStmt(_)
            | N::AlterExtensionContentsStmt(_)
            | N::AlterExtensionStmt(_)
            | N::AlterFdwStmt(_)
            | N::AlterForeignServerStmt(_)
            | N::AlterFunctionStmt(_)
            | N::AlterObjectDependsStmt(_)
            | N::AlterObjectSchemaStmt(_)
            | N::AlterOpFamilyStmt(_)
            | N::AlterOperatorStmt(_)
            | N::AlterOwnerStmt(_)
            | N::AlterPolicyStmt(_)
            | N::AlterPublicationStmt(_)
            | N::AlterRoleSetStmt(_)
            | N::AlterRoleStmt(_)
            | N::AlterSeqStmt(_)
            | N::AlterStatsStmt(_)
            | N::AlterSubscriptionStmt(_)
            | N::AlterSystemStmt(_)
            | N::AlterTableMoveAllStmt(_)
            | N::AlterTableSpaceOptionsStmt(_)
            | N::AlterTableStmt(_)
            | N::AlterTsconfigurationStmt(_)
            | N::AlterTsdictionaryStmt(_)
            | N::AlterTypeStmt(_)
            | N::AlterUserMappingStmt(_)
            | N::CommentStmt(_)
            | N::CompositeTypeStmt(_)
            | N::CreateAmStmt(_)
            | N::CreateCastStmt(_)
            | N::CreateConversionStmt(_)
            | N::CreateDomainStmt(_)
            | N::CreateEnumStmt(_)
            | N::CreateEventTrigStmt(_)
            | N::CreateExtensionStmt(_)
            | N::CreateFdwStmt(_)
            | N::CreateForeignServerStmt(_)
            | N::CreateForeignTableStmt(_)
            | N::CreateFunctionStmt(_)
            | N::CreateOpClassStmt(_)
            | N::CreateOpFamilyStmt(_)
            | N::CreatePlangStmt(_)
            | N::CreatePolicyStmt(_)
            | N::CreatePublicationStmt(_)
            | N::CreateRangeStmt(_)
            | N::CreateRoleStmt(_)
            | N::CreateSchemaStmt(_)
            | N::CreateSeqStmt(_)
            | N::CreateStatsStmt(_)
            | N::CreateStmt(_)
            | N::CreateSubscriptionStmt(_)
            | N::CreateTableAsStmt(_)
            | N::CreateTableSpaceStmt(_)
            | N::CreateTransformStmt(_)
            | N::CreateTrigStmt(_)
            | N::CreateUserMappingStmt(_)
            | N::CreatedbStmt(_)
            | N::DefineStmt(_)
            | N::DropOwnedStmt(_)
            | N::DropRoleStmt(_)
            | N::DropStmt(_)
            | N::DropSubscriptionStmt(_)
            | N::DropTableSpaceStmt(_)
            | N::DropUserMappingStmt(_)
            | N::DropdbStmt(_)
            | N::GrantRoleStmt(_)
            | N::GrantStmt(_)
            | N::ImportForeignSchemaStmt(_)
            | N::IndexStmt(_)
            | N::ReassignOwnedStmt(_)
            | N::RefreshMatViewStmt(_)
            | N::RenameStmt(_)
            | N::RuleStmt(_)
            | N::SecLabelStmt(_)
            | N::ViewStmt(_)
    )
}

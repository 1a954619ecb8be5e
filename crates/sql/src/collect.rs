//! The walk behind [`StatementInfo`](crate::StatementInfo)'s relation, function and flag fields.
//! It visits every node of a statement (through [`for_each_child`]) and gives meaning to the few
//! that matter: relations, function calls, WITH scopes, locking clauses and write targets.

use pg_query::protobuf::{self, node::Node as NodeEnum, Node, ObjectType, SqlValueFunctionOp};
use pg_query::NodeRef;

use crate::analysis::{FunctionName, OperatorName, RelationName, SqlValueFunction, TypeName};
use crate::children::for_each_child;
use crate::temp;
use crate::text::{const_str, name_parts};

/// What a relation met during the walk means at that point of the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Its rows are read (FROM items and everything below a query).
    Read,
    /// Its rows or definition change (DML targets, TRUNCATE, DDL objects).
    Write,
    /// Named, but neither read nor written (VACUUM, LOCK).
    Ignore,
}

/// Accumulates the findings of one statement.
#[derive(Debug, Default)]
pub(crate) struct Collector {
    pub reads: Vec<RelationName>,
    pub writes: Vec<RelationName>,
    pub functions: Vec<FunctionName>,
    pub operators: Vec<OperatorName>,
    pub casts: Vec<TypeName>,
    pub attributes: Vec<String>,
    pub sql_value_functions: Vec<SqlValueFunction>,
    pub locking: bool,
    pub data_modifying_cte: bool,
    pub select_into: bool,
    pub tablesample: bool,
    pub session_temp_table: bool,
    /// See [`StatementInfo::set_config_names`](crate::StatementInfo::set_config_names): the
    /// literal names met, and whether a call named its setting otherwise.
    pub set_config_names: Vec<String>,
    pub set_config_unknown: bool,
    /// Names of the CTEs in scope at the current point of the walk, innermost last.
    ctes: Vec<String>,
}

impl Collector {
    /// Walks `node`, treating relations not claimed by a statement as `role`.
    pub fn visit(&mut self, node: NodeRef<'_>, role: Role) {
        match node {
            NodeRef::RangeVar(rv) => self.relation(rv, role),
            NodeRef::FuncCall(call) => {
                self.function(&call.funcname);
                self.set_config(call);
                self.children(node, Role::Read);
            }
            NodeRef::AExpr(e) => {
                self.a_expr(e);
                self.children(node, role);
            }
            // `t.f` and `(x).f` select a column, or call a function `f` of the row (attribute
            // notation): which one only the catalog tells.
            NodeRef::ColumnRef(c) if c.fields.len() >= 2 => {
                self.attribute(c.fields.last());
                self.children(node, role);
            }
            NodeRef::AIndirection(ind) => {
                for field in &ind.indirection {
                    self.attribute(Some(field));
                }
                self.children(node, role);
            }
            NodeRef::SubLink(link) => {
                // `x IN (SELECT ...)` is `x = ANY (SELECT ...)` with the name left out.
                if link.oper_name.is_empty()
                    && link.sub_link_type() == protobuf::SubLinkType::AnySublink
                {
                    push_unique(&mut self.operators, OperatorName::new(None, "="));
                }
                self.operator(&link.oper_name);
                self.children(node, role);
            }
            // `CASE x WHEN v ...` compares `x = v`.
            NodeRef::CaseExpr(case) if case.arg.is_some() => {
                push_unique(&mut self.operators, OperatorName::new(None, "="));
                self.children(node, role);
            }
            NodeRef::TypeCast(cast) => {
                if let Some(name) = cast
                    .type_name
                    .as_ref()
                    .and_then(|t| TypeName::from_parts(&name_parts(&t.names)))
                {
                    push_unique(&mut self.casts, name);
                }
                self.children(node, role);
            }
            NodeRef::SortBy(sort) => {
                self.operator(&sort.use_op);
                self.children(node, role);
            }
            NodeRef::SqlvalueFunction(f) => self.sql_value_function(f.op()),
            NodeRef::SelectStmt(s) => {
                self.select_into |= s.into_clause.is_some();
                self.scoped(s.with_clause.as_ref(), |c| c.children(node, Role::Read));
            }
            NodeRef::InsertStmt(s) => self.insert(s),
            NodeRef::UpdateStmt(s) => self.update(s),
            NodeRef::DeleteStmt(s) => self.delete(s),
            NodeRef::MergeStmt(s) => self.merge(s),
            NodeRef::CopyStmt(s) => self.copy(s),
            NodeRef::DropStmt(s) => self.drop(s),
            // Visited by the statement owning it, inside the scope it opens.
            NodeRef::WithClause(_) => {}
            // `FOR UPDATE OF a` names FROM items (aliases), not relations.
            NodeRef::LockingClause(_) => self.locking = true,
            NodeRef::IntoClause(into) => {
                self.session_temp_table |= temp::into(into);
                if let Some(rel) = &into.rel {
                    self.relation(rel, Role::Write);
                }
            }
            // Temporary objects are flagged wherever they appear; PostgreSQL rejects the nested
            // forms (`CREATE SCHEMA s CREATE TEMP TABLE ...`), so erring is harmless.
            _ if temp::created(node) => {
                self.session_temp_table = true;
                self.children(node, role);
            }
            NodeRef::RangeTableSample(_) => {
                self.tablesample = true;
                self.children(node, role);
            }
            _ => self.children(node, role),
        }
    }

    fn children(&mut self, node: NodeRef<'_>, role: Role) {
        for_each_child(node, &mut |child| self.visit(child, role));
    }

    fn node(&mut self, node: Option<&Node>, role: Role) {
        if let Some(n) = node.and_then(|n| n.node.as_ref()) {
            self.visit(n.to_ref(), role);
        }
    }

    fn nodes(&mut self, nodes: &[Node], role: Role) {
        for n in nodes {
            self.node(Some(n), role);
        }
    }

    fn returning(&mut self, returning: Option<&protobuf::ReturningClause>) {
        if let Some(r) = returning {
            self.visit(NodeRef::ReturningClause(r), Role::Read);
        }
    }

    /// Runs `body` with the CTEs of `with` in scope, after walking the CTE bodies themselves.
    /// A non-recursive CTE sees only the CTEs before it; a recursive WITH makes all of them
    /// visible everywhere, including in their own bodies.
    fn scoped(&mut self, with: Option<&protobuf::WithClause>, body: impl FnOnce(&mut Self)) {
        let mark = self.ctes.len();
        if let Some(with) = with {
            let ctes: Vec<&protobuf::CommonTableExpr> = with
                .ctes
                .iter()
                .filter_map(|n| match &n.node {
                    Some(NodeEnum::CommonTableExpr(cte)) => Some(cte.as_ref()),
                    _ => None,
                })
                .collect();
            if with.recursive {
                self.ctes.extend(ctes.iter().map(|cte| cte.ctename.clone()));
            }
            for cte in ctes {
                let query = cte.ctequery.as_deref().and_then(|q| q.node.as_ref());
                if let Some(query) = query {
                    self.data_modifying_cte |= matches!(
                        query,
                        NodeEnum::InsertStmt(_)
                            | NodeEnum::UpdateStmt(_)
                            | NodeEnum::DeleteStmt(_)
                            | NodeEnum::MergeStmt(_)
                    );
                    self.visit(query.to_ref(), Role::Read);
                }
                if !with.recursive {
                    self.ctes.push(cte.ctename.clone());
                }
            }
        }
        body(self);
        self.ctes.truncate(mark);
    }

    fn insert(&mut self, s: &protobuf::InsertStmt) {
        let protobuf::InsertStmt {
            relation,
            cols,
            select_stmt,
            on_conflict_clause,
            returning_clause,
            with_clause,
            r#override: _,
        } = s;
        self.scoped(with_clause.as_ref(), |c| {
            c.target(relation.as_ref());
            c.nodes(cols, Role::Read);
            c.node(select_stmt.as_deref(), Role::Read);
            if let Some(on_conflict) = on_conflict_clause {
                c.visit(NodeRef::OnConflictClause(on_conflict), Role::Read);
            }
            c.returning(returning_clause.as_ref());
        });
    }

    fn update(&mut self, s: &protobuf::UpdateStmt) {
        let protobuf::UpdateStmt {
            relation,
            target_list,
            where_clause,
            from_clause,
            returning_clause,
            with_clause,
        } = s;
        self.scoped(with_clause.as_ref(), |c| {
            c.target(relation.as_ref());
            c.nodes(target_list, Role::Read);
            c.node(where_clause.as_deref(), Role::Read);
            c.nodes(from_clause, Role::Read);
            c.returning(returning_clause.as_ref());
        });
    }

    fn delete(&mut self, s: &protobuf::DeleteStmt) {
        let protobuf::DeleteStmt {
            relation,
            using_clause,
            where_clause,
            returning_clause,
            with_clause,
        } = s;
        self.scoped(with_clause.as_ref(), |c| {
            c.target(relation.as_ref());
            c.nodes(using_clause, Role::Read);
            c.node(where_clause.as_deref(), Role::Read);
            c.returning(returning_clause.as_ref());
        });
    }

    fn merge(&mut self, s: &protobuf::MergeStmt) {
        let protobuf::MergeStmt {
            relation,
            source_relation,
            join_condition,
            merge_when_clauses,
            returning_clause,
            with_clause,
        } = s;
        self.scoped(with_clause.as_ref(), |c| {
            c.target(relation.as_ref());
            c.node(source_relation.as_deref(), Role::Read);
            c.node(join_condition.as_deref(), Role::Read);
            c.nodes(merge_when_clauses, Role::Read);
            c.returning(returning_clause.as_ref());
        });
    }

    fn copy(&mut self, s: &protobuf::CopyStmt) {
        let role = if s.is_from { Role::Write } else { Role::Read };
        if let Some(rel) = &s.relation {
            self.relation(rel, role);
        }
        self.node(s.query.as_deref(), Role::Read);
        self.node(s.where_clause.as_deref(), Role::Read);
    }

    /// `DROP TABLE/VIEW/...` names its objects as lists of strings, not as relations.
    fn drop(&mut self, s: &protobuf::DropStmt) {
        let relation_like = matches!(
            s.remove_type(),
            ObjectType::ObjectTable
                | ObjectType::ObjectView
                | ObjectType::ObjectMatview
                | ObjectType::ObjectForeignTable
                | ObjectType::ObjectSequence
        );
        if !relation_like {
            return;
        }
        for object in &s.objects {
            if let Some(NodeEnum::List(list)) = &object.node {
                if let Some(name) = RelationName::from_parts(&name_parts(&list.items)) {
                    push_unique(&mut self.writes, name);
                }
            }
        }
    }

    fn target(&mut self, relation: Option<&protobuf::RangeVar>) {
        if let Some(rel) = relation {
            self.relation(rel, Role::Write);
        }
    }

    fn relation(&mut self, rv: &protobuf::RangeVar, role: Role) {
        let schema = (!rv.schemaname.is_empty()).then_some(rv.schemaname.as_str());
        let list = match role {
            Role::Ignore => return,
            // An unqualified name in a CTE's scope refers to the CTE.
            Role::Read if schema.is_none() && self.ctes.contains(&rv.relname) => return,
            Role::Read => &mut self.reads,
            Role::Write => &mut self.writes,
        };
        push_unique(list, RelationName::new(schema, &rv.relname));
    }

    fn attribute(&mut self, field: Option<&Node>) {
        if let Some(NodeEnum::String(name)) = field.and_then(|f| f.node.as_ref()) {
            push_unique(&mut self.attributes, name.sval.clone());
        }
    }

    /// Notes the setting a `set_config` call names (its first argument, a string literal,
    /// possibly cast), or that one names it otherwise.
    fn set_config(&mut self, call: &protobuf::FuncCall) {
        let Some(name) = FunctionName::from_parts(&name_parts(&call.funcname)) else {
            return;
        };
        if name.name != "set_config" || name.schema.as_deref().is_some_and(|s| s != "pg_catalog") {
            return;
        }
        let literal = call.args.first().and_then(|arg| match &arg.node {
            Some(NodeEnum::TypeCast(cast)) => cast.arg.as_deref().and_then(const_str),
            _ => const_str(arg),
        });
        match literal {
            Some(setting) => push_unique(&mut self.set_config_names, setting.to_ascii_lowercase()),
            None => self.set_config_unknown = true,
        }
    }

    fn function(&mut self, funcname: &[Node]) {
        if let Some(name) = FunctionName::from_parts(&name_parts(funcname)) {
            push_unique(&mut self.functions, name);
        }
    }

    /// The operators an expression applies: its own name, or for the kinds SQL syntax spells
    /// with words (`BETWEEN`), the operators they stand for.
    fn a_expr(&mut self, e: &protobuf::AExpr) {
        use protobuf::AExprKind as K;
        let implied: &[&str] = match e.kind() {
            K::AexprBetween | K::AexprNotBetween | K::AexprBetweenSym | K::AexprNotBetweenSym => {
                &["<", "<=", ">", ">="]
            }
            _ => &[],
        };
        if implied.is_empty() {
            self.operator(&e.name);
        }
        for op in implied {
            push_unique(&mut self.operators, OperatorName::new(None, op));
        }
    }

    fn operator(&mut self, name: &[Node]) {
        if let Some(name) = OperatorName::from_parts(&name_parts(name)) {
            push_unique(&mut self.operators, name);
        }
    }

    fn sql_value_function(&mut self, op: SqlValueFunctionOp) {
        use SqlValueFunction as F;
        use SqlValueFunctionOp as Op;
        let f = match op {
            Op::SqlvalueFunctionOpUndefined => return,
            Op::SvfopCurrentDate => F::CurrentDate,
            Op::SvfopCurrentTime | Op::SvfopCurrentTimeN => F::CurrentTime,
            Op::SvfopCurrentTimestamp | Op::SvfopCurrentTimestampN => F::CurrentTimestamp,
            Op::SvfopLocaltime | Op::SvfopLocaltimeN => F::LocalTime,
            Op::SvfopLocaltimestamp | Op::SvfopLocaltimestampN => F::LocalTimestamp,
            Op::SvfopCurrentRole => F::CurrentRole,
            Op::SvfopCurrentUser => F::CurrentUser,
            Op::SvfopUser => F::User,
            Op::SvfopSessionUser => F::SessionUser,
            Op::SvfopCurrentCatalog => F::CurrentCatalog,
            Op::SvfopCurrentSchema => F::CurrentSchema,
        };
        push_unique(&mut self.sql_value_functions, f);
    }
}

fn push_unique<T: PartialEq>(list: &mut Vec<T>, item: T) {
    if !list.contains(&item) {
        list.push(item);
    }
}

//! Small readers for parse-tree leaves (constants, name lists, options) and the deparse helpers
//! that turn expressions and type names back into SQL text. Used by every analysis step that
//! reports values rather than relations.

use pg_query::protobuf::{self, a_const, node::Node as NodeEnum, Node};

use crate::SqlError;

/// The `DefElem`s of an option list, skipping anything else.
pub(crate) fn def_elems(options: &[Node]) -> impl Iterator<Item = &protobuf::DefElem> {
    options.iter().filter_map(|n| match &n.node {
        Some(NodeEnum::DefElem(def)) => Some(def.as_ref()),
        _ => None,
    })
}

/// The parts of a dotted name given as a list of `String` nodes.
pub(crate) fn name_parts(names: &[Node]) -> Vec<&str> {
    names
        .iter()
        .filter_map(|n| match &n.node {
            Some(NodeEnum::String(s)) => Some(s.sval.as_str()),
            _ => None,
        })
        .collect()
}

/// A string constant or bare word (option arguments come as either).
pub(crate) fn const_str(node: &Node) -> Option<&str> {
    match &node.node {
        Some(NodeEnum::AConst(c)) => match &c.val {
            Some(a_const::Val::Sval(s)) => Some(&s.sval),
            _ => None,
        },
        Some(NodeEnum::String(s)) => Some(&s.sval),
        _ => None,
    }
}

/// A boolean as PostgreSQL's `defGetBoolean` reads option arguments: integers, booleans and the
/// words `true`/`false`/`on`/`off`/`yes`/`no`.
pub(crate) fn const_bool(node: &Node) -> Option<bool> {
    let from_int = |i: i32| match i {
        0 => Some(false),
        1 => Some(true),
        _ => None,
    };
    match &node.node {
        Some(NodeEnum::AConst(c)) => match &c.val {
            Some(a_const::Val::Ival(i)) => from_int(i.ival),
            Some(a_const::Val::Boolval(b)) => Some(b.boolval),
            Some(a_const::Val::Sval(s)) => word_bool(&s.sval),
            _ => None,
        },
        Some(NodeEnum::Integer(i)) => from_int(i.ival),
        Some(NodeEnum::Boolean(b)) => Some(b.boolval),
        Some(NodeEnum::String(s)) => word_bool(&s.sval),
        _ => None,
    }
}

fn word_bool(word: &str) -> Option<bool> {
    match word.to_ascii_lowercase().as_str() {
        "true" | "on" | "yes" | "1" => Some(true),
        "false" | "off" | "no" | "0" => Some(false),
        _ => None,
    }
}

/// A boolean option such as `ANALYZE` in `EXPLAIN (ANALYZE [value])`: absent value means true.
/// An unreadable value counts as true, the answer that assumes more work is done.
pub(crate) fn option_bool(arg: Option<&Node>) -> bool {
    match arg {
        None => true,
        Some(arg) => const_bool(arg).unwrap_or(true),
    }
}

/// The SQL text of an expression, as pg_query's deparser writes it.
pub(crate) fn expr_sql(expr: &Node, what: &'static str) -> Result<String, SqlError> {
    let target = protobuf::ResTarget {
        val: Some(Box::new(expr.clone())),
        location: -1,
        ..Default::default()
    };
    // Enum fields must hold valid values: libpg_query asserts on the protobuf `Undefined` (0).
    let select = protobuf::SelectStmt {
        target_list: vec![Node {
            node: Some(NodeEnum::ResTarget(Box::new(target))),
        }],
        op: protobuf::SetOperation::SetopNone.into(),
        limit_option: protobuf::LimitOption::Default.into(),
        ..Default::default()
    };
    let sql = deparse(NodeEnum::SelectStmt(Box::new(select)), what)?;
    strip(sql, "SELECT ", what)
}

/// The SQL text of a type name (`integer`, `varchar(10)`, `int[]`).
pub(crate) fn type_sql(
    type_name: &protobuf::TypeName,
    what: &'static str,
) -> Result<String, SqlError> {
    let null = Node {
        node: Some(NodeEnum::AConst(protobuf::AConst {
            isnull: true,
            location: -1,
            val: None,
        })),
    };
    let cast = protobuf::TypeCast {
        arg: Some(Box::new(null)),
        type_name: Some(type_name.clone()),
        location: -1,
    };
    let expr = Node {
        node: Some(NodeEnum::TypeCast(Box::new(cast))),
    };
    strip(expr_sql(&expr, what)?, "NULL::", what)
}

fn deparse(stmt: NodeEnum, what: &'static str) -> Result<String, SqlError> {
    stmt.deparse(Default::default())
        .map_err(|e| SqlError::Unsupported {
            message: format!("deparsing {what}: {e}"),
        })
}

fn strip(sql: String, prefix: &str, what: &'static str) -> Result<String, SqlError> {
    match sql.strip_prefix(prefix) {
        Some(rest) => Ok(rest.to_owned()),
        None => Err(SqlError::Unsupported {
            message: format!("deparsing {what}: unexpected output {sql:?}"),
        }),
    }
}

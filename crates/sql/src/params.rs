//! How many parameters PostgreSQL gives a statement: what a Bind must supply. pgmemo needs it
//! when it checks a Bind itself, because the statement must first be prepared again on a
//! server that lacks it, and that can fail (an aborted block, another `search_path`) where
//! PostgreSQL would have reported a wrong parameter count first.

use pg_query::NodeRef;

use crate::children::for_each_child;
use crate::ParseOptions;

/// The parameter count PostgreSQL gives a statement parsed from `sql` with `given` parameter
/// types: `given`, or the highest `$n` the text uses when that is higher. `None` when the
/// text does not parse.
///
/// ```
/// let options = sql::ParseOptions::default();
/// assert_eq!(sql::parameter_count("SELECT $2::int, '$7'", 0, options), Some(2));
/// assert_eq!(sql::parameter_count("SELECT 1", 3, options), Some(3));
/// ```
pub fn parameter_count(sql: &str, given: usize, options: ParseOptions) -> Option<usize> {
    if !sql.contains('$') {
        return Some(given);
    }
    let parsed = pg_query::parse(sql, options.bits()).ok()?;
    let mut highest = 0;
    for raw in &parsed.protobuf.stmts {
        if let Some(node) = raw.stmt.as_ref().and_then(|s| s.node.as_ref()) {
            visit(node.to_ref(), &mut highest);
        }
    }
    Some(given.max(highest))
}

fn visit(node: NodeRef<'_>, highest: &mut usize) {
    if let NodeRef::ParamRef(p) = node {
        *highest = (*highest).max(usize::try_from(p.number).unwrap_or(0));
    }
    for_each_child(node, &mut |child| visit(child, highest));
}

#[cfg(test)]
mod tests {
    use super::parameter_count;
    use crate::ParseOptions;

    #[test]
    fn the_highest_parameter_or_the_given_types_count() {
        let on = ParseOptions::default();
        assert_eq!(parameter_count("SELECT 1", 0, on), Some(0));
        assert_eq!(parameter_count("", 1, on), Some(1));
        assert_eq!(parameter_count("SELECT $1 + $3", 1, on), Some(3));
        assert_eq!(parameter_count("SELECT $1", 4, on), Some(4));
        assert_eq!(
            parameter_count("SELECT '$9', $$ $8 $$, \"$7\" -- $6", 0, on),
            Some(0)
        );
        assert_eq!(
            parameter_count("SELECT $1 /* $5 */ FROM t WHERE a = $2", 0, on),
            Some(2)
        );
        assert_eq!(
            parameter_count("SELECT * FROM t WHERE a IN (SELECT $4)", 0, on),
            Some(4)
        );
        assert_eq!(parameter_count("SELECT ($1", 0, on), None);
    }

    #[test]
    fn strings_are_read_as_the_session_reads_them() {
        let off = ParseOptions {
            standard_conforming_strings: false,
        };
        let sql = r"SELECT 'it\'s $1'";
        assert_eq!(parameter_count(sql, 0, off), Some(0));
        assert_eq!(parameter_count(sql, 0, ParseOptions::default()), None);
    }
}

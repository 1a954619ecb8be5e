//! Catalog lookups: what the names in a statement refer to, asked of the upstream on the
//! client's own server connection (so the session's search_path, temporary schema and
//! privileges apply) when a statement shape is first seen. One query answers everything the
//! cache policy needs: each relation's OID, kind, persistence and row-level security; the
//! relations a result really depends on (partitions and inheritance children and parents, the
//! base tables behind views, recursively); the tables a write changes besides its target (FK
//! cascades) and what code a write runs unseen (triggers, rules, defaults, constraints); and
//! the volatility of every function called, all overloads included.

use std::fmt::Write as _;

/// How a relation was reached from a name in the statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// The named relation itself.
    Named,
    /// A partition or inheritance child (reading the parent reads it; writing the parent may
    /// change it).
    Descendant,
    /// A parent (its readers see this relation's rows).
    Ancestor,
    /// A relation a view reads.
    ViewBase,
    /// A table an FK cascade (ON DELETE/UPDATE CASCADE, SET NULL, SET DEFAULT) may change.
    Cascade,
}

/// A relation found for a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// Index of the name in the list that was looked up.
    pub name_index: usize,
    pub oid: u32,
    pub reach: Reach,
    /// `pg_class.relkind`.
    pub kind: u8,
    /// `pg_class.relpersistence`: `p`, `u` or `t`.
    pub persistence: u8,
    pub row_security: bool,
    pub schema: String,
    pub name: String,
    /// What code a write to it runs besides the write itself (triggers, rules, column
    /// defaults, CHECK and domain constraints): what that code may change, the session's
    /// settings and temporary tables included, is an effect of the write.
    pub hidden_code: HiddenCode,
    /// A view's definition, to find the functions it calls.
    pub view_definition: Option<String>,
}

/// Code a write to a relation runs without the statement naming it, by what it may change.
/// A write is planned from the statement's text, so what this code does must be added to the
/// write's effects, or the session's next read is keyed and planned as if it had not run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HiddenCode {
    /// None, or only built-in functions that change neither settings nor tables pgmemo reads
    /// (`nextval()` of a serial column, `random()`, `now()`).
    #[default]
    Nothing,
    /// `set_config` in a column default or a CHECK or domain constraint: it changes the
    /// session's settings (which are part of the key) and nothing else.
    Settings,
    /// User triggers or rules, or a volatile user-defined function in a column default or a
    /// CHECK or domain constraint: they may write tables pgmemo cannot name, change settings,
    /// create temporary tables and run DDL, as `DO` may.
    Anything,
}

impl HiddenCode {
    /// Reads the lookup's column (`w`, `s` or `n`).
    fn from_column(value: Option<&str>) -> Option<HiddenCode> {
        match value {
            Some("w") => Some(HiddenCode::Anything),
            Some("s") => Some(HiddenCode::Settings),
            Some("n") => Some(HiddenCode::Nothing),
            _ => None,
        }
    }
}

/// OIDs below this belong to objects initdb created: the built-in functions.
pub const FIRST_NORMAL_OBJECT_ID: u32 = 16384;

/// A function found for a name (one row per overload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    pub name_index: usize,
    /// `pg_proc.provolatile`: `i`, `s` or `v`.
    pub volatility: u8,
    /// `pg_proc.oid`.
    pub oid: u32,
}

impl Function {
    /// Whether a call (the function is named `name`) may change the session's settings:
    /// `set_config`, and any volatile function defined after initdb (PL/pgSQL, SQL and
    /// extension functions can run SET). Built-in volatile functions such as `random()`,
    /// `nextval()` or `clock_timestamp()` cannot, nor can any stable or immutable function
    /// (PostgreSQL refuses SET inside them), so after those the session's context need not be
    /// read again.
    pub fn may_change_settings(&self, name: &str) -> bool {
        self.volatility == b'v' && (self.oid >= FIRST_NORMAL_OBJECT_ID || name == "set_config")
    }
}

/// The answer to one lookup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    pub relations: Vec<Relation>,
    /// Names (by index) that resolve to no relation.
    pub unresolved: Vec<usize>,
    /// Unqualified names (by index) that some session's temporary table also has: which one a
    /// session sees depends on that session, so no result may be shared.
    pub temp_shadowed: Vec<usize>,
    pub functions: Vec<Function>,
    /// The functions behind the user-defined operators (`pg_operator.oid` ≥
    /// [`FIRST_NORMAL_OBJECT_ID`]) of each operator name, all operand types included. Built-in
    /// operators are left out: none is volatile, and the stable ones depend only on settings
    /// that are part of the key (`TimeZone` for the timestamptz comparisons,
    /// `default_text_search_config` for `@@` on text, the output functions of `||`).
    pub operators: Vec<Function>,
    /// For each cast target type name, the functions a cast to it may run that are not
    /// built-in choices: the functions of user-defined casts (`pg_cast.oid` ≥
    /// [`FIRST_NORMAL_OBJECT_ID`], whatever their source type) and the type's input function
    /// when it was created after initdb. Built-in casts are left out for the operators'
    /// reason (the stable ones depend on `TimeZone`, `lc_monetary` and `search_path`).
    pub casts: Vec<Function>,
    /// For each name of a qualified column reference or field selection, the functions of
    /// the search path that attribute notation (`t.f`) could call: one argument (others
    /// defaulted) of a composite or pseudo type. None for a name that is only a column.
    pub attributes: Vec<Function>,
}

/// Why a lookup's answer could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CatalogError {
    #[error("a name holds characters pgmemo does not quote for catalog lookups")]
    UnsafeName,
    #[error("unexpected catalog row: {0}")]
    BadRow(String),
}

/// A name as (optional schema, name).
pub type Name<'a> = (Option<&'a str>, &'a str);

fn literal(out: &mut String, value: Option<&str>) -> Result<(), CatalogError> {
    match value {
        None => out.push_str("NULL::pg_catalog.text"),
        Some(v) => {
            // Backslashes would mean different things under standard_conforming_strings=off.
            if v.contains('\\') || v.contains('\0') {
                return Err(CatalogError::UnsafeName);
            }
            out.push('\'');
            out.push_str(&v.replace('\'', "''"));
            out.push('\'');
        }
    }
    Ok(())
}

fn values(out: &mut String, names: &[Name<'_>]) -> Result<(), CatalogError> {
    if names.is_empty() {
        // An empty VALUES list is not valid SQL: a row that matches nothing stands in.
        out.push_str("SELECT -1, NULL::pg_catalog.text, NULL::pg_catalog.text WHERE false");
        return Ok(());
    }
    out.push_str("VALUES ");
    for (i, (schema, name)) in names.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "({i}, ");
        literal(out, *schema)?;
        out.push_str(", ");
        literal(out, Some(name))?;
        out.push(')');
    }
    Ok(())
}

/// The lookup query for these relation, function and operator names. It never raises an
/// error for names that do not exist (it runs inside the client's transaction, which an error
/// would abort).
pub fn lookup_query(
    relations: &[Name<'_>],
    functions: &[Name<'_>],
    operators: &[Name<'_>],
    casts: &[Name<'_>],
    attributes: &[Name<'_>],
) -> Result<String, CatalogError> {
    let mut q = String::with_capacity(4096);
    q.push_str("/* pgmemo catalog lookup */ WITH RECURSIVE names(i, nsp, rel) AS (");
    values(&mut q, relations)?;
    q.push_str("), fnames(i, nsp, fn) AS (");
    values(&mut q, functions)?;
    q.push_str("), onames(i, nsp, op) AS (");
    values(&mut q, operators)?;
    q.push_str("), tnames(i, nsp, typ) AS (");
    values(&mut q, casts)?;
    q.push_str("), anames(i, nsp, attr) AS (");
    values(&mut q, attributes)?;
    q.push_str(LOOKUP_BODY);
    Ok(q)
}

/// Runs in the client's session, under its search_path, which may list the client's own
/// schemas before pg_catalog: every function, operator and type is named with its schema
/// (`OPERATOR(pg_catalog.=)`), so none of the client's can stand in for it.
///
/// A function's volatility (`'p'` rows) is the worst of its own and that of the functions
/// and operators its parameter defaults call: a call that leaves a parameter out runs its
/// default (`n bigint DEFAULT nextval('s')` in an IMMUTABLE function). They are read from
/// the stored expression, as `pg_depend` records no dependency on built-in functions; a
/// conversion through text there (`'today'::text::date`) counts as stable.
///
/// A relation's hidden code (`'r'` rows, see [`HiddenCode`]): its user triggers, its rules
/// other than a view's `_RETURN`, and the volatile functions its column defaults, CHECK
/// constraints and its columns' domains (their CHECK constraints and defaults; a domain over
/// another domain for its own only) call, read from the stored expressions as above: a
/// user-defined one may do anything, `set_config` changes settings, other built-in ones
/// (`nextval()`) neither.
///
/// A cast to a domain (`'x'::currency`) runs the domain's CHECK constraints: the functions
/// and operators they call count among the cast's (`'c'` rows), as a user-defined cast's
/// function does.
const LOOKUP_BODY: &str = r#"),
roots AS (SELECT i, rel, nsp, pg_catalog.to_regclass(CASE WHEN nsp IS NULL THEN pg_catalog.quote_ident(rel) ELSE pg_catalog.textcat(pg_catalog.textcat(pg_catalog.quote_ident(nsp), '.'), pg_catalog.quote_ident(rel)) END)::pg_catalog.oid AS oid FROM names),
deps(i, oid, how) AS (
  SELECT i, oid, 'r'::pg_catalog.text FROM roots WHERE oid IS NOT NULL
  UNION
  SELECT d.i, x.oid, x.how FROM deps d, LATERAL (
    SELECT h.inhrelid AS oid, 'd'::pg_catalog.text AS how FROM pg_catalog.pg_inherits h WHERE h.inhparent OPERATOR(pg_catalog.=) d.oid AND d.how OPERATOR(pg_catalog.=) ANY ('{r,d,b,f}'::pg_catalog.text[])
    UNION ALL SELECT h.inhparent, 'a' FROM pg_catalog.pg_inherits h WHERE h.inhrelid OPERATOR(pg_catalog.=) d.oid AND d.how OPERATOR(pg_catalog.=) ANY ('{r,a,b}'::pg_catalog.text[])
    UNION ALL SELECT dp.refobjid, 'b' FROM pg_catalog.pg_rewrite rw JOIN pg_catalog.pg_depend dp ON dp.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_rewrite'::pg_catalog.regclass AND dp.objid OPERATOR(pg_catalog.=) rw.oid AND dp.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass WHERE rw.ev_class OPERATOR(pg_catalog.=) d.oid AND dp.refobjid OPERATOR(pg_catalog.<>) d.oid AND d.how OPERATOR(pg_catalog.=) ANY ('{r,b}'::pg_catalog.text[])
    UNION ALL SELECT con.conrelid, 'f' FROM pg_catalog.pg_constraint con WHERE con.confrelid OPERATOR(pg_catalog.=) d.oid AND con.contype OPERATOR(pg_catalog.=) 'f' AND (con.confdeltype OPERATOR(pg_catalog.=) ANY ('{c,n,d}'::pg_catalog."char"[]) OR con.confupdtype OPERATOR(pg_catalog.=) ANY ('{c,n,d}'::pg_catalog."char"[])) AND d.how OPERATOR(pg_catalog.=) ANY ('{r,b,f,d}'::pg_catalog.text[])
  ) x
)
SELECT 'r', d.i, d.oid::pg_catalog.int8, d.how, c.relkind::pg_catalog.text, c.relpersistence::pg_catalog.text, c.relrowsecurity::pg_catalog.text, n.nspname::pg_catalog.text, c.relname::pg_catalog.text,
  CASE WHEN (c.relhasrules AND EXISTS (SELECT 1 FROM pg_catalog.pg_rewrite hr WHERE hr.ev_class OPERATOR(pg_catalog.=) c.oid AND hr.ev_type OPERATOR(pg_catalog.<>) '1'))
    OR EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t WHERE t.tgrelid OPERATOR(pg_catalog.=) c.oid AND NOT t.tgisinternal)
    OR hc.level OPERATOR(pg_catalog.=) 2 THEN 'w' WHEN hc.level OPERATOR(pg_catalog.=) 1 THEN 's' ELSE 'n' END,
  CASE WHEN c.relkind OPERATOR(pg_catalog.=) 'v' THEN pg_catalog.pg_get_viewdef(c.oid) END
  FROM deps d JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.oid JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
  LEFT JOIN LATERAL (SELECT pg_catalog.max(CASE WHEN hp.oid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid THEN 2 ELSE 1 END) AS level FROM pg_catalog.pg_proc hp
    WHERE hp.provolatile OPERATOR(pg_catalog.=) 'v' AND (hp.oid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid OR hp.proname OPERATOR(pg_catalog.=) 'set_config')
    AND hp.oid OPERATOR(pg_catalog.=) ANY (SELECT ((pg_catalog.regexp_matches(x.e, ':(?:op)?funcid ([0-9]+)', 'g'))[1])::pg_catalog.oid FROM (
      SELECT ad.adbin::pg_catalog.text AS e FROM pg_catalog.pg_attrdef ad WHERE ad.adrelid OPERATOR(pg_catalog.=) c.oid
      UNION ALL SELECT con.conbin::pg_catalog.text FROM pg_catalog.pg_constraint con WHERE con.conrelid OPERATOR(pg_catalog.=) c.oid AND con.contype OPERATOR(pg_catalog.=) 'c'
      UNION ALL SELECT con.conbin::pg_catalog.text FROM pg_catalog.pg_attribute att JOIN pg_catalog.pg_constraint con ON con.contypid OPERATOR(pg_catalog.=) att.atttypid AND con.contype OPERATOR(pg_catalog.=) 'c' WHERE att.attrelid OPERATOR(pg_catalog.=) c.oid AND att.attnum OPERATOR(pg_catalog.>) 0 AND NOT att.attisdropped
      UNION ALL SELECT ty.typdefaultbin::pg_catalog.text FROM pg_catalog.pg_attribute att JOIN pg_catalog.pg_type ty ON ty.oid OPERATOR(pg_catalog.=) att.atttypid WHERE att.attrelid OPERATOR(pg_catalog.=) c.oid AND att.attnum OPERATOR(pg_catalog.>) 0 AND NOT att.attisdropped) x)) hc ON true
UNION ALL SELECT 'u', i, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM roots WHERE oid IS NULL
UNION ALL SELECT 't', i, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM names WHERE nsp IS NULL AND EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.relname OPERATOR(pg_catalog.=) names.rel AND c.relpersistence OPERATOR(pg_catalog.=) 't')
UNION ALL SELECT 'p', f.i, p.oid::pg_catalog.int8, CASE WHEN p.prokind OPERATOR(pg_catalog.=) 'a' THEN (
    SELECT CASE WHEN pg_catalog.bool_or(sp.provolatile OPERATOR(pg_catalog.=) 'v') THEN 'v' WHEN pg_catalog.bool_or(sp.provolatile OPERATOR(pg_catalog.=) 's') THEN 's' ELSE 'i' END
    FROM pg_catalog.pg_aggregate a JOIN pg_catalog.pg_proc sp ON sp.oid OPERATOR(pg_catalog.=) p.oid OR sp.oid OPERATOR(pg_catalog.=) ANY (ARRAY[a.aggtransfn::pg_catalog.oid, a.aggfinalfn::pg_catalog.oid, a.aggcombinefn::pg_catalog.oid, a.aggserialfn::pg_catalog.oid, a.aggdeserialfn::pg_catalog.oid, a.aggmtransfn::pg_catalog.oid, a.aggminvtransfn::pg_catalog.oid, a.aggmfinalfn::pg_catalog.oid])
    WHERE a.aggfnoid OPERATOR(pg_catalog.=) p.oid) WHEN p.proargdefaults IS NULL THEN p.provolatile::pg_catalog.text ELSE (
    SELECT pg_catalog.max(vol.v) FROM (SELECT p.provolatile::pg_catalog.text AS v
      UNION ALL SELECT dp.provolatile::pg_catalog.text FROM pg_catalog.pg_proc dp WHERE dp.oid OPERATOR(pg_catalog.=) ANY (SELECT ((pg_catalog.regexp_matches(p.proargdefaults::pg_catalog.text, ':(?:op)?funcid ([0-9]+)', 'g'))[1])::pg_catalog.oid)
      UNION ALL SELECT 's' WHERE p.proargdefaults::pg_catalog.text OPERATOR(pg_catalog.~) 'COERCEVIAIO') vol) END, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM fnames f JOIN pg_catalog.pg_proc p ON p.proname OPERATOR(pg_catalog.=) f.fn
  AND ((f.nsp IS NULL AND p.pronamespace OPERATOR(pg_catalog.=) ANY (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(true)))) OR p.pronamespace OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname OPERATOR(pg_catalog.=) f.nsp))
UNION ALL SELECT 'o', f.i, p.oid::pg_catalog.int8, p.provolatile::pg_catalog.text, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM onames f JOIN pg_catalog.pg_operator o ON o.oprname OPERATOR(pg_catalog.=) f.op AND o.oid OPERATOR(pg_catalog.>=) 16384
  AND ((f.nsp IS NULL AND o.oprnamespace OPERATOR(pg_catalog.=) ANY (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(true)))) OR o.oprnamespace OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname OPERATOR(pg_catalog.=) f.nsp))
  JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) o.oprcode
UNION ALL SELECT 'a', f.i, p.oid::pg_catalog.int8, p.provolatile::pg_catalog.text, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM anames f JOIN pg_catalog.pg_proc p ON p.proname OPERATOR(pg_catalog.=) f.attr
  AND p.pronargs OPERATOR(pg_catalog.>=) 1 AND p.pronargs OPERATOR(pg_catalog.-) p.pronargdefaults OPERATOR(pg_catalog.<=) 1
  AND p.pronamespace OPERATOR(pg_catalog.=) ANY (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(true)))
  AND EXISTS (SELECT 1 FROM pg_catalog.pg_type ty WHERE ty.oid OPERATOR(pg_catalog.=) p.proargtypes[0] AND ty.typtype OPERATOR(pg_catalog.=) ANY ('{c,p}'::pg_catalog."char"[]))
UNION ALL SELECT 'c', f.i, p.oid::pg_catalog.int8, p.provolatile::pg_catalog.text, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM tnames f JOIN pg_catalog.pg_type t ON t.typname OPERATOR(pg_catalog.=) f.typ
  AND ((f.nsp IS NULL AND t.typnamespace OPERATOR(pg_catalog.=) ANY (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(true)))) OR t.typnamespace OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname OPERATOR(pg_catalog.=) f.nsp))
  JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) ANY (SELECT c.castfunc FROM pg_catalog.pg_cast c WHERE c.casttarget OPERATOR(pg_catalog.=) t.oid AND c.oid OPERATOR(pg_catalog.>=) 16384 UNION ALL SELECT t.typinput::pg_catalog.oid WHERE t.typinput::pg_catalog.oid OPERATOR(pg_catalog.>=) 16384
    UNION ALL SELECT ((pg_catalog.regexp_matches(con.conbin::pg_catalog.text, ':(?:op)?funcid ([0-9]+)', 'g'))[1])::pg_catalog.oid FROM pg_catalog.pg_constraint con WHERE con.contypid OPERATOR(pg_catalog.=) t.oid AND con.contype OPERATOR(pg_catalog.=) 'c')"#;

/// A row of the lookup's answer, as text columns (NULL as `None`).
pub type Row = Vec<Option<String>>;

/// The first column of the first row of an answer to one of pgmemo's own queries (`None`: no
/// answer, no row or NULL).
pub fn first_value(rows: Option<Vec<Row>>) -> Option<String> {
    rows?.into_iter().next()?.into_iter().next().flatten()
}

fn col(row: &Row, i: usize) -> Option<&str> {
    row.get(i).and_then(|c| c.as_deref())
}

fn byte(row: &Row, i: usize) -> u8 {
    col(row, i).and_then(|s| s.bytes().next()).unwrap_or(b'?')
}

/// Reads the lookup's rows.
pub fn parse_facts(rows: &[Row]) -> Result<Facts, CatalogError> {
    let mut facts = Facts::default();
    for row in rows {
        let bad = || CatalogError::BadRow(format!("{row:?}"));
        let index: usize = col(row, 1).and_then(|s| s.parse().ok()).ok_or_else(bad)?;
        match col(row, 0) {
            Some("r") => {
                let oid: u32 = col(row, 2).and_then(|s| s.parse().ok()).ok_or_else(bad)?;
                let reach = match col(row, 3) {
                    Some("r") => Reach::Named,
                    Some("d") => Reach::Descendant,
                    Some("a") => Reach::Ancestor,
                    Some("b") => Reach::ViewBase,
                    Some("f") => Reach::Cascade,
                    _ => return Err(bad()),
                };
                facts.relations.push(Relation {
                    name_index: index,
                    oid,
                    reach,
                    kind: byte(row, 4),
                    persistence: byte(row, 5),
                    row_security: col(row, 6) == Some("true"),
                    schema: col(row, 7).unwrap_or_default().to_owned(),
                    name: col(row, 8).unwrap_or_default().to_owned(),
                    hidden_code: HiddenCode::from_column(col(row, 9)).ok_or_else(bad)?,
                    view_definition: col(row, 10).map(str::to_owned),
                });
            }
            Some("u") => facts.unresolved.push(index),
            Some("t") => facts.temp_shadowed.push(index),
            Some(kind @ ("p" | "o" | "c" | "a")) => {
                let function = Function {
                    name_index: index,
                    volatility: byte(row, 3),
                    oid: col(row, 2).and_then(|s| s.parse().ok()).ok_or_else(bad)?,
                };
                match kind {
                    "p" => facts.functions.push(function),
                    "o" => facts.operators.push(function),
                    "a" => facts.attributes.push(function),
                    _ => facts.casts.push(function),
                }
            }
            _ => return Err(bad()),
        }
    }
    Ok(facts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lookup runs under the client's search_path, which may list the client's schemas
    /// before pg_catalog: every function, operator and type it names must be pg_catalog's.
    #[test]
    fn the_lookup_names_only_pg_catalogs_functions_operators_and_types() {
        let q = lookup_query(
            &[(None, "t")],
            &[(None, "f")],
            &[(None, "+")],
            &[(None, "d")],
            &[(None, "a")],
        )
        .unwrap();
        for op in [" = ", " <> ", " >= ", " <= ", " < ", " > ", " || ", " IN ("] {
            assert!(!q.contains(op), "unqualified {op:?} in {q}");
        }
        for (at, _) in q.match_indices("::") {
            assert!(
                q[at + 2..].starts_with("pg_catalog."),
                "cast at {}",
                &q[at..]
            );
        }
        let bytes = q.as_bytes();
        for (at, _) in q.match_indices('(') {
            let start = q[..at]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
                .map_or(0, |i| i + 1);
            let word = &q[start..at];
            let allowed = [
                "", "ANY", "EXISTS", "OPERATOR", "names", "fnames", "onames", "tnames", "anames",
                "deps",
            ];
            assert!(
                word.starts_with("pg_catalog.") || allowed.contains(&word),
                "unqualified call {word}( in {}",
                String::from_utf8_lossy(&bytes[start..(at + 40).min(bytes.len())])
            );
        }
    }

    #[test]
    fn names_are_quoted_and_backslashes_refused() {
        let q = lookup_query(
            &[(Some("s"), "it's")],
            &[],
            &[(None, "+")],
            &[(None, "t")],
            &[],
        )
        .unwrap();
        assert!(q.contains("(0, 's', 'it''s')"), "{q}");
        assert!(q.contains("WHERE false"), "empty function list: {q}");
        assert!(
            q.contains("onames(i, nsp, op) AS (VALUES (0, NULL::pg_catalog.text, '+'))"),
            "{q}"
        );
        assert_eq!(
            lookup_query(&[(None, "a\\b")], &[], &[], &[], &[]),
            Err(CatalogError::UnsafeName)
        );
    }

    fn r(v: &[Option<&str>]) -> Row {
        v.iter().map(|c| c.map(str::to_owned)).collect()
    }

    /// A function row of the answer (`p`, `o` or `c`) for name 0: only its first four
    /// columns are set.
    fn function_row(kind: &str, oid: &str, volatility: &str) -> Row {
        let mut row = r(&[Some(kind), Some("0"), Some(oid), Some(volatility)]);
        row.resize(11, None);
        row
    }

    #[test]
    fn rows_are_read() {
        let rows = vec![
            r(&[
                Some("r"),
                Some("0"),
                Some("16387"),
                Some("r"),
                Some("r"),
                Some("p"),
                Some("false"),
                Some("public"),
                Some("t"),
                Some("n"),
                None,
            ]),
            r(&[
                Some("u"),
                Some("1"),
                None,
                None,
                None,
                None,
                None,
                None,
                None,
                None,
                None,
            ]),
            function_row("p", "1396", "i"),
            function_row("o", "16400", "v"),
            function_row("c", "16401", "s"),
        ];
        let f = parse_facts(&rows).unwrap();
        assert_eq!(f.operators.len(), 1);
        assert_eq!(
            (f.operators[0].oid, f.operators[0].volatility),
            (16400, b'v')
        );
        assert_eq!(f.functions.len(), 1);
        assert_eq!((f.casts[0].oid, f.casts[0].volatility), (16401, b's'));
        assert_eq!(f.relations[0].oid, 16387);
        assert_eq!(f.relations[0].reach, Reach::Named);
        assert_eq!(f.unresolved, vec![1]);
        assert_eq!(f.functions[0].volatility, b'i');
    }
}

//! Table-driven tests of [`sql::may_affect_session`]: the expected answer for typical and tricky
//! query strings, and its one promise checked against the full analysis: whenever
//! [`sql::analyze`] finds a session-affecting statement, the prefilter said `true`.

use sql::{StatementInfo, StatementKind};

/// Query strings and the prefilter's expected answer. Some `true` rows are over-matches the
/// prefilter accepts (words inside literals and comments); they are marked as such.
const CASES: &[(&str, bool)] = &[
    // Typical traffic: no parse needed.
    (
        "SELECT abalance FROM pgbench_accounts WHERE aid = 42;",
        false,
    ),
    (
        "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 1;",
        false,
    ),
    ("INSERT INTO t VALUES (1)", false),
    ("BEGIN", false),
    ("COMMIT", false),
    ("select 1", false),
    ("", false),
    (";;", false),
    ("  \n\t select 1", false),
    ("WITH x AS (SELECT 1) SELECT * FROM x", false),
    ("DELETE FROM t WHERE id = 1 RETURNING *", false),
    ("VALUES (1), (2)", false),
    ("CREATE TABLE t (a int)", false),
    ("CREATE UNLOGGED TABLE t (a int)", false),
    (
        "SELECT settings, reset_val, temperature, temp_c FROM t",
        false,
    ),
    ("SELECT current_setting('work_mem')", false),
    (
        "SELECT my_set_config(1), set_config_x(2), xset_config(3)",
        false,
    ),
    ("SELECT pg_advisory_xact_lock(1)", false),
    ("SELECT pg_advisory_unlock(1)", false),
    ("/* set x = 1 */ select 1", false),
    ("-- set x = 1\nselect 1", false),
    ("/* a /* nested */ set */ select 1", false),
    ("SELECT 1 /* ( */ FROM t", false),
    ("settle", false),
    ("SELECT $$;set$$", false),
    ("BEGIN; UPDATE t SET a = 1; COMMIT", false),
    // Statement starts.
    ("SET search_path = app", true),
    ("set x = 2", true),
    ("RESET ALL", true),
    ("reset work_mem", true),
    ("/* c */ SET x=1", true),
    ("-- comment\nSET x = 1", true),
    ("-- comment\rSET x = 1", true),
    ("/* a /* nested */ still */ SET x = 1", true),
    ("(SET x = 1", true),
    ("((  /* c */ (reset all", true),
    ("select 1; set x = 2", true),
    ("select 1;set x = 2", true),
    ("BEGIN; SET LOCAL statement_timeout = 0; COMMIT", true),
    ("UPDATE t SET a = 1; RESET ALL", true),
    ("SET\"search_path\" = app", true),
    ("PREPARE p (int) AS SELECT $1", true),
    ("prepare transaction 'x'", true),
    ("execute s1(1)", true),
    ("  deallocate all", true),
    ("DEALLOCATE PREPARE p", true),
    ("discard all", true),
    ("DISCARD PLANS", true),
    ("LISTEN ch", true),
    ("unlisten *", true),
    ("DECLARE c CURSOR WITH HOLD FOR SELECT 1", true),
    // EXECUTE anywhere: a prepared statement run from inside another statement.
    ("EXPLAIN EXECUTE p(1)", true),
    ("EXPLAIN (ANALYZE, COSTS OFF) EXECUTE p", true),
    ("CREATE TABLE t AS EXECUTE p", true),
    // Words anywhere.
    ("create temporary table t()", true),
    ("CREATE TEMP TABLE t (a int) ON COMMIT DROP", true),
    ("CREATE GLOBAL TEMP SEQUENCE s", true),
    ("SELECT * INTO TEMP t FROM s", true),
    ("CREATE TEMP VIEW v AS SELECT 1", true),
    ("CREATE TABLE pg_temp.t (a int)", true),
    ("SELECT 1 INTO pg_temp_3.t", true),
    ("SELECT pg_temp.f()", true),
    ("select pg_advisory_lock(1)", true),
    ("SELECT pg_catalog.pg_advisory_lock_shared(1, 2)", true),
    ("SELECT PG_TRY_ADVISORY_LOCK(1)", true),
    ("SELECT pg_try_advisory_lock_shared(1)", true),
    ("SELECT set_config('search_path', 'app', false)", true),
    ("SELECT \"set_config\"('a','b',false)", true),
    ("SELECT \"pg_advisory_lock\"(1)", true),
    ("SELECT U&\"\\0073et_config\"('a','b',false)", true),
    ("SELECT u&\"x\"", true),
    // A `/*` or `--` inside a literal cannot hide a later statement.
    ("SELECT ';--'; SET x = 1", true),
    ("SELECT '/*'; SET x = 1; -- */", true),
    ("SELECT 1;/*;/* a */ b */ SET x = 1", true),
    ("SELECT ';/*'; /* c */ LISTEN ch", true),
    // Over-matches: words and `;` inside literals and comments.
    ("SELECT E'\\';set x=1'", true),
    ("SELECT 'a;set'", true),
    ("SELECT * FROM t WHERE note = 'temp'", true),
    ("SELECT 1 -- ; set x\n", true),
    ("SELECT \"temp\" FROM t", true),
    ("GRANT EXECUTE ON FUNCTION f() TO bob", true),
];

#[test]
fn answers_for_typical_and_tricky_strings() {
    let failures: Vec<String> = CASES
        .iter()
        .filter(|&&(sql, want)| sql::may_affect_session(sql) != want)
        .map(|&(sql, want)| format!("{sql:?}: want {want}"))
        .collect();
    assert!(failures.is_empty(), "\n{}\n", failures.join("\n"));
}

#[test]
fn nesting_deeper_than_the_scan_follows_answers_true() {
    let deep = format!("{} select 1", "/* ".repeat(70));
    assert!(sql::may_affect_session(&deep));
    let shallow = format!("{} select 1 {}", "/* ".repeat(60), "*/ ".repeat(60));
    assert!(!sql::may_affect_session(&shallow));
}

/// The statement kinds and flags the transaction pooler must see.
fn affects_session(stmt: &StatementInfo) -> bool {
    use StatementKind as K;
    stmt.session_temp_table
        || match &stmt.kind {
            K::Set(_)
            | K::Prepare { .. }
            | K::Execute { .. }
            | K::Deallocate { .. }
            | K::Discard(_)
            | K::Listen { .. }
            | K::Unlisten { .. }
            | K::DeclareCursor { .. }
            | K::Do
            | K::Call => true,
            K::Explain { inner, .. } => affects_session(inner),
            _ => false,
        }
        || stmt.functions.iter().any(|f| {
            matches!(
                f.name.as_str(),
                "set_config"
                    | "pg_advisory_lock"
                    | "pg_advisory_lock_shared"
                    | "pg_try_advisory_lock"
                    | "pg_try_advisory_lock_shared"
            )
        })
}

/// Session-affecting statements in the spellings clients use.
const SESSION_STATEMENTS: &[&str] = &[
    "DO $$BEGIN SET search_path = app; END$$",
    "do language plpgsql 'BEGIN NULL; END'",
    "CALL app.refresh(1)",
    "call refresh()",
    "SET search_path = app, public",
    "SET LOCAL statement_timeout = '5s'",
    "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
    "SET TIME ZONE 'UTC'",
    "SET ROLE bob",
    "SET SESSION AUTHORIZATION bob",
    "SET TRANSACTION READ ONLY",
    "set application_name to 'x'",
    "RESET ALL",
    "RESET search_path",
    "PREPARE p (int) AS SELECT $1",
    "PREPARE q AS UPDATE t SET a = 1",
    "EXECUTE p(1)",
    "EXPLAIN EXECUTE p(1)",
    "EXPLAIN (ANALYZE) EXECUTE p",
    "DEALLOCATE p",
    "DEALLOCATE ALL",
    "DISCARD ALL",
    "DISCARD TEMP",
    "LISTEN ch",
    "UNLISTEN *",
    "DECLARE c CURSOR FOR SELECT 1",
    "DECLARE c BINARY CURSOR WITH HOLD FOR SELECT * FROM t",
    "CREATE TEMP TABLE t (a int)",
    "CREATE TEMPORARY TABLE t (a int) ON COMMIT DELETE ROWS",
    "CREATE TEMP TABLE t AS SELECT 1",
    "SELECT 1 INTO TEMP t",
    "SELECT 1 INTO pg_temp.t",
    "CREATE TABLE pg_temp.t (a int)",
    "CREATE TEMP VIEW v AS SELECT 1",
    "CREATE TEMP SEQUENCE s",
    "EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT 1",
    "SELECT set_config('search_path', 'app', false)",
    "SELECT pg_catalog.set_config('a.b', 'c', true)",
    "SELECT \"set_config\"('a.b', 'c', true)",
    "SELECT pg_advisory_lock(1)",
    "SELECT pg_advisory_lock_shared(1, 2)",
    "SELECT pg_try_advisory_lock(1)",
    "SELECT pg_try_advisory_lock_shared(1)",
    "SELECT x FROM t WHERE pg_try_advisory_lock(t.id)",
];

/// Statements that affect nothing, to surround the others with.
const PLAIN_STATEMENTS: &[&str] = &[
    "SELECT 1",
    "UPDATE t SET a = 1",
    "SELECT ';--', '/*', $$;set$$, E'\\';--'",
    "SELECT \"x;/*\" FROM t",
    "BEGIN",
    "COMMIT",
];

/// What may stand between a statement boundary and the statement's first word.
const LEADS: &[&str] = &[
    "",
    " ",
    "\n\t ",
    "/* c */ ",
    "/* a /* b */ c */",
    "-- c\n",
    "-- c\r",
    "/* ; */ -- ;\n /**/",
];

/// Checks one string: `session` says whether it holds a session-affecting statement. Both the
/// analysis and the prefilter must agree with it; for plain strings this also shows the
/// prefilter does not over-match on lead-ins.
fn check(text: &str, session: bool, failures: &mut Vec<String>) {
    let Ok(analysis) = sql::analyze(text) else {
        failures.push(format!("{text:?}: does not parse"));
        return;
    };
    let analysed = analysis.statements.iter().any(affects_session);
    let prefiltered = sql::may_affect_session(text);
    if analysed != session || prefiltered != session {
        failures.push(format!(
            "{text:?}: want {session}, analysis {analysed}, prefilter {prefiltered}"
        ));
    }
}

/// Every session-affecting statement, alone or after another statement, behind every kind of
/// lead-in, is caught; plain statements in the same positions are not flagged.
#[test]
fn the_prefilter_catches_what_the_analysis_finds() {
    let statements = SESSION_STATEMENTS
        .iter()
        .map(|&s| (s, true))
        .chain(PLAIN_STATEMENTS.iter().map(|&s| (s, false)));
    let mut failures = Vec::new();
    for (stmt, session) in statements {
        for &lead in LEADS {
            check(&format!("{lead}{stmt}"), session, &mut failures);
            for &before in PLAIN_STATEMENTS {
                check(&format!("{before}; {lead}{stmt}"), session, &mut failures);
                check(&format!("{before};{lead}{stmt};"), session, &mut failures);
            }
        }
    }
    assert!(failures.is_empty(), "\n{}\n", failures.join("\n"));
}

/// Strings built at random from tricky fragments (literals and quoted names holding `;`, `/*`
/// and `--`, comments holding statements, dollar quotes): whenever the analysis succeeds and
/// finds a session-affecting statement, the prefilter must have said `true`. Deterministic, so
/// a failure reproduces.
#[test]
fn random_strings_never_hide_a_session_statement() {
    const FRAGMENTS: &[&str] = &[
        "SELECT 1",
        "SELECT ';--'",
        "SELECT '/*'",
        "SELECT '*/'",
        "SELECT $$;/*$$",
        "SELECT $t$ -- $t$",
        "SELECT E'\\'; --'",
        "SELECT \"a;--\" FROM t",
        "SELECT 1 /* ; set x = 1 */",
        "SELECT 1 -- ; set x = 1\n",
        "UPDATE t SET a = 1",
        "SET x.y = 1",
        "RESET ALL",
        "LISTEN c",
        "DISCARD ALL",
        "EXECUTE p",
        "DEALLOCATE p",
        "DECLARE c CURSOR FOR SELECT 1",
        "CREATE TEMP TABLE t ()",
        "SELECT pg_advisory_lock(1)",
    ];
    const GLUE: &[&str] = &[
        "; ",
        ";",
        ";\n",
        "; /* x */ ",
        ";-- x\n",
        "; /* /* */ */",
        ";\r--\r",
    ];
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = |n: usize| {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
    };
    let mut failures = Vec::new();
    let mut checked = 0;
    for _ in 0..20_000 {
        let mut text = String::new();
        for k in 0..1 + next(4) {
            if k > 0 {
                text.push_str(GLUE[next(GLUE.len())]);
            }
            text.push_str(FRAGMENTS[next(FRAGMENTS.len())]);
        }
        let Ok(analysis) = sql::analyze(&text) else {
            continue;
        };
        checked += 1;
        if analysis.statements.iter().any(affects_session) && !sql::may_affect_session(&text) {
            failures.push(format!("{text:?}"));
        }
    }
    assert!(checked > 10_000, "only {checked} strings parsed");
    assert!(failures.is_empty(), "missed:\n{}\n", failures.join("\n"));
}

//! Table-driven statement -> kind tests for the commands the session must understand:
//! transaction control, settings, prepared statements, cursors, LISTEN/NOTIFY and utilities.

use sql::{
    DiscardKind, IsolationLevel, SetCommand, SetValue, StatementInfo, StatementKind,
    TransactionCommand, TransactionModes,
};

fn only(sql: &str) -> StatementInfo {
    let analysis = sql::analyze(sql).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    let [stmt] = <[StatementInfo; 1]>::try_from(analysis.statements)
        .unwrap_or_else(|s| panic!("{sql}: expected one statement, got {s:#?}"));
    stmt
}

fn run(cases: Vec<(&str, StatementKind)>) {
    let failures: Vec<String> = cases
        .into_iter()
        .filter_map(|(sql, want)| {
            let got = only(sql).kind;
            (got != want).then(|| format!("{sql}:\n  want {want:?}\n  got  {got:?}"))
        })
        .collect();
    assert!(failures.is_empty(), "\n{}\n", failures.join("\n"));
}

fn modes(
    isolation: Option<IsolationLevel>,
    read_only: Option<bool>,
    deferrable: Option<bool>,
) -> TransactionModes {
    TransactionModes {
        isolation,
        read_only,
        deferrable,
    }
}

#[test]
fn transaction_control() {
    use IsolationLevel::*;
    use StatementKind::Transaction as T;
    use TransactionCommand::*;
    run(vec![
        ("BEGIN", T(Begin(TransactionModes::default()))),
        ("BEGIN WORK", T(Begin(TransactionModes::default()))),
        (
            "BEGIN ISOLATION LEVEL REPEATABLE READ",
            T(Begin(modes(Some(RepeatableRead), None, None))),
        ),
        (
            "BEGIN TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ ONLY, DEFERRABLE",
            T(Begin(modes(Some(Serializable), Some(true), Some(true)))),
        ),
        (
            "BEGIN NOT DEFERRABLE ISOLATION LEVEL READ UNCOMMITTED",
            T(Begin(modes(Some(ReadUncommitted), None, Some(false)))),
        ),
        (
            "START TRANSACTION READ ONLY",
            T(Begin(modes(None, Some(true), None))),
        ),
        (
            "START TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE",
            T(Begin(modes(Some(ReadCommitted), Some(false), None))),
        ),
        ("COMMIT", T(Commit { chain: false })),
        ("END", T(Commit { chain: false })),
        ("COMMIT AND CHAIN", T(Commit { chain: true })),
        ("COMMIT AND NO CHAIN", T(Commit { chain: false })),
        ("ROLLBACK", T(Rollback { chain: false })),
        ("ABORT", T(Rollback { chain: false })),
        ("ROLLBACK AND CHAIN", T(Rollback { chain: true })),
        ("SAVEPOINT sp1", T(Savepoint { name: "sp1".into() })),
        ("RELEASE SAVEPOINT sp1", T(Release { name: "sp1".into() })),
        ("RELEASE \"Sp\"", T(Release { name: "Sp".into() })),
        (
            "ROLLBACK TO SAVEPOINT sp1",
            T(RollbackTo { name: "sp1".into() }),
        ),
        ("ROLLBACK TO sp1", T(RollbackTo { name: "sp1".into() })),
        (
            "PREPARE TRANSACTION 'tx1'",
            T(PrepareTransaction { gid: "tx1".into() }),
        ),
        (
            "COMMIT PREPARED 'tx1'",
            T(CommitPrepared { gid: "tx1".into() }),
        ),
        (
            "ROLLBACK PREPARED 'tx1'",
            T(RollbackPrepared { gid: "tx1".into() }),
        ),
    ]);
}

#[test]
fn settings() {
    use IsolationLevel::*;
    use SetCommand::*;
    use SetValue::*;
    use StatementKind::Set as S;
    let text = |s: &str| Text(s.to_owned());
    let assign = |name: &str, values: Vec<SetValue>, local| {
        S(Assign {
            name: name.into(),
            values,
            local,
        })
    };
    run(vec![
        (
            "SET search_path = a, b",
            assign("search_path", vec![text("a"), text("b")], false),
        ),
        (
            "SET search_path TO \"MySchema\", public",
            assign("search_path", vec![text("MySchema"), text("public")], false),
        ),
        (
            "SET SESSION statement_timeout = '5s'",
            assign("statement_timeout", vec![text("5s")], false),
        ),
        (
            "SET LOCAL statement_timeout = '5s'",
            assign("statement_timeout", vec![text("5s")], true),
        ),
        (
            "SET statement_timeout = 5000",
            assign("statement_timeout", vec![Integer(5000)], false),
        ),
        (
            "SET extra_float_digits = -1",
            assign("extra_float_digits", vec![Integer(-1)], false),
        ),
        (
            "SET seq_page_cost = 1.5",
            assign("seq_page_cost", vec![Numeric("1.5".into())], false),
        ),
        (
            "SET enable_seqscan = off",
            assign("enable_seqscan", vec![text("off")], false),
        ),
        (
            "SET enable_seqscan TO true",
            assign("enable_seqscan", vec![text("true")], false),
        ),
        (
            "SET TIME ZONE 'UTC'",
            assign("timezone", vec![text("UTC")], false),
        ),
        (
            "SET LOCAL TIME ZONE 'UTC'",
            assign("timezone", vec![text("UTC")], true),
        ),
        (
            "SET TIME ZONE -7",
            assign("timezone", vec![Integer(-7)], false),
        ),
        (
            "SET TIME ZONE INTERVAL '+02:00' HOUR TO MINUTE",
            assign(
                "timezone",
                vec![Expr("'+02:00'::interval hour to minute".into())],
                false,
            ),
        ),
        (
            "SET TIME ZONE LOCAL",
            S(Default {
                name: "timezone".into(),
                local: false,
            }),
        ),
        (
            "SET TIME ZONE DEFAULT",
            S(Default {
                name: "timezone".into(),
                local: false,
            }),
        ),
        (
            "SET x TO DEFAULT",
            S(Default {
                name: "x".into(),
                local: false,
            }),
        ),
        (
            "SET LOCAL work_mem = DEFAULT",
            S(Default {
                name: "work_mem".into(),
                local: true,
            }),
        ),
        (
            "SET TimeZone = 'Europe/Paris'",
            assign("timezone", vec![text("Europe/Paris")], false),
        ),
        (
            "SET \"TimeZone\" = 'UTC'",
            assign("timezone", vec![text("UTC")], false),
        ),
        (
            "SET NAMES 'UTF8'",
            assign("client_encoding", vec![text("UTF8")], false),
        ),
        (
            "SET SCHEMA 'app'",
            assign("search_path", vec![text("app")], false),
        ),
        (
            "SET XML OPTION DOCUMENT",
            assign("xmloption", vec![text("DOCUMENT")], false),
        ),
        (
            "SET myapp.x = '1'",
            assign("myapp.x", vec![text("1")], false),
        ),
        (
            "SET MyApp.User_Id TO 42",
            assign("myapp.user_id", vec![Integer(42)], false),
        ),
        (
            "SET application_name FROM CURRENT",
            S(FromCurrent {
                name: "application_name".into(),
                local: false,
            }),
        ),
        ("RESET ALL", S(ResetAll)),
        (
            "RESET TimeZone",
            S(Reset {
                name: "timezone".into(),
            }),
        ),
        (
            "RESET search_path",
            S(Reset {
                name: "search_path".into(),
            }),
        ),
        (
            "SET ROLE bob",
            S(Role {
                role: Some("bob".into()),
                local: false,
            }),
        ),
        (
            "SET LOCAL ROLE \"Admin\"",
            S(Role {
                role: Some("Admin".into()),
                local: true,
            }),
        ),
        (
            "SET ROLE 'carol'",
            S(Role {
                role: Some("carol".into()),
                local: false,
            }),
        ),
        (
            "SET ROLE NONE",
            S(Role {
                role: None,
                local: false,
            }),
        ),
        (
            "RESET ROLE",
            S(Role {
                role: None,
                local: false,
            }),
        ),
        (
            "SET role TO DEFAULT",
            S(Role {
                role: None,
                local: false,
            }),
        ),
        (
            "SET SESSION AUTHORIZATION alice",
            S(SessionAuthorization {
                user: Some("alice".into()),
                local: false,
            }),
        ),
        (
            "SET LOCAL SESSION AUTHORIZATION 'alice'",
            S(SessionAuthorization {
                user: Some("alice".into()),
                local: true,
            }),
        ),
        (
            "SET SESSION AUTHORIZATION DEFAULT",
            S(SessionAuthorization {
                user: None,
                local: false,
            }),
        ),
        (
            "RESET SESSION AUTHORIZATION",
            S(SessionAuthorization {
                user: None,
                local: false,
            }),
        ),
        (
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            S(Transaction(modes(Some(Serializable), None, None))),
        ),
        (
            "SET TRANSACTION READ ONLY, NOT DEFERRABLE",
            S(Transaction(modes(None, Some(true), Some(false)))),
        ),
        (
            "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ",
            S(SessionCharacteristics(modes(
                Some(RepeatableRead),
                None,
                None,
            ))),
        ),
        (
            "SET TRANSACTION SNAPSHOT '00000003-0000001B-1'",
            S(TransactionSnapshot {
                snapshot_id: "00000003-0000001B-1".into(),
            }),
        ),
    ]);
}

#[test]
fn show() {
    let show = |name: &str| StatementKind::Show { name: name.into() };
    run(vec![
        ("SHOW search_path", show("search_path")),
        ("SHOW TIME ZONE", show("timezone")),
        ("SHOW \"TimeZone\"", show("timezone")),
        ("SHOW ALL", show("all")),
        (
            "SHOW TRANSACTION ISOLATION LEVEL",
            show("transaction_isolation"),
        ),
        ("SHOW SESSION AUTHORIZATION", show("session_authorization")),
        ("SHOW myapp.x", show("myapp.x")),
    ]);
}

#[test]
fn prepared_statements_cursors_and_notifications() {
    use StatementKind::*;
    let strings = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    run(vec![
        (
            "EXECUTE q",
            Execute {
                name: "q".into(),
                params: vec![],
            },
        ),
        (
            "EXECUTE q(1, 'a b', now(), $1, NULL, -2.5, '2024-01-01'::date, ARRAY[1,2])",
            Execute {
                name: "q".into(),
                params: strings(&[
                    "1",
                    "'a b'",
                    "now()",
                    "$1",
                    "NULL",
                    "-2.5",
                    "'2024-01-01'::date",
                    "ARRAY[1, 2]",
                ]),
            },
        ),
        (
            "EXECUTE \"Q\" ('it''s')",
            Execute {
                name: "Q".into(),
                params: strings(&["'it''s'"]),
            },
        ),
        (
            "DEALLOCATE q",
            Deallocate {
                name: Some("q".into()),
            },
        ),
        (
            "DEALLOCATE PREPARE q",
            Deallocate {
                name: Some("q".into()),
            },
        ),
        ("DEALLOCATE ALL", Deallocate { name: None }),
        ("DEALLOCATE PREPARE ALL", Deallocate { name: None }),
        ("DISCARD ALL", Discard(DiscardKind::All)),
        ("DISCARD PLANS", Discard(DiscardKind::Plans)),
        ("DISCARD SEQUENCES", Discard(DiscardKind::Sequences)),
        ("DISCARD TEMP", Discard(DiscardKind::Temp)),
        ("DISCARD TEMPORARY", Discard(DiscardKind::Temp)),
        (
            "LISTEN jobs",
            Listen {
                channel: "jobs".into(),
            },
        ),
        (
            "UNLISTEN jobs",
            Unlisten {
                channel: Some("jobs".into()),
            },
        ),
        ("UNLISTEN *", Unlisten { channel: None }),
        (
            "NOTIFY jobs",
            Notify {
                channel: "jobs".into(),
                payload: String::new(),
            },
        ),
        (
            "NOTIFY jobs, 'run 42'",
            Notify {
                channel: "jobs".into(),
                payload: "run 42".into(),
            },
        ),
        ("CALL p()", Call),
        ("DO $$ BEGIN PERFORM 1; END $$", Do),
        ("DO LANGUAGE plpgsql 'BEGIN NULL; END'", Do),
        (
            "DECLARE c CURSOR FOR SELECT 1",
            DeclareCursor {
                name: "c".into(),
                hold: false,
            },
        ),
        (
            "DECLARE c BINARY SCROLL CURSOR WITH HOLD FOR SELECT 1",
            DeclareCursor {
                name: "c".into(),
                hold: true,
            },
        ),
        (
            "DECLARE c NO SCROLL CURSOR WITHOUT HOLD FOR SELECT 1",
            DeclareCursor {
                name: "c".into(),
                hold: false,
            },
        ),
        (
            "FETCH 10 FROM c",
            Fetch {
                cursor: "c".into(),
                is_move: false,
            },
        ),
        (
            "FETCH c",
            Fetch {
                cursor: "c".into(),
                is_move: false,
            },
        ),
        (
            "FETCH ALL IN c",
            Fetch {
                cursor: "c".into(),
                is_move: false,
            },
        ),
        (
            "MOVE LAST IN c",
            Fetch {
                cursor: "c".into(),
                is_move: true,
            },
        ),
        (
            "CLOSE c",
            Close {
                cursor: Some("c".into()),
            },
        ),
        ("CLOSE ALL", Close { cursor: None }),
    ]);
}

#[test]
fn utility_and_maintenance() {
    use StatementKind::*;
    run(vec![
        ("SELECT 1", Select),
        ("VALUES (1)", Values),
        ("VALUES (1) UNION SELECT 2", Select),
        ("VACUUM", Vacuum),
        ("VACUUM FULL t", Vacuum),
        ("ANALYZE", Analyze),
        ("ANALYZE VERBOSE t", Analyze),
        ("LOCK t", Lock),
        ("CHECKPOINT", Checkpoint),
        ("REINDEX TABLE t", Other("ReindexStmt".into())),
        ("LOAD 'auto_explain'", Other("LoadStmt".into())),
        ("CREATE SCHEMA s", Ddl),
        (
            "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            Ddl,
        ),
        ("SECURITY LABEL ON TABLE t IS 'x'", Ddl),
        (
            "ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO bob",
            Ddl,
        ),
        ("GRANT admin TO bob", Ddl),
        ("CREATE PUBLICATION p FOR ALL TABLES", Ddl),
    ]);
}

#[test]
fn prepare_analyses_its_statement() {
    let sql = "PREPARE q (int, text, varchar(10), int[], double precision) AS SELECT * FROM t WHERE id = $1";
    let stmt = only(sql);
    assert!(stmt.reads.is_empty() && stmt.writes.is_empty() && stmt.functions.is_empty());
    let StatementKind::Prepare {
        name,
        param_types,
        statement,
    } = stmt.kind
    else {
        panic!("not a PREPARE: {:?}", stmt.kind);
    };
    assert_eq!(name, "q");
    assert_eq!(
        param_types,
        ["int", "text", "varchar(10)", "int[]", "double precision"]
    );
    assert_eq!(statement.kind, StatementKind::Select);
    assert_eq!(statement.text, "SELECT * FROM t WHERE id = $1");
    assert_eq!(&sql[statement.source.clone()], statement.text);
    assert_eq!(statement.reads, [sql::RelationName::new(None, "t")]);

    let stmt = only("PREPARE ins AS INSERT INTO t VALUES ($1) RETURNING now()");
    let StatementKind::Prepare {
        param_types,
        statement,
        ..
    } = stmt.kind
    else {
        panic!("not a PREPARE");
    };
    assert!(param_types.is_empty());
    assert!(stmt.writes.is_empty());
    assert_eq!(statement.kind, StatementKind::Insert);
    assert_eq!(statement.text, "INSERT INTO t VALUES ($1) RETURNING now()");
    assert_eq!(statement.writes, [sql::RelationName::new(None, "t")]);
    assert_eq!(statement.functions, [sql::FunctionName::new(None, "now")]);
}

#[test]
fn explain_reports_analyze_and_its_statement() {
    let cases = [
        ("EXPLAIN SELECT 1", false, StatementKind::Select, "SELECT 1"),
        (
            "EXPLAIN ANALYZE SELECT 1",
            true,
            StatementKind::Select,
            "SELECT 1",
        ),
        (
            "EXPLAIN ANALYSE VERBOSE SELECT 1",
            true,
            StatementKind::Select,
            "SELECT 1",
        ),
        (
            "EXPLAIN VERBOSE SELECT 1",
            false,
            StatementKind::Select,
            "SELECT 1",
        ),
        (
            "EXPLAIN (FORMAT JSON) SELECT 1",
            false,
            StatementKind::Select,
            "SELECT 1",
        ),
        (
            "EXPLAIN (ANALYZE false, COSTS off) SELECT 1",
            false,
            StatementKind::Select,
            "SELECT 1",
        ),
        (
            "EXPLAIN (ANALYZE on) SELECT 1",
            true,
            StatementKind::Select,
            "SELECT 1",
        ),
        (
            "EXPLAIN (ANALYZE, BUFFERS) DELETE FROM t",
            true,
            StatementKind::Delete,
            "DELETE FROM t",
        ),
        (
            "EXPLAIN /* why */ (ANALYZE) VALUES (1)",
            true,
            StatementKind::Values,
            "VALUES (1)",
        ),
        (
            "EXPLAIN EXECUTE q(1)",
            false,
            StatementKind::Execute {
                name: "q".into(),
                params: vec!["1".into()],
            },
            "EXECUTE q(1)",
        ),
    ];
    for (sql, want_analyze, want_kind, want_text) in cases {
        let stmt = only(sql);
        let StatementKind::Explain { analyze, inner } = &stmt.kind else {
            panic!("{sql}: not an EXPLAIN: {:?}", stmt.kind);
        };
        assert_eq!(*analyze, want_analyze, "{sql}");
        assert_eq!(inner.kind, want_kind, "{sql}");
        assert_eq!(inner.text, want_text, "{sql}");
        assert_eq!(&sql[inner.source.clone()], want_text, "{sql}");
        assert_eq!(stmt.reads, inner.reads, "{sql}");
        assert_eq!(stmt.writes, inner.writes, "{sql}");
    }
}

#[test]
fn statements_run_from_explain_or_create_table_as_are_located() {
    let cases = [
        ("EXPLAIN EXECUTE p", Some(("p", "p"))),
        (
            "EXPLAIN (ANALYZE, COSTS off) EXECUTE p(1, 'x')",
            Some(("p", "p")),
        ),
        (
            "EXPLAIN ANALYZE VERBOSE execute /* c */ \"My P\" (1)",
            Some(("My P", "\"My P\"")),
        ),
        ("CREATE TABLE t AS EXECUTE p", Some(("p", "p"))),
        (
            "create table execute (a) as execute execute(2) with no data",
            Some(("execute", "execute")),
        ),
        (
            "CREATE TEMP TABLE t WITH (fillfactor = 50) AS EXECUTE q",
            Some(("q", "q")),
        ),
        ("EXPLAIN SELECT 1", None),
        ("CREATE TABLE t AS SELECT 1", None),
        ("EXECUTE p", None),
    ];
    for (text, want) in cases {
        let got = only(text).executes;
        match (want, got) {
            (None, None) => {}
            (Some((name, written)), Some(got)) => {
                assert_eq!(got.name, name, "{text}");
                let range = got.name_range.unwrap_or_else(|| panic!("{text}: no range"));
                assert_eq!(&text[range], written, "{text}");
            }
            (want, got) => panic!("{text}: want {want:?}, got {got:?}"),
        }
    }
}

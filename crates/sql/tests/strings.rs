//! Whole query strings: splitting into statements, parse errors, parse options, and the query
//! identity used for statistics.

use sql::{ParseOptions, RelationName, SetValue, SqlError, StatementKind};

fn texts(sql: &str) -> Vec<String> {
    let analysis = sql::analyze(sql).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    for stmt in &analysis.statements {
        assert_eq!(&sql[stmt.source.clone()], stmt.text, "{sql}");
    }
    analysis.statements.into_iter().map(|s| s.text).collect()
}

#[test]
fn multi_statement_strings_are_split_with_their_source() {
    let cases: &[(&str, &[&str])] = &[
        (
            "SELECT 1; SET x = 1; COMMIT",
            &["SELECT 1", "SET x = 1", "COMMIT"],
        ),
        ("SELECT 1;", &["SELECT 1"]),
        ("  SELECT 1 ;\n\n  SELECT 2  ;  ", &["SELECT 1", "SELECT 2"]),
        ("BEGIN;;COMMIT", &["BEGIN", "COMMIT"]),
        (
            "SELECT 'a;b'; SELECT \";\" FROM t",
            &["SELECT 'a;b'", "SELECT \";\" FROM t"],
        ),
        (
            "/* lead */ SELECT 1; -- trailing\nSELECT 2",
            &["SELECT 1", "SELECT 2 "],
        ),
        (
            "SELECT 'ünïcødé'; SELECT 'ß'",
            &["SELECT 'ünïcødé'", "SELECT 'ß'"],
        ),
        (
            "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1; $$; SELECT f()",
            &[
                "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1; $$",
                "SELECT f()",
            ],
        ),
        ("", &[]),
        (" ;; -- nothing\n", &[]),
    ];
    for (sql, want) in cases {
        let got = texts(sql);
        let got: Vec<&str> = got.iter().map(|s| s.trim_end()).collect();
        let want: Vec<&str> = want.iter().map(|s| s.trim_end()).collect();
        assert_eq!(got, want, "{sql}");
    }
}

#[test]
fn each_statement_of_a_string_is_analysed_on_its_own() {
    let analysis = sql::analyze("SELECT * FROM a; SET search_path = s; DELETE FROM b").unwrap();
    let [select, set, delete] = analysis.statements.as_slice() else {
        panic!("expected three statements");
    };
    assert_eq!(select.kind, StatementKind::Select);
    assert_eq!(select.reads, [RelationName::new(None, "a")]);
    assert!(select.writes.is_empty());
    assert!(matches!(set.kind, StatementKind::Set(_)));
    assert!(set.reads.is_empty() && set.writes.is_empty());
    assert_eq!(delete.kind, StatementKind::Delete);
    assert_eq!(delete.writes, [RelationName::new(None, "b")]);
}

#[test]
fn syntax_errors_carry_message_and_position() {
    let cases = [
        ("SELEC 1", "syntax error at or near \"SELEC\"", Some(1)),
        (
            "SELECT * FORM t",
            "syntax error at or near \"FORM\"",
            Some(10),
        ),
        (
            "SELECT 'é' FORM t",
            "syntax error at or near \"t\"",
            Some(17),
        ),
        (
            "SELECT 1; SELEC 2",
            "syntax error at or near \"SELEC\"",
            Some(11),
        ),
        ("SELECT (1", "syntax error at end of input", Some(10)),
        (
            "SELECT 'open",
            "unterminated quoted string at or near \"'open\"",
            Some(8),
        ),
        (
            "SELECT 1\0",
            "query string contains a null character",
            Some(9),
        ),
    ];
    for (sql, message, cursor) in cases {
        let err = sql::analyze(sql).unwrap_err();
        assert_eq!(
            err,
            SqlError::Parse {
                message: message.to_owned(),
                cursor
            },
            "{sql}"
        );
        assert_eq!(err.to_string(), message);
    }
}

#[test]
fn trees_too_deep_for_pg_query_are_unsupported_not_syntax_errors() {
    let sql = format!("SELECT 1{}", " + 1".repeat(200));
    assert!(
        matches!(sql::analyze(&sql), Err(SqlError::Unsupported { .. })),
        "{:?}",
        sql::analyze(&sql)
    );
    let sql = format!("SELECT 1{}", " + 1".repeat(30));
    assert!(sql::analyze(&sql).is_ok());
}

#[test]
fn standard_conforming_strings_changes_what_the_text_says() {
    // With standard_conforming_strings on, `'x\'` ends at the second quote and `t` is read by a
    // first statement; with it off, `\'` escapes the quote and the whole line is one literal.
    let sql = r"SELECT 'x\' FROM t; SELECT 1 --'";
    let on = sql::analyze(sql).unwrap();
    assert_eq!(on.statements.len(), 2);
    assert_eq!(on.statements[0].reads, [RelationName::new(None, "t")]);

    let off = ParseOptions {
        standard_conforming_strings: false,
    };
    let analysis = sql::analyze_with(sql, off).unwrap();
    assert_eq!(analysis.statements.len(), 1);
    assert!(analysis.statements[0].reads.is_empty());
    assert_eq!(
        ParseOptions::default(),
        ParseOptions {
            standard_conforming_strings: true
        }
    );
}

#[test]
fn normalize_replaces_constants() {
    let cases = [
        (
            "SELECT * FROM t WHERE id = 42 AND name = 'bob'",
            "SELECT * FROM t WHERE id = $1 AND name = $2",
        ),
        (
            "SELECT * FROM t WHERE id = $1 LIMIT 10",
            "SELECT * FROM t WHERE id = $1 LIMIT $2",
        ),
        (
            "INSERT INTO t VALUES (1, 'a', 2.5)",
            "INSERT INTO t VALUES ($1, $2, $3)",
        ),
    ];
    for (sql, want) in cases {
        assert_eq!(sql::normalize(sql).unwrap(), want, "{sql}");
    }
    assert!(matches!(
        sql::normalize("SELEC 1"),
        Err(SqlError::Parse { .. })
    ));
}

#[test]
fn fingerprint_ignores_constants_but_not_shape() {
    let fp = |sql: &str| sql::fingerprint(sql).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    let same = [
        (
            "SELECT * FROM t WHERE id = 1",
            "SELECT * FROM t WHERE id = 2",
        ),
        (
            "SELECT * FROM t WHERE name = 'a'",
            "select *  from t where name = 'something else'",
        ),
        (
            "SELECT * FROM t WHERE id = 1",
            "SELECT * FROM t /* comment */ WHERE id = $1",
        ),
        (
            "SELECT * FROM t WHERE id IN (1, 2)",
            "SELECT * FROM t WHERE id IN (3, 4, 5)",
        ),
    ];
    for (a, b) in same {
        assert_eq!(fp(a), fp(b), "{a} vs {b}");
    }
    let different = [
        (
            "SELECT * FROM t WHERE id = 1",
            "SELECT * FROM u WHERE id = 1",
        ),
        (
            "SELECT * FROM t WHERE id = 1",
            "SELECT * FROM t WHERE other = 1",
        ),
        ("SELECT a FROM t", "SELECT b FROM t"),
        ("SELECT * FROM t WHERE id = 1", "DELETE FROM t WHERE id = 1"),
    ];
    for (a, b) in different {
        assert_ne!(fp(a), fp(b), "{a} vs {b}");
    }
    assert_eq!(
        sql::normalize("SELECT 1 FROM t WHERE x = 'a'").unwrap(),
        sql::normalize("SELECT 2 FROM t WHERE x = 'b'").unwrap()
    );
    assert!(matches!(
        sql::fingerprint("SELEC 1"),
        Err(SqlError::Parse { .. })
    ));
}

#[test]
fn set_values_render_as_sql() {
    let cases = [
        (SetValue::Text("UTC".into()), "'UTC'"),
        (SetValue::Text("it's".into()), "'it''s'"),
        (SetValue::Text(r"C:\dir".into()), r"E'C:\\dir'"),
        (SetValue::Integer(-5), "-5"),
        (SetValue::Numeric("1.5".into()), "1.5"),
        (
            SetValue::Expr("'+02:00'::interval hour to minute".into()),
            "'+02:00'::interval hour to minute",
        ),
    ];
    for (value, want) in cases {
        assert_eq!(value.to_sql(), want, "{value:?}");
    }
    // What `to_sql` renders reads back as the same value.
    for value in ["UTC", "it's", r"C:\dir", "a, b"] {
        let sql = format!("SET x TO {}", SetValue::Text(value.into()).to_sql());
        let stmt = &sql::analyze(&sql).unwrap().statements[0];
        let StatementKind::Set(sql::SetCommand::Assign { values, .. }) = &stmt.kind else {
            panic!("{sql}: {:?}", stmt.kind);
        };
        assert_eq!(values, &[SetValue::Text(value.into())], "{sql}");
    }
}

#[test]
fn names_display_qualified() {
    assert_eq!(RelationName::new(Some("s"), "t").to_string(), "s.t");
    assert_eq!(RelationName::new(None, "t").to_string(), "t");
    assert_eq!(
        sql::FunctionName::new(Some("pg_catalog"), "now").to_string(),
        "pg_catalog.now"
    );
}

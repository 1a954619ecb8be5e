//! Table-driven statement -> analysis tests: relations read and written, functions called and the
//! flags of each statement. Every field is checked for every case, so a row also asserts that
//! nothing else is reported; operators, which most rows have, are checked by their own table
//! (`operators_everywhere`).

use sql::{FunctionName, RelationName, SqlValueFunction, StatementKind};

/// One row of the table. Names are written `name` or `schema.name`.
struct Case {
    sql: &'static str,
    kind: Option<StatementKind>,
    reads: &'static [&'static str],
    writes: &'static [&'static str],
    functions: &'static [&'static str],
    sql_value_functions: &'static [SqlValueFunction],
    locking: bool,
    data_modifying_cte: bool,
    select_into: bool,
    tablesample: bool,
    session_temp_table: bool,
}

fn case(sql: &'static str, kind: StatementKind) -> Case {
    Case {
        sql,
        kind: Some(kind),
        reads: &[],
        writes: &[],
        functions: &[],
        sql_value_functions: &[],
        locking: false,
        data_modifying_cte: false,
        select_into: false,
        tablesample: false,
        session_temp_table: false,
    }
}

fn select(sql: &'static str) -> Case {
    case(sql, StatementKind::Select)
}

/// A row whose kind is checked elsewhere (nested kinds such as EXPLAIN).
fn any(sql: &'static str) -> Case {
    Case {
        kind: None,
        ..select(sql)
    }
}

impl Case {
    fn reads(self, reads: &'static [&'static str]) -> Self {
        Self { reads, ..self }
    }
    fn writes(self, writes: &'static [&'static str]) -> Self {
        Self { writes, ..self }
    }
    fn functions(self, functions: &'static [&'static str]) -> Self {
        Self { functions, ..self }
    }
    fn sql_value_functions(self, sql_value_functions: &'static [SqlValueFunction]) -> Self {
        Self {
            sql_value_functions,
            ..self
        }
    }
    fn locking(self) -> Self {
        Self {
            locking: true,
            ..self
        }
    }
    fn data_modifying_cte(self) -> Self {
        Self {
            data_modifying_cte: true,
            ..self
        }
    }
    fn select_into(self) -> Self {
        Self {
            select_into: true,
            ..self
        }
    }
    fn tablesample(self) -> Self {
        Self {
            tablesample: true,
            ..self
        }
    }
    fn session_temp_table(self) -> Self {
        Self {
            session_temp_table: true,
            ..self
        }
    }
}

fn split(name: &str) -> (Option<&str>, &str) {
    match name.split_once('.') {
        Some((schema, name)) => (Some(schema), name),
        None => (None, name),
    }
}

fn relations(names: &[&str]) -> Vec<RelationName> {
    let mut list: Vec<_> = names
        .iter()
        .map(|n| {
            let (schema, name) = split(n);
            RelationName::new(schema, name)
        })
        .collect();
    list.sort();
    list
}

fn functions(names: &[&str]) -> Vec<FunctionName> {
    let mut list: Vec<_> = names
        .iter()
        .map(|n| {
            let (schema, name) = split(n);
            FunctionName::new(schema, name)
        })
        .collect();
    list.sort();
    list
}

fn sorted<T: Ord + Clone>(list: &[T]) -> Vec<T> {
    let mut list = list.to_vec();
    list.sort();
    list
}

/// Compares one row, returning a description of each mismatch.
fn check(case: &Case) -> Vec<String> {
    let analysis = match sql::analyze(case.sql) {
        Ok(analysis) => analysis,
        Err(e) => return vec![format!("{}: unexpected error {e:?}", case.sql)],
    };
    let [stmt] = analysis.statements.as_slice() else {
        return vec![format!("{}: expected exactly one statement", case.sql)];
    };
    let mut failures = Vec::new();
    let mut expect = |what: &str, ok: bool, got: String| {
        if !ok {
            failures.push(format!("{}: {what} was {got}", case.sql));
        }
    };
    if let Some(kind) = &case.kind {
        expect("kind", &stmt.kind == kind, format!("{:?}", stmt.kind));
    }
    let reads = sorted(&stmt.reads);
    expect(
        "reads",
        reads == relations(case.reads),
        format!("{reads:?}"),
    );
    let writes = sorted(&stmt.writes);
    expect(
        "writes",
        writes == relations(case.writes),
        format!("{writes:?}"),
    );
    let called = sorted(&stmt.functions);
    expect(
        "functions",
        called == functions(case.functions),
        format!("{called:?}"),
    );
    let svf = &stmt.sql_value_functions;
    expect(
        "sql_value_functions",
        svf == case.sql_value_functions,
        format!("{svf:?}"),
    );
    let flags = [
        ("locking", stmt.locking, case.locking),
        (
            "data_modifying_cte",
            stmt.data_modifying_cte,
            case.data_modifying_cte,
        ),
        ("select_into", stmt.select_into, case.select_into),
        ("tablesample", stmt.tablesample, case.tablesample),
        (
            "session_temp_table",
            stmt.session_temp_table,
            case.session_temp_table,
        ),
    ];
    for (name, got, want) in flags {
        expect(name, got == want, got.to_string());
    }
    expect("text", stmt.text == case.sql, format!("{:?}", stmt.text));
    failures
}

fn run(cases: &[Case]) {
    let failures: Vec<String> = cases.iter().flat_map(check).collect();
    assert!(failures.is_empty(), "\n{}\n", failures.join("\n"));
}

#[test]
fn selects_joins_and_subqueries() {
    run(&[
        select("SELECT 1"),
        select("SELECT * FROM t").reads(&["t"]),
        select("TABLE t").reads(&["t"]),
        select("SELECT * FROM ONLY t AS x (a, b)").reads(&["t"]),
        select("SELECT a.x FROM a JOIN b ON a.id = b.id LEFT JOIN c USING (id)")
            .reads(&["a", "b", "c"]),
        select("SELECT * FROM a, b CROSS JOIN c NATURAL FULL JOIN d").reads(&["a", "b", "c", "d"]),
        select("SELECT * FROM (SELECT * FROM inner_t) s").reads(&["inner_t"]),
        select("SELECT * FROM t WHERE id IN (SELECT id FROM u) AND EXISTS (SELECT FROM v)")
            .reads(&["t", "u", "v"]),
        select("SELECT (SELECT max(x) FROM u) AS m FROM t")
            .reads(&["t", "u"])
            .functions(&["max"]),
        select("SELECT * FROM t, LATERAL (SELECT * FROM u WHERE u.t_id = t.id) l")
            .reads(&["t", "u"]),
        select("SELECT ARRAY(SELECT x FROM u)").reads(&["u"]),
        select("SELECT * FROM t WHERE x = ANY (SELECT x FROM u)").reads(&["t", "u"]),
        select("SELECT * FROM a JOIN b ON b.id = (SELECT min(id) FROM c)")
            .reads(&["a", "b", "c"])
            .functions(&["min"]),
        select("SELECT * FROM t ORDER BY (SELECT count(*) FROM u) LIMIT (SELECT n FROM cfg)")
            .reads(&["t", "u", "cfg"])
            .functions(&["count"]),
        select(
            "SELECT x FROM a UNION SELECT x FROM b INTERSECT SELECT x FROM c EXCEPT ALL TABLE d",
        )
        .reads(&["a", "b", "c", "d"]),
        select("SELECT * FROM sales.orders o JOIN public.customers c ON o.cid = c.id")
            .reads(&["sales.orders", "public.customers"]),
        select("SELECT * FROM mydb.s.t").reads(&["s.t"]),
        select(r#"SELECT * FROM Orders, "Orders", "MySchema"."Weird Table", MySchema.Foo"#)
            .reads(&["orders", "Orders", "MySchema.Weird Table", "myschema.foo"]),
        select("SELECT * FROM t AS x FOR UPDATE OF x")
            .reads(&["t"])
            .locking(),
        select(
            "SELECT * FROM JSON_TABLE((SELECT doc FROM docs), '$[*]' COLUMNS (a int PATH '$.a')) j",
        )
        .reads(&["docs"]),
        select(
            "SELECT * FROM t WHERE x > 0 GROUP BY GROUPING SETS ((a), ()) HAVING EXISTS (TABLE u)",
        )
        .reads(&["t", "u"]),
        case(
            "VALUES (1), ((SELECT max(x) FROM t))",
            StatementKind::Values,
        )
        .reads(&["t"])
        .functions(&["max"]),
    ]);
}

#[test]
fn common_table_expressions() {
    run(&[
        select("WITH c AS (SELECT * FROM base) SELECT * FROM c JOIN other ON true")
            .reads(&["base", "other"]),
        select("WITH a AS (SELECT * FROM t1), b AS (SELECT * FROM a) SELECT * FROM b")
            .reads(&["t1"]),
        // Inside its own (non-recursive) body, `t` is the table.
        select("WITH t AS (SELECT * FROM t) SELECT * FROM t").reads(&["t"]),
        // A later sibling is not visible yet: `b` in the first body is a table.
        select("WITH a AS (SELECT * FROM b), b AS (SELECT 1) SELECT * FROM a, b").reads(&["b"]),
        // Qualified names never refer to CTEs.
        select("WITH t AS (SELECT 1) SELECT * FROM t, public.t").reads(&["public.t"]),
        // A subquery's CTEs are not in scope outside it.
        select("SELECT * FROM (WITH x AS (SELECT 1) SELECT * FROM x) s, x").reads(&["x"]),
        select("SELECT * FROM t WHERE id IN (WITH ids AS (SELECT id FROM u) SELECT id FROM ids)")
            .reads(&["t", "u"]),
        select("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 9) SELECT * FROM r"),
        select(
            "WITH RECURSIVE tree AS (SELECT id FROM nodes WHERE parent IS NULL \
             UNION ALL SELECT n.id FROM nodes n JOIN tree ON n.parent = tree.id) SELECT * FROM tree",
        )
        .reads(&["nodes"]),
        select("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d")
            .writes(&["t"])
            .data_modifying_cte(),
        select("WITH u AS (UPDATE t SET x = 1 RETURNING *), i AS (INSERT INTO log SELECT * FROM u) SELECT 1")
            .writes(&["t", "log"])
            .data_modifying_cte(),
        select("WITH m AS (MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE RETURNING t.*) SELECT * FROM m")
            .reads(&["s"])
            .writes(&["t"])
            .data_modifying_cte(),
        case(
            "WITH moved AS (DELETE FROM queue WHERE id = 1 RETURNING *) INSERT INTO done SELECT * FROM moved",
            StatementKind::Insert,
        )
        .writes(&["queue", "done"])
        .data_modifying_cte(),
        case("WITH x AS (SELECT * FROM a) UPDATE b SET v = x.v FROM x", StatementKind::Update)
            .reads(&["a"])
            .writes(&["b"]),
    ]);
}

#[test]
fn functions_everywhere() {
    use SqlValueFunction::*;
    run(&[
        select("SELECT now(), random(), count(*), pg_catalog.lower(name) FROM t WHERE ts < now() ORDER BY random()")
            .reads(&["t"])
            .functions(&["now", "random", "count", "pg_catalog.lower"]),
        select(
            "SELECT sum(x), array_agg(y ORDER BY upper(z)) FILTER (WHERE abs(x) > 1) FROM t \
             GROUP BY date_trunc('day', ts) HAVING avg(x) > 0",
        )
        .reads(&["t"])
        .functions(&["sum", "array_agg", "upper", "abs", "date_trunc", "avg"]),
        select("SELECT row_number() OVER (PARTITION BY lower(a) ORDER BY b), rank() OVER w FROM t WINDOW w AS (ORDER BY length(c))")
            .reads(&["t"])
            .functions(&["row_number", "lower", "rank", "length"]),
        select("SELECT extract(year FROM ts), substring(s FROM 2), ts AT TIME ZONE 'UTC' FROM t")
            .reads(&["t"])
            .functions(&["pg_catalog.extract", "pg_catalog.substring", "pg_catalog.timezone"]),
        select("SELECT * FROM generate_series(1, 10) g, unnest(ARRAY[1]) u")
            .functions(&["generate_series", "unnest"]),
        select("SELECT CASE WHEN x > 0 THEN abs(x) ELSE coalesce(y, floor(z)) END FROM t")
            .reads(&["t"])
            .functions(&["abs", "floor"]),
        select(r#"SELECT "MyFunc"(1), MyFunc(2), app.f(3), db.app.g(4)"#)
            .functions(&["MyFunc", "myfunc", "app.f", "app.g"]),
        select("SELECT current_timestamp, current_user, localtimestamp(3), current_date, current_time")
            .sql_value_functions(&[CurrentTimestamp, CurrentUser, LocalTimestamp, CurrentDate, CurrentTime]),
        select("SELECT * FROM t WHERE owner = session_user AND ts > current_timestamp - interval '1 h'")
            .reads(&["t"])
            .sql_value_functions(&[SessionUser, CurrentTimestamp]),
        case("VALUES (1, now()), (2, random())", StatementKind::Values).functions(&["now", "random"]),
        case("INSERT INTO t (id, v) VALUES (nextval('t_seq'), DEFAULT)", StatementKind::Insert)
            .writes(&["t"])
            .functions(&["nextval"]),
        case("CALL s.proc(1, now())", StatementKind::Call).functions(&["s.proc", "now"]),
        any("EXECUTE q(now())").functions(&["now"]),
    ]);
}

#[test]
fn row_locking() {
    run(&[
        select("SELECT * FROM t WHERE id = 1 FOR UPDATE")
            .reads(&["t"])
            .locking(),
        select("SELECT * FROM t FOR SHARE NOWAIT")
            .reads(&["t"])
            .locking(),
        select("SELECT * FROM (SELECT * FROM t FOR SHARE) s")
            .reads(&["t"])
            .locking(),
        select("SELECT * FROM jobs j JOIN workers w ON true FOR NO KEY UPDATE OF j SKIP LOCKED")
            .reads(&["jobs", "workers"])
            .locking(),
        select("SELECT * FROM t WHERE EXISTS (SELECT 1 FROM u FOR KEY SHARE)")
            .reads(&["t", "u"])
            .locking(),
        select("WITH l AS (SELECT * FROM t FOR UPDATE) SELECT * FROM l")
            .reads(&["t"])
            .locking(),
    ]);
}

#[test]
fn data_modification() {
    use StatementKind::*;
    run(&[
        case("INSERT INTO archive SELECT * FROM events WHERE ts < now()", Insert)
            .reads(&["events"])
            .writes(&["archive"])
            .functions(&["now"]),
        case(
            "INSERT INTO t (id, n) VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET n = t.n + excluded.n \
             WHERE t.n < (SELECT max(n) FROM limits) RETURNING lower(x)",
            Insert,
        )
        .reads(&["limits"])
        .writes(&["t"])
        .functions(&["max", "lower"]),
        case("INSERT INTO t VALUES ((SELECT max(id) + 1 FROM t))", Insert)
            .reads(&["t"])
            .writes(&["t"])
            .functions(&["max"]),
        case("INSERT INTO s.t DEFAULT VALUES", Insert).writes(&["s.t"]),
        case(
            "UPDATE accounts a SET balance = a.balance + d.amount FROM deposits d WHERE d.account_id = a.id RETURNING a.*",
            Update,
        )
        .reads(&["deposits"])
        .writes(&["accounts"]),
        case("UPDATE t SET x = (SELECT max(y) FROM u) WHERE id IN (SELECT id FROM v)", Update)
            .reads(&["u", "v"])
            .writes(&["t"])
            .functions(&["max"]),
        case("UPDATE t SET x = 1 RETURNING old.x, new.x", Update).writes(&["t"]),
        case("DELETE FROM orders o USING customers c WHERE o.cid = c.id AND c.banned", Delete)
            .reads(&["customers"])
            .writes(&["orders"]),
        case("DELETE FROM t RETURNING (SELECT name FROM u WHERE u.id = t.uid)", Delete)
            .reads(&["u"])
            .writes(&["t"]),
        case(
            "MERGE INTO stock s USING deliveries d ON s.item = d.item \
             WHEN MATCHED THEN UPDATE SET qty = s.qty + d.qty \
             WHEN NOT MATCHED THEN INSERT VALUES (d.item, d.qty)",
            Merge,
        )
        .reads(&["deliveries"])
        .writes(&["stock"]),
        case(
            "MERGE INTO t USING (SELECT * FROM src WHERE ok) s ON t.id = s.id \
             WHEN MATCHED AND s.gone THEN DELETE WHEN NOT MATCHED THEN DO NOTHING",
            Merge,
        )
        .reads(&["src"])
        .writes(&["t"]),
        case(
            "TRUNCATE a, s.b RESTART IDENTITY",
            Truncate { cascade: false },
        )
        .writes(&["a", "s.b"]),
        case("TRUNCATE TABLE ONLY t", Truncate { cascade: false }).writes(&["t"]),
        case("TRUNCATE t CASCADE", Truncate { cascade: true }).writes(&["t"]),
    ]);
}

#[test]
fn copy() {
    let copy = |from, stdio| StatementKind::Copy { from, stdio };
    run(&[
        case(
            "COPY t (a, b) FROM STDIN WITH (FORMAT csv)",
            copy(true, true),
        )
        .writes(&["t"]),
        case("COPY s.t FROM '/tmp/data.csv'", copy(true, false)).writes(&["s.t"]),
        case("COPY t FROM PROGRAM 'cat data'", copy(true, false)).writes(&["t"]),
        case("COPY t TO STDOUT", copy(false, true)).reads(&["t"]),
        case(
            "COPY (SELECT * FROM t JOIN u USING (id)) TO STDOUT",
            copy(false, true),
        )
        .reads(&["t", "u"]),
        case("COPY (SELECT now()) TO '/tmp/out'", copy(false, false)).functions(&["now"]),
        case(
            "COPY (DELETE FROM t RETURNING *) TO STDOUT",
            copy(false, true),
        )
        .writes(&["t"]),
    ]);
}

#[test]
fn tables_created_from_queries_and_sampling() {
    run(&[
        select("SELECT * INTO TEMP snapshot FROM t")
            .reads(&["t"])
            .writes(&["snapshot"])
            .select_into()
            .session_temp_table(),
        case(
            "CREATE TABLE summary AS SELECT k, count(*) FROM t GROUP BY k",
            StatementKind::Ddl,
        )
        .reads(&["t"])
        .writes(&["summary"])
        .functions(&["count"]),
        case(
            "CREATE MATERIALIZED VIEW mv AS SELECT * FROM t",
            StatementKind::Ddl,
        )
        .reads(&["t"])
        .writes(&["mv"]),
        select("SELECT * FROM big TABLESAMPLE SYSTEM (1) REPEATABLE (42)")
            .reads(&["big"])
            .tablesample(),
        select("SELECT * FROM (SELECT * FROM big TABLESAMPLE BERNOULLI (random() * 10)) s")
            .reads(&["big"])
            .functions(&["random"])
            .tablesample(),
    ]);
}

#[test]
fn ddl_and_maintenance() {
    use StatementKind::*;
    run(&[
        case("CREATE TABLE t (id int PRIMARY KEY)", Ddl).writes(&["t"]),
        case(
            "ALTER TABLE s.t ADD COLUMN c timestamptz DEFAULT now()",
            Ddl,
        )
        .writes(&["s.t"])
        .functions(&["now"]),
        case("DROP TABLE IF EXISTS a, s.b CASCADE", Ddl).writes(&["a", "s.b"]),
        case("DROP VIEW v", Ddl).writes(&["v"]),
        case("DROP INDEX i", Ddl),
        case("DROP FUNCTION f(int)", Ddl),
        case("CREATE VIEW v AS SELECT * FROM t", Ddl)
            .reads(&["t"])
            .writes(&["v"]),
        case("CREATE INDEX ON t (lower(x))", Ddl)
            .writes(&["t"])
            .functions(&["lower"]),
        case("GRANT SELECT ON t TO bob", Ddl).writes(&["t"]),
        case("REVOKE ALL ON SCHEMA s FROM bob", Ddl),
        case("COMMENT ON TABLE t IS 'x'", Ddl),
        case("REFRESH MATERIALIZED VIEW CONCURRENTLY mv", Ddl).writes(&["mv"]),
        case("ALTER TABLE t RENAME TO u", Ddl).writes(&["t"]),
        case("CREATE ROLE bob LOGIN", Ddl),
        case("ALTER SYSTEM SET work_mem = '1MB'", Ddl),
        case("CREATE EXTENSION IF NOT EXISTS pgcrypto", Ddl),
        case("VACUUM (ANALYZE) t", Vacuum),
        case("ANALYZE t", Analyze),
        case("LOCK TABLE t IN ACCESS EXCLUSIVE MODE", Lock),
        case("CHECKPOINT", Checkpoint),
        case("CLUSTER t USING t_pkey", Other("ClusterStmt".into())).writes(&["t"]),
        case(
            "SET CONSTRAINTS ALL DEFERRED",
            Other("ConstraintsSetStmt".into()),
        ),
    ]);
}

#[test]
fn wrapped_statements_report_like_this() {
    run(&[
        // EXPLAIN's output depends on what its statement touches; PREPARE itself touches nothing.
        any("EXPLAIN ANALYZE SELECT * FROM t WHERE f(x)")
            .reads(&["t"])
            .functions(&["f"]),
        any("EXPLAIN (ANALYZE) WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d FOR UPDATE")
            .writes(&["t"])
            .data_modifying_cte()
            .locking(),
        any("PREPARE q AS SELECT * FROM t"),
        case(
            "DECLARE c CURSOR WITH HOLD FOR SELECT * FROM t WHERE x > random()",
            StatementKind::DeclareCursor {
                name: "c".into(),
                hold: true,
            },
        )
        .reads(&["t"])
        .functions(&["random"]),
    ]);
}

#[test]
fn temporary_relations_that_outlive_the_transaction() {
    use StatementKind::Ddl;
    run(&[
        case("CREATE TEMP TABLE t (a int)", Ddl)
            .writes(&["t"])
            .session_temp_table(),
        case("create temporary table t()", Ddl)
            .writes(&["t"])
            .session_temp_table(),
        case("CREATE LOCAL TEMP TABLE IF NOT EXISTS t (a int)", Ddl)
            .writes(&["t"])
            .session_temp_table(),
        case("CREATE GLOBAL TEMPORARY TABLE t (a int)", Ddl)
            .writes(&["t"])
            .session_temp_table(),
        // DELETE ROWS empties the table at commit but keeps it; PRESERVE ROWS is the default.
        case("CREATE TEMP TABLE t (a int) ON COMMIT DELETE ROWS", Ddl)
            .writes(&["t"])
            .session_temp_table(),
        case("CREATE TEMP TABLE t (a int) ON COMMIT PRESERVE ROWS", Ddl)
            .writes(&["t"])
            .session_temp_table(),
        case("CREATE TEMP TABLE t (a int) ON COMMIT DROP", Ddl).writes(&["t"]),
        case("CREATE TEMP TABLE t AS SELECT * FROM s", Ddl)
            .reads(&["s"])
            .writes(&["t"])
            .session_temp_table(),
        case("CREATE TEMP TABLE t ON COMMIT DELETE ROWS AS SELECT 1", Ddl)
            .writes(&["t"])
            .session_temp_table(),
        case("CREATE TEMP TABLE t ON COMMIT DROP AS SELECT * FROM s", Ddl)
            .reads(&["s"])
            .writes(&["t"]),
        select("SELECT * INTO TEMPORARY TABLE t FROM s")
            .reads(&["s"])
            .writes(&["t"])
            .select_into()
            .session_temp_table(),
        select("SELECT 1 AS a INTO TEMP t UNION SELECT 2")
            .writes(&["t"])
            .select_into()
            .session_temp_table(),
        select("WITH c AS (SELECT 1) SELECT * INTO TEMP t FROM c")
            .writes(&["t"])
            .select_into()
            .session_temp_table(),
        case("CREATE TEMP VIEW v AS SELECT * FROM s", Ddl)
            .reads(&["s"])
            .writes(&["v"])
            .session_temp_table(),
        case("CREATE OR REPLACE TEMPORARY VIEW v AS SELECT 1", Ddl)
            .writes(&["v"])
            .session_temp_table(),
        case("CREATE TEMP SEQUENCE seq", Ddl)
            .writes(&["seq"])
            .session_temp_table(),
        // Naming the temporary schema makes a temporary relation without the keyword.
        case("CREATE TABLE pg_temp.t (a int)", Ddl)
            .writes(&["pg_temp.t"])
            .session_temp_table(),
        case("CREATE TABLE pg_temp.t (a int) ON COMMIT DROP", Ddl).writes(&["pg_temp.t"]),
        case("CREATE VIEW pg_temp.v AS SELECT 1", Ddl)
            .writes(&["pg_temp.v"])
            .session_temp_table(),
        case("CREATE SEQUENCE pg_temp.seq", Ddl)
            .writes(&["pg_temp.seq"])
            .session_temp_table(),
        select("SELECT 1 INTO pg_temp.t")
            .writes(&["pg_temp.t"])
            .select_into()
            .session_temp_table(),
        // So does any other object created there.
        case(
            "CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            Ddl,
        )
        .session_temp_table(),
        case("CREATE PROCEDURE pg_temp_3.p() LANGUAGE sql AS ''", Ddl).session_temp_table(),
        case("CREATE DOMAIN pg_temp.d AS int", Ddl).session_temp_table(),
        case("CREATE TYPE pg_temp.e AS ENUM ('a')", Ddl).session_temp_table(),
        case("CREATE TYPE pg_temp.r AS RANGE (subtype = int)", Ddl).session_temp_table(),
        case("CREATE TYPE pg_temp.c AS (a int)", Ddl)
            .writes(&["pg_temp.c"])
            .session_temp_table(),
        case(
            "CREATE AGGREGATE pg_temp.a (int) (sfunc = int4pl, stype = int)",
            Ddl,
        )
        .session_temp_table(),
        case(
            "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            Ddl,
        ),
        case("CREATE DOMAIN app.d AS int", Ddl),
        // Persistent and unlogged relations are not session state.
        case("CREATE TABLE t (a int)", Ddl).writes(&["t"]),
        case("CREATE UNLOGGED TABLE t (a int)", Ddl).writes(&["t"]),
        case("CREATE TABLE t AS SELECT 1", Ddl).writes(&["t"]),
        select("SELECT 1 INTO t").writes(&["t"]).select_into(),
        case("CREATE VIEW v AS SELECT 1", Ddl).writes(&["v"]),
        case("CREATE SEQUENCE seq", Ddl).writes(&["seq"]),
        case("CREATE TABLE \"PG_TEMP\".t (a int)", Ddl).writes(&["PG_TEMP.t"]),
        select("SELECT * FROM pg_temp.t").reads(&["pg_temp.t"]),
        case("DROP TABLE pg_temp.t", Ddl).writes(&["pg_temp.t"]),
        case(
            "DISCARD TEMP",
            StatementKind::Discard(sql::DiscardKind::Temp),
        ),
        // Wrappers report their statement's flag.
        any("EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT * FROM s")
            .reads(&["s"])
            .writes(&["t"])
            .session_temp_table(),
        any("EXPLAIN SELECT * INTO TEMP t FROM s")
            .reads(&["s"])
            .writes(&["t"])
            .select_into()
            .session_temp_table(),
        any("EXPLAIN ANALYZE CREATE TEMP TABLE t ON COMMIT DROP AS SELECT 1").writes(&["t"]),
        any("PREPARE p AS SELECT * INTO TEMP t FROM s").session_temp_table(),
        any("PREPARE p AS SELECT * INTO t FROM s"),
    ]);
}

/// The inner statement of a wrapper carries the flag too.
#[test]
fn wrapped_temporary_relations_are_flagged_inside() {
    for sql in [
        "PREPARE p AS SELECT * INTO TEMP t FROM s",
        "EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT 1",
    ] {
        let analysis = sql::analyze(sql).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        let inner = match &analysis.statements[0].kind {
            StatementKind::Prepare { statement, .. } => statement,
            StatementKind::Explain { inner, .. } => inner,
            other => panic!("{sql}: unexpected kind {other:?}"),
        };
        assert!(inner.session_temp_table, "{sql}");
        assert!(analysis.statements[0].session_temp_table, "{sql}");
    }
}

/// Each row: a statement and every operator it must report, in any order.
#[test]
fn operators_everywhere() {
    let rows: &[(&str, &[&str])] = &[
        (
            "SELECT a + b * c FROM t WHERE x >= 1 AND NOT y",
            &["+", "*", ">="],
        ),
        ("SELECT 1", &[]),
        ("SELECT now(), lower(s) FROM t", &[]),
        (
            "SELECT x FROM t WHERE x IN (1, 2) OR y NOT IN (3)",
            &["=", "<>"],
        ),
        ("SELECT NULLIF(a, b), a IS DISTINCT FROM b FROM t", &["="]),
        ("SELECT x FROM t WHERE x IN (SELECT y FROM u)", &["="]),
        ("SELECT x FROM t WHERE x NOT IN (SELECT y FROM u)", &["="]),
        ("SELECT CASE x WHEN 1 THEN 2 END FROM t", &["="]),
        ("SELECT CASE WHEN x THEN 2 END FROM t", &[]),
        (
            "SELECT s LIKE 'a%', s ILIKE 'b%', s NOT LIKE 'c' FROM t",
            &["~~", "~~*", "!~~"],
        ),
        ("SELECT s SIMILAR TO 'a' FROM t", &["~"]),
        ("SELECT x BETWEEN 1 AND 2 FROM t", &["<", "<=", ">", ">="]),
        (
            "SELECT x = ANY (ARRAY[1]), y < ALL (SELECT z FROM u) FROM t",
            &["=", "<"],
        ),
        ("SELECT x FROM t WHERE x > ANY (SELECT y FROM u)", &[">"]),
        (
            "SELECT a OPERATOR(app.###) b, c OPERATOR(pg_catalog.+) d FROM t",
            &["app.###", "pg_catalog.+"],
        ),
        ("SELECT x FROM t ORDER BY x USING >", &[">"]),
        (
            "SELECT -x, @ y, j ->> 'k', arr && '{1}' FROM t",
            &["-", "@", "->>", "&&"],
        ),
        (
            "SELECT (SELECT max(a + 1) FROM u WHERE u.id = t.id) FROM t",
            &["+", "="],
        ),
        (
            "WITH w AS (SELECT a || b AS c FROM t) SELECT c FROM w",
            &["||"],
        ),
        ("UPDATE t SET a = a + 1 WHERE id = 7", &["+", "="]),
        ("CREATE VIEW v AS SELECT a % 2 FROM t", &["%"]),
    ];
    check_names(rows, |s| {
        s.operators.iter().map(ToString::to_string).collect()
    });
}

/// Each row: a statement and the target type of every explicit cast it must report.
#[test]
fn casts_everywhere() {
    let rows: &[(&str, &[&str])] = &[
        ("SELECT 1", &[]),
        (
            "SELECT x::int, CAST(y AS text), z::app.money2 FROM t",
            &["pg_catalog.int4", "text", "app.money2"],
        ),
        (
            "SELECT date '2024-01-01', '{1}'::int[], 'a'::varchar(3)",
            &["date", "pg_catalog.int4", "pg_catalog.varchar"],
        ),
        (
            "SELECT v FROM t WHERE id = (SELECT max(k)::bigint FROM u)",
            &["pg_catalog.int8"],
        ),
        ("SELECT \"MyType\" '7', '7'::mytype", &["MyType", "mytype"]),
    ];
    check_names(rows, |s| s.casts.iter().map(ToString::to_string).collect());
}

/// Each row: a statement and the names that may be attribute-notation calls (`t.f`,
/// `(x).f`): the last name of qualified column references and field selections.
#[test]
fn attributes_everywhere() {
    let rows: &[(&str, &[&str])] = &[
        ("SELECT a, b FROM t WHERE c = 1", &[]),
        (
            "SELECT t.a, s.t.b, t.* FROM s.t WHERE t.c = 1 ORDER BY t.d",
            &["a", "b", "c", "d"],
        ),
        (
            "SELECT (t).f, (row(1, 2)).g, (x).h.i FROM t",
            &["f", "g", "h", "i"],
        ),
        (
            "UPDATE t SET a = 1 WHERE t.id IN (SELECT u.id FROM u)",
            &["id"],
        ),
    ];
    check_names(rows, |s| s.attributes.clone());
}

/// Checks each row (a statement and the names it must report, in any order) against the
/// names `report` reads off the statement's analysis; lists every mismatch at once.
fn check_names(rows: &[(&str, &[&str])], report: impl Fn(&sql::StatementInfo) -> Vec<String>) {
    let mut failures = Vec::new();
    for (sql, want) in rows {
        let analysis = sql::analyze(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        let mut got = report(&analysis.statements[0]);
        got.sort();
        let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        want.sort();
        if got != want {
            failures.push(format!("{sql}\n  got  {got:?}\n  want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// The settings `set_config` calls name: lower-cased literals, at any depth; a name that is
/// not a literal makes the list unknown (`None`).
#[test]
fn set_config_names() {
    let names = |sql: &str| {
        sql::analyze(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .statements[0]
            .set_config_names
            .clone()
    };
    let some = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(names("SELECT 1"), some(&[]));
    assert_eq!(
        names("SELECT set_config('TimeZone', 'UTC', false)"),
        some(&["timezone"])
    );
    assert_eq!(
        names(
            "SELECT pg_catalog.set_config('work_mem'::text, '1MB', false), \
             (SELECT set_config('extra_float_digits', '1', true)) FROM t"
        ),
        some(&["work_mem", "extra_float_digits"])
    );
    assert_eq!(names("SELECT set_config(name, 'x', false) FROM t"), None);
    assert_eq!(names("SELECT my.set_config('a', 'b', false)"), some(&[]));
}

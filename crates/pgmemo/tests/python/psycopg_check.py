"""psycopg 3 against a PostgreSQL server or pgmemo in transaction pooling mode.

Usage: psycopg_check.py PORT TABLE MODE

TABLE exists with columns (id int PRIMARY KEY, v text). MODE:
- main: prepare_threshold=0 (every statement prepared server-side, named _pg3_0, _pg3_1, ...
  on every connection, so the names of different connections collide on a shared server),
  pipeline mode, transactions, an error inside a pipeline.
- alter: ALTER TABLE ... ADD COLUMN between two executions of a prepared SELECT *; TABLE
  holds the single row (1, 'one').

Prints "ok" at the end; any failed check raises (exit status 1).
"""

import sys

import psycopg
from psycopg import errors


def connect(port, autocommit=True):
    return psycopg.connect(
        host="127.0.0.1",
        port=port,
        user="postgres",
        dbname="test",
        prepare_threshold=0,
        autocommit=autocommit,
        connect_timeout=30,
    )


def main_checks(port, table):
    conns = [connect(port) for _ in range(6)]
    conns[0].execute(f"TRUNCATE {table}")

    # Same statement names, different texts per connection, interleaved.
    for rnd in range(10):
        for i, c in enumerate(conns):
            (got,) = c.execute(f"SELECT %s::int + {i}", (rnd,)).fetchone()
            assert got == rnd + i, (i, rnd, got)
            (got,) = c.execute(f"SELECT %s::text || '-{i}'", (str(rnd),)).fetchone()
            assert got == f"{rnd}-{i}", (i, rnd, got)

    # Pipeline mode in autocommit: many executes, one Sync.
    c = conns[1]
    with c.pipeline():
        curs = [c.execute("SELECT %s::int * 3", (k,)) for k in range(20)]
        c.execute(f"INSERT INTO {table} (id, v) VALUES (%s, %s)", (1, "one"))
        last = c.execute(f"SELECT v FROM {table} WHERE id = %s", (1,))
    assert [cur.fetchone()[0] for cur in curs] == [3 * k for k in range(20)]
    assert last.fetchone()[0] == "one"

    # Pipeline mode inside a transaction (psycopg sends BEGIN itself), rolled back...
    t = connect(port, autocommit=False)
    with t.pipeline():
        for k in range(50):
            t.execute(f"INSERT INTO {table} (id, v) VALUES (%s, %s)", (100 + k, f"p{k}"))
        count = t.execute(f"SELECT count(*) FROM {table} WHERE id >= %s", (100,))
    assert count.fetchone()[0] == 50
    t.rollback()
    check = f"SELECT count(*) FROM {table} WHERE id >= %s"
    assert conns[2].execute(check, (100,)).fetchone()[0] == 0
    # ...and committed (executemany pipelines on its own).
    with t.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {table} (id, v) VALUES (%s, %s)",
            [(200 + k, f"m{k}") for k in range(50)],
        )
    t.commit()
    assert conns[3].execute(check, (100,)).fetchone()[0] == 50

    # An error inside a pipeline: the rest of it is skipped, the connection goes on.
    c = conns[4]
    try:
        with c.pipeline():
            c.execute("SELECT 1 / %s::int", (0,))
            c.execute("SELECT %s::int", (1,))
    except errors.DivisionByZero:
        pass
    else:
        raise AssertionError("the pipeline did not report division by zero")
    assert c.execute("SELECT %s::int + 1", (41,)).fetchone()[0] == 42

    # Every connection still has its own statements.
    for i, c in enumerate(conns):
        (got,) = c.execute(f"SELECT %s::int + {i}", (1000,)).fetchone()
        assert got == 1000 + i, (i, got)
    for c in conns + [t]:
        c.close()


def alter_checks(port, table):
    a = connect(port)
    cur = a.execute(f"SELECT * FROM {table}")
    assert [d.name for d in cur.description] == ["id", "v"], cur.description
    assert cur.fetchall() == [(1, "one")]

    b = connect(port)
    b.execute(f"ALTER TABLE {table} ADD COLUMN c int DEFAULT 7")

    # A new client, same text: the new shape.
    c = connect(port)
    cur = c.execute(f"SELECT * FROM {table}")
    assert [d.name for d in cur.description] == ["id", "v", "c"], cur.description
    assert cur.fetchall() == [(1, "one", 7)]

    # The first client executes its prepared statement again: no "cached plan must not
    # change result type", the new shape.
    for _ in range(3):
        cur = a.execute(f"SELECT * FROM {table}")
        assert [d.name for d in cur.description] == ["id", "v", "c"], cur.description
        assert cur.fetchall() == [(1, "one", 7)]
    for conn in (a, b, c):
        conn.close()


def main():
    port, table, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    {"main": main_checks, "alter": alter_checks}[mode](port, table)
    print("ok")


if __name__ == "__main__":
    main()

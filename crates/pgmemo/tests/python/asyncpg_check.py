"""asyncpg against a PostgreSQL server or pgmemo in transaction pooling mode.

Usage: asyncpg_check.py PORT TABLE PROC WORKERS

WORKERS connections of this process are all opened, then run concurrently (asyncio.gather),
each 50 queries of a text of its own plus shared texts, a prepared statement object, and a
transaction with executemany into TABLE (id int PRIMARY KEY, v text). asyncpg prepares every
statement and names them __asyncpg_stmt_1__, __asyncpg_stmt_2__, ... counting per process, so
two processes started together use the same names for different texts. PROC (a small integer)
keeps the values and ids of concurrent processes apart.

Prints "ok" at the end; any failed check raises (exit status 1).
"""

import asyncio
import sys

import asyncpg


async def connect(port):
    return await asyncpg.connect(
        host="127.0.0.1", port=port, user="postgres", database="test", timeout=30
    )


async def worker(conn, table, proc, i):
    try:
        factor = proc * 100 + i + 1
        who = f"p{proc}w{i}"
        for j in range(50):
            got = await conn.fetchval(f"SELECT $1::int * {factor}", j)
            assert got == j * factor, (who, j, got)
            row = await conn.fetchrow("SELECT $1::text AS who, $2::int AS n", who, j)
            assert (row["who"], row["n"]) == (who, j), (who, j, row)
        stmt = await conn.prepare("SELECT $1::int + $2::int")
        for j in range(10):
            assert await stmt.fetchval(j, factor) == j + factor
        key = proc * 10000 + i * 100
        async with conn.transaction():
            await conn.executemany(
                f"INSERT INTO {table} (id, v) VALUES ($1, $2)",
                [(key + k, who) for k in range(5)],
            )
            n = await conn.fetchval(f"SELECT count(*) FROM {table} WHERE v = $1", who)
            assert n == 5, (who, n)
        n = await conn.fetchval(f"SELECT count(*) FROM {table} WHERE v = $1", who)
        assert n == 5, (who, n)
    finally:
        await conn.close()


async def run(port, table, proc, workers):
    # Every connection is open before any works: more clients than server connections.
    conns = await asyncio.gather(*(connect(port) for _ in range(workers)))
    await asyncio.gather(*(worker(c, table, proc, i) for i, c in enumerate(conns)))


def main():
    port, table, proc, workers = (
        int(sys.argv[1]),
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    asyncio.run(run(port, table, proc, workers))
    print("ok")


if __name__ == "__main__":
    main()

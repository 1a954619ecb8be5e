"""asyncpg and a table whose columns change between two executions of a cached statement.

Usage: asyncpg_alter.py PORT TABLE

asyncpg prepares every query once per connection and decodes later executions' rows with
the description it got then. Another connection swaps two columns' places (same count,
other types); PostgreSQL then fails the next execution with "cached plan must not change
result type", which asyncpg answers by preparing the statement again (outside a
transaction). Prints what each execution got, to compare with PostgreSQL's own transcript.
"""

import asyncio
import sys

import asyncpg


async def main(port, table):
    connect = lambda: asyncpg.connect(  # noqa: E731
        host="127.0.0.1", port=port, user="postgres", database="test", timeout=30
    )
    a, b = await connect(), await connect()
    query = f"SELECT * FROM {table} WHERE id = $1"
    print("before:", dict(await a.fetchrow(query, 1)))
    await b.execute(
        f"ALTER TABLE {table} DROP COLUMN v; ALTER TABLE {table} ADD COLUMN v text DEFAULT 'new'"
    )
    for i in (1, 2, 3):
        try:
            print(f"after {i}:", dict(await a.fetchrow(query, 1)))
        except Exception as e:  # the class and SQLSTATE are what matters
            print(f"after {i}: {type(e).__name__} {getattr(e, 'sqlstate', '')}")
    await a.close()
    await b.close()


asyncio.run(main(int(sys.argv[1]), sys.argv[2]))

// node-postgres (the npm package `pg`) against a server, through pgmemo or directly: what
// transaction pooling must keep working for Node.js applications. Run by
// tests/transaction_drivers.rs with NODE_PATH pointing at an `npm install pg`:
//
//   node pg_check.js PORT TABLE
//
// Named prepared statements (`{ name, text, values }`: node-postgres prepares a name once per
// connection and then sends only Bind, Describe and Execute), the same names on several
// connections for different texts, a connection pool of eight clients hammering a proxy pool
// of two, transactions committed and rolled back, an error inside one, typed values and a
// connection's SET kept for it alone. Prints "ok" or exits with the failure.

const { Client, Pool } = require('pg');

const [port, t] = process.argv.slice(2);
const config = { host: '127.0.0.1', port: Number(port), user: 'postgres', database: 'test' };

function check(ok, what) {
  if (!ok) {
    throw new Error(`failed: ${what}`);
  }
}

async function sameNames() {
  const a = new Client(config);
  const b = new Client(config);
  await a.connect();
  await b.connect();
  for (let i = 0; i < 20; i++) {
    const ra = await a.query({ name: 'q', text: 'SELECT $1::int + 1 AS n', values: [i] });
    check(ra.rows[0].n === i + 1, `a's q ${i}`);
    const rb = await b.query({ name: 'q', text: "SELECT 'b:' || $1::text AS s", values: [`x${i}`] });
    check(rb.rows[0].s === `b:x${i}`, `b's q ${i}`);
  }
  await a.end();
  await b.end();
}

async function transactions() {
  const a = new Client(config);
  const b = new Client(config);
  await a.connect();
  await b.connect();
  const insert = (id, v) => a.query({ name: 'ins', text: `INSERT INTO ${t} VALUES ($1, $2)`, values: [id, v] });
  const count = async () => Number((await b.query(`SELECT count(*) AS c FROM ${t}`)).rows[0].c);
  await a.query('BEGIN');
  for (let i = 1; i <= 5; i++) await insert(i, `rolled back ${i}`);
  await a.query('ROLLBACK');
  check((await count()) === 0, 'a rollback leaves nothing');
  await a.query('BEGIN');
  for (let i = 1; i <= 50; i++) await insert(i, `v${i}`);
  await a.query('COMMIT');
  check((await count()) === 50, 'a commit is seen by others');

  await a.query('BEGIN');
  let failed = null;
  try {
    await a.query({ name: 'div', text: 'SELECT 1 / $1::int', values: [0] });
  } catch (e) {
    failed = e.code;
  }
  check(failed === '22012', `division by zero: ${failed}`);
  failed = null;
  try {
    await a.query('SELECT 1');
  } catch (e) {
    failed = e.code;
  }
  check(failed === '25P02', `aborted: ${failed}`);
  await a.query('ROLLBACK');

  const r = await a.query({
    name: 'types',
    text: 'SELECT $1::timestamptz AS ts, $2::numeric AS n, $3::bytea AS b, $4::int[] AS a, $5::jsonb AS j',
    values: ['2026-01-02T03:04:05.123Z', '12345678901234567890.5', Buffer.from([0, 1, 255]), [1, 2, 3], { k: 'v' }],
  });
  const row = r.rows[0];
  check(row.ts.toISOString() === '2026-01-02T03:04:05.123Z', 'timestamptz');
  check(row.n === '12345678901234567890.5', 'numeric');
  check(Buffer.compare(row.b, Buffer.from([0, 1, 255])) === 0, 'bytea');
  check(JSON.stringify(row.a) === '[1,2,3]' && row.j.k === 'v', 'int[] and jsonb');

  const before = (await b.query('SHOW TimeZone')).rows[0].TimeZone;
  await a.query("SET TIME ZONE 'Asia/Tokyo'");
  for (let i = 0; i < 10; i++) {
    check((await a.query('SHOW TimeZone')).rows[0].TimeZone === 'Asia/Tokyo', 'a keeps its TimeZone');
    check((await b.query('SHOW TimeZone')).rows[0].TimeZone === before, "b never gets a's TimeZone");
  }
  await a.end();
  await b.end();
}

async function pooled() {
  const pool = new Pool({ ...config, max: 8 });
  const work = [];
  for (let w = 0; w < 8; w++) {
    work.push((async () => {
      for (let i = 0; i < 100; i++) {
        const id = 1 + ((w * 7 + i) % 50);
        const r = await pool.query({ name: 'get', text: `SELECT v FROM ${t} WHERE id = $1`, values: [id] });
        check(r.rows[0].v === `v${id}`, `row ${id}`);
        const c = await pool.connect();
        try {
          await c.query('BEGIN');
          await c.query({ name: 'upd', text: `UPDATE ${t} SET v = 'tmp' WHERE id = $1`, values: [id] });
          await c.query('ROLLBACK');
        } finally {
          c.release();
        }
      }
    })());
  }
  await Promise.all(work);
  await pool.end();
}

(async () => {
  await sameNames();
  await transactions();
  await pooled();
  console.log('ok');
})().catch((e) => {
  console.error(e);
  process.exit(1);
});

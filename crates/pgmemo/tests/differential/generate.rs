//! Random scripts for two clients over a small schema (see `fixtures`): reads that the cache
//! may answer, writes to each client's own table (so that neither client ever waits for the
//! other's locks), transaction control, settings, SQL-level and protocol-level prepared
//! statements, cursors, errors, and pipelines of extended-protocol messages.
//!
//! Generation is interactive: the driver runs each step directly against PostgreSQL and tells
//! the generator each client's transaction status, so that in `exclusive` scripts only a
//! client inside a transaction block speaks until it ends it (with a pool of one server the
//! other client would wait for that server).
//!
//! Everything here is valid in both pool modes: nothing that transaction pooling refuses by
//! design (temporary objects, LISTEN, WITH HOLD cursors, session advisory locks, SET ROLE), no
//! DDL (a changed row type is retried by pgmemo where PostgreSQL fails), no values that differ
//! from run to run (process ids, clock readings).

use crate::script::{Op, Step, Who};

/// A small, reproducible generator (splitmix64).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// The kind of a statement's one parameter, if it has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Param {
    None,
    Int,
    Text,
}

/// Where a statement may be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Use {
    /// Anywhere: a simple Query, a named or unnamed Parse.
    Any,
    /// In a simple Query or an unnamed Parse only (SQL-level PREPARE and friends, which
    /// transaction pooling refuses in named statements).
    Unnamed,
    /// In a simple Query only: `DISCARD ALL`, which PostgreSQL commits at once in the
    /// extended protocol (a documented difference of transaction pooling).
    Simple,
}

struct Template {
    sql: &'static str,
    param: Param,
    place: Use,
}

const fn t(sql: &'static str, param: Param) -> Template {
    Template {
        sql,
        param,
        place: Use::Any,
    }
}

const fn u(sql: &'static str) -> Template {
    Template {
        sql,
        param: Param::None,
        place: Use::Unnamed,
    }
}

const fn q(sql: &'static str) -> Template {
    Template {
        sql,
        param: Param::None,
        place: Use::Simple,
    }
}

/// `{p}` is the fixtures' prefix, `{o}` the speaking client's own table (`ta` or `tb`).
const READS: &[Template] = &[
    t("SELECT k, v FROM {p}_ta ORDER BY k", Param::None),
    t("SELECT k, v FROM {p}_tb ORDER BY k", Param::None),
    t("SELECT v FROM {p}_ta WHERE k = $1", Param::Int),
    t("SELECT v FROM {p}_tb WHERE k = $1", Param::Int),
    t("SELECT count(*) AS n, sum(v) AS s FROM {p}_ta", Param::None),
    t(
        "SELECT a.k, a.v, b.v AS bv FROM {p}_ta a JOIN {p}_tb b USING (k) ORDER BY a.k",
        Param::None,
    ),
    t("SELECT w FROM {p}_va WHERE k = $1", Param::Int),
    t("SELECT count(*) AS n FROM {p}_log", Param::None),
    t("SELECT k FROM {p}_ta WHERE k > $1 ORDER BY k", Param::Int),
    t("SELECT k FROM {p}_tb WHERE k > $1 ORDER BY k", Param::Int),
    t("SELECT '2020-01-01 12:00'::timestamptz AS t", Param::None),
    t("SELECT '2020-03-04'::date AS d", Param::None),
    t("SELECT 0.1::float8 + 0.2 AS f", Param::None),
    t("SELECT current_setting('TimeZone') AS tz", Param::None),
    t("SELECT $1::text AS x", Param::Text),
    t("SELECT $1::int * 2 AS y", Param::Int),
    t("SELECT nextval('{p}_sq') AS n", Param::None),
    t("SELECT 1/0 AS boom", Param::None),
    t("SELECT * FROM {p}_nosuch", Param::None),
    t("SELEC 1", Param::None),
    t("SELECT v FROM {p}_{o} WHERE k = 1 FOR UPDATE", Param::None),
    t(
        "SELECT k FROM {p}_{o} ORDER BY k LIMIT 2 FOR SHARE",
        Param::None,
    ),
    t("SHOW TimeZone", Param::None),
    t("SHOW DateStyle", Param::None),
    t(
        "SELECT now() >= '2000-01-01'::timestamptz AS ok",
        Param::None,
    ),
    t("SELECT k, w FROM {p}_va ORDER BY k", Param::None),
    t("VALUES (1, 'one'), (2, 'two')", Param::None),
    t("", Param::None),
];

const WRITES: &[Template] = &[
    t("UPDATE {p}_{o} SET v = v + 1 WHERE k = $1", Param::Int),
    t("INSERT INTO {p}_{o} (k, v) VALUES ($1, 0)", Param::Int),
    t("DELETE FROM {p}_{o} WHERE k = $1", Param::Int),
    // RETURNING in the order rows sit in the heap, which pruning may change: sorted.
    t(
        "WITH u AS (UPDATE {p}_{o} SET v = v * 2 RETURNING k, v) SELECT * FROM u ORDER BY k",
        Param::None,
    ),
    t("SELECT {p}_touch_{o}($1) AS touched", Param::Int),
    t(
        "INSERT INTO {p}_{o} SELECT coalesce(max(k), 0) + 1, 7 FROM {p}_{o}",
        Param::None,
    ),
    t("DELETE FROM {p}_log WHERE src = '{o}'", Param::None),
];

const CONTROL: &[Template] = &[
    t("BEGIN", Param::None),
    t("BEGIN ISOLATION LEVEL REPEATABLE READ", Param::None),
    t("BEGIN ISOLATION LEVEL SERIALIZABLE", Param::None),
    t("START TRANSACTION READ ONLY", Param::None),
    t("COMMIT", Param::None),
    t("ROLLBACK", Param::None),
    t("COMMIT AND CHAIN", Param::None),
    t("SAVEPOINT sp", Param::None),
    t("ROLLBACK TO SAVEPOINT sp", Param::None),
    t("RELEASE SAVEPOINT sp", Param::None),
    t("LOCK TABLE {p}_{o} IN SHARE MODE", Param::None),
];

const SETTINGS: &[Template] = &[
    t("SET TimeZone = 'UTC'", Param::None),
    t("SET TimeZone = 'Asia/Tokyo'", Param::None),
    t("SET DateStyle = 'SQL, DMY'", Param::None),
    t("SET DateStyle = 'ISO, MDY'", Param::None),
    t("SET extra_float_digits = 0", Param::None),
    t("SET extra_float_digits = 3", Param::None),
    t("SET LOCAL TimeZone = 'America/New_York'", Param::None),
    t("SET LOCAL extra_float_digits = 1", Param::None),
    t("RESET TimeZone", Param::None),
    t("RESET ALL", Param::None),
    t("SET search_path = pg_catalog", Param::None),
    t("SET search_path = public", Param::None),
    t("SET search_path = {p}_s2, public", Param::None),
    t("SET search_path = {p}_s2, public", Param::None),
    t("SET application_name = 'diff'", Param::None),
    t(
        "SELECT set_config('TimeZone', 'Europe/Paris', false) AS c",
        Param::None,
    ),
    t(
        "SELECT set_config('extra_float_digits', '1', false) AS c",
        Param::None,
    ),
    t(
        "SELECT set_config('DateStyle', 'German', true) AS c",
        Param::None,
    ),
    t("SET statement_timeout = '30s'", Param::None),
];

const SESSION: &[Template] = &[
    u("PREPARE q1 AS SELECT v FROM {p}_ta WHERE k = 2"),
    u("PREPARE q2(int) AS UPDATE {p}_{o} SET v = v + 1 WHERE k = $1"),
    u("PREPARE q3 AS SELECT '2020-01-01 12:00'::timestamptz AS t"),
    u("EXECUTE q1"),
    u("EXECUTE q2(3)"),
    u("EXECUTE q3"),
    u("DEALLOCATE q1"),
    u("DEALLOCATE ALL"),
    q("DISCARD ALL"),
    t(
        "DECLARE c1 CURSOR FOR SELECT k FROM {p}_ta ORDER BY k",
        Param::None,
    ),
    t("FETCH 2 FROM c1", Param::None),
    t("CLOSE c1", Param::None),
];

/// What the generator knows of each client.
#[derive(Clone, Default)]
struct ClientModel {
    /// The last ReadyForQuery status the client got directly ('I', 'T' or 'E').
    status: u8,
    /// The parameter kind of the text each statement name was last parsed with.
    statements: [Option<Param>; 3],
    /// The unnamed statement may hold a SQL-level PREPARE, EXECUTE or DEALLOCATE: it is not
    /// bound again (a second run of such a statement through transaction pooling is a
    /// documented difference, docs/transaction-pooling.md).
    session_unnamed: bool,
}

const STATEMENTS: [&str; 3] = ["", "s1", "s2"];
const PORTALS: [&str; 2] = ["", "p1"];

pub struct Generator {
    rng: Rng,
    prefix: String,
    /// Only a client in a transaction block speaks until it ends it.
    exclusive: bool,
    clients: [ClientModel; 2],
}

impl Generator {
    pub fn new(seed: u64, prefix: &str, exclusive: bool) -> Generator {
        let idle = ClientModel {
            status: b'I',
            ..ClientModel::default()
        };
        Generator {
            rng: Rng::new(seed),
            prefix: prefix.to_owned(),
            exclusive,
            clients: [idle.clone(), idle],
        }
    }

    /// Records the status a step left its client in (from the direct run).
    pub fn observe(&mut self, who: Who, status: u8) {
        self.clients[who.index()].status = status;
    }

    pub fn step(&mut self) -> Step {
        let who = self.speaker();
        let status = self.clients[who.index()].status;
        let ops = if status != b'I' && self.rng.chance(20) {
            // Blocks end now and then.
            let end = *self.rng.pick(&["COMMIT", "ROLLBACK", "END", "ABORT"]);
            if self.rng.chance(70) {
                vec![Op::Query(end.to_owned())]
            } else {
                vec![
                    Op::Parse {
                        name: "",
                        sql: end.to_owned(),
                        types: vec![],
                    },
                    Op::Bind {
                        portal: "",
                        statement: "",
                        params: vec![],
                    },
                    Op::Execute {
                        portal: "",
                        max_rows: 0,
                    },
                    Op::Sync,
                ]
            }
        } else if self.rng.chance(45) {
            vec![self.simple_query(who)]
        } else {
            self.batch(who)
        };
        Step { who, ops }
    }

    fn speaker(&mut self) -> Who {
        let pick = if self.rng.chance(50) { Who::A } else { Who::B };
        if self.exclusive && self.clients[pick.other().index()].status != b'I' {
            pick.other()
        } else {
            pick
        }
    }

    fn template(&mut self) -> &'static Template {
        let family = match self.rng.below(100) {
            0..=39 => READS,
            40..=59 => WRITES,
            60..=74 => CONTROL,
            75..=87 => SETTINGS,
            _ => SESSION,
        };
        self.rng.pick(family)
    }

    fn text(&self, who: Who, template: &Template) -> String {
        let own = match who {
            Who::A => "ta",
            Who::B => "tb",
        };
        template
            .sql
            .replace("{p}", &self.prefix)
            .replace("{o}", own)
    }

    fn literal(&mut self, param: Param) -> String {
        match param {
            Param::Int | Param::None => self.rng.below(8).to_string(),
            Param::Text => self.rng.pick(&["x", "yy", "", "$1"]).to_string(),
        }
    }

    fn simple_query(&mut self, who: Who) -> Op {
        let count = if self.rng.chance(25) {
            2 + self.rng.below(2)
        } else {
            1
        };
        let mut parts = Vec::new();
        while parts.len() < count {
            let template = self.template();
            let mut text = self.text(who, template);
            if template.param != Param::None {
                let value = match template.param {
                    Param::Text => format!("'{}'", self.literal(Param::Text).replace('\'', "''")),
                    _ => self.literal(Param::Int),
                };
                text = text.replace("$1", &value);
            }
            if !text.is_empty() || count == 1 {
                parts.push(text);
            }
        }
        Op::Query(parts.join("; "))
    }

    fn params(&mut self, param: Option<Param>) -> Vec<Option<String>> {
        let wanted = match param {
            Some(Param::None) => 0,
            Some(_) => 1,
            None => self.rng.below(2),
        };
        // Now and then the wrong number, or a NULL.
        let count = if self.rng.chance(5) {
            1 - wanted.min(1)
        } else {
            wanted
        };
        (0..count)
            .map(|_| {
                if self.rng.chance(5) {
                    None
                } else {
                    Some(self.literal(param.unwrap_or(Param::Int)))
                }
            })
            .collect()
    }

    /// A Parse of statement `name_index`. With `session`, an unnamed one may hold a SQL-level
    /// PREPARE, EXECUTE or DEALLOCATE; only [`Self::typical`] asks for that, as it binds and
    /// executes the statement right after: transaction pooling gives or drops such a
    /// statement's names when it is parsed, and one parsed but never executed is a documented
    /// difference (docs/transaction-pooling.md). Returns whether it holds one.
    fn parse(&mut self, who: Who, name_index: usize, session: bool) -> (Op, bool) {
        let mut template = self.template();
        while template.place == Use::Simple
            || (template.place == Use::Unnamed && (name_index != 0 || !session))
        {
            template = self.template();
        }
        let sql = if self.rng.chance(3) {
            // Two statements in one Parse: refused by PostgreSQL.
            format!("{}; SELECT 1", self.text(who, template))
        } else {
            self.text(who, template)
        };
        let types = match (template.param, self.rng.chance(50)) {
            (Param::Int, true) => vec![23],
            (Param::Text, true) => vec![25],
            _ => vec![],
        };
        self.clients[who.index()].statements[name_index] = Some(template.param);
        if name_index == 0 {
            self.clients[who.index()].session_unnamed = template.place == Use::Unnamed;
        }
        let op = Op::Parse {
            name: STATEMENTS[name_index],
            sql,
            types,
        };
        (op, template.place == Use::Unnamed)
    }

    fn bind(&mut self, who: Who, name_index: usize, portal: &'static str) -> Op {
        let param = self.clients[who.index()].statements[name_index];
        Op::Bind {
            portal,
            statement: STATEMENTS[name_index],
            params: self.params(param),
        }
    }

    /// A Bind that succeeds: no parameters, for a statement that takes none.
    fn exact_bind(portal: &'static str, name_index: usize) -> Op {
        Op::Bind {
            portal,
            statement: STATEMENTS[name_index],
            params: Vec::new(),
        }
    }

    /// A portal name for the client's next Bind, Describe, Execute or Close. Never the
    /// unnamed portal in an aborted block: PostgreSQL 15.20 may crash on an Execute or
    /// Describe of it there, when it is the portal of a simple Query that failed (its
    /// statement list lived in the memory of that Query's message, which later messages
    /// reuse; a multi-statement Query in the block makes the crash likely).
    fn portal(&mut self, who: Who) -> &'static str {
        if self.clients[who.index()].status == b'E' {
            "p1"
        } else {
            PORTALS[self.rng.below(PORTALS.len())]
        }
    }

    fn execute(&mut self, portal: &'static str) -> Op {
        let max_rows = if self.rng.chance(20) {
            1 + self.rng.below(2) as u32
        } else {
            0
        };
        Op::Execute { portal, max_rows }
    }

    /// One or two groups of extended-protocol messages, each ending with Sync.
    fn batch(&mut self, who: Who) -> Vec<Op> {
        let groups = if self.rng.chance(20) { 2 } else { 1 };
        let mut ops = Vec::new();
        for _ in 0..groups {
            if self.rng.chance(60) {
                self.typical(who, &mut ops);
            } else {
                for _ in 0..1 + self.rng.below(5) {
                    let op = self.random_op(who);
                    ops.push(op);
                }
            }
            ops.push(Op::Sync);
        }
        ops
    }

    /// What drivers send: Parse (unless the statement is known), Bind, Describe, Execute.
    fn typical(&mut self, who: Who, ops: &mut Vec<Op>) {
        let name_index = self.rng.below(STATEMENTS.len());
        let model = &self.clients[who.index()];
        let known = model.statements[name_index].is_some();
        let rebind_session = name_index == 0 && model.session_unnamed;
        let mut session = false;
        if !known || rebind_session || self.rng.chance(60) {
            let (parse, holds_session) = self.parse(who, name_index, true);
            ops.push(parse);
            session = holds_session;
            if self.rng.chance(20) {
                ops.push(Op::Describe {
                    kind: b'S',
                    name: STATEMENTS[name_index],
                });
            }
        }
        let portal = self.portal(who);
        if session {
            ops.push(Self::exact_bind(portal, name_index));
        } else {
            ops.push(self.bind(who, name_index, portal));
        }
        if self.rng.chance(40) {
            ops.push(Op::Describe {
                kind: b'P',
                name: portal,
            });
        }
        ops.push(self.execute(portal));
        if portal == "p1" && self.rng.chance(50) {
            ops.push(self.execute(portal));
        }
        if self.rng.chance(10) {
            ops.push(Op::Close {
                kind: b'S',
                name: STATEMENTS[name_index],
            });
        }
    }

    fn random_op(&mut self, who: Who) -> Op {
        let mut name_index = self.rng.below(STATEMENTS.len());
        if name_index == 0 && self.clients[who.index()].session_unnamed {
            name_index = 1;
        }
        let portal = self.portal(who);
        match self.rng.below(9) {
            0 | 1 => self.parse(who, name_index, false).0,
            2 | 3 => self.bind(who, name_index, portal),
            4 => {
                let kind = if self.rng.chance(50) { b'S' } else { b'P' };
                let name = if self.rng.chance(50) {
                    STATEMENTS[name_index]
                } else {
                    portal
                };
                // A statement name as a portal's: not the unnamed one where `portal` says no.
                let name = if kind == b'P' && name.is_empty() {
                    portal
                } else {
                    name
                };
                Op::Describe { kind, name }
            }
            5 | 6 => self.execute(portal),
            7 => Op::Close {
                kind: if self.rng.chance(50) { b'S' } else { b'P' },
                name: if self.rng.chance(50) {
                    STATEMENTS[name_index]
                } else {
                    portal
                },
            },
            _ => Op::Flush,
        }
    }
}

//! Prepared statements under transaction pooling. A client's statement names mean nothing to a
//! server connection it may never have used, so pgmemo keeps one process-wide
//! [`StatementRegistry`] of statements keyed by what defines them (text and parameter types),
//! each with pgmemo's own server-side name, and every server connection remembers which of
//! them it has prepared ([`ServerStatements`], least recently used closed beyond
//! `max_prepared_statements`). Two clients may then both call their statement "s1" while a
//! server holds one `pgmemo_7` for each distinct text.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use bytes::{Bytes, BytesMut};
use wire::frontend::Parse;

use crate::hash::Map;

/// How a statement's parameter types were given: OIDs in a protocol-level Parse, or type
/// names as SQL text in `PREPARE name (types) AS ...`. The two never share a server-side
/// statement (`int4` and `integer` would have to be resolved by the server to compare).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ParamTypes {
    Oids(Box<[u32]>),
    Sql(Box<[String]>),
}

/// What makes two prepared statements the same on a server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StatementKey {
    pub text: Box<str>,
    pub types: ParamTypes,
    /// The preparing client's `ClientSettings::parse_digest`: a statement is analysed under
    /// the settings of the session that prepares it, so clients that read literals
    /// differently (another TimeZone, DateStyle, ...) must not share one.
    pub settings: Arc<str>,
}

/// One statement as servers know it.
#[derive(Debug)]
pub struct PreparedStatement {
    /// Unique for the life of the process (while any client or server holds the statement).
    pub id: u64,
    /// pgmemo's name for it on every server: `pgmemo_<id>`.
    pub name: String,
    pub key: StatementKey,
    /// The Parse message (protocol-level statements) or the `PREPARE` statement (SQL-level)
    /// that creates it on a server that lacks it.
    pub create: StatementSource,
    /// A server accepted it once: a client's Parse of it can be answered without a server
    /// (clients that prepare synchronously while others hold every server must not wait).
    pub validated: std::sync::atomic::AtomicBool,
    /// For a statement of one client's own, prepared while pgmemo could not tell the settings
    /// (`key.settings` is `UNKNOWN_PARSE_SETTINGS`): the parse digest the server read it
    /// under, when its ParseComplete showed nothing had moved them (a `SET` pipelined ahead
    /// had committed by then). Preparing it again elsewhere then keeps that reading.
    settled_under: OnceLock<Arc<str>>,
    /// Whom the statement is for.
    pub sharing: Sharing,
}

/// Whom a statement is for: what decides whether a client may run it under settings it was
/// not registered for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// Handed to every client that prepares its key (`StatementRegistry::get_or_register`).
    Shared,
    /// One client's alone, never handed out for its key again nor copied: prepared under
    /// settings its records did not show yet (`StatementRegistry::register_unshared`), or a
    /// copy of a shared statement its analysis settings moved away from
    /// (`StatementRegistry::own_copy`), which stands for the client's statement as PostgreSQL
    /// first analysed it. Run under whatever settings the client has at use, as PostgreSQL
    /// runs the client's own statement.
    Own,
}

impl PreparedStatement {
    /// The parse digest the statement was read under, as far as pgmemo knows: the one it was
    /// registered under, or the one learnt when it turned out to be known
    /// ([`Self::settle_under`]).
    pub fn read_under(&self) -> &str {
        self.settled_under.get().unwrap_or(&self.key.settings)
    }

    /// Whether a client whose analysis settings are `parse_digest` (its
    /// `ClientSettings::parse_digest`) must run a copy of its own instead of this statement.
    ///
    /// A server analyses a statement again under the settings in force when it runs it after
    /// DDL invalidated it, or when it runs under a `search_path` that resolves to other
    /// schemas than the one it was last analysed under, which another client sharing the
    /// statement may have done. Run by a client whose settings moved since it prepared it
    /// (`SET TimeZone`), such a server's statement would read its literals
    /// (`'2020-01-01 12:00'::timestamptz`) under the new settings where PostgreSQL's own
    /// statement of the client keeps its first reading. A shared statement is therefore run
    /// only under the settings it was registered for, give or take `search_path`: when that
    /// alone differs, PostgreSQL's statement and the shared one are analysed again in the
    /// same cases (the schemas the path resolves to differ, DDL), under the same settings,
    /// keeping the parameter types their first analysis resolved, and clients that switch
    /// `search_path` per request (a schema per tenant) keep sharing.
    pub fn drifted_from(&self, parse_digest: &Arc<str>) -> bool {
        self.sharing == Sharing::Shared
            && self.key.settings != *parse_digest
            && super::settings::differ_beyond_search_path(&self.key.settings, parse_digest)
    }

    /// Records that the server read the statement under `parse_digest` (the first record
    /// stands: PostgreSQL keeps the reading of the statement's first analysis).
    pub fn settle_under(&self, parse_digest: Arc<str>) {
        let _ = self.settled_under.set(parse_digest);
    }
}

/// How to create a statement on a server.
#[derive(Debug, Clone)]
pub enum StatementSource {
    /// A complete Parse message under pgmemo's name.
    Parse(Bytes),
    /// `PREPARE pgmemo_<id> (types) AS ...`.
    Sql(String),
}

impl StatementSource {
    /// The same statement created under the server-side name `to` in place of `from`.
    fn renamed(&self, from: &str, to: &str) -> StatementSource {
        match self {
            StatementSource::Parse(message) => {
                let mut parse = Parse::decode(message.slice(5..))
                    .expect("a statement's Parse is one pgmemo encoded");
                parse.name = Bytes::copy_from_slice(to.as_bytes());
                let mut renamed = BytesMut::new();
                parse.encode(&mut renamed);
                StatementSource::Parse(renamed.freeze())
            }
            StatementSource::Sql(sql) => {
                let prefix = format!("PREPARE {from}");
                let rest = sql.strip_prefix(&prefix).unwrap_or_default();
                StatementSource::Sql(format!("PREPARE {to}{rest}"))
            }
        }
    }
}

/// The process-wide registry. Entries are weak: a statement no client maps and no server has
/// prepared is forgotten.
#[derive(Default)]
pub struct StatementRegistry {
    statements: Mutex<Map<StatementKey, Weak<PreparedStatement>>>,
    next_id: AtomicU64,
    /// Live-entry count at the last sweep of dead entries: the map is swept when it doubles.
    swept_at: AtomicU64,
    next_client: AtomicU64,
}

impl StatementRegistry {
    /// The statement for `key`, registered on first use with `create` built for its name.
    pub fn get_or_register(
        &self,
        key: StatementKey,
        create: impl FnOnce(&str) -> StatementSource,
    ) -> Arc<PreparedStatement> {
        let mut map = self.statements.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(live) = map.get(&key).and_then(Weak::upgrade) {
            return live;
        }
        let statement = self.new_statement(key.clone(), create, Sharing::Shared);
        map.insert(key, Arc::downgrade(&statement));
        let swept = self.swept_at.load(Ordering::Relaxed).max(1024);
        if map.len() as u64 > 2 * swept {
            map.retain(|_, weak| weak.strong_count() > 0);
            self.swept_at.store(map.len() as u64, Ordering::Relaxed);
        }
        statement
    }

    /// A statement of its own for one client, never handed out for `key` again: for a text
    /// prepared under settings the client's records do not show yet (a `SET` earlier in its
    /// transaction or Query), which the server's analysis of another client's statement
    /// would not have seen.
    pub fn register_unshared(
        &self,
        key: StatementKey,
        create: impl FnOnce(&str) -> StatementSource,
    ) -> Arc<PreparedStatement> {
        self.new_statement(key, create, Sharing::Own)
    }

    /// A copy of `statement` for one client alone, under a new server-side name: see
    /// [`PreparedStatement::drifted_from`] and [`Sharing::Own`]. It keeps the settings the
    /// statement was registered for, under which a server that lacks it prepares it.
    pub fn own_copy(&self, statement: &PreparedStatement) -> Arc<PreparedStatement> {
        let copy = self.new_statement(
            statement.key.clone(),
            |name| statement.create.renamed(&statement.name, name),
            Sharing::Own,
        );
        let validated = statement.validated.load(Ordering::Relaxed);
        copy.validated.store(validated, Ordering::Relaxed);
        copy
    }

    /// A statement with the next id and its name, `pgmemo_<id>`.
    fn new_statement(
        &self,
        key: StatementKey,
        create: impl FnOnce(&str) -> StatementSource,
        sharing: Sharing,
    ) -> Arc<PreparedStatement> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let name = format!("pgmemo_{id}");
        Arc::new(PreparedStatement {
            id,
            create: create(&name),
            name,
            key,
            validated: Default::default(),
            settled_under: OnceLock::new(),
            sharing,
        })
    }

    /// The statement for `key` if one is registered.
    pub fn get(&self, key: &StatementKey) -> Option<Arc<PreparedStatement>> {
        let map = self.statements.lock().unwrap_or_else(|e| e.into_inner());
        map.get(key).and_then(Weak::upgrade)
    }

    /// Statements known now (for statistics and tests).
    pub fn len(&self) -> usize {
        let map = self.statements.lock().unwrap_or_else(|e| e.into_inner());
        map.values().filter(|w| w.strong_count() > 0).count()
    }

    /// Whether no statement is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A number no other client session of this process has: tells server connections whose
    /// unnamed statement they hold.
    pub fn new_client_tag(&self) -> u64 {
        self.next_client.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// One statement a server holds.
struct Held {
    statement: Arc<PreparedStatement>,
    /// The clock at its last use.
    used: u64,
    /// The shape of its rows as this server described it (see [`ServerStatements::shape`]).
    shape: Option<u64>,
}

/// The statements one server connection has prepared, with use counters for `SHOW SERVERS`.
#[derive(Default)]
pub struct ServerStatements {
    prepared: Map<u64, Held>,
    clock: u64,
    /// While pgmemo plans one Query ([`Self::pin_uses`]): statements used since this clock
    /// value are not evicted, since the Query has yet to run them.
    pinned_from: Option<u64>,
    /// Uses of a statement the server already had.
    pub hits: u64,
    /// Statements pgmemo had to prepare on this server first.
    pub misses: u64,
}

impl ServerStatements {
    /// Whether the server has `statement`; a use counts as a hit and refreshes it.
    pub fn touch(&mut self, statement: &PreparedStatement) -> bool {
        self.clock += 1;
        match self.prepared.get_mut(&statement.id) {
            Some(entry) => {
                entry.used = self.clock;
                self.hits += 1;
                true
            }
            None => false,
        }
    }

    /// From now until [`Self::unpin`], the statements used or prepared are never the ones
    /// `insert` evicts: a simple Query gets every statement it executes prepared before it
    /// runs (`EXECUTE q1; PREPARE q2 AS ...`), and making room for a later one must not close
    /// an earlier one. When every statement held is pinned, the server holds more than
    /// `max_prepared_statements` until the next `insert` outside a pin closes the excess.
    pub fn pin_uses(&mut self) {
        self.pinned_from = Some(self.clock + 1);
    }

    /// Ends [`Self::pin_uses`].
    pub fn unpin(&mut self) {
        self.pinned_from = None;
    }

    /// Whether the server has `statement`, without counting a use.
    pub fn holds(&self, statement: &PreparedStatement) -> bool {
        self.prepared.contains_key(&statement.id)
    }

    /// Records that `statement` is being prepared on the server. Returns the least recently
    /// used statements to close first so that the server holds at most `max` (usually one,
    /// none while there is room; more after a pinned Query went beyond `max`).
    pub fn insert(
        &mut self,
        statement: Arc<PreparedStatement>,
        max: usize,
    ) -> Vec<Arc<PreparedStatement>> {
        self.clock += 1;
        self.misses += 1;
        let mut evicted = Vec::new();
        let pinned_from = self.pinned_from.unwrap_or(u64::MAX);
        while self.prepared.len() >= max.max(1) {
            let oldest = self
                .prepared
                .iter()
                .filter(|(_, held)| held.used < pinned_from)
                .min_by_key(|(_, held)| held.used)
                .map(|(id, _)| *id);
            match oldest.and_then(|id| self.prepared.remove(&id)) {
                Some(e) => evicted.push(e.statement),
                None => break,
            }
        }
        let held = Held {
            statement: Arc::clone(&statement),
            used: self.clock,
            shape: None,
        };
        self.prepared.insert(statement.id, held);
        evicted
    }

    /// The shape of the rows of `statement` on this server (a digest of the RowDescription
    /// it gave when described: see `shape_of`), when it has been described here since it
    /// was prepared. A client that learnt another shape must not get its rows.
    pub fn shape(&self, statement: &PreparedStatement) -> Option<u64> {
        self.prepared.get(&statement.id).and_then(|h| h.shape)
    }

    /// Notes the shape this server described `statement` with.
    pub fn note_shape(&mut self, statement: &PreparedStatement, shape: u64) {
        if let Some(held) = self.prepared.get_mut(&statement.id) {
            held.shape = Some(shape);
        }
    }

    /// Records `statement` again after pgmemo's Close of it was skipped: the server still
    /// has it. Not a use; the next `insert` evicts as usual if the server holds too many.
    pub fn restore(&mut self, statement: Arc<PreparedStatement>) {
        self.prepared.entry(statement.id).or_insert(Held {
            statement,
            used: 0,
            shape: None,
        });
    }

    /// Forgets a statement whose preparation failed.
    pub fn remove(&mut self, id: u64) {
        self.prepared.remove(&id);
    }

    /// Statements prepared now.
    pub fn len(&self) -> usize {
        self.prepared.len()
    }

    /// Whether none is prepared.
    pub fn is_empty(&self) -> bool {
        self.prepared.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> StatementKey {
        StatementKey {
            text: text.into(),
            types: ParamTypes::Oids(Box::new([])),
            settings: Arc::from(""),
        }
    }

    fn sql(name: &str) -> StatementSource {
        StatementSource::Sql(format!("PREPARE {name} AS SELECT 1"))
    }

    #[test]
    fn a_copy_is_its_own_under_a_new_name_and_never_drifts() {
        let registry = StatementRegistry::default();
        let shared = registry.get_or_register(key("SELECT 1"), sql);
        let utc: Arc<str> = Arc::from("");
        let paris: Arc<str> = Arc::from("8:timezone12:Europe/Paris");
        let other_path: Arc<str> = Arc::from("11:search_path6:public");
        let both: Arc<str> = Arc::from("11:search_path6:public8:timezone12:Europe/Paris");
        assert!(!shared.drifted_from(&utc));
        assert!(shared.drifted_from(&paris));
        assert!(
            !shared.drifted_from(&other_path),
            "analysed again in the same cases as PostgreSQL's own"
        );
        assert!(shared.drifted_from(&both));
        let copy = registry.own_copy(&shared);
        assert_ne!(copy.id, shared.id);
        assert_eq!(copy.key, shared.key);
        assert_eq!(copy.sharing, Sharing::Own);
        assert!(!copy.drifted_from(&paris), "a copy is the client's own");
        let StatementSource::Sql(create) = &copy.create else {
            panic!("a copy is created as the original was");
        };
        assert_eq!(create, &format!("PREPARE {} AS SELECT 1", copy.name));
        // The registry still hands out the shared statement for its key.
        assert_eq!(registry.get_or_register(key("SELECT 1"), sql).id, shared.id);
        // A Parse message: the name replaced, the text and parameter types kept.
        let parse = |name: &str| {
            let mut m = BytesMut::new();
            Parse {
                name: Bytes::copy_from_slice(name.as_bytes()),
                query: Bytes::from_static(b"SELECT $1"),
                param_types: vec![23],
            }
            .encode(&mut m);
            StatementSource::Parse(m.freeze())
        };
        let protocol = registry.get_or_register(key("SELECT $1"), parse);
        let copy = registry.own_copy(&protocol);
        match (&copy.create, parse(&copy.name)) {
            (StatementSource::Parse(a), StatementSource::Parse(b)) => assert_eq!(a, &b),
            _ => panic!("a copy of a Parse is a Parse"),
        }
    }

    #[test]
    fn one_statement_per_text_and_types_while_someone_holds_it() {
        let registry = StatementRegistry::default();
        let a = registry.get_or_register(key("SELECT 1"), sql);
        let b = registry.get_or_register(key("SELECT 1"), sql);
        assert_eq!(a.id, b.id);
        assert_eq!(a.name, format!("pgmemo_{}", a.id));
        let other_types = StatementKey {
            text: "SELECT 1".into(),
            types: ParamTypes::Oids(Box::new([23])),
            settings: Arc::from(""),
        };
        assert_ne!(registry.get_or_register(other_types, sql).id, a.id);
        let other_settings = StatementKey {
            settings: Arc::from("8:timezone3:UTC"),
            ..key("SELECT 1")
        };
        assert_ne!(registry.get_or_register(other_settings, sql).id, a.id);
        let id = a.id;
        drop((a, b));
        assert_ne!(registry.get_or_register(key("SELECT 1"), sql).id, id);
    }

    #[test]
    fn servers_close_the_least_recently_used_beyond_the_limit() {
        let registry = StatementRegistry::default();
        let s: Vec<_> = (0..3)
            .map(|i| registry.get_or_register(key(&format!("SELECT {i}")), sql))
            .collect();
        let mut server = ServerStatements::default();
        assert!(server.insert(s[0].clone(), 2).is_empty());
        assert!(server.insert(s[1].clone(), 2).is_empty());
        assert!(server.touch(&s[0]));
        let evicted = server.insert(s[2].clone(), 2);
        assert_eq!(evicted.len(), 1);
        assert_eq!(evicted[0].id, s[1].id);
        assert!(!server.touch(&s[1]));
        assert!(server.touch(&s[2]));
        assert_eq!(server.len(), 2);
        assert_eq!((server.hits, server.misses), (2, 3));
    }

    #[test]
    fn statements_a_query_uses_are_not_evicted_while_it_is_planned() {
        let registry = StatementRegistry::default();
        let s: Vec<_> = (0..4)
            .map(|i| registry.get_or_register(key(&format!("SELECT {i}")), sql))
            .collect();
        let mut server = ServerStatements::default();
        assert!(server.insert(s[0].clone(), 1).is_empty());
        server.pin_uses();
        // The Query executes s[0], then prepares s[1] and s[2]: nothing it uses is closed.
        assert!(server.touch(&s[0]));
        assert!(server.insert(s[1].clone(), 1).is_empty());
        assert!(server.insert(s[2].clone(), 1).is_empty());
        server.unpin();
        assert_eq!(server.len(), 3);
        // The next one outside the Query closes all three, oldest first.
        let evicted: Vec<u64> = server
            .insert(s[3].clone(), 1)
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(evicted, [s[0].id, s[1].id, s[2].id]);
        assert_eq!(server.len(), 1);
    }
}

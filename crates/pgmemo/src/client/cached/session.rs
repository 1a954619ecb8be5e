//! What a caching session remembers between requests: its context (the session half of every
//! key), the statements it prepared (protocol-level and SQL-level names share one namespace on
//! the server, and so here), and the scratch buffers the hit path reuses so that it allocates
//! nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use crate::cache::context::Context;
use crate::cache::plan::Plan;
use crate::cache::DatabaseCache;
use crate::cancel::CancelSlot;
use crate::hash::Map;

/// A statement prepared with Parse (or `PREPARE`), as the client named it.
#[derive(Debug)]
pub struct Statement {
    /// The query text.
    pub text: String,
    /// Key part identifying the statement: text and parameter type OIDs as sent in Parse.
    pub identity: Bytes,
    /// Its plan, the context id and plan epoch it was made in, and whether the text holds a
    /// time literal.
    pub plan: Option<(u64, u64, Arc<Plan>, bool)>,
    /// When the server last accepted it (see [`Confirmed`]). Until its ParseComplete it is
    /// not answered from the cache: a refused Parse leaves no statement (or the previous one)
    /// on the server.
    pub confirmed: Confirmed,
    /// It replaced a statement of the same name and another text. PostgreSQL refuses such a
    /// Parse (42P05) unless it dropped the old statement in a way pgmemo did not see (a
    /// `DEALLOCATE` run by a `DO` block): until its ParseComplete tells which, the name may
    /// stand for either text, so it is neither planned nor captured.
    pub replaced: bool,
    /// The id of the context the server analysed it in, when known. PostgreSQL reads literals
    /// (`'2020-01-01'::timestamptz` under TimeZone, dates under DateStyle, backslashes under
    /// standard_conforming_strings) when it analyses a statement and analyses a saved one
    /// again only after DDL or a search_path or role change, not after `SET TimeZone`: an
    /// execution is keyed by the session's context, so it is answered or captured only while
    /// that context is this one. `None` once the server may have analysed it elsewhere.
    pub parsed_in: Option<u64>,
}

/// When the server last accepted a statement: 0 until the ParseComplete of its latest Parse,
/// then 1 + the plans epoch (`DatabaseCache::plans_epoch`) when the accepted Parse, or the
/// latest accepted Bind of it, was sent. DDL bumps the epoch and may have changed the
/// statement's result type, which PostgreSQL refuses at its next Bind ("cached plan must not
/// change result type"): only a statement the server accepted since the last bump is answered
/// from the cache (entries stored before that DDL are gone, so those left have today's type).
pub type Confirmed = Arc<AtomicU64>;

/// A Parse or Bind sent to the server whose completion confirms a statement.
pub struct Confirmation {
    flag: Confirmed,
    epoch: u64,
}

impl Confirmation {
    /// For a message sent now, in plans epoch `epoch`.
    pub fn new(flag: &Confirmed, epoch: u64) -> Confirmation {
        Confirmation {
            flag: Arc::clone(flag),
            epoch,
        }
    }

    /// The server completed the message.
    pub fn confirm(&self) {
        self.flag.fetch_max(self.epoch + 1, Ordering::Relaxed);
    }
}

/// The confirmations a request carries, in the order of the messages: the n-th ParseComplete
/// (BindComplete) of its response completes the n-th Parse (Bind).
#[derive(Default)]
pub struct Confirmations {
    pub parses: Vec<Confirmation>,
    pub binds: Vec<Confirmation>,
}

impl Confirmations {
    pub fn is_empty(&self) -> bool {
        self.parses.is_empty() && self.binds.is_empty()
    }

    /// Appends a later request's.
    pub fn extend(&mut self, other: Confirmations) {
        self.parses.extend(other.parses);
        self.binds.extend(other.binds);
    }
}

impl Statement {
    /// Whether the server may hold another statement under this name (see `replaced`).
    pub fn in_doubt(&self) -> bool {
        self.replaced && self.confirmed.load(Ordering::Relaxed) == 0
    }

    /// Whether the server accepted it in plans epoch `epoch` (see [`Confirmed`]).
    pub fn confirmed_in(&self, epoch: u64) -> bool {
        self.confirmed.load(Ordering::Relaxed) == epoch + 1
    }

    /// Whether the server analysed it in the context `current` (the session's trusted context
    /// id), so that an execution keyed by that context gets what the server would send.
    pub fn parsed_in_context(&self, current: Option<u64>) -> bool {
        self.parsed_in.is_some() && self.parsed_in == current
    }

    /// The server may analyse it again now (a Bind or Describe of it, or its deferred Parse,
    /// is sent) in context `ctx` (`None`: not known): unless that is the context it was
    /// parsed in, its literals may now be read under other settings than pgmemo knows.
    pub fn may_analyse_in(&mut self, ctx: Option<u64>) {
        if self.parsed_in != ctx {
            self.parsed_in = None;
        }
    }

    /// Whether a Parse of `text` and `param_types` is of this statement.
    pub fn is(&self, text: &[u8], param_types: &[u8]) -> bool {
        self.identity.len() == text.len() + param_types.len() + 4
            && self.identity[4..4 + text.len()] == *text
            && self.identity[4 + text.len()..] == *param_types
    }
}

/// Per-session cache state.
pub struct CacheSession {
    pub db: Arc<DatabaseCache>,
    /// The name the client gave its database: `[databases.NAME]` may turn the cache off.
    pub client_database: String,
    /// `None` while the settings may have changed and were not read again.
    pub context: Option<Arc<Context>>,
    /// Prepared statements by name (`""` is the unnamed statement).
    pub statements: Map<Bytes, Statement>,
    /// The session's `SET pgmemo.cache` (on unless turned off).
    pub enabled: bool,
    /// What the server lacks for its unnamed statement to be the client's, sent before the
    /// client next uses it: the Parse the client sent in a batch answered from the cache, or
    /// a Close ([`close_unnamed`]) after a Query answered from the cache, which dropped the
    /// client's unnamed statement while the server still has it.
    pub unnamed_behind: Option<Bytes>,
    /// The cache is bypassed until the replication feed has applied the WAL up to here (the
    /// session's own writes that only the feed invalidates).
    pub bypass_until_lsn: u64,
    /// Reused for keys.
    pub key: Vec<u8>,
    /// Reused for the plan memo's keys (a simple query's miss looks its shape up).
    pub memo_key: Vec<u8>,
    /// Reused for hit responses.
    pub out: Vec<u8>,
    /// The relay ended with a request that may write unanswered (see `cached::run`): the
    /// server may still commit it.
    pub writes_unanswered: bool,
    /// The client's cancel slot: held while a statement waits in pgmemo with the server idle
    /// (see [`CancelSlot::hold`]).
    pub cancel: Arc<CancelSlot>,
}

impl CacheSession {
    /// A session on `db` (called `client_database` by the client) whose context is not
    /// known yet.
    pub fn new(
        db: Arc<DatabaseCache>,
        client_database: &str,
        cancel: Arc<CancelSlot>,
    ) -> CacheSession {
        CacheSession {
            cancel,
            db,
            client_database: client_database.to_owned(),
            context: None,
            statements: Map::default(),
            enabled: true,
            writes_unanswered: false,
            unnamed_behind: None,
            bypass_until_lsn: 0,
            key: Vec::with_capacity(256),
            memo_key: Vec::new(),
            out: Vec::with_capacity(1024),
        }
    }

    /// Starts a key in `self.key`: database, context and the request kind. `None` without a
    /// known context.
    pub fn start_key(&mut self, kind: u8) -> Option<()> {
        let ctx = self.context.as_ref()?;
        self.key.clear();
        self.key.extend_from_slice(&self.db.id.to_le_bytes());
        self.key.extend_from_slice(&ctx.id.to_le_bytes());
        self.key.push(kind);
        Some(())
    }

    /// Records a Parse sent in context `parsed_in` (see [`Statement::parsed_in`]): `name` now
    /// means `text` with these parameter types. Returns the flag that the Parse's
    /// ParseComplete sets.
    pub fn parsed(
        &mut self,
        name: Bytes,
        text: &[u8],
        param_types: &[u8],
        parsed_in: Option<u64>,
    ) -> Confirmed {
        // The same statement parsed again (drivers parse the unnamed statement for every
        // query): kept with its plan, to be confirmed again.
        let mut replaced = false;
        if let Some(st) = self.statements.get_mut(&name[..]) {
            if st.is(text, param_types) {
                st.parsed_in = parsed_in;
                st.confirmed.store(0, Ordering::Relaxed);
                return Arc::clone(&st.confirmed);
            }
            replaced = !name.is_empty();
        }
        let mut identity = Vec::with_capacity(text.len() + param_types.len() + 5);
        identity.extend_from_slice(&(text.len() as u32).to_le_bytes());
        identity.extend_from_slice(text);
        identity.extend_from_slice(param_types);
        let confirmed = Confirmed::default();
        self.statements.insert(
            name,
            Statement {
                text: String::from_utf8_lossy(text).into_owned(),
                identity: Bytes::from(identity),
                plan: None,
                confirmed: Arc::clone(&confirmed),
                replaced,
                parsed_in,
            },
        );
        confirmed
    }

    /// Forgets a statement (Close, DEALLOCATE, or a SQL `PREPARE` whose text pgmemo does not
    /// key on).
    pub fn forget(&mut self, name: &[u8]) {
        self.statements.remove(name);
    }
}

/// `Close` of the unnamed statement: drops the server's unnamed statement where a Query the
/// cache answered dropped the client's (see `Session::unnamed_behind`).
pub fn close_unnamed() -> Bytes {
    Bytes::from_static(b"C\0\0\0\x06S\0")
}

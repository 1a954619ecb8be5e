//! Transaction control statements (BEGIN, COMMIT, SAVEPOINT, two-phase commit) and their modes.
//! The session tracks these to know when a pooled server connection may be released and which
//! writes to invalidate at COMMIT.

use pg_query::protobuf::{self, TransactionStmtKind};

use crate::text::{const_bool, const_str, def_elems};

/// A transaction control statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransactionCommand {
    /// `BEGIN` or `START TRANSACTION`, with the modes given there.
    Begin(TransactionModes),
    /// `COMMIT` or `END`; `chain` for `AND CHAIN` (a new transaction starts at once).
    Commit { chain: bool },
    /// `ROLLBACK` or `ABORT`; `chain` for `AND CHAIN`.
    Rollback { chain: bool },
    /// `SAVEPOINT name`.
    Savepoint { name: String },
    /// `RELEASE [SAVEPOINT] name`.
    Release { name: String },
    /// `ROLLBACK TO [SAVEPOINT] name`.
    RollbackTo { name: String },
    /// `PREPARE TRANSACTION 'gid'`: the transaction leaves the session, as if committed.
    PrepareTransaction { gid: String },
    /// `COMMIT PREPARED 'gid'`: commits a transaction that may have written anything.
    CommitPrepared { gid: String },
    /// `ROLLBACK PREPARED 'gid'`.
    RollbackPrepared { gid: String },
}

/// Transaction modes of `BEGIN`, `START TRANSACTION`, `SET TRANSACTION` and
/// `SET SESSION CHARACTERISTICS AS TRANSACTION`; `None` where the statement leaves the mode to
/// its default. Results seen under different isolation levels may differ.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransactionModes {
    /// `ISOLATION LEVEL ...`.
    pub isolation: Option<IsolationLevel>,
    /// `READ ONLY` is `Some(true)`, `READ WRITE` is `Some(false)`.
    pub read_only: Option<bool>,
    /// `DEFERRABLE` is `Some(true)`, `NOT DEFERRABLE` is `Some(false)`.
    pub deferrable: Option<bool>,
}

/// A transaction isolation level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IsolationLevel {
    ReadUncommitted,
    ReadCommitted,
    RepeatableRead,
    Serializable,
}

impl IsolationLevel {
    /// Parses the level as PostgreSQL spells it in `transaction_isolation`.
    pub fn from_setting(value: &str) -> Option<Self> {
        match value.to_ascii_lowercase().as_str() {
            "read uncommitted" => Some(Self::ReadUncommitted),
            "read committed" => Some(Self::ReadCommitted),
            "repeatable read" => Some(Self::RepeatableRead),
            "serializable" => Some(Self::Serializable),
            _ => None,
        }
    }
}

/// Reads the transaction-mode `DefElem`s that the grammar produces for all statements taking
/// transaction modes.
pub(crate) fn transaction_modes(options: &[protobuf::Node]) -> TransactionModes {
    let mut modes = TransactionModes::default();
    for def in def_elems(options) {
        let arg = def.arg.as_deref();
        match def.defname.as_str() {
            "transaction_isolation" => {
                modes.isolation = arg
                    .and_then(const_str)
                    .and_then(IsolationLevel::from_setting);
            }
            "transaction_read_only" => modes.read_only = arg.and_then(const_bool),
            "transaction_deferrable" => modes.deferrable = arg.and_then(const_bool),
            _ => {}
        }
    }
    modes
}

/// Classifies a `TransactionStmt`; `None` only for a kind this pg_query does not know.
pub(crate) fn transaction_command(stmt: &protobuf::TransactionStmt) -> Option<TransactionCommand> {
    let name = || stmt.savepoint_name.clone();
    let gid = || stmt.gid.clone();
    let chain = stmt.chain;
    let command = match stmt.kind() {
        TransactionStmtKind::Undefined => return None,
        TransactionStmtKind::TransStmtBegin | TransactionStmtKind::TransStmtStart => {
            TransactionCommand::Begin(transaction_modes(&stmt.options))
        }
        TransactionStmtKind::TransStmtCommit => TransactionCommand::Commit { chain },
        TransactionStmtKind::TransStmtRollback => TransactionCommand::Rollback { chain },
        TransactionStmtKind::TransStmtSavepoint => TransactionCommand::Savepoint { name: name() },
        TransactionStmtKind::TransStmtRelease => TransactionCommand::Release { name: name() },
        TransactionStmtKind::TransStmtRollbackTo => TransactionCommand::RollbackTo { name: name() },
        TransactionStmtKind::TransStmtPrepare => {
            TransactionCommand::PrepareTransaction { gid: gid() }
        }
        TransactionStmtKind::TransStmtCommitPrepared => {
            TransactionCommand::CommitPrepared { gid: gid() }
        }
        TransactionStmtKind::TransStmtRollbackPrepared => {
            TransactionCommand::RollbackPrepared { gid: gid() }
        }
    };
    Some(command)
}

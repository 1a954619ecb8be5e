//! Statement kinds: the first thing the router and the session look at after a cache miss, to
//! tell queries from DML, DDL and the session and transaction commands they must track.

use crate::analysis::StatementInfo;
use crate::set::SetCommand;
use crate::transaction::TransactionCommand;

/// What kind of statement this is, with the details pgmemo needs to track session state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatementKind {
    /// `SELECT` and `TABLE`, including set operations; `SELECT INTO` too (see
    /// [`StatementInfo::select_into`]).
    Select,
    Insert,
    Update,
    Delete,
    Merge,
    /// A bare `VALUES` list.
    Values,
    /// `COPY`. `from` for `COPY ... FROM` (rows come in), false for `COPY ... TO`. `stdio` when
    /// the data flows over the connection (`STDIN`/`STDOUT`) rather than through a server-side
    /// file or program, i.e. when the CopyIn/CopyOut sub-protocol follows.
    Copy {
        from: bool,
        stdio: bool,
    },
    /// `TRUNCATE`. `cascade` for `TRUNCATE ... CASCADE`, which also empties every table
    /// whose foreign keys reach a named one, whatever their ON DELETE action.
    Truncate {
        cascade: bool,
    },
    /// CREATE, ALTER, DROP, COMMENT, GRANT, REVOKE, SECURITY LABEL, REFRESH MATERIALIZED VIEW,
    /// ALTER SYSTEM and the other statements that change definitions rather than rows.
    Ddl,
    /// Transaction control.
    Transaction(TransactionCommand),
    /// A change to a run-time setting.
    Set(SetCommand),
    /// `SHOW name`; the name lower-cased (`SHOW TIME ZONE` is `timezone`, `SHOW ALL` is `all`).
    Show {
        name: String,
    },
    /// SQL-level `PREPARE name (types) AS statement`. The statement is analysed as if it stood
    /// alone; the PREPARE itself reads and writes nothing.
    Prepare {
        name: String,
        /// Parameter types as SQL text (`integer`, `varchar(10)`), one per declared parameter.
        param_types: Vec<String>,
        statement: Box<StatementInfo>,
    },
    /// `EXECUTE name (params)`. What it reads depends on the matching PREPARE, which the session
    /// must remember.
    Execute {
        name: String,
        /// Each argument expression as SQL text, deparsed (`1`, `'x'`, `now()`).
        params: Vec<String>,
    },
    /// `DEALLOCATE [PREPARE] name`, or `name: None` for `DEALLOCATE ALL`.
    Deallocate {
        name: Option<String>,
    },
    /// `DISCARD ...`: drops session state.
    Discard(DiscardKind),
    /// `LISTEN channel`: pins the session to its server connection.
    Listen {
        channel: String,
    },
    /// `UNLISTEN channel`, or `channel: None` for `UNLISTEN *`.
    Unlisten {
        channel: Option<String>,
    },
    /// `NOTIFY channel [, payload]`; an absent payload is the empty string, as in PostgreSQL.
    Notify {
        channel: String,
        payload: String,
    },
    /// `CALL procedure(...)`; the procedure is in [`StatementInfo::functions`].
    Call,
    /// `DO` block: runs code the analysis cannot see into.
    Do,
    /// `EXPLAIN [ANALYZE] statement`. The outer statement reports the inner statement's
    /// relations and functions, since its output depends on them; with `analyze` the inner
    /// statement really runs, writes included.
    Explain {
        analyze: bool,
        inner: Box<StatementInfo>,
    },
    /// `DECLARE name CURSOR ...`; `hold` for `WITH HOLD`, a cursor that outlives its transaction
    /// and so pins the session. The cursor's query is reported as this statement's reads.
    DeclareCursor {
        name: String,
        hold: bool,
    },
    /// `FETCH` from a cursor, or `MOVE` (`is_move`).
    Fetch {
        cursor: String,
        is_move: bool,
    },
    /// `CLOSE name`, or `cursor: None` for `CLOSE ALL`.
    Close {
        cursor: Option<String>,
    },
    /// `VACUUM`.
    Vacuum,
    /// `ANALYZE` (the statistics command, not `EXPLAIN ANALYZE`).
    Analyze,
    /// `LOCK [TABLE]`.
    Lock,
    /// `CHECKPOINT`.
    Checkpoint,
    /// Anything else (`CLUSTER`, `REINDEX`, `LOAD`, `SET CONSTRAINTS`, ...), by pg_query's node
    /// type name, e.g. `"ReindexStmt"`.
    Other(String),
}

/// What `DISCARD` drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DiscardKind {
    /// `DISCARD ALL`: all session state, as a pooler's reset query does.
    All,
    /// `DISCARD PLANS`: cached plans (SQL-level prepared statements survive).
    Plans,
    /// `DISCARD SEQUENCES`: cached sequence values (`currval`, `lastval`).
    Sequences,
    /// `DISCARD TEMP` / `TEMPORARY`: temporary tables.
    Temp,
}

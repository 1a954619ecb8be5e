//! The streaming-replication sub-protocol and the pgoutput logical decoding format, decoded
//! without policy.
//!
//! This is not on the query path itself but beside it: pgmemo's `invalidate::replication` opens a
//! replication connection (`replication=database`), runs `START_REPLICATION SLOT .. LOGICAL ..
//! (proto_version '1', publication_names ..)` and receives CopyData messages
//! ([`crate::backend::BackendMessage::CopyData`]). Their payloads are read here in two layers:
//!
//! - [`copy_both`]: the walsender's envelope ([`WalSenderMessage`]: XLogData or a keepalive) and
//!   the client's [`StandbyStatusUpdate`] that acknowledges progress;
//! - [`pgoutput`]: the [`LogicalMessage`] carried inside each XLogData (Begin, Relation, Insert,
//!   Commit, ...), whose relation OIDs and names tell the cache which tables changed.
//!
//! Like the rest of the crate this performs no I/O and never panics on input: malformed payloads
//! are [`WireError`](crate::WireError)s, values stay zero-copy [`bytes::Bytes`]. Deciding what a
//! change invalidates, and when to acknowledge it, is the consumer's business.

pub mod copy_both;
pub mod lsn;
pub mod pgoutput;
pub mod timestamp;
pub mod tuple;

pub use copy_both::{
    lsn_of_xlog, PrimaryKeepalive, StandbyStatusUpdate, WalSenderMessage, XLogData,
};
pub use lsn::Lsn;
pub use pgoutput::{
    Begin, Column, Commit, DataType, Delete, Insert, LogicalDecodingMessage, LogicalMessage,
    Origin, Relation, ReplicaIdentity, Truncate, Update,
};
pub use timestamp::{pg_time_to_system, system_to_pg_time, PG_EPOCH_UNIX_SECS};
pub use tuple::{OldTuple, TupleData, TupleValue};

#[cfg(test)]
mod tests;

//! The meaning of the replication stream for the cache, without I/O: the feed task hands every
//! walsender message to a [`Consumer`] and applies the [`Effect`] it returns (invalidate
//! tables, flush the database, advance the applied LSN, acknowledge).
//!
//! The rules:
//! - Tables are invalidated at Commit, not before: until then the change is invisible to other
//!   sessions, so entries depending on it are still right. The relation OIDs of the Insert,
//!   Update, Delete and Truncate messages since Begin are collected (leaf partitions, as
//!   pgoutput reports them without `publish_via_partition_root`; the cache's dependencies
//!   include partitions).
//! - A logical message with prefix `pgmemo.ddl` (see `ddl`) flushes the database and its
//!   memoized plans, at its Commit when transactional, at once otherwise.
//! - What is acknowledged (flushed) is what has been applied: the end of the last Commit, or
//!   the server's WAL end from a keepalive received between transactions: every transaction
//!   that committed before that point has been streamed and applied, so the server may recycle
//!   the WAL and the slot never holds any back because of pgmemo.

use wire::replication::{LogicalMessage, Lsn, WalSenderMessage};

/// The prefix of the logical messages that announce DDL.
pub const DDL_PREFIX: &[u8] = b"pgmemo.ddl";

/// What one message asks of the feed task.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Effect {
    /// Relation OIDs whose results must go (deduplicated).
    pub invalidate: Vec<u32>,
    /// Every result of the database and its memoized plans must go (DDL).
    pub flush_database: bool,
    /// Every commit up to here has been applied: advance the gate and acknowledge it.
    pub applied: Option<Lsn>,
    /// The server asked for a status update now.
    pub reply_now: bool,
    /// A transaction's Commit was processed.
    pub committed: bool,
    /// That Commit's time on the upstream (µs since 2000-01-01), for the staleness histogram.
    pub commit_time: Option<i64>,
    /// A publication was altered or dropped (this DDL message's command tag): the stream
    /// may no longer carry every write, and is to be made again, which checks the
    /// publication anew.
    pub publication_changed: Option<String>,
}

/// A transaction's written tables are first made distinct at this many entries.
const MIN_DISTINCT_AT: usize = 1024;

/// Follows one stream from its start position.
#[derive(Debug, Clone)]
pub struct Consumer {
    in_transaction: bool,
    written: Vec<u32>,
    /// `written`'s length at which it is next made distinct (see `note_written`).
    distinct_at: usize,
    ddl: bool,
    /// The command tag of a publication's DDL in the transaction in progress.
    publication_ddl: Option<String>,
    received: Lsn,
    applied: Lsn,
    /// See [`Consumer::relations_mean_ddl`].
    relations_mean_ddl: bool,
}

impl Consumer {
    /// A consumer for a stream starting at `start` (the slot's consistent point: everything
    /// before it was flushed when the stream was established).
    pub fn new(start: Lsn) -> Consumer {
        Consumer {
            in_transaction: false,
            written: Vec::new(),
            distinct_at: MIN_DISTINCT_AT,
            ddl: false,
            publication_ddl: None,
            received: start,
            applied: start,
            relations_mean_ddl: false,
        }
    }

    /// Without the feed's DDL messages (no event trigger: the feed's role is no superuser),
    /// Relation messages are the stream's only sign of DDL. pgoutput sends one before the
    /// first change of a relation in the stream and again after its definition changed: a
    /// relation new to the stream may be a partition just created or a table created again
    /// (new OIDs that memoized plans and stored results do not know), one sent again was
    /// altered. With `on`, each flushes the database and its plans at its transaction's
    /// Commit, like a DDL message.
    pub fn relations_mean_ddl(mut self, on: bool) -> Consumer {
        self.relations_mean_ddl = on;
        self
    }

    /// Furthest position received.
    pub fn received(&self) -> Lsn {
        self.received
    }

    /// Furthest position applied: what a status update reports as flushed.
    pub fn applied(&self) -> Lsn {
        self.applied
    }

    /// Reads one walsender message.
    pub fn on_message(&mut self, msg: WalSenderMessage) -> Result<Effect, wire::WireError> {
        match msg {
            WalSenderMessage::PrimaryKeepalive(k) => {
                self.received = self.received.max(k.wal_end);
                let mut effect = Effect {
                    reply_now: k.reply_requested,
                    ..Effect::default()
                };
                if !self.in_transaction && k.wal_end > self.applied {
                    self.applied = k.wal_end;
                    effect.applied = Some(k.wal_end);
                }
                Ok(effect)
            }
            WalSenderMessage::XLogData(x) => {
                self.received = self.received.max(wire::replication::lsn_of_xlog(&x));
                self.on_logical(LogicalMessage::decode(x.data)?)
            }
        }
    }

    /// Adds the tables a change wrote to the transaction's. A bulk UPDATE sends one change
    /// per row, mostly of the same table: a repeat of the last table is skipped, and the list
    /// is made distinct again whenever it doubles, so it stays about as long as the number of
    /// tables rather than of rows.
    fn note_written(&mut self, oids: &[u32]) {
        for &oid in oids {
            if self.written.last() != Some(&oid) {
                self.written.push(oid);
            }
        }
        if self.written.len() >= self.distinct_at {
            self.written.sort_unstable();
            self.written.dedup();
            self.distinct_at = (2 * self.written.len()).max(MIN_DISTINCT_AT);
        }
    }

    fn on_logical(&mut self, msg: LogicalMessage) -> Result<Effect, wire::WireError> {
        let mut effect = Effect::default();
        match &msg {
            LogicalMessage::Begin(_) => {
                self.in_transaction = true;
                self.written.clear();
                self.distinct_at = MIN_DISTINCT_AT;
                self.ddl = false;
                self.publication_ddl = None;
            }
            LogicalMessage::Commit(c) => {
                self.in_transaction = false;
                let mut oids = std::mem::take(&mut self.written);
                oids.sort_unstable();
                oids.dedup();
                effect.invalidate = oids;
                effect.flush_database = std::mem::take(&mut self.ddl);
                effect.publication_changed = self.publication_ddl.take();
                effect.committed = true;
                effect.commit_time = Some(c.commit_time);
                let end = c.end_lsn.max(c.commit_lsn);
                if end > self.applied {
                    self.applied = end;
                }
                effect.applied = Some(self.applied);
            }
            LogicalMessage::Relation(_) if self.relations_mean_ddl => {
                if self.in_transaction {
                    self.ddl = true;
                } else {
                    effect.flush_database = true;
                }
            }
            LogicalMessage::Message(m) if m.prefix.as_ref() == DDL_PREFIX => {
                let publication = m
                    .content
                    .ends_with(b" PUBLICATION")
                    .then(|| String::from_utf8_lossy(&m.content).into_owned());
                if self.in_transaction {
                    self.ddl = true;
                    self.publication_ddl = self.publication_ddl.take().or(publication);
                } else {
                    effect.flush_database = true;
                    effect.publication_changed = publication;
                }
            }
            LogicalMessage::Unsupported { tag, .. } => {
                // Not of the protocol version asked for: the stream can no longer be followed.
                return Err(wire::WireError::UnexpectedTag(*tag));
            }
            other => {
                let written = other.written_relations();
                if !written.is_empty() {
                    if self.in_transaction {
                        self.note_written(written);
                    } else {
                        // pgoutput only sends changes inside Begin..Commit; be safe anyway.
                        effect.invalidate = written.to_vec();
                    }
                }
            }
        }
        Ok(effect)
    }
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use wire::replication::{
        Begin, Commit, Delete, Insert, LogicalDecodingMessage, OldTuple, PrimaryKeepalive,
        Truncate, TupleData, XLogData,
    };

    use super::*;

    fn xlog(msg: LogicalMessage, lsn: u64) -> WalSenderMessage {
        let mut body = BytesMut::new();
        msg.encode(&mut body);
        WalSenderMessage::XLogData(XLogData {
            wal_start: Lsn(lsn),
            wal_end: Lsn(lsn),
            send_time: 0,
            data: body.freeze(),
        })
    }

    fn keepalive(wal_end: u64, reply: bool) -> WalSenderMessage {
        WalSenderMessage::PrimaryKeepalive(PrimaryKeepalive {
            wal_end: Lsn(wal_end),
            send_time: 0,
            reply_requested: reply,
        })
    }

    fn begin() -> LogicalMessage {
        LogicalMessage::Begin(Begin {
            final_lsn: Lsn(0),
            commit_time: 0,
            xid: 7,
        })
    }

    fn commit(end: u64) -> LogicalMessage {
        LogicalMessage::Commit(Commit {
            flags: 0,
            commit_lsn: Lsn(end - 8),
            end_lsn: Lsn(end),
            commit_time: 0,
        })
    }

    fn insert(relation: u32) -> LogicalMessage {
        LogicalMessage::Insert(Insert {
            relation,
            new: TupleData { values: Vec::new() },
        })
    }

    fn ddl_message(transactional: bool) -> LogicalMessage {
        LogicalMessage::Message(LogicalDecodingMessage {
            flags: u8::from(transactional),
            lsn: Lsn(0),
            prefix: Bytes::from_static(DDL_PREFIX),
            content: Bytes::from_static(b"ALTER TABLE"),
        })
    }

    #[test]
    fn tables_are_invalidated_at_commit_deduplicated() {
        let mut c = Consumer::new(Lsn(100));
        assert_eq!(c.on_message(xlog(begin(), 110)).unwrap(), Effect::default());
        for oid in [16384, 16390, 16384] {
            let e = c.on_message(xlog(insert(oid), 120)).unwrap();
            assert!(e.invalidate.is_empty(), "nothing before the commit");
        }
        let del = LogicalMessage::Delete(Delete {
            relation: 16395,
            old: OldTuple::Key(TupleData { values: Vec::new() }),
        });
        c.on_message(xlog(del, 125)).unwrap();
        let trunc = LogicalMessage::Truncate(Truncate {
            options: 0,
            relations: vec![16390, 16400],
        });
        c.on_message(xlog(trunc, 126)).unwrap();
        let e = c.on_message(xlog(commit(200), 200)).unwrap();
        assert_eq!(e.invalidate, vec![16384, 16390, 16395, 16400]);
        assert_eq!(e.applied, Some(Lsn(200)));
        assert!(e.committed && !e.flush_database);
        assert_eq!(c.applied(), Lsn(200));
        let e = c
            .on_message(xlog(begin(), 210))
            .and_then(|_| c.on_message(xlog(commit(220), 220)))
            .unwrap();
        assert!(e.invalidate.is_empty(), "a new transaction starts empty");
    }

    #[test]
    fn without_ddl_messages_a_relation_message_flushes_at_commit() {
        let relation = || {
            LogicalMessage::Relation(wire::replication::Relation {
                oid: 16500,
                namespace: Bytes::from_static(b"public"),
                name: Bytes::from_static(b"p_2026"),
                replica_identity: wire::replication::ReplicaIdentity::Default,
                columns: Vec::new(),
            })
        };
        for (watch, flush) in [(true, true), (false, false)] {
            let mut c = Consumer::new(Lsn(100)).relations_mean_ddl(watch);
            c.on_message(xlog(begin(), 110)).unwrap();
            let e = c.on_message(xlog(relation(), 115)).unwrap();
            assert!(!e.flush_database, "not before the commit");
            c.on_message(xlog(insert(16500), 120)).unwrap();
            let e = c.on_message(xlog(commit(200), 200)).unwrap();
            assert_eq!(e.flush_database, flush, "watching relations: {watch}");
            assert_eq!(e.invalidate, vec![16500]);
        }
    }

    #[test]
    fn a_bulk_write_keeps_a_list_as_long_as_its_tables() {
        let mut c = Consumer::new(Lsn(100));
        c.on_message(xlog(begin(), 110)).unwrap();
        // A million rows over three tables, interleaved as a trigger would write them.
        for row in 0..1_000_000u32 {
            c.on_message(xlog(insert(16384 + row % 3), 120)).unwrap();
            assert!(c.written.len() < 2 * MIN_DISTINCT_AT, "row {row}");
        }
        let e = c.on_message(xlog(commit(200), 200)).unwrap();
        assert_eq!(e.invalidate, vec![16384, 16385, 16386]);
    }

    #[test]
    fn keepalives_advance_only_between_transactions() {
        let mut c = Consumer::new(Lsn(100));
        let e = c.on_message(keepalive(150, false)).unwrap();
        assert_eq!(e.applied, Some(Lsn(150)));
        assert!(!e.reply_now);
        c.on_message(xlog(begin(), 160)).unwrap();
        c.on_message(xlog(insert(1), 170)).unwrap();
        let e = c.on_message(keepalive(300, true)).unwrap();
        assert_eq!(
            e.applied, None,
            "inside a transaction nothing is applied yet"
        );
        assert!(e.reply_now);
        assert_eq!(c.applied(), Lsn(150));
        assert_eq!(c.received(), Lsn(300));
        let e = c.on_message(xlog(commit(250), 250)).unwrap();
        assert_eq!(e.applied, Some(Lsn(250)));
        let e = c.on_message(keepalive(120, false)).unwrap();
        assert_eq!(e.applied, None, "never backwards");
    }

    #[test]
    fn ddl_messages_flush_the_database() {
        let mut c = Consumer::new(Lsn(1));
        c.on_message(xlog(begin(), 10)).unwrap();
        let e = c.on_message(xlog(ddl_message(true), 11)).unwrap();
        assert!(!e.flush_database, "transactional: at commit");
        assert!(c.on_message(xlog(commit(20), 20)).unwrap().flush_database);
        assert!(
            c.on_message(xlog(ddl_message(false), 21))
                .unwrap()
                .flush_database
        );
        let other = LogicalMessage::Message(LogicalDecodingMessage {
            flags: 0,
            lsn: Lsn(0),
            prefix: Bytes::from_static(b"someone.else"),
            content: Bytes::new(),
        });
        assert!(!c.on_message(xlog(other, 22)).unwrap().flush_database);
    }

    #[test]
    fn malformed_data_is_an_error() {
        let mut c = Consumer::new(Lsn(1));
        let bad = WalSenderMessage::XLogData(XLogData {
            wal_start: Lsn(2),
            wal_end: Lsn(2),
            send_time: 0,
            data: Bytes::from_static(b"C"),
        });
        assert!(c.on_message(bad).is_err());
    }
}

//! The pgoutput logical decoding format, protocol version 1: the messages carried one per
//! XLogData when a client runs `START_REPLICATION SLOT s LOGICAL l (proto_version '1', ..)`.
//!
//! This is what the replication consumer learns writes from: Relation maps an OID to a table
//! name, Insert/Update/Delete/Truncate name the OIDs written, Begin/Commit delimit transactions
//! and carry the LSNs to acknowledge. Messages of later protocol versions (streaming of large
//! transactions, two-phase commit) are reported as [`LogicalMessage::Unsupported`], not decoded,
//! because under version 1 the server never sends them.

use bytes::{BufMut, Bytes, BytesMut};

use super::lsn::Lsn;
use super::tuple::{self, OldTuple, TupleData};
use crate::buf::{as_text, put_cbytes, put_count, put_value, BodyReader};
use crate::frame::WireError;

/// First byte of each pgoutput message.
pub mod tag {
    /// [`super::Begin`].
    pub const BEGIN: u8 = b'B';
    /// [`super::Commit`].
    pub const COMMIT: u8 = b'C';
    /// [`super::Origin`].
    pub const ORIGIN: u8 = b'O';
    /// [`super::Relation`].
    pub const RELATION: u8 = b'R';
    /// [`super::DataType`].
    pub const TYPE: u8 = b'Y';
    /// [`super::Insert`].
    pub const INSERT: u8 = b'I';
    /// [`super::Update`].
    pub const UPDATE: u8 = b'U';
    /// [`super::Delete`].
    pub const DELETE: u8 = b'D';
    /// [`super::Truncate`].
    pub const TRUNCATE: u8 = b'T';
    /// [`super::LogicalDecodingMessage`].
    pub const MESSAGE: u8 = b'M';
    /// Messages of protocol versions 2 (streaming: `S`, `E`, `c`, `A`) and 3 (two-phase commit:
    /// `b`, `P`, `K`, `r`, `p`), known but not decoded.
    pub const LATER_VERSIONS: &[u8] = b"SEcAbPKrp";
}

/// One pgoutput message. [`LogicalMessage::encode`] writes back exactly what
/// [`LogicalMessage::decode`] read, so a test server can replay decoded streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogicalMessage {
    /// `'B'`: a transaction starts.
    Begin(Begin),
    /// `'C'`: the transaction committed.
    Commit(Commit),
    /// `'O'`: the transaction came from another replication origin.
    Origin(Origin),
    /// `'R'`: the OID, name and columns of a relation changed later.
    Relation(Relation),
    /// `'Y'`: a non-builtin column type.
    Type(DataType),
    /// `'I'`: a row inserted.
    Insert(Insert),
    /// `'U'`: a row updated.
    Update(Update),
    /// `'D'`: a row deleted.
    Delete(Delete),
    /// `'T'`: relations truncated.
    Truncate(Truncate),
    /// `'M'`: a `pg_logical_emit_message` message.
    Message(LogicalDecodingMessage),
    /// A message of a later protocol version, kept undecoded: a consumer that did not ask for
    /// that version can treat it as "lost track" rather than fail to parse the stream.
    Unsupported { tag: u8, body: Bytes },
}

/// Start of a transaction; the changes up to the matching [`Commit`] belong to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begin {
    /// The final LSN of the transaction (its commit record).
    pub final_lsn: Lsn,
    /// Commit time, µs since 2000-01-01.
    pub commit_time: i64,
    /// The transaction id.
    pub xid: u32,
}

/// End of a transaction: its changes are committed, and `end_lsn` is the position to
/// acknowledge once they have been acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    /// Currently unused (0); kept for round trips.
    pub flags: u8,
    /// The LSN of the commit record.
    pub commit_lsn: Lsn,
    /// The end LSN of the transaction.
    pub end_lsn: Lsn,
    /// Commit time, µs since 2000-01-01.
    pub commit_time: i64,
}

/// The transaction was replicated into this server from another origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The LSN of the commit on the origin server.
    pub commit_lsn: Lsn,
    /// The origin's name.
    pub name: Bytes,
}

/// Describes a relation before the first change to it in a session (and again after its schema
/// changed): the only place that maps the OIDs of later changes to a table name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// The relation's OID, as later changes name it.
    pub oid: u32,
    /// The schema; empty for `pg_catalog` (see [`Relation::namespace_str`]).
    pub namespace: Bytes,
    /// The relation name.
    pub name: Bytes,
    /// Which old values Update and Delete carry.
    pub replica_identity: ReplicaIdentity,
    /// The published columns (generated columns excepted), in TupleData order.
    pub columns: Vec<Column>,
}

/// `pg_class.relreplident`: what the old-row image of an Update or Delete contains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaIdentity {
    /// `'d'`: the primary key columns.
    Default,
    /// `'n'`: nothing.
    Nothing,
    /// `'f'`: all columns.
    Full,
    /// `'i'`: the columns of a chosen unique index.
    Index,
}

/// One column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// 1 if the column is part of the replica identity key, else 0; see [`Column::is_key`].
    pub flags: u8,
    /// The column name.
    pub name: Bytes,
    /// The OID of the column's type.
    pub type_oid: u32,
    /// The type modifier (`atttypmod`), -1 when none.
    pub type_modifier: i32,
}

/// Describes a non-builtin type used by a following Relation (`'Y'`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataType {
    /// The type's OID.
    pub oid: u32,
    /// The type's schema; empty for `pg_catalog`.
    pub namespace: Bytes,
    /// The type's name.
    pub name: Bytes,
}

/// A row was inserted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert {
    /// The OID of the relation written, described by an earlier [`Relation`].
    pub relation: u32,
    /// The new row.
    pub new: TupleData,
}

/// A row was updated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// The OID of the relation written.
    pub relation: u32,
    /// The old row, present when the key changed or the identity is FULL.
    pub old: Option<OldTuple>,
    /// The new row.
    pub new: TupleData,
}

/// A row was deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    /// The OID of the relation written.
    pub relation: u32,
    /// The old row's key, or the whole old row.
    pub old: OldTuple,
}

/// One TRUNCATE statement, possibly over several relations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncate {
    /// Option bits: [`Truncate::CASCADE`], [`Truncate::RESTART_IDENTITY`].
    pub options: u8,
    /// The OIDs of the relations truncated.
    pub relations: Vec<u32>,
}

/// A message written with `pg_logical_emit_message` (sent when the subscriber asked for
/// `messages 'true'`), e.g. a marker a test or an application puts in the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicalDecodingMessage {
    /// 1 if the message is transactional, else 0; see
    /// [`LogicalDecodingMessage::is_transactional`].
    pub flags: u8,
    /// The LSN of the message.
    pub lsn: Lsn,
    /// The prefix given to `pg_logical_emit_message`.
    pub prefix: Bytes,
    /// The content.
    pub content: Bytes,
}

impl LogicalMessage {
    /// Decodes one pgoutput version 1 message: the `data` of an XLogData. Truncation, bad counts,
    /// bad marker bytes and trailing bytes are errors; an unknown first byte is
    /// [`WireError::UnexpectedTag`]; tags of later versions give [`LogicalMessage::Unsupported`].
    pub fn decode(data: Bytes) -> Result<LogicalMessage, WireError> {
        use LogicalMessage as M;
        let mut r = BodyReader::new(data);
        let tag = r.u8()?;
        let msg = match tag {
            tag::BEGIN => M::Begin(Begin {
                final_lsn: Lsn(r.u64()?),
                commit_time: r.i64()?,
                xid: r.u32()?,
            }),
            tag::COMMIT => M::Commit(Commit {
                flags: r.u8()?,
                commit_lsn: Lsn(r.u64()?),
                end_lsn: Lsn(r.u64()?),
                commit_time: r.i64()?,
            }),
            tag::ORIGIN => M::Origin(Origin {
                commit_lsn: Lsn(r.u64()?),
                name: r.cstr()?,
            }),
            tag::RELATION => M::Relation(Relation::decode(&mut r)?),
            tag::TYPE => M::Type(DataType {
                oid: r.u32()?,
                namespace: r.cstr()?,
                name: r.cstr()?,
            }),
            tag::INSERT => M::Insert(Insert {
                relation: r.u32()?,
                new: new_tuple(r.u8()?, &mut r)?,
            }),
            tag::UPDATE => M::Update(Update::decode(&mut r)?),
            tag::DELETE => M::Delete(Delete {
                relation: r.u32()?,
                old: OldTuple::decode(r.u8()?, &mut r)?,
            }),
            tag::TRUNCATE => M::Truncate(Truncate::decode(&mut r)?),
            tag::MESSAGE => M::Message(LogicalDecodingMessage {
                flags: r.u8()?,
                lsn: Lsn(r.u64()?),
                prefix: r.cstr()?,
                content: r
                    .value()?
                    .ok_or(WireError::Malformed("NULL message content"))?,
            }),
            t if tag::LATER_VERSIONS.contains(&t) => M::Unsupported {
                tag: t,
                body: r.rest(),
            },
            other => return Err(WireError::UnexpectedTag(other)),
        };
        r.finish("trailing bytes after pgoutput message")?;
        Ok(msg)
    }

    /// Appends the message as a walsender puts it in XLogData (no framing of its own).
    ///
    /// # Panics
    /// Only for values the protocol cannot express: more than 65535 columns, a value or content
    /// longer than `i32::MAX` bytes, more than `u32::MAX` truncated relations, or (in debug
    /// builds) a NUL byte inside a name.
    pub fn encode(&self, out: &mut BytesMut) {
        use LogicalMessage as M;
        out.put_u8(self.tag());
        match self {
            M::Begin(m) => {
                out.put_u64(m.final_lsn.0);
                out.put_i64(m.commit_time);
                out.put_u32(m.xid);
            }
            M::Commit(m) => {
                out.put_u8(m.flags);
                out.put_u64(m.commit_lsn.0);
                out.put_u64(m.end_lsn.0);
                out.put_i64(m.commit_time);
            }
            M::Origin(m) => {
                out.put_u64(m.commit_lsn.0);
                put_cbytes(out, &m.name);
            }
            M::Relation(m) => m.encode(out),
            M::Type(m) => {
                out.put_u32(m.oid);
                put_cbytes(out, &m.namespace);
                put_cbytes(out, &m.name);
            }
            M::Insert(m) => {
                out.put_u32(m.relation);
                out.put_u8(tuple::tag::NEW);
                m.new.encode(out);
            }
            M::Update(m) => {
                out.put_u32(m.relation);
                if let Some(old) = &m.old {
                    old.encode(out);
                }
                out.put_u8(tuple::tag::NEW);
                m.new.encode(out);
            }
            M::Delete(m) => {
                out.put_u32(m.relation);
                m.old.encode(out);
            }
            M::Truncate(m) => m.encode(out),
            M::Message(m) => {
                out.put_u8(m.flags);
                out.put_u64(m.lsn.0);
                put_cbytes(out, &m.prefix);
                put_value(out, Some(&m.content));
            }
            M::Unsupported { body, .. } => out.extend_from_slice(body),
        }
    }

    /// The message's first byte.
    pub fn tag(&self) -> u8 {
        use LogicalMessage as M;
        match self {
            M::Begin(_) => tag::BEGIN,
            M::Commit(_) => tag::COMMIT,
            M::Origin(_) => tag::ORIGIN,
            M::Relation(_) => tag::RELATION,
            M::Type(_) => tag::TYPE,
            M::Insert(_) => tag::INSERT,
            M::Update(_) => tag::UPDATE,
            M::Delete(_) => tag::DELETE,
            M::Truncate(_) => tag::TRUNCATE,
            M::Message(_) => tag::MESSAGE,
            M::Unsupported { tag, .. } => *tag,
        }
    }

    /// The OIDs of the relations whose rows this message changes (Insert, Update, Delete,
    /// Truncate), empty for every other message: what a consumer maps to tables to invalidate.
    pub fn written_relations(&self) -> &[u32] {
        match self {
            LogicalMessage::Insert(m) => std::slice::from_ref(&m.relation),
            LogicalMessage::Update(m) => std::slice::from_ref(&m.relation),
            LogicalMessage::Delete(m) => std::slice::from_ref(&m.relation),
            LogicalMessage::Truncate(m) => &m.relations,
            _ => &[],
        }
    }
}

/// Reads the `'N'` marker and the new tuple of an Insert or Update.
fn new_tuple(marker: u8, r: &mut BodyReader) -> Result<TupleData, WireError> {
    if marker != tuple::tag::NEW {
        return Err(WireError::Malformed("expected new tuple marker 'N'"));
    }
    TupleData::decode(r)
}

impl Relation {
    fn decode(r: &mut BodyReader) -> Result<Relation, WireError> {
        let oid = r.u32()?;
        let namespace = r.cstr()?;
        let name = r.cstr()?;
        let replica_identity = ReplicaIdentity::from_byte(r.u8()?)?;
        let n = r.count()?;
        // Each column takes at least 10 bytes (flags, name terminator, type, modifier).
        let mut columns = Vec::with_capacity(n.min(r.remaining() / 10));
        for _ in 0..n {
            columns.push(Column {
                flags: r.u8()?,
                name: r.cstr()?,
                type_oid: r.u32()?,
                type_modifier: r.i32()?,
            });
        }
        Ok(Relation {
            oid,
            namespace,
            name,
            replica_identity,
            columns,
        })
    }

    fn encode(&self, out: &mut BytesMut) {
        out.put_u32(self.oid);
        put_cbytes(out, &self.namespace);
        put_cbytes(out, &self.name);
        out.put_u8(self.replica_identity.as_byte());
        put_count(out, self.columns.len());
        for c in &self.columns {
            out.put_u8(c.flags);
            put_cbytes(out, &c.name);
            out.put_u32(c.type_oid);
            out.put_i32(c.type_modifier);
        }
    }

    /// The schema name when it is UTF-8, with the empty namespace pgoutput sends for
    /// `pg_catalog` spelled out.
    pub fn namespace_str(&self) -> Option<&str> {
        if self.namespace.is_empty() {
            Some("pg_catalog")
        } else {
            as_text(&self.namespace)
        }
    }

    /// The relation name when it is UTF-8.
    pub fn name_str(&self) -> Option<&str> {
        as_text(&self.name)
    }
}

impl ReplicaIdentity {
    /// Reads a `relreplident` byte; other values are not a pgoutput Relation.
    pub fn from_byte(b: u8) -> Result<ReplicaIdentity, WireError> {
        match b {
            b'd' => Ok(ReplicaIdentity::Default),
            b'n' => Ok(ReplicaIdentity::Nothing),
            b'f' => Ok(ReplicaIdentity::Full),
            b'i' => Ok(ReplicaIdentity::Index),
            _ => Err(WireError::Malformed("unknown replica identity")),
        }
    }

    /// The `relreplident` byte.
    pub fn as_byte(self) -> u8 {
        match self {
            ReplicaIdentity::Default => b'd',
            ReplicaIdentity::Nothing => b'n',
            ReplicaIdentity::Full => b'f',
            ReplicaIdentity::Index => b'i',
        }
    }
}

impl Column {
    /// Whether the column belongs to the replica identity key, i.e. is sent in `'K'` old tuples.
    pub fn is_key(&self) -> bool {
        self.flags & 1 != 0
    }

    /// The column name when it is UTF-8.
    pub fn name_str(&self) -> Option<&str> {
        as_text(&self.name)
    }
}

impl Update {
    fn decode(r: &mut BodyReader) -> Result<Update, WireError> {
        let relation = r.u32()?;
        let (old, marker) = match r.u8()? {
            m @ (tuple::tag::KEY | tuple::tag::OLD) => (Some(OldTuple::decode(m, r)?), r.u8()?),
            m => (None, m),
        };
        Ok(Update {
            relation,
            old,
            new: new_tuple(marker, r)?,
        })
    }
}

impl Truncate {
    /// `TRUNCATE .. CASCADE`.
    pub const CASCADE: u8 = 1;
    /// `TRUNCATE .. RESTART IDENTITY`.
    pub const RESTART_IDENTITY: u8 = 2;

    fn decode(r: &mut BodyReader) -> Result<Truncate, WireError> {
        let n = r.u32()?;
        let options = r.u8()?;
        // Check the count against the bytes present before allocating for it.
        if u64::from(n) * 4 > r.remaining() as u64 {
            return Err(WireError::Truncated);
        }
        let relations = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
        Ok(Truncate { options, relations })
    }

    fn encode(&self, out: &mut BytesMut) {
        let n = u32::try_from(self.relations.len()).expect("more than u32::MAX relations");
        out.put_u32(n);
        out.put_u8(self.options);
        for &oid in &self.relations {
            out.put_u32(oid);
        }
    }

    /// Whether the truncate cascaded to referencing tables (which are listed too).
    pub fn cascade(&self) -> bool {
        self.options & Self::CASCADE != 0
    }

    /// Whether sequences owned by the columns were reset.
    pub fn restart_identity(&self) -> bool {
        self.options & Self::RESTART_IDENTITY != 0
    }
}

impl LogicalDecodingMessage {
    /// Whether the message was emitted inside a transaction (and so arrives between its Begin and
    /// Commit, only if it committed) rather than immediately.
    pub fn is_transactional(&self) -> bool {
        self.flags & 1 != 0
    }

    /// The prefix when it is UTF-8.
    pub fn prefix_str(&self) -> Option<&str> {
        as_text(&self.prefix)
    }
}

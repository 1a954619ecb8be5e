//! TupleData, the row images inside pgoutput's Insert, Update and Delete messages.
//!
//! The replication consumer mostly needs only the relation a change touched, but key values let
//! it be finer later (and a test server must be able to send rows), so values are kept as
//! zero-copy `Bytes` in whatever format the server chose.

use bytes::{BufMut, Bytes, BytesMut};

use crate::buf::{put_count, BodyReader};
use crate::frame::WireError;

/// Column kind bytes of TupleData and the markers that introduce a tuple.
pub mod tag {
    /// NULL value.
    pub const NULL: u8 = b'n';
    /// An unchanged TOASTed value whose content is not sent.
    pub const UNCHANGED_TOAST: u8 = b'u';
    /// A value in text format.
    pub const TEXT: u8 = b't';
    /// A value in binary format (subscription option `binary`, PostgreSQL 14+).
    pub const BINARY: u8 = b'b';
    /// The new row of an Insert or Update.
    pub const NEW: u8 = b'N';
    /// The old row's replica identity key columns.
    pub const KEY: u8 = b'K';
    /// The whole old row (`REPLICA IDENTITY FULL`).
    pub const OLD: u8 = b'O';
}

/// One column of a row image. Unchanged TOAST values are distinct from NULL: the column has a
/// value, the server just did not resend it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TupleValue {
    /// SQL NULL (`'n'`).
    Null,
    /// An unchanged TOASTed value, not sent (`'u'`).
    UnchangedToast,
    /// A value in text format (`'t'`).
    Text(Bytes),
    /// A value in binary format (`'b'`).
    Binary(Bytes),
}

impl TupleValue {
    /// The value's bytes when they were sent, in either format.
    pub fn bytes(&self) -> Option<&Bytes> {
        match self {
            TupleValue::Text(b) | TupleValue::Binary(b) => Some(b),
            TupleValue::Null | TupleValue::UnchangedToast => None,
        }
    }
}

/// A row image: one value per column of the relation, in the order of its Relation message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TupleData {
    /// The columns, in relation order.
    pub values: Vec<TupleValue>,
}

/// The old row sent with an Update or Delete, whose extent depends on the table's replica
/// identity: only the key columns, or the whole row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldTuple {
    /// `'K'`: the replica identity key columns (other columns are NULL).
    Key(TupleData),
    /// `'O'`: the whole old row (`REPLICA IDENTITY FULL`).
    Full(TupleData),
}

impl OldTuple {
    /// The row image, whichever kind it is.
    pub fn tuple(&self) -> &TupleData {
        match self {
            OldTuple::Key(t) | OldTuple::Full(t) => t,
        }
    }

    /// Reads the tuple after its marker byte `marker` (`'K'` or `'O'`).
    pub(crate) fn decode(marker: u8, r: &mut BodyReader) -> Result<OldTuple, WireError> {
        match marker {
            tag::KEY => Ok(OldTuple::Key(TupleData::decode(r)?)),
            tag::OLD => Ok(OldTuple::Full(TupleData::decode(r)?)),
            _ => Err(WireError::Malformed(
                "old tuple marker is neither 'K' nor 'O'",
            )),
        }
    }

    /// Appends the marker byte and the tuple.
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        let (marker, t) = match self {
            OldTuple::Key(t) => (tag::KEY, t),
            OldTuple::Full(t) => (tag::OLD, t),
        };
        out.put_u8(marker);
        t.encode(out);
    }
}

impl TupleData {
    /// Reads an Int16 column count then each column.
    pub(crate) fn decode(r: &mut BodyReader) -> Result<TupleData, WireError> {
        let n = r.count()?;
        // Each column takes at least its kind byte: cap the allocation by what is there.
        let mut values = Vec::with_capacity(n.min(r.remaining()));
        for _ in 0..n {
            values.push(match r.u8()? {
                tag::NULL => TupleValue::Null,
                tag::UNCHANGED_TOAST => TupleValue::UnchangedToast,
                tag::TEXT => TupleValue::Text(sized(r)?),
                tag::BINARY => TupleValue::Binary(sized(r)?),
                _ => return Err(WireError::Malformed("unknown TupleData column kind")),
            });
        }
        Ok(TupleData { values })
    }

    /// Appends the column count then each column.
    ///
    /// # Panics
    /// If there are more than 65535 columns or a value is longer than `i32::MAX` bytes, which the
    /// protocol cannot express.
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        put_count(out, self.values.len());
        for v in &self.values {
            match v {
                TupleValue::Null => out.put_u8(tag::NULL),
                TupleValue::UnchangedToast => out.put_u8(tag::UNCHANGED_TOAST),
                TupleValue::Text(b) => put_sized(out, tag::TEXT, b),
                TupleValue::Binary(b) => put_sized(out, tag::BINARY, b),
            }
        }
    }
}

/// An Int32 length then that many bytes.
fn sized(r: &mut BodyReader) -> Result<Bytes, WireError> {
    let len = r.i32()?;
    let len = usize::try_from(len).map_err(|_| WireError::Malformed("negative value length"))?;
    r.take(len)
}

fn put_sized(out: &mut BytesMut, kind: u8, b: &[u8]) {
    out.put_u8(kind);
    out.put_i32(i32::try_from(b.len()).expect("tuple value longer than 2 GiB"));
    out.extend_from_slice(b);
}

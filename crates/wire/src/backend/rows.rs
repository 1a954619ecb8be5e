//! Result messages of a query: ParameterDescription, RowDescription, DataRow, CommandComplete and
//! the fast-path FunctionCallResponse.
//!
//! On the query path these flow from the server back to the client. The cache captures them and
//! replays them untouched, so [`DataRow`] keeps its body as received and only offers a view over
//! the columns; the other messages are small and decoded into fields for the session and cache
//! (result shape, row counts).

use bytes::{BufMut, Bytes, BytesMut};

use super::tag;
use crate::buf::{as_text, put_cbytes, put_count, put_message, put_value, BodyReader};
use crate::frame::WireError;

/// ParameterDescription: the parameter types the server inferred for a statement, sent in answer
/// to Describe of a statement. A pooler replays it when it answers Describe from its own cache.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParameterDescription {
    /// One type OID per parameter.
    pub types: Vec<u32>,
}

impl ParameterDescription {
    /// Decodes a ParameterDescription body.
    pub fn decode(body: Bytes) -> Result<ParameterDescription, WireError> {
        let mut r = BodyReader::new(body);
        let types = r.u32_array()?;
        r.finish("trailing bytes after ParameterDescription")?;
        Ok(ParameterDescription { types })
    }

    /// Appends the ParameterDescription frame to `out`.
    ///
    /// # Panics
    /// If there are more than 65535 types.
    pub fn encode(&self, out: &mut BytesMut) {
        put_message(out, tag::PARAMETER_DESCRIPTION, |b| {
            put_count(b, self.types.len());
            for &oid in &self.types {
                b.put_u32(oid);
            }
        });
    }
}

/// One column of a RowDescription.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldDescription {
    /// Column name in the client's encoding.
    pub name: Bytes,
    /// OID of the table the column comes from, or 0.
    pub table_oid: u32,
    /// Attribute number of the column in that table, or 0.
    pub column: i16,
    /// OID of the column's data type.
    pub type_oid: u32,
    /// `pg_type.typlen`; negative for variable-width types.
    pub type_size: i16,
    /// `pg_attribute.atttypmod`; type-specific, -1 when none.
    pub type_modifier: i32,
    /// Format code of the column's values: 0 text, 1 binary.
    pub format: i16,
}

impl FieldDescription {
    /// The column name when it is UTF-8.
    pub fn name_str(&self) -> Option<&str> {
        as_text(&self.name)
    }
}

/// RowDescription: the shape of the rows that follow. Part of a cached result, and what the
/// session needs to know a statement returns rows at all.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RowDescription {
    /// The columns, in order.
    pub fields: Vec<FieldDescription>,
}

impl RowDescription {
    /// Decodes a RowDescription body.
    pub fn decode(body: Bytes) -> Result<RowDescription, WireError> {
        /// Smallest encoded field: an empty name's NUL plus 18 bytes of fixed fields.
        const MIN_FIELD: usize = 19;
        let mut r = BodyReader::new(body);
        let n = r.count()?;
        let mut fields = Vec::with_capacity(n.min(r.remaining() / MIN_FIELD));
        for _ in 0..n {
            fields.push(FieldDescription {
                name: r.cstr()?,
                table_oid: r.u32()?,
                column: r.i16()?,
                type_oid: r.u32()?,
                type_size: r.i16()?,
                type_modifier: r.i32()?,
                format: r.i16()?,
            });
        }
        r.finish("trailing bytes after RowDescription")?;
        Ok(RowDescription { fields })
    }

    /// Appends the RowDescription frame to `out`.
    ///
    /// # Panics
    /// If there are more than 65535 fields.
    pub fn encode(&self, out: &mut BytesMut) {
        put_message(out, tag::ROW_DESCRIPTION, |b| {
            put_count(b, self.fields.len());
            for f in &self.fields {
                put_cbytes(b, &f.name);
                b.put_u32(f.table_oid);
                b.put_i16(f.column);
                b.put_u32(f.type_oid);
                b.put_i16(f.type_size);
                b.put_i32(f.type_modifier);
                b.put_i16(f.format);
            }
        });
    }
}

/// Appends the RowDescription `frame` (type byte and length included) to `out` with field
/// `i`'s format code replaced by `format(i)`, everything else as it was: how a pooler turns
/// the description of a statement (format codes all zero, since a statement's result formats
/// are chosen only at Bind) into the description of a portal and back, without decoding the
/// fields. `None` when the frame is not a well-formed RowDescription; `out` then holds part
/// of it.
pub fn put_row_description_with_formats(
    frame: &[u8],
    format: impl Fn(usize) -> i16,
    out: &mut Vec<u8>,
) -> Option<()> {
    /// Fixed part of a field after its name: table OID, column, type OID, size, modifier.
    const FIXED: usize = 4 + 2 + 4 + 2 + 4;
    let (&tag, rest) = frame.split_first()?;
    let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    if tag != tag::ROW_DESCRIPTION || len + 1 != frame.len() || len < 6 {
        return None;
    }
    let count = i16::from_be_bytes([frame[5], frame[6]]);
    let count = usize::try_from(count).ok()?;
    out.reserve(frame.len());
    out.extend_from_slice(&frame[..7]);
    let mut at = 7;
    for i in 0..count {
        let name_len = memchr::memchr(0, frame.get(at..)?)?;
        let end = at + name_len + 1 + FIXED;
        out.extend_from_slice(frame.get(at..end)?);
        frame.get(end..end + 2)?;
        out.extend_from_slice(&format(i).to_be_bytes());
        at = end + 2;
    }
    (at == frame.len()).then_some(())
}

/// DataRow: one result row, kept as the exact body received so a cache can store and replay it
/// without re-encoding. The body is validated once on decode; [`DataRow::columns`] then walks it
/// without errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataRow {
    body: Bytes,
}

impl DataRow {
    /// Wraps a DataRow body after checking that its column count and lengths add up exactly.
    pub fn decode(body: Bytes) -> Result<DataRow, WireError> {
        let mut r = BodyReader::new(body.clone());
        let n = r.count()?;
        for _ in 0..n {
            r.value()?;
        }
        r.finish("trailing bytes after DataRow")?;
        Ok(DataRow { body })
    }

    /// Builds a row from column values (`None` is SQL NULL), e.g. for answers pgmemo computes.
    ///
    /// # Panics
    /// If there are more than 65535 columns or a value exceeds `i32::MAX` bytes.
    pub fn from_values<I, V>(values: I) -> DataRow
    where
        I: IntoIterator<Item = Option<V>>,
        V: AsRef<[u8]>,
    {
        let mut body = BytesMut::from(&[0u8, 0][..]);
        let mut n = 0usize;
        for v in values {
            put_value(&mut body, v.as_ref().map(AsRef::as_ref));
            n += 1;
        }
        let mut count = BytesMut::with_capacity(2);
        put_count(&mut count, n);
        body[..2].copy_from_slice(&count);
        DataRow {
            body: body.freeze(),
        }
    }

    /// Appends the DataRow frame to `out`; the body is copied as is.
    pub fn encode(&self, out: &mut BytesMut) {
        put_message(out, tag::DATA_ROW, |b| b.extend_from_slice(&self.body));
    }

    /// The body as received (column count, then length-prefixed values).
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// Consumes the row into its body, e.g. to store it in a cache.
    pub fn into_body(self) -> Bytes {
        self.body
    }

    /// Number of columns.
    pub fn len(&self) -> usize {
        match self.body.get(..2) {
            Some(&[hi, lo]) => usize::from(u16::from_be_bytes([hi, lo])),
            _ => 0,
        }
    }

    /// True for a row with no columns (`SELECT;` returns those).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The column values in order, `None` for SQL NULL, each a zero-copy slice of the body.
    pub fn columns(&self) -> DataRowColumns<'_> {
        DataRowColumns {
            body: &self.body,
            pos: 2,
            left: self.len(),
        }
    }
}

/// Iterator over the columns of a [`DataRow`].
#[derive(Debug, Clone)]
pub struct DataRowColumns<'a> {
    body: &'a Bytes,
    pos: usize,
    left: usize,
}

impl Iterator for DataRowColumns<'_> {
    type Item = Option<Bytes>;

    fn next(&mut self) -> Option<Option<Bytes>> {
        if self.left == 0 {
            return None;
        }
        let len = match self.body.get(self.pos..self.pos + 4) {
            Some(&[a, b, c, d]) => i32::from_be_bytes([a, b, c, d]),
            // Unreachable for a validated body; end quietly rather than panic.
            _ => {
                self.left = 0;
                return None;
            }
        };
        self.left -= 1;
        self.pos += 4;
        if len < 0 {
            return Some(None);
        }
        let end = match self.pos.checked_add(len as usize) {
            Some(end) if end <= self.body.len() => end,
            _ => {
                self.left = 0;
                return None;
            }
        };
        let value = self.body.slice(self.pos..end);
        self.pos = end;
        Some(Some(value))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for DataRowColumns<'_> {}

/// CommandComplete: a statement finished; its tag (`SELECT 3`, `INSERT 0 1`, `CREATE TABLE`)
/// tells the session what ran and the cache how many rows it produced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommandComplete {
    /// The command tag, without the terminating NUL.
    pub tag: Bytes,
}

impl CommandComplete {
    /// Decodes a CommandComplete body.
    pub fn decode(body: Bytes) -> Result<CommandComplete, WireError> {
        let mut r = BodyReader::new(body);
        let tag = r.cstr()?;
        r.finish("trailing bytes after CommandComplete")?;
        Ok(CommandComplete { tag })
    }

    /// Appends the CommandComplete frame to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        put_message(out, tag::COMMAND_COMPLETE, |b| put_cbytes(b, &self.tag));
    }

    /// The tag when it is UTF-8 (server-generated tags always are).
    pub fn tag_str(&self) -> Option<&str> {
        as_text(&self.tag)
    }

    /// The row count at the end of tags such as `SELECT 3`, `INSERT 0 3` or `COPY 3`; `None` for
    /// tags without one (`CREATE TABLE`, `SET`).
    pub fn rows(&self) -> Option<u64> {
        let tag = self.tag_str()?;
        let (_, last) = tag.rsplit_once(' ')?;
        last.parse().ok()
    }
}

/// FunctionCallResponse: the result of a fast-path FunctionCall.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FunctionCallResponse {
    /// The result value, `None` for SQL NULL.
    pub result: Option<Bytes>,
}

impl FunctionCallResponse {
    /// Decodes a FunctionCallResponse body.
    pub fn decode(body: Bytes) -> Result<FunctionCallResponse, WireError> {
        let mut r = BodyReader::new(body);
        let result = r.value()?;
        r.finish("trailing bytes after FunctionCallResponse")?;
        Ok(FunctionCallResponse { result })
    }

    /// Appends the FunctionCallResponse frame to `out`.
    ///
    /// # Panics
    /// If the value exceeds `i32::MAX` bytes.
    pub fn encode(&self, out: &mut BytesMut) {
        put_message(out, tag::FUNCTION_CALL_RESPONSE, |b| {
            put_value(b, self.result.as_deref())
        });
    }
}

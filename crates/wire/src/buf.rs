//! Small helpers to read C strings and integers out of message bodies without panicking, and to
//! write them back. Every typed message in `frontend` and `backend` is built on these.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::frame::WireError;

/// A cursor over a message body that reports truncation instead of panicking.
pub(crate) struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Reader { data }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub(crate) fn remaining(&self) -> &'a [u8] {
        self.data
    }

    pub(crate) fn u8(&mut self) -> Result<u8, WireError> {
        let (&b, rest) = self.data.split_first().ok_or(WireError::Truncated)?;
        self.data = rest;
        Ok(b)
    }

    pub(crate) fn i32(&mut self) -> Result<i32, WireError> {
        let bytes = self.take(4)?;
        Ok(i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.data.len() < n {
            return Err(WireError::Truncated);
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Ok(head)
    }

    /// Reads a NUL-terminated string; PostgreSQL strings are UTF-8 on the wire for pgmemo's
    /// purposes (names, parameters), anything else is reported as malformed.
    pub(crate) fn cstr(&mut self) -> Result<&'a str, WireError> {
        let end = memchr::memchr(0, self.data).ok_or(WireError::MissingTerminator)?;
        let s = std::str::from_utf8(&self.data[..end]).map_err(|_| WireError::InvalidUtf8)?;
        self.data = &self.data[end + 1..];
        Ok(s)
    }
}

/// Appends a NUL-terminated string.
pub(crate) fn put_cstr(out: &mut bytes::BytesMut, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.extend_from_slice(&[0]);
}

/// Writes a tagged message: `tag`, then a length placeholder patched after `body` ran.
pub(crate) fn put_message(
    out: &mut bytes::BytesMut,
    tag: u8,
    body: impl FnOnce(&mut bytes::BytesMut),
) {
    out.extend_from_slice(&[tag]);
    let len_at = out.len();
    out.extend_from_slice(&[0, 0, 0, 0]);
    body(out);
    let len = (out.len() - len_at) as i32;
    out[len_at..len_at + 4].copy_from_slice(&len.to_be_bytes());
}

/// A cursor over a message body held as `Bytes`: strings and values come out as zero-copy slices
/// of the frame, and every read reports truncation instead of panicking.
pub(crate) struct BodyReader {
    data: Bytes,
}

impl BodyReader {
    pub(crate) fn new(data: Bytes) -> Self {
        BodyReader { data }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.data.len()
    }

    fn need(&self, n: usize) -> Result<(), WireError> {
        if self.data.len() < n {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }

    pub(crate) fn u8(&mut self) -> Result<u8, WireError> {
        self.need(1)?;
        Ok(self.data.get_u8())
    }

    pub(crate) fn i16(&mut self) -> Result<i16, WireError> {
        self.need(2)?;
        Ok(self.data.get_i16())
    }

    pub(crate) fn i32(&mut self) -> Result<i32, WireError> {
        self.need(4)?;
        Ok(self.data.get_i32())
    }

    pub(crate) fn u32(&mut self) -> Result<u32, WireError> {
        self.need(4)?;
        Ok(self.data.get_u32())
    }

    pub(crate) fn u64(&mut self) -> Result<u64, WireError> {
        self.need(8)?;
        Ok(self.data.get_u64())
    }

    pub(crate) fn i64(&mut self) -> Result<i64, WireError> {
        self.need(8)?;
        Ok(self.data.get_i64())
    }

    /// Everything left, without copying: the trailing `Byten` field of a message.
    pub(crate) fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.data)
    }

    /// An element count. PostgreSQL reads these 16-bit fields as unsigned (`pq_getmsgint(m, 2)`),
    /// so up to 65535 parameters are valid.
    pub(crate) fn count(&mut self) -> Result<usize, WireError> {
        self.need(2)?;
        Ok(usize::from(self.data.get_u16()))
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<Bytes, WireError> {
        self.need(n)?;
        Ok(self.data.split_to(n))
    }

    /// A NUL-terminated string as raw bytes: names and query texts are in the client's encoding,
    /// which need not be UTF-8.
    pub(crate) fn cstr(&mut self) -> Result<Bytes, WireError> {
        // memchr: statement texts are searched for their NUL on every Parse.
        let end = memchr::memchr(0, &self.data).ok_or(WireError::MissingTerminator)?;
        let s = self.data.split_to(end);
        self.data.advance(1);
        Ok(s)
    }

    /// A length-prefixed value where length -1 means NULL, as in Bind, DataRow and FunctionCall.
    pub(crate) fn value(&mut self) -> Result<Option<Bytes>, WireError> {
        match self.i32()? {
            -1 => Ok(None),
            len if len < 0 => Err(WireError::Malformed("negative value length")),
            len => self.take(len as usize).map(Some),
        }
    }

    /// `count` 16-bit entries preceded by their count.
    pub(crate) fn i16_array(&mut self) -> Result<Vec<i16>, WireError> {
        let n = self.count()?;
        self.need(2 * n)?;
        Ok((0..n).map(|_| self.data.get_i16()).collect())
    }

    /// `count` 32-bit OIDs preceded by a 16-bit count.
    pub(crate) fn u32_array(&mut self) -> Result<Vec<u32>, WireError> {
        let n = self.count()?;
        self.need(4 * n)?;
        Ok((0..n).map(|_| self.data.get_u32()).collect())
    }

    /// Values (see [`BodyReader::value`]) preceded by a 16-bit count.
    pub(crate) fn values(&mut self) -> Result<Vec<Option<Bytes>>, WireError> {
        let n = self.count()?;
        // Each value takes at least its 4-byte length: cap the allocation by what is there.
        let mut out = Vec::with_capacity(n.min(self.data.len() / 4));
        for _ in 0..n {
            out.push(self.value()?);
        }
        Ok(out)
    }

    /// Ends decoding: bytes left over mean the message is not what its tag says.
    pub(crate) fn finish(self, what: &'static str) -> Result<(), WireError> {
        if self.data.is_empty() {
            Ok(())
        } else {
            Err(WireError::Malformed(what))
        }
    }
}

/// Appends a NUL-terminated string given as raw bytes.
///
/// # Panics
/// In debug builds, if `s` contains a NUL byte: the peer would read a different message.
pub(crate) fn put_cbytes(out: &mut BytesMut, s: &[u8]) {
    debug_assert!(!s.contains(&0), "NUL byte inside a protocol string");
    out.extend_from_slice(s);
    out.put_u8(0);
}

/// Appends a 16-bit element count.
///
/// # Panics
/// If `n` exceeds 65535, which the protocol cannot express.
pub(crate) fn put_count(out: &mut BytesMut, n: usize) {
    let n = u16::try_from(n).expect("more than 65535 elements in one protocol message");
    out.put_u16(n);
}

/// Appends a length-prefixed value, -1 for NULL.
///
/// # Panics
/// If the value is longer than `i32::MAX` bytes.
pub(crate) fn put_value(out: &mut BytesMut, value: Option<&[u8]>) {
    match value {
        Some(v) => {
            out.put_i32(i32::try_from(v.len()).expect("protocol value longer than 2 GiB"));
            out.extend_from_slice(v);
        }
        None => out.put_i32(-1),
    }
}

/// Appends a count then the 16-bit entries.
pub(crate) fn put_i16_array(out: &mut BytesMut, items: &[i16]) {
    put_count(out, items.len());
    for &i in items {
        out.put_i16(i);
    }
}

/// Appends a count then the values.
pub(crate) fn put_values(out: &mut BytesMut, values: &[Option<Bytes>]) {
    put_count(out, values.len());
    for v in values {
        put_value(out, v.as_deref());
    }
}

/// Reads raw protocol text as UTF-8 when it is, for logs and decisions that only care about
/// UTF-8 clients. Non-UTF-8 text stays valid on the wire; it is only not viewable as `&str`.
pub(crate) fn as_text(b: &[u8]) -> Option<&str> {
    std::str::from_utf8(b).ok()
}

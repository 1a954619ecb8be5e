//! Small helpers to read C strings and integers out of message bodies without panicking.

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
        let end = self
            .data
            .iter()
            .position(|&b| b == 0)
            .ok_or(WireError::MissingTerminator)?;
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

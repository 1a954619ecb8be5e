//! The start of a COPY: CopyInResponse, CopyOutResponse and CopyBothResponse share one layout.
//!
//! On the query path these switch the session into copy mode: after CopyInResponse the client
//! streams CopyData up to CopyDone or CopyFail, after CopyOutResponse the server does, and
//! CopyBothResponse starts streaming replication. Results containing them are never cached.

use bytes::{BufMut, Bytes, BytesMut};

use crate::buf::{put_i16_array, put_message, BodyReader};
use crate::frame::WireError;

/// The body of CopyInResponse, CopyOutResponse or CopyBothResponse; which one is given by the
/// [`super::BackendMessage`] variant.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CopyResponse {
    /// Overall format: 0 textual (rows separated by newlines), 1 binary.
    pub format: i8,
    /// Format code of each column; all 0 when `format` is 0.
    pub column_formats: Vec<i16>,
}

impl CopyResponse {
    /// Decodes the body shared by the three Copy*Response messages.
    pub fn decode(body: Bytes) -> Result<CopyResponse, WireError> {
        let mut r = BodyReader::new(body);
        let msg = CopyResponse {
            format: r.u8()? as i8,
            column_formats: r.i16_array()?,
        };
        r.finish("trailing bytes after Copy*Response")?;
        Ok(msg)
    }

    /// Appends the frame to `out` with the given type byte (`'G'`, `'H'` or `'W'`, see
    /// [`super::tag`]).
    ///
    /// # Panics
    /// If there are more than 65535 columns.
    pub fn encode(&self, tag: u8, out: &mut BytesMut) {
        put_message(out, tag, |b| {
            b.put_i8(self.format);
            put_i16_array(b, &self.column_formats);
        });
    }
}

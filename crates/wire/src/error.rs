//! ErrorResponse and NoticeResponse: building the ones pgmemo reports itself, and reading the
//! fields of those a server sends (for logs and decisions such as "authentication failed").

use bytes::{BufMut, Bytes, BytesMut};

use crate::buf::{put_cstr, put_message, Reader};
use crate::frame::WireError;

/// Severity of an error, as PostgreSQL spells it in the `S` and `V` fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Aborts the current statement; the session goes on.
    Error,
    /// Ends the session; the connection is closed after it.
    Fatal,
    /// Informational, sent as a NoticeResponse.
    Warning,
    Notice,
}

impl Severity {
    fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "ERROR",
            Severity::Fatal => "FATAL",
            Severity::Warning => "WARNING",
            Severity::Notice => "NOTICE",
        }
    }
}

/// An error or notice in PostgreSQL's field format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorResponse {
    pub severity: String,
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl ErrorResponse {
    /// An error pgmemo raises itself, with a SQLSTATE from [`crate::sqlstate`].
    pub fn new(severity: Severity, code: &str, message: impl Into<String>) -> Self {
        ErrorResponse {
            severity: severity.as_str().to_owned(),
            code: code.to_owned(),
            message: message.into(),
            detail: None,
            hint: None,
        }
    }

    /// Shorthand for a statement-level error.
    pub fn error(code: &str, message: impl Into<String>) -> Self {
        Self::new(Severity::Error, code, message)
    }

    /// Shorthand for a session-ending error.
    pub fn fatal(code: &str, message: impl Into<String>) -> Self {
        Self::new(Severity::Fatal, code, message)
    }

    /// Adds a DETAIL line.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Adds a HINT line.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// True for FATAL and PANIC, after which the sender closes the connection.
    pub fn is_fatal(&self) -> bool {
        self.severity == "FATAL" || self.severity == "PANIC"
    }

    /// Encodes as an ErrorResponse ('E') frame.
    pub fn encode(&self) -> Bytes {
        self.encode_as(b'E')
    }

    /// Encodes as an ErrorResponse frame that also names the source routine (`R`), for the
    /// few errors clients recognise by it (pgjdbc and sqlx prepare a statement again on
    /// `RevalidateCachedQuery`). Not a field of the struct: errors pgmemo re-encodes were
    /// raised by code of its own, whose routine is not the one PostgreSQL would name.
    pub fn encode_with_routine(&self, routine: &str) -> Bytes {
        let mut out = BytesMut::with_capacity(64 + self.message.len() + routine.len());
        put_message(&mut out, b'E', |b| {
            self.put_fields(b);
            // Before the terminating zero.
            b.truncate(b.len() - 1);
            b.put_u8(b'R');
            put_cstr(b, routine);
            b.put_u8(0);
        });
        out.freeze()
    }

    /// Encodes as a NoticeResponse ('N') frame.
    pub fn encode_notice(&self) -> Bytes {
        self.encode_as(b'N')
    }

    /// Appends the ErrorResponse frame to `out`.
    pub fn encode_into(&self, out: &mut BytesMut) {
        put_message(out, b'E', |b| self.put_fields(b));
    }

    /// Appends the NoticeResponse frame to `out`.
    pub fn encode_notice_into(&self, out: &mut BytesMut) {
        put_message(out, b'N', |b| self.put_fields(b));
    }

    fn encode_as(&self, tag: u8) -> Bytes {
        let mut out = BytesMut::with_capacity(64 + self.message.len());
        put_message(&mut out, tag, |b| self.put_fields(b));
        out.freeze()
    }

    fn put_fields(&self, b: &mut BytesMut) {
        for (field, value) in [
            (b'S', Some(self.severity.as_str())),
            (b'V', Some(self.severity.as_str())),
            (b'C', Some(self.code.as_str())),
            (b'M', Some(self.message.as_str())),
            (b'D', self.detail.as_deref()),
            (b'H', self.hint.as_deref()),
        ] {
            if let Some(v) = value {
                b.put_u8(field);
                put_cstr(b, v);
            }
        }
        b.put_u8(0);
    }

    /// Reads the fields of an ErrorResponse or NoticeResponse body. Unknown fields are skipped.
    pub fn parse(body: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let mut e = ErrorResponse::new(Severity::Error, "", "");
        e.severity.clear();
        loop {
            let field = r.u8()?;
            if field == 0 {
                break;
            }
            let value = r.cstr()?;
            match field {
                b'V' => e.severity = value.to_owned(),
                b'S' if e.severity.is_empty() => e.severity = value.to_owned(),
                b'C' => e.code = value.to_owned(),
                b'M' => e.message = value.to_owned(),
                b'D' => e.detail = Some(value.to_owned()),
                b'H' => e.hint = Some(value.to_owned()),
                _ => {}
            }
        }
        Ok(e)
    }
}

impl std::fmt::Display for ErrorResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} ({})", self.severity, self.message, self.code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlstate;

    #[test]
    fn a_routine_goes_last_and_the_rest_reads_as_without_it() {
        let e = ErrorResponse::error(sqlstate::FEATURE_NOT_SUPPORTED, "m").with_hint("h");
        let frame = e.encode_with_routine("R1");
        assert!(frame.ends_with(b"RR1\0\0"));
        let len = u32::from_be_bytes(frame[1..5].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - 1);
        assert_eq!(ErrorResponse::parse(&frame[5..]).unwrap(), e);
    }

    #[test]
    fn round_trip() {
        let e = ErrorResponse::fatal(sqlstate::INVALID_PASSWORD, "password authentication failed")
            .with_detail("d")
            .with_hint("h");
        let raw = e.encode();
        assert_eq!(raw[0], b'E');
        let len = i32::from_be_bytes([raw[1], raw[2], raw[3], raw[4]]) as usize;
        assert_eq!(len + 1, raw.len());
        assert_eq!(ErrorResponse::parse(&raw[5..]).unwrap(), e);
        assert!(e.is_fatal());
    }

    #[test]
    fn golden_bytes() {
        let raw = ErrorResponse::error("42601", "x").encode();
        assert_eq!(&raw[..], b"E\0\0\0\x1dSERROR\0VERROR\0C42601\0Mx\0\0");
    }
}

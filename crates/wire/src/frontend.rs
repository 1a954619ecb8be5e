//! Messages a client sends (`FrontendMessage`): the ones pgmemo reads during authentication and
//! encoders for the ones pgmemo sends to servers as a client itself.

use bytes::{BufMut, Bytes, BytesMut};

use crate::buf::{put_cstr, put_message, Reader};
use crate::frame::{Frame, WireError};

/// Frontend message type bytes that pgmemo looks at while relaying.
pub mod tag {
    pub const QUERY: u8 = b'Q';
    pub const PARSE: u8 = b'P';
    pub const BIND: u8 = b'B';
    pub const DESCRIBE: u8 = b'D';
    pub const EXECUTE: u8 = b'E';
    pub const CLOSE: u8 = b'C';
    pub const SYNC: u8 = b'S';
    pub const FLUSH: u8 = b'H';
    pub const FUNCTION_CALL: u8 = b'F';
    pub const COPY_DATA: u8 = b'd';
    pub const COPY_DONE: u8 = b'c';
    pub const COPY_FAIL: u8 = b'f';
    pub const PASSWORD: u8 = b'p';
    pub const TERMINATE: u8 = b'X';
}

/// The frontend messages pgmemo decodes; everything else is relayed as raw frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrontendMessage {
    /// Simple query.
    Query {
        sql: String,
    },
    /// A 'p' message: a password, SASL initial response or SASL response. Which one it is
    /// depends on the authentication exchange, so it is kept raw here; see [`SaslInitialResponse`].
    Password {
        body: Bytes,
    },
    Terminate,
    Sync,
    /// Any other message, kept whole.
    Other(Frame),
}

impl FrontendMessage {
    /// Decodes a frame received from a client.
    pub fn decode(frame: Frame) -> Result<FrontendMessage, WireError> {
        Ok(match frame.tag() {
            tag::QUERY => FrontendMessage::Query {
                sql: Reader::new(frame.body()).cstr()?.to_owned(),
            },
            tag::PASSWORD => FrontendMessage::Password {
                body: frame.body_bytes(),
            },
            tag::TERMINATE => FrontendMessage::Terminate,
            tag::SYNC => FrontendMessage::Sync,
            _ => FrontendMessage::Other(frame),
        })
    }
}

/// Reads a cleartext or md5 password message body.
pub fn parse_password(body: &[u8]) -> Result<&str, WireError> {
    let mut r = Reader::new(body);
    let pw = r.cstr()?;
    if !r.is_empty() {
        return Err(WireError::InvalidAuth("trailing bytes after password"));
    }
    Ok(pw)
}

/// The first SASL message from a client: the chosen mechanism and its initial data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslInitialResponse<'a> {
    pub mechanism: &'a str,
    pub data: &'a [u8],
}

impl<'a> SaslInitialResponse<'a> {
    /// Reads a SASLInitialResponse body.
    pub fn parse(body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let mechanism = r.cstr()?;
        let len = r.i32()?;
        let data = if len < 0 {
            &[][..]
        } else {
            r.take(len as usize)?
        };
        if !r.is_empty() {
            return Err(WireError::InvalidAuth("trailing bytes after SASL data"));
        }
        Ok(SaslInitialResponse { mechanism, data })
    }
}

/// PasswordMessage with a cleartext or md5-hashed password.
pub fn password_message(password: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(6 + password.len());
    put_message(&mut out, tag::PASSWORD, |b| put_cstr(b, password));
    out.freeze()
}

/// SASLInitialResponse.
pub fn sasl_initial_response(mechanism: &str, data: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(10 + mechanism.len() + data.len());
    put_message(&mut out, tag::PASSWORD, |b| {
        put_cstr(b, mechanism);
        b.put_i32(data.len() as i32);
        b.extend_from_slice(data);
    });
    out.freeze()
}

/// SASLResponse.
pub fn sasl_response(data: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + data.len());
    put_message(&mut out, tag::PASSWORD, |b| b.extend_from_slice(data));
    out.freeze()
}

/// Simple Query.
pub fn query(sql: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(6 + sql.len());
    put_message(&mut out, tag::QUERY, |b| put_cstr(b, sql));
    out.freeze()
}

/// Terminate.
pub fn terminate() -> Bytes {
    Bytes::from_static(b"X\0\0\0\x04")
}

/// Sync.
pub fn sync() -> Bytes {
    Bytes::from_static(b"S\0\0\0\x04")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sasl_initial_round_trip() {
        let raw = sasl_initial_response("SCRAM-SHA-256", b"n,,n=,r=abc");
        let s = SaslInitialResponse::parse(&raw[5..]).unwrap();
        assert_eq!(s.mechanism, "SCRAM-SHA-256");
        assert_eq!(s.data, b"n,,n=,r=abc");
        assert!(SaslInitialResponse::parse(b"SCRAM\0\0\0\0\x09abc").is_err());
    }

    #[test]
    fn query_decodes() {
        let mut buf = BytesMut::from(&query("select 1")[..]);
        let f = Frame::decode(&mut buf, 1024).unwrap().unwrap();
        assert_eq!(
            FrontendMessage::decode(f).unwrap(),
            FrontendMessage::Query {
                sql: "select 1".into()
            }
        );
        assert_eq!(parse_password(b"pw\0").unwrap(), "pw");
        assert!(parse_password(b"pw").is_err());
    }
}

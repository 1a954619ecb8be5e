//! Messages a client sends (`FrontendMessage`): typed decoding and encoding of every regular
//! frontend message, plus the encoders pgmemo uses when it is itself the client of a server.
//!
//! On the query path this is the first thing that reads client bytes after framing: the session
//! reads Query and the extended-protocol messages (see [`extended`]), authentication reads the
//! 'p' messages, and everything is re-encoded byte for byte when relayed after a rewrite.

use bytes::{BufMut, Bytes, BytesMut};

use crate::buf::{as_text, put_cbytes, put_cstr, put_message, BodyReader, Reader};
use crate::frame::{Frame, WireError};

pub mod extended;
pub mod peek;

pub use extended::{Bind, Close, Describe, Execute, FunctionCall, Parse, Target};

/// Frontend message type bytes, so that a relay can route frames by tag without decoding them.
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

/// A decoded client message. Each variant keeps the payload zero-copy where the protocol allows;
/// [`FrontendMessage::encode`] writes back exactly what [`FrontendMessage::decode`] read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrontendMessage {
    /// Simple query: one or more statements, answered up to ReadyForQuery.
    Query(Query),
    /// Extended protocol: create a prepared statement.
    Parse(Parse),
    /// Extended protocol: bind parameters into a portal.
    Bind(Bind),
    /// Extended protocol: describe a statement or portal.
    Describe(Describe),
    /// Extended protocol: run a portal.
    Execute(Execute),
    /// Extended protocol: drop a statement or portal.
    Close(Close),
    /// Ends an extended-protocol request; the server answers with ReadyForQuery.
    Sync,
    /// Asks the server to send what it has buffered, without ending the request.
    Flush,
    /// COPY FROM STDIN data, relayed untouched.
    CopyData(Bytes),
    /// COPY FROM STDIN completed successfully.
    CopyDone,
    /// COPY FROM STDIN aborted by the client.
    CopyFail(CopyFail),
    /// Legacy fast-path function call.
    FunctionCall(FunctionCall),
    /// A 'p' message: a password, SASL initial response or SASL response. Which one it is
    /// depends on the authentication exchange, so it is kept raw here; see [`SaslInitialResponse`].
    Password { body: Bytes },
    /// The client is closing the connection.
    Terminate,
    /// A message with a type byte this crate does not know, kept whole.
    Other(Frame),
}

impl FrontendMessage {
    /// Decodes a frame received from a client. Malformed bodies (bad counts, truncation, trailing
    /// bytes) are errors, never panics; unknown type bytes become [`FrontendMessage::Other`].
    pub fn decode(frame: Frame) -> Result<FrontendMessage, WireError> {
        let body = frame.body_bytes();
        Ok(match frame.tag() {
            tag::QUERY => FrontendMessage::Query(Query::decode(body)?),
            tag::PARSE => FrontendMessage::Parse(Parse::decode(body)?),
            tag::BIND => FrontendMessage::Bind(Bind::decode(body)?),
            tag::DESCRIBE => FrontendMessage::Describe(Describe::decode(body)?),
            tag::EXECUTE => FrontendMessage::Execute(Execute::decode(body)?),
            tag::CLOSE => FrontendMessage::Close(Close::decode(body)?),
            tag::SYNC => empty(body, FrontendMessage::Sync)?,
            tag::FLUSH => empty(body, FrontendMessage::Flush)?,
            tag::COPY_DATA => FrontendMessage::CopyData(body),
            tag::COPY_DONE => empty(body, FrontendMessage::CopyDone)?,
            tag::COPY_FAIL => FrontendMessage::CopyFail(CopyFail::decode(body)?),
            tag::FUNCTION_CALL => FrontendMessage::FunctionCall(FunctionCall::decode(body)?),
            tag::PASSWORD => FrontendMessage::Password { body },
            tag::TERMINATE => empty(body, FrontendMessage::Terminate)?,
            _ => FrontendMessage::Other(frame),
        })
    }

    /// Appends the message as one frame to `out`, e.g. after a pooler renamed a statement.
    ///
    /// # Panics
    /// Only for values the protocol cannot express (see the `encode` of each message).
    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            FrontendMessage::Query(m) => m.encode(out),
            FrontendMessage::Parse(m) => m.encode(out),
            FrontendMessage::Bind(m) => m.encode(out),
            FrontendMessage::Describe(m) => m.encode(out),
            FrontendMessage::Execute(m) => m.encode(out),
            FrontendMessage::Close(m) => m.encode(out),
            FrontendMessage::CopyFail(m) => m.encode(out),
            FrontendMessage::FunctionCall(m) => m.encode(out),
            FrontendMessage::CopyData(data) => {
                put_message(out, tag::COPY_DATA, |b| b.extend_from_slice(data))
            }
            FrontendMessage::Password { body } => {
                put_message(out, tag::PASSWORD, |b| b.extend_from_slice(body))
            }
            FrontendMessage::Sync
            | FrontendMessage::Flush
            | FrontendMessage::CopyDone
            | FrontendMessage::Terminate => put_message(out, self.tag(), |_| {}),
            FrontendMessage::Other(frame) => out.extend_from_slice(frame.raw()),
        }
    }

    /// The type byte this message is sent with, for logs and routing without a second match.
    pub fn tag(&self) -> u8 {
        match self {
            FrontendMessage::Query(_) => tag::QUERY,
            FrontendMessage::Parse(_) => tag::PARSE,
            FrontendMessage::Bind(_) => tag::BIND,
            FrontendMessage::Describe(_) => tag::DESCRIBE,
            FrontendMessage::Execute(_) => tag::EXECUTE,
            FrontendMessage::Close(_) => tag::CLOSE,
            FrontendMessage::Sync => tag::SYNC,
            FrontendMessage::Flush => tag::FLUSH,
            FrontendMessage::CopyData(_) => tag::COPY_DATA,
            FrontendMessage::CopyDone => tag::COPY_DONE,
            FrontendMessage::CopyFail(_) => tag::COPY_FAIL,
            FrontendMessage::FunctionCall(_) => tag::FUNCTION_CALL,
            FrontendMessage::Password { .. } => tag::PASSWORD,
            FrontendMessage::Terminate => tag::TERMINATE,
            FrontendMessage::Other(frame) => frame.tag(),
        }
    }
}

/// Accepts a message that has no body; bytes in it mean the peer is not speaking protocol 3.
fn empty(body: Bytes, msg: FrontendMessage) -> Result<FrontendMessage, WireError> {
    if body.is_empty() {
        Ok(msg)
    } else {
        Err(WireError::Malformed(
            "unexpected body in a message without fields",
        ))
    }
}

/// Simple Query. The text stays raw because the client encoding may not be UTF-8.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Query {
    /// The SQL text in the client's encoding, without the terminating NUL.
    pub sql: Bytes,
}

impl Query {
    /// Decodes a Query body: one NUL-terminated string and nothing after it.
    pub fn decode(body: Bytes) -> Result<Query, WireError> {
        let mut r = BodyReader::new(body);
        let sql = r.cstr()?;
        r.finish("trailing bytes after Query")?;
        Ok(Query { sql })
    }

    /// Appends the Query frame to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        put_message(out, tag::QUERY, |b| put_cbytes(b, &self.sql));
    }

    /// The SQL text when it is UTF-8, which the SQL analyser needs.
    pub fn sql_str(&self) -> Option<&str> {
        as_text(&self.sql)
    }
}

/// CopyFail: the client aborts COPY FROM STDIN; the server answers with an ErrorResponse.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CopyFail {
    /// The reason the client gives, in the client's encoding.
    pub message: Bytes,
}

impl CopyFail {
    /// Decodes a CopyFail body.
    pub fn decode(body: Bytes) -> Result<CopyFail, WireError> {
        let mut r = BodyReader::new(body);
        let message = r.cstr()?;
        r.finish("trailing bytes after CopyFail")?;
        Ok(CopyFail { message })
    }

    /// Appends the CopyFail frame to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        put_message(out, tag::COPY_FAIL, |b| put_cbytes(b, &self.message));
    }

    /// The reason when it is UTF-8.
    pub fn message_str(&self) -> Option<&str> {
        as_text(&self.message)
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

/// The statement and portal names of [`own_queries`]: names no driver picks.
pub const OWN_STATEMENT: &str = "pgmemo own query";

/// Runs `statements` in order as one extended-protocol request (text results, no
/// parameters, one Sync at the end), under a named statement and portal that it closes
/// again. Unlike a simple Query, it leaves the session's unnamed statement and unnamed portal
/// as they were, so a proxy can ask a server things between a client's Parse and its Bind.
/// After an error the server skips the rest up to the Sync, as for a simple Query; a
/// statement left prepared by such an error is closed first by the next call.
pub fn own_queries(statements: &[&str]) -> Bytes {
    let name = OWN_STATEMENT;
    let len: usize = statements.iter().map(|s| s.len() + 120).sum();
    let mut out = BytesMut::with_capacity(len + 5);
    for sql in statements {
        put_message(&mut out, tag::CLOSE, |b| {
            b.put_u8(b'S');
            put_cstr(b, name);
        });
        put_message(&mut out, tag::PARSE, |b| {
            put_cstr(b, name);
            put_cstr(b, sql);
            b.put_i16(0);
        });
        put_message(&mut out, tag::BIND, |b| {
            put_cstr(b, name);
            put_cstr(b, name);
            b.put_i16(0);
            b.put_i16(0);
            b.put_i16(0);
        });
        put_message(&mut out, tag::EXECUTE, |b| {
            put_cstr(b, name);
            b.put_i32(0);
        });
        put_message(&mut out, tag::CLOSE, |b| {
            b.put_u8(b'P');
            put_cstr(b, name);
        });
        put_message(&mut out, tag::CLOSE, |b| {
            b.put_u8(b'S');
            put_cstr(b, name);
        });
    }
    out.extend_from_slice(&sync());
    out.freeze()
}

/// A Parse that PostgreSQL refuses with a syntax error (42601) before it looks at the
/// statement name or drops the unnamed statement (it parses the text first), so it changes
/// nothing but the transaction: sent ahead of a request, it makes the server fail at once and
/// skip the request's messages up to their Sync, aborting an open transaction block, which is
/// what a cancel landing on the request's first message does. The text names pgmemo in the
/// server's log.
pub fn refused_parse() -> Bytes {
    let mut out = BytesMut::with_capacity(96);
    put_message(&mut out, tag::PARSE, |b| {
        put_cstr(b, OWN_STATEMENT);
        put_cstr(b, "pgmemo: canceling statement due to user request");
        b.put_i16(0);
    });
    out.freeze()
}

/// Terminate.
pub fn terminate() -> Bytes {
    Bytes::from_static(b"X\0\0\0\x04")
}

/// Flush: the server sends what it has, without ending the batch as a Sync would.
pub fn flush() -> Bytes {
    Bytes::from_static(b"H\0\0\0\x04")
}

/// Sync.
pub fn sync() -> Bytes {
    Bytes::from_static(b"S\0\0\0\x04")
}

#[cfg(test)]
mod tests;

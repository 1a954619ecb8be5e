//! Messages a server sends (`BackendMessage`): typed decoding and encoding of every backend
//! message, and encoders for the ones pgmemo sends to clients itself (authentication, parameter
//! status, key data, ready-for-query, and small result sets for the admin console).
//!
//! On the query path this reads what comes back from upstream: the pool reads authentication and
//! ReadyForQuery, the session tracks transaction status, and the cache captures results
//! ([`rows`]) untouched. Anything with an unknown type byte stays a raw [`Frame`].

use bytes::{BufMut, Bytes, BytesMut};

use crate::buf::{put_cstr, put_message, Reader};
use crate::error::ErrorResponse;
use crate::frame::{Frame, WireError};
use crate::startup::CancelKey;

pub mod copy;
pub mod notification;
pub mod rows;

pub use copy::CopyResponse;
pub use notification::NotificationResponse;
pub use rows::{
    put_row_description_with_formats, CommandComplete, DataRow, DataRowColumns, FieldDescription,
    FunctionCallResponse, ParameterDescription, RowDescription,
};

/// Backend message type bytes, so that a relay can route frames by tag without decoding them.
pub mod tag {
    pub const AUTHENTICATION: u8 = b'R';
    pub const PARAMETER_STATUS: u8 = b'S';
    pub const BACKEND_KEY_DATA: u8 = b'K';
    pub const READY_FOR_QUERY: u8 = b'Z';
    pub const ERROR_RESPONSE: u8 = b'E';
    pub const NOTICE_RESPONSE: u8 = b'N';
    pub const NOTIFICATION_RESPONSE: u8 = b'A';
    pub const COPY_IN_RESPONSE: u8 = b'G';
    pub const COPY_OUT_RESPONSE: u8 = b'H';
    pub const COPY_BOTH_RESPONSE: u8 = b'W';
    pub const NEGOTIATE_PROTOCOL_VERSION: u8 = b'v';
    pub const COMMAND_COMPLETE: u8 = b'C';
    pub const DATA_ROW: u8 = b'D';
    pub const ROW_DESCRIPTION: u8 = b'T';
    pub const EMPTY_QUERY_RESPONSE: u8 = b'I';
    pub const PARSE_COMPLETE: u8 = b'1';
    pub const BIND_COMPLETE: u8 = b'2';
    pub const CLOSE_COMPLETE: u8 = b'3';
    pub const NO_DATA: u8 = b'n';
    pub const PORTAL_SUSPENDED: u8 = b's';
    pub const PARAMETER_DESCRIPTION: u8 = b't';
    pub const COPY_DATA: u8 = b'd';
    pub const COPY_DONE: u8 = b'c';
    pub const FUNCTION_CALL_RESPONSE: u8 = b'V';
}

/// Transaction status carried by ReadyForQuery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionStatus {
    /// Not in a transaction block.
    Idle,
    /// In a transaction block.
    InTransaction,
    /// In a failed transaction block (queries rejected until ROLLBACK).
    Failed,
}

impl TransactionStatus {
    /// Reads the status byte.
    pub fn from_byte(b: u8) -> Result<Self, WireError> {
        match b {
            b'I' => Ok(TransactionStatus::Idle),
            b'T' => Ok(TransactionStatus::InTransaction),
            b'E' => Ok(TransactionStatus::Failed),
            other => Err(WireError::UnexpectedTag(other)),
        }
    }

    /// The status byte.
    pub fn as_byte(self) -> u8 {
        match self {
            TransactionStatus::Idle => b'I',
            TransactionStatus::InTransaction => b'T',
            TransactionStatus::Failed => b'E',
        }
    }
}

/// An authentication request from a server ('R').
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authentication {
    Ok,
    CleartextPassword,
    Md5Password {
        salt: [u8; 4],
    },
    /// Offered SASL mechanisms, e.g. `SCRAM-SHA-256`.
    Sasl {
        mechanisms: Vec<String>,
    },
    SaslContinue {
        data: Bytes,
    },
    SaslFinal {
        data: Bytes,
    },
    /// Kerberos, GSS, SSPI and anything newer: pgmemo cannot answer these itself.
    Unsupported {
        code: i32,
    },
}

impl Authentication {
    /// Reads the body of an 'R' message. Request codes pgmemo cannot answer become
    /// [`Authentication::Unsupported`] (their data, e.g. GSS tokens, is not kept).
    pub fn decode(body: &[u8]) -> Result<Authentication, WireError> {
        let mut r = Reader::new(body);
        Ok(match r.i32()? {
            0 => Authentication::Ok,
            3 => Authentication::CleartextPassword,
            5 => {
                let s = r.take(4)?;
                Authentication::Md5Password {
                    salt: [s[0], s[1], s[2], s[3]],
                }
            }
            10 => {
                let mut mechanisms = Vec::new();
                loop {
                    let m = r.cstr()?;
                    if m.is_empty() {
                        break;
                    }
                    mechanisms.push(m.to_owned());
                }
                Authentication::Sasl { mechanisms }
            }
            11 => Authentication::SaslContinue {
                data: Bytes::copy_from_slice(r.remaining()),
            },
            12 => Authentication::SaslFinal {
                data: Bytes::copy_from_slice(r.remaining()),
            },
            code => Authentication::Unsupported { code },
        })
    }

    /// Appends the 'R' frame to `out`, e.g. when pgmemo authenticates clients itself.
    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            Authentication::Ok => put_auth(out, 0, &[]),
            Authentication::CleartextPassword => put_auth(out, 3, &[]),
            Authentication::Md5Password { salt } => put_auth(out, 5, salt),
            Authentication::Sasl { mechanisms } => {
                put_message(out, tag::AUTHENTICATION, |b| {
                    b.put_i32(10);
                    for m in mechanisms {
                        put_cstr(b, m);
                    }
                    b.put_u8(0);
                });
            }
            Authentication::SaslContinue { data } => put_auth(out, 11, data),
            Authentication::SaslFinal { data } => put_auth(out, 12, data),
            Authentication::Unsupported { code } => put_auth(out, *code, &[]),
        }
    }
}

/// A decoded server message. Results keep their payloads zero-copy ([`DataRow`] keeps its whole
/// body) so that captured results can be replayed byte for byte; [`BackendMessage::encode`]
/// writes back what [`BackendMessage::decode`] read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendMessage {
    Authentication(Authentication),
    ParameterStatus {
        name: String,
        value: String,
    },
    BackendKeyData(CancelKey),
    ReadyForQuery(TransactionStatus),
    ErrorResponse(ErrorResponse),
    NoticeResponse(ErrorResponse),
    /// The server speaks an older protocol than asked for, or not some `_pq_.` options.
    NegotiateProtocolVersion {
        /// The newest protocol version the server supports, as PostgreSQL sends it: major in
        /// the high 16 bits, minor in the low (`0x0003_0000` for 3.0).
        version: i32,
        unrecognized: Vec<String>,
    },
    /// Parse succeeded.
    ParseComplete,
    /// Bind succeeded.
    BindComplete,
    /// Close succeeded (also sent for names that did not exist).
    CloseComplete,
    /// Describe of a statement or portal that returns no rows.
    NoData,
    /// Execute stopped at its row limit; the portal can be executed again.
    PortalSuspended,
    /// The query string was empty.
    EmptyQueryResponse,
    /// Parameter types of a described statement.
    ParameterDescription(ParameterDescription),
    /// Shape of the rows that follow.
    RowDescription(RowDescription),
    /// One result row, body kept as received.
    DataRow(DataRow),
    /// A statement finished, with its command tag.
    CommandComplete(CommandComplete),
    /// The server waits for COPY FROM STDIN data.
    CopyInResponse(CopyResponse),
    /// The server starts sending COPY TO STDOUT data.
    CopyOutResponse(CopyResponse),
    /// Both directions stream CopyData (replication).
    CopyBothResponse(CopyResponse),
    /// COPY TO STDOUT or replication data, relayed untouched.
    CopyData(Bytes),
    /// The server's COPY data stream ended.
    CopyDone,
    /// A NOTIFY delivered to a listening session.
    NotificationResponse(NotificationResponse),
    /// Result of a fast-path FunctionCall.
    FunctionCallResponse(FunctionCallResponse),
    /// A message with a type byte this crate does not know, kept whole.
    Other(Frame),
}

impl BackendMessage {
    /// Decodes a frame received from a server. Malformed bodies are errors, never panics; unknown
    /// type bytes become [`BackendMessage::Other`].
    ///
    /// BackendKeyData may carry a longer secret under protocol 3.2; only its first 8 bytes are
    /// read. The authentication, key and error messages accept trailing bytes as they always did.
    pub fn decode(frame: Frame) -> Result<BackendMessage, WireError> {
        let body = frame.body_bytes();
        let mut r = Reader::new(frame.body());
        let msg = match frame.tag() {
            tag::AUTHENTICATION => BackendMessage::Authentication(Authentication::decode(&body)?),
            tag::PARAMETER_STATUS => BackendMessage::ParameterStatus {
                name: r.cstr()?.to_owned(),
                value: r.cstr()?.to_owned(),
            },
            tag::BACKEND_KEY_DATA => BackendMessage::BackendKeyData(CancelKey {
                process_id: r.i32()?,
                secret_key: r.i32()?,
            }),
            tag::READY_FOR_QUERY => {
                BackendMessage::ReadyForQuery(TransactionStatus::from_byte(r.u8()?)?)
            }
            tag::ERROR_RESPONSE => BackendMessage::ErrorResponse(ErrorResponse::parse(&body)?),
            tag::NOTICE_RESPONSE => BackendMessage::NoticeResponse(ErrorResponse::parse(&body)?),
            tag::NEGOTIATE_PROTOCOL_VERSION => {
                let version = r.i32()?;
                let n = r.i32()?;
                let mut unrecognized = Vec::new();
                for _ in 0..n.max(0) {
                    unrecognized.push(r.cstr()?.to_owned());
                }
                BackendMessage::NegotiateProtocolVersion {
                    version,
                    unrecognized,
                }
            }
            _ => return Self::decode_query_reply(frame, body),
        };
        Ok(msg)
    }

    /// The messages of the query cycle, whose bodies stay `Bytes`.
    fn decode_query_reply(frame: Frame, body: Bytes) -> Result<BackendMessage, WireError> {
        use BackendMessage as M;
        Ok(match frame.tag() {
            tag::PARSE_COMPLETE => empty(body, M::ParseComplete)?,
            tag::BIND_COMPLETE => empty(body, M::BindComplete)?,
            tag::CLOSE_COMPLETE => empty(body, M::CloseComplete)?,
            tag::NO_DATA => empty(body, M::NoData)?,
            tag::PORTAL_SUSPENDED => empty(body, M::PortalSuspended)?,
            tag::EMPTY_QUERY_RESPONSE => empty(body, M::EmptyQueryResponse)?,
            tag::PARAMETER_DESCRIPTION => {
                M::ParameterDescription(ParameterDescription::decode(body)?)
            }
            tag::ROW_DESCRIPTION => M::RowDescription(RowDescription::decode(body)?),
            tag::DATA_ROW => M::DataRow(DataRow::decode(body)?),
            tag::COMMAND_COMPLETE => M::CommandComplete(CommandComplete::decode(body)?),
            tag::COPY_IN_RESPONSE => M::CopyInResponse(CopyResponse::decode(body)?),
            tag::COPY_OUT_RESPONSE => M::CopyOutResponse(CopyResponse::decode(body)?),
            tag::COPY_BOTH_RESPONSE => M::CopyBothResponse(CopyResponse::decode(body)?),
            tag::COPY_DATA => M::CopyData(body),
            tag::COPY_DONE => empty(body, M::CopyDone)?,
            tag::NOTIFICATION_RESPONSE => {
                M::NotificationResponse(NotificationResponse::decode(body)?)
            }
            tag::FUNCTION_CALL_RESPONSE => {
                M::FunctionCallResponse(FunctionCallResponse::decode(body)?)
            }
            _ => M::Other(frame),
        })
    }

    /// Appends the message as one frame to `out`, e.g. when replaying a cached result or
    /// answering locally.
    ///
    /// # Panics
    /// Only for values the protocol cannot express (see the `encode` of each message).
    pub fn encode(&self, out: &mut BytesMut) {
        use BackendMessage as M;
        match self {
            M::Authentication(a) => a.encode(out),
            M::ParameterStatus { name, value } => put_message(out, tag::PARAMETER_STATUS, |b| {
                put_cstr(b, name);
                put_cstr(b, value);
            }),
            M::BackendKeyData(key) => put_message(out, tag::BACKEND_KEY_DATA, |b| {
                b.put_i32(key.process_id);
                b.put_i32(key.secret_key);
            }),
            M::ReadyForQuery(status) => {
                put_message(out, tag::READY_FOR_QUERY, |b| b.put_u8(status.as_byte()))
            }
            M::ErrorResponse(e) => e.encode_into(out),
            M::NoticeResponse(e) => e.encode_notice_into(out),
            M::NegotiateProtocolVersion {
                version,
                unrecognized,
            } => put_message(out, tag::NEGOTIATE_PROTOCOL_VERSION, |b| {
                b.put_i32(*version);
                b.put_i32(unrecognized.len() as i32);
                for o in unrecognized {
                    put_cstr(b, o);
                }
            }),
            M::ParameterDescription(m) => m.encode(out),
            M::RowDescription(m) => m.encode(out),
            M::DataRow(m) => m.encode(out),
            M::CommandComplete(m) => m.encode(out),
            M::CopyInResponse(m) => m.encode(tag::COPY_IN_RESPONSE, out),
            M::CopyOutResponse(m) => m.encode(tag::COPY_OUT_RESPONSE, out),
            M::CopyBothResponse(m) => m.encode(tag::COPY_BOTH_RESPONSE, out),
            M::CopyData(data) => put_message(out, tag::COPY_DATA, |b| b.extend_from_slice(data)),
            M::NotificationResponse(m) => m.encode(out),
            M::FunctionCallResponse(m) => m.encode(out),
            M::ParseComplete
            | M::BindComplete
            | M::CloseComplete
            | M::NoData
            | M::PortalSuspended
            | M::EmptyQueryResponse
            | M::CopyDone => put_message(out, self.tag(), |_| {}),
            M::Other(frame) => out.extend_from_slice(frame.raw()),
        }
    }

    /// The type byte this message is sent with, for logs and "unexpected message" errors.
    pub fn tag(&self) -> u8 {
        use BackendMessage as M;
        match self {
            M::Authentication(_) => tag::AUTHENTICATION,
            M::ParameterStatus { .. } => tag::PARAMETER_STATUS,
            M::BackendKeyData(_) => tag::BACKEND_KEY_DATA,
            M::ReadyForQuery(_) => tag::READY_FOR_QUERY,
            M::ErrorResponse(_) => tag::ERROR_RESPONSE,
            M::NoticeResponse(_) => tag::NOTICE_RESPONSE,
            M::NegotiateProtocolVersion { .. } => tag::NEGOTIATE_PROTOCOL_VERSION,
            M::ParseComplete => tag::PARSE_COMPLETE,
            M::BindComplete => tag::BIND_COMPLETE,
            M::CloseComplete => tag::CLOSE_COMPLETE,
            M::NoData => tag::NO_DATA,
            M::PortalSuspended => tag::PORTAL_SUSPENDED,
            M::EmptyQueryResponse => tag::EMPTY_QUERY_RESPONSE,
            M::ParameterDescription(_) => tag::PARAMETER_DESCRIPTION,
            M::RowDescription(_) => tag::ROW_DESCRIPTION,
            M::DataRow(_) => tag::DATA_ROW,
            M::CommandComplete(_) => tag::COMMAND_COMPLETE,
            M::CopyInResponse(_) => tag::COPY_IN_RESPONSE,
            M::CopyOutResponse(_) => tag::COPY_OUT_RESPONSE,
            M::CopyBothResponse(_) => tag::COPY_BOTH_RESPONSE,
            M::CopyData(_) => tag::COPY_DATA,
            M::CopyDone => tag::COPY_DONE,
            M::NotificationResponse(_) => tag::NOTIFICATION_RESPONSE,
            M::FunctionCallResponse(_) => tag::FUNCTION_CALL_RESPONSE,
            M::Other(frame) => frame.tag(),
        }
    }
}

/// Accepts a message that has no body; bytes in it mean the peer is not speaking protocol 3.
fn empty(body: Bytes, msg: BackendMessage) -> Result<BackendMessage, WireError> {
    if body.is_empty() {
        Ok(msg)
    } else {
        Err(WireError::Malformed(
            "unexpected body in a message without fields",
        ))
    }
}

/// AuthenticationOk.
pub fn authentication_ok() -> Bytes {
    auth_frame(0, &[])
}

/// AuthenticationCleartextPassword.
pub fn authentication_cleartext() -> Bytes {
    auth_frame(3, &[])
}

/// AuthenticationMD5Password with the salt the client must mix in.
pub fn authentication_md5(salt: [u8; 4]) -> Bytes {
    auth_frame(5, &salt)
}

/// AuthenticationSASL listing mechanisms.
pub fn authentication_sasl(mechanisms: &[&str]) -> Bytes {
    let mut data = BytesMut::new();
    for m in mechanisms {
        put_cstr(&mut data, m);
    }
    data.put_u8(0);
    auth_frame(10, &data)
}

/// AuthenticationSASLContinue carrying the server-first message.
pub fn authentication_sasl_continue(data: &[u8]) -> Bytes {
    auth_frame(11, data)
}

/// AuthenticationSASLFinal carrying the server-final message.
pub fn authentication_sasl_final(data: &[u8]) -> Bytes {
    auth_frame(12, data)
}

fn auth_frame(code: i32, data: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(9 + data.len());
    put_auth(&mut out, code, data);
    out.freeze()
}

fn put_auth(out: &mut BytesMut, code: i32, data: &[u8]) {
    put_message(out, tag::AUTHENTICATION, |b| {
        b.put_i32(code);
        b.extend_from_slice(data);
    });
}

/// ParameterStatus.
pub fn parameter_status(name: &str, value: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(7 + name.len() + value.len());
    put_message(&mut out, tag::PARAMETER_STATUS, |b| {
        put_cstr(b, name);
        put_cstr(b, value);
    });
    out.freeze()
}

/// BackendKeyData with the key a client must use to cancel its queries.
pub fn backend_key_data(key: CancelKey) -> Bytes {
    let mut out = BytesMut::with_capacity(13);
    put_message(&mut out, tag::BACKEND_KEY_DATA, |b| {
        b.put_i32(key.process_id);
        b.put_i32(key.secret_key);
    });
    out.freeze()
}

/// ReadyForQuery.
pub fn ready_for_query(status: TransactionStatus) -> Bytes {
    let mut out = BytesMut::with_capacity(6);
    put_message(&mut out, tag::READY_FOR_QUERY, |b| {
        b.put_u8(status.as_byte())
    });
    out.freeze()
}

/// NegotiateProtocolVersion: the newest protocol version supported (major and minor, as
/// PostgreSQL sends it: clients such as libpq 18 read it whole and refuse a major version
/// below 3) and the protocol options (`_pq_.*`) that were not recognized.
pub fn negotiate_protocol_version(version: i32, unrecognized: &[&str]) -> Bytes {
    let mut out = BytesMut::new();
    put_message(&mut out, tag::NEGOTIATE_PROTOCOL_VERSION, |b| {
        b.put_i32(version);
        b.put_i32(unrecognized.len() as i32);
        for o in unrecognized {
            put_cstr(b, o);
        }
    });
    out.freeze()
}

/// CommandComplete with a command tag such as `SELECT 3` or `SHOW`.
pub fn command_complete(command_tag: &str, out: &mut BytesMut) {
    put_message(out, tag::COMMAND_COMPLETE, |b| put_cstr(b, command_tag));
}

/// EmptyQueryResponse, the answer to an empty query string.
pub fn empty_query_response(out: &mut BytesMut) {
    put_message(out, tag::EMPTY_QUERY_RESPONSE, |_| {});
}

/// RowDescription for columns that are all `text` in text format, as the admin console answers.
pub fn row_description_text(columns: &[&str], out: &mut BytesMut) {
    const TEXT_OID: i32 = 25;
    put_message(out, tag::ROW_DESCRIPTION, |b| {
        b.put_i16(columns.len() as i16);
        for c in columns {
            put_cstr(b, c);
            b.put_i32(0); // table oid
            b.put_i16(0); // column number
            b.put_i32(TEXT_OID);
            b.put_i16(-1); // type size
            b.put_i32(-1); // type modifier
            b.put_i16(0); // text format
        }
    });
}

/// DataRow with text values; `None` is SQL NULL.
pub fn data_row_text<S: AsRef<str>>(values: &[Option<S>], out: &mut BytesMut) {
    put_message(out, tag::DATA_ROW, |b| {
        b.put_i16(values.len() as i16);
        for v in values {
            match v {
                Some(v) => {
                    b.put_i32(v.as_ref().len() as i32);
                    b.extend_from_slice(v.as_ref().as_bytes());
                }
                None => b.put_i32(-1),
            }
        }
    });
}

#[cfg(test)]
mod tests;

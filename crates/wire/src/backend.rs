//! Messages a server sends (`BackendMessage`): the ones pgmemo reads from upstream servers, and
//! encoders for the ones pgmemo sends to clients itself (authentication, parameter status, key
//! data, ready-for-query, and small result sets for the admin console).

use bytes::{BufMut, Bytes, BytesMut};

use crate::buf::{put_cstr, put_message, Reader};
use crate::error::ErrorResponse;
use crate::frame::{Frame, WireError};
use crate::startup::CancelKey;

/// Backend message type bytes that pgmemo looks at.
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

/// The backend messages pgmemo needs to understand; everything else is forwarded as raw frames.
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
    NegotiateProtocolVersion {
        minor: i32,
        unrecognized: Vec<String>,
    },
    /// Any other message, kept whole.
    Other(Frame),
}

impl BackendMessage {
    /// Decodes a frame received from a server.
    pub fn decode(frame: Frame) -> Result<BackendMessage, WireError> {
        let mut r = Reader::new(frame.body());
        let msg = match frame.tag() {
            tag::AUTHENTICATION => BackendMessage::Authentication(match r.i32()? {
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
            }),
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
            tag::ERROR_RESPONSE => {
                BackendMessage::ErrorResponse(ErrorResponse::parse(frame.body())?)
            }
            tag::NOTICE_RESPONSE => {
                BackendMessage::NoticeResponse(ErrorResponse::parse(frame.body())?)
            }
            tag::NEGOTIATE_PROTOCOL_VERSION => {
                let minor = r.i32()?;
                let n = r.i32()?;
                let mut unrecognized = Vec::new();
                for _ in 0..n.max(0) {
                    unrecognized.push(r.cstr()?.to_owned());
                }
                BackendMessage::NegotiateProtocolVersion {
                    minor,
                    unrecognized,
                }
            }
            _ => BackendMessage::Other(frame),
        };
        Ok(msg)
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
    put_message(&mut out, tag::AUTHENTICATION, |b| {
        b.put_i32(code);
        b.extend_from_slice(data);
    });
    out.freeze()
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

/// NegotiateProtocolVersion: the newest minor version supported and the protocol options
/// (`_pq_.*`) that were not recognized.
pub fn negotiate_protocol_version(minor: i32, unrecognized: &[&str]) -> Bytes {
    let mut out = BytesMut::new();
    put_message(&mut out, tag::NEGOTIATE_PROTOCOL_VERSION, |b| {
        b.put_i32(minor);
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
mod tests {
    use super::*;

    fn decode(raw: Bytes) -> BackendMessage {
        let mut buf = BytesMut::from(&raw[..]);
        let f = Frame::decode(&mut buf, 1 << 20).unwrap().unwrap();
        assert!(buf.is_empty());
        BackendMessage::decode(f).unwrap()
    }

    #[test]
    fn round_trips() {
        assert_eq!(
            decode(authentication_ok()),
            BackendMessage::Authentication(Authentication::Ok)
        );
        assert_eq!(
            decode(authentication_md5([1, 2, 3, 4])),
            BackendMessage::Authentication(Authentication::Md5Password { salt: [1, 2, 3, 4] })
        );
        assert_eq!(
            decode(authentication_sasl(&[
                "SCRAM-SHA-256",
                "SCRAM-SHA-256-PLUS"
            ])),
            BackendMessage::Authentication(Authentication::Sasl {
                mechanisms: vec!["SCRAM-SHA-256".into(), "SCRAM-SHA-256-PLUS".into()]
            })
        );
        assert_eq!(
            decode(parameter_status("TimeZone", "UTC")),
            BackendMessage::ParameterStatus {
                name: "TimeZone".into(),
                value: "UTC".into()
            }
        );
        let key = CancelKey {
            process_id: 42,
            secret_key: 7,
        };
        assert_eq!(
            decode(backend_key_data(key)),
            BackendMessage::BackendKeyData(key)
        );
        assert_eq!(
            decode(ready_for_query(TransactionStatus::Failed)),
            BackendMessage::ReadyForQuery(TransactionStatus::Failed)
        );
        assert_eq!(
            decode(negotiate_protocol_version(0, &["_pq_.x"])),
            BackendMessage::NegotiateProtocolVersion {
                minor: 0,
                unrecognized: vec!["_pq_.x".into()]
            }
        );
    }

    #[test]
    fn golden_ready_for_query() {
        assert_eq!(
            &ready_for_query(TransactionStatus::Idle)[..],
            b"Z\0\0\0\x05I"
        );
    }
}

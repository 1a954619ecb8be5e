//! The untagged first packet of a connection: StartupMessage, SSLRequest, GSSENCRequest or
//! CancelRequest, all framed as a 4-byte length followed by a 4-byte code.

use bytes::{BufMut, Bytes, BytesMut};

use crate::buf::{put_cstr, Reader};
use crate::frame::WireError;

/// PostgreSQL's own limit for a startup packet (`MAX_STARTUP_PACKET_LENGTH`).
pub const MAX_STARTUP_PACKET_LEN: usize = 10_000;

const CANCEL_REQUEST_CODE: i32 = 80877102;
const SSL_REQUEST_CODE: i32 = 80877103;
const GSSENC_REQUEST_CODE: i32 = 80877104;
const PROTOCOL_3_MAJOR: u16 = 3;

/// The first packet a client sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupPacket {
    /// Asks to upgrade the connection to TLS before the real startup packet.
    SslRequest,
    /// Asks for GSSAPI encryption, which pgmemo declines with 'N'.
    GssEncRequest,
    /// Asks to cancel the query running on the session identified by the key.
    CancelRequest(CancelKey),
    /// Opens a session with protocol 3.`minor` and the given parameters (`user`, `database`, ...),
    /// in the order received.
    Startup(StartupMessage),
}

/// The (process id, secret) pair of BackendKeyData, used by CancelRequest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CancelKey {
    pub process_id: i32,
    pub secret_key: i32,
}

impl CancelKey {
    /// Encodes a CancelRequest packet carrying this key, as sent to a server.
    pub fn encode_cancel_request(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(16);
        out.put_i32(16);
        out.put_i32(CANCEL_REQUEST_CODE);
        out.put_i32(self.process_id);
        out.put_i32(self.secret_key);
        out.freeze()
    }
}

/// A protocol-3 StartupMessage.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StartupMessage {
    /// The minor protocol version the client asked for (0 for 3.0).
    pub minor_version: u16,
    /// Parameters in the order sent. Protocol options (`_pq_.*`) are included.
    pub params: Vec<(String, String)>,
}

impl StartupMessage {
    /// Returns the value of a startup parameter.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Encodes the message as protocol 3.0 with the given parameters, as pgmemo sends it to a
    /// server.
    pub fn encode<'a>(params: impl IntoIterator<Item = (&'a str, &'a str)>) -> Bytes {
        let mut out = BytesMut::with_capacity(128);
        out.put_i32(0);
        out.put_i32(i32::from(PROTOCOL_3_MAJOR) << 16);
        for (k, v) in params {
            put_cstr(&mut out, k);
            put_cstr(&mut out, v);
        }
        out.put_u8(0);
        let len = out.len() as i32;
        out[..4].copy_from_slice(&len.to_be_bytes());
        out.freeze()
    }
}

impl StartupPacket {
    /// Decodes the first packet from `buf`, consuming it when complete. Anything that is not a
    /// well-formed packet of a known kind is an error: the caller answers with a FATAL
    /// ErrorResponse and closes, as PostgreSQL does.
    pub fn decode(buf: &mut BytesMut) -> Result<Option<StartupPacket>, WireError> {
        if buf.len() < 4 {
            return Ok(None);
        }
        let len = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
        if len < 8 || len as usize > MAX_STARTUP_PACKET_LEN {
            return Err(WireError::InvalidStartup(
                "invalid length of startup packet",
            ));
        }
        let len = len as usize;
        if buf.len() < len {
            return Ok(None);
        }
        let packet = buf.split_to(len);
        let mut r = Reader::new(&packet[4..]);
        let code = r.i32()?;
        match code {
            SSL_REQUEST_CODE if len == 8 => Ok(Some(StartupPacket::SslRequest)),
            GSSENC_REQUEST_CODE if len == 8 => Ok(Some(StartupPacket::GssEncRequest)),
            CANCEL_REQUEST_CODE if len == 16 => Ok(Some(StartupPacket::CancelRequest(CancelKey {
                process_id: r.i32()?,
                secret_key: r.i32()?,
            }))),
            SSL_REQUEST_CODE | GSSENC_REQUEST_CODE | CANCEL_REQUEST_CODE => Err(
                WireError::InvalidStartup("invalid length of startup packet"),
            ),
            _ => {
                let major = (code >> 16) as u16;
                let minor = (code & 0xffff) as u16;
                if major != PROTOCOL_3_MAJOR {
                    return Err(WireError::UnsupportedProtocol { major, minor });
                }
                let mut params = Vec::new();
                loop {
                    let name = r.cstr()?;
                    if name.is_empty() {
                        break;
                    }
                    let value = r.cstr()?;
                    params.push((name.to_owned(), value.to_owned()));
                }
                if !r.is_empty() {
                    return Err(WireError::InvalidStartup("trailing bytes after parameters"));
                }
                Ok(Some(StartupPacket::Startup(StartupMessage {
                    minor_version: minor,
                    params,
                })))
            }
        }
    }
}

/// The one-byte answer to SSLRequest/GSSENCRequest.
pub fn encryption_answer(accept: bool) -> &'static [u8] {
    if accept {
        b"S"
    } else {
        b"N"
    }
}

/// Encodes an SSLRequest, as pgmemo sends it to a server before TLS.
pub fn encode_ssl_request() -> Bytes {
    let mut out = BytesMut::with_capacity(8);
    out.put_i32(8);
    out.put_i32(SSL_REQUEST_CODE);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn startup_round_trip() {
        let raw = StartupMessage::encode([("user", "alice"), ("database", "db")]);
        let mut buf = BytesMut::from(&raw[..]);
        let p = StartupPacket::decode(&mut buf).unwrap().unwrap();
        let StartupPacket::Startup(m) = p else {
            panic!("not a startup")
        };
        assert_eq!(m.minor_version, 0);
        assert_eq!(m.param("user"), Some("alice"));
        assert_eq!(m.param("database"), Some("db"));
        assert!(buf.is_empty());
    }

    #[test]
    fn special_requests() {
        let mut buf = BytesMut::from(&encode_ssl_request()[..]);
        assert_eq!(
            StartupPacket::decode(&mut buf).unwrap(),
            Some(StartupPacket::SslRequest)
        );
        let key = CancelKey {
            process_id: 7,
            secret_key: -3,
        };
        let mut buf = BytesMut::from(&key.encode_cancel_request()[..]);
        assert_eq!(
            StartupPacket::decode(&mut buf).unwrap(),
            Some(StartupPacket::CancelRequest(key))
        );
    }

    #[test]
    fn partial_and_garbage() {
        let raw = StartupMessage::encode([("user", "a")]);
        let mut buf = BytesMut::from(&raw[..raw.len() - 1]);
        assert_eq!(StartupPacket::decode(&mut buf).unwrap(), None);
        let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\n\r\n"[..]);
        assert!(StartupPacket::decode(&mut buf).is_err());
        let mut buf = BytesMut::from(&b"\0\0\0\x0c\0\x02\0\0abcd"[..]);
        assert_eq!(
            StartupPacket::decode(&mut buf),
            Err(WireError::UnsupportedProtocol { major: 2, minor: 0 })
        );
        // missing final terminator
        let mut buf = BytesMut::from(&b"\0\0\0\x0e\0\x03\0\0user\0a"[..]);
        assert!(StartupPacket::decode(&mut buf).is_err());
    }

    proptest::proptest! {
        #[test]
        fn decode_never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let mut buf = BytesMut::from(&data[..]);
            let _ = StartupPacket::decode(&mut buf);
        }
    }
}

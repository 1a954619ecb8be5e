//! The opening of a client connection: SSLRequest/GSSENCRequest answers and the TLS upgrade,
//! CancelRequest forwarding, and the StartupMessage with protocol-version negotiation.

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wire::startup::{encryption_answer, StartupMessage, StartupPacket};
use wire::{backend, sqlstate, ErrorResponse};

use super::{ClientConn, ClientError};
use crate::net::{FastSocket, MaybeTls, Peer};
use crate::shared::Shared;
use crate::stats::Stats;

/// What the first packets of a connection amounted to.
pub enum Opening {
    /// A session to log in.
    Session(ClientConn, StartupMessage),
    /// A cancel request, already forwarded; the connection is done.
    Cancel,
}

/// Reads the first packet(s). Errors are returned for the caller to report; a connection that
/// sends garbage gets a FATAL 08P01 and is closed, as PostgreSQL does.
pub async fn open(
    socket: FastSocket,
    peer: Peer,
    shared: &Arc<Shared>,
) -> Result<Opening, (Option<ClientConn>, ClientError)> {
    let mut conn = ClientConn {
        stream: MaybeTls::Plain(socket),
        buf: BytesMut::with_capacity(1024),
        peer,
    };
    let tls = shared.client_tls();
    loop {
        let packet = match read_packet(&mut conn).await {
            Ok(p) => p,
            Err(e) => return Err((Some(conn), e)),
        };
        match packet {
            StartupPacket::SslRequest => {
                // As PostgreSQL: no TLS over a Unix-domain socket.
                let offer = match (&*tls, &conn.stream) {
                    (Some(t), MaybeTls::Plain(_)) if peer != Peer::Unix => Some(t.acceptor.clone()),
                    _ => None,
                };
                if let Err(e) = conn
                    .stream
                    .write_all(encryption_answer(offer.is_some()))
                    .await
                {
                    return Err((None, e.into()));
                }
                if let Some(acceptor) = offer {
                    if !conn.buf.is_empty() {
                        // Bytes sent before the handshake would be trusted as if encrypted.
                        let e = ErrorResponse::fatal(
                            sqlstate::PROTOCOL_VIOLATION,
                            "received unencrypted data after SSL request",
                        );
                        return Err((Some(conn), ClientError::Refused(e)));
                    }
                    let MaybeTls::Plain(tcp) = conn.stream else {
                        unreachable!("offer is only made on plain connections")
                    };
                    match acceptor.accept(tcp).await {
                        Ok(s) => conn.stream = MaybeTls::Tls(Box::new(s)),
                        Err(e) => {
                            tracing::info!(%peer, error = %e, "TLS handshake with client failed");
                            return Err((None, ClientError::Io(e)));
                        }
                    }
                }
            }
            StartupPacket::GssEncRequest => {
                if let Err(e) = conn.stream.write_all(encryption_answer(false)).await {
                    return Err((None, e.into()));
                }
            }
            StartupPacket::CancelRequest(key) => {
                Stats::bump(&shared.stats.cancel_requests);
                shared.cancels.cancel(key).await;
                return Ok(Opening::Cancel);
            }
            StartupPacket::Startup(msg) => {
                if let Some(t) = &*tls {
                    // A Unix-domain socket never leaves the machine: TLS is neither offered
                    // nor required there (PostgreSQL offers none on its socket either).
                    if t.required && !conn.stream.is_tls() && peer != Peer::Unix {
                        let e = ErrorResponse::fatal(
                            sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
                            "pgmemo requires TLS connections (client_tls_sslmode = require)",
                        );
                        return Err((Some(conn), ClientError::Refused(e)));
                    }
                }
                if let Err(e) = negotiate_version(&mut conn, &msg).await {
                    return Err((None, e));
                }
                if let Err(e) = check_startup(&msg) {
                    return Err((Some(conn), ClientError::Refused(e)));
                }
                return Ok(Opening::Session(conn, msg));
            }
        }
    }
}

async fn read_packet(conn: &mut ClientConn) -> Result<StartupPacket, ClientError> {
    loop {
        if let Some(p) = StartupPacket::decode(&mut conn.buf)? {
            return Ok(p);
        }
        if conn.stream.read_buf(&mut conn.buf).await? == 0 {
            return Err(ClientError::Disconnected);
        }
    }
}

/// Protocol 3.0, the version pgmemo speaks, as NegotiateProtocolVersion carries it.
const PROTOCOL_3_0: i32 = 0x0003_0000;

/// Answers a request for protocol 3.x (x > 0) or `_pq_.` options with NegotiateProtocolVersion,
/// as PostgreSQL does: pgmemo speaks 3.0 and ignores unknown protocol options.
async fn negotiate_version(conn: &mut ClientConn, msg: &StartupMessage) -> Result<(), ClientError> {
    let unknown: Vec<&str> = msg
        .params
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| k.starts_with("_pq_."))
        .collect();
    if msg.minor_version > 0 || !unknown.is_empty() {
        conn.send(&backend::negotiate_protocol_version(PROTOCOL_3_0, &unknown))
            .await?;
    }
    Ok(())
}

/// Refuses startup requests pgmemo cannot serve, with PostgreSQL's wording where it has one.
fn check_startup(msg: &StartupMessage) -> Result<(), ErrorResponse> {
    if msg.param("user").is_none_or(str::is_empty) {
        return Err(ErrorResponse::fatal(
            sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
            "no PostgreSQL user name specified in startup packet",
        ));
    }
    if let Some(r) = msg.param("replication") {
        if !matches!(
            r.to_ascii_lowercase().as_str(),
            "false" | "off" | "no" | "0"
        ) {
            return Err(ErrorResponse::fatal(
                sqlstate::FEATURE_NOT_SUPPORTED,
                "pgmemo does not support replication connections (COPY BOTH)",
            )
            .with_hint("Connect replication clients directly to PostgreSQL."));
        }
    }
    Ok(())
}

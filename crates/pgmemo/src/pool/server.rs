//! One connection to a PostgreSQL server: opening it (TCP, optional TLS, StartupMessage),
//! logging in as a client when pgmemo holds the credentials, finishing startup, and the small
//! simple-query exchanges the pool needs (reset, health check, rollback).

use bytes::BytesMut;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wire::backend::{Authentication, BackendMessage, TransactionStatus};
use wire::scram::{ScramKeyClient, ScramKeys};
use wire::startup::{encode_ssl_request, CancelKey, StartupMessage};
use wire::{frontend, ErrorResponse, Frame, WireError};

use crate::cancel::CancelSlot;
use crate::net::{self, FastSocket, MaybeTls, ServerStream};
use crate::tls::UpstreamTls;

/// Servers may send large rows; pgmemo only frames whole the small messages it reads itself.
const MAX_SERVER_FRAME: usize = 1 << 30;

/// What pgmemo can log in to a server with.
#[derive(Debug, Clone, Default)]
pub enum ServerCredential {
    /// Nothing: the server must not ask (trust).
    #[default]
    None,
    /// A clear-text password: answers cleartext, md5 and SCRAM requests.
    Password(String),
    /// SCRAM keys recovered from the client's own SCRAM login against a userlist verifier:
    /// answers SCRAM requests of a server that stores the same verifier.
    ScramKeys(ScramKeys),
}

/// What went wrong with a server connection.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("could not connect to server {host}:{port}: {source}")]
    Connect {
        host: String,
        port: u16,
        source: std::io::Error,
    },
    #[error("server connection lost: {0}")]
    Io(#[from] std::io::Error),
    #[error("server closed the connection unexpectedly")]
    Closed,
    #[error("TLS with the server failed: {0}")]
    Tls(String),
    #[error("server does not support TLS, but sslmode requires it")]
    TlsRefused,
    #[error("invalid message from server: {0}")]
    Protocol(#[from] WireError),
    #[error("unexpected message '{}' from server", char::from(*.0))]
    Unexpected(u8),
    #[error("server reported: {0}")]
    Server(ErrorResponse),
    #[error("server asked for a password, but pgmemo has none for user \"{0}\"")]
    NoPassword(String),
    #[error("server requested authentication method {0}, which pgmemo does not support")]
    UnsupportedAuth(i32),
    #[error("SCRAM exchange with the server failed: {0}")]
    Scram(String),
    #[error("server did not answer within {0:?}")]
    Timeout(std::time::Duration),
}

impl ServerError {
    /// The error a client sees for this failure: the server's own error when there is one
    /// (same SQLSTATE and message as a direct connection), else 08006.
    pub fn to_client_error(&self) -> ErrorResponse {
        match self {
            ServerError::Server(e) => e.clone(),
            other => ErrorResponse::fatal(wire::sqlstate::CONNECTION_FAILURE, other.to_string()),
        }
    }
}

/// An open server connection and what pgmemo knows about its session.
pub struct ServerConn {
    /// The socket.
    pub stream: ServerStream,
    /// Bytes read from the server and not consumed yet.
    pub read_buf: BytesMut,
    /// The server's BackendKeyData, for forwarding cancel requests.
    pub key: Option<CancelKey>,
    /// Current values of the server's reported parameters (ParameterStatus), in arrival order.
    pub params: Vec<(String, String)>,
    /// Hash of the startup parameters the connection was opened with; a pooled connection is
    /// only reused by clients whose startup parameters hash the same.
    pub fingerprint: u64,
    /// Where the server is, for cancel requests.
    pub host: std::sync::Arc<str>,
    pub port: u16,
    /// Transaction status from the last ReadyForQuery.
    pub status: TransactionStatus,
    pub created: super::Tick,
    pub last_used: super::Tick,
    /// What transaction pooling has left on this connection for the clients it serves.
    pub session: ServerSession,
    /// The connection's line in `SHOW SERVERS` (pool connections only), dropped with it.
    pub listing: Option<super::ServerListing>,
}

/// Session state a transaction-pooled server connection carries between clients: the
/// statements pgmemo prepared on it, whose unnamed statement it holds, and the settings
/// pgmemo set on it.
#[derive(Default)]
pub struct ServerSession {
    pub statements: super::ServerStatements,
    /// `(client tag, parse number)` of the client Parse that made the unnamed statement
    /// (`(0, 0)`: one pgmemo made for itself, see `transaction::link::OWN_UNNAMED`).
    pub unnamed: Option<(u64, u64)>,
    pub settings: super::settings::ServerSettings,
    /// Statements whose plan went stale after DDL: closed before the next request, so that
    /// their next use prepares them again with the new result shape.
    pub stale: Vec<String>,
    /// Texts clients sent as their unnamed statement, some prepared under pgmemo's names
    /// (`max_promoted_statements`).
    pub promoted: super::PromotedStatements,
}

impl ServerConn {
    /// Notes in `SHOW SERVERS` what the connection is doing since `at`.
    pub fn set_state(&self, state: super::ServerState, at: super::Tick) {
        if let Some(listing) = &self.listing {
            listing.set_state(state, at);
        }
    }

    /// Whether the connection to the server is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self.stream, MaybeTls::Tls(_))
    }

    /// Connects, negotiates TLS as configured and sends the StartupMessage. Authentication is
    /// the caller's next step ([`ServerConn::authenticate`] or a relay).
    ///
    /// Boxed: a connection moves between the pool, leases and sessions on every transaction
    /// in transaction pooling, and moving the struct itself cost ~12 copies of its 300-odd
    /// bytes per transaction.
    pub async fn open(
        host: &str,
        port: u16,
        tls: Option<&UpstreamTls>,
        startup: &[(String, String)],
        fingerprint: u64,
        keepalive: &net::TcpKeepalive,
    ) -> Result<Box<ServerConn>, ServerError> {
        let socket = net::connect(host, port, keepalive)
            .await
            .map_err(|source| ServerError::Connect {
                host: host.to_owned(),
                port,
                source,
            })?;
        // As libpq: TLS is never tried over a Unix-domain socket, whatever sslmode says
        // (the socket's file permissions and the server's peer checks protect it).
        let tls = tls.filter(|_| !net::is_unix_socket_dir(host));
        let stream = match tls {
            None => MaybeTls::Plain(socket),
            Some(tls) => negotiate_tls(socket, tls, host).await?,
        };
        let mut conn = Box::new(ServerConn {
            stream,
            read_buf: BytesMut::with_capacity(16 * 1024),
            key: None,
            params: Vec::new(),
            fingerprint,
            host: host.into(),
            port,
            status: TransactionStatus::Idle,
            created: super::Tick::now(),
            last_used: super::Tick::now(),
            session: ServerSession::default(),
            listing: None,
        });
        let msg = StartupMessage::encode(startup.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        conn.send(&msg).await?;
        Ok(conn)
    }

    /// Writes bytes to the server.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), ServerError> {
        self.stream.write_all(bytes).await?;
        self.stream.flush().await?;
        Ok(())
    }

    /// Reads one whole message.
    pub async fn read_frame(&mut self) -> Result<Frame, ServerError> {
        loop {
            if let Some(frame) = Frame::decode(&mut self.read_buf, MAX_SERVER_FRAME)? {
                return Ok(frame);
            }
            if self.read_buf.capacity() - self.read_buf.len() < 4096 {
                self.read_buf.reserve(16 * 1024);
            }
            if self.stream.read_buf(&mut self.read_buf).await? == 0 {
                return Err(ServerError::Closed);
            }
        }
    }

    /// Logs in with pgmemo's own credentials (trust, cleartext, md5 or SCRAM-SHA-256).
    pub async fn authenticate(
        &mut self,
        user: &str,
        credential: &ServerCredential,
    ) -> Result<(), ServerError> {
        let password = match credential {
            ServerCredential::Password(p) => Some(p.as_str()),
            _ => None,
        };
        let mut scram: Option<ScramSha256> = None;
        let mut key_scram: Option<ScramKeyClient> = None;
        loop {
            let frame = self.read_frame().await?;
            let tag = frame.tag();
            let auth = match BackendMessage::decode(frame)? {
                BackendMessage::Authentication(a) => a,
                BackendMessage::ErrorResponse(e) => return Err(ServerError::Server(e)),
                BackendMessage::NegotiateProtocolVersion { .. } => continue,
                BackendMessage::NoticeResponse(_) => continue,
                _ => return Err(ServerError::Unexpected(tag)),
            };
            let need_pw = || password.ok_or_else(|| ServerError::NoPassword(user.to_owned()));
            match auth {
                // SCRAM authenticates both sides: a server that ends the exchange before its
                // SASLFinal never proved it knows the password (an impostor would).
                Authentication::Ok if scram.is_some() || key_scram.is_some() => {
                    return Err(ServerError::Scram(
                        "the server ended SCRAM authentication without proving it knows the \
                         password (AuthenticationOk before SASLFinal)"
                            .into(),
                    ))
                }
                Authentication::Ok => return Ok(()),
                Authentication::CleartextPassword => {
                    self.send(&frontend::password_message(need_pw()?)).await?;
                }
                Authentication::Md5Password { salt } => {
                    let secret = wire::md5::md5_secret(user, need_pw()?);
                    let resp = wire::md5::md5_response_from_secret(&secret, salt)
                        .expect("md5_secret yields a valid secret");
                    self.send(&frontend::password_message(&resp)).await?;
                }
                Authentication::Sasl { mechanisms } => {
                    if !mechanisms.iter().any(|m| m == wire::scram::SCRAM_SHA_256) {
                        return Err(ServerError::Scram(format!(
                            "no supported SASL mechanism in {mechanisms:?}"
                        )));
                    }
                    if let ServerCredential::ScramKeys(keys) = credential {
                        let (client, first) = ScramKeyClient::new(keys.clone());
                        self.send(&frontend::sasl_initial_response(
                            wire::scram::SCRAM_SHA_256,
                            first.as_bytes(),
                        ))
                        .await?;
                        key_scram = Some(client);
                        continue;
                    }
                    let s = ScramSha256::new(need_pw()?.as_bytes(), ChannelBinding::unsupported());
                    self.send(&frontend::sasl_initial_response(
                        wire::scram::SCRAM_SHA_256,
                        s.message(),
                    ))
                    .await?;
                    scram = Some(s);
                }
                Authentication::SaslContinue { data } if key_scram.is_some() => {
                    let client = key_scram.as_mut().expect("checked by the guard");
                    let fin = client
                        .server_first(&data)
                        .map_err(|e| ServerError::Scram(e.to_string()))?;
                    self.send(&frontend::sasl_response(fin.as_bytes())).await?;
                }
                Authentication::SaslFinal { data } if key_scram.is_some() => {
                    let client = key_scram.take().expect("checked by the guard");
                    client
                        .server_final(&data)
                        .map_err(|e| ServerError::Scram(e.to_string()))?;
                }
                Authentication::SaslContinue { data } => {
                    let s = scram
                        .as_mut()
                        .ok_or(ServerError::Scram("unexpected SASLContinue".into()))?;
                    s.update(&data)
                        .map_err(|e| ServerError::Scram(e.to_string()))?;
                    let msg = frontend::sasl_response(s.message());
                    self.send(&msg).await?;
                }
                Authentication::SaslFinal { data } => {
                    let mut s = scram
                        .take()
                        .ok_or(ServerError::Scram("unexpected SASLFinal".into()))?;
                    s.finish(&data)
                        .map_err(|e| ServerError::Scram(e.to_string()))?;
                }
                Authentication::Unsupported { code } => {
                    return Err(ServerError::UnsupportedAuth(code))
                }
            }
        }
    }

    /// After AuthenticationOk: collects ParameterStatus and BackendKeyData up to the first
    /// ReadyForQuery. A FATAL from the server here (e.g. 3D000) is returned as
    /// [`ServerError::Server`].
    pub async fn finish_startup(&mut self) -> Result<(), ServerError> {
        loop {
            let frame = self.read_frame().await?;
            let tag = frame.tag();
            match BackendMessage::decode(frame)? {
                BackendMessage::ParameterStatus { name, value } => self.set_param(name, value),
                BackendMessage::BackendKeyData(key) => {
                    if let Some(listing) = &self.listing {
                        listing.set_pid(key.process_id as u32);
                    }
                    self.key = Some(key);
                }
                BackendMessage::ReadyForQuery(status) => {
                    self.status = status;
                    return Ok(());
                }
                BackendMessage::ErrorResponse(e) => return Err(ServerError::Server(e)),
                BackendMessage::NoticeResponse(_)
                | BackendMessage::NegotiateProtocolVersion { .. } => {}
                _ => return Err(ServerError::Unexpected(tag)),
            }
        }
    }

    /// Whether an idle connection must be closed rather than lent: past `server_lifetime` or
    /// `server_idle_timeout`, or its server closed it (or spoke unasked).
    pub fn expired(&self, settings: &super::PoolSettings, now: super::Tick) -> bool {
        now.reached(self.created, settings.server_lifetime)
            || now.reached(self.last_used, settings.server_idle_timeout)
            || self.stream.peer_closed_or_spoke()
    }

    /// Records a ParameterStatus value.
    pub fn set_param(&mut self, name: String, value: String) {
        match self.params.iter_mut().find(|(k, _)| *k == name) {
            Some(slot) => slot.1 = value,
            None => self.params.push((name, value)),
        }
    }

    /// Runs a simple query whose result pgmemo does not need, up to ReadyForQuery. Errors from
    /// the server are returned; the connection stays usable after them.
    pub async fn simple_query(&mut self, sql: &str) -> Result<(), ServerError> {
        // A simple Query drops the server's unnamed statement, whoever sends it (a health
        // check, a reset, settings brought in line): a client whose unnamed statement
        // transaction pooling believed still there would get 26000.
        self.session.unnamed = None;
        self.run(&frontend::query(sql), false).await.map(drop)
    }

    /// Runs one statement and returns its rows as text (NULL as `None`), for the catalog
    /// questions pgmemo asks itself (e.g. "is this role a superuser?"). It goes as an
    /// extended-protocol request under a statement name of pgmemo's own
    /// (`frontend::own_queries`), so the server's unnamed statement and portal survive it.
    pub async fn query_text_rows(
        &mut self,
        sql: &str,
    ) -> Result<Vec<Vec<Option<String>>>, ServerError> {
        self.run(&frontend::own_queries(&[sql]), true).await
    }

    /// Runs one statement as a simple Query and returns its rows as text (NULL as `None`).
    /// For connections that refuse the extended protocol: a walsender connection
    /// (`replication=database`) answers a Parse with 08P01, so the invalidation feed asks its
    /// questions this way. Like `simple_query`, it drops the server's unnamed statement.
    pub async fn simple_query_rows(
        &mut self,
        sql: &str,
    ) -> Result<Vec<Vec<Option<String>>>, ServerError> {
        self.session.unnamed = None;
        self.run(&frontend::query(sql), true).await
    }

    /// One round trip up to ReadyForQuery; DataRows are collected only when `keep_rows`.
    async fn run(
        &mut self,
        request: &[u8],
        keep_rows: bool,
    ) -> Result<Vec<Vec<Option<String>>>, ServerError> {
        self.send(request).await?;
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            let frame = self.read_frame().await?;
            let tag = frame.tag();
            match BackendMessage::decode(frame)? {
                BackendMessage::ReadyForQuery(status) => {
                    self.status = status;
                    return match error {
                        Some(e) => Err(ServerError::Server(e)),
                        None => Ok(rows),
                    };
                }
                BackendMessage::ParameterStatus { name, value } => self.set_param(name, value),
                BackendMessage::ErrorResponse(e) => error = Some(e),
                BackendMessage::DataRow(row) if keep_rows => rows.push(
                    row.columns()
                        .map(|c| c.map(|v| String::from_utf8_lossy(&v).into_owned()))
                        .collect(),
                ),
                // pgmemo never issues COPY itself; anything else is result data it drops.
                BackendMessage::CopyInResponse(_)
                | BackendMessage::CopyOutResponse(_)
                | BackendMessage::CopyBothResponse(_) => {
                    return Err(ServerError::Unexpected(tag));
                }
                _ => {}
            }
        }
    }

    /// Makes `slot` send its client's cancel requests to this connection's server process
    /// (nowhere, when the server sent no BackendKeyData).
    pub fn attach_cancel(&self, slot: &CancelSlot) {
        match self.key {
            Some(key) => slot.attach(&self.host, self.port, key),
            // A new connection: nothing of this client's was sent to it yet.
            None => {
                let _ = slot.detach();
            }
        }
    }

    /// Makes `slot` send its client's cancel requests to this connection's server process
    /// once the client's waiting request has been sent to it (see
    /// [`CancelSlot::request_sent`]).
    pub fn stage_cancel(&self, slot: &CancelSlot) {
        slot.stage(&self.host, self.port, self.key);
    }

    /// Sends Terminate and closes, ignoring errors: the connection is being discarded.
    /// Ends the connection after whatever it is still running: Terminate is queued behind
    /// it, and the server's answers are read and dropped until it closes (or `limit`
    /// passes). When this returns, a statement that was running has committed or never will
    /// (unless the limit passed first).
    pub async fn close_after_running(mut self, limit: std::time::Duration) {
        let drained = async {
            self.stream.write_all(&frontend::terminate()).await?;
            self.stream.flush().await?;
            let mut sink = vec![0u8; 32 * 1024];
            while self.stream.read(&mut sink).await? > 0 {}
            Ok::<_, std::io::Error>(())
        };
        if tokio::time::timeout(limit, drained).await.is_err() {
            tracing::warn!(
                ?limit,
                "a server still running a statement was closed before it ended"
            );
        }
        let _ =
            tokio::time::timeout(std::time::Duration::from_secs(1), self.stream.shutdown()).await;
    }

    pub async fn close(mut self) {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async {
            let _ = self.stream.write_all(&frontend::terminate()).await;
            let _ = self.stream.shutdown().await;
        })
        .await;
    }
}

async fn negotiate_tls(
    mut tcp: FastSocket,
    tls: &UpstreamTls,
    host: &str,
) -> Result<ServerStream, ServerError> {
    let server_name = UpstreamTls::server_name(host).map_err(ServerError::Tls)?;
    tcp.write_all(&encode_ssl_request()).await?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer).await?;
    match answer[0] {
        b'S' => {
            let stream = tls
                .connector
                .connect(server_name, tcp)
                .await
                .map_err(|e| ServerError::Tls(e.to_string()))?;
            Ok(MaybeTls::Tls(Box::new(stream)))
        }
        b'N' if !tls.required => Ok(MaybeTls::Plain(tcp)),
        b'N' => Err(ServerError::TlsRefused),
        other => Err(ServerError::Unexpected(other)),
    }
}

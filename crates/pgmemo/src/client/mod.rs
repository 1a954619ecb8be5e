//! Step 2 of the query path: one task per client connection. `startup` negotiates TLS and reads
//! the StartupMessage, `login` authenticates and obtains a server connection, `session` relays
//! messages until the client leaves, and the server connection goes back to its pool clean.

mod auth;
mod cached;
mod conn;
mod deadline;
mod login;
mod quiet;
mod relay;
mod scan;
mod session;
mod startup;
mod transaction;

use std::sync::Arc;

use wire::{sqlstate, ErrorResponse, WireError};

use crate::net::{FastSocket, Peer};
use crate::pool::{PoolError, ServerError};
use crate::shared::Shared;
use crate::stats::Stats;

pub use conn::ClientConn;
pub(crate) use deadline::LoginDeadline;
pub use login::pool_settings;
pub(crate) use login::{give_back_unused, login_unpooled, open_authenticated};

/// Why a client session ended abnormally. Each variant maps to the ErrorResponse the client
/// gets (if it can still get one) in [`ClientError::to_error_response`].
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("client disconnected")]
    Disconnected,
    #[error("client connection error: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol violation: {0}")]
    Protocol(#[from] WireError),
    #[error("{0}")]
    Refused(ErrorResponse),
    #[error("{0}")]
    Server(#[from] ServerError),
    #[error("{0}")]
    Pool(#[from] PoolError),
    #[error("authentication timeout")]
    LoginTimeout,
    /// The error was already sent to the client (e.g. relayed from the server).
    #[error("{0}")]
    AlreadyReported(ErrorResponse),
}

impl ClientError {
    /// The FATAL error to send before closing, if any.
    pub fn to_error_response(&self) -> Option<ErrorResponse> {
        match self {
            ClientError::Disconnected | ClientError::Io(_) | ClientError::AlreadyReported(_) => {
                None
            }
            ClientError::Protocol(WireError::UnsupportedProtocol { major, minor }) => {
                Some(ErrorResponse::fatal(
                    sqlstate::FEATURE_NOT_SUPPORTED,
                    format!(
                        "unsupported frontend protocol {major}.{minor}: server supports 3.0 to 3.0"
                    ),
                ))
            }
            ClientError::Protocol(e @ WireError::TooLarge { .. }) => Some(ErrorResponse::fatal(
                sqlstate::PROGRAM_LIMIT_EXCEEDED,
                format!("{e} (max_message_size)"),
            )),
            ClientError::Protocol(e) => Some(ErrorResponse::fatal(
                sqlstate::PROTOCOL_VIOLATION,
                e.to_string(),
            )),
            ClientError::Refused(e) => Some(e.clone()),
            ClientError::Server(e) => {
                let mut e = e.to_client_error();
                e.severity = "FATAL".into();
                Some(e)
            }
            ClientError::Pool(PoolError::WaitTimeout(_)) => Some(ErrorResponse::fatal(
                sqlstate::TOO_MANY_CONNECTIONS,
                self.to_string(),
            )),
            ClientError::Pool(PoolError::Closed) => Some(ErrorResponse::fatal(
                sqlstate::ADMIN_SHUTDOWN,
                "pgmemo is shutting down",
            )),
            ClientError::LoginTimeout => Some(ErrorResponse::fatal(
                sqlstate::PROTOCOL_VIOLATION,
                "client did not complete authentication in time (client_login_timeout)",
            )),
        }
    }
}

/// Runs one client connection to its end. Never panics on bad input; every failure is logged
/// with the client's address and, where possible, reported to the client as PostgreSQL would.
pub async fn run(socket: FastSocket, peer: Peer, shared: Arc<Shared>) {
    let Some(_slot) = shared.admit_client() else {
        Stats::bump(&shared.stats.clients_rejected);
        tracing::warn!(%peer, "client refused: max_client_conn reached");
        session::refuse(socket, peer, &shared, too_many_clients()).await;
        return;
    };
    Stats::bump(&shared.stats.clients_accepted);
    tracing::debug!(%peer, "client connected");
    session::serve(socket, peer, shared).await;
}

fn too_many_clients() -> ErrorResponse {
    ErrorResponse::fatal(
        sqlstate::TOO_MANY_CONNECTIONS,
        "sorry, too many clients already",
    )
    .with_detail("pgmemo's max_client_conn is reached.")
}

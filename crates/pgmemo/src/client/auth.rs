//! Authentication of a client: either relayed to PostgreSQL over a new server connection
//! (`auth_type = upstream`) or checked by pgmemo against the userlist (trust, md5, SCRAM).

use std::time::Duration;

use rand::RngCore;
use wire::backend::{self, Authentication, BackendMessage};
use wire::frontend::{parse_password, SaslInitialResponse};
use wire::scram::{ScramKeys, ScramSecret, ScramServer, SCRAM_SHA_256};
use wire::{sqlstate, ErrorResponse, WireError};

use super::{ClientConn, ClientError};
use crate::auth::{Secret, Userlist};
use crate::config::AuthType;
use crate::pool::{ServerConn, ServerError};

/// Authentication messages are small; anything bigger is an attack or a bug.
const MAX_AUTH_MESSAGE: usize = 16 * 1024;

/// What pgmemo learned while checking a client itself.
#[derive(Debug, Default)]
pub struct LocalLogin {
    /// The client's clear-text password, when the method revealed it (it never does for md5 or
    /// SCRAM, but a plain userlist entry is as good).
    pub password: Option<String>,
    /// The client's SCRAM keys, when it logged in with SCRAM against a userlist verifier.
    pub scram_keys: Option<ScramKeys>,
}

fn password_failed(user: &str) -> ErrorResponse {
    ErrorResponse::fatal(
        sqlstate::INVALID_PASSWORD,
        format!("password authentication failed for user \"{user}\""),
    )
}

/// Checks the client against the userlist and, on success, sends AuthenticationOk. Failures
/// look like PostgreSQL's (28P01 "password authentication failed for user ..."), including for
/// unknown users, who go through a mock exchange so their absence is not revealed.
/// Not timed here: the caller bounds it by the client's login deadline.
pub async fn authenticate_locally(
    client: &mut ClientConn,
    userlist: &Userlist,
    method: AuthType,
    user: &str,
    seed: &[u8],
) -> Result<LocalLogin, ClientError> {
    let secret = userlist.get(user);
    let login = match method {
        AuthType::Upstream => unreachable!("upstream authentication is relayed"),
        AuthType::Trust => {
            if secret.is_none() {
                return Err(ClientError::Refused(ErrorResponse::fatal(
                    sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
                    format!("role \"{user}\" is not listed in auth_file"),
                )));
            }
            LocalLogin {
                password: plain(secret),
                scram_keys: None,
            }
        }
        AuthType::Md5 if matches!(secret, Some(Secret::Scram(_))) => {
            // Like PostgreSQL with an md5 line and a SCRAM verifier: use SCRAM.
            scram(client, userlist, user, seed).await?
        }
        AuthType::Md5 => md5(client, secret, user).await?,
        AuthType::ScramSha256 => scram(client, userlist, user, seed).await?,
    };
    client.send(&backend::authentication_ok()).await?;
    Ok(login)
}

fn plain(secret: Option<&Secret>) -> Option<String> {
    match secret {
        Some(Secret::Plain(p)) => Some(p.clone()),
        _ => None,
    }
}

async fn read_password_message(client: &mut ClientConn) -> Result<bytes::Bytes, ClientError> {
    let frame = client.read_frame(MAX_AUTH_MESSAGE).await?;
    if frame.tag() != b'p' {
        return Err(ClientError::Protocol(WireError::UnexpectedTag(frame.tag())));
    }
    Ok(frame.body_bytes())
}

async fn md5(
    client: &mut ClientConn,
    secret: Option<&Secret>,
    user: &str,
) -> Result<LocalLogin, ClientError> {
    let mut salt = [0u8; 4];
    rand::thread_rng().fill_bytes(&mut salt);
    client.send(&backend::authentication_md5(salt)).await?;
    let body = read_password_message(client).await?;
    let response = parse_password(&body)?;
    let stored = match secret {
        Some(Secret::Plain(p)) => Some(wire::md5::md5_secret(user, p)),
        Some(Secret::Md5(m)) => Some(m.clone()),
        _ => None,
    };
    match stored {
        Some(s) if wire::md5::verify_md5_response(&s, salt, response) => Ok(LocalLogin {
            password: plain(secret),
            scram_keys: None,
        }),
        _ => Err(ClientError::Refused(password_failed(user))),
    }
}

async fn scram(
    client: &mut ClientConn,
    userlist: &Userlist,
    user: &str,
    seed: &[u8],
) -> Result<LocalLogin, ClientError> {
    let secret = userlist.get(user);
    let (verifier, known) = match secret {
        // Salted like an unknown user's mock: the salt shows nothing. Derived at load.
        Some(Secret::Plain(p)) => match userlist.plain_verifier(user) {
            Some(v) => (v.clone(), true),
            None => (ScramSecret::from_password_for(p, user, seed), true),
        },
        Some(Secret::Scram(s)) => (s.clone(), true),
        // md5 secrets cannot verify SCRAM; unknown users get a mock exchange.
        _ => (ScramSecret::mock(user, seed), false),
    };
    client
        .send(&backend::authentication_sasl(&[SCRAM_SHA_256]))
        .await?;
    let body = read_password_message(client).await?;
    let initial = SaslInitialResponse::parse(&body)?;
    if initial.mechanism != SCRAM_SHA_256 {
        return Err(ClientError::Refused(ErrorResponse::fatal(
            sqlstate::PROTOCOL_VIOLATION,
            "client selected an invalid SASL authentication mechanism",
        )));
    }
    let (server, first) = ScramServer::client_first(verifier, initial.data).map_err(|e| {
        ClientError::Refused(ErrorResponse::fatal(
            sqlstate::PROTOCOL_VIOLATION,
            e.to_string(),
        ))
    })?;
    client
        .send(&backend::authentication_sasl_continue(first.as_bytes()))
        .await?;
    let body = read_password_message(client).await?;
    match server.client_final(&body) {
        Ok(outcome) if known => {
            client
                .send(&backend::authentication_sasl_final(
                    outcome.server_final.as_bytes(),
                ))
                .await?;
            let scram_keys = match secret {
                Some(Secret::Scram(v)) => Some(ScramKeys {
                    client_key: outcome.client_key,
                    server_key: v.server_key,
                }),
                _ => None,
            };
            Ok(LocalLogin {
                password: plain(secret),
                scram_keys,
            })
        }
        _ => Err(ClientError::Refused(password_failed(user))),
    }
}

/// Relays the server's authentication exchange to the client until the server accepts or
/// refuses it. Returns whether the server asked for any credential at all. Server errors are
/// forwarded verbatim, so the client sees exactly what a direct connection would show.
///
/// SCRAM-SHA-256-PLUS is removed from the mechanisms offered: channel binding would bind the
/// client's TLS session with pgmemo, which the server cannot verify.
///
/// The client's replies are not timed here: the caller bounds the whole exchange by the
/// client's login deadline, since the client holds a server connection meanwhile.
/// `on_asked` runs when the server first asks for a credential, before the client answers
/// (logins waiting to learn whether the server trusts need not wait for a slow typist).
pub async fn relay_upstream_auth(
    client: &mut ClientConn,
    server: &mut ServerConn,
    server_timeout: Duration,
    on_asked: &(dyn Fn() + Sync),
) -> Result<bool, ClientError> {
    let mut asked = false;
    loop {
        // The server has `server_timeout` for each answer.
        let frame = tokio::time::timeout(server_timeout, server.read_frame())
            .await
            .map_err(|_| ServerError::Timeout(server_timeout))??;
        match frame.tag() {
            b'R' => {}
            b'E' => {
                let e = ErrorResponse::parse(frame.body()).map_err(ServerError::from)?;
                client.send(frame.raw()).await?;
                return Err(ClientError::AlreadyReported(e));
            }
            b'v' | b'N' => continue,
            other => return Err(ServerError::Unexpected(other).into()),
        }
        let raw = frame.raw().clone();
        let request = match BackendMessage::decode(frame).map_err(ServerError::from)? {
            BackendMessage::Authentication(a) => a,
            _ => unreachable!("tag checked above"),
        };
        let expects_reply = match &request {
            Authentication::Ok => {
                client.send(&raw).await?;
                return Ok(asked);
            }
            Authentication::Sasl { mechanisms } => {
                let offered: Vec<&str> = mechanisms
                    .iter()
                    .map(String::as_str)
                    .filter(|m| !m.ends_with("-PLUS"))
                    .collect();
                if offered.is_empty() {
                    return Err(ClientError::Refused(ErrorResponse::fatal(
                        sqlstate::FEATURE_NOT_SUPPORTED,
                        "server offers only SASL mechanisms with channel binding, which pgmemo cannot relay",
                    )));
                }
                client.send(&backend::authentication_sasl(&offered)).await?;
                true
            }
            Authentication::CleartextPassword
            | Authentication::Md5Password { .. }
            | Authentication::SaslContinue { .. } => {
                client.send(&raw).await?;
                true
            }
            Authentication::SaslFinal { .. } => {
                client.send(&raw).await?;
                false
            }
            Authentication::Unsupported { code } => {
                return Err(ClientError::Refused(ErrorResponse::fatal(
                    sqlstate::FEATURE_NOT_SUPPORTED,
                    format!(
                        "server requested authentication method {code}, which pgmemo cannot relay"
                    ),
                )));
            }
        };
        if !asked {
            on_asked();
        }
        asked = true;
        if expects_reply {
            let reply = client.read_frame(MAX_AUTH_MESSAGE).await?;
            if reply.tag() != b'p' {
                return Err(ClientError::Protocol(WireError::UnexpectedTag(reply.tag())));
            }
            server.send(reply.raw()).await?;
        }
    }
}

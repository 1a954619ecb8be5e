//! The admin console: a client that connects to the virtual database `pgmemo` talks to pgmemo
//! itself, PgBouncer-style, with `SHOW ...` commands and `RELOAD`.
//!
//! Who may: the roles in `admin_users`, or, when that list is empty, the roles that are
//! superusers on the upstream. The client authenticates exactly as for a normal login (against
//! the upstream URL's database, or `postgres`), so the console is as protected as the server.
//! Anyone else gets 42501.

mod command;
mod explain_cache;
mod show_cache;
mod show_clients;
mod show_config;
mod show_help;
mod show_pools;
mod show_replication;
mod show_servers;
mod show_stats;
mod table;

use std::sync::Arc;
use std::time::SystemTime;

use bytes::BytesMut;
use wire::backend::{self, TransactionStatus};
use wire::startup::StartupMessage;
use wire::{sqlstate, ErrorResponse};

pub use command::AdminCommand;
pub use table::Table;

use crate::client::{ClientConn, ClientError, LoginDeadline};
use crate::pool::settings::quote_literal;
use crate::pool::ServerConn;
use crate::registry::ClientInfo;
use crate::shared::Shared;

/// The database name that reaches the console instead of a server.
pub const ADMIN_DATABASE: &str = "pgmemo";

/// Largest query the console accepts; its commands are short.
const MAX_ADMIN_MESSAGE: usize = 64 * 1024;

/// Runs an admin session: authenticate, check the role, then answer commands until the client
/// leaves.
pub async fn serve(
    mut client: ClientConn,
    startup: StartupMessage,
    shared: Arc<Shared>,
    deadline: LoginDeadline,
) {
    let peer = client.peer;
    let user = startup.param("user").unwrap_or_default().to_owned();
    match authorize(&mut client, &startup, &shared, deadline).await {
        Ok(()) => {}
        Err(e) => {
            tracing::info!(%peer, %user, error = %e, "admin console login refused");
            if let Some(err) = e.to_error_response() {
                client.send_error(&err).await;
            }
            return;
        }
    }
    let _entry = shared.clients.add(ClientInfo {
        peer,
        user: user.clone(),
        database: ADMIN_DATABASE.to_owned(),
        tls: client.stream.is_tls(),
        connected_at: SystemTime::now(),
        admin: true,
    });
    tracing::info!(%peer, %user, "admin console session opened");
    if let Err(e) = command_loop(&mut client, &shared).await {
        tracing::debug!(%peer, error = %e, "admin console session ended");
    }
}

/// Authenticates the client like any login (relayed or local, by the same `deadline`), then
/// checks it is an admin.
async fn authorize(
    client: &mut ClientConn,
    startup: &StartupMessage,
    shared: &Arc<Shared>,
    deadline: LoginDeadline,
) -> Result<(), ClientError> {
    let config = shared.config();
    let mut auth_startup = startup.clone();
    let auth_db = config
        .upstream
        .database
        .clone()
        .unwrap_or_else(|| "postgres".to_owned());
    auth_startup.params.retain(|(k, _)| k != "database");
    auth_startup.params.push(("database".to_owned(), auth_db));
    let user = startup.param("user").unwrap_or_default().to_owned();
    let admins = config.admin_users.clone();
    // Relayed authentication proves the server's own role (the connection's current_user,
    // mapped or not); pgmemo's own proves only the client's name, and a `[databases]` mapping
    // may log the connection in as another, more privileged role.
    let role = (config.auth_type != crate::config::AuthType::Upstream).then(|| user.clone());
    drop(config);
    // No pool place is taken: the console must answer while the workload fills the pool.
    let (route, relayed) =
        crate::client::login_unpooled(client, shared, &auth_startup, deadline).await?;
    let allowed = if admins.is_empty() {
        // A connection of its own, closed after the check.
        let mut server = match relayed {
            Some(conn) => conn,
            None => crate::client::open_authenticated(shared, &route).await?,
        };
        let allowed = is_superuser(&mut server, role.as_deref()).await;
        tokio::spawn(server.close());
        allowed
    } else {
        if let Some(conn) = relayed {
            tokio::spawn(conn.close());
        }
        // The name the login proved: the client's own with pgmemo's authentication, the
        // server role when relayed (a `[databases]` entry may map the client's name to
        // another, whose password is what the server checked). Both must be listed.
        let proven = role.as_deref().unwrap_or(&route.key.user);
        admins.contains(&user) && admins.iter().any(|a| a == proven)
    };
    if !allowed {
        return Err(ClientError::Refused(
            ErrorResponse::fatal(
                sqlstate::INSUFFICIENT_PRIVILEGE,
                format!("permission denied for the pgmemo admin console to role \"{user}\""),
            )
            .with_hint("List the role in admin_users, or connect as a superuser of the server."),
        ));
    }
    Ok(())
}

/// Whether `role` (the connection's own role when `None`) is a superuser on the server.
async fn is_superuser(server: &mut ServerConn, role: Option<&str>) -> bool {
    let role = role.map_or_else(|| "current_user".to_owned(), quote_literal);
    // Every name qualified: the check runs in a session whose search_path the client may
    // have chosen (ALTER ROLE ... SET search_path, startup options), where an unqualified
    // `pg_roles` or `=` could be the client's own view or operator.
    let sql = format!(
        "SELECT r.rolsuper FROM pg_catalog.pg_roles r \
         WHERE r.rolname OPERATOR(pg_catalog.=) {role}::pg_catalog.name"
    );
    match server.query_text_rows(&sql).await {
        Ok(rows) => rows
            .first()
            .and_then(|r| r.first())
            .is_some_and(|v| v.as_deref() == Some("t")),
        Err(e) => {
            tracing::warn!(error = %e, "cannot check whether the role is a superuser");
            false
        }
    }
}

async fn command_loop(client: &mut ClientConn, shared: &Arc<Shared>) -> Result<(), ClientError> {
    let mut hello = BytesMut::new();
    for (k, v) in [
        ("server_version", "15.0 (pgmemo admin console)"),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("DateStyle", "ISO, MDY"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
        ("application_name", ""),
    ] {
        hello.extend_from_slice(&backend::parameter_status(k, v));
    }
    let registration = shared.cancels.register();
    hello.extend_from_slice(&backend::backend_key_data(registration.key));
    hello.extend_from_slice(&backend::ready_for_query(TransactionStatus::Idle));
    client.send(&hello).await?;
    let mut extended_error = false;
    loop {
        // The console is idle between commands: it closes as soon as shutdown begins.
        let frame = tokio::select! {
            _ = shared.stop_accepting.cancelled() => return Ok(()),
            frame = client.read_frame(MAX_ADMIN_MESSAGE) => frame?,
        };
        let mut out = BytesMut::new();
        match frame.tag() {
            b'X' => return Ok(()),
            b'Q' => {
                let sql = String::from_utf8_lossy(frame.body());
                let sql = sql.trim_end_matches('\0');
                answer(shared, AdminCommand::parse(sql), &mut out);
                out.extend_from_slice(&backend::ready_for_query(TransactionStatus::Idle));
            }
            b'S' => {
                if std::mem::take(&mut extended_error) {
                    ErrorResponse::error(
                        sqlstate::FEATURE_NOT_SUPPORTED,
                        "the pgmemo admin console accepts only simple queries",
                    )
                    .encode_into(&mut out);
                }
                out.extend_from_slice(&backend::ready_for_query(TransactionStatus::Idle));
            }
            b'P' | b'B' | b'D' | b'E' | b'C' | b'H' | b'F' => extended_error = true,
            other => {
                return Err(ClientError::Protocol(wire::WireError::UnexpectedTag(other)));
            }
        }
        if !out.is_empty() {
            client.send(&out).await?;
        }
    }
}

/// Encodes the answer to one command.
fn answer(shared: &Shared, command: AdminCommand, out: &mut BytesMut) {
    let table = match command {
        AdminCommand::ShowPools => show_pools::show_pools(shared),
        AdminCommand::ShowClients => show_clients::show_clients(shared),
        AdminCommand::ShowServers => show_servers::show_servers(shared),
        AdminCommand::ShowStats => show_stats::show_stats(shared),
        AdminCommand::ShowConfig => show_config::show_config(shared),
        AdminCommand::ShowVersion => show_help::show_version(),
        AdminCommand::ShowHelp => show_help::show_help(),
        AdminCommand::ShowCache => show_cache::show_cache(shared),
        AdminCommand::ExplainCache(sql) => explain_cache::explain_cache(shared, &sql),
        AdminCommand::ShowQueries => show_cache::show_queries(shared),
        AdminCommand::ShowTables => show_cache::show_tables(shared),
        AdminCommand::ShowReplication => show_replication::show_replication(shared),
        AdminCommand::CachePurge(table) => {
            match table {
                None => shared.cache.purge_all(),
                Some(t) => {
                    shared.cache.purge_table(&t);
                }
            }
            backend::command_complete("CACHE PURGE", out);
            return;
        }
        AdminCommand::Empty => {
            backend::empty_query_response(out);
            return;
        }
        AdminCommand::Reload => {
            match shared.reload_from_source() {
                Ok(()) => backend::command_complete("RELOAD", out),
                Err(e) => ErrorResponse::error(sqlstate::CONFIG_FILE_ERROR, e).encode_into(out),
            }
            return;
        }
        AdminCommand::Unknown(text) => {
            ErrorResponse::error(
                sqlstate::SYNTAX_ERROR,
                format!("unknown pgmemo admin command: {text}"),
            )
            .with_hint("SHOW HELP lists the commands.")
            .encode_into(out);
            return;
        }
    };
    table.encode(out);
}

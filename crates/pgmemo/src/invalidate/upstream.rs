//! The feed's conversations with the upstream before streaming: opening a connection as the
//! configured user (a replication connection for the stream, a plain one for the `auto` probe),
//! creating the publication, creating the temporary slot, and `START_REPLICATION`.

use std::sync::Arc;

use wire::backend::BackendMessage;
use wire::replication::Lsn;

use super::FeedError;
use crate::pool::{ServerConn, ServerCredential, ServerError};
use crate::shared::Shared;

/// SQLSTATE `duplicate_object`: a concurrent pgmemo created the publication first.
const DUPLICATE_OBJECT: &str = "42710";

/// Opens a connection to `dbname` on `host:port` as the upstream URL's user and finishes its
/// startup. With `replication`, it is a walsender connection (`replication=database`) that
/// accepts both replication commands and simple SQL.
pub async fn connect(
    shared: &Arc<Shared>,
    host: &str,
    port: u16,
    dbname: &str,
    replication: bool,
) -> Result<Box<ServerConn>, FeedError> {
    let config = shared.config();
    let user = config.upstream.user.clone().ok_or(FeedError::NoUser)?;
    let credential = match &config.upstream.password {
        Some(p) => ServerCredential::Password(p.clone()),
        None => ServerCredential::None,
    };
    let timeout = config.server_connect_timeout.0;
    let keepalive = config.tcp_keepalive();
    drop(config);
    let mut params = vec![
        ("user".to_owned(), user.clone()),
        ("database".to_owned(), dbname.to_owned()),
        ("application_name".to_owned(), "pgmemo feed".to_owned()),
    ];
    if replication {
        params.push(("replication".to_owned(), "database".to_owned()));
    }
    let opened = tokio::time::timeout(timeout, async {
        let tls = shared.upstream_tls.as_ref();
        let mut conn = ServerConn::open(host, port, tls, &params, 0, &keepalive).await?;
        conn.authenticate(&user, &credential).await?;
        conn.finish_startup().await?;
        Ok::<_, ServerError>(conn)
    })
    .await
    .map_err(|_| FeedError::Timeout(timeout))??;
    Ok(opened)
}

/// Quotes an identifier for SQL and replication commands.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Quotes a string literal (standard_conforming_strings is on in replication connections).
pub fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// The first column of the first row of a query, as text.
pub async fn scalar(conn: &mut ServerConn, sql: &str) -> Result<Option<String>, FeedError> {
    Ok(conn
        .simple_query_rows(sql)
        .await?
        .into_iter()
        .next()
        .and_then(|r| r.into_iter().next())
        .flatten())
}

/// Creates the publication `FOR ALL TABLES` unless it exists (only when `create`; `auto` mode
/// uses an existing one only). Creating one needs superuser; a user that may only replicate
/// needs it created beforehand.
///
/// A publication that publishes updates and deletes makes PostgreSQL refuse UPDATE and DELETE
/// on tables without a replica identity (no primary key, `REPLICA IDENTITY NOTHING`), so
/// pgmemo does not create one while such tables exist: it would break the application's
/// writes. Tables created later without a primary key have the same problem; see
/// docs/cache.md.
pub async fn ensure_publication(
    conn: &mut ServerConn,
    name: &str,
    create: bool,
) -> Result<(), FeedError> {
    // What the publication lacks for the feed to see every write, if it exists.
    let lacks = scalar(
        conn,
        &format!(
            "SELECT concat_ws(', ', \
               CASE WHEN NOT puballtables THEN 'FOR ALL TABLES' END, \
               CASE WHEN NOT pubinsert THEN 'insert' END, \
               CASE WHEN NOT pubupdate THEN 'update' END, \
               CASE WHEN NOT pubdelete THEN 'delete' END, \
               CASE WHEN NOT pubtruncate THEN 'truncate' END, \
               CASE WHEN pubviaroot THEN 'publish_via_partition_root = false' END) \
             FROM pg_catalog.pg_publication WHERE pubname = {}",
            quote_literal(name)
        ),
    )
    .await?;
    match lacks.as_deref() {
        Some("") => return Ok(()),
        Some(lacks) => {
            return Err(FeedError::PartialPublication(
                name.to_owned(),
                lacks.to_owned(),
            ))
        }
        None => {}
    }
    if !create {
        return Err(FeedError::NoPublication(name.to_owned()));
    }
    if let Some(tables) = scalar(conn, WITHOUT_REPLICA_IDENTITY).await? {
        return Err(FeedError::MissingReplicaIdentity(tables));
    }
    let sql = format!("CREATE PUBLICATION {} FOR ALL TABLES", quote_ident(name));
    match conn.simple_query(&sql).await {
        Ok(()) => {
            tracing::info!(publication = name, "created publication FOR ALL TABLES");
            Ok(())
        }
        Err(ServerError::Server(e)) if e.code == DUPLICATE_OBJECT => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Ordinary tables on which a FOR ALL TABLES publication would make UPDATE and DELETE fail.
const WITHOUT_REPLICA_IDENTITY: &str = r"
SELECT string_agg(format('%I.%I', n.nspname, c.relname), ', ' ORDER BY n.nspname, c.relname)
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND c.relpersistence = 'p'
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_%'
  AND (c.relreplident = 'n'
       OR (c.relreplident = 'd' AND NOT EXISTS (
             SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)))";

/// Creates a temporary logical slot with pgoutput and returns its consistent point: every
/// transaction committing after it will be streamed. Waits for transactions running now to
/// end. The slot disappears with the connection, so a dead pgmemo never pins WAL.
pub async fn create_slot(conn: &mut ServerConn, slot: &str) -> Result<Lsn, FeedError> {
    let rows = conn
        .simple_query_rows(&format!(
            "CREATE_REPLICATION_SLOT {} TEMPORARY LOGICAL pgoutput NOEXPORT_SNAPSHOT",
            quote_ident(slot)
        ))
        .await?;
    let point = rows
        .first()
        .and_then(|r| r.get(1))
        .cloned()
        .flatten()
        .ok_or_else(|| FeedError::Unexpected {
            command: "CREATE_REPLICATION_SLOT",
            detail: format!("{rows:?}"),
        })?;
    point.parse::<Lsn>().map_err(|e| FeedError::Unexpected {
        command: "CREATE_REPLICATION_SLOT",
        detail: format!("consistent point {point:?}: {e}"),
    })
}

/// Sends `START_REPLICATION` and waits for CopyBothResponse: from then on the connection
/// carries the stream. `messages` asks for `pg_logical_emit_message` messages (PostgreSQL 14+).
pub async fn start_replication(
    conn: &mut ServerConn,
    slot: &str,
    start: Lsn,
    publication: &str,
    messages: bool,
) -> Result<(), FeedError> {
    let mut options = format!(
        "proto_version '1', publication_names {}",
        quote_literal(&quote_ident(publication))
    );
    if messages {
        options.push_str(", messages 'true'");
    }
    let command = format!(
        "START_REPLICATION SLOT {} LOGICAL {start} ({options})",
        quote_ident(slot)
    );
    conn.send(&wire::frontend::query(&command)).await?;
    loop {
        let frame = conn.read_frame().await?;
        match BackendMessage::decode(frame)? {
            BackendMessage::CopyBothResponse(_) => return Ok(()),
            BackendMessage::ErrorResponse(e) => return Err(ServerError::Server(e).into()),
            BackendMessage::NoticeResponse(_) | BackendMessage::ParameterStatus { .. } => {}
            other => {
                return Err(FeedError::Unexpected {
                    command: "START_REPLICATION",
                    detail: format!("{other:?}"),
                })
            }
        }
    }
}

/// The server's major version from its `server_version` parameter (e.g. 15), 0 if unknown.
pub fn server_major(conn: &ServerConn) -> u32 {
    conn.params
        .iter()
        .find(|(k, _)| k == "server_version")
        .and_then(|(_, v)| {
            v.split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// Whether the connection's role is a superuser.
pub async fn is_superuser(conn: &mut ServerConn) -> Result<bool, FeedError> {
    Ok(scalar(
        conn,
        "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user",
    )
    .await?
    .as_deref()
        == Some("t"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote_ident("pg\"memo"), "\"pg\"\"memo\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal(&quote_ident("pgmemo")), "'\"pgmemo\"'");
    }
}

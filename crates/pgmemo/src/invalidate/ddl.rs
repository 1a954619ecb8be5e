//! DDL is not in pgoutput's stream (only its effects on rows are), so the feed puts it there:
//! an event trigger `pgmemo_ddl` (on `ddl_command_end`, and `pgmemo_ddl_drop` on `sql_drop`)
//! emits a transactional logical message with prefix `pgmemo.ddl` (not for temporary objects), which the consumer turns
//! into a flush of the database's results and memoized plans when the DDL commits.
//!
//! Installed idempotently by the feed when its user is a superuser (event triggers need one)
//! and the server is PostgreSQL 14 or later (logical messages in pgoutput); otherwise skipped
//! with an info log: DDL made elsewhere is then seen only by TTL, while DDL relayed by pgmemo
//! still flushes.

use super::{upstream, FeedError};
use crate::pool::ServerConn;

/// Creates the function and the event triggers unless they exist.
const INSTALL: &str = r#"
DO $pgmemo$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
                 WHERE n.nspname = 'public' AND p.proname = 'pgmemo_ddl_notify_v1') THEN
    CREATE FUNCTION public.pgmemo_ddl_notify_v1() RETURNS event_trigger
      LANGUAGE plpgsql SET search_path = pg_catalog AS
      $f$
      BEGIN
        IF tg_event = 'sql_drop' THEN
          IF NOT EXISTS (SELECT 1 FROM pg_event_trigger_dropped_objects() WHERE NOT is_temporary) THEN
            RETURN;
          END IF;
        ELSIF tg_tag LIKE 'DROP %' THEN
          RETURN; -- sql_drop reports what was dropped
        ELSIF EXISTS (SELECT 1 FROM pg_event_trigger_ddl_commands())
          AND NOT EXISTS (SELECT 1 FROM pg_event_trigger_ddl_commands()
                          WHERE schema_name IS NULL OR schema_name NOT LIKE 'pg\_temp\_%') THEN
          RETURN; -- only temporary objects: no other session sees them
        END IF;
        PERFORM pg_logical_emit_message(true, 'pgmemo.ddl', tg_tag);
      END
      $f$;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger WHERE evtname = 'pgmemo_ddl') THEN
    CREATE EVENT TRIGGER pgmemo_ddl ON ddl_command_end EXECUTE FUNCTION public.pgmemo_ddl_notify_v1();
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger WHERE evtname = 'pgmemo_ddl_drop') THEN
    CREATE EVENT TRIGGER pgmemo_ddl_drop ON sql_drop EXECUTE FUNCTION public.pgmemo_ddl_notify_v1();
  END IF;
END
$pgmemo$"#;

/// Installs the DDL event trigger when possible; returns whether DDL will be in the stream.
/// Failure is not an error of the feed: it runs without DDL messages.
pub async fn install(conn: &mut ServerConn, dbname: &str) -> Result<bool, FeedError> {
    if upstream::server_major(conn) < 14 {
        tracing::info!(
            database = dbname,
            "PostgreSQL before 14: DDL made elsewhere is not seen by the feed"
        );
        return Ok(false);
    }
    if !upstream::is_superuser(conn).await? {
        tracing::info!(
            database = dbname,
            "the feed's user is not a superuser: no DDL event trigger, DDL made elsewhere is not seen by the feed"
        );
        return Ok(false);
    }
    match conn.simple_query(INSTALL).await {
        Ok(()) => Ok(true),
        Err(crate::pool::ServerError::Server(e)) => {
            // E.g. a concurrent pgmemo installing the same objects.
            tracing::info!(database = dbname, error = %e.message, "DDL event trigger not installed");
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

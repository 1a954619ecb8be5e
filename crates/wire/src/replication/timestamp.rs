//! PostgreSQL timestamps as replication messages carry them: signed microseconds since
//! 2000-01-01 00:00:00 UTC (`TimestampTz`), converted to and from [`SystemTime`].
//!
//! The replication consumer needs them to measure how far behind the server it is (send time,
//! commit time) and to stamp its StandbyStatusUpdate with its own clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds from the Unix epoch to PostgreSQL's epoch, 2000-01-01 00:00:00 UTC.
pub const PG_EPOCH_UNIX_SECS: u64 = 946_684_800;

fn pg_epoch() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(PG_EPOCH_UNIX_SECS)
}

/// Converts a PostgreSQL timestamp (µs since 2000-01-01 UTC) to a [`SystemTime`], so that lag can
/// be computed with `SystemTime::duration_since`. `None` only when the platform's `SystemTime`
/// cannot represent the instant; any input is accepted without panicking.
pub fn pg_time_to_system(micros: i64) -> Option<SystemTime> {
    let offset = Duration::from_micros(micros.unsigned_abs());
    if micros >= 0 {
        pg_epoch().checked_add(offset)
    } else {
        pg_epoch().checked_sub(offset)
    }
}

/// Converts a [`SystemTime`] to a PostgreSQL timestamp, for the client clock field of a
/// StandbyStatusUpdate. Instants beyond the `i64` range saturate instead of wrapping.
pub fn system_to_pg_time(t: SystemTime) -> i64 {
    let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
    match t.duration_since(pg_epoch()) {
        Ok(after) => micros(after),
        Err(before) => micros(before.duration()).saturating_neg(),
    }
}

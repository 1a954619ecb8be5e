//! A small text-only result set, encoded as RowDescription, DataRows and CommandComplete, the
//! way PgBouncer's console answers: every column is `text`, which psql and monitoring scripts
//! read without type knowledge.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use wire::backend;

/// A connection's `connected_seconds` (how long ago, as of `now`) and `connect_time` (Unix
/// seconds) columns, as `SHOW CLIENTS` and `SHOW SERVERS` print them.
pub fn connected_columns(connected_at: SystemTime, now: SystemTime) -> [Option<String>; 2] {
    let age = now.duration_since(connected_at).unwrap_or_default();
    let since_epoch = connected_at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    [
        Some(age.as_secs().to_string()),
        Some(since_epoch.to_string()),
    ]
}

/// Rows for one SHOW command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    columns: Vec<&'static str>,
    rows: Vec<Vec<Option<String>>>,
}

impl Table {
    /// An empty table with these columns.
    pub fn new(columns: &[&'static str]) -> Table {
        Table {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; values are shown as their `Display` text.
    pub fn row(&mut self, values: Vec<Option<String>>) {
        debug_assert_eq!(values.len(), self.columns.len());
        self.rows.push(values);
    }

    /// The rows, for tests.
    pub fn rows(&self) -> &[Vec<Option<String>>] {
        &self.rows
    }

    /// Encodes the result of a `SHOW`.
    pub fn encode(&self, out: &mut BytesMut) {
        backend::row_description_text(&self.columns, out);
        for r in &self.rows {
            backend::data_row_text(r, out);
        }
        backend::command_complete("SHOW", out);
    }
}

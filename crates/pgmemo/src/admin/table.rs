//! A small text-only result set, encoded as RowDescription, DataRows and CommandComplete, the
//! way PgBouncer's console answers: every column is `text`, which psql and monitoring scripts
//! read without type knowledge.

use bytes::BytesMut;
use wire::backend;

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

//! `SHOW CONFIG`: every setting in force, as `key = value` rows with passwords masked.

use super::table::Table;
use crate::shared::Shared;

/// Builds the table from the running configuration's TOML form.
pub fn show_config(shared: &Shared) -> Table {
    let mut t = Table::new(&["key", "value"]);
    let text = shared.config().to_toml_redacted();
    let parsed: toml::Table = toml::from_str(&text).unwrap_or_default();
    for (key, value) in parsed {
        let shown = match value {
            toml::Value::String(s) => s,
            other => other.to_string(),
        };
        t.row(vec![Some(key), Some(shown)]);
    }
    t
}

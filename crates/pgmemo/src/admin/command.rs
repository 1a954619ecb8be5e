//! The admin console's commands, parsed from a simple query: `SHOW POOLS`, `SHOW CLIENTS`,
//! `SHOW SERVERS`,
//! `SHOW STATS`, `SHOW CONFIG`, `SHOW REPLICATION`, `SHOW VERSION`, `SHOW HELP`, `RELOAD`. Case does not matter and
//! a trailing semicolon is ignored, as in PgBouncer's console.

/// One admin command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminCommand {
    ShowPools,
    ShowClients,
    ShowServers,
    ShowStats,
    ShowConfig,
    ShowVersion,
    ShowHelp,
    Reload,
    ShowCache,
    ShowQueries,
    ShowTables,
    /// `SHOW REPLICATION`: the invalidation feeds.
    ShowReplication,
    /// `EXPLAIN CACHE query`.
    ExplainCache(String),
    /// `CACHE PURGE [table]`.
    CachePurge(Option<String>),
    /// Blank query: answered with EmptyQueryResponse.
    Empty,
    /// Anything else, kept for the error message.
    Unknown(String),
}

impl AdminCommand {
    /// Parses one statement.
    pub fn parse(sql: &str) -> AdminCommand {
        let text = sql.trim().trim_end_matches(';').trim();
        if text.is_empty() {
            return AdminCommand::Empty;
        }
        let words: Vec<String> = text
            .split_whitespace()
            .map(|w| w.to_ascii_uppercase())
            .collect();
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        match words.as_slice() {
            ["SHOW", "POOLS"] => AdminCommand::ShowPools,
            ["SHOW", "CLIENTS"] => AdminCommand::ShowClients,
            ["SHOW", "SERVERS"] => AdminCommand::ShowServers,
            ["SHOW", "STATS"] => AdminCommand::ShowStats,
            ["SHOW", "CONFIG"] => AdminCommand::ShowConfig,
            ["SHOW", "VERSION"] => AdminCommand::ShowVersion,
            ["SHOW", "HELP"] | ["SHOW"] | ["HELP"] => AdminCommand::ShowHelp,
            ["RELOAD"] => AdminCommand::Reload,
            ["SHOW", "CACHE"] => AdminCommand::ShowCache,
            ["EXPLAIN", "CACHE", ..] => {
                let rest = text.trim_start()[7..].trim_start()[5..].trim();
                AdminCommand::ExplainCache(rest.to_owned())
            }
            ["SHOW", "QUERIES"] => AdminCommand::ShowQueries,
            ["SHOW", "TABLES"] => AdminCommand::ShowTables,
            ["SHOW", "REPLICATION"] => AdminCommand::ShowReplication,
            ["CACHE", "PURGE"] => AdminCommand::CachePurge(None),
            ["CACHE", "PURGE", _] => AdminCommand::CachePurge(
                text.split_whitespace()
                    .nth(2)
                    .map(|t| t.trim_matches('"').to_owned()),
            ),
            _ => AdminCommand::Unknown(text.to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commands_case_insensitively() {
        assert_eq!(AdminCommand::parse("show pools;"), AdminCommand::ShowPools);
        assert_eq!(
            AdminCommand::parse("  SHOW   Stats "),
            AdminCommand::ShowStats
        );
        assert_eq!(AdminCommand::parse("reload"), AdminCommand::Reload);
        assert_eq!(
            AdminCommand::parse("Show Servers;"),
            AdminCommand::ShowServers
        );
        assert_eq!(
            AdminCommand::parse("show replication;"),
            AdminCommand::ShowReplication
        );
        assert_eq!(AdminCommand::parse(" ; "), AdminCommand::Empty);
        assert_eq!(
            AdminCommand::parse("select 1"),
            AdminCommand::Unknown("select 1".into())
        );
    }
}

//! Describing and creating a throwaway cluster: initdb, configuration, pg_hba.conf, a free port.
//!
//! Each cluster gets its own temp directory (data directory, Unix socket, log) and its own
//! port, so any number of tests can start clusters in parallel without sharing anything.

use std::path::Path;

use anyhow::Context as _;

use super::command::{chown_to_postgres, pg_command, run, write_for_postgres};
use super::{sweep, TempPostgres};
use crate::ports::free_port;

/// How often a start that lost its port to another process is retried on a new port.
const START_ATTEMPTS: usize = 5;

/// Settings for [`TempPostgres`]; obtained from [`TempPostgres::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `start` is awaited"]
pub struct TempPostgresBuilder {
    conf: Vec<String>,
    hba: Vec<String>,
    default_trust: bool,
    default_auth_method: String,
}

impl Default for TempPostgresBuilder {
    fn default() -> Self {
        TempPostgresBuilder {
            conf: Vec::new(),
            hba: Vec::new(),
            default_trust: true,
            default_auth_method: "trust".to_owned(),
        }
    }
}

impl TempPostgresBuilder {
    /// Adds a postgresql.conf line (`"wal_level = logical"`). Lines are written after testkit's
    /// own settings, so they override them.
    pub fn conf(mut self, line: impl Into<String>) -> Self {
        self.conf.push(line.into());
        self
    }

    /// Adds a pg_hba.conf rule (`"host all alice 127.0.0.1/32 scram-sha-256"`). Rules are
    /// written before the fallback rules, so the first matching one of them wins.
    pub fn hba(mut self, rule: impl Into<String>) -> Self {
        self.hba.push(rule.into());
        self
    }

    /// The method of the fallback `host all all 127.0.0.1/32` rule (default `trust`), for tests
    /// where every TCP login must authenticate (`"scram-sha-256"`, `"md5"`, `"password"`).
    /// The fallback `local` rule stays `trust` so that [`TempPostgres::psql`] keeps working.
    pub fn auth_method_default(mut self, method: impl Into<String>) -> Self {
        self.default_auth_method = method.into();
        self
    }

    /// Writes no fallback rules: only the rules given with [`hba`](Self::hba) apply, plus
    /// `local all postgres trust` (after them) so that [`TempPostgres::psql`] still works.
    pub fn no_default_trust(mut self) -> Self {
        self.default_trust = false;
        self
    }

    /// Runs initdb in a fresh temp directory, writes the configuration and starts the server on
    /// a free port (retrying on another port if that one gets taken meanwhile).
    pub async fn start(self) -> anyhow::Result<TempPostgres> {
        sweep::remove_abandoned_clusters();
        let dir = tempfile::Builder::new()
            .prefix(sweep::DIR_PREFIX)
            .tempdir_in(sweep::PARENT_DIR)
            .context("creating the cluster's temp directory")?;
        sweep::mark_owner(dir.path())?;
        chown_to_postgres(dir.path())?;
        let data = dir.path().join("data");

        let mut initdb = pg_command("initdb", dir.path());
        initdb
            .args([
                "--nosync",
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "-D",
            ])
            .arg(&data);
        run(initdb, None, "initdb").await?;

        write_for_postgres(&data.join("pg_hba.conf"), &self.hba_file())?;
        let main_conf = data.join("postgresql.conf");
        let mut conf = std::fs::read_to_string(&main_conf).context("reading postgresql.conf")?;
        conf.push_str("\ninclude 'testkit.conf'\n");
        write_for_postgres(&main_conf, &conf)?;

        let mut pg = TempPostgres { dir, port: 0 };
        let mut attempt = 1;
        loop {
            pg.port = free_port();
            let conf = self.conf_file(pg.port, pg.socket_dir());
            write_for_postgres(&data.join("testkit.conf"), &conf)?;
            let log_before = pg.log_contents().len();
            let Err(e) = pg.start_again().await else {
                return Ok(pg);
            };
            let log = pg.log_contents();
            let new_log = log.get(log_before..).unwrap_or(&log);
            if attempt == START_ATTEMPTS || !lost_port(new_log) {
                return Err(e.context(format!("starting PostgreSQL; server log:\n{new_log}")));
            }
            attempt += 1;
        }
    }

    /// testkit's settings first, the caller's after them (the last setting of a name wins).
    fn conf_file(&self, port: u16, socket_dir: &Path) -> String {
        let mut conf = format!(
            "# Written by testkit.\n\
             listen_addresses = '127.0.0.1'\n\
             port = {port}\n\
             unix_socket_directories = '{}'\n\
             fsync = off\n\
             shared_buffers = 16MB\n\
             max_connections = 100\n",
            socket_dir.display()
        );
        for line in &self.conf {
            conf.push_str(line);
            conf.push('\n');
        }
        conf
    }

    /// The caller's rules first, then the fallbacks (the first matching rule wins).
    fn hba_file(&self) -> String {
        let mut hba = String::from("# Written by testkit.\n");
        for rule in &self.hba {
            hba.push_str(rule);
            hba.push('\n');
        }
        if self.default_trust {
            hba.push_str("local all all trust\n");
            hba.push_str(&format!(
                "host all all 127.0.0.1/32 {}\n",
                self.default_auth_method
            ));
        } else {
            hba.push_str("local all postgres trust\n");
        }
        hba
    }
}

/// Whether a failed start's log says the port was taken (worth retrying on another port).
fn lost_port(log: &str) -> bool {
    log.contains("Address already in use") || log.contains("could not create any TCP/IP sockets")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_rules_come_before_the_fallbacks() {
        let b = TempPostgresBuilder::default()
            .hba("host all alice 127.0.0.1/32 scram-sha-256")
            .auth_method_default("md5");
        assert_eq!(
            b.hba_file(),
            "# Written by testkit.\n\
             host all alice 127.0.0.1/32 scram-sha-256\n\
             local all all trust\n\
             host all all 127.0.0.1/32 md5\n"
        );
        let strict = b.no_default_trust();
        assert!(strict
            .hba_file()
            .ends_with("scram-sha-256\nlocal all postgres trust\n"));
    }

    #[test]
    fn user_conf_lines_come_last() {
        let b = TempPostgresBuilder::default().conf("max_connections = 7");
        let conf = b.conf_file(5555, Path::new("/tmp/x"));
        assert!(conf.contains("port = 5555\n"));
        assert!(conf.contains("unix_socket_directories = '/tmp/x'\n"));
        assert!(conf.ends_with("max_connections = 100\nmax_connections = 7\n"));
    }
}

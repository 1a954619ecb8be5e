//! Configuration: what an operator can set, with defaults, and how it is loaded (TOML file,
//! `PGMEMO_*` environment variables, command-line flags) and validated.
//!
//! Every field is documented in docs/configuration.md. Fields marked "runtime" take effect on
//! SIGHUP / `RELOAD`; the others need a restart.

mod load;
mod units;
mod upstream;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use load::{load, validate, ConfigError, ConfigSources};
pub use units::{ByteSize, Seconds};

pub use upstream::{SslMode, UpstreamUrl};

/// How server connections are shared between clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PoolMode {
    /// A client keeps one server connection for its whole session.
    #[default]
    Session,
    /// A client holds a server connection only for the duration of a transaction.
    Transaction,
}

/// How pgmemo checks the identity of a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum AuthType {
    /// PostgreSQL checks the client: pgmemo relays the exchange over a new server connection.
    #[default]
    #[serde(rename = "upstream")]
    Upstream,
    /// No password; the user must be listed in `auth_file`.
    #[serde(rename = "trust")]
    Trust,
    /// MD5 challenge against `auth_file` (plain or md5 secrets).
    #[serde(rename = "md5")]
    Md5,
    /// SCRAM-SHA-256 against `auth_file` (plain or SCRAM secrets).
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
}

/// Whether clients may or must use TLS to reach pgmemo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ClientTlsMode {
    /// Never offer TLS.
    Disable,
    /// Offer TLS when a certificate is configured (the default).
    #[default]
    Prefer,
    /// Refuse clients that do not use TLS.
    Require,
}

/// An on/off switch written as `"on"`/`"off"` (or `true`/`false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    #[default]
    On,
    Off,
}

impl Switch {
    /// Whether the switch is on.
    pub fn is_on(self) -> bool {
        self == Switch::On
    }
}

impl<'de> Deserialize<'de> for Switch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bool(bool),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bool(true) => Ok(Switch::On),
            Raw::Bool(false) => Ok(Switch::Off),
            Raw::Text(t) => match t.to_ascii_lowercase().as_str() {
                "on" | "true" | "yes" | "1" => Ok(Switch::On),
                "off" | "false" | "no" | "0" => Ok(Switch::Off),
                other => Err(serde::de::Error::custom(format!(
                    "expected \"on\" or \"off\", found \"{other}\""
                ))),
            },
        }
    }
}

/// Which cacheable misses are stored. Runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CacheAdmission {
    /// Results of new or costly statements (misses of 1 ms or more) on their first miss,
    /// others from the second miss of the same key among recent misses: one-off results of
    /// cheap lookups are not worth an insert and the memory (see `cache::admission`).
    #[default]
    Auto,
    /// Every cacheable miss.
    Always,
}

/// How pgmemo learns about writes it does not relay itself (other applications, triggers,
/// functions, other pgmemo instances). Restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Invalidation {
    /// `replication` when the upstream allows it (wal_level = logical and a user that may
    /// replicate), else `proxy` with a warning at start: the safe choice that needs no setup.
    #[default]
    Auto,
    /// Follow PostgreSQL's logical replication stream; while it is down nothing is served
    /// from the cache (fail closed).
    Replication,
    /// Only writes relayed by this pgmemo invalidate; others are seen when entries expire.
    Proxy,
    /// Like `proxy`: for setups that rely on `cache_ttl` to bound staleness.
    Ttl,
}

impl Invalidation {
    /// The spelling in the configuration file, for logs and `SHOW REPLICATION`.
    pub fn name(self) -> &'static str {
        match self {
            Invalidation::Auto => "auto",
            Invalidation::Replication => "replication",
            Invalidation::Proxy => "proxy",
            Invalidation::Ttl => "ttl",
        }
    }
}

/// A `[databases.NAME]` entry: the name clients use, mapped to a real database (PgBouncer's
/// `[databases]` idea). Unset fields fall back to the upstream URL and the client's values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    pub host: Option<String>,
    pub port: Option<u16>,
    /// Real database name on the server (default: the name the client used).
    pub dbname: Option<String>,
    /// Connect to the server as this user instead of the client's user.
    pub user: Option<String>,
    /// Password for the server connection.
    pub password: Option<String>,
    /// Overrides `pool_size` for this database.
    pub pool_size: Option<usize>,
    /// Overrides `cache` for this database.
    pub cache: Option<Switch>,
}

/// Settings for one user (`[users.NAME]`), PgBouncer's per-user overrides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// Overrides `pool_size` for this user's pools (a `[databases]` entry's size wins).
    pub pool_size: Option<usize>,
}

/// The whole configuration. Defaults match `pgmemo` started with no arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address clients connect to. Restart.
    pub listen: SocketAddr,
    /// Directory where pgmemo also listens on a Unix-domain socket, `.s.PGSQL.<listen port>`,
    /// as PostgreSQL does (so `psql -h DIR -p PORT` and libpq's socket defaults reach it);
    /// unset means TCP only. Restart.
    pub unix_socket_dir: Option<String>,
    /// The PostgreSQL server: `postgres://[USER[:PASSWORD]@]HOST[:PORT][/DB][?sslmode=..]`. Restart.
    pub upstream: UpstreamUrl,
    /// Session or transaction pooling. Restart.
    pub pool_mode: PoolMode,
    /// Server connections per (database, user). Runtime.
    pub pool_size: usize,
    /// Transaction pooling: server connections pgmemo keeps open per pool even when no client
    /// needs them (opened once the pool's first client logged in). Runtime.
    pub min_pool_size: usize,
    /// Transaction pooling: statements each server connection keeps prepared for the clients
    /// it serves (least recently used ones are closed beyond this). Runtime.
    pub max_prepared_statements: usize,
    /// Transaction pooling: texts each server connection keeps prepared under pgmemo's own
    /// names for clients that send them as the unnamed statement (0: none, the default).
    /// Runtime.
    pub max_promoted_statements: usize,
    /// Transaction pooling: a client idle inside a transaction for longer than this is
    /// disconnected, so it cannot hold a server connection forever; 0 means never. Runtime.
    pub idle_transaction_timeout: Seconds,
    /// Most client connections pgmemo accepts at once. Runtime.
    pub max_client_conn: usize,
    /// How clients authenticate. Runtime.
    pub auth_type: AuthType,
    /// PgBouncer-style userlist (`"user" "secret"` per line). Runtime (re-read on reload).
    pub auth_file: Option<PathBuf>,
    /// Run on a server connection before another client may use it. Runtime.
    pub server_reset_query: String,
    /// How long a client waits for a server connection before it gets an error. Runtime.
    pub query_wait_timeout: Seconds,
    /// Close server connections older than this once they are idle. Runtime.
    pub server_lifetime: Seconds,
    /// Close server connections idle for longer than this. Runtime.
    pub server_idle_timeout: Seconds,
    /// An idle server connection unused for longer than this is checked with
    /// `server_check_query` before reuse. Runtime.
    pub server_check_delay: Seconds,
    /// Health-check query; empty disables the check. Runtime.
    pub server_check_query: String,
    /// Limit for establishing a server connection (TCP, TLS, startup). Runtime.
    pub server_connect_timeout: Seconds,
    /// A client must finish startup and authentication within this time. Runtime.
    pub client_login_timeout: Seconds,
    /// TCP keepalive on client and server connections, so that a peer that vanished without
    /// closing (a crashed host, a network that drops everything) is noticed and its server
    /// connection or client slot freed. Runtime (connections opened afterwards).
    pub tcp_keepalive: Switch,
    /// Idle time before the first keepalive probe; 0 means the operating system's default.
    /// Runtime (connections opened afterwards).
    pub tcp_keepidle: Seconds,
    /// Time between unanswered keepalive probes; 0 means the operating system's default.
    /// Runtime (connections opened afterwards).
    pub tcp_keepintvl: Seconds,
    /// Unanswered keepalive probes before the connection is dropped; 0 means the operating
    /// system's default. Runtime (connections opened afterwards).
    pub tcp_keepcnt: u32,
    /// How long sent data may stay unacknowledged before the connection is dropped (Linux
    /// `TCP_USER_TIMEOUT`); 0 means the operating system's default. Runtime (connections
    /// opened afterwards).
    pub tcp_user_timeout: Seconds,
    /// On SIGTERM/SIGINT, sessions in a transaction get this long to finish. Restart.
    pub shutdown_timeout: Seconds,
    /// Largest message accepted from a client. Runtime.
    pub max_message_size: ByteSize,
    /// PEM certificate chain offered to clients asking for TLS. Runtime.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key for `tls_cert_file`. Runtime.
    pub tls_key_file: Option<PathBuf>,
    /// Whether client TLS is offered or required. Runtime.
    pub client_tls_sslmode: ClientTlsMode,
    /// `tracing` filter, e.g. `info` or `pgmemo=debug`. Runtime.
    pub log_level: String,
    /// Name mappings for databases clients ask for. Runtime.
    pub databases: BTreeMap<String, DatabaseConfig>,
    /// Per-user overrides. Runtime.
    pub users: BTreeMap<String, UserConfig>,
    /// Threads serving clients; 0 means one per CPU core. Restart.
    pub worker_threads: usize,
    /// Roles allowed into the admin console (database `pgmemo`); empty means the roles that
    /// are superusers on the upstream. Runtime.
    pub admin_users: Vec<String>,
    /// Serve repeated reads from memory. Runtime.
    pub cache: Switch,
    /// Most bytes the result cache holds (keys, results and bookkeeping). Restart.
    pub cache_size: ByteSize,
    /// Larger results are not cached (they stream through untouched). Runtime.
    pub max_entry_size: ByteSize,
    /// Which cacheable misses are stored. Runtime.
    pub cache_admission: CacheAdmission,
    /// A statement whose misses take at least this long upstream on average is costly: with
    /// `cache_admission = auto` its results are stored on their first miss. Runtime.
    pub cache_costly_miss: Seconds,
    /// Entries expire after this long even without a write; 0 means never. Runtime.
    pub cache_ttl: Seconds,
    /// Tables (`schema.table` or `table`) whose results are never cached. Runtime.
    pub cache_exclude_tables: Vec<String>,
    /// When non-empty, only results reading these tables (and no others) are cached. Runtime.
    pub cache_include_tables: Vec<String>,
    /// TTL per table (`"schema.table"` or `"table"`): results reading it expire after this
    /// long. Runtime.
    pub cache_table_ttl: BTreeMap<String, Seconds>,
    /// Where the Prometheus endpoint (`GET /metrics`) listens; unset means no endpoint, so
    /// nothing is exposed unless an operator asks for it. Restart.
    pub metrics_listen: Option<SocketAddr>,
    /// How writes that do not pass through this pgmemo are seen. Restart.
    pub invalidation: Invalidation,
    /// The publication the replication feed subscribes to (created `FOR ALL TABLES` when
    /// missing). Restart.
    pub replication_publication: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 6432)),
            unix_socket_dir: None,
            upstream: UpstreamUrl::default(),
            pool_mode: PoolMode::Session,
            pool_size: 20,
            min_pool_size: 0,
            max_prepared_statements: 500,
            max_promoted_statements: 0,
            idle_transaction_timeout: Seconds(Duration::ZERO),
            max_client_conn: 1000,
            auth_type: AuthType::Upstream,
            auth_file: None,
            server_reset_query: "DISCARD ALL".to_owned(),
            query_wait_timeout: Seconds(Duration::from_secs(120)),
            server_lifetime: Seconds(Duration::from_secs(3600)),
            server_idle_timeout: Seconds(Duration::from_secs(600)),
            server_check_delay: Seconds(Duration::from_secs(30)),
            server_check_query: "SELECT 1".to_owned(),
            server_connect_timeout: Seconds(Duration::from_secs(15)),
            client_login_timeout: Seconds(Duration::from_secs(60)),
            tcp_keepalive: Switch::On,
            tcp_keepidle: Seconds(Duration::ZERO),
            tcp_keepintvl: Seconds(Duration::ZERO),
            tcp_keepcnt: 0,
            tcp_user_timeout: Seconds(Duration::ZERO),
            shutdown_timeout: Seconds(Duration::from_secs(30)),
            max_message_size: ByteSize(256 * 1024 * 1024),
            tls_cert_file: None,
            tls_key_file: None,
            client_tls_sslmode: ClientTlsMode::Prefer,
            log_level: "info".to_owned(),
            databases: BTreeMap::new(),
            users: BTreeMap::new(),
            worker_threads: 0,
            admin_users: Vec::new(),
            cache: Switch::On,
            cache_size: ByteSize(256 * 1024 * 1024),
            max_entry_size: ByteSize(1024 * 1024),
            cache_admission: CacheAdmission::Auto,
            cache_costly_miss: Seconds(Duration::from_millis(1)),
            cache_ttl: Seconds(Duration::ZERO),
            cache_exclude_tables: Vec::new(),
            cache_include_tables: Vec::new(),
            cache_table_ttl: BTreeMap::new(),
            metrics_listen: None,
            invalidation: Invalidation::Auto,
            replication_publication: "pgmemo".to_owned(),
        }
    }
}

impl Config {
    /// The TCP keepalive options for connections opened now.
    pub fn tcp_keepalive(&self) -> crate::net::TcpKeepalive {
        crate::net::TcpKeepalive {
            enabled: self.tcp_keepalive.is_on(),
            idle: self.tcp_keepidle.0,
            interval: self.tcp_keepintvl.0,
            count: self.tcp_keepcnt,
            user_timeout: self.tcp_user_timeout.0,
        }
    }

    /// Pool size for a (database, user) pool: a `[databases]` override, else a `[users]`
    /// override, else `pool_size`.
    pub fn pool_size_for(&self, database: &str, user: &str) -> usize {
        self.databases
            .get(database)
            .and_then(|d| d.pool_size)
            .or_else(|| self.users.get(user).and_then(|u| u.pool_size))
            .unwrap_or(self.pool_size)
    }

    /// Whether results of `database` (the name clients use) are cached.
    pub fn cache_on_for(&self, database: &str) -> bool {
        self.databases
            .get(database)
            .and_then(|d| d.cache)
            .unwrap_or(self.cache)
            .is_on()
    }

    /// Whether the include/exclude lists keep `schema.table` out of the cache.
    pub fn table_excluded(&self, schema: &str, table: &str) -> bool {
        let matches =
            |pattern: &String| pattern == table || pattern.split_once('.') == Some((schema, table));
        self.cache_exclude_tables.iter().any(matches)
            || (!self.cache_include_tables.is_empty()
                && !self.cache_include_tables.iter().any(matches))
    }

    /// The shortest `cache_table_ttl` among tables given as `schema.table`.
    pub fn table_ttl<'a>(&self, tables: impl Iterator<Item = &'a str>) -> Option<Duration> {
        if self.cache_table_ttl.is_empty() {
            return None;
        }
        tables
            .filter_map(|full| {
                let short = full.split_once('.').map_or(full, |(_, t)| t);
                self.cache_table_ttl
                    .get(full)
                    .or_else(|| self.cache_table_ttl.get(short))
            })
            .map(|s| s.0)
            .min()
    }

    /// The configuration as TOML with passwords masked: what `pgmemo --check` prints, safe to
    /// paste into a bug report. Apart from the masked passwords it loads back unchanged.
    pub fn to_toml_redacted(&self) -> String {
        let mut redacted = self.clone();
        redacted.upstream.password = redacted.upstream.password.map(|_| MASK.to_owned());
        for db in redacted.databases.values_mut() {
            db.password = db.password.take().map(|_| MASK.to_owned());
        }
        toml::to_string(&redacted)
            .unwrap_or_else(|e| format!("# cannot render the configuration: {e}\n"))
    }
}

/// Stands in for a password in rendered configuration.
const MASK: &str = "********";

#[cfg(test)]
mod tests {
    use super::*;

    /// The full example in docs/configuration.md must stay a valid configuration: every key
    /// known, every value of the right type, and accepted by validation apart from the files
    /// it names, which do not exist here.
    #[test]
    fn documented_full_example_parses() {
        let doc = include_str!("../../../../docs/configuration.md");
        let start = doc.find("## Full example").expect("section");
        let body = &doc[start..];
        let toml_start = body.find("```toml").expect("toml block") + "```toml".len();
        let toml_end = body[toml_start..].find("```").expect("block end") + toml_start;
        let example = &body[toml_start..toml_end];
        let config: Config = toml::from_str(example).expect("example parses");
        assert_eq!(config.pool_mode, PoolMode::Session);
        let problems = match load::validate(&config) {
            Ok(()) => Vec::new(),
            Err(ConfigError::Invalid(p)) => p,
            Err(e) => panic!("{e}"),
        };
        for p in problems {
            assert!(
                p.contains("/etc/pgmemo")
                    || p.contains("does not exist")
                    || p.contains("not found"),
                "documented example is invalid: {p}"
            );
        }
    }

    #[test]
    fn table_ttl_takes_the_shortest_match() {
        let mut c = Config::default();
        assert_eq!(c.table_ttl(["public.a"].into_iter()), None);
        c.cache_table_ttl
            .insert("public.a".into(), Seconds(Duration::from_secs(30)));
        c.cache_table_ttl
            .insert("b".into(), Seconds(Duration::from_secs(5)));
        assert_eq!(
            c.table_ttl(["public.a", "s.b"].into_iter()),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            c.table_ttl(["public.a"].into_iter()),
            Some(Duration::from_secs(30))
        );
        assert_eq!(c.table_ttl(["other.a"].into_iter()), None);
        assert!(!c.table_excluded("s", "x"));
        c.cache_exclude_tables = vec!["s.x".into()];
        assert!(c.table_excluded("s", "x"));
        c.cache_include_tables = vec!["y".into()];
        assert!(c.table_excluded("public", "z"));
        assert!(!c.table_excluded("public", "y"));
    }

    #[test]
    fn rendering_masks_passwords() {
        let mut c = Config {
            upstream: UpstreamUrl::parse("postgres://u:hunter2@db/app").unwrap(),
            ..Config::default()
        };
        let db = DatabaseConfig {
            password: Some("swordfish".into()),
            ..DatabaseConfig::default()
        };
        c.databases.insert("app".into(), db);
        let text = c.to_toml_redacted();
        assert!(
            !text.contains("hunter2") && !text.contains("swordfish"),
            "{text}"
        );
        let back: Config = toml::from_str(&text).unwrap();
        assert_eq!(back.upstream.host, "db");
        assert_eq!(back.databases["app"].password.as_deref(), Some(MASK));
    }
}

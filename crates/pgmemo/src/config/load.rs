//! Loading the configuration: the step before the query path exists, run once at start and again
//! on SIGHUP. Defaults < TOML file < `PGMEMO_<KEY>` environment variables < command-line flags
//! are merged into one [`Config`], which is then validated, reporting every problem at once.

use std::fmt;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

use super::{AuthType, ClientTlsMode, Config, PoolMode};

/// Prefix of the environment variables that set configuration keys.
const ENV_PREFIX: &str = "PGMEMO_";

/// `PGMEMO_` variables that are not configuration keys: the config file path (read by the CLI)
/// and the log filter override (read by the binary's logging setup).
const NON_CONFIG_ENV: &[&str] = &["PGMEMO_CONFIG", "PGMEMO_LOG"];

/// Top-level keys of [`Config`]; a test keeps this list in step with the struct.
const KEYS: &[&str] = &[
    "listen",
    "unix_socket_dir",
    "worker_threads",
    "admin_users",
    "upstream",
    "pool_mode",
    "pool_size",
    "min_pool_size",
    "max_prepared_statements",
    "max_promoted_statements",
    "idle_transaction_timeout",
    "max_client_conn",
    "auth_type",
    "auth_file",
    "server_reset_query",
    "query_wait_timeout",
    "server_lifetime",
    "server_idle_timeout",
    "server_check_delay",
    "server_check_query",
    "server_connect_timeout",
    "client_login_timeout",
    "tcp_keepalive",
    "tcp_keepidle",
    "tcp_keepintvl",
    "tcp_keepcnt",
    "tcp_user_timeout",
    "shutdown_timeout",
    "max_message_size",
    "tls_cert_file",
    "tls_key_file",
    "client_tls_sslmode",
    "log_level",
    "databases",
    "users",
    "cache",
    "cache_size",
    "max_entry_size",
    "cache_admission",
    "cache_costly_miss",
    "cache_ttl",
    "cache_exclude_tables",
    "cache_include_tables",
    "cache_table_ttl",
    "metrics_listen",
    "invalidation",
    "replication_publication",
];

/// Smallest `max_message_size` that still fits a startup packet and ordinary queries.
const MIN_MESSAGE_SIZE: usize = 1024;

/// Where a configuration comes from. Kept by the binary so SIGHUP can load again from the same
/// file, environment and flags.
#[derive(Debug, Clone, Default)]
pub struct ConfigSources {
    /// The TOML file, if any (`--config` / `PGMEMO_CONFIG`).
    pub file: Option<PathBuf>,
    /// Values from command-line flags, keyed by config key (`pool_size`, not `--pool-size`).
    pub overrides: Table,
    /// Environment variables; only those starting with `PGMEMO_` are looked at.
    pub env: Vec<(String, String)>,
}

impl ConfigSources {
    /// Sources for the running process: the given file and flags plus its `PGMEMO_*` variables.
    pub fn from_process(file: Option<PathBuf>, overrides: Table) -> ConfigSources {
        let env = std::env::vars_os()
            .filter_map(|(k, v)| {
                let k = k.into_string().ok()?;
                k.starts_with(ENV_PREFIX)
                    .then(|| (k, v.to_string_lossy().into_owned()))
            })
            .collect();
        ConfigSources {
            file,
            overrides,
            env,
        }
    }
}

/// Why a configuration could not be loaded. Every variant names where the problem is.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration file could not be read.
    #[error("cannot read configuration file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not valid TOML or holds an unknown key or a badly typed value.
    #[error("in configuration file {}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    /// A `PGMEMO_*` variable that names no configuration key (most likely a typo).
    #[error(
        "unknown environment variable {0}: not a configuration key \
         (PGMEMO_<KEY> sets the top-level key <key> of the configuration file)"
    )]
    UnknownEnv(String),
    /// A `PGMEMO_<KEY>` variable whose value does not fit the key.
    #[error("environment variable {name}: {message}")]
    Env { name: String, message: String },
    /// A command-line value that does not fit its key.
    #[error("command-line setting {key}: {message}")]
    Override { key: String, message: String },
    /// The merged configuration is well-formed but inconsistent; lists every problem.
    #[error("invalid configuration:{}", Bullets(.0))]
    Invalid(Vec<String>),
}

/// Renders problems as an indented bullet list, one per line.
struct Bullets<'a>(&'a [String]);

impl fmt::Display for Bullets<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for problem in self.0 {
            write!(f, "\n  - {problem}")?;
        }
        Ok(())
    }
}

/// Loads and validates the configuration. Precedence: flags > environment > file > defaults.
pub fn load(sources: &ConfigSources) -> Result<Config, ConfigError> {
    let config = assemble(sources)?;
    validate(&config)?;
    Ok(config)
}

/// Merges the sources into a `Config` without the cross-field checks of [`validate`].
fn assemble(sources: &ConfigSources) -> Result<Config, ConfigError> {
    let mut merged = match &sources.file {
        Some(path) => read_file(path)?,
        None => Table::new(),
    };
    for (name, value) in env_settings(&sources.env)? {
        overlay(&mut merged, name, value);
    }
    for (key, value) in &sources.overrides {
        probe(key, value).map_err(|message| ConfigError::Override {
            key: key.clone(),
            message,
        })?;
        overlay(&mut merged, key.clone(), value.clone());
    }
    // Each piece deserialized on its own above, so this only fails on an inconsistency we did
    // not foresee; report it rather than panic.
    Value::Table(merged)
        .try_into::<Config>()
        .map_err(|e| ConfigError::Invalid(vec![clean(&e.to_string())]))
}

/// Reads the file as a table, after checking it deserializes on its own: errors then carry the
/// line, column and key of the problem.
fn read_file(path: &Path) -> Result<Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_owned(),
        source,
    })?;
    // Where and what, without the source line toml's own message quotes: a line such as
    // `upstream = "postgres://app:secret@..."` must not reach logs or the admin console.
    let parse_error = |e: toml::de::Error| {
        let at = e
            .span()
            .and_then(|span| text.get(..span.start))
            .map(|before| {
                let line = before.matches('\n').count() + 1;
                let line_start = before.rfind('\n').map_or(0, |i| i + 1);
                let column = before.len() - line_start + 1;
                // The key of that line (never its value), when the line assigns one.
                let key = text[line_start..]
                    .lines()
                    .next()
                    .and_then(|l| l.split_once('='))
                    .map(|(k, _)| k.trim())
                    .filter(|k| !k.is_empty() && k.len() <= 64 && !k.contains(['"', '\'']))
                    .map(|k| format!(" ({k})"))
                    .unwrap_or_default();
                format!("line {line}, column {column}{key}: ")
            })
            .unwrap_or_default();
        ConfigError::Parse {
            path: path.to_owned(),
            message: format!("{at}{}", e.message().trim_end()),
        }
    };
    toml::from_str::<Config>(&text).map_err(parse_error)?;
    toml::from_str::<Table>(&text).map_err(parse_error)
}

/// Turns `PGMEMO_<KEY>` variables into `(key, value)` pairs, each checked against its key.
fn env_settings(env: &[(String, String)]) -> Result<Vec<(String, Value)>, ConfigError> {
    let mut settings = Vec::new();
    for (name, raw) in env {
        let Some(suffix) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if NON_CONFIG_ENV.contains(&name.as_str()) {
            continue;
        }
        let key = suffix.to_ascii_lowercase();
        if !KEYS.contains(&key.as_str()) {
            return Err(ConfigError::UnknownEnv(name.clone()));
        }
        let value = env_value(&key, raw).map_err(|message| ConfigError::Env {
            name: name.clone(),
            message,
        })?;
        settings.push((key, value));
    }
    Ok(settings)
}

/// Interprets an environment value: as a TOML integer, boolean, float or inline table when it
/// reads as one and that fits the key, otherwise as a plain string. So `PGMEMO_POOL_SIZE=20`
/// is a number while `PGMEMO_SERVER_CHECK_QUERY=1` stays the string `"1"`.
fn env_value(key: &str, raw: &str) -> Result<Value, String> {
    let typed = toml::from_str::<Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .filter(|v| !v.is_str());
    let string = Value::String(raw.to_owned());
    match typed {
        Some(v) => match probe(key, &v) {
            Ok(()) => Ok(v),
            Err(typed_error) => probe(key, &string)
                .map(|()| string)
                .map_err(|_| typed_error),
        },
        None => probe(key, &string).map(|()| string),
    }
}

/// Checks that `key = value` alone deserializes into a `Config`.
fn probe(key: &str, value: &Value) -> Result<(), String> {
    let mut table = Table::new();
    table.insert(key.to_owned(), value.clone());
    Value::Table(table)
        .try_into::<Config>()
        .map(drop)
        .map_err(|e| clean(&e.to_string()))
}

/// Sets `key` in `base`; tables (such as `databases` and `users`) are merged key by key.
fn overlay(base: &mut Table, key: String, value: Value) {
    match value {
        Value::Table(over) if base.get(&key).is_some_and(Value::is_table) => {
            if let Some(Value::Table(inner)) = base.get_mut(&key) {
                for (k, v) in over {
                    overlay(inner, k, v);
                }
            }
        }
        value => {
            base.insert(key, value);
        }
    }
}

/// Flattens a multi-line deserializer message onto one line.
fn clean(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Cross-field checks on a deserialized configuration. Reports every problem at once so an
/// operator fixes the file in one pass; also used before applying a reload.
pub fn validate(config: &Config) -> Result<(), ConfigError> {
    let mut problems = Vec::new();
    let mut require = |ok: bool, problem: String| {
        if !ok {
            problems.push(problem);
        }
    };
    require(config.pool_size >= 1, "pool_size must be at least 1".into());
    require(
        config.pool_mode == PoolMode::Session || config.max_prepared_statements >= 1,
        "max_prepared_statements must be at least 1 with pool_mode = \"transaction\"".into(),
    );
    require(
        config.max_client_conn >= 1,
        "max_client_conn must be at least 1".into(),
    );
    require(
        config.auth_type == AuthType::Upstream || config.auth_file.is_some(),
        format!(
            "auth_type = \"{}\" needs auth_file (a userlist of \"user\" \"secret\" lines)",
            auth_type_name(config.auth_type)
        ),
    );
    for (key, timeout) in [
        ("query_wait_timeout", config.query_wait_timeout),
        ("server_connect_timeout", config.server_connect_timeout),
        ("client_login_timeout", config.client_login_timeout),
    ] {
        require(
            !timeout.0.is_zero(),
            format!("{key} must be greater than 0"),
        );
    }
    require(
        config.max_message_size.0 >= MIN_MESSAGE_SIZE,
        format!(
            "max_message_size must be at least 1kB (got {})",
            config.max_message_size
        ),
    );
    if let Some(metrics) = config.metrics_listen {
        require(
            metrics != config.listen || metrics.port() == 0,
            format!("metrics_listen {metrics} must differ from listen"),
        );
    }
    require(
        !config.replication_publication.is_empty() && config.replication_publication.len() <= 63,
        "replication_publication must be 1 to 63 bytes long".into(),
    );
    require(
        config.invalidation != super::Invalidation::Replication || config.upstream.user.is_some(),
        "invalidation = \"replication\" needs a user in the upstream URL (one that may \
         replicate: REPLICATION or superuser)"
            .into(),
    );
    match (&config.tls_cert_file, &config.tls_key_file) {
        (Some(_), None) => require(false, "tls_cert_file is set but tls_key_file is not".into()),
        (None, Some(_)) => require(false, "tls_key_file is set but tls_cert_file is not".into()),
        _ => {}
    }
    require(
        config.client_tls_sslmode != ClientTlsMode::Require || config.tls_cert_file.is_some(),
        "client_tls_sslmode = \"require\" needs tls_cert_file and tls_key_file".into(),
    );
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&config.log_level) {
        require(
            false,
            format!(
                "log_level {:?} is not a valid filter: {e}",
                config.log_level
            ),
        );
    }
    let files = [
        ("auth_file", config.auth_file.as_deref()),
        ("tls_cert_file", config.tls_cert_file.as_deref()),
        ("tls_key_file", config.tls_key_file.as_deref()),
        (
            "upstream sslrootcert",
            config.upstream.sslrootcert.as_deref().map(Path::new),
        ),
    ];
    for (key, path) in files {
        if let Some(problem) = path.and_then(|p| missing_file(key, p)) {
            problems.push(problem);
        }
    }
    if config.min_pool_size > config.pool_size {
        problems.push(format!(
            "min_pool_size ({}) must not exceed pool_size ({})",
            config.min_pool_size, config.pool_size
        ));
    }
    for (name, user) in &config.users {
        if user.pool_size == Some(0) {
            problems.push(format!("users.{name}.pool_size must be at least 1"));
        }
    }
    for (name, db) in &config.databases {
        let at = format!("databases.{name}");
        if name.is_empty() {
            problems.push("databases: a database name must not be empty".into());
        }
        if db.pool_size == Some(0) {
            problems.push(format!("{at}.pool_size must be at least 1"));
        }
        if db.port == Some(0) {
            problems.push(format!("{at}.port must not be 0"));
        }
        for (field, value) in [
            ("host", &db.host),
            ("dbname", &db.dbname),
            ("user", &db.user),
        ] {
            if value.as_deref() == Some("") {
                problems.push(format!(
                    "{at}.{field} must not be empty (leave it out instead)"
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::Invalid(problems))
    }
}

/// A problem text when `path` is not a readable regular file.
fn missing_file(key: &str, path: &Path) -> Option<String> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => None,
        Ok(_) => Some(format!("{key} {} is not a regular file", path.display())),
        Err(e) => Some(format!("{key} {}: {e}", path.display())),
    }
}

/// The spelling of an auth type in the configuration file.
fn auth_type_name(auth_type: AuthType) -> &'static str {
    match auth_type {
        AuthType::Upstream => "upstream",
        AuthType::Trust => "trust",
        AuthType::Md5 => "md5",
        AuthType::ScramSha256 => "scram-sha-256",
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::Duration;

    use super::*;
    use crate::config::{ByteSize, DatabaseConfig, PoolMode, Seconds};

    fn file_with(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    fn sources(file: Option<&Path>, env: &[(&str, &str)], overrides: &str) -> ConfigSources {
        ConfigSources {
            file: file.map(Path::to_owned),
            overrides: toml::from_str(overrides).unwrap(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn no_sources_gives_defaults() {
        assert_eq!(load(&ConfigSources::default()).unwrap(), Config::default());
    }

    #[test]
    fn precedence_is_flags_then_env_then_file_then_defaults() {
        let f = file_with(
            "listen = \"127.0.0.1:7000\"\npool_size = 5\nmax_client_conn = 10\nlog_level = \"warn\"\n",
        );
        let s = sources(
            Some(f.path()),
            &[
                ("PGMEMO_POOL_SIZE", "7"),
                ("PGMEMO_MAX_CLIENT_CONN", "50"),
                ("HOME", "/root"),
                ("PGMEMO_CONFIG", "/elsewhere.toml"),
                ("PGMEMO_LOG", "debug"),
            ],
            "pool_size = 9",
        );
        let c = load(&s).unwrap();
        assert_eq!(c.pool_size, 9, "flag beats env and file");
        assert_eq!(c.max_client_conn, 50, "env beats file");
        assert_eq!(c.listen.port(), 7000, "file beats default");
        assert_eq!(c.log_level, "warn", "PGMEMO_LOG is not log_level");
        assert_eq!(c.pool_mode, PoolMode::Session, "default");
    }

    #[test]
    fn errors_in_the_file_never_quote_its_lines() {
        let f = file_with("pool_size = 3\nupstream = \"postgres://app:s3cret@db:bad/x\"\n");
        let msg = load(&sources(Some(f.path()), &[], ""))
            .unwrap_err()
            .to_string();
        assert!(!msg.contains("s3cret"), "{msg}");
        assert!(msg.contains("line 2") && msg.contains("upstream"), "{msg}");
        let f = file_with("pool_size = 3\nupstream = \"postgres://app:s3cret@db/x\n");
        let msg = load(&sources(Some(f.path()), &[], ""))
            .unwrap_err()
            .to_string();
        assert!(!msg.contains("s3cret"), "{msg}");
    }

    #[test]
    fn unknown_key_in_file_names_key_and_file() {
        let f = file_with("pool_size = 3\npool_sise = 4\n");
        let err = load(&sources(Some(f.path()), &[], "")).unwrap_err();
        assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("pool_sise"), "{msg}");
        assert!(msg.contains(&f.path().display().to_string()), "{msg}");
        assert!(msg.contains("line 2"), "{msg}");
    }

    #[test]
    fn unreadable_and_malformed_files() {
        let err = load(&sources(
            Some(Path::new("/nonexistent/pgmemo.toml")),
            &[],
            "",
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/pgmemo.toml"),
            "{err}"
        );
        let f = file_with("pool_size = \n");
        let err = load(&sources(Some(f.path()), &[], "")).unwrap_err();
        assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");
        let f = file_with("pool_size = \"many\"\n");
        let err = load(&sources(Some(f.path()), &[], "")).unwrap_err();
        assert!(err.to_string().contains("pool_size"), "{err}");
    }

    #[test]
    fn unknown_env_var_is_rejected_by_name() {
        let err = load(&sources(None, &[("PGMEMO_POOLSIZE", "3")], "")).unwrap_err();
        assert!(matches!(&err, ConfigError::UnknownEnv(n) if n == "PGMEMO_POOLSIZE"));
        assert!(err.to_string().contains("PGMEMO_POOLSIZE"));
    }

    #[test]
    fn transaction_pooling_needs_room_for_prepared_statements() {
        let c = load(&sources(None, &[("PGMEMO_POOL_MODE", "transaction")], "")).unwrap();
        assert_eq!(c.pool_mode, PoolMode::Transaction);
        assert_eq!(c.max_prepared_statements, 500);
        let err = load(&sources(
            None,
            &[
                ("PGMEMO_POOL_MODE", "transaction"),
                ("PGMEMO_MAX_PREPARED_STATEMENTS", "0"),
            ],
            "",
        ))
        .unwrap_err();
        assert!(err.to_string().contains("max_prepared_statements"), "{err}");
    }

    #[test]
    fn env_values_are_typed_by_key() {
        let env = [
            ("PGMEMO_POOL_SIZE", "12"),
            ("PGMEMO_SERVER_CHECK_QUERY", "1"),
            ("PGMEMO_QUERY_WAIT_TIMEOUT", "30s"),
            ("PGMEMO_SERVER_LIFETIME", "90"),
            ("PGMEMO_MAX_MESSAGE_SIZE", "1MB"),
            ("PGMEMO_POOL_MODE", "session"),
            ("PGMEMO_UPSTREAM", "postgres://db:5433/app"),
            (
                "PGMEMO_DATABASES",
                "{ app = { dbname = \"real\", pool_size = 3 } }",
            ),
        ];
        let c = load(&sources(None, &env, "")).unwrap();
        assert_eq!(c.pool_size, 12);
        assert_eq!(c.server_check_query, "1");
        assert_eq!(c.query_wait_timeout, Seconds(Duration::from_secs(30)));
        assert_eq!(c.server_lifetime, Seconds(Duration::from_secs(90)));
        assert_eq!(c.max_message_size, ByteSize(1 << 20));
        assert_eq!(c.pool_mode, PoolMode::Session);
        assert_eq!((c.upstream.host.as_str(), c.upstream.port), ("db", 5433));
        assert_eq!(c.pool_size_for("app", "anyone"), 3);
    }

    #[test]
    fn bad_env_value_names_the_variable() {
        let err = load(&sources(None, &[("PGMEMO_POOL_SIZE", "lots")], "")).unwrap_err();
        assert!(matches!(&err, ConfigError::Env { name, .. } if name == "PGMEMO_POOL_SIZE"));
        let err = load(&sources(None, &[("PGMEMO_SERVER_LIFETIME", "soon")], "")).unwrap_err();
        assert!(err.to_string().contains("PGMEMO_SERVER_LIFETIME"), "{err}");
    }

    #[test]
    fn bad_override_names_the_key() {
        let err = load(&sources(None, &[], "pool_mode = \"statement\"")).unwrap_err();
        assert!(matches!(&err, ConfigError::Override { key, .. } if key == "pool_mode"));
    }

    #[test]
    fn durations_and_sizes_in_file() {
        let f = file_with(
            "query_wait_timeout = \"30s\"\nserver_check_delay = \"500ms\"\n\
             server_idle_timeout = \"5m\"\nserver_lifetime = 7200\n\
             max_message_size = \"1MB\"\n",
        );
        let c = load(&sources(Some(f.path()), &[], "")).unwrap();
        assert_eq!(c.query_wait_timeout.0, Duration::from_secs(30));
        assert_eq!(c.server_check_delay.0, Duration::from_millis(500));
        assert_eq!(c.server_idle_timeout.0, Duration::from_secs(300));
        assert_eq!(c.server_lifetime.0, Duration::from_secs(7200));
        assert_eq!(c.max_message_size.0, 1 << 20);
    }

    #[test]
    fn users_override_the_pool_size_and_min_pool_size_is_bounded() {
        let f = file_with(
            "pool_size = 5\nmin_pool_size = 2\n[users.batch]\npool_size = 2\n\
             [databases.app]\npool_size = 4\n",
        );
        let c = load(&sources(Some(f.path()), &[], "")).unwrap();
        assert_eq!(c.pool_size_for("other", "batch"), 2);
        assert_eq!(c.pool_size_for("app", "batch"), 4, "a database entry wins");
        assert_eq!(c.pool_size_for("other", "web"), 5);
        assert_eq!(c.min_pool_size, 2);
        let err = load(&sources(None, &[], "min_pool_size = 30")).unwrap_err();
        assert!(err.to_string().contains("min_pool_size"), "{err}");
        let f = file_with("[users.batch]\npool_size = 0\n");
        let err = load(&sources(Some(f.path()), &[], "")).unwrap_err();
        assert!(err.to_string().contains("users.batch.pool_size"), "{err}");
    }

    #[test]
    fn databases_merge_across_sources() {
        let f = file_with("[databases.app]\nhost = \"db1\"\ndbname = \"app_prod\"\n");
        let env = [(
            "PGMEMO_DATABASES",
            "{ app = { pool_size = 4 }, other = {} }",
        )];
        let c = load(&sources(Some(f.path()), &env, "")).unwrap();
        let app = &c.databases["app"];
        assert_eq!(app.host.as_deref(), Some("db1"));
        assert_eq!(app.dbname.as_deref(), Some("app_prod"));
        assert_eq!(app.pool_size, Some(4));
        assert!(c.databases.contains_key("other"));
    }

    #[test]
    fn validation_reports_every_problem() {
        let f = file_with(
            "pool_size = 0\nmax_client_conn = 0\nauth_type = \"md5\"\n\
             tls_cert_file = \"/nonexistent/cert.pem\"\nclient_tls_sslmode = \"require\"\n\
             max_message_size = 100\nserver_connect_timeout = 0\nlog_level = \"[[[\"\n\
             [databases.app]\npool_size = 0\n",
        );
        let err = load(&sources(Some(f.path()), &[], "")).unwrap_err();
        let ConfigError::Invalid(problems) = &err else {
            panic!("{err:?}");
        };
        let text = err.to_string();
        for needle in [
            "pool_size must be",
            "max_client_conn",
            "needs auth_file",
            "tls_key_file is not",
            "/nonexistent/cert.pem",
            "max_message_size",
            "server_connect_timeout",
            "log_level",
            "databases.app.pool_size",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        assert_eq!(problems.len(), 9, "{text}");
        assert!(text.starts_with("invalid configuration:\n  - "), "{text}");
    }

    #[test]
    fn metrics_listen_loads_and_must_not_take_the_client_port() {
        let env = [("PGMEMO_METRICS_LISTEN", "127.0.0.1:9187")];
        let c = load(&sources(None, &env, "")).unwrap();
        assert_eq!(c.metrics_listen, Some("127.0.0.1:9187".parse().unwrap()));
        let clash = sources(None, &env, "listen = \"127.0.0.1:9187\"");
        let err = load(&clash).unwrap_err().to_string();
        assert!(
            err.contains("metrics_listen 127.0.0.1:9187 must differ"),
            "{err}"
        );
    }

    #[test]
    fn validation_accepts_existing_files() {
        let users = file_with("\"alice\" \"secret\"\n");
        let cert = file_with("cert");
        let key = file_with("key");
        let mut c = Config {
            auth_type: AuthType::ScramSha256,
            auth_file: Some(users.path().to_owned()),
            tls_cert_file: Some(cert.path().to_owned()),
            tls_key_file: Some(key.path().to_owned()),
            client_tls_sslmode: ClientTlsMode::Require,
            ..Config::default()
        };
        validate(&c).unwrap();
        c.auth_file = Some(std::env::temp_dir());
        let err = validate(&c).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }

    fn everything_set() -> Config {
        let mut c = Config {
            auth_type: AuthType::Md5,
            auth_file: Some("/etc/pgmemo/userlist.txt".into()),
            tls_cert_file: Some("/etc/pgmemo/cert.pem".into()),
            tls_key_file: Some("/etc/pgmemo/key.pem".into()),
            upstream: crate::config::UpstreamUrl::parse(
                "postgres://u:p@db:5433/app?sslmode=verify-ca&sslrootcert=/ca.pem",
            )
            .unwrap(),
            query_wait_timeout: Seconds(Duration::from_millis(1500)),
            ..Config::default()
        };
        let db = DatabaseConfig {
            host: Some("h".into()),
            port: Some(1),
            dbname: Some("d".into()),
            user: Some("u".into()),
            password: Some("p".into()),
            pool_size: Some(2),
            cache: Some(crate::config::Switch::Off),
        };
        c.databases.insert("app".into(), db);
        c.cache_exclude_tables = vec!["audit.log".into()];
        c.cache_table_ttl
            .insert("public.rates".into(), Seconds(Duration::from_secs(5)));
        c.metrics_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 9187)));
        c.unix_socket_dir = Some("/var/run/pgmemo".into());
        c
    }

    #[test]
    fn key_list_matches_the_struct() {
        let value = Value::try_from(everything_set()).unwrap();
        let table = value.as_table().unwrap();
        let mut keys: Vec<&str> = table.keys().map(String::as_str).collect();
        let mut expected = KEYS.to_vec();
        keys.sort_unstable();
        expected.sort_unstable();
        assert_eq!(keys, expected);
    }

    #[test]
    fn serialized_config_loads_back() {
        let c = everything_set();
        let f = file_with(&toml::to_string(&c).unwrap());
        assert_eq!(assemble(&sources(Some(f.path()), &[], "")).unwrap(), c);
    }
}

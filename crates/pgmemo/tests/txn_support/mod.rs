//! Shared by the transaction-pooling test files (`transaction_pooling.rs`,
//! `transaction_drivers.rs`): pgmemo in `pool_mode = "transaction"`, small client helpers,
//! scratch tables on the local server, a raw protocol client that records what it gets as text
//! (so a run through pgmemo can be compared with the same run directly against PostgreSQL), and
//! python3 with the Python drivers, installed once. (psql and pgbench: `testkit::pg_client`.)

// Each test file uses a different part of this module.
#![allow(dead_code)]

use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use pgmemo::config::{Invalidation, PoolMode, Seconds, Switch};
use pgmemo::Config;
use testkit::{
    pgmemo_config_for, rows, scrub_pg_env, spawn_pgmemo, unique, LocalPostgres, PgmemoInstance,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_postgres::{Client, NoTls};

pub const USER: &str = "postgres";
/// Database on the shared local server.
pub const DB: &str = "test";
/// Generous bound for anything that should happen "at once" on a busy CI machine.
pub const SOON: Duration = Duration::from_secs(10);
/// Upper bound for one ordinary test; a hang fails instead of blocking the suite.
pub const TEST_DEADLINE: Duration = Duration::from_secs(120);

/// Transaction pooling in front of PostgreSQL on 127.0.0.1:`port`, with the result cache on
/// (so every test here also runs the cache's effect tracking and capture; tests whose writes
/// bypass pgmemo turn it off), and a short `query_wait_timeout` so that a client stuck
/// waiting for a server fails the test instead of hanging it.
pub fn txn_config(port: u16, pool_size: usize) -> Config {
    Config {
        pool_mode: PoolMode::Transaction,
        pool_size,
        cache: Switch::On,
        invalidation: Invalidation::Proxy,
        query_wait_timeout: Seconds(Duration::from_secs(15)),
        ..pgmemo_config_for(port)
    }
}

/// [`txn_config`] with `tweak` applied, started.
pub async fn txn_pgmemo(
    port: u16,
    pool_size: usize,
    tweak: impl FnOnce(&mut Config),
) -> PgmemoInstance {
    let mut config = txn_config(port, pool_size);
    tweak(&mut config);
    spawn_pgmemo(config)
        .await
        .expect("pgmemo starts with pool_mode = transaction")
}

/// [`txn_pgmemo`] over the local server's one connection that holds one prepared statement at
/// a time (`max_prepared_statements` = 1): a client's statements are evicted and prepared
/// again there whenever it uses another.
pub async fn evicting_pgmemo(cache: Switch) -> PgmemoInstance {
    evicting_pgmemo_at(LocalPostgres::PORT, cache).await
}

/// [`evicting_pgmemo`] in front of the server on `port`.
pub async fn evicting_pgmemo_at(port: u16, cache: Switch) -> PgmemoInstance {
    txn_pgmemo(port, 1, |c| {
        c.cache = cache;
        c.max_prepared_statements = 1;
    })
    .await
}

/// The server's message of a database error ("" for other errors).
pub fn db_message(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map(|d| d.message().to_owned())
        .unwrap_or_default()
}

/// The first column of the first row of a simple query; panics on an error or no row.
pub async fn value(client: &Client, sql: &str) -> String {
    let messages = client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    rows(&messages)
        .into_iter()
        .next()
        .and_then(|r| r.into_iter().next().flatten())
        .unwrap_or_else(|| panic!("{sql}: no value"))
}

/// The error of a simple query that must fail.
pub async fn query_error(client: &Client, sql: &str) -> tokio_postgres::Error {
    match client.simple_query(sql).await {
        Ok(m) => panic!("{sql}: succeeded with {:?}, expected an error", rows(&m)),
        Err(e) => e,
    }
}

/// The backend serving this statement (in transaction pooling it may change per statement).
pub async fn backend_pid(client: &Client) -> i32 {
    value(client, "SELECT pg_backend_pid()")
        .await
        .parse()
        .unwrap()
}

/// A client connected with a changed configuration (application_name, options, ...).
pub async fn connect_with(url: &str, change: impl FnOnce(&mut tokio_postgres::Config)) -> Client {
    let mut config: tokio_postgres::Config = url.parse().unwrap();
    change(&mut config);
    let (client, connection) = config
        .connect(NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e:?}"));
    tokio::spawn(connection);
    client
}

/// A table `columns` (e.g. `"(v text)"`) on the local server under a name no other test uses,
/// created directly (pgmemo does not see it); returns the name. Drop it with [`drop_table`].
pub async fn create_table(prefix: &str, columns: &str) -> String {
    let t = unique(prefix);
    let direct = LocalPostgres.client(USER, DB).await;
    direct
        .batch_execute(&format!("CREATE TABLE {t} {columns}"))
        .await
        .unwrap();
    t
}

/// Drops a table of [`create_table`], directly.
pub async fn drop_table(t: &str) {
    let direct = LocalPostgres.client(USER, DB).await;
    direct
        .batch_execute(&format!("DROP TABLE {t}"))
        .await
        .unwrap();
}

/// Two tenant schemas (a schema per tenant) on the local server under names no other test
/// uses, created directly: each holds `table` (`column int`) with one row, 0 in the first
/// and 1 in the second. Drop them with [`drop_tenants`].
pub async fn create_tenants(table: &str, column: &str) -> [String; 2] {
    let schemas = [unique("tenant_a"), unique("tenant_b")];
    let direct = LocalPostgres.client(USER, DB).await;
    for (i, schema) in schemas.iter().enumerate() {
        direct
            .batch_execute(&format!(
                "CREATE SCHEMA {schema}; CREATE TABLE {schema}.{table} ({column} int); \
                 INSERT INTO {schema}.{table} VALUES ({i})"
            ))
            .await
            .unwrap();
    }
    schemas
}

/// Drops the schemas of [`create_tenants`], directly.
pub async fn drop_tenants(schemas: &[String; 2]) {
    let direct = LocalPostgres.client(USER, DB).await;
    for schema in schemas {
        direct
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// One-time set-up shared by parallel test processes, and Python.

/// An exclusive `flock` on `path` (created if missing), held until the file is dropped: for
/// set-up that parallel test processes must not do twice at once. Blocks; call it from
/// `spawn_blocking`.
pub fn lock_exclusive(path: &Path) -> std::fs::File {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("opening lock file {}: {e}", path.display()));
    // SAFETY: flock(2) on a descriptor we own; no memory is shared with the kernel.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(
        rc,
        0,
        "flock {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    file
}

/// What the Python tests install from PyPI.
const PY_PACKAGES: &[&str] = &["psycopg[binary]>=3.1,<4", "asyncpg>=0.29,<1"];

/// A directory with psycopg 3 and asyncpg, for `PYTHONPATH`: installed with pip once (per
/// target directory; later runs reuse it), under a file lock so parallel tests and test
/// processes do not race.
pub async fn python_deps() -> PathBuf {
    static DEPS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    tokio::task::spawn_blocking(|| DEPS.get_or_init(install_python_deps).clone())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn install_python_deps() -> Result<PathBuf, String> {
    install_once("pgmemo-pydeps", PY_PACKAGES, |dir| {
        let mut pip = std::process::Command::new("python3");
        pip.args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(["--no-input", "--target"])
        .arg(dir)
        .args(PY_PACKAGES)
        .env("PIP_ROOT_USER_ACTION", "ignore");
        pip
    })
}

/// Installs `packages` into `CARGO_TARGET_TMPDIR/NAME` with the command `install(dir)` once
/// per target directory: later runs find the list of packages in a marker file and reuse the
/// directory. Under a file lock, so parallel test processes do not race.
fn install_once(
    name: &str,
    packages: &[&str],
    install: impl FnOnce(&Path) -> std::process::Command,
) -> Result<PathBuf, String> {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&root).map_err(|e| format!("creating {}: {e}", root.display()))?;
    let dir = root.join(name);
    let marker = dir.join(".pgmemo-installed");
    let wanted = packages.join("\n");
    let _lock = lock_exclusive(&root.join(format!("{name}.lock")));
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let mut command = install(&dir);
    let out = command
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", command.get_program()))?;
    if !out.status.success() {
        return Err(format!(
            "installing {packages:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    std::fs::write(&marker, wanted).map_err(|e| format!("writing {}: {e}", marker.display()))?;
    Ok(dir)
}

/// `python3 tests/python/SCRIPT ARGS...` with the drivers on `PYTHONPATH`.
pub async fn python(script: &str, args: &[String]) -> tokio::process::Command {
    let deps = python_deps().await;
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let mut cmd = tokio::process::Command::new("python3");
    scrub_pg_env(&mut cmd);
    cmd.arg("-u")
        .arg(path)
        .args(args)
        .env("PYTHONPATH", deps)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    cmd
}

/// PostgreSQL's JDBC driver as Debian installs it (package `libpostgresql-jdbc-java`, which
/// `.ci/run` installs).
const JDBC_JAR: &str = "/usr/share/java/postgresql.jar";

/// `java -cp JDBC_JAR tests/java/JdbcCheck.java ARGS...`: a single-file program, compiled
/// in memory by the JDK's launcher.
pub fn jdbc_check(args: &[String]) -> tokio::process::Command {
    assert!(
        Path::new(JDBC_JAR).exists(),
        "{JDBC_JAR} is missing: apt-get install libpostgresql-jdbc-java (.ci/run installs it)"
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/java/JdbcCheck.java");
    let mut cmd = tokio::process::Command::new("java");
    scrub_pg_env(&mut cmd);
    cmd.arg("-cp").arg(JDBC_JAR).arg(path).args(args);
    cmd
}

/// What the Node.js test installs from the npm registry.
const NODE_PACKAGES: &[&str] = &["pg@8"];

/// A `node_modules` directory with node-postgres, for `NODE_PATH`: installed with npm once
/// (per target directory), under a file lock, as [`python_deps`].
pub async fn node_deps() -> PathBuf {
    static DEPS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    tokio::task::spawn_blocking(|| DEPS.get_or_init(install_node_deps).clone())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn install_node_deps() -> Result<PathBuf, String> {
    let dir = install_once("pgmemo-nodedeps", NODE_PACKAGES, |dir| {
        let mut npm = std::process::Command::new("npm");
        npm.args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
            .arg(dir)
            .args(NODE_PACKAGES);
        npm
    })?;
    Ok(dir.join("node_modules"))
}

/// `node tests/node/SCRIPT ARGS...` with node-postgres on `NODE_PATH`.
pub async fn node(script: &str, args: &[String]) -> tokio::process::Command {
    let modules = node_deps().await;
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/node")
        .join(script);
    let mut cmd = tokio::process::Command::new("node");
    scrub_pg_env(&mut cmd);
    cmd.arg(path).args(args).env("NODE_PATH", modules);
    cmd
}

/// `php tests/php/SCRIPT ARGS...` (packages `php-cli` and `php-pgsql`, which `.ci/run`
/// installs).
pub fn php(script: &str, args: &[String]) -> tokio::process::Command {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/php")
        .join(script);
    let mut cmd = tokio::process::Command::new("php");
    scrub_pg_env(&mut cmd);
    cmd.arg(path).args(args);
    cmd
}

// ---------------------------------------------------------------------------------------------
// A raw protocol client whose answers are recorded as text.

/// Frontend messages, encoded by hand so the tests do not depend on pgmemo's own codec.
pub mod msg {
    /// A message of type `tag` with `body` as it is (also one that is not what `tag` says).
    pub fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    fn cstr(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    }

    pub fn query(sql: &str) -> Vec<u8> {
        let mut b = Vec::new();
        cstr(&mut b, sql);
        frame(b'Q', &b)
    }

    /// Parse with parameter type OIDs (empty: the server infers them).
    pub fn parse(name: &str, sql: &str, types: &[u32]) -> Vec<u8> {
        let mut b = Vec::new();
        cstr(&mut b, name);
        cstr(&mut b, sql);
        b.extend_from_slice(&(types.len() as u16).to_be_bytes());
        for t in types {
            b.extend_from_slice(&t.to_be_bytes());
        }
        frame(b'P', &b)
    }

    /// Bind with text parameters (`None` is NULL) and text results.
    pub fn bind(portal: &str, statement: &str, params: &[Option<&str>]) -> Vec<u8> {
        let mut b = Vec::new();
        cstr(&mut b, portal);
        cstr(&mut b, statement);
        b.extend_from_slice(&0u16.to_be_bytes());
        b.extend_from_slice(&(params.len() as u16).to_be_bytes());
        for p in params {
            match p {
                None => b.extend_from_slice(&(-1i32).to_be_bytes()),
                Some(v) => {
                    b.extend_from_slice(&(v.len() as i32).to_be_bytes());
                    b.extend_from_slice(v.as_bytes());
                }
            }
        }
        b.extend_from_slice(&0u16.to_be_bytes());
        frame(b'B', &b)
    }

    /// Describe a statement (`b'S'`) or portal (`b'P'`).
    pub fn describe(kind: u8, name: &str) -> Vec<u8> {
        let mut b = vec![kind];
        cstr(&mut b, name);
        frame(b'D', &b)
    }

    /// Close a statement (`b'S'`) or portal (`b'P'`).
    pub fn close(kind: u8, name: &str) -> Vec<u8> {
        let mut b = vec![kind];
        cstr(&mut b, name);
        frame(b'C', &b)
    }

    /// Execute a portal; `max_rows` 0 means all.
    pub fn execute(portal: &str, max_rows: u32) -> Vec<u8> {
        let mut b = Vec::new();
        cstr(&mut b, portal);
        b.extend_from_slice(&max_rows.to_be_bytes());
        frame(b'E', &b)
    }

    pub fn sync() -> Vec<u8> {
        frame(b'S', &[])
    }

    /// FunctionCall of the function `oid` with text arguments and a text result.
    pub fn function_call(oid: u32, args: &[&str]) -> Vec<u8> {
        let mut b = oid.to_be_bytes().to_vec();
        b.extend_from_slice(&0u16.to_be_bytes());
        b.extend_from_slice(&(args.len() as u16).to_be_bytes());
        for a in args {
            b.extend_from_slice(&(a.len() as i32).to_be_bytes());
            b.extend_from_slice(a.as_bytes());
        }
        b.extend_from_slice(&0u16.to_be_bytes());
        frame(b'F', &b)
    }

    pub fn copy_data(data: &[u8]) -> Vec<u8> {
        frame(b'd', data)
    }

    pub fn flush() -> Vec<u8> {
        frame(b'H', &[])
    }
}

/// A client speaking protocol 3.0 over a plain socket (trust login only).
pub struct Raw {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Said when an answer does not come (which step of which script).
    pub context: String,
    /// The BackendKeyData of the login: process id and secret key, as sent.
    key: [u8; 8],
    port: u16,
}

impl Raw {
    /// Logs in to 127.0.0.1:`port` as `postgres` to `test`.
    pub async fn login(port: u16) -> Raw {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap_or_else(|e| panic!("connect to port {port}: {e}"));
        stream.set_nodelay(true).unwrap();
        let mut raw = Raw {
            stream,
            buf: Vec::new(),
            context: format!("login to port {port}"),
            key: [0; 8],
            port,
        };
        let mut body = 196_608u32.to_be_bytes().to_vec();
        for s in ["user", USER, "database", DB, ""] {
            body.extend_from_slice(s.as_bytes());
            body.push(0);
        }
        let mut startup = (body.len() as u32 + 4).to_be_bytes().to_vec();
        startup.extend_from_slice(&body);
        raw.send(&[startup]).await;
        loop {
            let (tag, body) = raw.recv().await;
            match tag {
                b'R' => assert_eq!(body[..4], [0, 0, 0, 0], "only trust logins are supported"),
                b'E' => panic!("login failed: {}", describe(tag, &body)),
                b'K' => raw.key.copy_from_slice(&body[..8]),
                b'Z' => return raw,
                _ => {}
            }
        }
    }

    /// Sends a CancelRequest with this session's key, over a connection of its own.
    pub async fn cancel(&self) {
        let mut request = 16u32.to_be_bytes().to_vec();
        request.extend_from_slice(&80_877_102u32.to_be_bytes());
        request.extend_from_slice(&self.key);
        let mut c = TcpStream::connect(("127.0.0.1", self.port)).await.unwrap();
        c.write_all(&request).await.unwrap();
        // The proxy closes the connection once it has taken the request.
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest).await;
    }

    pub async fn send(&mut self, messages: &[Vec<u8>]) {
        self.stream
            .write_all(&messages.concat())
            .await
            .expect("write");
    }

    /// The next backend message (tag, body).
    pub async fn recv(&mut self) -> (u8, Vec<u8>) {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
                if self.buf.len() > len {
                    let body = self.buf[5..1 + len].to_vec();
                    let tag = self.buf[0];
                    self.buf.drain(..1 + len);
                    return (tag, body);
                }
            }
            let mut chunk = [0u8; 8192];
            let n = tokio::time::timeout(SOON, self.stream.read(&mut chunk))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{}: no answer within {SOON:?} (does another client hold the server?)",
                        self.context
                    )
                })
                .unwrap_or_else(|e| panic!("{}: read: {e}", self.context));
            assert!(n > 0, "{}: the connection closed", self.context);
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Reads messages up to and including the first of type `tag`, one line each (see
    /// [`describe`]), ParameterStatus, notices and notifications left out.
    pub async fn until(&mut self, tag: u8) -> Vec<String> {
        let mut lines = Vec::new();
        loop {
            let (t, body) = self.recv().await;
            if !matches!(t, b'S' | b'N' | b'A') {
                lines.push(describe(t, &body));
            }
            if t == tag {
                return lines;
            }
        }
    }

    /// Every message up to the end of the connection, one line each (see [`describe`]);
    /// ParameterStatus, notices and notifications are left out.
    pub async fn until_closed(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        loop {
            while self.buf.len() >= 5 {
                let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
                if self.buf.len() <= len {
                    break;
                }
                let (tag, body) = (self.buf[0], self.buf[5..1 + len].to_vec());
                self.buf.drain(..1 + len);
                if !matches!(tag, b'S' | b'N' | b'A') {
                    lines.push(describe(tag, &body));
                }
            }
            let mut chunk = [0u8; 8192];
            let n = tokio::time::timeout(SOON, self.stream.read(&mut chunk))
                .await
                .unwrap_or_else(|_| panic!("{}: not closed within {SOON:?}", self.context))
                .unwrap_or(0);
            if n == 0 {
                return lines;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Sends `messages` in one write and returns every answer up to the ReadyForQuery of the
    /// last Sync, Query or FunctionCall among them, one line each (see [`describe`]); ParameterStatus,
    /// notices and notifications are left out.
    pub async fn exchange(&mut self, messages: &[Vec<u8>]) -> Vec<String> {
        let mut pending = messages
            .iter()
            .filter(|m| matches!(m.first(), Some(b'S' | b'Q' | b'F')))
            .count();
        assert!(
            pending > 0,
            "nothing in {messages:?} asks for ReadyForQuery"
        );
        self.send(messages).await;
        let mut lines = Vec::new();
        while pending > 0 {
            let (tag, body) = self.recv().await;
            if matches!(tag, b'S' | b'N' | b'A') {
                continue;
            }
            lines.push(describe(tag, &body));
            if tag == b'Z' {
                pending -= 1;
            }
        }
        lines
    }
}

fn cstrings(body: &[u8]) -> Vec<String> {
    body.split(|&b| b == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// One backend message as a line of text: values and types, never PIDs or positions.
pub fn describe(tag: u8, body: &[u8]) -> String {
    let i16_at = |at: usize| i16::from_be_bytes([body[at], body[at + 1]]);
    let i32_at = |at: usize| i32::from_be_bytes(body[at..at + 4].try_into().unwrap());
    match tag {
        b'1' => "ParseComplete".into(),
        b'2' => "BindComplete".into(),
        b'3' => "CloseComplete".into(),
        b'n' => "NoData".into(),
        b's' => "PortalSuspended".into(),
        b'I' => "EmptyQueryResponse".into(),
        b'Z' => format!("ReadyForQuery {}", body[0] as char),
        b'C' => format!("CommandComplete {}", cstrings(body)[0]),
        b'E' => {
            let field = |key: u8| {
                body.split(|&b| b == 0)
                    .find(|f| f.first() == Some(&key))
                    .map(|f| String::from_utf8_lossy(&f[1..]).into_owned())
                    .unwrap_or_default()
            };
            format!("Error {} {}: {}", field(b'V'), field(b'C'), field(b'M'))
        }
        b't' => {
            let n = i16_at(0) as usize;
            let oids: Vec<u32> = (0..n)
                .map(|i| u32::from_be_bytes(body[2 + 4 * i..6 + 4 * i].try_into().unwrap()))
                .collect();
            format!("ParameterDescription {oids:?}")
        }
        b'T' => {
            let n = i16_at(0) as usize;
            let mut at = 2;
            let mut cols = Vec::new();
            for _ in 0..n {
                let end = at + body[at..].iter().position(|&b| b == 0).unwrap();
                let name = String::from_utf8_lossy(&body[at..end]).into_owned();
                let oid = u32::from_be_bytes(body[end + 7..end + 11].try_into().unwrap());
                cols.push(format!("{name}:{oid}"));
                at = end + 19;
            }
            format!("RowDescription [{}]", cols.join(", "))
        }
        b'D' => {
            let n = i16_at(0) as usize;
            let mut at = 2;
            let mut values = Vec::new();
            for _ in 0..n {
                let len = i32_at(at);
                at += 4;
                if len < 0 {
                    values.push("NULL".to_owned());
                } else {
                    let len = len as usize;
                    values.push(String::from_utf8_lossy(&body[at..at + len]).into_owned());
                    at += len;
                }
            }
            format!("DataRow [{}]", values.join(", "))
        }
        b'V' => match i32_at(0) {
            len if len < 0 => "FunctionCallResponse NULL".to_owned(),
            len => format!(
                "FunctionCallResponse {}",
                String::from_utf8_lossy(&body[4..4 + len as usize])
            ),
        },
        other => format!("Message {:?}", other as char),
    }
}

/// Who speaks in a [`run_script`] step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    A,
    B,
}

/// Logs in two raw clients A and B to 127.0.0.1:`port` and runs `steps` in order, each an
/// exchange of one client; returns the transcript ("A| ..." / "B| ..." lines, with each step's
/// number), to compare a run through pgmemo with the same run directly against PostgreSQL.
pub async fn run_script(port: u16, steps: &[(Who, Vec<Vec<u8>>)]) -> Vec<String> {
    let mut a = Raw::login(port).await;
    let mut b = Raw::login(port).await;
    let mut transcript = Vec::new();
    for (n, (who, messages)) in steps.iter().enumerate() {
        let client = match who {
            Who::A => &mut a,
            Who::B => &mut b,
        };
        client.context = format!("port {port}, step {n} ({who:?})");
        for line in client.exchange(messages).await {
            transcript.push(format!("{n:>2} {who:?}| {line}"));
        }
    }
    transcript
}

/// A readable difference of two transcripts for assertion messages.
pub fn side_by_side(direct: &[String], proxied: &[String]) -> String {
    let mut out = String::from("direct  ||  through pgmemo\n");
    for i in 0..direct.len().max(proxied.len()) {
        let d = direct.get(i).map(String::as_str).unwrap_or("-");
        let p = proxied.get(i).map(String::as_str).unwrap_or("-");
        let mark = if d == p { "   " } else { "!!!" };
        out.push_str(&format!("{mark} {d}  ||  {p}\n"));
    }
    out
}

//! Unix-domain sockets on both sides of pgmemo.
//!
//! - Upstream: a host that is a directory (`postgres://%2Fdir:PORT`, or `?host=/dir`) is where
//!   PostgreSQL's socket `.s.PGSQL.PORT` is, as libpq reads it. PostgreSQL reports no server
//!   address for a session over its socket, which is how these tests know which way pgmemo
//!   went.
//! - Clients: with `unix_socket_dir`, pgmemo also listens on `DIR/.s.PGSQL.<listen port>`.

use std::path::Path;
use std::time::{Duration, Instant};

use pgmemo::config::{PoolMode, UpstreamUrl};
use pgmemo::Config;
use testkit::{pgmemo_config_for, spawn_pgmemo, LocalPostgres, TempPostgres};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::{Client, NoTls};

/// Upper bound for a login or a cancel to take effect: longer is a hang, not a slow machine.
const PATIENCE: Duration = Duration::from_secs(30);

/// An upstream URL naming the socket directory of `pg`, in libpq's percent-encoded form.
fn socket_url(pg: &TempPostgres) -> UpstreamUrl {
    let dir = pg.socket_dir().to_str().expect("UTF-8 temp dir");
    let encoded = dir.replace('/', "%2F");
    UpstreamUrl::parse(&format!("postgres://{encoded}:{}", pg.port())).expect("socket URL")
}

async fn connect(config: &tokio_postgres::Config) -> Client {
    let (client, connection) = tokio::time::timeout(PATIENCE, config.connect(NoTls))
        .await
        .unwrap_or_else(|_| panic!("login hung: {config:?}"))
        .unwrap_or_else(|e| panic!("login failed: {e}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A client of pgmemo's own Unix-domain socket in `dir`.
async fn connect_over_socket(dir: &Path, port: u16, user: &str, db: &str) -> Client {
    let mut config = tokio_postgres::Config::new();
    config.host_path(dir).port(port).user(user).dbname(db);
    connect(&config).await
}

/// What PostgreSQL says the session's server address is: NULL over its Unix-domain socket.
async fn server_addr(client: &Client) -> Option<String> {
    client
        .query_one("SELECT host(inet_server_addr())", &[])
        .await
        .expect("inet_server_addr")
        .get(0)
}

/// In both pool modes, pgmemo reaches PostgreSQL through its socket directory: queries,
/// transactions and a forwarded cancel (which opens its own connection to the server) work,
/// and the server sees no TCP address. `sslmode=require` is not tried over the socket (as
/// libpq: the cluster has no TLS at all, and pgmemo still gets in).
#[tokio::test]
async fn upstream_over_postgres_unix_socket() {
    let pg = TempPostgres::start().await.expect("cluster");
    for (mode, upstream) in [
        (PoolMode::Session, socket_url(&pg)),
        (PoolMode::Transaction, socket_url(&pg)),
        (
            PoolMode::Session,
            UpstreamUrl::parse(&format!(
                "postgres://?host={}&port={}&sslmode=require",
                pg.socket_dir().display(),
                pg.port()
            ))
            .expect("URL with host="),
        ),
    ] {
        let pgmemo = spawn_pgmemo(Config {
            upstream,
            pool_mode: mode,
            pool_size: 2,
            ..pgmemo_config_for(pg.port())
        })
        .await
        .expect("pgmemo");
        let client = pgmemo.client("postgres", "postgres").await;
        assert_eq!(
            server_addr(&client).await,
            None,
            "{mode:?}: not over the socket"
        );
        let direct = pg.client("postgres", "postgres").await;
        assert_eq!(
            server_addr(&direct).await.as_deref(),
            Some("127.0.0.1"),
            "the check itself tells TCP from the socket"
        );

        client
            .batch_execute("CREATE TABLE IF NOT EXISTS t (v int)")
            .await
            .expect("DDL over the socket");
        client
            .batch_execute("BEGIN; INSERT INTO t VALUES (1); ROLLBACK")
            .await
            .expect("a transaction over the socket");
        let n: i64 = client
            .query_one("SELECT count(*) FROM t", &[])
            .await
            .expect("count")
            .get(0);
        assert_eq!(n, 0, "{mode:?}: the rollback took");

        let cancel = client.cancel_token();
        let started = Instant::now();
        let sleeper = tokio::spawn(async move { client.simple_query("SELECT pg_sleep(10)").await });
        // Cancel once the sleep is running on the server.
        testkit::assert_eventually(PATIENCE, "the sleep to start", || async {
            let row = direct
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(10)' \
                     AND state = 'active'",
                    &[],
                )
                .await
                .expect("pg_stat_activity");
            row.get::<_, i64>(0) == 1
        })
        .await;
        cancel
            .cancel_query(NoTls)
            .await
            .expect("cancel through pgmemo");
        let result = tokio::time::timeout(PATIENCE, sleeper)
            .await
            .expect("the cancelled query hung")
            .expect("task");
        let err = result.expect_err("the sleep must be cancelled");
        assert_eq!(
            err.code(),
            Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
            "{err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(9),
            "{mode:?}: cancel too late"
        );
    }
}

/// With `unix_socket_dir`, clients reach pgmemo through `DIR/.s.PGSQL.<port>` (mode 0777, as
/// PostgreSQL's), as `[local]` in `SHOW CLIENTS`; an SSLRequest there gets 'N' (tests/tls.rs
/// checks that with TLS configured for TCP clients); shutdown removes the socket file.
#[tokio::test]
async fn clients_over_pgmemos_unix_socket() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let pgmemo = spawn_pgmemo(Config {
        unix_socket_dir: Some(dir.path().to_str().expect("UTF-8").to_owned()),
        ..pgmemo_config_for(LocalPostgres::PORT)
    })
    .await
    .expect("pgmemo");
    let path = dir.path().join(format!(".s.PGSQL.{}", pgmemo.port()));
    assert_eq!(pgmemo.handle().unix_socket_path(), Some(path.as_path()));
    let mode = std::fs::metadata(&path)
        .expect("socket file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o777, "socket mode {mode:o}");

    let client = connect_over_socket(dir.path(), pgmemo.port(), "postgres", "test").await;
    let row = client.query_one("SELECT 41 + 1", &[]).await.expect("query");
    assert_eq!(row.get::<_, i32>(0), 42);
    let admin = connect_over_socket(dir.path(), pgmemo.port(), "postgres", "pgmemo").await;
    let clients = admin
        .simple_query("SHOW CLIENTS")
        .await
        .expect("SHOW CLIENTS");
    let peers: Vec<String> = clients
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                let i = r.columns().iter().position(|c| c.name() == "address")?;
                r.get(i).map(str::to_owned)
            }
            _ => None,
        })
        .collect();
    assert!(
        peers.iter().any(|p| p == "[local]"),
        "SHOW CLIENTS address: {peers:?}"
    );

    let mut raw = tokio::net::UnixStream::connect(&path)
        .await
        .expect("raw connect");
    raw.write_all(&wire::startup::encode_ssl_request())
        .await
        .expect("SSLRequest");
    let mut answer = [0u8; 1];
    raw.read_exact(&mut answer).await.expect("answer");
    assert_eq!(&answer, b"N");

    drop((client, admin, raw));
    pgmemo.shutdown().await;
    assert!(!path.exists(), "the socket file outlived shutdown");
}

/// A configuration listening on TCP `port` of 127.0.0.1 and, in `dir`, on `.s.PGSQL.<port>`.
fn socket_config(dir: &Path, port: u16) -> Config {
    Config {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        unix_socket_dir: Some(dir.to_str().expect("UTF-8").to_owned()),
        ..pgmemo_config_for(LocalPostgres::PORT)
    }
}

/// Starts pgmemo on `config`, trying again while its TCP port is briefly taken: a port from
/// [`testkit::free_port`] was probed with a listener of this process, and a child that another
/// test forks at that moment holds a copy of it until it execs (see testkit's `ports`).
async fn start_on_free_port(config: &Config) -> Result<pgmemo::PgmemoHandle, pgmemo::StartError> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match pgmemo::Pgmemo::start(config.clone()).await {
            Err(pgmemo::StartError::Listen { source, .. })
                if source.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            result => return result,
        }
    }
}

/// Leaves at `path` what a server that crashed leaves: the file of a stream socket that
/// nothing listens on. The socket never listens, so no copy of its descriptor (in a child
/// that another test forks meanwhile) can make it look alive.
fn leave_stale_socket_file(path: &Path) {
    use std::os::unix::ffi::OsStrExt as _;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: `addr` is a zeroed sockaddr_un whose path is copied in with room for its NUL;
    // the descriptor is closed before returning.
    unsafe {
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        assert!(bytes.len() < addr.sun_path.len(), "socket path too long");
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (to, from) in addr.sun_path.iter_mut().zip(bytes) {
            *to = *from as libc::c_char;
        }
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let bound = libc::bind(
            fd,
            std::ptr::addr_of!(addr).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        );
        let bind_error = std::io::Error::last_os_error();
        libc::close(fd);
        assert_eq!(bound, 0, "bind {}: {bind_error}", path.display());
    }
}

/// A socket file left by a process that is gone is replaced; a live one is not taken over
/// (pgmemo refuses to start, naming the path).
#[tokio::test]
async fn stale_socket_file_is_replaced_and_a_live_one_refused() {
    let dir = tempfile::tempdir().expect("temp dir");

    let port = testkit::free_port();
    let stale = dir.path().join(format!(".s.PGSQL.{port}"));
    leave_stale_socket_file(&stale);
    let pgmemo = start_on_free_port(&socket_config(dir.path(), port))
        .await
        .expect("start over a stale socket file");
    let client = connect_over_socket(dir.path(), port, "postgres", "test").await;
    client.simple_query("SELECT 1").await.expect("query");
    drop(client);
    pgmemo.shutdown().await;

    let port = testkit::free_port();
    let live_path = dir.path().join(format!(".s.PGSQL.{port}"));
    let live = std::os::unix::net::UnixListener::bind(&live_path).expect("a live socket");
    let err = match start_on_free_port(&socket_config(dir.path(), port)).await {
        Ok(_) => panic!("pgmemo took over a socket another server listens on"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(&live_path.display().to_string()), "{err}");
    assert!(err.contains("another server"), "{err}");
    assert!(
        live_path.exists(),
        "the live server's socket file was removed"
    );
    drop(live);
}

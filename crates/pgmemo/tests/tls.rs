//! TLS on both sides of pgmemo.
//!
//! - Client side: pgmemo offers (or requires) TLS with `tls_cert_file`/`tls_key_file`;
//!   tokio-postgres with rustls connects with `sslmode=require`.
//! - Upstream side: pgmemo speaks TLS to a PostgreSQL that only accepts `hostssl`, as the
//!   upstream URL's `sslmode` (and `sslrootcert`) ask.
//!
//! Certificates are generated per test with rcgen: a CA and a leaf signed by it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pgmemo::config::{AuthType, ClientTlsMode, UpstreamUrl};
use pgmemo::Config;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::CertificateDer;
use tempfile::TempDir;
use testkit::{
    assert_eventually, pgmemo_config_for, spawn_pgmemo, LocalPostgres, PgmemoInstance,
    TempPostgres, TempPostgresBuilder,
};
use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, NoTls, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

/// Upper bound for one login: a login that takes longer is a hang, not a slow machine.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// Certificates
// ---------------------------------------------------------------------------------------------

/// A CA and a server certificate signed by it, as PEM files in their own temp directory.
struct Pki {
    /// Keeps the files alive.
    _dir: TempDir,
    ca_file: PathBuf,
    cert_file: PathBuf,
    key_file: PathBuf,
    ca_der: CertificateDer<'static>,
}

/// Generates a CA and a server certificate for `names` (DNS names or IP addresses: rcgen turns
/// "127.0.0.1" into an IP SAN). When we are root, the directory and files are handed to the
/// `postgres` OS user with the key at mode 0600, so a TempPostgres can use them too.
fn make_pki(names: &[&str]) -> Pki {
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "pgmemo test CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).expect("self-signed CA");

    let key = KeyPair::generate().expect("server key");
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names.clone()).expect("server cert params");
    params
        .distinguished_name
        .push(DnType::CommonName, names[0].clone());
    let cert = params
        .signed_by(&key, &ca_cert, &ca_key)
        .expect("signing the server certificate");

    let dir = tempfile::tempdir().expect("temp dir for certificates");
    let ca_file = dir.path().join("ca.pem");
    let cert_file = dir.path().join("server.crt");
    let key_file = dir.path().join("server.key");
    std::fs::write(&ca_file, ca_cert.pem()).unwrap();
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    give_to_postgres(dir.path(), &[&ca_file, &cert_file, &key_file]);
    set_mode(&key_file, 0o600);
    Pki {
        _dir: dir,
        ca_file,
        cert_file,
        key_file,
        ca_der: ca_cert.der().clone(),
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// chown to the `postgres` OS user when running as root (PostgreSQL then runs as that user and
/// insists that it owns its key file); a no-op otherwise.
fn give_to_postgres(dir: &Path, files: &[&Path]) {
    for path in std::iter::once(dir).chain(files.iter().copied()) {
        testkit::chown_to_postgres(path).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------------------------

fn ring() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls connector for tokio-postgres that trusts only `ca`.
fn tls_trusting(ca: &CertificateDer<'static>) -> MakeRustlsConnect {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).expect("adding the test CA");
    let config = rustls::ClientConfig::builder_with_provider(ring())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    MakeRustlsConnect::new(config)
}

fn client_config(
    port: u16,
    user: &str,
    password: Option<&str>,
    mode: SslMode,
) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user(user)
        .dbname("postgres")
        .ssl_mode(mode);
    if let Some(pw) = password {
        config.password(pw);
    }
    config
}

/// Logs in with `tls` and `config`; panics if the login hangs.
async fn connect_with<T>(
    config: &tokio_postgres::Config,
    tls: T,
) -> Result<Client, tokio_postgres::Error>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let (client, connection) = tokio::time::timeout(LOGIN_TIMEOUT, config.connect(tls))
        .await
        .unwrap_or_else(|_| panic!("login hung for {LOGIN_TIMEOUT:?}: {config:?}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// A plain-TCP login (NoTls: no SSLRequest is sent).
async fn connect_plain(port: u16, user: &str) -> Result<Client, tokio_postgres::Error> {
    connect_with(&client_config(port, user, None, SslMode::Disable), NoTls).await
}

/// A TLS login trusting `ca`, with `sslmode`.
async fn connect_tls(
    port: u16,
    user: &str,
    password: Option<&str>,
    ca: &CertificateDer<'static>,
    mode: SslMode,
) -> Result<Client, tokio_postgres::Error> {
    connect_with(&client_config(port, user, password, mode), tls_trusting(ca)).await
}

/// A TLS login as `postgres` without a password (the local server trusts it), trusting `ca`.
async fn connect_tls_as_postgres(
    port: u16,
    ca: &CertificateDer<'static>,
    mode: SslMode,
) -> Result<Client, tokio_postgres::Error> {
    connect_tls(port, "postgres", None, ca, mode).await
}

fn db_error(e: &tokio_postgres::Error) -> (SqlState, String) {
    match e.as_db_error() {
        Some(db) => (db.code().clone(), db.message().to_owned()),
        None => panic!("expected an ErrorResponse, got {e:?}"),
    }
}

/// Asserts that pgmemo could not log in to the server because TLS towards it failed (an
/// ErrorResponse 08006 that says so).
fn assert_upstream_tls_failure(err: &tokio_postgres::Error) {
    let (code, msg) = db_error(err);
    assert_eq!(code, SqlState::CONNECTION_FAILURE, "{msg}");
    assert!(msg.contains("TLS"), "{msg}");
}

async fn assert_select_one(client: &Client) {
    let row = client.query_one("SELECT 1", &[]).await.expect("SELECT 1");
    assert_eq!(row.get::<_, i32>(0), 1);
}

/// Whether the server session behind `client` uses TLS, as PostgreSQL sees it.
async fn server_side_ssl(client: &Client) -> bool {
    client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_ssl")
        .get(0)
}

async fn start_pgmemo(config: Config) -> PgmemoInstance {
    spawn_pgmemo(config).await.expect("starting pgmemo")
}

/// A configuration for pgmemo in front of the shared local server, with the certificate of
/// `pki` for clients and `client_tls_sslmode = mode`.
fn client_tls_config(pki: &Pki, mode: ClientTlsMode) -> Config {
    Config {
        tls_cert_file: Some(pki.cert_file.clone()),
        tls_key_file: Some(pki.key_file.clone()),
        client_tls_sslmode: mode,
        ..pgmemo_config_for(LocalPostgres::PORT)
    }
}

/// pgmemo started with [`client_tls_config`].
async fn pgmemo_with_client_tls(pki: &Pki, mode: ClientTlsMode) -> PgmemoInstance {
    start_pgmemo(client_tls_config(pki, mode)).await
}

// ---------------------------------------------------------------------------------------------
// Client side
// ---------------------------------------------------------------------------------------------

/// With `client_tls_sslmode = require`, a TLS client gets in and a plain-text client is
/// refused with 28000: the sessions that work really are encrypted.
#[tokio::test]
async fn client_tls_required() {
    let pki = make_pki(&["localhost", "127.0.0.1"]);
    let pgmemo = pgmemo_with_client_tls(&pki, ClientTlsMode::Require).await;

    let client = connect_tls_as_postgres(pgmemo.port(), &pki.ca_der, SslMode::Require)
        .await
        .expect("TLS login through pgmemo");
    assert_select_one(&client).await;
    // `prefer` upgrades too (it has to: plain text would be refused).
    let client = connect_tls_as_postgres(pgmemo.port(), &pki.ca_der, SslMode::Prefer)
        .await
        .expect("sslmode=prefer login through pgmemo");
    assert_select_one(&client).await;

    let err = connect_plain(pgmemo.port(), "postgres")
        .await
        .expect_err("plain-text login must be refused");
    let (code, msg) = db_error(&err);
    assert_eq!(code, SqlState::INVALID_AUTHORIZATION_SPECIFICATION, "{msg}");
    assert!(msg.contains("requires TLS"), "{msg}");
}

/// A Unix-domain socket never leaves the machine: with `client_tls_sslmode = require`, its
/// clients get in without TLS (an SSLRequest there is answered 'N', as PostgreSQL answers on
/// its socket), while plain TCP clients are still refused.
#[tokio::test]
async fn client_tls_required_leaves_the_unix_socket_alone() {
    let pki = make_pki(&["localhost", "127.0.0.1"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let pgmemo = start_pgmemo(Config {
        unix_socket_dir: Some(dir.path().to_str().expect("UTF-8").to_owned()),
        ..client_tls_config(&pki, ClientTlsMode::Require)
    })
    .await;
    let path = dir.path().join(format!(".s.PGSQL.{}", pgmemo.port()));
    let mut raw = tokio::net::UnixStream::connect(&path)
        .await
        .expect("raw connect");
    tokio::io::AsyncWriteExt::write_all(&mut raw, &wire::startup::encode_ssl_request())
        .await
        .expect("SSLRequest");
    let mut answer = [0u8; 1];
    tokio::io::AsyncReadExt::read_exact(&mut raw, &mut answer)
        .await
        .expect("answer");
    assert_eq!(&answer, b"N", "TLS offered over the Unix-domain socket");
    let mut config = tokio_postgres::Config::new();
    config
        .host_path(dir.path())
        .port(pgmemo.port())
        .user("postgres")
        .dbname("test");
    let client = connect_with(&config, NoTls)
        .await
        .expect("a socket client gets in without TLS");
    assert_select_one(&client).await;
    let err = connect_plain(pgmemo.port(), "postgres")
        .await
        .expect_err("plain TCP is still refused");
    assert_eq!(
        db_error(&err).0,
        SqlState::INVALID_AUTHORIZATION_SPECIFICATION
    );
}

/// With `prefer` (the default) and a certificate, both kinds of clients get in.
#[tokio::test]
async fn client_tls_preferred() {
    let pki = make_pki(&["localhost", "127.0.0.1"]);
    let pgmemo = pgmemo_with_client_tls(&pki, ClientTlsMode::Prefer).await;
    let client = connect_tls_as_postgres(pgmemo.port(), &pki.ca_der, SslMode::Require)
        .await
        .expect("TLS login through pgmemo");
    assert_select_one(&client).await;
    let client = connect_plain(pgmemo.port(), "postgres")
        .await
        .expect("plain-text login through pgmemo");
    assert_select_one(&client).await;
}

/// pgmemo notices that a TLS client queued for a pool place has gone, as it does for a plain
/// one: the client leaves the queue and frees its `max_client_conn` slot at once, not after
/// `query_wait_timeout`.
#[tokio::test]
async fn a_tls_client_that_leaves_while_queued_leaves_the_queue() {
    let pki = make_pki(&["localhost", "127.0.0.1"]);
    let pgmemo = start_pgmemo(Config {
        pool_size: 1,
        query_wait_timeout: pgmemo::config::Seconds(Duration::from_secs(30)),
        ..client_tls_config(&pki, ClientTlsMode::Require)
    })
    .await;
    let holder = connect_tls_as_postgres(pgmemo.port(), &pki.ca_der, SslMode::Require)
        .await
        .expect("TLS login through pgmemo");
    assert_select_one(&holder).await;
    let shared = pgmemo.handle().shared().clone();
    let pool = shared.pools.all()[0].clone();
    let (port, ca) = (pgmemo.port(), pki.ca_der.clone());
    let queued =
        tokio::spawn(async move { connect_tls_as_postgres(port, &ca, SslMode::Require).await });
    assert_eventually(LOGIN_TIMEOUT, "the TLS client is queued", || async {
        pool.waiting() == 1
    })
    .await;
    // Its socket closes with the task.
    queued.abort();
    let _ = queued.await;
    assert_eventually(
        Duration::from_secs(2),
        "the TLS client leaves the queue and its slot",
        || async { pool.waiting() == 0 && shared.client_count() == 1 },
    )
    .await;
    assert_select_one(&holder).await;
}

/// pgmemo presents the configured certificate: a client that trusts another CA fails the
/// handshake (without an ErrorResponse, and without hanging).
#[tokio::test]
async fn client_tls_presents_the_configured_certificate() {
    let pki = make_pki(&["localhost", "127.0.0.1"]);
    let other = make_pki(&["localhost", "127.0.0.1"]);
    let pgmemo = pgmemo_with_client_tls(&pki, ClientTlsMode::Prefer).await;
    let err = connect_tls_as_postgres(pgmemo.port(), &other.ca_der, SslMode::Require)
        .await
        .expect_err("a client trusting another CA must not connect");
    assert!(err.as_db_error().is_none(), "{err:?}");
    assert!(format!("{err:?}").contains("InvalidCertificate"), "{err:?}");
}

/// Without a certificate (or with `disable`), `sslmode=require` fails and `prefer` falls back
/// to plain text.
#[tokio::test]
async fn client_tls_not_configured() {
    let pki = make_pki(&["localhost", "127.0.0.1"]);
    let unconfigured = start_pgmemo(pgmemo_config_for(LocalPostgres::PORT)).await;
    let disabled = pgmemo_with_client_tls(&pki, ClientTlsMode::Disable).await;
    for pgmemo in [&unconfigured, &disabled] {
        let err = connect_tls_as_postgres(pgmemo.port(), &pki.ca_der, SslMode::Require)
            .await
            .expect_err("sslmode=require without TLS on pgmemo must fail");
        assert!(err.as_db_error().is_none(), "{err:?}");
        assert!(
            format!("{err}").contains("TLS"),
            "unexpected error for sslmode=require: {err}"
        );
        let client = connect_tls_as_postgres(pgmemo.port(), &pki.ca_der, SslMode::Prefer)
            .await
            .expect("sslmode=prefer falls back to plain text");
        assert_select_one(&client).await;
    }
}

/// SCRAM with pgmemo's userlist over TLS: tokio-postgres announces that it could do channel
/// binding (GS2 flag `y`) since pgmemo offers only plain SCRAM-SHA-256; pgmemo must accept it.
#[tokio::test]
async fn client_tls_with_local_scram() {
    let pki = make_pki(&["localhost", "127.0.0.1"]);
    let dir = tempfile::tempdir().unwrap();
    let userlist = dir.path().join("userlist.txt");
    std::fs::write(&userlist, "\"postgres\" \"tls-scram-pw\"\n").unwrap();
    let pgmemo = start_pgmemo(Config {
        auth_type: AuthType::ScramSha256,
        auth_file: Some(userlist),
        ..client_tls_config(&pki, ClientTlsMode::Require)
    })
    .await;
    let client = connect_tls(
        pgmemo.port(),
        "postgres",
        Some("tls-scram-pw"),
        &pki.ca_der,
        SslMode::Require,
    )
    .await
    .expect("SCRAM over TLS through pgmemo");
    assert_select_one(&client).await;
    let err = connect_tls(
        pgmemo.port(),
        "postgres",
        Some("wrong-password"),
        &pki.ca_der,
        SslMode::Require,
    )
    .await
    .expect_err("wrong password over TLS");
    assert_eq!(
        db_error(&err),
        (
            SqlState::INVALID_PASSWORD,
            "password authentication failed for user \"postgres\"".to_owned()
        )
    );
    // libpq over TLS announces channel binding support (GS2 flag `y`): pgmemo accepts it.
    assert_eq!(
        psql_via(
            &pgmemo,
            "postgres",
            "tls-scram-pw",
            "channel_binding=prefer"
        )
        .await,
        Ok("1".to_owned())
    );
    // A client that insists on channel binding cannot have it from pgmemo.
    let err = psql_via(
        &pgmemo,
        "postgres",
        "tls-scram-pw",
        "channel_binding=require",
    )
    .await
    .expect_err("channel_binding=require");
    assert!(err.contains("channel binding"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Upstream side
// ---------------------------------------------------------------------------------------------

/// A cluster with TLS on, serving the certificate of `pki`, that admits only the pg_hba.conf
/// rules the caller adds.
fn ssl_cluster(pki: &Pki) -> TempPostgresBuilder {
    TempPostgres::builder()
        .conf("ssl = on")
        .conf(format!("ssl_cert_file = '{}'", pki.cert_file.display()))
        .conf(format!("ssl_key_file = '{}'", pki.key_file.display()))
        .no_default_trust()
}

/// A cluster with TLS on that accepts TCP logins only over TLS (`hostssl ... trust`).
async fn ssl_only_cluster(pki: &Pki) -> TempPostgres {
    ssl_cluster(pki)
        .hba("hostssl all all 127.0.0.1/32 trust")
        .start()
        .await
        .expect("starting PostgreSQL with ssl = on")
}

async fn pgmemo_upstream(url: &str) -> PgmemoInstance {
    start_pgmemo(Config {
        upstream: UpstreamUrl::parse(url).unwrap_or_else(|e| panic!("{url}: {e}")),
        ..Config::default()
    })
    .await
}

#[tokio::test]
async fn upstream_tls_require_and_disable() {
    let pki = make_pki(&["localhost", "127.0.0.1"]);
    let pg = ssl_only_cluster(&pki).await;

    for mode in ["require", "prefer"] {
        let pgmemo = pgmemo_upstream(&format!(
            "postgres://127.0.0.1:{}?sslmode={mode}",
            pg.port()
        ))
        .await;
        let client = connect_plain(pgmemo.port(), "postgres")
            .await
            .unwrap_or_else(|e| panic!("login through pgmemo with sslmode={mode}: {e:?}"));
        assert!(
            server_side_ssl(&client).await,
            "sslmode={mode}: not encrypted"
        );
    }

    // Without TLS the server's refusal (no hostssl match) reaches the client unchanged.
    let direct = connect_plain(pg.port(), "postgres")
        .await
        .expect_err("PostgreSQL accepted a plain-text login");
    let direct = db_error(&direct);
    assert_eq!(direct.0, SqlState::INVALID_AUTHORIZATION_SPECIFICATION);
    assert!(direct.1.starts_with("no pg_hba.conf entry"), "{direct:?}");
    let pgmemo = start_pgmemo(pgmemo_config_for(pg.port())).await;
    let proxied = connect_plain(pgmemo.port(), "postgres")
        .await
        .expect_err("pgmemo with sslmode=disable logged in to a hostssl-only server");
    assert_eq!(db_error(&proxied), direct);
}

#[tokio::test]
async fn upstream_tls_verify_full() {
    let pki = make_pki(&["localhost", "127.0.0.1"]);
    let other = make_pki(&["localhost", "127.0.0.1"]);
    let pg = ssl_only_cluster(&pki).await;

    for mode in ["verify-full", "verify-ca"] {
        let url = format!(
            "postgres://127.0.0.1:{}?sslmode={mode}&sslrootcert={}",
            pg.port(),
            pki.ca_file.display()
        );
        let pgmemo = pgmemo_upstream(&url).await;
        let client = connect_plain(pgmemo.port(), "postgres")
            .await
            .unwrap_or_else(|e| panic!("login through pgmemo with {url}: {e:?}"));
        assert!(server_side_ssl(&client).await);

        // A CA that did not sign the server's certificate: the login fails with a TLS error.
        let url = format!(
            "postgres://127.0.0.1:{}?sslmode={mode}&sslrootcert={}",
            pg.port(),
            other.ca_file.display()
        );
        let pgmemo = pgmemo_upstream(&url).await;
        let err = connect_plain(pgmemo.port(), "postgres")
            .await
            .err()
            .unwrap_or_else(|| {
                panic!("pgmemo trusted a server certificate from another CA: {url}")
            });
        assert_upstream_tls_failure(&err);
    }
}

/// `verify-ca` checks the chain only; `verify-full` also wants the host's name in the
/// certificate.
#[tokio::test]
async fn upstream_tls_verify_full_checks_the_name() {
    let pki = make_pki(&["db.example"]);
    let pg = ssl_only_cluster(&pki).await;
    let url = |mode: &str| {
        format!(
            "postgres://127.0.0.1:{}?sslmode={mode}&sslrootcert={}",
            pg.port(),
            pki.ca_file.display()
        )
    };

    let pgmemo = pgmemo_upstream(&url("verify-ca")).await;
    let client = connect_plain(pgmemo.port(), "postgres")
        .await
        .expect("verify-ca ignores the name");
    assert!(server_side_ssl(&client).await);

    let pgmemo = pgmemo_upstream(&url("verify-full")).await;
    let err = connect_plain(pgmemo.port(), "postgres")
        .await
        .expect_err("verify-full accepted a certificate for another name");
    assert_upstream_tls_failure(&err);
}

/// `sslmode=require` towards a server without TLS fails with a clear error; `prefer` falls
/// back to plain text.
#[tokio::test]
async fn upstream_tls_required_but_not_offered() {
    let pg = TempPostgres::builder()
        .conf("ssl = off")
        .start()
        .await
        .expect("starting PostgreSQL");

    let pgmemo = pgmemo_upstream(&format!(
        "postgres://127.0.0.1:{}?sslmode=require",
        pg.port()
    ))
    .await;
    let err = connect_plain(pgmemo.port(), "postgres")
        .await
        .expect_err("sslmode=require towards a server without TLS must fail");
    assert_upstream_tls_failure(&err);

    let pgmemo = pgmemo_upstream(&format!(
        "postgres://127.0.0.1:{}?sslmode=prefer",
        pg.port()
    ))
    .await;
    let client = connect_plain(pgmemo.port(), "postgres")
        .await
        .expect("sslmode=prefer falls back to plain text");
    assert!(!server_side_ssl(&client).await);
}

/// A cluster with TLS on where role `tls_scram` must log in over TLS with SCRAM, and pgmemo in
/// front of it requiring TLS from clients and speaking TLS to the server, relaying the SCRAM
/// exchange (`auth_type = upstream`).
async fn tls_both_sides_relaying_scram(pki: &Pki) -> (TempPostgres, PgmemoInstance) {
    let pg = ssl_cluster(pki)
        .conf("password_encryption = 'scram-sha-256'")
        .hba("hostssl all tls_scram 127.0.0.1/32 scram-sha-256")
        .start()
        .await
        .expect("starting PostgreSQL with ssl = on");
    pg.psql("CREATE ROLE tls_scram LOGIN PASSWORD 'tls-scram-pw'")
        .await;
    let upstream = format!("postgres://127.0.0.1:{}?sslmode=require", pg.port());
    let pgmemo = start_pgmemo(Config {
        upstream: UpstreamUrl::parse(&upstream).unwrap(),
        ..client_tls_config(pki, ClientTlsMode::Require)
    })
    .await;
    (pg, pgmemo)
}

/// psql (libpq) through pgmemo with `sslmode=require` and the given extra conninfo; returns
/// its output or its error message.
async fn psql_via(
    pgmemo: &PgmemoInstance,
    user: &str,
    password: &str,
    extra: &str,
) -> Result<String, String> {
    let conninfo = format!(
        "host=127.0.0.1 port={} user={user} dbname=postgres sslmode=require connect_timeout=20 {extra}",
        pgmemo.port()
    );
    let mut cmd = tokio::process::Command::new(testkit::pg_bin("psql"));
    cmd.args(["-X", "-A", "-t", "-c", "SELECT 1"])
        .arg(conninfo)
        .env("PGPASSWORD", password)
        .kill_on_drop(true);
    let out = tokio::time::timeout(LOGIN_TIMEOUT, cmd.output())
        .await
        .expect("psql hung")
        .expect("running psql");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// TLS on both sides with SCRAM relayed to the server. (tokio-postgres-rustls 0.13 never
/// offers channel binding, so this is the plain SCRAM case; libpq clients that announce channel
/// binding support are covered below.)
#[tokio::test]
async fn tls_both_sides_with_relayed_scram() {
    let pki = make_pki(&["localhost", "127.0.0.1"]);
    let (_pg, pgmemo) = tls_both_sides_relaying_scram(&pki).await;
    let client = connect_tls(
        pgmemo.port(),
        "tls_scram",
        Some("tls-scram-pw"),
        &pki.ca_der,
        SslMode::Require,
    )
    .await
    .expect("SCRAM relayed with TLS on both sides");
    assert!(server_side_ssl(&client).await);
    let err = connect_tls(
        pgmemo.port(),
        "tls_scram",
        Some("wrong-password"),
        &pki.ca_der,
        SslMode::Require,
    )
    .await
    .expect_err("wrong password");
    assert_eq!(
        db_error(&err),
        (
            SqlState::INVALID_PASSWORD,
            "password authentication failed for user \"tls_scram\"".to_owned()
        )
    );
    // libpq with channel binding switched off.
    assert_eq!(
        psql_via(
            &pgmemo,
            "tls_scram",
            "tls-scram-pw",
            "channel_binding=disable"
        )
        .await,
        Ok("1".to_owned())
    );
}

/// KNOWN LIMITATION: libpq over TLS (default `channel_binding=prefer`) sees plain
/// SCRAM-SHA-256 from pgmemo and answers with GS2 flag `y` ("I could bind, you cannot"). The
/// server's own connection (from pgmemo) is TLS, so PostgreSQL takes `y` for a downgrade attack
/// and refuses: "SCRAM channel binding negotiation error". The flag is covered by the client's
/// proof, so pgmemo cannot rewrite it.
#[tokio::test]
#[ignore = "known limitation: relayed SCRAM fails for libpq clients (channel_binding=prefer) when both sides use TLS"]
async fn tls_both_sides_with_relayed_scram_libpq_default() {
    let pki = make_pki(&["localhost", "127.0.0.1"]);
    let (_pg, pgmemo) = tls_both_sides_relaying_scram(&pki).await;
    assert_eq!(
        psql_via(&pgmemo, "tls_scram", "tls-scram-pw", "").await,
        Ok("1".to_owned())
    );
}

/// `verify-full` checks the certificate against the host each connection goes to: a
/// `[databases]` entry that sends a database to another host name than the upstream URL's is
/// checked against that name, not the URL's.
#[tokio::test]
async fn upstream_tls_verify_full_checks_the_host_of_each_database() {
    let pki = make_pki(&["localhost"]);
    let pg = ssl_only_cluster(&pki).await;
    let url = format!(
        "postgres://localhost:{}?sslmode=verify-full&sslrootcert={}",
        pg.port(),
        pki.ca_file.display()
    );
    let mut config = Config {
        upstream: UpstreamUrl::parse(&url).unwrap(),
        ..Config::default()
    };
    config.databases.insert(
        "by_address".into(),
        pgmemo::config::DatabaseConfig {
            host: Some("127.0.0.1".into()),
            dbname: Some("postgres".into()),
            ..Default::default()
        },
    );
    let pgmemo = start_pgmemo(config).await;
    let client = connect_plain(pgmemo.port(), "postgres")
        .await
        .expect("the URL's host is in the certificate");
    assert!(server_side_ssl(&client).await);
    let mut by_address = client_config(pgmemo.port(), "postgres", None, SslMode::Disable);
    by_address.dbname("by_address");
    let err = connect_with(&by_address, NoTls)
        .await
        .expect_err("verify-full accepted a certificate without the entry's host");
    assert_upstream_tls_failure(&err);
}

/// An upstream URL naming a socket directory with `sslmode=require`: the socket itself is
/// never tried with TLS (as libpq), but a `[databases]` entry's TCP host is.
#[tokio::test]
async fn upstream_tls_applies_to_database_hosts_of_a_socket_url() {
    let pki = make_pki(&["localhost", "127.0.0.1"]);
    let pg = ssl_only_cluster(&pki).await;
    let dir = pg
        .socket_dir()
        .to_str()
        .expect("UTF-8 temp dir")
        .replace('/', "%2F");
    let url = format!("postgres://{dir}:{}?sslmode=require", pg.port());
    let mut config = Config {
        upstream: UpstreamUrl::parse(&url).unwrap(),
        ..Config::default()
    };
    config.databases.insert(
        "over_tcp".into(),
        pgmemo::config::DatabaseConfig {
            host: Some("127.0.0.1".into()),
            dbname: Some("postgres".into()),
            ..Default::default()
        },
    );
    let pgmemo = start_pgmemo(config).await;
    let over_socket = connect_plain(pgmemo.port(), "postgres")
        .await
        .expect("the socket needs no TLS");
    assert!(!server_side_ssl(&over_socket).await);
    let mut over_tcp = client_config(pgmemo.port(), "postgres", None, SslMode::Disable);
    over_tcp.dbname("over_tcp");
    let client = connect_with(&over_tcp, NoTls)
        .await
        .expect("the TCP host is reached over TLS (the server refuses anything else)");
    assert!(server_side_ssl(&client).await);
}

//! Authentication through pgmemo, on both sides.
//!
//! - Upstream side (`auth_type = upstream`, the default): pgmemo relays the client's exchange to
//!   PostgreSQL. Every outcome (success, wrong password, unknown database, unknown user) must look
//!   exactly like a direct connection, and a pooled connection must never let a client skip the
//!   server's password check.
//! - Local side (`auth_type = trust | md5 | scram-sha-256` with a userlist): pgmemo checks the
//!   client itself, then logs in to the server with the credentials it holds (SCRAM, md5 or
//!   cleartext, whatever the server asks for).

use std::path::PathBuf;
use std::time::Duration;
use testkit::backend_pid;

use pgmemo::config::{AuthType, Seconds};
use pgmemo::Config;
use tempfile::TempDir;
use testkit::{assert_eventually, pgmemo_config_for, spawn_pgmemo, PgmemoInstance, TempPostgres};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls};

/// Upper bound for one login: a login that takes longer is a hang, not a slow machine.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a server connection may take to come back to its pool after its client left.
const RESET_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Logs in over plain TCP to 127.0.0.1:`port` (PostgreSQL or pgmemo). Panics if the login does
/// not finish within [`LOGIN_TIMEOUT`], so a hang fails the test with a clear message.
async fn connect(
    port: u16,
    user: &str,
    password: Option<&str>,
    db: &str,
) -> Result<Client, tokio_postgres::Error> {
    let mut config = tokio_postgres::Config::new();
    config.host("127.0.0.1").port(port).user(user).dbname(db);
    if let Some(pw) = password {
        config.password(pw);
    }
    let (client, connection) = tokio::time::timeout(LOGIN_TIMEOUT, config.connect(NoTls))
        .await
        .unwrap_or_else(|_| panic!("login of {user} to port {port} hung for {LOGIN_TIMEOUT:?}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Like [`connect`] but the login must succeed.
async fn login(port: u16, user: &str, password: Option<&str>, db: &str) -> Client {
    connect(port, user, password, db)
        .await
        .unwrap_or_else(|e| panic!("login of {user} to port {port} failed: {e:?}"))
}

/// The SQLSTATE and message of a failed login; panics unless the server (or pgmemo) sent an
/// ErrorResponse.
async fn login_error(
    port: u16,
    user: &str,
    password: Option<&str>,
    db: &str,
) -> (SqlState, String) {
    match connect(port, user, password, db).await {
        Ok(_) => panic!("login of {user} to {db} on port {port} succeeded but should fail"),
        Err(e) => match e.as_db_error() {
            Some(db_err) => (db_err.code().clone(), db_err.message().to_owned()),
            None => panic!("login of {user} on port {port} failed without an ErrorResponse: {e:?}"),
        },
    }
}

/// Asserts that a login fails with `code` through pgmemo, with the same SQLSTATE and message
/// as the same login made directly to PostgreSQL. Returns the message.
async fn assert_fails_like_direct(
    pg: &TempPostgres,
    pgmemo: &PgmemoInstance,
    user: &str,
    password: Option<&str>,
    db: &str,
    code: SqlState,
) -> String {
    let direct = login_error(pg.port(), user, password, db).await;
    assert_eq!(direct.0, code, "direct login of {user}: {direct:?}");
    let proxied = login_error(pgmemo.port(), user, password, db).await;
    assert_eq!(proxied, direct, "{user}/{db} through pgmemo vs. direct");
    proxied.1
}

/// Runs `SELECT current_user` and checks the answer.
async fn assert_current_user(client: &Client, user: &str) {
    let row = client
        .query_one("SELECT current_user::text", &[])
        .await
        .expect("query after login");
    assert_eq!(row.get::<_, String>(0), user);
}

/// Idle server connections pgmemo holds for `user` (over all its pools).
fn idle_for(pgmemo: &PgmemoInstance, user: &str) -> usize {
    pgmemo
        .handle()
        .shared()
        .pools
        .all()
        .iter()
        .filter(|p| p.key().user == user)
        .map(|p| p.counts().0)
        .sum()
}

/// Waits until a server connection for `user` is back in its pool, idle.
async fn wait_idle(pgmemo: &PgmemoInstance, user: &str) {
    assert_eventually(
        RESET_TIMEOUT,
        &format!("an idle pooled server connection for {user}"),
        || async { idle_for(pgmemo, user) >= 1 },
    )
    .await;
}

fn password_failed(user: &str) -> String {
    format!("password authentication failed for user \"{user}\"")
}

/// Asserts that `user` logs in through pgmemo with `password` and is who the server says.
async fn assert_login(pgmemo: &PgmemoInstance, (user, password): (&str, &str)) {
    let client = login(pgmemo.port(), user, Some(password), "postgres").await;
    assert_current_user(&client, user).await;
}

/// Asserts that a login of `user` with `password` is refused as a wrong password (28P01 with
/// PostgreSQL's message).
async fn assert_password_refused(pgmemo: &PgmemoInstance, user: &str, password: &str) {
    assert_refused(
        pgmemo,
        user,
        password,
        SqlState::INVALID_PASSWORD,
        &password_failed(user),
    )
    .await;
}

/// Asserts that a login of `user` with `password` through pgmemo fails with `code` and
/// `message`.
async fn assert_refused(
    pgmemo: &PgmemoInstance,
    user: &str,
    password: &str,
    code: SqlState,
    message: &str,
) {
    let got = login_error(pgmemo.port(), user, Some(password), "postgres").await;
    assert_eq!(
        got,
        (code, message.to_owned()),
        "login of {user} with password {password:?}"
    );
}

/// SQL that creates a login role with a password for each password method: `scram` stored as
/// a SCRAM verifier, `md5` as an md5 hash (stored under `password_encryption = 'md5'`, since a
/// SCRAM verifier would make PostgreSQL use SCRAM for an md5 rule), `cleartext` for a
/// `password` rule.
fn password_roles(scram: (&str, &str), md5: (&str, &str), cleartext: (&str, &str)) -> String {
    format!(
        "CREATE ROLE {} LOGIN PASSWORD '{}';
         SET password_encryption = 'md5';
         CREATE ROLE {} LOGIN PASSWORD '{}';
         RESET password_encryption;
         CREATE ROLE {} LOGIN PASSWORD '{}';",
        scram.0, scram.1, md5.0, md5.1, cleartext.0, cleartext.1
    )
}

/// A userlist file in a fresh temp directory (kept alive by the returned `TempDir`).
fn write_userlist(entries: &[(&str, String)]) -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir for the userlist");
    let path = dir.path().join("userlist.txt");
    let mut text = String::from("; written by tests/auth.rs\n");
    for (user, secret) in entries {
        text.push_str(&format!(
            "\"{}\" \"{}\"\n",
            user.replace('"', "\"\""),
            secret.replace('"', "\"\"")
        ));
    }
    std::fs::write(&path, text).expect("writing the userlist");
    (dir, path)
}

async fn start_pgmemo(config: Config) -> PgmemoInstance {
    spawn_pgmemo(config).await.expect("starting pgmemo")
}

// ---------------------------------------------------------------------------------------------
// Upstream side: auth_type = upstream relays the client's exchange to PostgreSQL
// ---------------------------------------------------------------------------------------------

const SCRAM_USER: (&str, &str) = ("scram_user", "scram-pw");
const MD5_USER: (&str, &str) = ("md5_user", "md5-pw");
const PW_USER: (&str, &str) = ("pw_user", "cleartext-pw");
const TRUST_USER: &str = "trust_user";

/// A cluster where each role has its own pg_hba method and nothing else is trusted over TCP.
/// Database `mockdb` (which does not exist) asks every other role for SCRAM, so unknown roles go
/// through PostgreSQL's mock authentication there.
async fn relay_cluster() -> TempPostgres {
    let pg = TempPostgres::builder()
        .conf("password_encryption = 'scram-sha-256'")
        .hba("host all scram_user 127.0.0.1/32 scram-sha-256")
        .hba("host all md5_user 127.0.0.1/32 md5")
        .hba("host all pw_user 127.0.0.1/32 password")
        .hba("host all trust_user 127.0.0.1/32 trust")
        .hba("host mockdb all 127.0.0.1/32 scram-sha-256")
        .no_default_trust()
        .start()
        .await
        .expect("starting PostgreSQL");
    pg.psql(&format!(
        "{}
         CREATE ROLE {TRUST_USER} LOGIN;",
        password_roles(SCRAM_USER, MD5_USER, PW_USER)
    ))
    .await;
    // The md5 role really has an md5 secret (else PostgreSQL would switch to SCRAM).
    let stored = pg
        .psql("SELECT rolname || ' ' || left(rolpassword, 3) FROM pg_authid WHERE rolname IN ('md5_user', 'scram_user') ORDER BY 1")
        .await;
    assert_eq!(stored, "md5_user md5\nscram_user SCR");
    pg
}

/// Right password, wrong password and unknown database for one password method.
async fn check_relayed_password_login((user, password): (&str, &str)) {
    let pg = relay_cluster().await;
    let pgmemo = start_pgmemo(pgmemo_config_for(pg.port())).await;

    assert_login(&pgmemo, (user, password)).await;

    let msg = assert_fails_like_direct(
        &pg,
        &pgmemo,
        user,
        Some("wrong-password"),
        "postgres",
        SqlState::INVALID_PASSWORD,
    )
    .await;
    assert_eq!(msg, password_failed(user));

    let msg = assert_fails_like_direct(
        &pg,
        &pgmemo,
        user,
        Some(password),
        "no_such_db",
        SqlState::INVALID_CATALOG_NAME,
    )
    .await;
    assert_eq!(msg, "database \"no_such_db\" does not exist");

    // And a right password still works after the failures.
    assert_login(&pgmemo, (user, password)).await;
}

#[tokio::test]
async fn relayed_scram_sha_256_login() {
    check_relayed_password_login(SCRAM_USER).await;
}

#[tokio::test]
async fn relayed_md5_login() {
    check_relayed_password_login(MD5_USER).await;
}

#[tokio::test]
async fn relayed_cleartext_password_login() {
    check_relayed_password_login(PW_USER).await;
}

#[tokio::test]
async fn relayed_unknown_user_fails_like_direct() {
    let pg = relay_cluster().await;
    let pgmemo = start_pgmemo(pgmemo_config_for(pg.port())).await;

    // No pg_hba.conf rule matches: PostgreSQL's 28000, word for word.
    let msg = assert_fails_like_direct(
        &pg,
        &pgmemo,
        "ghost",
        Some("whatever"),
        "postgres",
        SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
    )
    .await;
    assert!(msg.starts_with("no pg_hba.conf entry"), "{msg}");

    // A rule asks for SCRAM: the mock exchange ends in the usual 28P01.
    let msg = assert_fails_like_direct(
        &pg,
        &pgmemo,
        "ghost",
        Some("whatever"),
        "mockdb",
        SqlState::INVALID_PASSWORD,
    )
    .await;
    assert_eq!(msg, password_failed("ghost"));
}

#[tokio::test]
async fn relayed_trust_login_and_unknown_database() {
    let pg = relay_cluster().await;
    let pgmemo = start_pgmemo(pgmemo_config_for(pg.port())).await;
    let client = login(pgmemo.port(), TRUST_USER, None, "postgres").await;
    assert_current_user(&client, TRUST_USER).await;
    drop(client);
    let msg = assert_fails_like_direct(
        &pg,
        &pgmemo,
        TRUST_USER,
        None,
        "no_such_db",
        SqlState::INVALID_CATALOG_NAME,
    )
    .await;
    assert_eq!(msg, "database \"no_such_db\" does not exist");
}

/// An idle pooled connection must not let the next client of the same user skip the server's
/// password check.
#[tokio::test]
async fn relayed_pooled_connection_still_requires_the_password() {
    let pg = relay_cluster().await;
    let pgmemo = start_pgmemo(pgmemo_config_for(pg.port())).await;
    for (user, password) in [SCRAM_USER, MD5_USER, PW_USER] {
        assert_login(&pgmemo, (user, password)).await;
        wait_idle(&pgmemo, user).await;

        let (code, msg) =
            login_error(pgmemo.port(), user, Some("wrong-password"), "postgres").await;
        assert_eq!(
            (code, msg),
            (SqlState::INVALID_PASSWORD, password_failed(user)),
            "{user} with a wrong password while a pooled connection is idle"
        );
        // The pooled connection is still there, and the right password still works.
        assert!(
            idle_for(&pgmemo, user) >= 1,
            "{user}: pooled connection lost"
        );
        assert_login(&pgmemo, (user, password)).await;
    }
}

/// Refused logins give their place in the pool back: with `pool_size = 1`, a right login after
/// several failed ones gets a connection at once instead of waiting for a leaked slot.
#[tokio::test]
async fn relayed_failed_logins_do_not_use_up_the_pool() {
    let pg = relay_cluster().await;
    let pgmemo = start_pgmemo(Config {
        pool_size: 1,
        query_wait_timeout: Seconds(Duration::from_secs(5)),
        ..pgmemo_config_for(pg.port())
    })
    .await;
    let (user, password) = SCRAM_USER;
    for _ in 0..3 {
        let (code, _) = login_error(pgmemo.port(), user, Some("wrong-password"), "postgres").await;
        assert_eq!(code, SqlState::INVALID_PASSWORD);
        let (code, _) = login_error(pgmemo.port(), user, Some(password), "no_such_db").await;
        assert_eq!(code, SqlState::INVALID_CATALOG_NAME);
    }
    assert_login(&pgmemo, (user, password)).await;
}

/// A client that stays silent at the server's password request (a person at a prompt, a
/// stalled driver) while it is the first login of its pool does not hold up the others: once
/// the server has asked, every login relays its own exchange.
#[tokio::test]
async fn a_silent_first_login_does_not_hold_up_the_others() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pg = relay_cluster().await;
    let pgmemo = start_pgmemo(pgmemo_config_for(pg.port())).await;
    let (user, password) = SCRAM_USER;
    let mut silent = tokio::net::TcpStream::connect(("127.0.0.1", pgmemo.port()))
        .await
        .unwrap();
    let startup = wire::startup::StartupMessage::encode([("user", user), ("database", "postgres")]);
    silent.write_all(&startup).await.unwrap();
    let mut first = [0u8; 1];
    silent.read_exact(&mut first).await.unwrap();
    assert_eq!(
        first[0], b'R',
        "the server's password request reaches the client"
    );
    // The silent client still holds its exchange; the next login is not kept waiting.
    tokio::time::timeout(
        Duration::from_secs(10),
        assert_login(&pgmemo, (user, password)),
    )
    .await
    .expect("a login waited for a silent one");
    drop(silent);
}

/// Many clients of a user the server trusts, logging in at once on a fresh pgmemo: one of
/// them finds out that the server trusts it, the others then share the pool. pgmemo opens no
/// more server connections than the pool has places (plus the one that found out), however
/// many clients arrive.
#[tokio::test]
async fn a_crowd_of_trusted_logins_opens_no_more_connections_than_the_pool_has() {
    let pg = relay_cluster().await;
    let pgmemo = start_pgmemo(Config {
        pool_size: 2,
        query_wait_timeout: Seconds(Duration::from_secs(30)),
        ..pgmemo_config_for(pg.port())
    })
    .await;
    let port = pgmemo.port();
    let logins = (0..40).map(|_| async move {
        let client = login(port, TRUST_USER, None, "postgres").await;
        client.simple_query("SELECT 1").await.expect("a query");
    });
    futures_util::future::join_all(logins).await;
    let opened = pgmemo
        .stats()
        .server_connects
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(opened <= 3, "{opened} server connections for a pool of 2");
}

/// For a user the server trusts, the next client reuses the pooled server connection.
#[tokio::test]
async fn relayed_trust_user_reuses_the_pooled_connection() {
    let pg = relay_cluster().await;
    let pgmemo = start_pgmemo(pgmemo_config_for(pg.port())).await;

    let first = login(pgmemo.port(), TRUST_USER, None, "postgres").await;
    let pid = backend_pid(&first).await;
    drop(first);

    // The reset runs in the background after the client left; once the connection is idle
    // again, the next client gets it.
    assert_eventually(
        RESET_TIMEOUT,
        "a second trust_user client gets the first one's server connection",
        || async {
            if idle_for(&pgmemo, TRUST_USER) == 0 {
                return false;
            }
            let second = login(pgmemo.port(), TRUST_USER, None, "postgres").await;
            backend_pid(&second).await == pid
        },
    )
    .await;
    let server_sessions = pg
        .psql("SELECT count(*) FROM pg_stat_activity WHERE usename = 'trust_user'")
        .await;
    assert_eq!(
        server_sessions, "1",
        "pgmemo opened a second server connection"
    );
}

// ---------------------------------------------------------------------------------------------
// Local side: pgmemo checks clients against a userlist
// ---------------------------------------------------------------------------------------------

const LOCAL_PLAIN: (&str, &str) = ("plain_user", "plain-pw");
const LOCAL_MD5: (&str, &str) = ("md5_user", "md5-pw");
const LOCAL_SCRAM: (&str, &str) = ("scram_user", "scram-pw");
/// Exists on the server but is not in the userlist.
const UNLISTED: &str = "unlisted_user";

/// A trusting cluster with the roles of the userlist (pgmemo needs no password for them), and
/// pgmemo in front of it with `auth_type` and the userlist holding one entry of each form.
async fn local_setup(auth_type: AuthType) -> (TempPostgres, PgmemoInstance, TempDir) {
    let pg = TempPostgres::start().await.expect("starting PostgreSQL");
    pg.psql(&format!(
        "CREATE ROLE {} LOGIN; CREATE ROLE {} LOGIN; CREATE ROLE {} LOGIN; CREATE ROLE {UNLISTED} LOGIN;",
        LOCAL_PLAIN.0, LOCAL_MD5.0, LOCAL_SCRAM.0
    ))
    .await;
    let md5_secret = wire::md5::md5_secret(LOCAL_MD5.0, LOCAL_MD5.1);
    assert_eq!(md5_secret.len(), 35);
    let scram_secret = wire::scram::ScramSecret::generate(LOCAL_SCRAM.1).to_text();
    let (dir, path) = write_userlist(&[
        (LOCAL_PLAIN.0, LOCAL_PLAIN.1.to_owned()),
        (LOCAL_MD5.0, md5_secret),
        (LOCAL_SCRAM.0, scram_secret),
    ]);
    let config = Config {
        auth_type,
        auth_file: Some(path),
        ..pgmemo_config_for(pg.port())
    };
    let pgmemo = start_pgmemo(config).await;
    (pg, pgmemo, dir)
}

#[tokio::test]
async fn local_trust_needs_a_listed_user_only() {
    let (_pg, pgmemo, _dir) = local_setup(AuthType::Trust).await;
    for (user, password) in [LOCAL_PLAIN, LOCAL_MD5, LOCAL_SCRAM] {
        // trust asks no password: right, wrong and none all work for listed users.
        assert_login(&pgmemo, (user, password)).await;
        assert_login(&pgmemo, (user, "wrong-password")).await;
        let client = login(pgmemo.port(), user, None, "postgres").await;
        assert_current_user(&client, user).await;
    }
    for user in [UNLISTED, "ghost"] {
        assert_refused(
            &pgmemo,
            user,
            "whatever",
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            &format!("role \"{user}\" is not listed in auth_file"),
        )
        .await;
    }
}

#[tokio::test]
async fn local_md5_checks_the_userlist() {
    let (_pg, pgmemo, _dir) = local_setup(AuthType::Md5).await;
    // Plain and md5 entries through md5; a SCRAM entry makes pgmemo use SCRAM instead, as
    // PostgreSQL does for an md5 rule and a SCRAM verifier.
    for (user, password) in [LOCAL_PLAIN, LOCAL_MD5, LOCAL_SCRAM] {
        assert_login(&pgmemo, (user, password)).await;
        assert_password_refused(&pgmemo, user, "wrong-password").await;
    }
    for user in [UNLISTED, "ghost"] {
        assert_password_refused(&pgmemo, user, "whatever").await;
    }
}

#[tokio::test]
async fn local_scram_checks_the_userlist() {
    let (_pg, pgmemo, _dir) = local_setup(AuthType::ScramSha256).await;
    for (user, password) in [LOCAL_PLAIN, LOCAL_SCRAM] {
        assert_login(&pgmemo, (user, password)).await;
        assert_password_refused(&pgmemo, user, "wrong-password").await;
    }
    // An md5 secret cannot verify a SCRAM exchange, even with the right password (as in
    // PostgreSQL).
    assert_password_refused(&pgmemo, LOCAL_MD5.0, LOCAL_MD5.1).await;
    for user in [UNLISTED, "ghost"] {
        assert_password_refused(&pgmemo, user, "whatever").await;
    }
}

/// A plain-text userlist password is prepared with SASLprep for SCRAM, as PostgreSQL prepares
/// the passwords it stores and libpq the ones it sends: a no-break space and a space are one.
#[tokio::test]
async fn local_scram_prepares_plain_passwords_with_saslprep() {
    let pg = TempPostgres::start().await.expect("starting PostgreSQL");
    pg.psql("CREATE ROLE prep_user LOGIN").await;
    let (_dir, path) = write_userlist(&[("prep_user", "pass\u{a0}word".to_owned())]);
    let config = Config {
        auth_type: AuthType::ScramSha256,
        auth_file: Some(path),
        ..pgmemo_config_for(pg.port())
    };
    let pgmemo = start_pgmemo(config).await;
    for password in ["pass\u{a0}word", "pass word"] {
        assert_login(&pgmemo, ("prep_user", password)).await;
    }
    assert_password_refused(&pgmemo, "prep_user", "password").await;
}

/// A wrong password is refused by pgmemo even while an idle pooled connection for the user
/// exists, and the next right login reuses that connection.
#[tokio::test]
async fn local_pooled_connection_still_requires_the_password() {
    let (_pg, pgmemo, _dir) = local_setup(AuthType::ScramSha256).await;
    let (user, password) = LOCAL_PLAIN;
    let client = login(pgmemo.port(), user, Some(password), "postgres").await;
    let pid = backend_pid(&client).await;
    drop(client);
    wait_idle(&pgmemo, user).await;
    assert_password_refused(&pgmemo, user, "wrong-password").await;
    let client = login(pgmemo.port(), user, Some(password), "postgres").await;
    assert_eq!(backend_pid(&client).await, pid, "pooled connection reused");
}

// ---------------------------------------------------------------------------------------------
// pgmemo → server login with the credentials pgmemo holds
// ---------------------------------------------------------------------------------------------

const SRV_SCRAM: (&str, &str) = ("srv_scram", "srv-scram-pw");
const SRV_MD5: (&str, &str) = ("srv_md5", "srv-md5-pw");
const SRV_PW: (&str, &str) = ("srv_pw", "srv-cleartext-pw");
/// The userlist holds only the SCRAM verifier: pgmemo can check the client but has no password
/// for the server.
const SRV_VERIFIER: (&str, &str) = ("srv_verifier", "srv-verifier-pw");
/// The userlist holds an outdated plain password.
const SRV_STALE: (&str, &str) = ("srv_stale", "srv-stale-old-pw");
const SRV_STALE_SERVER_PW: &str = "srv-stale-new-pw";

/// A cluster that asks every role for a password (each with its own method), and pgmemo with
/// a userlist for them.
async fn server_login_setup(auth_type: AuthType) -> (TempPostgres, PgmemoInstance, TempDir) {
    server_login_setup_with(auth_type, |_| {}).await
}

/// [`server_login_setup`] with `tweak` applied to pgmemo's configuration.
async fn server_login_setup_with(
    auth_type: AuthType,
    tweak: impl FnOnce(&mut Config),
) -> (TempPostgres, PgmemoInstance, TempDir) {
    let pg = TempPostgres::builder()
        .conf("password_encryption = 'scram-sha-256'")
        .hba("host all srv_scram 127.0.0.1/32 scram-sha-256")
        .hba("host all srv_md5 127.0.0.1/32 md5")
        .hba("host all srv_pw 127.0.0.1/32 password")
        .hba("host all srv_verifier 127.0.0.1/32 scram-sha-256")
        .hba("host all srv_stale 127.0.0.1/32 scram-sha-256")
        .no_default_trust()
        .start()
        .await
        .expect("starting PostgreSQL");
    pg.psql(&format!(
        "{}
         CREATE ROLE {} LOGIN PASSWORD '{}';
         CREATE ROLE {} LOGIN PASSWORD '{SRV_STALE_SERVER_PW}';",
        password_roles(SRV_SCRAM, SRV_MD5, SRV_PW),
        SRV_VERIFIER.0,
        SRV_VERIFIER.1,
        SRV_STALE.0
    ))
    .await;
    // The verifier as PostgreSQL stores it, copied the way the docs suggest.
    let verifier = pg
        .psql("SELECT rolpassword FROM pg_authid WHERE rolname = 'srv_verifier'")
        .await;
    assert!(verifier.starts_with("SCRAM-SHA-256$"), "{verifier}");
    let (dir, path) = write_userlist(&[
        (SRV_SCRAM.0, SRV_SCRAM.1.to_owned()),
        (SRV_MD5.0, SRV_MD5.1.to_owned()),
        (SRV_PW.0, SRV_PW.1.to_owned()),
        (SRV_VERIFIER.0, verifier),
        (SRV_STALE.0, SRV_STALE.1.to_owned()),
    ]);
    // One server connection per user and a short wait: a failed server login that kept its
    // place in the pool would make the next attempt time out (53300) instead of failing again.
    let mut config = Config {
        auth_type,
        auth_file: Some(path),
        pool_size: 1,
        query_wait_timeout: Seconds(Duration::from_secs(5)),
        ..pgmemo_config_for(pg.port())
    };
    tweak(&mut config);
    let pgmemo = start_pgmemo(config).await;
    (pg, pgmemo, dir)
}

/// Transaction pooling opens server connections long after a client logged in, with the
/// credentials its login found (the userlist's password here). A client whose login was
/// served by an idle pooled connection needs them too: here B logs in on A's idle
/// connection, A then holds it in a block, and B's next statement needs a new one.
#[tokio::test]
async fn transaction_pooling_logs_in_new_servers_for_clients_that_reused_one() {
    for auth_type in [AuthType::Md5, AuthType::ScramSha256] {
        let (_pg, pgmemo, _dir) = server_login_setup_with(auth_type, |c| {
            c.pool_mode = pgmemo::config::PoolMode::Transaction;
            c.pool_size = 2;
        })
        .await;
        let (user, password) = SRV_MD5;
        let a = connect(pgmemo.port(), user, Some(password), "postgres")
            .await
            .unwrap();
        a.simple_query("SELECT 1").await.unwrap();
        let b = connect(pgmemo.port(), user, Some(password), "postgres")
            .await
            .unwrap();
        a.batch_execute("BEGIN").await.unwrap();
        b.simple_query("SELECT 1")
            .await
            .unwrap_or_else(|e| panic!("{auth_type:?}: B on a new server: {e}"));
        a.batch_execute("COMMIT").await.unwrap();
    }
}

async fn check_server_login_with_held_credentials(auth_type: AuthType) {
    let (pg, pgmemo, _dir) = server_login_setup(auth_type).await;

    for (user, password) in [SRV_SCRAM, SRV_MD5, SRV_PW] {
        // The server really asks for a password: without one a direct login fails.
        assert!(
            connect(pg.port(), user, None, "postgres").await.is_err(),
            "{user} logs in to PostgreSQL without a password"
        );
        // The client proves itself to pgmemo; pgmemo answers the server's SCRAM / md5 /
        // cleartext request with the password from the userlist.
        assert_login(&pgmemo, (user, password)).await;
        // A wrong password is pgmemo's to refuse.
        assert_password_refused(&pgmemo, user, "wrong-password").await;
    }

    // Only a verifier in the userlist (as pg_authid stores it): pgmemo recovers the client's
    // SCRAM ClientKey from its proof and logs in to the server with it, as PgBouncer does.
    // (With auth_type = md5 pgmemo switches to SCRAM for a user whose secret is a verifier.)
    assert_login(&pgmemo, SRV_VERIFIER).await;
    // Once the server's verifier changes, the recovered keys no longer fit: the server's own
    // refusal reaches the client, promptly.
    pg.psql(&format!(
        "ALTER ROLE {} PASSWORD 'changed-on-the-server'",
        SRV_VERIFIER.0
    ))
    .await;
    for pool in pgmemo.handle().shared().pools.all() {
        // Close the pooled connection so the next login must authenticate to the server.
        pool.close_idle().await;
    }
    assert_password_refused(&pgmemo, SRV_VERIFIER.0, SRV_VERIFIER.1).await;

    // An outdated plain password: the server's own refusal reaches the client.
    for _ in 0..2 {
        assert_password_refused(&pgmemo, SRV_STALE.0, SRV_STALE.1).await;
    }
    // (The server password is not what the client knows, so that one fails at pgmemo.)
    let (code, _) = login_error(
        pgmemo.port(),
        SRV_STALE.0,
        Some(SRV_STALE_SERVER_PW),
        "postgres",
    )
    .await;
    assert_eq!(code, SqlState::INVALID_PASSWORD);
}

#[tokio::test]
async fn server_login_with_held_credentials_md5_clients() {
    check_server_login_with_held_credentials(AuthType::Md5).await;
}

#[tokio::test]
async fn server_login_with_held_credentials_scram_clients() {
    check_server_login_with_held_credentials(AuthType::ScramSha256).await;
}

/// The salt pgmemo shows in a SCRAM exchange for `user`: the `s=` attribute of the
/// server-first-message, read with raw protocol bytes (the exchange is then dropped).
async fn scram_salt(pgmemo: &PgmemoInstance, user: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", pgmemo.port()))
        .await
        .unwrap();
    let startup = wire::startup::StartupMessage::encode([("user", user), ("database", "postgres")]);
    socket.write_all(&startup).await.unwrap();
    let mut buf = bytes::BytesMut::new();
    let next = async |socket: &mut tokio::net::TcpStream, buf: &mut bytes::BytesMut| loop {
        if let Some(frame) = wire::Frame::decode(buf, 1 << 20).unwrap() {
            return frame;
        }
        assert!(socket.read_buf(buf).await.unwrap() > 0, "closed");
    };
    let offer = next(&mut socket, &mut buf).await;
    assert_eq!(offer.tag(), b'R');
    socket
        .write_all(&wire::frontend::sasl_initial_response(
            "SCRAM-SHA-256",
            b"n,,n=,r=fyko+d2lbbFgONRv9qkxdawL",
        ))
        .await
        .unwrap();
    let first = next(&mut socket, &mut buf).await;
    let text = String::from_utf8_lossy(&first.body()[4..]).into_owned();
    text.split(',')
        .find_map(|a| a.strip_prefix("s="))
        .unwrap_or_else(|| panic!("no salt in {text:?}"))
        .to_owned()
}

/// The salt of a SCRAM exchange tells nothing of whether the user exists: it is the same
/// from one attempt to the next for a listed user with a plain-text password as for an
/// unlisted one, and it depends on a secret of the process (another pgmemo shows another
/// salt for the same unknown user), so nobody can compute an unknown user's salt offline.
#[tokio::test]
async fn scram_salts_do_not_tell_listed_users_from_unknown_ones() {
    let (pg, pgmemo, _dir) = local_setup(AuthType::ScramSha256).await;
    for user in [LOCAL_PLAIN.0, "ghost"] {
        let first = scram_salt(&pgmemo, user).await;
        assert_eq!(
            scram_salt(&pgmemo, user).await,
            first,
            "{user}: the salt changed"
        );
    }
    let (_dir2, path) = write_userlist(&[(LOCAL_PLAIN.0, LOCAL_PLAIN.1.to_owned())]);
    let other = start_pgmemo(Config {
        auth_type: AuthType::ScramSha256,
        auth_file: Some(path),
        ..pgmemo_config_for(pg.port())
    })
    .await;
    assert_ne!(
        scram_salt(&other, "ghost").await,
        scram_salt(&pgmemo, "ghost").await,
        "an unknown user's salt is the same in every pgmemo"
    );
    // Logins still work.
    assert_login(&pgmemo, LOCAL_PLAIN).await;
}

/// A server that answers pgmemo's SCRAM login with AuthenticationOk right after the client's
/// final message, without the SASLFinal that proves it knows the password (what an impostor
/// between pgmemo and PostgreSQL would do), then says it is ready. It keeps every connection
/// open until dropped.
async fn scram_impostor() -> (u16, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    fn auth(code: i32, data: &[u8]) -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend_from_slice(&(8 + data.len() as i32).to_be_bytes());
        m.extend_from_slice(&code.to_be_bytes());
        m.extend_from_slice(data);
        m
    }
    async fn message(s: &mut tokio::net::TcpStream) -> Vec<u8> {
        let mut head = [0u8; 5];
        s.read_exact(&mut head).await.unwrap();
        let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut body = vec![0u8; len - 4];
        s.read_exact(&mut body).await.unwrap();
        body
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut s, _)) = listener.accept().await {
            let mut len = [0u8; 4];
            s.read_exact(&mut len).await.unwrap();
            let mut startup = vec![0u8; i32::from_be_bytes(len) as usize - 4];
            s.read_exact(&mut startup).await.unwrap();
            s.write_all(&auth(10, b"SCRAM-SHA-256\0\0")).await.unwrap();
            let first = message(&mut s).await;
            let text = String::from_utf8_lossy(&first);
            // The nonce is everything after the first ",r=": it never holds a comma, but
            // it may hold "r=" itself (printable characters at random).
            let nonce = text
                .split_once(",r=")
                .unwrap()
                .1
                .trim_end_matches('\0')
                .to_owned();
            let server_first = format!("r={nonce}impostor,s=c2FsdHNhbHQ=,i=4096");
            s.write_all(&auth(11, server_first.as_bytes()))
                .await
                .unwrap();
            message(&mut s).await;
            let mut rest = auth(0, b"");
            rest.extend_from_slice(&[b'K', 0, 0, 0, 12, 0, 0, 0, 7, 0, 0, 0, 9]);
            rest.extend_from_slice(&[b'Z', 0, 0, 0, 5, b'I']);
            s.write_all(&rest).await.unwrap();
            held.push(s);
        }
    });
    (port, task)
}

/// pgmemo logs in to PostgreSQL with SCRAM and its own password: a server that does not
/// complete the exchange (no SASLFinal) is not taken for PostgreSQL, and the client's login
/// fails instead of reaching it.
#[tokio::test]
async fn a_server_that_skips_the_scram_proof_is_refused() {
    let (port, impostor) = scram_impostor().await;
    let (_dir, path) = write_userlist(&[("app", "app-pw".to_owned())]);
    let pgmemo = start_pgmemo(Config {
        auth_type: AuthType::Trust,
        auth_file: Some(path),
        ..pgmemo_config_for(port)
    })
    .await;
    let e = match connect(pgmemo.port(), "app", None, "app").await {
        Ok(_) => panic!("a client logged in through a server that never proved itself"),
        Err(e) => e,
    };
    let db = e
        .as_db_error()
        .unwrap_or_else(|| panic!("no ErrorResponse: {e:?}"));
    assert!(db.message().contains("SASLFinal"), "{db:?}");
    impostor.abort();
}

//! The admin console: the virtual database `pgmemo` answers SHOW commands and RELOAD for
//! superusers of the upstream (or the roles in `admin_users`) and refuses everyone else with
//! 42501.

use std::sync::Arc;
use testkit::backend_pid;

use testkit::{pgmemo_config_for, spawn_pgmemo, PgmemoInstance, TempPostgres};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, SimpleQueryMessage};

async fn cluster() -> TempPostgres {
    let pg = TempPostgres::builder()
        .start()
        .await
        .expect("cluster starts");
    pg.psql("CREATE ROLE plain_user LOGIN; CREATE ROLE ops LOGIN;")
        .await;
    pg
}

async fn admin(memo: &PgmemoInstance, user: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, conn) =
        tokio_postgres::connect(&memo.url(user, "pgmemo"), tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

/// Rows of a simple query as (column name → value) maps, in order.
async fn rows(client: &Client, sql: &str) -> Vec<Vec<(String, Option<String>)>> {
    client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(
                r.columns()
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (c.name().to_owned(), r.get(i).map(str::to_owned)))
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

fn value<'a>(row: &'a [(String, Option<String>)], column: &str) -> &'a str {
    row.iter()
        .find(|(c, _)| c == column)
        .and_then(|(_, v)| v.as_deref())
        .unwrap_or_else(|| panic!("no column {column} in {row:?}"))
}

#[tokio::test]
async fn superuser_sees_pools_clients_stats_config_and_version() {
    let pg = cluster().await;
    let mut config = pgmemo_config_for(pg.port());
    config.upstream = pgmemo::config::UpstreamUrl::parse(&format!(
        "postgres://ops:s3cret@127.0.0.1:{}",
        pg.port()
    ))
    .unwrap();
    let memo = spawn_pgmemo(config).await.unwrap();
    let app = memo.client("postgres", "postgres").await;
    app.simple_query("SELECT 1").await.unwrap();

    let console = admin(&memo, "postgres").await.expect("superuser gets in");
    // The console's own login takes no place of that pool: only the application holds one.
    let app_pool = || async {
        rows(&console, "SHOW POOLS")
            .await
            .into_iter()
            .find(|r| value(r, "database") == "postgres" && value(r, "user") == "postgres")
            .expect("the application's pool is listed")
    };
    testkit::assert_eventually(
        std::time::Duration::from_secs(10),
        "SHOW POOLS counts the application's client",
        || async { value(&app_pool().await, "clients") == "1" },
    )
    .await;
    assert_eq!(value(&app_pool().await, "pool_size"), "20");

    let clients = rows(&console, "show clients;").await;
    assert!(clients
        .iter()
        .any(|r| value(r, "database") == "postgres" && value(r, "admin") == "false"));
    assert!(clients
        .iter()
        .any(|r| value(r, "database") == "pgmemo" && value(r, "admin") == "true"));

    let stats = rows(&console, "SHOW STATS").await;
    let accepted = stats
        .iter()
        .find(|r| value(r, "name") == "clients_accepted")
        .expect("clients_accepted counter");
    assert!(value(accepted, "value").parse::<u64>().unwrap() >= 2);

    let config = rows(&console, "SHOW CONFIG").await;
    let upstream = config
        .iter()
        .find(|r| value(r, "key") == "upstream")
        .expect("upstream setting");
    assert!(
        !value(upstream, "value").contains("s3cret"),
        "password shown"
    );

    let version = rows(&console, "SHOW VERSION").await;
    assert!(value(&version[0], "version").starts_with("pgmemo "));
    assert!(!rows(&console, "SHOW HELP").await.is_empty());

    let err = console.simple_query("SELECT 1").await.unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::SYNTAX_ERROR));
    // The extended protocol is refused with a clear error, and the session goes on.
    let err = console.query("SHOW POOLS", &[]).await.unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::FEATURE_NOT_SUPPORTED));
    assert!(!rows(&console, "SHOW POOLS").await.is_empty());
}

#[tokio::test]
async fn non_superusers_are_refused_with_42501() {
    let pg = cluster().await;
    let memo = spawn_pgmemo(pgmemo_config_for(pg.port())).await.unwrap();
    let Err(err) = admin(&memo, "plain_user").await else {
        panic!("plain_user got into the console")
    };
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{err}");
    // The refusal does not affect normal use by the same role.
    let client = memo.client("plain_user", "postgres").await;
    client.simple_query("SELECT 1").await.unwrap();
}

/// The superuser check cannot be fooled by the role's own search_path: a `pg_roles` view in
/// a schema searched before pg_catalog that claims the role is a superuser changes nothing.
#[tokio::test]
async fn a_role_cannot_fake_being_a_superuser_with_its_search_path() {
    let pg = cluster().await;
    pg.psql(
        "CREATE SCHEMA evil AUTHORIZATION plain_user; \
         CREATE VIEW evil.pg_roles AS SELECT true AS rolsuper, name 'plain_user' AS rolname; \
         ALTER VIEW evil.pg_roles OWNER TO plain_user; \
         ALTER ROLE plain_user SET search_path = evil, pg_catalog;",
    )
    .await;
    let memo = spawn_pgmemo(pgmemo_config_for(pg.port())).await.unwrap();
    // The view is what the role sees.
    let client = memo.client("plain_user", "postgres").await;
    let faked = client
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .unwrap();
    assert!(faked.get::<_, bool>(0));
    let Err(err) = admin(&memo, "plain_user").await else {
        panic!("plain_user got into the console with a pg_roles view of its own")
    };
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{err}");
}

#[tokio::test]
async fn admin_users_replaces_the_superuser_rule() {
    let pg = cluster().await;
    let mut config = pgmemo_config_for(pg.port());
    config.admin_users = vec!["ops".to_owned()];
    let memo = spawn_pgmemo(config).await.unwrap();
    let console = admin(&memo, "ops").await.expect("listed role gets in");
    assert!(!rows(&console, "SHOW STATS").await.is_empty());
    let Err(err) = admin(&memo, "postgres").await else {
        panic!("unlisted superuser got into the console")
    };
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));
}

#[tokio::test]
async fn reload_applies_the_configuration_source() {
    let pg = cluster().await;
    let base = pgmemo_config_for(pg.port());
    let memo = spawn_pgmemo(base.clone()).await.unwrap();
    let console = admin(&memo, "postgres").await.unwrap();
    // Without a configuration source there is nothing to reload from.
    let err = console.simple_query("RELOAD").await.unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::CONFIG_FILE_ERROR), "{err}");

    let setting = |config: &[Vec<(String, Option<String>)>], key: &str| {
        let row = config
            .iter()
            .find(|r| value(r, "key") == key)
            .unwrap_or_else(|| panic!("{key} setting"));
        value(row, "value").to_owned()
    };
    let before = rows(&console, "SHOW CONFIG").await;
    let mut next = base.clone();
    next.pool_size = 7;
    // Settings that need a restart keep their running values (and a warning names them).
    next.cache_size = pgmemo::config::ByteSize(base.cache_size.0 * 2);
    next.worker_threads = base.worker_threads + 3;
    next.shutdown_timeout = pgmemo::config::Seconds(base.shutdown_timeout.0 * 2);
    memo.handle()
        .set_reloader(Arc::new(move || Ok(next.clone())));
    console.simple_query("RELOAD").await.expect("RELOAD works");
    let config = rows(&console, "SHOW CONFIG").await;
    assert_eq!(setting(&config, "pool_size"), "7");
    for key in ["cache_size", "worker_threads", "shutdown_timeout"] {
        assert_eq!(setting(&config, key), setting(&before, key), "{key}");
    }
}

/// A configuration that cannot be applied (here an `auth_file` that does not exist) is
/// refused as a whole: `RELOAD` reports the error, and neither the settings nor the log
/// filter change. An accepted one switches the log filter to its `log_level`.
#[tokio::test]
async fn a_refused_reload_changes_nothing_not_even_the_log_level() {
    let pg = cluster().await;
    let base = pgmemo_config_for(pg.port());
    let memo = spawn_pgmemo(base.clone()).await.unwrap();
    let applied = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let record = applied.clone();
    memo.handle().set_log_applier(Arc::new(move |level: &str| {
        record.lock().unwrap().push(level.to_owned())
    }));
    let console = admin(&memo, "postgres").await.unwrap();
    let mut bad = base.clone();
    bad.pool_size = 7;
    bad.log_level = "trace".to_owned();
    bad.auth_type = pgmemo::config::AuthType::Md5;
    bad.auth_file = Some("/nonexistent/pgmemo/userlist.txt".into());
    memo.handle()
        .set_reloader(Arc::new(move || Ok(bad.clone())));
    let err = console.simple_query("RELOAD").await.unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::CONFIG_FILE_ERROR), "{err}");
    let message = err.as_db_error().map(|e| e.message().to_owned());
    assert!(
        message.as_deref().is_some_and(|m| m.contains("userlist")),
        "{message:?}"
    );
    assert_eq!(memo.handle().shared().config().pool_size, base.pool_size);
    assert!(applied.lock().unwrap().is_empty(), "log filter changed");
    let mut good = base.clone();
    good.log_level = "debug".to_owned();
    memo.handle()
        .set_reloader(Arc::new(move || Ok(good.clone())));
    console.simple_query("RELOAD").await.expect("RELOAD works");
    assert_eq!(*applied.lock().unwrap(), ["debug"]);
}

/// The admin console checks a login's role on a pooled server. In transaction pooling that
/// server goes back as it was: pgmemo tracks the statements it prepared there and the settings
/// it replayed, and a reset query (`DISCARD ALL`) behind the tracking's back made the next
/// Bind fail with "prepared statement does not exist" and lost the client's settings.
#[tokio::test]
async fn an_admin_login_leaves_a_transaction_pooled_server_as_it_was() {
    let pg = cluster().await;
    let mut config = pgmemo_config_for(pg.port());
    config.pool_mode = pgmemo::config::PoolMode::Transaction;
    // One server: the console's check borrows the very connection the app uses.
    config.pool_size = 1;
    let memo = spawn_pgmemo(config).await.unwrap();
    let app = memo.client("postgres", "postgres").await;
    let pid = backend_pid(&app).await;
    let stmt = app.prepare("SELECT $1::int + 1").await.unwrap();
    assert_eq!(
        app.query_one(&stmt, &[&1i32])
            .await
            .unwrap()
            .get::<_, i32>(0),
        2
    );
    app.batch_execute("SET application_name = 'kept'")
        .await
        .unwrap();
    let show_app_name = || async {
        app.query_one("SHOW application_name", &[])
            .await
            .unwrap()
            .get::<_, String>(0)
    };
    assert_eq!(show_app_name().await, "kept");

    let console = admin(&memo, "postgres").await.unwrap();
    rows(&console, "SHOW VERSION").await;

    assert_eq!(backend_pid(&app).await, pid, "the same server");
    let after = app.query_one(&stmt, &[&41i32]).await;
    assert_eq!(after.unwrap().get::<_, i32>(0), 42);
    assert_eq!(show_app_name().await, "kept");
}

/// The console's login takes no place in the pool it checks the role with: with a pool of
/// one held by a session, in both pool modes (transaction pooling with the session inside a
/// transaction), `SHOW POOLS` still answers, and the session's server is untouched.
#[tokio::test]
async fn the_console_answers_while_the_pool_is_full() {
    let pg = cluster().await;
    for mode in [
        pgmemo::config::PoolMode::Session,
        pgmemo::config::PoolMode::Transaction,
    ] {
        let mut config = pgmemo_config_for(pg.port());
        config.pool_mode = mode;
        config.pool_size = 1;
        config.query_wait_timeout = pgmemo::config::Seconds(std::time::Duration::from_secs(120));
        let memo = spawn_pgmemo(config).await.unwrap();
        let app = memo.client("postgres", "postgres").await;
        app.batch_execute("BEGIN").await.unwrap();
        let pid = backend_pid(&app).await;
        let console = tokio::time::timeout(std::time::Duration::from_secs(20), async {
            let console = admin(&memo, "postgres").await.expect("superuser gets in");
            rows(&console, "SHOW POOLS").await;
            console
        })
        .await
        .unwrap_or_else(|_| panic!("{mode:?}: the console waited for the pool's place"));
        assert!(!rows(&console, "SHOW VERSION").await.is_empty());
        assert_eq!(backend_pid(&app).await, pid, "{mode:?}: the same server");
        app.batch_execute("COMMIT").await.unwrap();
    }
}

/// The row of `SHOW SERVERS` for the server process `pid`, if listed.
async fn server_row(console: &Client, pid: i32) -> Option<Vec<(String, Option<String>)>> {
    rows(console, "SHOW SERVERS")
        .await
        .into_iter()
        .find(|r| value(r, "pid") == pid.to_string())
}

/// Session pooling: the connection a client holds is listed as active with the server's own
/// process id, and as idle once the client left and the reset query ran.
#[tokio::test]
async fn show_servers_follows_a_session_connection_from_active_to_idle() {
    let pg = cluster().await;
    let memo = spawn_pgmemo(pgmemo_config_for(pg.port())).await.unwrap();
    let console = admin(&memo, "postgres").await.unwrap();
    let app = memo.client("postgres", "postgres").await;
    let pid = backend_pid(&app).await;

    let row = server_row(&console, pid)
        .await
        .expect("the app's server is listed");
    assert_eq!(value(&row, "state"), "active");
    assert_eq!(value(&row, "database"), "postgres");
    assert_eq!(value(&row, "user"), "postgres");
    assert_eq!(value(&row, "server"), format!("127.0.0.1:{}", pg.port()));
    assert_eq!(value(&row, "tls"), "false");

    drop(app);
    testkit::assert_eventually(
        std::time::Duration::from_secs(10),
        "the connection is idle in its pool once the client left",
        || async {
            server_row(&console, pid)
                .await
                .is_some_and(|r| value(&r, "state") == "idle")
        },
    )
    .await;
    assert!(rows(&console, "SHOW HELP")
        .await
        .iter()
        .any(|r| value(r, "command") == "SHOW SERVERS"));

    // Seconds in a state count from the state's start, not from the connection's.
    let seconds = |row: &[(String, Option<String>)], column: &str| -> u64 {
        value(row, column).parse().unwrap()
    };
    let idle = testkit::eventually_some(std::time::Duration::from_secs(10), || async {
        server_row(&console, pid)
            .await
            .filter(|r| value(r, "state") == "idle" && seconds(r, "state_seconds") >= 1)
    })
    .await
    .expect("the idle row's state_seconds reaches 1");
    assert!(seconds(&idle, "connected_seconds") >= seconds(&idle, "state_seconds"));
    let again = memo.client("postgres", "postgres").await;
    assert_eq!(backend_pid(&again).await, pid, "the idle server is reused");
    let row = server_row(&console, pid).await.expect("listed");
    assert_eq!(value(&row, "state"), "active");
    assert!(
        seconds(&row, "state_seconds") < seconds(&row, "connected_seconds"),
        "a fresh state starts from zero: {row:?}"
    );
}

/// Transaction pooling: between transactions the connection is idle in the pool, and it
/// carries the statements pgmemo prepared on it for the client, with their hits and misses;
/// a connection pgmemo closes leaves the list.
#[tokio::test]
async fn show_servers_counts_prepared_statements_in_transaction_pooling() {
    let pg = cluster().await;
    let mut config = pgmemo_config_for(pg.port());
    config.pool_mode = pgmemo::config::PoolMode::Transaction;
    config.pool_size = 1;
    let memo = spawn_pgmemo(config).await.unwrap();
    let console = admin(&memo, "postgres").await.unwrap();
    let app = memo.client("postgres", "postgres").await;
    let pid = backend_pid(&app).await;
    let stmt = app.prepare("SELECT $1::int + 1").await.unwrap();
    for i in 0..3 {
        let row = app.query_one(&stmt, &[&i]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), i + 1);
    }

    // The client has its answer a moment before its server is back in the pool with its
    // counts noted: polled, not read once.
    let counts = |row: &[(String, Option<String>)]| {
        ["prepared_statements", "prepared_hits", "prepared_misses"]
            .map(|c| value(row, c).parse::<u64>().unwrap())
    };
    let row = testkit::eventually_some(std::time::Duration::from_secs(10), || async {
        let row = server_row(&console, pid).await?;
        let [statements, hits, misses] = counts(&row);
        // The client's statement, prepared once and executed three times; idle between
        // transactions.
        (value(&row, "state") == "idle" && statements >= 1 && misses >= 1 && hits >= 2)
            .then_some(row)
    })
    .await;
    assert!(
        row.is_some(),
        "no idle row with the prepared statement's counts: {:?}",
        server_row(&console, pid).await
    );

    // A server that goes away is closed at its next use and unlisted.
    let direct = pg.client("postgres", "postgres").await;
    direct
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    let _ = app.simple_query("SELECT 1").await;
    testkit::assert_eventually(
        std::time::Duration::from_secs(10),
        "the terminated server leaves SHOW SERVERS",
        || async { server_row(&console, pid).await.is_none() },
    )
    .await;
}

/// With pgmemo's own authentication, the console asks the server whether the client's role
/// is a superuser, not the role a `[databases]` entry logs the connection in as: here every
/// listed user reaches the server as `postgres`, yet only `postgres` gets the console.
#[tokio::test]
async fn a_mapped_server_user_does_not_make_a_client_an_admin() {
    let pg = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let userlist = dir.path().join("userlist.txt");
    std::fs::write(&userlist, "\"plain_user\" \"\"\n\"postgres\" \"\"\n").unwrap();
    let mut config = pgmemo_config_for(pg.port());
    config.auth_type = pgmemo::config::AuthType::Trust;
    config.auth_file = Some(userlist);
    config.databases.insert(
        "postgres".to_owned(),
        pgmemo::config::DatabaseConfig {
            user: Some("postgres".to_owned()),
            ..Default::default()
        },
    );
    let memo = spawn_pgmemo(config).await.unwrap();
    let Err(err) = admin(&memo, "plain_user").await else {
        panic!("plain_user got into the console through the mapping")
    };
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));
    let console = admin(&memo, "postgres").await.expect("a superuser gets in");
    assert!(!rows(&console, "SHOW STATS").await.is_empty());
}

/// With relayed authentication the server checks the role a `[databases]` entry maps the
/// client's name to: a listed admin name mapped to an unlisted role does not get the console.
#[tokio::test]
async fn a_listed_admin_name_mapped_to_another_role_is_refused() {
    let pg = cluster().await;
    let mut config = pgmemo_config_for(pg.port());
    config.admin_users = vec!["ops".to_owned(), "postgres".to_owned()];
    config.databases.insert(
        "postgres".to_owned(),
        pgmemo::config::DatabaseConfig {
            user: Some("app_role".to_owned()),
            ..Default::default()
        },
    );
    pg.psql("CREATE ROLE app_role LOGIN").await;
    let memo = spawn_pgmemo(config).await.unwrap();
    let Err(err) = admin(&memo, "ops").await else {
        panic!("ops got into the console as app_role")
    };
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));
}

/// SHOW STATS counts what its rows name: failed logins, waits for a pool place that timed
/// out, server connections opened, and in transaction pooling prepared-statement hits and
/// misses on the servers.
#[tokio::test]
async fn show_stats_counts_failures_waits_and_prepared_statements() {
    let pg = cluster().await;
    let stat = |rows: &[Vec<(String, Option<String>)>], name: &str| -> u64 {
        let row = rows
            .iter()
            .find(|r| value(r, "name") == name)
            .unwrap_or_else(|| panic!("no {name} in SHOW STATS"));
        value(row, "value").parse().unwrap()
    };
    let mut config = pgmemo_config_for(pg.port());
    config.pool_size = 1;
    config.query_wait_timeout = pgmemo::config::Seconds(std::time::Duration::from_millis(200));
    let memo = spawn_pgmemo(config).await.unwrap();
    let console = admin(&memo, "postgres").await.unwrap();
    let before = rows(&console, "SHOW STATS").await;
    let e = tokio_postgres::connect(&memo.url("postgres", "no_such_db"), tokio_postgres::NoTls)
        .await
        .err()
        .expect("no such database");
    assert_eq!(e.code(), Some(&SqlState::INVALID_CATALOG_NAME), "{e}");
    let holder = memo.client("postgres", "postgres").await;
    holder.simple_query("SELECT 1").await.unwrap();
    let waited = tokio_postgres::connect(&memo.url("postgres", "postgres"), tokio_postgres::NoTls)
        .await
        .err()
        .expect("the only place is taken");
    assert!(waited.code().is_some(), "{waited}");
    let after = rows(&console, "SHOW STATS").await;
    for (name, at_least) in [
        ("login_failures", 2),
        ("pool_wait_timeouts", 1),
        ("server_connects", 1),
    ] {
        assert!(
            stat(&after, name) >= stat(&before, name) + at_least,
            "{name}: {} -> {}",
            stat(&before, name),
            stat(&after, name)
        );
    }
    drop(holder);

    let mut config = pgmemo_config_for(pg.port());
    config.pool_mode = pgmemo::config::PoolMode::Transaction;
    config.pool_size = 1;
    let memo = spawn_pgmemo(config).await.unwrap();
    let console = admin(&memo, "postgres").await.unwrap();
    let c = memo.client("postgres", "postgres").await;
    let statement = c.prepare("SELECT $1::int + 1").await.unwrap();
    for i in 0..3 {
        c.query_one(&statement, &[&i]).await.unwrap();
    }
    let stats = rows(&console, "SHOW STATS").await;
    assert!(stat(&stats, "prepared_misses") >= 1);
    assert!(stat(&stats, "prepared_hits") >= 1);
}

//! TCP keepalive and user timeout (`tcp_keepalive`, `tcp_keepidle`, `tcp_keepintvl`,
//! `tcp_keepcnt`, `tcp_user_timeout`): a peer that vanishes without closing its connection is
//! noticed. The peer sits in a network namespace behind a veth pair (`testkit::IsolatedLink`)
//! whose link is then cut, so nothing more arrives from it, not even a reset: without these
//! options pgmemo would wait for it for hours (or, with data unacknowledged, 15 minutes).

use std::net::SocketAddr;
use std::time::Duration;

use pgmemo::config::{Seconds, Switch};
use pgmemo::Config;
use testkit::{
    assert_eventually, connect_watched, free_port, pg_bin, pg_sleep_running, pgmemo_config_for,
    rows, scrub_pg_env, spawn_pgmemo, sqlstate, within, IsolatedLink, PgmemoInstance, TempPostgres,
};
use tokio_postgres::Client;

const USER: &str = "postgres";
const DB: &str = "postgres";

/// Far longer than the options below need (about 3 s), far shorter than the minutes or hours a
/// vanished peer goes unnoticed without them.
const NOTICED: Duration = Duration::from_secs(30);

/// Probes after 1 s of quiet, 1 s apart; two unanswered ones drop the connection.
fn quick_keepalive(config: &mut Config) {
    config.tcp_keepalive = Switch::On;
    config.tcp_keepidle = Seconds(Duration::from_secs(1));
    config.tcp_keepintvl = Seconds(Duration::from_secs(1));
    config.tcp_keepcnt = 2;
}

/// A link, and a throwaway cluster behind it: pgmemo reaches the cluster through a forwarder
/// in the namespace. Returns the address pgmemo must use as its upstream.
async fn cluster_behind_link() -> (IsolatedLink, TempPostgres, SocketAddr) {
    let mut link = IsolatedLink::create()
        .await
        .expect("a network namespace (needs root and iproute2)");
    let pg = TempPostgres::builder()
        .conf(format!(
            "listen_addresses = '127.0.0.1, {}'",
            link.host_addr()
        ))
        .hba(format!("host all all {} trust", link.cidr()))
        .start()
        .await
        .expect("a throwaway cluster starts");
    let via = link
        .forward(free_port(), SocketAddr::from((link.host_addr(), pg.port())))
        .await
        .unwrap();
    (link, pg, via)
}

/// pgmemo (cache off) in front of `upstream`, with `tweak` applied.
async fn pgmemo_to(upstream: SocketAddr, tweak: impl FnOnce(&mut Config)) -> PgmemoInstance {
    let mut config = pgmemo_config_for(upstream.port());
    config.upstream =
        pgmemo::config::UpstreamUrl::parse(&format!("postgres://{upstream}")).unwrap();
    config.cache = Switch::Off;
    tweak(&mut config);
    spawn_pgmemo(config).await.unwrap()
}

/// Whether this host has a TCP connection to `peer` (an address, with or without a port)
/// whose keepalive timer runs: keepalive is on and nothing sent is waiting for an
/// acknowledgement (a retransmission timer would show instead), so the connection is quiet and
/// only keepalive can tell that the peer is gone.
async fn quiet_with_keepalive(peer: String) -> bool {
    let out = tokio::process::Command::new("ss")
        .args(["-tnoH", "dst", &peer])
        .output()
        .await
        .expect("ss (package iproute2) runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.contains("timer:(keepalive"))
}

/// A client through pgmemo with its application name; its session holds a server already.
async fn client_with_server(pgmemo: &PgmemoInstance, name: &str) -> Client {
    let url = format!("{}?application_name={name}", pgmemo.url(USER, DB));
    let (client, _connection) = connect_watched(&url).await;
    client.simple_query("SELECT 1").await.unwrap();
    client
}

/// The server is cut off while a query runs on it, after the query reached it: the
/// connection is quiet, keepalive finds the server gone and the client's query fails with
/// 08006 instead of waiting forever.
#[tokio::test]
async fn a_server_that_vanishes_during_a_query_fails_it_by_keepalive() {
    let (link, pg, via) = cluster_behind_link().await;
    let pgmemo = pgmemo_to(via, quick_keepalive).await;
    let client = client_with_server(&pgmemo, "keepalive_server").await;
    let direct = pg.client(USER, DB).await;
    let sleeping = tokio::spawn(async move { client.simple_query("SELECT pg_sleep(600)").await });
    assert_eventually(NOTICED, "the query runs on the server", || {
        pg_sleep_running(&direct, "keepalive_server")
    })
    .await;
    assert_eventually(
        NOTICED,
        "pgmemo's server connection is quiet, keepalive on",
        || quiet_with_keepalive(via.to_string()),
    )
    .await;

    link.cut().await.unwrap();
    let e = within(NOTICED, sleeping)
        .await
        .unwrap()
        .expect_err("the server is gone");
    assert_eq!(sqlstate(&e), Some("08006"), "{e:?}");
    pgmemo.shutdown().await;
}

/// The server is cut off before the client's next query reaches it: the query stays
/// unacknowledged, which keepalive does not cover; `tcp_user_timeout` ends the connection and
/// the client gets 08006.
#[tokio::test]
async fn a_query_sent_to_a_vanished_server_fails_by_tcp_user_timeout() {
    let (link, _pg, via) = cluster_behind_link().await;
    let pgmemo = pgmemo_to(via, |c| {
        c.tcp_keepalive = Switch::Off;
        c.tcp_user_timeout = Seconds(Duration::from_secs(2));
    })
    .await;
    let client = client_with_server(&pgmemo, "user_timeout").await;

    link.cut().await.unwrap();
    let e = within(NOTICED, client.simple_query("SELECT 2"))
        .await
        .expect_err("the server is gone");
    assert_eq!(sqlstate(&e), Some("08006"), "{e:?}");
    pgmemo.shutdown().await;
}

/// A client in the namespace is cut off while its query runs: keepalive finds it gone and its
/// session ends (it leaves `SHOW CLIENTS`; its server is not given to anyone dirty).
#[tokio::test]
async fn a_client_that_vanishes_without_closing_is_let_go() {
    let link = IsolatedLink::create()
        .await
        .expect("a network namespace (needs root and iproute2)");
    let pg = TempPostgres::start().await.unwrap();
    let mut config = pgmemo_config_for(pg.port());
    config.listen = SocketAddr::from((link.host_addr(), free_port()));
    config.cache = Switch::Off;
    quick_keepalive(&mut config);
    let pgmemo = spawn_pgmemo(config).await.unwrap();

    let mut psql = link.command(pg_bin("psql"));
    scrub_pg_env(&mut psql);
    psql.args(["-X", "-h", &link.host_addr().to_string()])
        .args(["-p", &pgmemo.port().to_string(), "-U", USER, "-d", DB])
        .args(["-c", "SELECT pg_sleep(600)"])
        .env("PGAPPNAME", "keepalive_client")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let _psql = psql.spawn().expect("psql starts in the namespace");
    let direct = pg.client(USER, DB).await;
    assert_eventually(NOTICED, "the client's query runs on the server", || {
        pg_sleep_running(&direct, "keepalive_client")
    })
    .await;
    let console = pgmemo.client(USER, "pgmemo").await;
    let client_listed = || async {
        let shown = rows(&console.simple_query("SHOW CLIENTS").await.unwrap());
        let inner = link.inner_addr().to_string();
        shown
            .iter()
            .any(|r| r[0].as_deref().is_some_and(|a| a.starts_with(&inner)))
    };
    assert!(client_listed().await, "the client is in SHOW CLIENTS");
    // pgmemo's end of the client's connection is this host's only one to the namespace.
    assert_eventually(
        NOTICED,
        "pgmemo's client connection is quiet, keepalive on",
        || quiet_with_keepalive(link.inner_addr().to_string()),
    )
    .await;

    link.cut().await.unwrap();
    assert_eventually(
        NOTICED,
        "the vanished client leaves SHOW CLIENTS",
        || async { !client_listed().await },
    )
    .await;
    pgmemo.shutdown().await;
}

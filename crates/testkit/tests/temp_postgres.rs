//! TempPostgres end to end: parallel clusters with their own settings, stop/start on the same
//! port, and cleanup on drop.

use std::time::Duration;

use testkit::{assert_eventually, pid_alive, TempPostgres};

async fn show(pg: &TempPostgres, setting: &str) -> String {
    let client = pg.client("postgres", "postgres").await;
    let row = client
        .query_one(&format!("SHOW {setting}"), &[])
        .await
        .unwrap();
    row.get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_clusters_stop_restart_and_clean_up() -> anyhow::Result<()> {
    let (a, b) = tokio::try_join!(
        TempPostgres::builder().conf("work_mem = '7MB'").start(),
        TempPostgres::builder().conf("work_mem = '9MB'").start(),
    )?;
    assert_ne!(a.port(), b.port());
    assert_eq!(show(&a, "work_mem").await, "7MB");
    assert_eq!(show(&b, "work_mem").await, "9MB");
    assert_eq!(a.psql("SHOW work_mem").await, "7MB");
    assert_eq!(
        a.psql("CREATE TABLE t (x int); INSERT INTO t VALUES (1), (2);")
            .await,
        ""
    );
    assert_eq!(a.psql("SELECT x FROM t ORDER BY x").await, "1\n2");

    // Stopped: connections are refused, the other cluster is unaffected.
    let port = a.port();
    a.stop().await?;
    assert_eq!(a.postmaster_pid(), None);
    assert!(a.try_client("postgres", "postgres").await.is_err());
    assert_eq!(show(&b, "work_mem").await, "9MB");

    // Started again: same port, same data.
    a.start_again().await?;
    assert_eq!(a.port(), port);
    assert_eq!(a.psql("SELECT count(*) FROM t").await, "2");

    // restart() cuts existing connections.
    let old = a.client("postgres", "postgres").await;
    a.restart().await?;
    assert!(old.simple_query("SELECT 1").await.is_err());
    assert_eq!(show(&a, "work_mem").await, "7MB");

    // Drop: the postmaster is gone and the directory removed.
    let pid = a.postmaster_pid().expect("running");
    let dir = a.root_dir().to_owned();
    assert!(dir.exists());
    drop(a);
    assert!(!pid_alive(pid));
    assert!(!dir.exists());
    assert_eventually(Duration::from_secs(5), "port released", || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
    })
    .await;
    Ok(())
}

#[tokio::test]
async fn custom_hba_rules_come_first() -> anyhow::Result<()> {
    let pg = TempPostgres::builder()
        .hba("host all alice 127.0.0.1/32 scram-sha-256")
        .start()
        .await?;
    pg.psql("CREATE ROLE alice LOGIN PASSWORD 'secret'").await;
    assert!(
        pg.try_client("alice", "postgres").await.is_err(),
        "password required"
    );
    let url = pg.url_with_password("alice", "secret", "postgres");
    let alice = testkit::connect(&url).await?;
    let row = alice.query_one("SELECT current_user::text", &[]).await?;
    assert_eq!(row.get::<_, String>(0), "alice");
    // Everyone else falls through to the trust rule.
    pg.client("postgres", "postgres").await;
    Ok(())
}

#[tokio::test]
async fn no_default_trust_leaves_only_the_given_rules() -> anyhow::Result<()> {
    let pg = TempPostgres::builder()
        .hba("host all all 127.0.0.1/32 scram-sha-256")
        .no_default_trust()
        .start()
        .await?;
    assert_eq!(
        pg.psql("SELECT 1").await,
        "1",
        "psql still works over the socket"
    );
    pg.psql("ALTER ROLE postgres PASSWORD 'pw'").await;
    assert!(pg.try_client("postgres", "postgres").await.is_err());
    testkit::connect(&pg.url_with_password("postgres", "pw", "postgres")).await?;
    Ok(())
}

#[tokio::test]
async fn local_postgres_is_reachable() {
    let client = testkit::LocalPostgres.client("postgres", "postgres").await;
    client.simple_query("SELECT 1").await.unwrap();
    assert_eq!(
        testkit::local_url("test"),
        "postgres://postgres@127.0.0.1:5432/test"
    );
}

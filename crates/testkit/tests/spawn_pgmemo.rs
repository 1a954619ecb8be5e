//! spawn_pgmemo: an in-process pgmemo on its own port in front of the local server.

use testkit::{pgmemo_config_for, spawn_pgmemo, LocalPostgres};

#[tokio::test]
async fn listens_on_a_fresh_port_and_shuts_down() -> anyhow::Result<()> {
    let a = spawn_pgmemo(pgmemo_config_for(LocalPostgres::PORT)).await?;
    // The default listen address (port 6432) is replaced too, so parallel tests never collide.
    let b = spawn_pgmemo(pgmemo::Config {
        upstream: pgmemo_config_for(LocalPostgres::PORT).upstream,
        ..pgmemo::Config::default()
    })
    .await?;
    assert_ne!(a.port(), 0);
    assert_ne!(b.port(), 6432);
    assert_ne!(a.port(), b.port());
    assert_eq!(
        a.url("u", "d"),
        format!("postgres://u@127.0.0.1:{}/d", a.port())
    );
    tokio::net::TcpStream::connect(a.addr()).await?;

    let addr = a.addr();
    a.shutdown().await;
    b.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    Ok(())
}

#[tokio::test]
async fn relays_queries_to_the_upstream() -> anyhow::Result<()> {
    let pgmemo = spawn_pgmemo(pgmemo_config_for(LocalPostgres::PORT)).await?;
    let client = pgmemo.client("postgres", "postgres").await;
    let row = client.query_one("SELECT 40 + 2", &[]).await?;
    assert_eq!(row.get::<_, i32>(0), 42);
    drop(client);
    pgmemo.shutdown().await;
    Ok(())
}

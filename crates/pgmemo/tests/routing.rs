//! Routing of a client's database and user: pass-through by default (one pgmemo serves every
//! database of a server) and `[databases.NAME]` mappings to another database name, server user
//! and password, with their own pool size.

use std::time::Duration;

use pgmemo::config::DatabaseConfig;
use testkit::{pgmemo_config_for, spawn_pgmemo, TempPostgres};

async fn cluster() -> TempPostgres {
    let pg = TempPostgres::builder()
        .conf("password_encryption = 'scram-sha-256'")
        .hba("host all app_owner 127.0.0.1/32 scram-sha-256")
        .start()
        .await
        .expect("cluster starts");
    pg.psql(
        "CREATE ROLE app_owner LOGIN PASSWORD 'owner-secret';
         CREATE DATABASE real_app OWNER app_owner;
         CREATE DATABASE other_db;",
    )
    .await;
    pg
}

#[tokio::test]
async fn client_database_and_user_pass_through() {
    let pg = cluster().await;
    let memo = spawn_pgmemo(pgmemo_config_for(pg.port())).await.unwrap();
    for db in ["postgres", "other_db"] {
        let client = memo.client("postgres", db).await;
        let row = client
            .query_one("SELECT current_database(), current_user", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), db);
        assert_eq!(row.get::<_, String>(1), "postgres");
    }
}

#[tokio::test]
async fn mapped_database_uses_its_name_user_and_password() {
    let pg = cluster().await;
    let mut config = pgmemo_config_for(pg.port());
    // Userlist auth so pgmemo logs in upstream itself, with the mapping's credentials.
    let dir = tempfile::tempdir().unwrap();
    let userlist = dir.path().join("userlist.txt");
    std::fs::write(&userlist, "\"alice\" \"alice-pw\"\n").unwrap();
    config.auth_type = pgmemo::config::AuthType::ScramSha256;
    config.auth_file = Some(userlist);
    config.databases.insert(
        "app".to_owned(),
        DatabaseConfig {
            dbname: Some("real_app".to_owned()),
            user: Some("app_owner".to_owned()),
            password: Some("owner-secret".to_owned()),
            pool_size: Some(1),
            ..DatabaseConfig::default()
        },
    );
    let memo = spawn_pgmemo(config).await.unwrap();
    let client = testkit::connect(&memo.url_with_password("alice", "alice-pw", "app"))
        .await
        .expect("mapped login works");
    let row = client
        .query_one("SELECT current_database(), current_user", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "real_app");
    assert_eq!(row.get::<_, String>(1), "app_owner");

    // The mapping's pool_size overrides the global one for this database's pool.
    let pools = memo.handle().shared().pools.all();
    let pool = pools
        .iter()
        .find(|p| p.key().database == "real_app")
        .expect("pool for the mapped database");
    assert_eq!(pool.size(), 1);
    drop(client);
    // After the first client leaves, its connection is reset and reused.
    testkit::assert_eventually(
        Duration::from_secs(10),
        "pooled connection comes back",
        || async { pool.counts().0 == 1 },
    )
    .await;
    let again = testkit::connect(&memo.url_with_password("alice", "alice-pw", "app"))
        .await
        .expect("second login works");
    assert_eq!(
        again
            .query_one("SELECT current_database()", &[])
            .await
            .unwrap()
            .get::<_, String>(0),
        "real_app"
    );
}

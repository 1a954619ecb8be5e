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

/// Two entries naming one real database are two pools, each with its own `pool_size`
/// (one shared pool took the size of whichever entry logged in last), shown in `SHOW POOLS`
/// under the names clients use.
#[tokio::test]
async fn entries_sharing_a_database_keep_their_own_pool_size() {
    let pg = cluster().await;
    let mut config = pgmemo_config_for(pg.port());
    for (name, size) in [("small", 1), ("large", 3)] {
        config.databases.insert(
            name.to_owned(),
            DatabaseConfig {
                dbname: Some("other_db".to_owned()),
                pool_size: Some(size),
                ..DatabaseConfig::default()
            },
        );
    }
    let memo = spawn_pgmemo(config).await.unwrap();
    let small = memo.client("postgres", "small").await;
    let large = memo.client("postgres", "large").await;
    for client in [&small, &large] {
        let row = client
            .query_one("SELECT current_database()", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), "other_db");
    }
    let sizes: Vec<(String, usize)> = {
        let mut v: Vec<_> = memo
            .handle()
            .shared()
            .pools
            .all()
            .iter()
            .filter(|p| p.key().database == "other_db")
            .map(|p| (p.key().alias.clone(), p.size()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        sizes,
        vec![("large".to_owned(), 3), ("small".to_owned(), 1)],
        "one pool per entry, each with its own size"
    );
    let console = memo.client("postgres", "pgmemo").await;
    let listed: Vec<String> = console
        .simple_query("SHOW POOLS")
        .await
        .unwrap()
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get("database").map(str::to_owned),
            _ => None,
        })
        .collect();
    assert!(
        listed.contains(&"small".to_owned()) && listed.contains(&"large".to_owned()),
        "{listed:?}"
    );
}

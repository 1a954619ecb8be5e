//! Differential scripts: random conversations of two clients, run directly against PostgreSQL
//! and through pgmemo in each pool mode with the result cache on and off, must get the same
//! answers, message for message. The generator (`generate`) covers what applications send:
//! reads the cache may answer, writes that must invalidate them (also through a trigger and a
//! volatile function), transactions at every isolation level, savepoints, settings, SQL-level
//! and protocol-level prepared statements, cursors, errors and pipelines.
//!
//! A failing script is shrunk to a short one that still differs and printed with its seed:
//! `PGMEMO_DIFF_SEED=<seed> cargo test -p pgmemo --test differential` runs that seed alone,
//! `PGMEMO_DIFF_SCRIPTS=<n>` runs more scripts than the default, `PGMEMO_DIFF_SKIP=<n>` starts
//! `n` seeds later (fresh scripts, beyond the ones every run covers).

#[path = "../txn_support/mod.rs"]
mod txn_support;

mod conn;
mod generate;
mod script;

use std::time::Duration;

use pgmemo::config::{CacheAdmission, Invalidation, PoolMode, Switch};
use pgmemo::Config;
use testkit::{pgmemo_config_for, spawn_pgmemo, within, PgmemoInstance, TempPostgres};

use conn::Conn;
use generate::Generator;
use script::{listing, Step};
use txn_support::{side_by_side, DB, USER};

/// Steps per script.
const STEPS: usize = 40;
/// How long a step may wait for its answers before the run counts as hung.
const STEP_WAIT: Duration = Duration::from_secs(5);

/// The schema every script runs against, created afresh before each run.
fn fixtures(prefix: &str) -> String {
    let p = prefix;
    let mut sql = format!(
        "DROP VIEW IF EXISTS {p}_va; DROP TABLE IF EXISTS {p}_ta, {p}_tb, {p}_log CASCADE; \
         DROP SEQUENCE IF EXISTS {p}_sq; \
         CREATE TABLE {p}_log (src text NOT NULL, k int, v int); \
         CREATE SEQUENCE {p}_sq; \
         CREATE OR REPLACE FUNCTION {p}_logged() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN INSERT INTO {p}_log VALUES (TG_ARGV[0], NEW.k, NEW.v); RETURN NEW; END $$; "
    );
    for t in ["ta", "tb"] {
        sql.push_str(&format!(
            "CREATE TABLE {p}_{t} (k int PRIMARY KEY, v int NOT NULL); \
             INSERT INTO {p}_{t} SELECT g, g * 10 FROM generate_series(1, 5) g; \
             CREATE TRIGGER {p}_{t}_logged AFTER INSERT OR UPDATE ON {p}_{t} \
             FOR EACH ROW EXECUTE FUNCTION {p}_logged('{t}'); \
             CREATE OR REPLACE FUNCTION {p}_touch_{t}(int) RETURNS int LANGUAGE sql AS \
             $$ UPDATE {p}_{t} SET v = v + 100 WHERE k = $1 RETURNING v $$; "
        ));
    }
    // A tenant's schema: the same table name, other rows.
    sql.push_str(&format!(
        "CREATE VIEW {p}_va AS SELECT k, v * 2 AS w FROM {p}_ta; \
         DROP SCHEMA IF EXISTS {p}_s2 CASCADE; CREATE SCHEMA {p}_s2; \
         CREATE TABLE {p}_s2.{p}_ta (k int PRIMARY KEY, v int NOT NULL); \
         INSERT INTO {p}_s2.{p}_ta SELECT g, g * 1000 FROM generate_series(1, 5) g;"
    ));
    sql
}

/// A cluster of the test's own: a generated script may crash PostgreSQL itself (see
/// `generate`), which must not take the shared server's other clients with it.
async fn cluster() -> TempPostgres {
    let pg = TempPostgres::start()
        .await
        .expect("a throwaway cluster starts");
    pg.client("postgres", "postgres")
        .await
        .batch_execute(&format!("CREATE DATABASE {DB}"))
        .await
        .expect("create the test database");
    pg
}

/// Waits until `port` lets a client in again after a backend crashed (the postmaster
/// restarts every backend and runs crash recovery first).
async fn recovered(port: u16) {
    let url = testkit::url("127.0.0.1", port, USER, DB);
    let back = testkit::eventually(Duration::from_secs(60), || async {
        match testkit::connect(&url).await {
            Ok(client) => client.simple_query("SELECT 1").await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    assert!(
        back,
        "PostgreSQL on port {port} did not recover within 60 s"
    );
}

async fn reset(port: u16, prefix: &str) {
    let client = testkit::connect(&testkit::url("127.0.0.1", port, USER, DB))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    client
        .batch_execute(&fixtures(prefix))
        .await
        .unwrap_or_else(|e| panic!("fixtures through port {port}: {e:?}"));
}

/// One run of a script: every line each client got, numbered by step, and the transaction
/// status each step left its client in (`None` from the step that got no full answer on).
async fn run(port: u16, steps: &[Step]) -> (Vec<String>, Vec<Option<u8>>) {
    let mut clients = [Conn::login(port).await, Conn::login(port).await];
    let mut transcript = Vec::new();
    let mut statuses = Vec::new();
    for (n, step) in steps.iter().enumerate() {
        let conn = &mut clients[step.who.index()];
        let (lines, end) = conn
            .exchange(&step.bytes(), step.readies(), STEP_WAIT)
            .await;
        for line in lines {
            transcript.push(format!("{n:>3} {:?}| {line}", step.who));
        }
        match end {
            Ok(status) => statuses.push(Some(status)),
            Err(broken) => {
                transcript.push(format!("{n:>3} {:?}| !! {broken:?}", step.who));
                break;
            }
        }
    }
    (transcript, statuses)
}

/// Whether a run kept to the rule of `exclusive` scripts: no client speaks while the other
/// is inside a transaction block.
fn one_block_at_a_time(steps: &[Step], statuses: &[Option<u8>]) -> bool {
    let mut last = [b'I', b'I'];
    for (step, status) in steps.iter().zip(statuses) {
        if last[step.who.other().index()] != b'I' {
            return false;
        }
        last[step.who.index()] = status.unwrap_or(b'I');
    }
    true
}

/// Generates a script against PostgreSQL directly (on `direct`); returns it with its
/// transcript. `None` when PostgreSQL itself gave no answer: PostgreSQL 15.20 crashes on a
/// few scripts (e.g. Execute of an unnamed portal after a failed ROLLBACK TO SAVEPOINT and a
/// multi-statement Query in the aborted block), which say nothing about pgmemo.
async fn generate(
    direct: u16,
    seed: u64,
    prefix: &str,
    exclusive: bool,
) -> Option<(Vec<Step>, Vec<String>)> {
    reset(direct, prefix).await;
    let mut generator = Generator::new(seed, prefix, exclusive);
    let mut clients = [Conn::login(direct).await, Conn::login(direct).await];
    let mut steps = Vec::new();
    let mut transcript = Vec::new();
    for n in 0..STEPS {
        let step = generator.step();
        let conn = &mut clients[step.who.index()];
        let (lines, end) = conn
            .exchange(&step.bytes(), step.readies(), STEP_WAIT)
            .await;
        for line in lines {
            transcript.push(format!("{n:>3} {:?}| {line}", step.who));
        }
        match end {
            Ok(status) => generator.observe(step.who, status),
            Err(broken) => {
                eprintln!(
                    "seed {seed} skipped: PostgreSQL itself gave no answer ({broken:?}) to \
                     step {n}:\n{}",
                    listing(&[steps.clone(), vec![step]].concat())
                );
                drop(clients);
                recovered(direct).await;
                return None;
            }
        }
        steps.push(step);
    }
    Some((steps, transcript))
}

/// A pgmemo configuration scripts run through.
struct Target {
    name: &'static str,
    pgmemo: PgmemoInstance,
}

async fn target(
    direct: u16,
    name: &'static str,
    mode: PoolMode,
    pool_size: usize,
    cache: Switch,
) -> Target {
    tweaked_target(direct, name, mode, pool_size, cache, |_| {}).await
}

/// [`target`] with more of its configuration changed.
async fn tweaked_target(
    direct: u16,
    name: &'static str,
    mode: PoolMode,
    pool_size: usize,
    cache: Switch,
    tweak: impl FnOnce(&mut Config),
) -> Target {
    let mut config = Config {
        pool_mode: mode,
        pool_size,
        cache,
        cache_admission: CacheAdmission::Always,
        invalidation: Invalidation::Proxy,
        ..pgmemo_config_for(direct)
    };
    tweak(&mut config);
    let pgmemo = spawn_pgmemo(config).await.expect("pgmemo starts");
    Target { name, pgmemo }
}

/// Runs `steps` through `target` (fixtures made afresh through it, so that pgmemo sees them).
async fn through(target: &Target, prefix: &str, steps: &[Step]) -> Vec<String> {
    reset(target.pgmemo.port(), prefix).await;
    run(target.pgmemo.port(), steps).await.0
}

/// Drops steps while the script still differs through `target`, a few at a time, then one by
/// one: what is left is what a regression test needs. A smaller script counts only when its
/// direct run is complete and, for `exclusive` scripts, keeps to one block at a time.
async fn shrink(
    direct: u16,
    target: &Target,
    prefix: &str,
    exclusive: bool,
    mut steps: Vec<Step>,
) -> (Vec<Step>, String) {
    let mut chunk = steps.len() / 2;
    while chunk >= 1 {
        let mut at = 0;
        while at < steps.len() {
            let mut candidate = steps.clone();
            candidate.drain(at..(at + chunk).min(candidate.len()));
            reset(direct, prefix).await;
            let (answers, statuses) = run(direct, &candidate).await;
            let valid = statuses.len() == candidate.len()
                && (!exclusive || one_block_at_a_time(&candidate, &statuses));
            if valid && answers != through(target, prefix, &candidate).await {
                steps = candidate;
            } else {
                at += chunk;
            }
        }
        chunk /= 2;
    }
    reset(direct, prefix).await;
    let (answers, _) = run(direct, &steps).await;
    let proxied = through(target, prefix, &steps).await;
    (steps, side_by_side(&answers, &proxied))
}

/// The first lines where two transcripts part, with a little context.
fn first_difference(direct: &[String], proxied: &[String]) -> String {
    let at = direct
        .iter()
        .zip(proxied)
        .position(|(d, p)| d != p)
        .unwrap_or(direct.len().min(proxied.len()));
    let from = at.saturating_sub(3);
    let to = (at + 4).min(direct.len().max(proxied.len()));
    side_by_side(
        direct.get(from..to.min(direct.len())).unwrap_or_default(),
        proxied.get(from..to.min(proxied.len())).unwrap_or_default(),
    )
}

/// The fixtures' name prefix, one per test (each has a cluster of its own, so a printed
/// script names the same tables in every run).
fn prefix(test: &str) -> String {
    format!("d{test}")
}

/// A whole test's limit: longer when asked to collect every failure (each is shrunk).
fn deadline() -> Duration {
    if std::env::var_os("PGMEMO_DIFF_KEEP_GOING").is_some() {
        Duration::from_secs(4 * 3600)
    } else {
        Duration::from_secs(600)
    }
}

fn seeds(first: u64, default_count: u64) -> Vec<u64> {
    if let Ok(seed) = std::env::var("PGMEMO_DIFF_SEED") {
        return vec![seed.parse().expect("PGMEMO_DIFF_SEED is a number")];
    }
    let count = std::env::var("PGMEMO_DIFF_SCRIPTS")
        .ok()
        .map(|n| n.parse().expect("PGMEMO_DIFF_SCRIPTS is a number"))
        .unwrap_or(default_count);
    let skip: u64 = std::env::var("PGMEMO_DIFF_SKIP")
        .ok()
        .map(|n| n.parse().expect("PGMEMO_DIFF_SKIP is a number"))
        .unwrap_or(0);
    (first + skip..first + skip + count).collect()
}

/// Runs scripts from `seeds` through every target; fails with the first shrunk difference
/// (with `PGMEMO_DIFF_KEEP_GOING` set, with all of them, one per seed, at the end).
/// `PGMEMO_DIFF_ONLY=text` runs only the targets whose name holds the text.
async fn differential(
    direct: u16,
    prefix: &str,
    exclusive: bool,
    targets: Vec<Target>,
    seeds: Vec<u64>,
) {
    let targets: Vec<Target> = match std::env::var("PGMEMO_DIFF_ONLY") {
        Ok(only) => targets
            .into_iter()
            .filter(|t| t.name.contains(&only))
            .collect(),
        Err(_) => targets,
    };
    if let Ok(filter) = std::env::var("PGMEMO_DIFF_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
    let keep_going = std::env::var_os("PGMEMO_DIFF_KEEP_GOING").is_some();
    let mut failures = Vec::new();
    for seed in seeds {
        let Some((steps, answers)) = generate(direct, seed, prefix, exclusive).await else {
            continue;
        };
        if std::env::var_os("PGMEMO_DIFF_PRINT").is_some() {
            eprintln!("seed {seed}:\n{}", listing(&steps));
        }
        for target in &targets {
            let proxied = through(target, prefix, &steps).await;
            if answers != proxied {
                let first = if std::env::var_os("PGMEMO_DIFF_FULL").is_some() {
                    side_by_side(&answers, &proxied)
                } else {
                    first_difference(&answers, &proxied)
                };
                // The same script again: a difference that does not come back is a race,
                // which shrinking cannot follow.
                let again = through(target, prefix, &steps).await;
                let (small, diff) = if again == answers {
                    (
                        steps.clone(),
                        "(not shrunk: the second run matched)".to_owned(),
                    )
                } else {
                    shrink(direct, target, prefix, exclusive, steps.clone()).await
                };
                let failure = format!(
                    "seed {seed} ({}): answers differ from PostgreSQL's.\n{first}\n\
                     shrunk script:\n{}\n{diff}",
                    target.name,
                    listing(&small)
                );
                if !keep_going {
                    panic!("{failure}");
                }
                eprintln!("{failure}");
                failures.push(failure);
                break;
            }
        }
    }
    for target in targets {
        target.pgmemo.shutdown().await;
    }
    assert!(
        failures.is_empty(),
        "{} scripts differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Scripts in which one client at a time is inside a transaction block, so that transaction
/// pooling can run them over a single server connection the two clients share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_shared_by_two_clients() {
    within(deadline(), async {
        let pg = cluster().await;
        let direct = pg.port();
        let targets = vec![
            target(
                direct,
                "transaction pooling, 1 server, cache on",
                PoolMode::Transaction,
                1,
                Switch::On,
            )
            .await,
            target(
                direct,
                "transaction pooling, 1 server, cache off",
                PoolMode::Transaction,
                1,
                Switch::Off,
            )
            .await,
            // Statements evicted and prepared again all the time.
            tweaked_target(
                direct,
                "transaction pooling, 1 server, 2 statements per server, cache off",
                PoolMode::Transaction,
                1,
                Switch::Off,
                |c| c.max_prepared_statements = 2,
            )
            .await,
            // Unnamed statements seen again bound from pgmemo's own, two texts per server.
            tweaked_target(
                direct,
                "transaction pooling, 1 server, 2 promoted texts per server, cache off",
                PoolMode::Transaction,
                1,
                Switch::Off,
                |c| c.max_promoted_statements = 2,
            )
            .await,
        ];
        differential(direct, &prefix("x"), true, targets, seeds(1, 30)).await;
    })
    .await
}

/// Scripts in which both clients may be inside transaction blocks at once (each writes only
/// its own table, so neither waits for the other), in session pooling and in transaction
/// pooling with two servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_transactions() {
    within(deadline(), async {
        let pg = cluster().await;
        let direct = pg.port();
        let targets = vec![
            target(
                direct,
                "session pooling, cache on",
                PoolMode::Session,
                4,
                Switch::On,
            )
            .await,
            target(
                direct,
                "session pooling, cache off",
                PoolMode::Session,
                4,
                Switch::Off,
            )
            .await,
            target(
                direct,
                "transaction pooling, 2 servers, cache on",
                PoolMode::Transaction,
                2,
                Switch::On,
            )
            .await,
            target(
                direct,
                "transaction pooling, 2 servers, cache off",
                PoolMode::Transaction,
                2,
                Switch::Off,
            )
            .await,
            tweaked_target(
                direct,
                "transaction pooling, 2 servers, 2 statements per server, cache on",
                PoolMode::Transaction,
                2,
                Switch::On,
                |c| c.max_prepared_statements = 2,
            )
            .await,
            tweaked_target(
                direct,
                "transaction pooling, 2 servers, 2 promoted texts per server, cache off",
                PoolMode::Transaction,
                2,
                Switch::Off,
                |c| c.max_promoted_statements = 2,
            )
            .await,
        ];
        differential(direct, &prefix("y"), false, targets, seeds(1_000_001, 30)).await;
    })
    .await
}

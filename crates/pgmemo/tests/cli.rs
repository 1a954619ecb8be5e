//! The command line as the README promises it: with no arguments pgmemo listens on
//! 127.0.0.1:6432 and proxies to 127.0.0.1:5432; flags override defaults; transaction pooling
//! is refused with a clear message until it is complete.

use std::process::{Command, Output};

fn pgmemo(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgmemo"));
    for (k, _) in std::env::vars() {
        if k.starts_with("PGMEMO_") {
            cmd.env_remove(k);
        }
    }
    cmd.args(args).output().expect("pgmemo runs")
}

#[test]
fn no_arguments_means_local_defaults() {
    let out = pgmemo(&["--check"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = String::from_utf8_lossy(&out.stdout);
    assert!(config.contains("listen = \"127.0.0.1:6432\""), "{config}");
    assert!(
        config.contains("upstream = \"postgres://127.0.0.1:5432\""),
        "{config}"
    );
    assert!(config.contains("pool_mode = \"session\""), "{config}");
}

#[test]
fn flags_override_defaults() {
    let out = pgmemo(&[
        "--listen",
        "127.0.0.1:7000",
        "--upstream",
        "postgres://bob:pw@db.example:6543/app",
        "--pool-size",
        "7",
        "--worker-threads",
        "1",
        "--check",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "listen = \"127.0.0.1:7000\"",
        "pool_size = 7",
        "worker_threads = 1",
        "db.example:6543/app",
    ] {
        assert!(config.contains(expected), "{expected} missing in {config}");
    }
    assert!(!config.contains(":pw@"), "password printed: {config}");
}

#[test]
fn transaction_pooling_is_accepted_and_a_bad_mode_refused() {
    let out = pgmemo(&["--pool-mode", "transaction", "--check"]);
    assert!(out.status.success(), "{out:?}");
    let config = String::from_utf8_lossy(&out.stdout);
    assert!(config.contains("pool_mode = \"transaction\""), "{config}");
    let out = pgmemo(&["--pool-mode", "statement", "--check"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pool-mode"), "{err}");
}

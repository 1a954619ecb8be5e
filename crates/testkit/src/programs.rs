//! PostgreSQL's client programs (psql, pgbench) run by tests: the environment's `PG*`
//! variables removed so that only the arguments decide where they connect, a deadline on every
//! run, the output shown when a run fails, and what every pgbench run must report.

use std::process::Output;
use std::time::Duration;

use tokio::process::Command;

/// A PostgreSQL client program (`psql`, `pgbench`) from the same installation as the server,
/// prepared by [`scrub_pg_env`].
pub fn pg_client(program: &str) -> Command {
    let mut cmd = Command::new(crate::pg_bin(program));
    scrub_pg_env(&mut cmd);
    cmd
}

/// Removes every `PG*` variable (PGHOST, PGPORT, PGPASSWORD, ...) from `cmd`'s environment, so
/// that a developer's or CI's settings cannot redirect a test's client; also gives it no stdin
/// and kills it if the test drops it (a timed-out run does not linger).
pub fn scrub_pg_env(cmd: &mut Command) {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("PG") {
            cmd.env_remove(key);
        }
    }
    cmd.stdin(std::process::Stdio::null()).kill_on_drop(true);
}

/// Runs `cmd` within `limit` and returns its output, whatever its exit status: for runs whose
/// failure the test examines. `what` names the run in panics.
pub async fn output(mut cmd: Command, what: &str, limit: Duration) -> Output {
    tokio::time::timeout(limit, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"))
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"))
}

/// Like [`output`] but panics (showing stdout and stderr) unless the program succeeded: for
/// runs that are set-up or whose success is the point.
pub async fn run_ok(cmd: Command, what: &str, limit: Duration) -> Output {
    let out = output(cmd, what, limit).await;
    if !out.status.success() {
        panic!(
            "{what} failed ({})\n--- stdout ---\n{}\n--- stderr ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// Asserts that a pgbench run in query mode `mode` (its output `out`) processed transactions
/// and none failed, showing pgbench's report and stderr otherwise; returns the report (stdout)
/// for further checks.
pub fn assert_pgbench_report(out: &Output, mode: &str) -> String {
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let processed = number_after(&report, "number of transactions actually processed:");
    let failed = number_after(&report, "number of failed transactions:");
    assert_eq!(failed, Some(0), "-M {mode}:\n{report}\n{stderr}");
    assert!(
        processed.is_some_and(|n| n > 0),
        "-M {mode}:\n{report}\n{stderr}"
    );
    assert!(
        report.contains(&format!("query mode: {mode}")),
        "-M {mode}:\n{report}"
    );
    report
}

/// The number after `label` on the first line that starts with it, to read pgbench's report
/// (`"number of failed transactions: 0 (0.000%)"` → 0).
fn number_after(report: &str, label: &str) -> Option<u64> {
    let line = report.lines().find(|l| l.starts_with(label))?;
    line[label.len()..].split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pgbench_report_numbers() {
        let report = "query mode: simple\nnumber of failed transactions: 0 (0.000%)\n";
        assert_eq!(
            number_after(report, "number of failed transactions:"),
            Some(0)
        );
        assert_eq!(number_after(report, "query mode:"), None);
        assert_eq!(number_after(report, "latency:"), None);
    }
}

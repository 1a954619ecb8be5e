//! Cleaning up clusters whose test process died without running `Drop` (killed, aborted).
//!
//! Every cluster directory records the PID of the process that created it. Before creating a
//! new cluster, directories whose owner is gone are shut down and removed, so a crashed test
//! run does not leave postmasters holding memory and ports for the next one.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;

use crate::procfs::{cmdline, pid_alive, send_signal, wait_pid_gone};

/// Where cluster directories live. Fixed rather than `$TMPDIR`: the `postgres` OS user must be
/// able to reach it, and Unix socket paths must stay short.
pub(crate) const PARENT_DIR: &str = "/tmp";

/// Name prefix of cluster directories; the sweep only looks at these.
pub(crate) const DIR_PREFIX: &str = "testkit-pg-";

/// File in a cluster directory holding the PID of the process that owns the cluster.
const OWNER_FILE: &str = "owner.pid";

/// Records this process as the owner of the cluster in `dir`.
pub(crate) fn mark_owner(dir: &Path) -> anyhow::Result<()> {
    std::fs::write(dir.join(OWNER_FILE), std::process::id().to_string())
        .context("writing the cluster's owner.pid")
}

/// Stops and removes every cluster directory whose owner process is gone. Best effort: errors
/// are ignored, and a directory without an owner file (still being created) is left alone.
pub(crate) fn remove_abandoned_clusters() {
    let Ok(entries) = std::fs::read_dir(PARENT_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let dir = entry.path();
        let owner = std::fs::read_to_string(dir.join(OWNER_FILE))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        if let Some(owner) = owner {
            if !pid_alive(owner) {
                kill_postmaster(&dir.join("data"));
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
}

/// The postmaster's PID from `data/postmaster.pid`, if that file exists and the process is a
/// running PostgreSQL server (a stale file after a crash may name an unrelated process).
pub(crate) fn postmaster_pid(data: &Path) -> Option<u32> {
    let contents = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    let pid: u32 = contents.lines().next()?.trim().parse().ok()?;
    let is_postgres = cmdline(pid).is_some_and(|c| c.contains("postgres"));
    (is_postgres && pid_alive(pid)).then_some(pid)
}

/// Immediate shutdown of the server in `data`, if one runs: SIGQUIT (the postmaster stops its
/// children and exits without a checkpoint), then SIGKILL if it has not gone within seconds.
/// Blocks until the process is gone, because the caller deletes the directory next.
pub(crate) fn kill_postmaster(data: &Path) {
    let Some(pid) = postmaster_pid(data) else {
        return;
    };
    if send_signal(pid, libc::SIGQUIT).is_ok() && wait_pid_gone(pid, Duration::from_secs(10)) {
        return;
    }
    let _ = send_signal(pid, libc::SIGKILL);
    wait_pid_gone(pid, Duration::from_secs(5));
}

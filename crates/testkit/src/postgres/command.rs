//! Finding the PostgreSQL binaries and running them as the `postgres` OS user.
//!
//! PostgreSQL refuses to run as root, and these tests often do (containers, CI). Every
//! initdb/pg_ctl/psql call therefore goes through [`pg_command`], which wraps it in
//! `runuser -u postgres --` when the effective UID is 0.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;

use anyhow::{bail, Context as _};
use tokio::io::AsyncWriteExt as _;
use tokio::process::Command;

/// Where Debian/Ubuntu install PostgreSQL 15, the version these tests are written against.
const DEFAULT_BINDIR: &str = "/usr/lib/postgresql/15/bin";

/// OS user that owns throwaway clusters when tests run as root.
pub(crate) const POSTGRES_OS_USER: &str = "postgres";

/// Full path of a PostgreSQL program (`initdb`, `pg_ctl`, `psql`, `pgbench`, ...).
///
/// Looks in /usr/lib/postgresql/15/bin, then in `pg_config --bindir`; if neither has it, returns
/// the bare name so that `PATH` decides (and the spawn error names the program).
pub fn pg_bin(name: &str) -> PathBuf {
    let in_default = Path::new(DEFAULT_BINDIR).join(name);
    if in_default.exists() {
        return in_default;
    }
    match pg_config_bindir() {
        Some(dir) if dir.join(name).exists() => dir.join(name),
        _ => PathBuf::from(name),
    }
}

/// `pg_config --bindir`, asked once per process.
fn pg_config_bindir() -> Option<&'static Path> {
    static BINDIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    BINDIR
        .get_or_init(|| {
            let out = std::process::Command::new("pg_config")
                .arg("--bindir")
                .output()
                .ok()?;
            let dir = String::from_utf8(out.stdout).ok()?;
            out.status.success().then(|| PathBuf::from(dir.trim()))
        })
        .as_deref()
}

/// Whether PostgreSQL programs must be wrapped in `runuser` (we are root).
pub(crate) fn running_as_root() -> bool {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// UID and GID of the `postgres` OS user, to hand it the temp directory. Looked up once,
/// with the reentrant `getpwnam_r`: `getpwnam` returns a static record that another test
/// thread's lookup may overwrite while it is read, and a file then chowned to the wrong
/// user is one PostgreSQL cannot read (`could not open configuration file pg_hba.conf:
/// Permission denied`, seen once in CI).
pub(crate) fn postgres_os_user_ids() -> anyhow::Result<(u32, u32)> {
    static IDS: OnceLock<Option<(u32, u32)>> = OnceLock::new();
    let ids = IDS.get_or_init(|| {
        let name = std::ffi::CString::new(POSTGRES_OS_USER).expect("no NUL in user name");
        // SAFETY: an all-zero passwd (null pointers, zero ids) is a valid value to pass to
        // getpwnam_r, which fills it in.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call, `buf` for `buf.len()` bytes; the record
        // and the strings it points to live in `entry` and `buf`, owned here.
        let rc = unsafe {
            libc::getpwnam_r(
                name.as_ptr(),
                &mut entry,
                buf.as_mut_ptr(),
                buf.len(),
                &mut found,
            )
        };
        (rc == 0 && !found.is_null()).then_some((entry.pw_uid, entry.pw_gid))
    });
    match ids {
        Some(ids) => Ok(*ids),
        None => {
            bail!("running as root but there is no `{POSTGRES_OS_USER}` OS user to run PostgreSQL")
        }
    }
}

/// Gives `path` to the `postgres` OS user when we are root; a no-op otherwise. Tests that
/// hand PostgreSQL files of their own (a TLS key) use it too, rather than a `getpwnam` of
/// their own that would race with this one.
pub fn chown_to_postgres(path: &Path) -> anyhow::Result<()> {
    if running_as_root() {
        let (uid, gid) = postgres_os_user_ids()?;
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .with_context(|| format!("chown {} to {POSTGRES_OS_USER}", path.display()))?;
    }
    Ok(())
}

/// Writes a file that the server will read, owned by the `postgres` OS user when we are root.
pub(crate) fn write_for_postgres(path: &Path, contents: &str) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))?;
    chown_to_postgres(path)
}

/// A command for PostgreSQL program `name`, run as the `postgres` OS user if we are root, in
/// `cwd` (which that user can enter), with `PG*` variables of the test environment removed so
/// that only explicit arguments decide where it connects.
pub(crate) fn pg_command(name: &str, cwd: &Path) -> Command {
    let program = pg_bin(name);
    let mut cmd = if running_as_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", POSTGRES_OS_USER, "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    };
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("PG") {
            cmd.env_remove(key);
        }
    }
    cmd.current_dir(cwd).stdin(Stdio::null());
    cmd
}

/// Runs `cmd` to completion, feeding it `stdin` if given; returns stdout, or an error that
/// shows exit status, stdout and stderr.
pub(crate) async fn run(
    mut cmd: Command,
    stdin: Option<&str>,
    what: &str,
) -> anyhow::Result<String> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("{what}: cannot spawn {cmd:?}"))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())
            .await
            .with_context(|| format!("{what}: writing stdin"))?;
    }
    let out = child
        .wait_with_output()
        .await
        .with_context(|| format!("{what}: waiting for {cmd:?}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {cmd:?}\n--- stdout ---\n{stdout}\n--- stderr ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_installed_binaries() {
        for name in ["initdb", "pg_ctl", "psql"] {
            assert!(pg_bin(name).is_absolute(), "{name} not found");
        }
    }
}

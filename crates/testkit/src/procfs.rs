//! Looking at other processes through /proc and signals: is a postmaster gone, how much memory
//! does a pgmemo process use.
//!
//! Linux only, like the rest of testkit. Works for processes that are not our children (a
//! postmaster daemonized by pg_ctl) and treats zombies as gone, because in containers the
//! reaper may never collect them.

use std::time::{Duration, Instant};

/// Whether `pid` names a process that is still running (not a zombie, not reaped).
pub fn pid_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesized command name, which may itself contain ") ".
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    !matches!(state, Some("Z" | "X" | "x"))
}

/// Sends `signal` (a `libc::SIG*` constant) to `pid`; errors say why (gone, not permitted).
pub fn send_signal(pid: u32, signal: i32) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    // SAFETY: kill(2) has no memory-safety preconditions.
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Blocks (polling every few milliseconds) until `pid` is gone or `timeout` passes; returns
/// whether it is gone. Blocking on purpose: it is used from `Drop`, where nothing can be awaited.
pub fn wait_pid_gone(pid: u32, timeout: Duration) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if !pid_alive(pid) {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A `/proc/PID/status` field given in kB (`VmRSS`, `VmHWM`), in bytes; `None` once the
/// process is gone.
pub fn status_kb_field(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        let kb: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
        Some(kb * 1024)
    })
}

/// The command line of `pid` with arguments joined by spaces, to check that a PID read from a
/// file still belongs to the program we expect before signalling it.
pub fn cmdline(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect::<Vec<_>>()
            .join(" "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_itself() {
        let me = std::process::id();
        assert!(pid_alive(me));
        assert!(status_kb_field(me, "VmRSS").unwrap() > 0);
        assert!(status_kb_field(me, "VmHWM").unwrap() > 0);
        assert_eq!(status_kb_field(me, "NoSuchField"), None);
        assert!(cmdline(me).is_some());
    }

    #[test]
    fn a_reaped_child_is_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!pid_alive(pid));
        assert!(wait_pid_gone(pid, Duration::from_millis(10)));
    }

    #[test]
    fn an_unreaped_child_is_gone_too() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        assert!(
            wait_pid_gone(pid, Duration::from_secs(10)),
            "zombie counts as gone"
        );
        child.wait().unwrap();
    }
}

//! The pgmemo binary as a child process, for what an in-process instance cannot show: signal
//! handling, exit status, memory use, log output.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{bail, Context as _};
use tempfile::NamedTempFile;
use tokio::process::{Child, Command};
use tokio_postgres::Client;

use crate::eventually::eventually;
use crate::ports::free_port;
use crate::procfs::{send_signal, status_kb_field};

/// How long the binary may take to accept connections (it may be a debug build on a busy CI).
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a start that lost its port to another process is retried on a new port.
const START_ATTEMPTS: usize = 5;

/// A running pgmemo binary listening on a free port of 127.0.0.1. Killed (SIGKILL) on drop
/// unless it already exited.
#[derive(Debug)]
pub struct PgmemoProcess {
    child: Child,
    pid: u32,
    port: u16,
    stdout: NamedTempFile,
    stderr: NamedTempFile,
}

impl PgmemoProcess {
    /// Runs `binary --listen 127.0.0.1:PORT ARGS...` and returns once the port accepts TCP
    /// connections. Fails with the process's stderr if it exits first; retries on another port
    /// if the chosen one was taken meanwhile.
    pub async fn spawn(binary: &Path, args: &[String]) -> anyhow::Result<PgmemoProcess> {
        let mut attempt = 1;
        loop {
            let mut process = Self::spawn_on(binary, args, free_port())?;
            let Err(e) = process.wait_ready().await else {
                return Ok(process);
            };
            let stderr = process.stderr_contents();
            if attempt == START_ATTEMPTS || !stderr.contains("in use") {
                return Err(e.context(format!("starting {}", binary.display())));
            }
            attempt += 1;
        }
    }

    fn spawn_on(binary: &Path, args: &[String], port: u16) -> anyhow::Result<PgmemoProcess> {
        let stdout = NamedTempFile::new().context("creating a file for pgmemo's stdout")?;
        let stderr = NamedTempFile::new().context("creating a file for pgmemo's stderr")?;
        let child = Command::new(binary)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(stdout.reopen()?)
            .stderr(stderr.reopen()?)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning {}", binary.display()))?;
        let pid = child
            .id()
            .context("the child exited before we saw its PID")?;
        Ok(PgmemoProcess {
            child,
            pid,
            port,
            stdout,
            stderr,
        })
    }

    /// Polls until the port accepts a TCP connection, failing early if the process exits.
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let addr = self.addr();
        let mut exited = None;
        let ready = eventually(READY_TIMEOUT, || {
            let status = self.child.try_wait().ok().flatten();
            exited = exited.or(status);
            async move { status.is_some() || tokio::net::TcpStream::connect(addr).await.is_ok() }
        })
        .await;
        let stderr = self.stderr_contents();
        if let Some(status) = exited {
            bail!("pgmemo exited ({status}) before accepting connections; stderr:\n{stderr}");
        }
        if !ready {
            bail!("pgmemo did not accept connections on {addr} within {READY_TIMEOUT:?}; stderr:\n{stderr}");
        }
        Ok(())
    }

    /// The process ID, e.g. for `ps` or `/proc` in a test.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The port given with `--listen`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// 127.0.0.1:[`port`](Self::port).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `postgres://user@127.0.0.1:port/db` through this process.
    pub fn url(&self, user: &str, db: &str) -> String {
        crate::client::url("127.0.0.1", self.port, user, db)
    }

    /// A client connected through this process; panics with the reason on failure.
    pub async fn client(&self, user: &str, db: &str) -> Client {
        self.try_client(user, db)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// A client through this process, or the connection error.
    pub async fn try_client(&self, user: &str, db: &str) -> anyhow::Result<Client> {
        crate::client::connect(&self.url(user, db)).await
    }

    /// Current resident memory (VmRSS) in bytes; `None` once the process is gone.
    pub fn rss_bytes(&self) -> Option<u64> {
        status_kb_field(self.pid, "VmRSS")
    }

    /// Peak resident memory (VmHWM) in bytes, for memory-bound tests that must not miss a
    /// short spike; `None` once the process is gone.
    pub fn peak_rss_bytes(&self) -> Option<u64> {
        status_kb_field(self.pid, "VmHWM")
    }

    /// Sends a signal (`libc::SIGTERM`, `libc::SIGHUP`, ...), e.g. to test graceful shutdown
    /// and reload.
    pub fn signal(&self, signal: i32) -> std::io::Result<()> {
        send_signal(self.pid, signal)
    }

    /// Waits up to `timeout` for the process to exit; `None` if it is still running.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(timeout, self.child.wait())
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// Everything the process wrote to stderr so far (its log, unless configured otherwise).
    pub fn stderr_contents(&self) -> String {
        std::fs::read_to_string(self.stderr.path()).unwrap_or_default()
    }

    /// Everything the process wrote to stdout so far.
    pub fn stdout_contents(&self) -> String {
        std::fs::read_to_string(self.stdout.path()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in "binary": a shell script that listens like pgmemo would.
    fn fake_binary(dir: &Path, body: &str) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let path = dir.join("fake-pgmemo");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[tokio::test]
    async fn reports_early_exit_with_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let bin = fake_binary(dir.path(), "echo \"bad flag $1 $2 $3\" >&2; exit 3");
        let err = PgmemoProcess::spawn(&bin, &["--oops".to_owned()])
            .await
            .unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("bad flag --listen 127.0.0.1:"), "{msg}");
        assert!(msg.contains("--oops"), "{msg}");
        assert!(msg.contains("exit status: 3"), "{msg}");
    }

    #[tokio::test]
    async fn waits_for_the_port_then_signals_and_measures() {
        let dir = tempfile::tempdir().unwrap();
        // python3 stands in for a server: it listens on the port given after --listen.
        let bin = fake_binary(
            dir.path(),
            "port=${2##*:}\nexec python3 -c \"import socket,sys,time\n\
             s=socket.socket(); s.bind(('127.0.0.1', $port)); s.listen()\n\
             print('listening', file=sys.stderr, flush=True)\ntime.sleep(60)\"",
        );
        let mut p = PgmemoProcess::spawn(&bin, &[]).await.unwrap();
        tokio::net::TcpStream::connect(p.addr()).await.unwrap();
        let rss = p.rss_bytes().unwrap();
        assert!(rss > 0);
        assert!(p.peak_rss_bytes().unwrap() >= rss);
        assert!(p.stderr_contents().contains("listening"));
        assert!(p.wait_exit(Duration::from_millis(20)).await.is_none());
        p.signal(libc::SIGTERM).unwrap();
        let status = p
            .wait_exit(Duration::from_secs(10))
            .await
            .expect("exits on SIGTERM");
        assert!(!status.success());
        assert_eq!(p.rss_bytes(), None);
    }
}

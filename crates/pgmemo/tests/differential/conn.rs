//! A raw protocol client for differential runs: like `txn_support::Raw`, but a missing answer
//! or a closed connection is a result (a transcript line), not a panic, so that a script can
//! be shrunk by re-running variants of it that may hang through pgmemo.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::txn_support::{describe, DB, USER};

pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

/// Why a step got no complete answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Broken {
    Timeout,
    Closed,
}

impl Conn {
    pub async fn login(port: u16) -> Conn {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap_or_else(|e| panic!("connect to port {port}: {e}"));
        stream.set_nodelay(true).unwrap();
        let mut conn = Conn {
            stream,
            buf: Vec::new(),
        };
        let startup = wire::startup::StartupMessage::encode([("user", USER), ("database", DB)]);
        conn.stream.write_all(&startup).await.expect("startup");
        loop {
            match conn.recv(Duration::from_secs(10)).await {
                Ok((b'Z', _)) => return conn,
                Ok((b'E', body)) => panic!("login failed: {}", describe(b'E', &body)),
                Ok(_) => {}
                Err(e) => panic!("login to port {port}: {e:?}"),
            }
        }
    }

    async fn recv(&mut self, wait: Duration) -> Result<(u8, Vec<u8>), Broken> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
                if self.buf.len() > len {
                    let body = self.buf[5..1 + len].to_vec();
                    let tag = self.buf[0];
                    self.buf.drain(..1 + len);
                    return Ok((tag, body));
                }
            }
            let mut chunk = [0u8; 8192];
            match tokio::time::timeout(wait, self.stream.read(&mut chunk)).await {
                Err(_) => return Err(Broken::Timeout),
                Ok(Ok(0)) | Ok(Err(_)) => return Err(Broken::Closed),
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Sends `bytes` and reads up to the `readies`-th ReadyForQuery: one line per message
    /// (ParameterStatus, notices and notifications left out), and the last status letter.
    pub async fn exchange(
        &mut self,
        bytes: &[u8],
        readies: usize,
        wait: Duration,
    ) -> (Vec<String>, Result<u8, Broken>) {
        let mut lines = Vec::new();
        if self.stream.write_all(bytes).await.is_err() {
            return (lines, Err(Broken::Closed));
        }
        let mut pending = readies;
        let mut status = b'I';
        while pending > 0 {
            match self.recv(wait).await {
                Ok((tag, body)) => {
                    if matches!(tag, b'S' | b'N' | b'A') {
                        continue;
                    }
                    lines.push(describe(tag, &body));
                    if tag == b'Z' {
                        status = body[0];
                        pending -= 1;
                    }
                    // A FATAL error ends the session: nothing more comes.
                    if tag == b'E' && lines.last().is_some_and(|l| l.contains(" FATAL ")) {
                        return (lines, Err(Broken::Closed));
                    }
                }
                Err(e) => return (lines, Err(e)),
            }
        }
        (lines, Ok(status))
    }
}

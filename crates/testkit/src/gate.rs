//! [`CancelGate`]: a TCP forwarder between pgmemo and PostgreSQL that holds every cancel
//! request until the test lets them through, so a test can make a cancel arrive late (after
//! the query it was meant for ended) deterministically instead of by luck of timing.

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// The CancelRequest code of the protocol (1234 << 16 | 5678).
const CANCEL_REQUEST_CODE: u32 = 80_877_102;

/// Forwards connections to PostgreSQL on 127.0.0.1; cancel requests wait for [`release`].
///
/// [`release`]: CancelGate::release
pub struct CancelGate {
    port: u16,
    arrived: mpsc::UnboundedReceiver<()>,
    open: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl CancelGate {
    /// Starts forwarding from a free port on 127.0.0.1 to `upstream_port`.
    pub async fn start(upstream_port: u16) -> CancelGate {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("testkit: bind the cancel gate");
        let port = listener.local_addr().expect("bound").port();
        let (arrived_tx, arrived) = mpsc::unbounded_channel();
        let (open, opened) = watch::channel(false);
        let accept = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (arrived, opened) = (arrived_tx.clone(), opened.clone());
                tokio::spawn(forward(conn, upstream_port, arrived, opened));
            }
        });
        CancelGate {
            port,
            arrived,
            open,
            accept,
        }
    }

    /// Where pgmemo's upstream should point.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Waits until a cancel request has reached the gate (and is held there).
    pub async fn cancel_arrived(&mut self) {
        self.arrived.recv().await.expect("the gate runs");
    }

    /// Lets the held cancel requests, and every later one, through.
    pub fn release(&self) {
        let _ = self.open.send(true);
    }
}

impl Drop for CancelGate {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn forward(
    mut conn: TcpStream,
    upstream_port: u16,
    arrived: mpsc::UnboundedSender<()>,
    mut opened: watch::Receiver<bool>,
) {
    let mut head = [0u8; 8];
    if conn.read_exact(&mut head).await.is_err() {
        return;
    }
    let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    let code = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
    let Ok(mut upstream) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
        return;
    };
    if len == 16 && code == CANCEL_REQUEST_CODE {
        let mut key = [0u8; 8];
        if conn.read_exact(&mut key).await.is_err() {
            return;
        }
        let _ = arrived.send(());
        if opened.wait_for(|open| *open).await.is_err() {
            return;
        }
        let _ = upstream.write_all(&head).await;
        let _ = upstream.write_all(&key).await;
        // PostgreSQL closes the connection once it has acted on the request; so does the gate.
        let mut rest = Vec::new();
        let _ = upstream.read_to_end(&mut rest).await;
        return;
    }
    if upstream.write_all(&head).await.is_ok() {
        let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
    }
}

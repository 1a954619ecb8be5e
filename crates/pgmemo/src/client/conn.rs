//! The client's socket with its read buffer, and the few whole-message reads and writes the
//! login phase needs.

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wire::{ErrorResponse, Frame};

use super::ClientError;
use crate::net::{ClientStream, Peer};

/// A connected client.
pub struct ClientConn {
    /// The socket (plain or TLS).
    pub stream: ClientStream,
    /// Bytes read and not consumed yet.
    pub buf: BytesMut,
    /// The client's address, for logs.
    pub peer: Peer,
}

impl ClientConn {
    /// Reads one whole message, refusing lengths over `max` (`max_message_size`).
    pub async fn read_frame(&mut self, max: usize) -> Result<Frame, ClientError> {
        loop {
            if let Some(frame) = Frame::decode(&mut self.buf, max)? {
                return Ok(frame);
            }
            if self.buf.capacity() - self.buf.len() < 1024 {
                self.buf.reserve(8 * 1024);
            }
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(ClientError::Disconnected);
            }
        }
    }

    /// Waits until the client closes its connection (end of stream, or a connection error),
    /// for a task waiting on something else (a pool place) that must not outlive its client.
    /// What the client sends meanwhile (requests pipelined behind its startup) is kept in
    /// `buf`, read as any other read does, so the same works over TLS. Once `limit` bytes are
    /// buffered it stops reading and never returns: the client is evidently still there, and
    /// its further bytes wait in the kernel.
    pub async fn gone(&mut self, limit: usize) -> ClientError {
        while self.buf.len() < limit {
            if self.buf.capacity() - self.buf.len() < 1024 {
                self.buf.reserve(8 * 1024);
            }
            match self.stream.read_buf(&mut self.buf).await {
                Ok(0) => return ClientError::Disconnected,
                Ok(_) => {}
                Err(e) => return ClientError::Io(e),
            }
        }
        std::future::pending().await
    }

    /// Writes bytes and flushes.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream.write_all(bytes).await?;
        self.stream.flush().await?;
        Ok(())
    }

    /// Sends an error; for a FATAL one the caller closes the connection afterwards.
    pub async fn send_error(&mut self, e: &ErrorResponse) {
        let _ = self.send(&e.encode()).await;
    }
}

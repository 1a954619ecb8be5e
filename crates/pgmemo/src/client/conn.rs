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

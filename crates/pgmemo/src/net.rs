//! A socket that is either plain TCP or TLS over TCP, for both the client and the server side,
//! so the rest of pgmemo reads and writes without caring which.

use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Plain TCP or TLS over TCP.
pub enum MaybeTls<T> {
    Plain(TcpStream),
    Tls(Box<T>),
}

/// The client side of pgmemo (pgmemo is the TLS server).
pub type ClientStream = MaybeTls<tokio_rustls::server::TlsStream<TcpStream>>;
/// The server side of pgmemo (pgmemo is the TLS client).
pub type ServerStream = MaybeTls<tokio_rustls::client::TlsStream<TcpStream>>;

impl<T> MaybeTls<T> {
    /// Whether TLS is in use.
    pub fn is_tls(&self) -> bool {
        matches!(self, MaybeTls::Tls(_))
    }
}

impl ServerStream {
    /// True when the peer has closed the connection or sent something unsolicited: an idle
    /// server connection in that state must not be handed to a client. Never blocks.
    pub fn peer_closed_or_spoke(&self) -> bool {
        let fd = match self {
            MaybeTls::Plain(s) => s.as_raw_fd(),
            MaybeTls::Tls(s) => s.get_ref().0.as_raw_fd(),
        };
        let mut byte = [0u8; 1];
        // SAFETY: `fd` is a valid open socket owned by `self` for the duration of the call and
        // `byte` is a valid one-byte buffer. MSG_PEEK leaves the data in the socket.
        let n = unsafe {
            libc::recv(
                fd,
                byte.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return true;
        }
        io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for MaybeTls<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_read(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for MaybeTls<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTls::Plain(s) => s.is_write_vectored(),
            MaybeTls::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_flush(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_shutdown(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

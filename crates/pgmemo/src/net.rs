//! A socket that is either plain TCP or TLS over TCP, for both the client and the server side,
//! so the rest of pgmemo reads and writes without caring which.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A non-blocking TCP socket registered with tokio's reactor, like `tokio::net::TcpStream`,
/// with one difference that matters on the relay's hot path: a read that returns less than the
/// buffer could hold has drained the socket, so it clears the readiness flag right away.
/// tokio's own stream only learns that from a second `recv` failing with EAGAIN, which costs a
/// system call per message in each direction. The clear is race-free: it only applies to the
/// readiness event observed before the read, so data arriving afterwards still wakes the task.
pub struct FastTcp {
    fd: AsyncFd<std::net::TcpStream>,
}

impl FastTcp {
    /// Takes over a connected tokio stream (deregistering it from tokio's own registration).
    pub fn from_tokio(stream: tokio::net::TcpStream) -> io::Result<FastTcp> {
        let std = stream.into_std()?;
        std.set_nonblocking(true)?;
        // SAFETY: a std TcpStream owns its descriptor, keeps it open until dropped and always
        // reports the same one.
        let fd = unsafe { AsyncFd::register(std) }.map_err(io::Error::from)?;
        Ok(FastTcp { fd })
    }

    /// Whether the reactor has seen the socket become readable since the last read that
    /// drained it (data or end of stream). Makes no system call; a `true` may be stale.
    pub fn maybe_readable(&self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        self.fd.poll_read_ready(&mut cx).is_ready()
    }

    fn poll_read_inner(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            // SAFETY: recv writes at most `len` bytes into the unfilled, possibly uninitialized
            // part of the buffer; only the `n` bytes it reports are marked initialized.
            let unfilled = unsafe { buf.unfilled_mut() };
            let len = unfilled.len();
            let ptr = unfilled.as_mut_ptr();
            let result = guard.try_io(|inner| {
                let n = unsafe { libc::recv(inner.as_raw_fd(), ptr.cast(), len, 0) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match result {
                Ok(Ok(n)) => {
                    if n < len {
                        guard.clear_ready();
                    }
                    // SAFETY: recv initialized the first `n` bytes.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_write_inner(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            match guard.try_io(|inner| inner.get_ref().write(data)) {
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn shutdown_write(&self) -> io::Result<()> {
        match self.fd.get_ref().shutdown(std::net::Shutdown::Write) {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            other => other,
        }
    }
}

impl AsRawFd for FastTcp {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsyncRead for FastTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.poll_read_inner(cx, buf)
    }
}

impl AsyncWrite for FastTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_inner(cx, data)
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.shutdown_write())
    }
}

/// Reading and writing through shared references lets the relay use one socket from two pumps
/// at once without a lock (as `tokio::net::TcpStream::split` does).
impl AsyncRead for &FastTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.poll_read_inner(cx, buf)
    }
}

impl AsyncWrite for &FastTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_inner(cx, data)
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.shutdown_write())
    }
}

/// Plain TCP or TLS over TCP.
pub enum MaybeTls<T> {
    Plain(FastTcp),
    Tls(Box<T>),
}

/// The client side of pgmemo (pgmemo is the TLS server).
pub type ClientStream = MaybeTls<tokio_rustls::server::TlsStream<FastTcp>>;
/// The server side of pgmemo (pgmemo is the TLS client).
pub type ServerStream = MaybeTls<tokio_rustls::client::TlsStream<FastTcp>>;

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
            // The reactor already knows whether anything arrived since the socket was last
            // drained: only then is a system call needed to tell (transaction pooling asks
            // on every checkout).
            MaybeTls::Plain(s) if !s.maybe_readable() => return false,
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

//! A socket that is either plain (TCP or Unix-domain) or TLS over TCP, for both the client and
//! the server side, so the rest of pgmemo reads and writes without caring which.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Who is at the other end of a client connection, for logs and `SHOW CLIENTS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A TCP client, by address.
    Tcp(std::net::SocketAddr),
    /// A client of pgmemo's Unix-domain socket, which has no address; shown as PostgreSQL
    /// logs such clients, `[local]`.
    Unix,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Tcp(addr) => addr.fmt(f),
            Peer::Unix => f.write_str("[local]"),
        }
    }
}

/// A non-blocking TCP or Unix-domain stream socket registered with tokio's reactor, like
/// `tokio::net::TcpStream`, with one difference that matters on the relay's hot path: a read
/// that returns less than the buffer could hold has drained the socket, so it clears the
/// readiness flag right away. tokio's own stream only learns that from a second `recv` failing
/// with EAGAIN, which costs a system call per message in each direction. The clear is
/// race-free: it only applies to the readiness event observed before the read, so data
/// arriving afterwards still wakes the task.
pub struct FastSocket {
    /// A connected stream socket; TCP and Unix-domain ones are read, written and shut down
    /// with the same system calls.
    fd: AsyncFd<OwnedFd>,
}

/// Whether `host` names a directory holding PostgreSQL's Unix-domain socket (as libpq reads
/// a host that starts with a slash) rather than a TCP host.
pub fn is_unix_socket_dir(host: &str) -> bool {
    host.starts_with('/')
}

/// The path of the Unix-domain socket a PostgreSQL-protocol server listening on `port` keeps
/// in `dir` (libpq's and PostgreSQL's naming).
pub fn unix_socket_path(dir: &str, port: u16) -> std::path::PathBuf {
    std::path::Path::new(dir).join(format!(".s.PGSQL.{port}"))
}

/// Connects to `host:port`: over TCP (Nagle off: the protocol's messages are small and
/// answered), or to the Unix-domain socket in `host` when it is a directory
/// ([`is_unix_socket_dir`]), which skips the kernel's TCP/IP stack: on one machine the cheaper
/// way to PostgreSQL.
pub async fn connect(host: &str, port: u16) -> io::Result<FastSocket> {
    if is_unix_socket_dir(host) {
        let s = tokio::net::UnixStream::connect(unix_socket_path(host, port)).await?;
        FastSocket::from_tokio_unix(s)
    } else {
        let s = tokio::net::TcpStream::connect((host, port)).await?;
        s.set_nodelay(true)?;
        FastSocket::from_tokio(s)
    }
}

impl FastSocket {
    /// Takes over a connected tokio TCP stream (deregistering it from tokio's own
    /// registration).
    pub fn from_tokio(stream: tokio::net::TcpStream) -> io::Result<FastSocket> {
        let std = stream.into_std()?;
        std.set_nonblocking(true)?;
        FastSocket::register(std.into())
    }

    /// Takes over a connected tokio Unix-domain stream.
    pub fn from_tokio_unix(stream: tokio::net::UnixStream) -> io::Result<FastSocket> {
        let std = stream.into_std()?;
        std.set_nonblocking(true)?;
        FastSocket::register(std.into())
    }

    fn register(socket: OwnedFd) -> io::Result<FastSocket> {
        // SAFETY: an OwnedFd keeps its descriptor open until dropped and always reports the
        // same one.
        let fd = unsafe { AsyncFd::register(socket) }.map_err(io::Error::from)?;
        Ok(FastSocket { fd })
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

    /// Writes without asking the reactor first: a socket's send buffer almost never is full,
    /// and asking costs as much user-space work as the rest of the write. Only a write that
    /// would block goes through the reactor's readiness, which then clears the stale flag and
    /// waits for room.
    fn poll_write_inner(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        match send(self.fd.as_raw_fd(), data) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            done => return Poll::Ready(done),
        }
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            let result = guard.try_io(|inner| send(inner.as_raw_fd(), data));
            match result {
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn shutdown_write(&self) -> io::Result<()> {
        // SAFETY: the descriptor is a socket owned by `self`.
        if unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_WR) } == 0 {
            return Ok(());
        }
        match io::Error::last_os_error() {
            e if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            e => Err(e),
        }
    }
}

/// One `send` on a non-blocking socket. MSG_NOSIGNAL turns a write to a closed peer into
/// EPIPE rather than a signal.
fn send(fd: RawFd, data: &[u8]) -> io::Result<usize> {
    // SAFETY: `data` is valid for `data.len()` bytes and `fd` is an open socket of the caller.
    let n = unsafe { libc::send(fd, data.as_ptr().cast(), data.len(), libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

impl AsRawFd for FastSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsyncRead for FastSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.poll_read_inner(cx, buf)
    }
}

impl AsyncWrite for FastSocket {
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
impl AsyncRead for &FastSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.poll_read_inner(cx, buf)
    }
}

impl AsyncWrite for &FastSocket {
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

/// A plain socket (TCP or Unix-domain) or TLS over TCP.
pub enum MaybeTls<T> {
    Plain(FastSocket),
    Tls(Box<T>),
}

/// The client side of pgmemo (pgmemo is the TLS server).
pub type ClientStream = MaybeTls<tokio_rustls::server::TlsStream<FastSocket>>;
/// The server side of pgmemo (pgmemo is the TLS client).
pub type ServerStream = MaybeTls<tokio_rustls::client::TlsStream<FastSocket>>;

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

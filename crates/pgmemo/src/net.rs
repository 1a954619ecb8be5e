//! A socket that is either plain (TCP or Unix-domain) or TLS over TCP, for both the client and
//! the server side, so the rest of pgmemo reads and writes without caring which.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

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

/// How a TCP connection (a client's or a server's) watches a quiet peer. Without keepalive, a
/// peer that vanished without closing (its host crashed, the network drops everything) is
/// never noticed while pgmemo waits for it: a server connection stays lent to a client
/// waiting for an answer that never comes, or a dead client keeps its slot. Zero values leave
/// the operating system's defaults (`net.ipv4.tcp_keepalive_*`), as PgBouncer's do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpKeepalive {
    /// `SO_KEEPALIVE`.
    pub enabled: bool,
    /// `TCP_KEEPIDLE`: idle time before the first probe.
    pub idle: Duration,
    /// `TCP_KEEPINTVL`: time between unanswered probes.
    pub interval: Duration,
    /// `TCP_KEEPCNT`: unanswered probes before the connection is dropped.
    pub count: u32,
    /// `TCP_USER_TIMEOUT`: how long sent data may stay unacknowledged (with keepalive on, also
    /// how long probes may go unanswered).
    pub user_timeout: Duration,
}

impl TcpKeepalive {
    /// Sets these options on a connected TCP socket.
    pub fn apply(&self, socket: &impl AsFd) -> io::Result<()> {
        let socket = socket2::SockRef::from(socket);
        if self.enabled {
            let mut keepalive = socket2::TcpKeepalive::new();
            if !self.idle.is_zero() {
                keepalive = keepalive.with_time(self.idle);
            }
            if !self.interval.is_zero() {
                keepalive = keepalive.with_interval(self.interval);
            }
            if self.count > 0 {
                keepalive = keepalive.with_retries(self.count);
            }
            socket.set_tcp_keepalive(&keepalive)?;
        }
        if !self.user_timeout.is_zero() {
            socket.set_tcp_user_timeout(Some(self.user_timeout))?;
        }
        Ok(())
    }
}

/// Connects to `host:port`: over TCP (Nagle off: the protocol's messages are small and
/// answered; `keepalive` set), or to the Unix-domain socket in `host` when it is a directory
/// ([`is_unix_socket_dir`]), which skips the kernel's TCP/IP stack: on one machine the cheaper
/// way to PostgreSQL.
pub async fn connect(host: &str, port: u16, keepalive: &TcpKeepalive) -> io::Result<FastSocket> {
    if is_unix_socket_dir(host) {
        let s = tokio::net::UnixStream::connect(unix_socket_path(host, port)).await?;
        FastSocket::from_tokio_unix(s)
    } else {
        let s = tokio::net::TcpStream::connect((host, port)).await?;
        s.set_nodelay(true)?;
        keepalive.apply(&s)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected pair of TCP sockets on loopback.
    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    #[test]
    fn keepalive_options_reach_the_socket() {
        let (socket, _peer) = pair();
        let options = TcpKeepalive {
            enabled: true,
            idle: Duration::from_secs(77),
            interval: Duration::from_secs(7),
            count: 4,
            user_timeout: Duration::from_secs(33),
        };
        options.apply(&socket).unwrap();
        let s = socket2::SockRef::from(&socket);
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(77));
        assert_eq!(s.tcp_keepalive_interval().unwrap(), Duration::from_secs(7));
        assert_eq!(s.tcp_keepalive_retries().unwrap(), 4);
        assert_eq!(s.tcp_user_timeout().unwrap(), Some(Duration::from_secs(33)));
    }

    #[test]
    fn zero_values_leave_the_systems_defaults_and_off_sets_nothing() {
        let (socket, _peer) = pair();
        let defaults = socket2::SockRef::from(&socket)
            .tcp_keepalive_time()
            .unwrap();
        let on = TcpKeepalive {
            enabled: true,
            ..TcpKeepalive::default()
        };
        on.apply(&socket).unwrap();
        let s = socket2::SockRef::from(&socket);
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), defaults);
        assert_eq!(s.tcp_user_timeout().unwrap(), None);

        let (socket, _peer) = pair();
        TcpKeepalive::default().apply(&socket).unwrap();
        assert!(!socket2::SockRef::from(&socket).keepalive().unwrap());
    }
}

//! The metrics endpoint's HTTP server, beside the query path rather than on it: a minimal
//! HTTP/1.1 responder on its own listener that answers `GET /metrics` with [`super::render`]
//! and closes every connection after one response. Hand-rolled because a scrape needs nothing
//! more, and an HTTP stack would be the largest dependency of the crate.
//!
//! Untrusted input is bounded everywhere: the request head by size and time, the number of
//! connections, the time spent writing and draining. Nothing here panics on bad input.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::exposition::CONTENT_TYPE;
use crate::shared::Shared;

/// Largest request head (request line and headers) read; larger ones get 431.
pub const MAX_HEAD: usize = 8 * 1024;

/// A client must send its whole request head within this time.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Writing a response, and draining what the client still sends, must end within this time.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// After the response, unread input is drained for at most this long (or until EOF), so the
/// close is a FIN rather than a reset that could destroy the response in flight.
const LINGER: Duration = Duration::from_secs(1);

/// Most bytes drained after a response.
const MAX_DRAIN: usize = 64 * 1024;

/// Scrapers connect once per interval; more connections than this at once are dropped.
const MAX_CONNECTIONS: usize = 64;

/// Why a request got no metrics page: mapped to a status code, or to closing the connection.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("request head larger than {MAX_HEAD} bytes")]
    TooLarge,
    #[error("malformed request line")]
    Malformed,
    #[error("connection closed before the request head was complete")]
    Closed,
    #[error("no complete request head within {READ_TIMEOUT:?}")]
    Timeout,
    #[error("reading the request: {0}")]
    Io(#[from] std::io::Error),
}

/// A parsed request line; headers are read past and ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The target without its query string.
    pub path: String,
}

/// Accepts scrapers until pgmemo stops accepting clients (`shared.stop_accepting`), then
/// aborts any connection still open and returns.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let stop = shared.stop_accepting.clone();
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) if connections.len() < MAX_CONNECTIONS => {
                    connections.spawn(handle(socket, peer, shared.clone()));
                }
                Ok((_, peer)) => {
                    tracing::warn!(%peer, limit = MAX_CONNECTIONS, "metrics: too many connections; dropping one");
                }
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "metrics: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    connections.shutdown().await;
}

/// One connection: one request, one response, close.
async fn handle(mut socket: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let request = match tokio::time::timeout(READ_TIMEOUT, read_request(&mut socket)).await {
        Ok(result) => result,
        Err(_) => Err(RequestError::Timeout),
    };
    let response = match request {
        Ok(request) => respond(&request, || super::render(&shared)),
        Err(e) => {
            tracing::debug!(%peer, error = %e, "metrics: bad request");
            match e {
                RequestError::TooLarge => plain(431, "Request Header Fields Too Large", &e),
                RequestError::Malformed => plain(400, "Bad Request", &e),
                RequestError::Closed | RequestError::Timeout | RequestError::Io(_) => return,
            }
        }
    };
    let written = tokio::time::timeout(WRITE_TIMEOUT, async {
        socket.write_all(&response).await?;
        socket.shutdown().await?;
        drain(&mut socket).await;
        Ok::<_, std::io::Error>(())
    })
    .await;
    if let Ok(Err(e)) = written {
        tracing::debug!(%peer, error = %e, "metrics: writing the response failed");
    }
}

/// Reads what the client still sends until EOF, [`LINGER`] or [`MAX_DRAIN`] bytes.
async fn drain(socket: &mut TcpStream) {
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    while drained < MAX_DRAIN {
        match tokio::time::timeout(LINGER, socket.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => drained += n,
            _ => return,
        }
    }
}

/// Reads up to the blank line that ends the request head and parses its request line. A
/// malformed request line is reported as soon as it is complete, without waiting for more.
pub async fn read_request(reader: &mut (impl AsyncRead + Unpin)) -> Result<Request, RequestError> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let mut line_checked = false;
    loop {
        let n = reader.read(&mut chunk).await?;
        if n == 0 {
            return Err(RequestError::Closed);
        }
        let search_from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        if !line_checked {
            if let Some(end) = head.iter().position(|&b| b == b'\n') {
                parse_request_line(&head[..end])?;
                line_checked = true;
            }
        }
        if let Some(end) = head_end(&head[search_from..]) {
            if search_from + end > MAX_HEAD {
                return Err(RequestError::TooLarge);
            }
            let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
            return parse_request_line(&head[..line_end]);
        }
        if head.len() > MAX_HEAD {
            return Err(RequestError::TooLarge);
        }
    }
}

/// Where the head ends (just past its blank line) in `bytes`, accepting bare `\n` line ends.
fn head_end(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4);
    let lf = bytes.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `METHOD SP TARGET SP HTTP/1.x`, with or without the trailing `\r`.
pub fn parse_request_line(line: &[u8]) -> Result<Request, RequestError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = std::str::from_utf8(line).map_err(|_| RequestError::Malformed)?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(RequestError::Malformed);
    };
    let method_ok = !method.is_empty() && method.bytes().all(|b| b.is_ascii_uppercase());
    let version_ok = matches!(version, "HTTP/1.0" | "HTTP/1.1");
    let target_ok = target.starts_with('/') && !target.bytes().any(|b| b.is_ascii_control());
    if !(method_ok && version_ok && target_ok) {
        return Err(RequestError::Malformed);
    }
    let path = target.split(['?', '#']).next().unwrap_or(target);
    Ok(Request {
        method: method.to_owned(),
        path: path.to_owned(),
    })
}

/// The response bytes for a well-formed request; `page` renders the metrics only when asked.
pub fn respond(request: &Request, page: impl FnOnce() -> String) -> Vec<u8> {
    if request.path != "/metrics" {
        return plain(404, "Not Found", "not found; metrics are at /metrics");
    }
    match request.method.as_str() {
        "GET" => response(200, "OK", CONTENT_TYPE, &[], page().as_bytes(), true),
        "HEAD" => response(200, "OK", CONTENT_TYPE, &[], page().as_bytes(), false),
        _ => {
            let body = b"method not allowed; use GET\n";
            let allow = [("Allow", "GET, HEAD")];
            response(405, "Method Not Allowed", TEXT, &allow, body, true)
        }
    }
}

/// Content type of error bodies.
const TEXT: &str = "text/plain; charset=utf-8";

/// A short plain-text response.
fn plain(status: u16, reason: &str, message: impl std::fmt::Display) -> Vec<u8> {
    let body = format!("{message}\n");
    response(status, reason, TEXT, &[], body.as_bytes(), true)
}

/// A complete `Connection: close` response; `with_body` is false for HEAD, whose
/// Content-Length still describes the body GET would send.
fn response(
    status: u16,
    reason: &str,
    content_type: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    with_body: bool,
) -> Vec<u8> {
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    if with_body {
        out.extend_from_slice(body);
    }
    out
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    fn request(method: &str, path: &str) -> Request {
        Request {
            method: method.into(),
            path: path.into(),
        }
    }

    async fn read_from(input: &[u8]) -> Result<Request, RequestError> {
        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        client.write_all(input).await.unwrap();
        drop(client);
        read_request(&mut server).await
    }

    #[test]
    fn request_lines() {
        let ok = |line: &str| parse_request_line(line.as_bytes()).unwrap();
        assert_eq!(ok("GET /metrics HTTP/1.1\r"), request("GET", "/metrics"));
        assert_eq!(ok("GET /metrics?x=1 HTTP/1.0"), request("GET", "/metrics"));
        assert_eq!(ok("POST /a#b HTTP/1.1"), request("POST", "/a"));
        for bad in [
            "",
            "GET",
            "GET /metrics",
            "GET /metrics HTTP/2.0",
            "GET  /metrics HTTP/1.1",
            "get /metrics HTTP/1.1",
            "GET metrics HTTP/1.1",
            "GET /metrics HTTP/1.1 extra",
            "PRI * HTTP/2.0",
            "GET /a\u{7}b HTTP/1.1",
        ] {
            assert!(
                matches!(
                    parse_request_line(bad.as_bytes()),
                    Err(RequestError::Malformed)
                ),
                "{bad:?}"
            );
        }
        assert!(parse_request_line(b"GET /\xff HTTP/1.1").is_err());
    }

    #[tokio::test]
    async fn heads_are_read_to_the_blank_line_and_bounded() {
        let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\nleftover";
        assert_eq!(read_from(head).await.unwrap(), request("GET", "/metrics"));
        let bare_lf = b"HEAD /metrics HTTP/1.0\n\n";
        assert_eq!(
            read_from(bare_lf).await.unwrap(),
            request("HEAD", "/metrics")
        );
        let incomplete = b"GET /metrics HTTP/1.1\r\nHost: x\r\n";
        assert!(matches!(
            read_from(incomplete).await,
            Err(RequestError::Closed)
        ));
        let garbage = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\n";
        assert!(matches!(
            read_from(garbage).await,
            Err(RequestError::Malformed)
        ));
        let mut huge = b"GET /metrics HTTP/1.1\r\n".to_vec();
        huge.extend(std::iter::repeat_n(b'a', MAX_HEAD));
        assert!(matches!(
            read_from(&huge).await,
            Err(RequestError::TooLarge)
        ));
        let endless_line = vec![b'G'; MAX_HEAD + 10];
        assert!(matches!(
            read_from(&endless_line).await,
            Err(RequestError::TooLarge)
        ));
    }

    #[test]
    fn routing_and_response_framing() {
        let text = |bytes: Vec<u8>| String::from_utf8(bytes).unwrap();
        let ok = text(respond(&request("GET", "/metrics"), || "m 1\n".into()));
        assert_eq!(
            ok,
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: 4\r\n\
                 Connection: close\r\n\r\nm 1\n"
            )
        );
        let head = text(respond(&request("HEAD", "/metrics"), || "m 1\n".into()));
        assert!(head.contains("Content-Length: 4\r\n") && head.ends_with("\r\n\r\n"));
        let never = || -> String { panic!("not rendered for other paths") };
        let missing = text(respond(&request("GET", "/nope"), never));
        assert!(
            missing.starts_with("HTTP/1.1 404 Not Found\r\n"),
            "{missing}"
        );
        let post = text(respond(&request("POST", "/metrics"), never));
        assert!(post.starts_with("HTTP/1.1 405 ") && post.contains("Allow: GET, HEAD\r\n"));
    }
}

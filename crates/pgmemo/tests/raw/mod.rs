//! A raw protocol v3 client for tests that need exact control of the messages sent
//! (batches, pipelining, Flush) and see every message type received. Shared by `cache.rs`
//! and `transaction_cache.rs`.

#![allow(dead_code)]

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct Raw {
    stream: TcpStream,
    buf: BytesMut,
}

pub fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

pub fn parse(text: &str, types: &[u32]) -> Vec<u8> {
    parse_named("", text, types)
}

pub fn parse_named(name: &str, text: &str, types: &[u32]) -> Vec<u8> {
    let mut b = name.as_bytes().to_vec();
    b.push(0);
    b.extend_from_slice(text.as_bytes());
    b.push(0);
    b.put_i16(types.len() as i16);
    for t in types {
        b.put_u32(*t);
    }
    msg(b'P', &b)
}

pub fn bind(params: &[&str]) -> Vec<u8> {
    bind_named("", params)
}

/// Bind of the unnamed portal to statement `statement`, text parameters and results.
pub fn bind_named(statement: &str, params: &[&str]) -> Vec<u8> {
    let mut b = vec![0u8];
    b.extend_from_slice(statement.as_bytes());
    b.push(0);
    b.put_i16(0);
    b.put_i16(params.len() as i16);
    for p in params {
        b.put_i32(p.len() as i32);
        b.extend_from_slice(p.as_bytes());
    }
    b.put_i16(0);
    msg(b'B', &b)
}

pub fn describe_portal() -> Vec<u8> {
    msg(b'D', b"P\0")
}

/// Describe of the portal `name`.
pub fn describe_portal_named(name: &str) -> Vec<u8> {
    let mut body = vec![b'P'];
    body.extend_from_slice(name.as_bytes());
    body.push(0);
    msg(b'D', &body)
}

pub fn describe_statement() -> Vec<u8> {
    msg(b'D', b"S\0")
}

/// Bind of the unnamed portal to the unnamed statement, text parameters, and results in
/// the format codes `results` (none: all text; one: for every column).
pub fn bind_results(params: &[&str], results: &[i16]) -> Vec<u8> {
    let mut b = vec![0u8, 0u8];
    b.put_i16(0);
    b.put_i16(params.len() as i16);
    for p in params {
        b.put_i32(p.len() as i32);
        b.extend_from_slice(p.as_bytes());
    }
    b.put_i16(results.len() as i16);
    for r in results {
        b.put_i16(*r);
    }
    msg(b'B', &b)
}

pub fn execute() -> Vec<u8> {
    msg(b'E', b"\0\0\0\0\0")
}

pub fn sync() -> Vec<u8> {
    msg(b'S', b"")
}

pub fn query(sql: &str) -> Vec<u8> {
    let mut b = sql.as_bytes().to_vec();
    b.push(0);
    msg(b'Q', &b)
}

pub fn flush() -> Vec<u8> {
    msg(b'H', b"")
}

pub fn copy_data(data: &[u8]) -> Vec<u8> {
    msg(b'd', data)
}

pub fn copy_done() -> Vec<u8> {
    msg(b'c', b"")
}

impl Raw {
    pub async fn connect(addr: std::net::SocketAddr) -> Raw {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut body = Vec::new();
        body.put_i32(196_608);
        body.extend_from_slice(b"user\0postgres\0database\0postgres\0\0");
        let mut startup = Vec::new();
        startup.put_i32(body.len() as i32 + 4);
        startup.extend_from_slice(&body);
        stream.write_all(&startup).await.unwrap();
        let mut raw = Raw {
            stream,
            buf: BytesMut::new(),
        };
        raw.until_ready().await;
        raw
    }

    /// Sends `messages` and reads `count` messages back: their tags and text columns.
    pub async fn exchange(
        &mut self,
        messages: &[Vec<u8>],
        count: usize,
    ) -> (Vec<char>, Vec<String>) {
        self.stream.write_all(&messages.concat()).await.unwrap();
        let (mut tags, mut values) = (Vec::new(), Vec::new());
        while tags.len() < count {
            while tags.len() < count {
                let Some(frame) = self.next_frame() else {
                    break;
                };
                record(&frame, &mut tags, &mut values);
            }
            if tags.len() < count {
                self.read_more().await;
            }
        }
        (tags, values)
    }

    /// Sends `messages`, returns the tags and text columns of what came back up to
    /// ReadyForQuery.
    pub async fn round_trip(&mut self, messages: &[Vec<u8>]) -> (Vec<char>, Vec<String>) {
        self.stream.write_all(&messages.concat()).await.unwrap();
        self.until_ready().await
    }

    /// Sends `messages`, returns every byte that came back up to and including ReadyForQuery.
    pub async fn round_trip_bytes(&mut self, messages: &[Vec<u8>]) -> Vec<u8> {
        self.stream.write_all(&messages.concat()).await.unwrap();
        let mut out = Vec::new();
        loop {
            while let Some(frame) = self.next_frame() {
                out.extend_from_slice(&frame);
                if frame[0] == b'Z' {
                    return out;
                }
            }
            self.read_more().await;
        }
    }

    async fn until_ready(&mut self) -> (Vec<char>, Vec<String>) {
        let (mut tags, mut values) = (Vec::new(), Vec::new());
        loop {
            while let Some(frame) = self.next_frame() {
                record(&frame, &mut tags, &mut values);
                if frame[0] == b'Z' {
                    return (tags, values);
                }
            }
            self.read_more().await;
        }
    }

    /// The next whole message in the buffer, if one has arrived.
    fn next_frame(&mut self) -> Option<BytesMut> {
        if self.buf.len() < 5 {
            return None;
        }
        let len = i32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        (self.buf.len() > len).then(|| self.buf.split_to(len + 1))
    }

    /// Reads more bytes into the buffer; the server must not have closed the connection.
    async fn read_more(&mut self) {
        let n = self.stream.read_buf(&mut self.buf).await.unwrap();
        assert!(n > 0, "connection closed");
    }
}

/// Notes a message's tag and, for a DataRow, its columns as text.
fn record(frame: &[u8], tags: &mut Vec<char>, values: &mut Vec<String>) {
    tags.push(frame[0] as char);
    if frame[0] == b'D' {
        let mut body = &frame[5..];
        let n = body.get_i16();
        for _ in 0..n {
            let l = body.get_i32();
            values.push(String::from_utf8_lossy(&body[..l.max(0) as usize]).into_owned());
            body.advance(l.max(0) as usize);
        }
    }
}

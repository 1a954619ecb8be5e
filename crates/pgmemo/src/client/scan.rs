//! Finds message boundaries in a stream of protocol bytes so a relay can forward bytes as they
//! arrive, look at the type of every message, and read whole only the few small messages it
//! must understand. Memory stays bounded however large a message or result is.

use wire::{FrameHeader, WireError};

/// What to do with the message that starts at the current position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Forward it.
    Forward,
    /// Stop before it: it is not forwarded, and scanning ends.
    StopBefore,
}

/// Result of one scan over a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scanned {
    /// Bytes at the front of the buffer that may be forwarded now.
    pub forward: usize,
    /// Whether a message asked to stop (the bytes from it on are not forwarded).
    pub stopped: bool,
}

/// Tracks the position inside the message stream across reads.
#[derive(Debug, Default)]
pub struct Scanner {
    /// Bytes of the current message's body that have not arrived yet.
    body_left: usize,
}

impl Scanner {
    /// Whether the stream is inside a message (part of it was forwarded, the rest not yet).
    pub fn mid_message(&self) -> bool {
        self.body_left > 0
    }

    /// Scans `buf` (bytes not yet forwarded). For every message that starts in it, `visit` gets
    /// the type byte and, when `whole(tag, frame_len)` holds, the complete frame (the scan
    /// waits for the rest of such a message before going on); otherwise `None`.
    pub fn scan(
        &mut self,
        buf: &[u8],
        max_frame: usize,
        whole: impl Fn(u8, usize) -> bool,
        mut visit: impl FnMut(u8, Option<&[u8]>) -> Verdict,
    ) -> Result<Scanned, WireError> {
        let mut pos = 0;
        loop {
            if self.body_left > 0 {
                let n = self.body_left.min(buf.len() - pos);
                pos += n;
                self.body_left -= n;
                if self.body_left > 0 {
                    return Ok(Scanned {
                        forward: pos,
                        stopped: false,
                    });
                }
            }
            let Some(header) = FrameHeader::peek(&buf[pos..], max_frame)? else {
                return Ok(Scanned {
                    forward: pos,
                    stopped: false,
                });
            };
            let available = buf.len() - pos;
            let need_whole = whole(header.tag, header.frame_len);
            if need_whole && available < header.frame_len {
                return Ok(Scanned {
                    forward: pos,
                    stopped: false,
                });
            }
            let frame = need_whole.then(|| &buf[pos..pos + header.frame_len]);
            if visit(header.tag, frame) == Verdict::StopBefore {
                return Ok(Scanned {
                    forward: pos,
                    stopped: true,
                });
            }
            if available >= header.frame_len {
                pos += header.frame_len;
            } else {
                self.body_left = header.frame_len - available;
                pos = buf.len();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames() -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(b"D\0\0\0\x08abcd");
        v.extend_from_slice(b"Z\0\0\0\x05I");
        v.extend_from_slice(b"X\0\0\0\x04");
        v
    }

    #[test]
    fn forwards_partial_bodies_and_waits_for_whole_ones() {
        let data = frames();
        let mut s = Scanner::default();
        let mut seen = Vec::new();
        // First 7 bytes: header of D plus 2 body bytes: forward them all.
        let r = s
            .scan(
                &data[..7],
                1024,
                |t, _| t == b'Z',
                |t, _| {
                    seen.push(t);
                    Verdict::Forward
                },
            )
            .unwrap();
        assert_eq!(r.forward, 7);
        assert!(s.mid_message());
        // Rest of D plus half of Z: forward D's rest, wait for Z.
        let r = s
            .scan(
                &data[7..12],
                1024,
                |t, _| t == b'Z',
                |t, _| {
                    seen.push(t);
                    Verdict::Forward
                },
            )
            .unwrap();
        assert_eq!(r.forward, 2);
        let r = s
            .scan(
                &data[9..],
                1024,
                |t, _| t == b'Z',
                |t, f| {
                    seen.push(t);
                    if t == b'Z' {
                        assert_eq!(f.unwrap(), b"Z\0\0\0\x05I");
                    }
                    if t == b'X' {
                        Verdict::StopBefore
                    } else {
                        Verdict::Forward
                    }
                },
            )
            .unwrap();
        assert_eq!(
            r,
            Scanned {
                forward: 6,
                stopped: true
            }
        );
        assert_eq!(seen, vec![b'D', b'Z', b'X']);
    }

    #[test]
    fn rejects_oversized_length() {
        let mut s = Scanner::default();
        let err = s
            .scan(b"Q\x10\0\0\0", 1024, |_, _| false, |_, _| Verdict::Forward)
            .unwrap_err();
        assert!(matches!(err, WireError::TooLarge { .. }));
    }

    proptest::proptest! {
        #[test]
        fn chunking_does_not_change_what_is_seen(split in 0usize..18) {
            let data = frames();
            let split = split.min(data.len());
            let mut whole_seen = Vec::new();
            let mut s = Scanner::default();
            s.scan(&data, 1024, |_, _| false, |t, _| { whole_seen.push(t); Verdict::Forward }).unwrap();
            let mut seen = Vec::new();
            let mut s = Scanner::default();
            let mut buf = data[..split].to_vec();
            let r = s.scan(&buf, 1024, |_, _| false, |t, _| { seen.push(t); Verdict::Forward }).unwrap();
            buf.drain(..r.forward);
            buf.extend_from_slice(&data[split..]);
            s.scan(&buf, 1024, |_, _| false, |t, _| { seen.push(t); Verdict::Forward }).unwrap();
            proptest::prop_assert_eq!(seen, whole_seen);
        }
    }
}

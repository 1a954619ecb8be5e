//! The routing rules both pool modes' caches share about client messages: the one batch form
//! whose result is cached (`[Parse] Bind [Describe] Execute Sync`) and how to find it in the
//! client's buffer, Bind parameters that read the clock, and the session's own
//! `SET pgmemo.cache` switch. The borrowed decoders of Parse and Bind live in
//! `wire::frontend::peek`.

use wire::FrameHeader;

use crate::cache::store::Described;

/// A batch held back to be routed as a whole is at most this large.
const MAX_BATCH: usize = 1 << 20;

/// `SET [SESSION] pgmemo.cache {=|TO} {on|off|default}` (and `RESET pgmemo.cache`): the
/// session's own cache switch, answered by pgmemo.
pub(crate) fn session_switch(text: &[u8]) -> Option<bool> {
    // Every simple query passes here, hits included: reject anything that is not a SET or
    // RESET naming pgmemo without allocating.
    let start = text.iter().position(|c| !c.is_ascii_whitespace())?;
    let first = &text[start..];
    let verb = first
        .get(..3)
        .is_some_and(|w| w.eq_ignore_ascii_case(b"set"))
        || first
            .get(..5)
            .is_some_and(|w| w.eq_ignore_ascii_case(b"reset"));
    if !verb || !text.windows(6).any(|w| w.eq_ignore_ascii_case(b"pgmemo")) {
        return None;
    }
    let text = std::str::from_utf8(text)
        .ok()?
        .trim()
        .trim_end_matches(';')
        .to_ascii_lowercase();
    let text = text.replace('=', " = ");
    let words: Vec<&str> = text.split_whitespace().collect();
    let words: Vec<&str> = match words.as_slice() {
        ["set", "session", rest @ ..] => {
            std::iter::once("set").chain(rest.iter().copied()).collect()
        }
        _ => words,
    };
    match words.as_slice() {
        ["set", "pgmemo.cache", "=" | "to", value] => match value.trim_matches('\'') {
            "on" | "true" | "default" => Some(true),
            "off" | "false" => Some(false),
            _ => None,
        },
        ["reset", "pgmemo.cache"] => Some(true),
        _ => None,
    }
}

pub(crate) enum Batch {
    /// The batch up to and including its Sync is this many bytes.
    Complete(usize),
    /// More bytes are needed to see the whole batch.
    Incomplete,
    /// Not a batch pgmemo holds back (a Flush, a Query, too large).
    Other,
}

pub(crate) fn scan_batch(buf: &[u8], max: usize) -> Batch {
    let mut pos = 0;
    loop {
        let h = match FrameHeader::peek(&buf[pos..], max) {
            Ok(Some(h)) => h,
            Ok(None) if pos < MAX_BATCH => return Batch::Incomplete,
            Ok(None) => return Batch::Other,
            // A malformed header later in the batch: the messages before it go on one by
            // one, and the bad one is reported when it is reached. Waiting for more bytes
            // would wait for ever, buffering whatever the client sends.
            Err(_) => return Batch::Other,
        };
        if !matches!(h.tag, b'P' | b'B' | b'D' | b'E' | b'C' | b'S') {
            return Batch::Other;
        }
        if buf.len() - pos < h.frame_len {
            return if pos + h.frame_len <= MAX_BATCH {
                Batch::Incomplete
            } else {
                Batch::Other
            };
        }
        pos += h.frame_len;
        if h.tag == b'S' {
            // A Sync with a body fails on the server (08P01) after the rest ran: never a
            // batch the cache answers alone.
            if h.frame_len != FrameHeader::SIZE {
                return Batch::Other;
            }
            return Batch::Complete(pos);
        }
    }
}

/// The frames of a whole batch, into `v` (cleared first; a buffer the caller reuses).
pub(crate) fn split_frames(bytes: &[u8], v: &mut Vec<std::ops::Range<usize>>) {
    v.clear();
    let mut pos = 0;
    while let Ok(Some(h)) = FrameHeader::peek(&bytes[pos..], usize::MAX) {
        if bytes.len() - pos < h.frame_len {
            break;
        }
        v.push(pos..pos + h.frame_len);
        pos += h.frame_len;
    }
}

/// The frames of a batch of at most five messages (the longest cacheable form), without
/// allocating: `None` for a longer batch.
pub(crate) fn short_batch(bytes: &[u8]) -> Option<([std::ops::Range<usize>; 5], usize)> {
    let mut frames: [std::ops::Range<usize>; 5] = Default::default();
    let mut n = 0;
    let mut pos = 0;
    while let Ok(Some(h)) = FrameHeader::peek(&bytes[pos..], usize::MAX) {
        if bytes.len() - pos < h.frame_len {
            break;
        }
        *frames.get_mut(n)? = pos..pos + h.frame_len;
        n += 1;
        pos += h.frame_len;
    }
    Some((frames, n))
}

/// The one batch form whose result pgmemo caches.
pub(crate) struct BatchShape {
    pub(crate) parse: bool,
    pub(crate) describe: BatchDescribe,
}

/// The Describe of a cacheable batch.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) enum BatchDescribe {
    None,
    /// Of the unnamed portal.
    Portal,
    /// Of the unnamed statement the batch's own Parse made with every parameter type given
    /// (as tokio-postgres' `query_typed` sends): its ParameterDescription is those types.
    /// Where, in the batch's bytes, the Parse's parameter types (count and OIDs) and the
    /// Bind's result format codes are.
    Statement {
        types: std::ops::Range<usize>,
        formats: std::ops::Range<usize>,
    },
}

impl BatchShape {
    /// What the batch's Describe asks of a stored result; `bytes`: the batch (or a buffer
    /// that starts with it).
    #[inline]
    pub(crate) fn described<'a>(&self, bytes: &'a [u8]) -> Described<'a> {
        match &self.describe {
            BatchDescribe::None => Described::Nothing,
            BatchDescribe::Portal => Described::Portal,
            BatchDescribe::Statement { types, .. } => Described::Statement(&bytes[types.clone()]),
        }
    }

    /// For a capture of a batch that describes its statement: the Bind's result formats (the
    /// stored RowDescription is the portal's, with these formats).
    pub(crate) fn statement_formats(&self, bytes: &[u8]) -> Option<Box<[u8]>> {
        match &self.describe {
            BatchDescribe::Statement { formats, .. } => Some(bytes[formats.clone()].into()),
            _ => None,
        }
    }
}

/// `[Parse] Bind("" portal) [Describe(portal "")] Execute("", 0 rows) Sync`, or `Parse("")
/// Bind("" portal, "") Describe(statement "") Execute("", 0 rows) Sync` when the Parse gives
/// every parameter's type.
pub(crate) fn cacheable_shape(
    bytes: &[u8],
    frames: &[std::ops::Range<usize>],
) -> Option<BatchShape> {
    let mut tags = [0u8; 5];
    if frames.len() > tags.len() {
        return None;
    }
    for (tag, r) in tags.iter_mut().zip(frames) {
        *tag = bytes[r.start];
    }
    let tags = &tags[..frames.len()];
    let body = |i: usize| &bytes[frames[i].start + 5..frames[i].end];
    let (parse, rest) = match tags.first() {
        Some(b'P') => (true, 1),
        _ => (false, 0),
    };
    let describe = match &tags[rest..] {
        [b'B', b'E', b'S'] => BatchDescribe::None,
        [b'B', b'D', b'E', b'S'] => {
            // The target byte and the empty name's NUL.
            let d = body(rest + 1);
            match (d.len(), d.first()) {
                (2, Some(b'P')) if d[1] == 0 => BatchDescribe::Portal,
                // Filled in once the Parse and Bind are read.
                (2, Some(b'S')) if d[1] == 0 && parse => BatchDescribe::Statement {
                    types: 0..0,
                    formats: 0..0,
                },
                _ => return None,
            }
        }
        _ => return None,
    };
    let bind = bind_message(body(rest))?;
    if !bind.portal.is_empty() {
        return None;
    }
    let exec = body(rest + 1 + usize::from(describe != BatchDescribe::None));
    let mut describe = describe;
    if parse {
        let p = parse_message(body(0))?;
        if p.name != bind.statement {
            return None;
        }
        if let BatchDescribe::Statement { .. } = describe {
            describe = statement_described(bytes, &p, &bind)?;
        }
    }
    if exec != b"\0\0\0\0\0" {
        return None;
    }
    Some(BatchShape { parse, describe })
}

/// The Describe of the statement `p` parses (in `bytes`), when pgmemo can answer it: the
/// unnamed statement, with a type for each value the Bind carries, none of them one the
/// server resolves itself (0, unspecified, or 705, `unknown`), so that the server's
/// ParameterDescription lists exactly these types.
/// `unknown`: a parameter of this type is resolved by the server as one of type 0.
const UNKNOWN_OID: u32 = 705;

#[cold]
fn statement_described(
    bytes: &[u8],
    p: &ParseRef<'_>,
    bind: &BindMessage<'_>,
) -> Option<BatchDescribe> {
    let (count, oids) = p.param_types.split_first_chunk::<2>()?;
    let count = usize::try_from(i16::from_be_bytes(*count)).ok()?;
    let counts = bind_counts(bind.tail)?;
    let typed = p.name.is_empty()
        && count == counts.params
        && oids.len() == 4 * count
        && oids
            .chunks_exact(4)
            .all(|oid| oid != [0, 0, 0, 0] && oid != UNKNOWN_OID.to_be_bytes());
    typed.then(|| BatchDescribe::Statement {
        types: range_in(bytes, p.param_types),
        formats: range_in(bytes, counts.result_formats),
    })
}

/// Where `part`, a slice of `bytes`, lies in it.
fn range_in(bytes: &[u8], part: &[u8]) -> std::ops::Range<usize> {
    let start = part.as_ptr() as usize - bytes.as_ptr() as usize;
    start..start + part.len()
}

pub(crate) use wire::frontend::peek::{
    bind as bind_message, bind_counts, cstr, parse as parse_message, BindRef as BindMessage,
    ParseRef,
};

/// Whether a parameter holds `now`, `today`, `tomorrow` or `yesterday`, which a date or time
/// parameter reads as the clock. Binary-format values count too: a text parameter in binary
/// format (as Npgsql sends them) carries its text, which a cast may read as the clock. A
/// binary number that happens to spell a word only costs that request its caching.
pub(crate) fn bind_has_time_word(b: &BindMessage<'_>) -> bool {
    let t = b.tail;
    let read_i16 =
        |at: usize| -> Option<i16> { Some(i16::from_be_bytes([*t.get(at)?, *t.get(at + 1)?])) };
    let Some(nfmt) = read_i16(0) else { return true };
    let nfmt = nfmt.max(0) as usize;
    let mut pos = 2 + 2 * nfmt;
    let Some(nparams) = read_i16(pos) else {
        return true;
    };
    pos += 2;
    for _ in 0..nparams.max(0) as usize {
        let Some(len) = t
            .get(pos..pos + 4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        else {
            return true;
        };
        pos += 4;
        if len < 0 {
            continue;
        }
        let len = len as usize;
        let Some(value) = t.get(pos..pos + len) else {
            return true;
        };
        pos += len;
        if sql::has_time_word(value) {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_switch_forms() {
        assert_eq!(session_switch(b"SET pgmemo.cache = off"), Some(false));
        assert_eq!(
            session_switch(b"set session pgmemo.cache to 'on';"),
            Some(true)
        );
        assert_eq!(session_switch(b"set pgmemo.cache=off"), Some(false));
        assert_eq!(session_switch(b"RESET pgmemo.cache"), Some(true));
        assert_eq!(session_switch(b"set search_path = x"), None);
        assert_eq!(session_switch(b"  \n Set pgmemo.cache TO off"), Some(false));
        assert_eq!(session_switch(b"select 'set pgmemo.cache = off'"), None);
        assert_eq!(session_switch(b"settle"), None);
        assert_eq!(session_switch(b""), None);
    }

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn bind(stmt: &str, params: &[&str]) -> Vec<u8> {
        let mut b = vec![0u8];
        b.extend_from_slice(stmt.as_bytes());
        b.push(0);
        b.extend_from_slice(&0i16.to_be_bytes());
        b.extend_from_slice(&(params.len() as i16).to_be_bytes());
        for p in params {
            b.extend_from_slice(&(p.len() as i32).to_be_bytes());
            b.extend_from_slice(p.as_bytes());
        }
        b.extend_from_slice(&0i16.to_be_bytes());
        msg(b'B', &b)
    }

    fn batch(parts: &[Vec<u8>]) -> (Vec<u8>, Vec<std::ops::Range<usize>>) {
        let bytes = parts.concat();
        let mut frames = Vec::new();
        split_frames(&bytes, &mut frames);
        (bytes, frames)
    }

    #[test]
    fn a_malformed_header_inside_a_batch_is_not_waited_for() {
        let bind = bind("", &[]);
        for bad in [&b"S\0\0\0\0"[..], b"E\xff\xff\xff\xff", b"E\x7f\0\0\0"] {
            let bytes = [&bind[..], bad, &[0u8; 100][..]].concat();
            assert!(
                matches!(scan_batch(&bytes, 1 << 20), Batch::Other),
                "{bad:?}"
            );
        }
        let sync = msg(b'S', b"");
        let whole = [bind.clone(), sync].concat();
        assert!(matches!(scan_batch(&whole, 1 << 20), Batch::Complete(n) if n == whole.len()));
        assert!(matches!(scan_batch(&bind, 1 << 20), Batch::Incomplete));
    }

    #[test]
    fn recognises_the_cacheable_batch_forms() {
        let parse = msg(b'P', b"s1\0SELECT 1\0\0\0");
        let exec = msg(b'E', b"\0\0\0\0\0");
        let sync = msg(b'S', b"");
        let describe = msg(b'D', b"P\0");
        let (b, f) = batch(&[bind("s1", &[]), exec.clone(), sync.clone()]);
        let shape = cacheable_shape(&b, &f).expect("Bind Execute Sync");
        assert!(!shape.parse && shape.describe == BatchDescribe::None);
        let (b, f) = batch(&[
            parse.clone(),
            bind("s1", &[]),
            describe.clone(),
            exec.clone(),
            sync.clone(),
        ]);
        let shape = cacheable_shape(&b, &f).expect("Parse Bind Describe Execute Sync");
        assert!(shape.parse && shape.describe == BatchDescribe::Portal);
        // Parse of another statement than the one bound, a row limit, two Executes: no.
        let (b, f) = batch(&[parse, bind("s2", &[]), exec.clone(), sync.clone()]);
        assert!(cacheable_shape(&b, &f).is_none());
        let (b, f) = batch(&[bind("s1", &[]), msg(b'E', b"\0\0\0\0\x0a"), sync.clone()]);
        assert!(cacheable_shape(&b, &f).is_none());
        let (b, f) = batch(&[bind("s1", &[]), exec.clone(), exec, sync]);
        assert!(cacheable_shape(&b, &f).is_none());
    }

    /// `Parse Bind Describe(statement) Execute Sync` (tokio-postgres' `query_typed`) is
    /// cacheable only when pgmemo can answer the ParameterDescription itself: the unnamed
    /// statement, parsed in the batch, with a type for every value bound.
    #[test]
    fn a_statement_describe_needs_every_parameter_type() {
        let typed = |name: &str, types: &[u32]| {
            let mut b = name.as_bytes().to_vec();
            b.push(0);
            b.extend_from_slice(b"SELECT $1::int\0");
            b.extend_from_slice(&(types.len() as i16).to_be_bytes());
            for t in types {
                b.extend_from_slice(&t.to_be_bytes());
            }
            msg(b'P', &b)
        };
        let describe = msg(b'D', b"S\0");
        let (exec, sync) = (msg(b'E', b"\0\0\0\0\0"), msg(b'S', b""));
        let shape_of = |parts: &[Vec<u8>]| {
            let (b, f) = batch(parts);
            // (parse, the ParameterDescription's types, the Bind's result formats)
            cacheable_shape(&b, &f).map(|s| {
                let types = match s.described(&b) {
                    Described::Statement(t) => Some(t.to_vec()),
                    _ => None,
                };
                (s.parse, types, s.statement_formats(&b))
            })
        };
        let with = |parse: Vec<u8>, bind: Vec<u8>| {
            shape_of(&[parse, bind, describe.clone(), exec.clone(), sync.clone()])
        };
        // bind() asks for text results: no format codes.
        assert_eq!(
            with(typed("", &[23]), bind("", &["7"])),
            Some((
                true,
                Some(b"\0\x01\0\0\0\x17".to_vec()),
                Some(Box::from(&b""[..]))
            ))
        );
        assert_eq!(
            with(typed("", &[0]), bind("", &["7"])),
            None,
            "a type left to the server"
        );
        assert_eq!(
            with(typed("", &[]), bind("", &["7"])),
            None,
            "no types given"
        );
        assert_eq!(
            with(typed("", &[23, 23]), bind("", &["7"])),
            None,
            "counts differ"
        );
        assert_eq!(
            with(typed("s1", &[23]), bind("s1", &["7"])),
            None,
            "a named statement"
        );
        assert_eq!(
            shape_of(&[
                bind("", &["7"]),
                describe.clone(),
                exec.clone(),
                sync.clone()
            ]),
            None,
            "no Parse in the batch"
        );
        assert_eq!(
            with(typed("", &[]), bind("", &[])),
            Some((true, Some(b"\0\0".to_vec()), Some(Box::from(&b""[..])))),
            "no parameters at all"
        );
    }

    #[test]
    fn batches_are_held_until_their_sync() {
        let whole = [bind("", &[]), msg(b'E', b"\0\0\0\0\0"), msg(b'S', b"")].concat();
        assert!(matches!(scan_batch(&whole, 1 << 20), Batch::Complete(n) if n == whole.len()));
        assert!(matches!(
            scan_batch(&whole[..whole.len() - 2], 1 << 20),
            Batch::Incomplete
        ));
        let flushed = [bind("", &[]), msg(b'H', b"")].concat();
        assert!(matches!(scan_batch(&flushed, 1 << 20), Batch::Other));
    }

    #[test]
    fn time_words_in_text_parameters_are_found() {
        let has = |params: &[&str]| {
            let b = bind("", params);
            bind_has_time_word(&bind_message(&b[5..]).unwrap())
        };
        assert!(has(&["1", "now"]));
        assert!(has(&[" Today "]));
        assert!(!has(&["1", "nowhere else at all"]));
        assert!(!has(&["42"]));
    }
}

#[cfg(test)]
mod time_word_tests {
    use super::*;

    /// A Bind tail: per-parameter formats, then the values, then no result formats.
    fn tail(formats: &[i16], values: &[&str]) -> Vec<u8> {
        let mut t = Vec::new();
        t.extend_from_slice(&(formats.len() as i16).to_be_bytes());
        for f in formats {
            t.extend_from_slice(&f.to_be_bytes());
        }
        t.extend_from_slice(&(values.len() as i16).to_be_bytes());
        for v in values {
            t.extend_from_slice(&(v.len() as i32).to_be_bytes());
            t.extend_from_slice(v.as_bytes());
        }
        t.extend_from_slice(&0i16.to_be_bytes());
        t
    }

    fn has(formats: &[i16], values: &[&str]) -> bool {
        let t = tail(formats, values);
        bind_has_time_word(&BindMessage {
            portal: b"",
            statement: b"",
            tail: &t,
        })
    }

    #[test]
    fn text_parameters_that_read_the_clock_are_found() {
        assert!(has(&[], &["1", " NOW "]));
        assert!(has(&[0], &["Today"]));
        assert!(has(&[0, 0], &["x", "yesterday"]));
        assert!(has(&[], &["tomorrow 12:00"]));
        assert!(!has(&[], &["1", "no"]));
        assert!(!has(&[], &["42", "2024-01-01"]));
        // A text parameter in binary format carries its text.
        assert!(has(&[1], &["now"]));
        assert!(has(&[1, 0], &["42", "now"]));
        assert!(!has(&[1], &["42"]));
        // A word anywhere, as a field of its own (`'00:00 tomorrow'`), in a value short
        // enough to be date/time input.
        assert!(has(&[], &["tomorrow 00:00:00"]));
        assert!(has(&[], &["00:00 Tomorrow"]));
        assert!(has(&[], &["now is a long sentence here"]));
        let long = format!("now {}", "x".repeat(200));
        assert!(!has(&[], &[long.as_str()]));
    }
}

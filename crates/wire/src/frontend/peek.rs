//! Borrowed views of the extended-protocol messages a cache routes on its hit path: just the
//! name, text, parameter-type and parameter parts of Parse and Bind bodies, as slices of the
//! client's buffer, without decoding or allocating anything. [`super::extended`] decodes the
//! same messages into owned values when they are to be rewritten.

/// A NUL-terminated string at the start of `b`, and what follows it.
pub fn cstr(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let nul = memchr::memchr(0, b)?;
    Some((&b[..nul], &b[nul + 1..]))
}

/// A Parse body's parts.
pub struct ParseRef<'a> {
    pub name: &'a [u8],
    pub text: &'a [u8],
    /// The parameter type count and OIDs, as sent.
    pub param_types: &'a [u8],
}

/// Splits a Parse body (after the type byte and length); `None` when a string is unterminated.
pub fn parse(body: &[u8]) -> Option<ParseRef<'_>> {
    let (name, rest) = cstr(body)?;
    let (text, param_types) = cstr(rest)?;
    Some(ParseRef {
        name,
        text,
        param_types,
    })
}

/// A Bind body's parts.
pub struct BindRef<'a> {
    pub portal: &'a [u8],
    pub statement: &'a [u8],
    /// Parameter formats and values and result formats, as sent: what a cache key takes from
    /// a Bind.
    pub tail: &'a [u8],
}

/// Splits a Bind body (after the type byte and length); `None` when a name is unterminated.
pub fn bind(body: &[u8]) -> Option<BindRef<'_>> {
    let (portal, rest) = cstr(body)?;
    let (statement, tail) = cstr(rest)?;
    Some(BindRef {
        portal,
        statement,
        tail,
    })
}

/// What a Bind's tail ([`BindRef::tail`]) says beyond the values themselves.
pub struct BindCounts<'a> {
    /// How many parameter values it carries.
    pub params: usize,
    /// The result format codes as sent (two bytes each, without their count): none means
    /// all text, one applies to every column, otherwise one per column.
    pub result_formats: &'a [u8],
}

/// Walks a Bind tail; `None` when its counts and lengths do not add up exactly.
pub fn bind_counts(tail: &[u8]) -> Option<BindCounts<'_>> {
    let count = |at: usize| -> Option<usize> {
        let n = i16::from_be_bytes(tail.get(at..at + 2)?.try_into().ok()?);
        usize::try_from(n).ok()
    };
    let mut at = 2 + 2 * count(0)?;
    let params = count(at)?;
    at += 2;
    for _ in 0..params {
        let len = i32::from_be_bytes(tail.get(at..at + 4)?.try_into().ok()?);
        at += 4 + usize::try_from(len).unwrap_or(0);
    }
    let results = count(at)?;
    let result_formats = tail.get(at + 2..)?;
    (result_formats.len() == 2 * results).then_some(BindCounts {
        params,
        result_formats,
    })
}

/// The format code of result column `i` under `codes` (as in [`BindCounts::result_formats`]).
pub fn result_format(codes: &[u8], i: usize) -> i16 {
    let code = |j: usize| {
        codes
            .get(2 * j..2 * j + 2)
            .map(|b| i16::from_be_bytes([b[0], b[1]]))
    };
    match codes.len() {
        0 => 0,
        2 => code(0).unwrap_or(0),
        _ => code(i).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_parse_and_bind_bodies() {
        let p = parse(b"s1\0SELECT $1\0\0\x01\0\0\0\x17").unwrap();
        assert_eq!(
            (p.name, p.text, p.param_types),
            (&b"s1"[..], &b"SELECT $1"[..], &b"\0\x01\0\0\0\x17"[..])
        );
        let b = bind(b"\0s1\0\0\0\0\0\0\0").unwrap();
        assert_eq!((b.portal, b.statement), (&b""[..], &b"s1"[..]));
        assert_eq!(b.tail, b"\0\0\0\0\0\0");
        assert!(parse(b"unterminated").is_none());
        assert!(bind(b"p\0s").is_none());
    }

    #[test]
    fn reads_a_bind_tails_counts_and_result_formats() {
        // One format code (binary) for two parameters: 7 and NULL; two result codes.
        let tail = b"\0\x01\0\x01\0\x02\0\0\0\x01\x37\xff\xff\xff\xff\0\x02\0\0\0\x01";
        let c = bind_counts(tail).unwrap();
        assert_eq!((c.params, c.result_formats), (2, &b"\0\0\0\x01"[..]));
        assert_eq!(
            (0..3)
                .map(|i| result_format(c.result_formats, i))
                .collect::<Vec<_>>(),
            [0, 1, 0]
        );
        assert_eq!(result_format(b"", 5), 0);
        assert_eq!(
            result_format(b"\0\x01", 5),
            1,
            "one code applies to every column"
        );
        assert!(bind_counts(&tail[..tail.len() - 1]).is_none(), "truncated");
        assert!(
            bind_counts(b"\0\0\0\x01\0\0\0\x09x\0\0").is_none(),
            "value past the end"
        );
        let no_params = bind_counts(b"\0\0\0\0\0\0").unwrap();
        assert_eq!((no_params.params, no_params.result_formats), (0, &b""[..]));
    }
}

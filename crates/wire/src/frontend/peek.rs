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
}

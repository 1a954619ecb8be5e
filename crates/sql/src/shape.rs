//! The shape of a query string: its text with literal values blanked out, found by a small
//! lexer instead of the parser. pgmemo memoizes analyses by shape, so a stream of lookups that
//! differ only in their constants (`... WHERE id = 1`, `... WHERE id = 2`) is parsed once, and
//! every later miss costs a scan of the text rather than a full parse.
//!
//! The lexer follows PostgreSQL's scanner where it matters for finding literals: standard and
//! escape strings (`'it''s'`, `E'\''`), dollar quoting (`$tag$ ... $tag$`), quoted identifiers,
//! nested block comments and line comments. Anything it cannot classify is kept verbatim, so
//! two texts with the same shape differ only in the values of literals, never in structure.

/// A query string's shape and what the blanked literals held that matters to caching.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// The text with every string and numeric literal replaced by `?` and comments removed.
    pub text: String,
    /// A string literal holds one of the special time inputs (`now`, `today`, `tomorrow`,
    /// `yesterday`, `allballs` excluded): cast to a date or time type it reads the clock, so
    /// the statement is time-dependent without calling any function.
    pub time_literal: bool,
    /// A comment holds a pgmemo hint or Pgpool-II's `NO QUERY CACHE`; the comments are kept
    /// here (in order) because the shape drops them.
    pub hints: Vec<String>,
}

/// Computes the shape of `sql`. `standard_conforming_strings` tells how backslashes in plain
/// string literals are read, as the session would.
pub fn shape(sql: &str, standard_conforming_strings: bool) -> Shape {
    let mut out = Vec::with_capacity(sql.len());
    let ShapeFacts {
        time_literal,
        hints,
    } = shape_into(sql, standard_conforming_strings, &mut out);
    Shape {
        // Only whole runs of `sql` (cut at ASCII bytes) and ASCII were written.
        text: String::from_utf8(out).expect("a shape is cut from UTF-8 text at ASCII bytes"),
        time_literal,
        hints,
    }
}

/// What [`shape_into`] found besides the shape's text: see [`Shape`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShapeFacts {
    pub time_literal: bool,
    pub hints: Vec<String>,
}

/// Appends the shape of `sql` to `out` (see [`shape`]; the bytes appended are its `text`).
///
/// Every miss of a simple query computes a shape to look its plan up, so this writes into a
/// buffer the caller keeps (nothing allocated unless a comment holds a hint), copies the text
/// between literals and comments in runs rather than token by token, and looks closely only at
/// the few bytes that can begin a literal or a comment: everything between them is kept.
pub fn shape_into(sql: &str, standard_conforming_strings: bool, out: &mut Vec<u8>) -> ShapeFacts {
    let b = sql.as_bytes();
    let base = out.len();
    out.reserve(b.len());
    let mut facts = ShapeFacts::default();
    // The value so far of a string literal continued on the next line (`'to'` newline
    // `'day'` is `'today'`).
    let mut continued: Option<Vec<u8>> = None;
    let mut i = 0;
    // `sql[copied..i]` is kept verbatim and not written to `out` yet. Both always sit on an
    // ASCII byte or at the end: runs end before a special ASCII byte or after a token.
    let mut copied = 0;
    loop {
        i = next_special(b, i);
        let Some(&c) = b.get(i) else { break };
        // Whether the byte ends a word: a digit there is part of it, a quote may follow an
        // `E` prefix, a `$` does not open a dollar quote.
        let after_word = i > 0 && is_word_byte(b[i - 1]);
        match c {
            b'-' if b.get(i + 1) == Some(&b'-') => {
                out.extend_from_slice(&b[copied..i]);
                let end = find_byte(b, i, b'\n').unwrap_or(b.len());
                note_hint(&sql[i..end], &mut facts.hints);
                out.push(b' ');
                i = end;
                copied = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                out.extend_from_slice(&b[copied..i]);
                let end = block_comment_end(b, i);
                note_hint(&sql[i..end], &mut facts.hints);
                out.push(b' ');
                i = end;
                copied = end;
            }
            b'\'' => {
                out.extend_from_slice(&b[copied..i]);
                let escape = !standard_conforming_strings
                    || (after_word && ends_with_escape_prefix(&out[base..]));
                let (end, body_end) = string_end(b, i + 1, escape);
                let unicode = i >= 2 && b[i - 1] == b'&' && b[i - 2].eq_ignore_ascii_case(&b'u');
                facts.time_literal |= literal_reads_clock(
                    &b[i + 1..body_end],
                    Prefix { escape, unicode },
                    &b[end..],
                    &mut continued,
                );
                out.push(b'?');
                i = end;
                copied = end;
            }
            b'"' => i = quoted_identifier_end(b, i + 1),
            b'$' if dollar_tag(b, i).is_some() => {
                out.extend_from_slice(&b[copied..i]);
                let tag_len = dollar_tag(b, i).unwrap_or(1);
                let tag = &b[i..i + tag_len];
                let body_start = i + tag_len;
                let end = find_slice(b, body_start, tag).map_or(b.len(), |p| p + tag_len);
                let body_end = end.saturating_sub(tag_len).max(body_start);
                facts.time_literal |= has_time_word(&b[body_start..body_end]);
                out.push(b'?');
                i = end;
                copied = end;
            }
            b'0'..=b'9' | b'.' if !after_word && starts_number(b, i) => {
                out.extend_from_slice(&b[copied..i]);
                i = number_end(b, i);
                out.push(b'?');
                copied = i;
            }
            // A digit or `$` inside a word (`t1`, `a$b`, `$1`): the rest of the word is kept.
            _ if is_word_byte(c) => {
                i += 1;
                while i < b.len() && is_word_byte(b[i]) {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    out.extend_from_slice(&b[copied..]);
    facts
}

/// Bytes that may begin a comment, a literal or a quoted identifier (a table: the lexer asks
/// for every byte of every query; all others are kept as they are).
static SPECIAL_BYTES: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        t[i] = c.is_ascii_digit() || matches!(c, b'-' | b'/' | b'\'' | b'"' | b'$' | b'.');
        i += 1;
    }
    t
};

fn is_special(c: u8) -> bool {
    SPECIAL_BYTES[c as usize]
}

/// The first special byte at or after `i` (or the end). Eight bytes at a time: every special
/// byte lies in `"`..=`9` (0x22..=0x39), so a chunk without any byte in that range (most
/// chunks of words, blanks, `=` and `;`) is passed with a few arithmetic operations.
#[inline(always)]
fn next_special(b: &[u8], mut i: usize) -> usize {
    while let Some(chunk) = b.get(i..i + 8) {
        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        if has_byte_between(word, b'"' - 1, b'9' + 1) {
            if let Some(k) = chunk.iter().position(|&c| is_special(c)) {
                return i + k;
            }
        }
        i += 8;
    }
    while i < b.len() && !is_special(b[i]) {
        i += 1;
    }
    i
}

/// Whether a byte of `word` is greater than `above` and less than `below` (both at most 127;
/// bytes of 128 and more never are): "Determine if a word has a byte between m and n" of
/// Sean Anderson's Bit Twiddling Hacks.
#[inline(always)]
fn has_byte_between(word: u64, above: u8, below: u8) -> bool {
    const ONES: u64 = u64::MAX / 255;
    const HIGHS: u64 = ONES * 0x80;
    let low7 = word & (ONES * 127);
    let below = ONES * (127 + u64::from(below));
    let above = ONES * (127 - u64::from(above));
    (below.wrapping_sub(low7) & !word & low7.wrapping_add(above) & HIGHS) != 0
}

/// Bytes that continue a word (a table: the lexer asks for every byte of every query).
static WORD_BYTES: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        t[i] = c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80 || c == b'$';
        i += 1;
    }
    t
};

fn is_word_byte(c: u8) -> bool {
    WORD_BYTES[c as usize]
}

/// `E'...'` (or `e'...'`) starts an escape string; the prefix is the word just written.
fn ends_with_escape_prefix(out: &[u8]) -> bool {
    let word = out
        .rsplit(|&c| !(c.is_ascii_alphanumeric() || c == b'_' || c == b'$'))
        .next()
        .unwrap_or(b"");
    word.eq_ignore_ascii_case(b"e")
}

fn note_hint(comment: &str, hints: &mut Vec<String>) {
    let lower = comment.to_ascii_lowercase();
    if lower.contains("pgmemo:") || lower.contains("no query cache") {
        hints.push(comment.to_owned());
    }
}

/// Most bytes PostgreSQL reads as date/time input (`MAXDATELEN`): a value with more letters
/// and digits is refused by every date/time type, so it cannot read the clock. (Blanks and
/// most punctuation are not counted there: `'now'` padded with spaces is still `now`.)
const MAX_DATE_INPUT: usize = 128;

/// How a string literal was introduced.
#[derive(Clone, Copy)]
struct Prefix {
    /// Backslashes escape (`E'...'`, or `standard_conforming_strings` off).
    escape: bool,
    /// `U&'...'`: backslash (or `UESCAPE`) escapes give code points.
    unicode: bool,
}

/// Whether a string literal's value, as PostgreSQL reads it, is clock-reading date/time
/// input (see [`has_time_word`]). `body` is the text between the quotes, `rest` the text
/// after the literal, `continued` the value of the literal this one continues (if any).
fn literal_reads_clock(
    body: &[u8],
    prefix: Prefix,
    rest: &[u8],
    continued: &mut Option<Vec<u8>>,
) -> bool {
    if prefix.unicode && (body.contains(&b'\\') || uescape_follows(rest)) {
        // A unicode escape can spell any letter; such literals are rare enough to refuse.
        return true;
    }
    let decoded;
    let value: &[u8] = if prefix.escape && body.contains(&b'\\') {
        decoded = unescape(body);
        &decoded
    } else {
        body
    };
    let joined = continued.take().map(|mut v| {
        v.extend_from_slice(value);
        v
    });
    let value = joined.as_deref().unwrap_or(value);
    let reads = has_time_word(value);
    if continues_on_next_line(rest) {
        *continued = Some(value.to_vec());
    }
    reads
}

/// The value of an escape string's body: `\n`, octal, hex and unicode escapes, and `\`
/// before any other character. Code points past ASCII become a byte no date/time input holds.
fn unescape(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let c = body[i];
        i += 1;
        if c != b'\\' {
            out.push(c);
            if c == b'\'' && body.get(i) == Some(&b'\'') {
                i += 1;
            }
            continue;
        }
        let Some(&e) = body.get(i) else { break };
        i += 1;
        let digits = |i: &mut usize, max: usize, radix: u32| {
            let mut v: u32 = 0;
            let mut n = 0;
            while n < max {
                match body.get(*i).and_then(|&d| (d as char).to_digit(radix)) {
                    Some(d) => v = v * radix + d,
                    None => break,
                }
                *i += 1;
                n += 1;
            }
            (v, n)
        };
        let byte = match e {
            b'b' => 8,
            b'f' => 12,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'0'..=b'7' => {
                i -= 1;
                digits(&mut i, 3, 8).0 as u8
            }
            b'x' => match digits(&mut i, 2, 16) {
                (v, n) if n > 0 => v as u8,
                _ => b'x',
            },
            b'u' | b'U' => {
                let (v, _) = digits(&mut i, if e == b'u' { 4 } else { 8 }, 16);
                u8::try_from(v).ok().filter(u8::is_ascii).unwrap_or(0x80)
            }
            other => other,
        };
        out.push(byte);
    }
    out
}

/// Whether a `UESCAPE` clause follows a `U&'...'` literal (blanks and comments aside).
fn uescape_follows(rest: &[u8]) -> bool {
    let start = rest
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(rest.len());
    rest[start..]
        .get(..7)
        .is_some_and(|w| w.eq_ignore_ascii_case(b"uescape"))
        || rest[start..].starts_with(b"/*")
        || rest[start..].starts_with(b"--")
}

/// Whether the literal goes on in the next one: blanks holding a line break (line comments
/// count as such), then a quote, as PostgreSQL's scanner joins them.
fn continues_on_next_line(rest: &[u8]) -> bool {
    let mut i = 0;
    let mut newline = false;
    while i < rest.len() {
        match rest[i] {
            b'\n' | b'\r' => newline = true,
            b' ' | b'\t' | b'\x0c' => {}
            b'-' if rest.get(i + 1) == Some(&b'-') => {
                while i < rest.len() && rest[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'\'' => return newline,
            _ => return false,
        }
        i += 1;
    }
    false
}

/// Whether a value, read as date/time input, holds one of the special words that read the
/// clock (`now`, `today`, `tomorrow`, `yesterday`) as a field of its own, anywhere
/// (`'00:00 tomorrow'` is midnight tonight), ignoring case. Such input makes an otherwise
/// immutable statement's result change with time.
pub fn has_time_word(value: &[u8]) -> bool {
    // PostgreSQL's date/time lexer takes letters, digits and blanks, and skips any other
    // ASCII punctuation as a field separator (`'(today)'`, `'"now"'`); so do the element
    // and bound parsers of arrays and ranges around it (`'{now}'::timestamptz[]`,
    // `'[today,)'::daterange`). Anything else (a non-ASCII letter) makes it refuse the input.
    let date_char =
        |c: &u8| c.is_ascii_alphanumeric() || c.is_ascii_whitespace() || c.is_ascii_punctuation();
    if !value.iter().all(date_char)
        || value.iter().filter(|c| c.is_ascii_alphanumeric()).count() > MAX_DATE_INPUT
    {
        return false;
    }
    value.split(|c| !c.is_ascii_alphabetic()).any(|w| {
        [&b"now"[..], b"today", b"tomorrow", b"yesterday"]
            .iter()
            .any(|t| w.eq_ignore_ascii_case(t))
    })
}

fn find_byte(b: &[u8], from: usize, needle: u8) -> Option<usize> {
    b[from..]
        .iter()
        .position(|&c| c == needle)
        .map(|p| p + from)
}

fn find_slice(b: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || from > b.len() {
        return None;
    }
    b[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// End (exclusive) of a block comment starting at `i`; PostgreSQL's comments nest.
fn block_comment_end(b: &[u8], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            depth += 1;
            i += 2;
        } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    b.len()
}

/// End (exclusive) of a string literal whose body starts at `i` (just past its closing quote,
/// or the end of the text when it is not closed), and the end of its body.
fn string_end(b: &[u8], mut i: usize, backslash_escapes: bool) -> (usize, usize) {
    while i < b.len() {
        match b[i] {
            b'\\' if backslash_escapes => i += 2,
            b'\'' if b.get(i + 1) == Some(&b'\'') => i += 2,
            b'\'' => return (i + 1, i),
            _ => i += 1,
        }
    }
    (b.len(), b.len())
}

fn quoted_identifier_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() {
        if b[i] == b'"' {
            if b.get(i + 1) == Some(&b'"') {
                i += 2;
                continue;
            }
            return i + 1;
        }
        i += 1;
    }
    b.len()
}

/// Length of a dollar-quote tag (`$$` or `$tag$`) starting at `i`, if one starts there.
/// `$1` is a parameter, not a tag.
fn dollar_tag(b: &[u8], i: usize) -> Option<usize> {
    if i > 0 && is_word_byte(b[i - 1]) {
        return None;
    }
    let mut j = i + 1;
    if b.get(j).is_some_and(|c| c.is_ascii_digit()) {
        return None;
    }
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_' || b[j] >= 0x80) {
        j += 1;
    }
    (b.get(j) == Some(&b'$')).then_some(j + 1 - i)
}

fn starts_number(b: &[u8], i: usize) -> bool {
    b[i].is_ascii_digit() || (b[i] == b'.' && b.get(i + 1).is_some_and(|c| c.is_ascii_digit()))
}

fn number_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'_') {
        // An exponent sign belongs to the number: 1e-5.
        if (b[i] == b'e' || b[i] == b'E') && matches!(b.get(i + 1), Some(b'+' | b'-')) {
            i += 2;
            continue;
        }
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(sql: &str) -> String {
        shape(sql, true).text
    }

    #[test]
    fn literals_are_blanked() {
        assert_eq!(
            s("SELECT a FROM t WHERE id = 42 AND name = 'x''y'"),
            "SELECT a FROM t WHERE id = ? AND name = ?"
        );
        assert_eq!(s("select 1.5e-3, .5, $1"), "select ?, ?, $1");
        assert_eq!(s("select $$a'b$$, $q$x$q$"), "select ?, ?");
        assert_eq!(s("select t1.c2 from t1"), "select t1.c2 from t1");
        assert_eq!(s(r"select E'a\'b', 1"), "select E?, ?");
    }

    #[test]
    fn same_shape_for_different_values_only() {
        assert_eq!(
            s("select * from t where a = 1"),
            s("select * from t where a = 2")
        );
        assert_ne!(
            s("select * from t where a = 1"),
            s("select * from u where a = 1")
        );
        assert_ne!(s("select \"A\" from t"), s("select \"B\" from t"));
    }

    #[test]
    fn comments_are_dropped_but_hints_kept() {
        let sh = shape("/* pgmemo:ttl=30s */ select 1 -- trailing", true);
        assert_eq!(sh.text.trim(), "select ?");
        assert_eq!(sh.hints, vec!["/* pgmemo:ttl=30s */".to_owned()]);
        assert_eq!(s("select /* a /* nested */ b */ 1"), "select   ?");
    }

    #[test]
    fn time_words_are_noticed() {
        assert!(shape("select 'now'::timestamptz", true).time_literal);
        assert!(shape("select 'Today'::date", true).time_literal);
        assert!(shape("select $$tomorrow$$::date", true).time_literal);
        assert!(!shape("select 'nowhere'", true).time_literal);
        assert!(shape("select '00:00 tomorrow'::timestamptz", true).time_literal);
        assert!(shape("select '2024-01-01 today'::date", true).time_literal);
        // Punctuation separates fields; arrays and ranges hold date/time input too.
        assert!(shape("select '[today,tomorrow)'::daterange", true).time_literal);
        assert!(shape("select '{now}'::timestamptz[]", true).time_literal);
        assert!(shape("select '\"now\"'::timestamptz", true).time_literal);
        assert!(shape("select '(today)'::date", true).time_literal);
        assert!(has_time_word(b"#today!"));
        assert!(
            !has_time_word("tod\u{e4}y now".as_bytes()),
            "not date/time input"
        );
    }

    #[test]
    fn time_words_spelled_with_escapes_or_continuations_are_noticed() {
        let time = |sql: &str| shape(sql, true).time_literal;
        // Escape strings are read as PostgreSQL reads them.
        assert!(time(r"select E'\x74oday'::date"));
        assert!(time(r"select e'\164oday'::date"));
        assert!(time(r"select E'\u006eow'::timestamptz"));
        assert!(time(r"select E'to\day'::date"));
        assert!(!time(r"select E'line\nbreak'"));
        assert!(shape(r"select 'n\x6fw'::date", false).time_literal);
        // Unicode escapes can spell anything.
        assert!(time(r"select U&'\006Eow'::timestamptz"));
        assert!(time("select U&'!006Eow' UESCAPE '!'::timestamptz"));
        assert!(!time("select U&'plain'"));
        // A literal continued on the next line is one value.
        assert!(time("select 'to'\n'day'::date"));
        assert!(time("select 'to' -- c\n  'mor'\n'row'::date"));
        assert!(!time("select 'to' 'day'"), "a syntax error, not a literal");
        // Blanks do not count toward PostgreSQL's limit on date/time input.
        assert!(time(&format!(
            "select 'now{}'::timestamptz",
            " ".repeat(300)
        )));
        assert!(!time(&format!("select 'now {}'::text", "x".repeat(300))));
    }

    #[test]
    fn backslashes_follow_standard_conforming_strings() {
        // With standard_conforming_strings off, \' does not end the literal.
        assert_eq!(shape(r"select 'a\'b', 1", false).text, "select ?, ?");
        assert_eq!(shape(r"select 'a\', 1", true).text, "select ?, ?");
    }

    #[test]
    fn words_of_every_length_end_where_they_end() {
        for len in 1..=25 {
            let word = "w".repeat(len);
            for (after, shaped) in [("", ""), (" = 1", " = ?"), ("'x'", "?"), ("(7)", "(?)")] {
                let sql = format!("SELECT {word}{after}");
                assert_eq!(s(&sql), format!("SELECT {word}{shaped}"), "{sql:?}");
            }
        }
        // A digit inside a word is part of it; after a word's end it starts a number.
        assert_eq!(
            s("SELECT abcdefgh12345678 + 12345678"),
            "SELECT abcdefgh12345678 + ?"
        );
    }

    #[test]
    fn shape_into_appends_and_reads_only_its_own_text() {
        let mut out = b"xyz e".to_vec();
        let facts = shape_into("SELECT '\\' FROM t /* pgmemo:nocache */", true, &mut out);
        // Standard strings: the backslash is a character and the quote after it ends the
        // literal; the bytes already in `out` (ending in a word `e`) do not make it an E string.
        assert_eq!(out, b"xyz eSELECT ? FROM t  ".to_vec());
        assert_eq!(facts.hints, vec!["/* pgmemo:nocache */".to_owned()]);
        // A word at the very start is read alone, not with the word bytes before it in `out`.
        let mut out = b"prefix".to_vec();
        shape_into("E'\\'' || x", true, &mut out);
        assert_eq!(out, b"prefixE? || x".to_vec());
    }

    #[test]
    fn the_chunk_test_finds_every_byte_in_its_range_and_no_other() {
        for lane in 0..8 {
            for c in 0..=255u8 {
                let mut chunk = [b'a'; 8];
                chunk[lane] = c;
                let word = u64::from_le_bytes(chunk);
                assert_eq!(
                    has_byte_between(word, b'"' - 1, b'9' + 1),
                    (b'"'..=b'9').contains(&c),
                    "byte {c:#x} in lane {lane}"
                );
            }
        }
        for c in 0..=255u8 {
            assert!(!is_special(c) || (b'"'..=b'9').contains(&c), "{c:#x}");
        }
        let text = b"SELECT abalance FROM pgbench_accounts WHERE aid = 42;";
        let at = text.iter().position(|&c| c == b'4').unwrap();
        for from in 0..=at {
            assert_eq!(next_special(text, from), at);
        }
        assert_eq!(next_special(b"a, b, c (d) * e + f # g % h & i", 0), 31);
    }
}

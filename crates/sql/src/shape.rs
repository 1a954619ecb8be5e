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
///
/// Every miss of a simple query computes a shape, so text between literals and comments is
/// copied in runs rather than token by token, and nothing is allocated beyond the result.
pub fn shape(sql: &str, standard_conforming_strings: bool) -> Shape {
    let b = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let mut time_literal = false;
    let mut hints = Vec::new();
    let mut i = 0;
    // `sql[copied..i]` is kept verbatim and not written to `out` yet. Both always sit on an
    // ASCII byte or at the end: runs end before a special ASCII byte or after a token.
    let mut copied = 0;
    let mut last_word_end = usize::MAX;
    while i < b.len() {
        let c = b[i];
        match c {
            b'-' if b.get(i + 1) == Some(&b'-') => {
                out.push_str(&sql[copied..i]);
                let end = find_byte(b, i, b'\n').unwrap_or(b.len());
                note_hint(&sql[i..end], &mut hints);
                out.push(' ');
                i = end;
                copied = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                out.push_str(&sql[copied..i]);
                let end = block_comment_end(b, i);
                note_hint(&sql[i..end], &mut hints);
                out.push(' ');
                i = end;
                copied = end;
            }
            b'\'' => {
                out.push_str(&sql[copied..i]);
                let escape = !standard_conforming_strings
                    || (last_word_end == i && ends_with_escape_prefix(&out));
                let (end, body_end) = string_end(b, i + 1, escape);
                time_literal |= is_time_word(&b[i + 1..body_end]);
                out.push('?');
                i = end;
                copied = end;
            }
            b'"' => i = quoted_identifier_end(b, i + 1),
            b'$' if dollar_tag(b, i).is_some() => {
                out.push_str(&sql[copied..i]);
                let tag_len = dollar_tag(b, i).unwrap_or(1);
                let tag = &b[i..i + tag_len];
                let body_start = i + tag_len;
                let end = find_slice(b, body_start, tag).map_or(b.len(), |p| p + tag_len);
                let body_end = end.saturating_sub(tag_len).max(body_start);
                time_literal |= is_time_word(&b[body_start..body_end]);
                out.push('?');
                i = end;
                copied = end;
            }
            b'0'..=b'9' | b'.' if last_word_end != i && starts_number(b, i) => {
                out.push_str(&sql[copied..i]);
                i = number_end(b, i);
                out.push('?');
                copied = i;
            }
            _ if is_word_byte(c) => {
                while i < b.len() && is_word_byte(b[i]) {
                    i += 1;
                }
                last_word_end = i;
            }
            // Every other byte is ASCII (bytes >= 0x80 belong to words) and kept.
            _ => i += 1,
        }
    }
    out.push_str(&sql[copied..]);
    Shape {
        text: out,
        time_literal,
        hints,
    }
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
fn ends_with_escape_prefix(out: &str) -> bool {
    let word: &str = out
        .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$'))
        .next()
        .unwrap_or("");
    word.eq_ignore_ascii_case("e")
}

fn note_hint(comment: &str, hints: &mut Vec<String>) {
    let lower = comment.to_ascii_lowercase();
    if lower.contains("pgmemo:") || lower.contains("no query cache") {
        hints.push(comment.to_owned());
    }
}

/// Whether a literal's text (as written) is one of the special time inputs, alone or followed
/// by more words (`'today 10:00'`), ignoring case and surrounding blanks.
fn is_time_word(value: &[u8]) -> bool {
    let v = value.trim_ascii();
    ["now", "today", "tomorrow", "yesterday"].iter().any(|w| {
        let w = w.as_bytes();
        v.len() >= w.len()
            && v[..w.len()].eq_ignore_ascii_case(w)
            && (v.len() == w.len() || v[w.len()] == b' ')
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
    }

    #[test]
    fn backslashes_follow_standard_conforming_strings() {
        // With standard_conforming_strings off, \' does not end the literal.
        assert_eq!(shape(r"select 'a\'b', 1", false).text, "select ?, ?");
        assert_eq!(shape(r"select 'a\', 1", true).text, "select ?, ?");
    }
}

//! A parser-free prefilter for transaction pooling: one pass over the bytes of a query string
//! that tells whether it could touch session state, so that the proxy runs the full
//! [`analyze`](crate::analyze) only for the few strings that might.
//!
//! The answer may be a false positive (that only costs a parse) but never a false negative
//! (that would let session state leak between clients sharing a server connection). The scan
//! does not track string literals, quoted identifiers or dollar quotes: every `;` is taken as a
//! possible statement boundary and every word is checked, inside literals and comments too.
//! Comments are skipped only to find the first word of a statement, and without trusting them:
//! a `/*` or `--` that turns out to sit inside a literal cannot hide a later statement (see
//! [`Starts`]).

/// Words starting with this name the session's temporary schema (`pg_temp`, `pg_temp_3`):
/// `CREATE TABLE pg_temp.t` makes a temporary table without saying `TEMP`.
const TEMP_SCHEMA_PREFIX: &[u8] = b"PG_TEMP";

/// Whether `sql` could contain a statement that changes or depends on session state: one that
/// begins with `SET`, `RESET`, `PREPARE`, `EXECUTE`, `DEALLOCATE`, `DISCARD`, `LISTEN`,
/// `UNLISTEN`, `DECLARE`, `DO` or `CALL` (code that may run `SET`), or that mentions anywhere `TEMP`, `TEMPORARY`, `EXECUTE`,
/// `pg_temp...`, `set_config` or a session-level advisory lock function (`pg_advisory_lock`,
/// `pg_advisory_lock_shared`, `pg_try_advisory_lock`, `pg_try_advisory_lock_shared`).
///
/// The transaction pooler calls it on every query string: `false` means the full
/// [`analyze`](crate::analyze) would find nothing session-affecting and can be skipped; `true`
/// means it must run. Words are ASCII case-insensitive and whole (identifier characters are
/// ASCII letters, digits, `_` and `$`), quoted or not. A statement begins at the start of the
/// text or after any `;`, past whitespace, comments (`--`, nested `/* */`) and `(`. A unicode
/// escape identifier (`U&"..."`) can spell any function name, so it always answers `true`.
///
/// No allocation, no parser. Once the first statement's first word is behind it, a text with
/// no further `;` can only match an anywhere word or `U&"`: if a few byte searches find none of
/// their fragments in the rest, the scan stops there (most query strings end that way).
///
/// ```
/// assert!(sql::may_affect_session("/* c */ SET search_path = app"));
/// assert!(sql::may_affect_session("select 1; select pg_advisory_lock(7)"));
/// assert!(!sql::may_affect_session("UPDATE accounts SET balance = 0 WHERE id = 1"));
/// ```
pub fn may_affect_session(sql: impl AsRef<[u8]>) -> bool {
    scan(sql.as_ref(), true)
}

/// The scan behind [`may_affect_session`]; `early_exit` enables the shortcut (tests compare
/// the answers with and without it).
fn scan(bytes: &[u8], early_exit: bool) -> bool {
    let mut starts = Starts::new();
    let mut rest_checked = !early_exit;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match BYTE_CLASS[b as usize] {
            Class::Ident => {
                let start = i;
                i = word_end(bytes, i + 1);
                let word = &bytes[start..i];
                if listed(word, starts.at_start()) {
                    return true;
                }
                starts.token();
                if !rest_checked && starts.past_every_start() {
                    rest_checked = true;
                    if !rest_may_match(&bytes[i..]) {
                        return false;
                    }
                }
                continue;
            }
            Class::Blank => {
                i += 1;
                continue;
            }
            Class::Token => {
                starts.token();
                i += 1;
                continue;
            }
            Class::Special => {}
        }
        let next = bytes.get(i + 1).copied();
        let step = match (b, next) {
            (b'/', Some(b'*')) => {
                if !starts.open_comment() {
                    return true;
                }
                2
            }
            (b'*', Some(b'/')) => {
                starts.close_comment();
                2
            }
            (b'-', Some(b'-')) => {
                starts.line_comment();
                2
            }
            (b'\n' | b'\r', _) => {
                starts.newline();
                1
            }
            (b';', _) => {
                starts.semicolon();
                1
            }
            (b'&', Some(b'"')) if i > 0 && bytes[i - 1].eq_ignore_ascii_case(&b'u') => {
                return true;
            }
            _ => {
                starts.token();
                1
            }
        };
        i += step;
    }
    false
}

/// Whether the rest of a text, read where no reading is at a statement start or in a comment
/// entered at one, could still make the scan answer `true`. Without a `;` no statement starts
/// again, so only an anywhere word or `U&"` could, and each of those holds `&` or one of four
/// byte pairs, in either case: `mp` (`TEMP`, `TEMPORARY`, `pg_temp...`), `xe` (`EXECUTE`), `_c`
/// (`SET_CONFIG`) or `dv` (the advisory lock functions). A `;` with nothing but whitespace
/// after it starts nothing. A `false` is exact; a `true` only means the scan goes on.
///
/// Sixteen positions per step with SSE2 (every x86-64 processor has it), a few instructions
/// where the full scan takes about ten per byte; elsewhere the scan just goes on.
fn rest_may_match(rest: &[u8]) -> bool {
    let end = rest
        .iter()
        .rposition(|&b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b';'))
        .map_or(0, |last| last + 1);
    pairs::any(&rest[..end])
}

#[cfg(target_arch = "x86_64")]
mod pairs {
    use std::arch::x86_64::{
        __m128i, _mm_and_si128, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };

    /// Bytes read per step: the sixteen positions and the byte after the last.
    const WINDOW: usize = 17;

    /// Whether `text` holds `;`, `&` or one of the pairs (see `rest_may_match`).
    pub(super) fn any(text: &[u8]) -> bool {
        let mut at = 0;
        while let Some(window) = text.get(at..at + WINDOW) {
            if window_hits(window) {
                return true;
            }
            at += WINDOW - 1;
        }
        // The tail (at most 16 bytes), padded with zero bytes, which match nothing: no pair
        // reaches past the text.
        let mut padded = [0u8; WINDOW];
        let tail = &text[at..];
        padded[..tail.len()].copy_from_slice(tail);
        window_hits(&padded)
    }

    /// Positions 0..16 of `window` (at least 17 bytes).
    fn window_hits(window: &[u8]) -> bool {
        assert!(window.len() >= WINDOW);
        // SAFETY: SSE2 is part of every x86-64 target (the intrinsics are unsafe only because
        // they are target-feature functions); both loads read 16 bytes inside `window`
        // (checked just above), and `loadu` has no alignment requirement.
        unsafe {
            let first = _mm_loadu_si128(window.as_ptr().cast::<__m128i>());
            let second = _mm_loadu_si128(window[1..].as_ptr().cast::<__m128i>());
            // ASCII letters to lower case; `_` becomes 0x7f (other bytes change too, which
            // can only add matches).
            let fold = _mm_set1_epi8(0x20);
            let (a, b) = (_mm_or_si128(first, fold), _mm_or_si128(second, fold));
            let is = |v: __m128i, byte: u8| _mm_cmpeq_epi8(v, _mm_set1_epi8(byte as i8));
            let pair = |x: u8, y: u8| _mm_and_si128(is(a, x), is(b, y));
            let hits = _mm_or_si128(
                _mm_or_si128(
                    _mm_or_si128(pair(b'm', b'p'), pair(b'x', b'e')),
                    _mm_or_si128(pair(0x7f, b'c'), pair(b'd', b'v')),
                ),
                _mm_or_si128(is(a, b';'), is(a, b'&')),
            );
            _mm_movemask_epi8(hits) != 0
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod pairs {
    /// Without SSE2 the scan always goes on.
    pub(super) fn any(_text: &[u8]) -> bool {
        true
    }
}

/// What a byte is to the scan.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Part of a word.
    Ident,
    /// Whitespace other than a line break, or `(`: skipped, a statement start stays one.
    Blank,
    /// May begin a comment, end one, end a line comment or a statement, or begin `U&"`:
    /// looked at with the byte after it.
    Special,
    /// Any other token: readings at a statement start are past it.
    Token,
}

/// Every byte's class (a table: every byte of every query string is looked up).
static BYTE_CLASS: [Class; 256] = {
    let mut t = [Class::Token; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        t[i] = if IDENT_BYTES[i] {
            Class::Ident
        } else {
            match c {
                b' ' | b'\t' | b'\x0b' | b'\x0c' | b'(' => Class::Blank,
                b'/' | b'*' | b'-' | b'\n' | b'\r' | b';' | b'&' => Class::Special,
                _ => Class::Token,
            }
        };
        i += 1;
    }
    t
};

/// Every reading of the text seen so far that is still at a statement start.
///
/// Without tracking literals the scan cannot know whether a `/*` or `--` after a `;` really
/// opens a comment (`SELECT ';--'; SET x = 1` has a `--` inside a literal), so it follows
/// every reading in which it does, all at once: each `;` starts a reading at a statement start,
/// and the readings that entered a block comment there differ only in how deep they are
/// nested. The real lexing is always among them, so a statement start is never missed.
#[derive(Debug, Clone, Copy)]
struct Starts {
    /// Bit 0: a reading is at a statement start, outside comments. Bit `d` > 0: a reading is
    /// `d` levels deep in a block comment that it entered at a statement start.
    open: u64,
    /// A reading is in a `--` comment that it entered at a statement start.
    line: bool,
}

impl Starts {
    /// The text itself begins a statement.
    fn new() -> Self {
        Self {
            open: 1,
            line: false,
        }
    }

    /// Whether some reading is at a statement start, so the next word may begin a statement.
    fn at_start(self) -> bool {
        self.open & 1 != 0
    }

    /// No reading is at a statement start or inside a comment it entered at one: only a `;`
    /// can start a statement again.
    fn past_every_start(self) -> bool {
        self.open == 0 && !self.line
    }

    /// A word or any other token that is neither whitespace, `(`, a comment nor `;`: readings
    /// at a statement start are past it; the others are inside comments and do not care.
    fn token(&mut self) {
        self.open &= !1;
    }

    /// A possible statement boundary.
    fn semicolon(&mut self) {
        self.open |= 1;
    }

    /// `/*`: opens a comment at a statement start, nests one level deeper in comments. False
    /// when the readings nest deeper than the scan can follow; the caller then answers `true`.
    fn open_comment(&mut self) -> bool {
        if self.open >> 63 != 0 {
            return false;
        }
        self.open <<= 1;
        true
    }

    /// `*/`: closes one level; readings that leave their comment are at a statement start again,
    /// and one at a statement start outside comments has met an operator.
    fn close_comment(&mut self) {
        self.open >>= 1;
    }

    /// `--`: a reading at a statement start enters a line comment.
    fn line_comment(&mut self) {
        self.line |= self.at_start();
        self.token();
    }

    /// A line break: ends line comments (PostgreSQL ends them at `\n` or `\r`).
    fn newline(&mut self) {
        if self.line {
            self.open |= 1;
            self.line = false;
        }
    }
}

/// Identifier characters, as far as whole-word matching is concerned (a table: every byte of
/// every query string is looked up).
static IDENT_BYTES: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        t[i] = c.is_ascii_alphanumeric() || c == b'_' || c == b'$';
        i += 1;
    }
    t
};

fn is_ident(b: u8) -> bool {
    IDENT_BYTES[b as usize]
}

/// The end of the word whose bytes before `i` were identifier characters. Four bytes per step
/// while they last: most of a query's bytes are in words, and one branch per four bytes costs
/// about half of one per byte.
#[inline(always)]
fn word_end(bytes: &[u8], mut i: usize) -> usize {
    while let Some(&[a, b, c, d]) = bytes.get(i..i + 4) {
        if !(is_ident(a) & is_ident(b) & is_ident(c) & is_ident(d)) {
            break;
        }
        i += 4;
    }
    while i < bytes.len() && is_ident(bytes[i]) {
        i += 1;
    }
    i
}

/// Whether `word` is one of the words [`may_affect_session`] looks for: a statement word
/// (`SET`, `RESET`, `PREPARE`, `DEALLOCATE`, `DISCARD`, `LISTEN`, `UNLISTEN`, `DECLARE`, `DO`,
/// `CALL`; counted
/// only `at_start`), an anywhere word (`TEMP`, `TEMPORARY`, `EXECUTE`, `SET_CONFIG`, the four
/// session-level advisory lock functions), or one beginning with [`TEMP_SCHEMA_PREFIX`].
/// Every word of every query comes here, so its length and first letter pick the one or two
/// candidates worth comparing; most words (`SELECT`, column and table names) match no arm.
#[inline(always)]
fn listed(word: &[u8], at_start: bool) -> bool {
    let is = |w: &[u8]| word.eq_ignore_ascii_case(w);
    // ASCII letters fold to lower case; digits, `_` and `$` fold to no letter.
    let first = word[0] | 0x20;
    let statement = at_start
        && match (word.len(), first) {
            (2, b'd') => is(b"DO"),
            (4, b'c') => is(b"CALL"),
            (3, b's') => is(b"SET"),
            (5, b'r') => is(b"RESET"),
            (6, b'l') => is(b"LISTEN"),
            (7, b'p') => is(b"PREPARE"),
            (7, b'd') => is(b"DISCARD") || is(b"DECLARE"),
            (8, b'u') => is(b"UNLISTEN"),
            (10, b'd') => is(b"DEALLOCATE"),
            _ => false,
        };
    statement
        || match (word.len(), first) {
            (4, b't') => is(b"TEMP"),
            (9, b't') => is(b"TEMPORARY"),
            (7, b'e') => is(b"EXECUTE"),
            (10, b's') => is(b"SET_CONFIG"),
            (n, b'p') if n >= TEMP_SCHEMA_PREFIX.len() => {
                word[..TEMP_SCHEMA_PREFIX.len()].eq_ignore_ascii_case(TEMP_SCHEMA_PREFIX)
                    || match n {
                        16 => is(b"PG_ADVISORY_LOCK"),
                        20 => is(b"PG_TRY_ADVISORY_LOCK"),
                        23 => is(b"PG_ADVISORY_LOCK_SHARED"),
                        27 => is(b"PG_TRY_ADVISORY_LOCK_SHARED"),
                        _ => false,
                    }
            }
            _ => false,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Words that make a statement session-affecting when they begin it: settings (`SET`,
    /// `RESET`), SQL-level prepared statements, `DISCARD`, `LISTEN`/`UNLISTEN`, cursors, and
    /// `DO`/`CALL` (their code may run `SET`). Matched only at a statement start, since `SET`
    /// also appears inside every `UPDATE`.
    const STATEMENT_WORDS: [&[u8]; 10] = [
        b"DO",
        b"CALL",
        b"SET",
        b"RESET",
        b"PREPARE",
        b"DEALLOCATE",
        b"DISCARD",
        b"LISTEN",
        b"UNLISTEN",
        b"DECLARE",
    ];

    /// Words that matter wherever they appear: temporary relations, the function form of `SET`,
    /// session-level advisory locks, and `EXECUTE`, which also runs a session's prepared statement
    /// from inside `EXPLAIN EXECUTE` and `CREATE TABLE ... AS EXECUTE`.
    const ANYWHERE_WORDS: [&[u8]; 8] = [
        b"TEMP",
        b"TEMPORARY",
        b"EXECUTE",
        b"SET_CONFIG",
        b"PG_ADVISORY_LOCK",
        b"PG_ADVISORY_LOCK_SHARED",
        b"PG_TRY_ADVISORY_LOCK",
        b"PG_TRY_ADVISORY_LOCK_SHARED",
    ];

    /// The definition `listed` implements with its length and first-letter dispatch.
    fn in_lists(word: &[u8], at_start: bool) -> bool {
        (at_start && STATEMENT_WORDS.iter().any(|w| word.eq_ignore_ascii_case(w)))
            || ANYWHERE_WORDS.iter().any(|w| word.eq_ignore_ascii_case(w))
            || word
                .get(..TEMP_SCHEMA_PREFIX.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(TEMP_SCHEMA_PREFIX))
    }

    /// Pieces of query text around everything the shortcut reasons about: statement starts,
    /// comments, line breaks, `U&"`, anywhere words and their fragments in every case.
    const PIECES: [&str; 32] = [
        "SELECT ",
        "select",
        " x ",
        "FROM t",
        " WHERE a = 1",
        ";",
        "; ",
        "&",
        "U&\"a\"",
        "u",
        "\"",
        "/*",
        "*/",
        "--",
        "\n",
        "\r",
        "(",
        "'",
        "SET ",
        "temp",
        "TeMp",
        "tem",
        "Temporary",
        "pg_temp_3",
        "execute",
        "EXECUTE",
        "exe",
        "set_config",
        "SET_config(",
        "advisory_lock",
        "pg_try_advisory_lock_shared",
        "pg_advisory_lock",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]

        /// The shortcut changes no answer.
        #[test]
        fn the_early_exit_agrees_with_the_full_scan(
            picks in proptest::collection::vec(0..PIECES.len(), 0..12),
        ) {
            let text: String = picks.iter().map(|&k| PIECES[k]).collect();
            proptest::prop_assert_eq!(
                scan(text.as_bytes(), true),
                scan(text.as_bytes(), false),
                "{:?}",
                text
            );
        }
    }

    #[test]
    fn the_early_exit_needs_a_fragment_of_every_anywhere_word() {
        for word in ANYWHERE_WORDS.iter().chain([&b"PG_TEMP_7"[..]].iter()) {
            let text = [&b"SELECT 1 FROM t WHERE "[..], word, b"(1)"].concat();
            assert!(scan(&text, true), "{}", String::from_utf8_lossy(&text));
            assert!(scan(&text.to_ascii_lowercase(), true));
        }
        assert!(!scan(
            b"SELECT abalance FROM pgbench_accounts WHERE aid = 42",
            true
        ));
    }

    /// Every word at every offset from the sixteen-byte steps, and at the very end.
    #[test]
    fn the_early_exit_finds_words_at_every_offset() {
        for word in
            ANYWHERE_WORDS
                .iter()
                .copied()
                .chain([&b"pg_temp_7"[..], b"U&\"x\"", b"; SET a = 1"])
        {
            for pad in 0..40 {
                let head = [&b"SELECT "[..], &b"abcdefghij".repeat(4)[..pad], b" "].concat();
                for tail in [&b""[..], b" x", b" FROM t WHERE a = 1"] {
                    let text = [&head[..], word, tail].concat();
                    assert_eq!(scan(&text, true), scan(&text, false));
                    assert!(scan(&text, true), "{}", String::from_utf8_lossy(&text));
                }
            }
        }
        let quiet = [&b"SELECT "[..], &b"abcdefghij ".repeat(9), b";  \n"].concat();
        for end in 7..quiet.len() {
            assert!(
                !scan(&quiet[..end], true),
                "{}",
                String::from_utf8_lossy(&quiet[..end])
            );
        }
    }

    #[test]
    fn listed_agrees_with_the_word_lists() {
        let mut words: Vec<Vec<u8>> = Vec::new();
        for w in STATEMENT_WORDS
            .iter()
            .chain(ANYWHERE_WORDS.iter())
            .chain([&TEMP_SCHEMA_PREFIX])
        {
            words.push(w.to_vec());
            words.push(w.to_ascii_lowercase());
            let mut mixed = w.to_vec();
            mixed[0] = mixed[0].to_ascii_lowercase();
            words.push(mixed.clone());
            // One byte off, longer, shorter.
            let last = mixed.len() - 1;
            mixed[last] ^= 1;
            words.push(mixed);
            words.push([w.to_vec(), b"x".to_vec()].concat());
            words.push(w[..w.len() - 1].to_vec());
        }
        for w in [
            &b"pg_temp_12"[..],
            b"PG_TEMP",
            b"pgbench_accounts",
            b"abalance",
            b"select",
            b"_set",
            b"$et",
            b"1set",
            b"Set_config",
        ] {
            words.push(w.to_vec());
        }
        for w in &words {
            for at_start in [false, true] {
                assert_eq!(
                    listed(w, at_start),
                    in_lists(w, at_start),
                    "{} at_start={at_start}",
                    String::from_utf8_lossy(w)
                );
            }
        }
    }
}

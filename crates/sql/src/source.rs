//! Where each statement sits in the query string, so that pgmemo can split a multi-statement
//! string, forward or replay single statements, and name the inner statement of PREPARE and
//! EXPLAIN.

use std::ops::Range;

use pg_query::protobuf::Token;

/// The trimmed byte range of a top-level statement from the parser's `stmt_location` and
/// `stmt_len` (a length of 0 means "to the end of the string").
pub(crate) fn statement_range(sql: &str, location: i32, len: i32) -> Range<usize> {
    let start = usize::try_from(location).unwrap_or(0).min(sql.len());
    let end = match usize::try_from(len) {
        Ok(0) | Err(_) => sql.len(),
        Ok(len) => (start + len).min(sql.len()),
    };
    trim(sql, start..end)
}

/// Shrinks `range` to exclude surrounding whitespace.
fn trim(sql: &str, range: Range<usize>) -> Range<usize> {
    let Some(text) = sql.get(range.clone()) else {
        return range;
    };
    let start = range.start + (text.len() - text.trim_start().len());
    let end = range.end - (text.len() - text.trim_end().len());
    start..end.max(start)
}

/// Where the inner statement of a statement that wraps one begins.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wrapper {
    /// `PREPARE name [(types)] AS statement`: after the first top-level `AS`.
    Prepare,
    /// `EXPLAIN [(options)] [ANALYZE] [VERBOSE] statement`: after the keywords and options.
    Explain,
}

/// The byte range of the statement wrapped in `outer`, found by scanning tokens. Falls back to
/// `outer` when the scanner disagrees with the parser, which only odd inputs could cause.
pub(crate) fn inner_range(sql: &str, outer: Range<usize>, wrapper: Wrapper) -> Range<usize> {
    let Some(text) = sql.get(outer.clone()) else {
        return outer;
    };
    let Ok(tokens) = pg_query::scan_tokens(text) else {
        return outer;
    };
    let tokens: Vec<(Token, usize)> = tokens
        .iter()
        .filter_map(|t| {
            let token = Token::try_from(t.token).ok()?;
            let skip = matches!(token, Token::SqlComment | Token::CComment);
            (!skip).then_some((token, usize::try_from(t.start).ok()?))
        })
        .collect();
    let start = match wrapper {
        Wrapper::Prepare => after_top_level_as(&tokens),
        Wrapper::Explain => after_explain_options(&tokens),
    };
    match start.and_then(|i| tokens.get(i)) {
        Some(&(_, offset)) => trim(sql, outer.start + offset..outer.end),
        None => outer,
    }
}

/// Where the statement name of the `EXECUTE name ...` at `range` is written (quotes
/// included), or `None` when the text there does not start that way.
pub(crate) fn execute_name_range(sql: &str, range: Range<usize>) -> Option<Range<usize>> {
    let text = sql.get(range.clone())?;
    let tokens = pg_query::scan_tokens(text).ok()?;
    let mut tokens = tokens.iter().filter(|t| {
        !matches!(
            Token::try_from(t.token),
            Ok(Token::SqlComment | Token::CComment)
        )
    });
    let first = tokens.next()?;
    if Token::try_from(first.token).ok()? != Token::Execute {
        return None;
    }
    let name = tokens.next()?;
    let start = usize::try_from(name.start).ok()?;
    let end = usize::try_from(name.end).ok()?;
    Some(range.start + start..range.start + end)
}

/// Where the query of `CREATE TABLE ... AS query` (at `outer`) begins.
pub(crate) fn after_as_range(sql: &str, outer: Range<usize>) -> Range<usize> {
    inner_range(sql, outer, Wrapper::Prepare)
}

fn after_top_level_as(tokens: &[(Token, usize)]) -> Option<usize> {
    let mut depth = 0usize;
    for (i, (token, _)) in tokens.iter().enumerate() {
        match token {
            Token::Ascii40 => depth += 1,
            Token::Ascii41 => depth = depth.saturating_sub(1),
            Token::As if depth == 0 => return Some(i + 1),
            _ => {}
        }
    }
    None
}

fn after_explain_options(tokens: &[(Token, usize)]) -> Option<usize> {
    let mut i = 1; // past EXPLAIN
    let parenthesized_query = matches!(
        tokens.get(i + 1),
        Some((
            Token::Select | Token::Values | Token::Table | Token::With | Token::Ascii40,
            _
        ))
    );
    if matches!(tokens.get(i), Some((Token::Ascii40, _))) && !parenthesized_query {
        let mut depth = 0usize;
        while let Some((token, _)) = tokens.get(i) {
            i += 1;
            match token {
                Token::Ascii40 => depth += 1,
                Token::Ascii41 => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    while matches!(
        tokens.get(i),
        Some((Token::Analyze | Token::Analyse | Token::Verbose, _))
    ) {
        i += 1;
    }
    Some(i)
}

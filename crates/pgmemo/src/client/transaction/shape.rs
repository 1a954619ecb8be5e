//! The shape of a statement's rows, as a digest of its RowDescription. PostgreSQL fixes a
//! prepared statement's result type when it prepares it, and a client that described the
//! statement decodes every later execution's rows with that description, without asking
//! again: after DDL, PostgreSQL fails such an execution with `cached plan must not change
//! result type` rather than send rows of another shape. pgmemo prepares a client's statement
//! again on servers that lack it, where it may take the new shape: it compares the shape the
//! client learnt with the one the server has before letting the rows through.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::OnceLock;

use wire::backend::tag;

/// The shape of a statement that returns no rows (NoData).
pub const NO_ROWS: u64 = 0;

/// One hasher for the process: shapes are compared (and cache keys built from them) only
/// within it. ahash, as on the rest of the request path: a prepared execution that describes
/// its portal notes its shape on every request.
static HASHER: OnceLock<ahash::RandomState> = OnceLock::new();

/// The shape an answer to a Describe tells: RowDescription (column names, types and type
/// modifiers; not the formats, which the Bind chooses, nor the source columns) or NoData.
/// `None` for other messages or a malformed RowDescription.
pub fn shape_of(tag: u8, frame: &[u8]) -> Option<u64> {
    match tag {
        tag::NO_DATA => Some(NO_ROWS),
        tag::ROW_DESCRIPTION => {
            let body = frame.get(5..)?;
            let count = i16::from_be_bytes(body.get(..2)?.try_into().ok()?);
            let mut hasher = HASHER.get_or_init(ahash::RandomState::new).build_hasher();
            count.hash(&mut hasher);
            let mut at = 2;
            for _ in 0..count {
                let end = at + body.get(at..)?.iter().position(|&b| b == 0)?;
                body[at..end].hash(&mut hasher);
                // Table OID (4) and column number (2) skipped; type OID (4), length (2) and
                // modifier (4) kept; format (2) skipped.
                body.get(end + 7..end + 17)?.hash(&mut hasher);
                at = end + 19;
            }
            // Never NO_ROWS.
            Some(hasher.finish() | 1)
        }
        _ => None,
    }
}

/// PostgreSQL's error for an execution whose statement's result type changed since it was
/// prepared, naming its routine as PostgreSQL's does: pgjdbc and sqlx then close the statement
/// and prepare it again (they look for `RevalidateCachedQuery`).
pub fn changed_error() -> bytes::Bytes {
    wire::ErrorResponse::error(
        wire::sqlstate::FEATURE_NOT_SUPPORTED,
        "cached plan must not change result type",
    )
    .encode_with_routine("RevalidateCachedQuery")
}

/// Whether the messages after a Bind (`rest`, as far as they have arrived) describe its
/// `portal` before executing anything: the client then learns the rows' shape anew.
pub fn describes_portal_next(rest: &[u8], portal: &[u8]) -> bool {
    let mut at = 0;
    while let Ok(Some(header)) = wire::FrameHeader::peek(&rest[at..], usize::MAX) {
        let Some(body) = rest.get(at + wire::FrameHeader::SIZE..at + header.frame_len) else {
            return false;
        };
        match header.tag {
            b'D' if body.first() == Some(&b'P') => {
                return body.get(1..body.len() - 1) == Some(portal);
            }
            // A Parse, a Close or a Describe of a statement changes nothing here.
            b'P' | b'C' | b'D' => at += header.frame_len,
            _ => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row_description(columns: &[(&str, u32, i32, i16)]) -> Vec<u8> {
        let mut body = (columns.len() as i16).to_be_bytes().to_vec();
        for (name, oid, typmod, format) in columns {
            body.extend_from_slice(name.as_bytes());
            body.push(0);
            body.extend_from_slice(&16384u32.to_be_bytes());
            body.extend_from_slice(&1i16.to_be_bytes());
            body.extend_from_slice(&oid.to_be_bytes());
            body.extend_from_slice(&4i16.to_be_bytes());
            body.extend_from_slice(&typmod.to_be_bytes());
            body.extend_from_slice(&format.to_be_bytes());
        }
        let mut frame = vec![b'T'];
        frame.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        frame.extend_from_slice(&body);
        frame
    }

    #[test]
    fn the_shape_is_the_columns_names_and_types_whatever_the_formats() {
        let text = row_description(&[("id", 23, -1, 0), ("v", 25, -1, 0)]);
        let binary = row_description(&[("id", 23, -1, 1), ("v", 25, -1, 1)]);
        let shape = shape_of(b'T', &text).unwrap();
        assert_eq!(shape_of(b'T', &binary), Some(shape));
        assert_ne!(shape, NO_ROWS);
        for other in [
            row_description(&[("id", 23, -1, 0)]),
            row_description(&[("id", 23, -1, 0), ("w", 25, -1, 0)]),
            row_description(&[("id", 23, -1, 0), ("v", 23, -1, 0)]),
            row_description(&[("id", 23, -1, 0), ("v", 25, 8, 0)]),
            row_description(&[("v", 25, -1, 0), ("id", 23, -1, 0)]),
        ] {
            assert_ne!(shape_of(b'T', &other), Some(shape));
        }
        assert_eq!(shape_of(b'n', b"n\0\0\0\x04"), Some(NO_ROWS));
        assert_eq!(shape_of(b'T', b"T\0\0\0\x06\0\x01"), None, "truncated");
    }

    fn message(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn the_changed_error_names_postgresqls_routine() {
        let frame = changed_error();
        let error = wire::ErrorResponse::parse(&frame[5..]).unwrap();
        assert_eq!(error.code, "0A000");
        assert_eq!(error.message, "cached plan must not change result type");
        assert!(frame.ends_with(b"RRevalidateCachedQuery\0\0"));
    }

    #[test]
    fn a_describe_of_the_portal_before_its_execute_tells_the_shape_anew() {
        let describe_p = message(b'D', b"P\0");
        let describe_other = message(b'D', b"Pp2\0");
        let execute = message(b'E', b"\0\0\0\0\0");
        let sync = message(b'S', b"");
        assert!(describes_portal_next(
            &[describe_p.clone(), execute.clone()].concat(),
            b""
        ));
        assert!(!describes_portal_next(
            &[execute.clone(), describe_p.clone()].concat(),
            b""
        ));
        assert!(!describes_portal_next(
            &[describe_other, execute].concat(),
            b""
        ));
        assert!(!describes_portal_next(&sync, b""));
        assert!(
            !describes_portal_next(&describe_p[..4], b""),
            "not arrived yet"
        );
    }
}

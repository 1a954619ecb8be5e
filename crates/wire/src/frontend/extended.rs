//! The extended query protocol as a client speaks it: Parse, Bind, Describe, Execute, Close (up
//! to the Sync that ends the request), plus the legacy FunctionCall that shares Bind's layout.
//!
//! These sit on the query path between the client socket and the pool: a transaction pooler must
//! rename prepared statements (rewrite `Parse::name` and `Bind::statement`), and the cache keys
//! on the statement text and the bound parameter values. Names and texts stay `Bytes` because a
//! client may use a non-UTF-8 `client_encoding`; parameter values are zero-copy slices of the
//! frame they arrived in.

use bytes::{BufMut, Bytes, BytesMut};

use super::tag;
use crate::buf::{
    as_text, put_cbytes, put_count, put_i16_array, put_message, put_values, BodyReader,
};
use crate::frame::WireError;

/// Parse: creates a prepared statement (unnamed when `name` is empty). A pooler rewrites `name`
/// so that statements of different clients do not collide on a shared server connection.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parse {
    /// Statement name in the client's encoding; empty for the unnamed statement.
    pub name: Bytes,
    /// The SQL text in the client's encoding.
    pub query: Bytes,
    /// Parameter type OIDs the client pins; 0 or a shorter list leaves types to the server.
    pub param_types: Vec<u32>,
}

impl Parse {
    /// Decodes a Parse body. Truncated bodies, missing terminators and trailing bytes are errors.
    pub fn decode(body: Bytes) -> Result<Parse, WireError> {
        let mut r = BodyReader::new(body);
        let msg = Parse {
            name: r.cstr()?,
            query: r.cstr()?,
            param_types: r.u32_array()?,
        };
        r.finish("trailing bytes after Parse")?;
        Ok(msg)
    }

    /// Appends the Parse frame to `out`.
    ///
    /// # Panics
    /// If there are more than 65535 parameter types (in debug builds also if a name contains NUL).
    pub fn encode(&self, out: &mut BytesMut) {
        put_message(out, tag::PARSE, |b| {
            put_cbytes(b, &self.name);
            put_cbytes(b, &self.query);
            put_count(b, self.param_types.len());
            for &oid in &self.param_types {
                b.put_u32(oid);
            }
        });
    }

    /// The statement name when it is UTF-8, for logs and admin output.
    pub fn name_str(&self) -> Option<&str> {
        as_text(&self.name)
    }

    /// The SQL text when it is UTF-8, which the SQL analyser needs.
    pub fn query_str(&self) -> Option<&str> {
        as_text(&self.query)
    }
}

/// Bind: creates a portal from a prepared statement and parameter values. The cache key includes
/// the values and formats; a pooler rewrites `statement` to its server-side name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bind {
    /// Destination portal; empty for the unnamed portal.
    pub portal: Bytes,
    /// Source prepared statement; empty for the unnamed statement.
    pub statement: Bytes,
    /// Parameter format codes (0 text, 1 binary): none means all text, one applies to all.
    pub param_formats: Vec<i16>,
    /// Parameter values, `None` for SQL NULL; slices of the received frame.
    pub params: Vec<Option<Bytes>>,
    /// Result column format codes, with the same none/one/each convention as `param_formats`.
    pub result_formats: Vec<i16>,
}

impl Bind {
    /// Decodes a Bind body. Value lengths below -1, truncation and trailing bytes are errors; the
    /// agreement between format and parameter counts is left to the server, which reports it
    /// with the SQLSTATE clients expect.
    pub fn decode(body: Bytes) -> Result<Bind, WireError> {
        let mut r = BodyReader::new(body);
        let msg = Bind {
            portal: r.cstr()?,
            statement: r.cstr()?,
            param_formats: r.i16_array()?,
            params: r.values()?,
            result_formats: r.i16_array()?,
        };
        r.finish("trailing bytes after Bind")?;
        Ok(msg)
    }

    /// Appends the Bind frame to `out`.
    ///
    /// # Panics
    /// If a list has more than 65535 entries or a value exceeds `i32::MAX` bytes.
    pub fn encode(&self, out: &mut BytesMut) {
        put_message(out, tag::BIND, |b| {
            put_cbytes(b, &self.portal);
            put_cbytes(b, &self.statement);
            put_i16_array(b, &self.param_formats);
            put_values(b, &self.params);
            put_i16_array(b, &self.result_formats);
        });
    }

    /// The portal name when it is UTF-8.
    pub fn portal_str(&self) -> Option<&str> {
        as_text(&self.portal)
    }

    /// The statement name when it is UTF-8.
    pub fn statement_str(&self) -> Option<&str> {
        as_text(&self.statement)
    }
}

/// What Describe and Close act on: a prepared statement or a portal, which have separate
/// namespaces on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// `'S'`: a prepared statement.
    Statement,
    /// `'P'`: a portal.
    Portal,
}

impl Target {
    /// Reads the target byte; anything but `'S'` or `'P'` is malformed.
    pub fn from_byte(b: u8) -> Result<Target, WireError> {
        match b {
            b'S' => Ok(Target::Statement),
            b'P' => Ok(Target::Portal),
            _ => Err(WireError::Malformed("target must be 'S' or 'P'")),
        }
    }

    /// The target byte.
    pub fn as_byte(self) -> u8 {
        match self {
            Target::Statement => b'S',
            Target::Portal => b'P',
        }
    }
}

/// Describe: asks for the parameter and row descriptions of a statement or portal. A pooler
/// renames statement targets like `Bind::statement`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Describe {
    /// Statement or portal.
    pub target: Target,
    /// Its name; empty for the unnamed one.
    pub name: Bytes,
}

/// Close: drops a prepared statement or portal. A pooler must see these to keep its statement
/// map in step with the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Close {
    /// Statement or portal.
    pub target: Target,
    /// Its name; empty for the unnamed one.
    pub name: Bytes,
}

fn decode_target(body: Bytes, what: &'static str) -> Result<(Target, Bytes), WireError> {
    let mut r = BodyReader::new(body);
    let target = Target::from_byte(r.u8()?)?;
    let name = r.cstr()?;
    r.finish(what)?;
    Ok((target, name))
}

fn encode_target(out: &mut BytesMut, tag: u8, target: Target, name: &[u8]) {
    put_message(out, tag, |b| {
        b.put_u8(target.as_byte());
        put_cbytes(b, name);
    });
}

impl Describe {
    /// Decodes a Describe body.
    pub fn decode(body: Bytes) -> Result<Describe, WireError> {
        let (target, name) = decode_target(body, "trailing bytes after Describe")?;
        Ok(Describe { target, name })
    }

    /// The target and name of a Describe body, checked as [`Describe::decode`] checks them
    /// but borrowed: drivers describe the unnamed portal with every query, and a proxy that
    /// forwards it as it is needs no copy.
    pub fn target_of(body: &[u8]) -> Result<(Target, &[u8]), WireError> {
        let (&first, rest) = body.split_first().ok_or(WireError::Truncated)?;
        let target = Target::from_byte(first)?;
        let end = memchr::memchr(0, rest).ok_or(WireError::MissingTerminator)?;
        if end + 1 != rest.len() {
            return Err(WireError::Malformed("trailing bytes after Describe"));
        }
        Ok((target, &rest[..end]))
    }

    /// Appends the Describe frame to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        encode_target(out, tag::DESCRIBE, self.target, &self.name);
    }

    /// The name when it is UTF-8.
    pub fn name_str(&self) -> Option<&str> {
        as_text(&self.name)
    }
}

impl Close {
    /// Decodes a Close body.
    pub fn decode(body: Bytes) -> Result<Close, WireError> {
        let (target, name) = decode_target(body, "trailing bytes after Close")?;
        Ok(Close { target, name })
    }

    /// Appends the Close frame to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        encode_target(out, tag::CLOSE, self.target, &self.name);
    }

    /// The name when it is UTF-8.
    pub fn name_str(&self) -> Option<&str> {
        as_text(&self.name)
    }
}

/// Execute: runs a portal. A non-zero `max_rows` makes the server stop with PortalSuspended,
/// which a cache must treat as an incomplete result.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Execute {
    /// Portal name; empty for the unnamed portal.
    pub portal: Bytes,
    /// Row limit; 0 means no limit.
    pub max_rows: i32,
}

impl Execute {
    /// Decodes an Execute body.
    pub fn decode(body: Bytes) -> Result<Execute, WireError> {
        let mut r = BodyReader::new(body);
        let msg = Execute {
            portal: r.cstr()?,
            max_rows: r.i32()?,
        };
        r.finish("trailing bytes after Execute")?;
        Ok(msg)
    }

    /// The portal an Execute body names, checked as [`Execute::decode`] checks it but
    /// borrowed: a proxy that forwards the message as it is needs no copy of it.
    pub fn portal_of(body: &[u8]) -> Result<&[u8], WireError> {
        let end = memchr::memchr(0, body).ok_or(WireError::MissingTerminator)?;
        match body.len() - end - 1 {
            4 => Ok(&body[..end]),
            n if n < 4 => Err(WireError::Truncated),
            _ => Err(WireError::Malformed("trailing bytes after Execute")),
        }
    }

    /// The row limit an Execute body asks for (0: none), checked as [`Execute::decode`]
    /// checks it but borrowed.
    pub fn max_rows_of(body: &[u8]) -> Result<i32, WireError> {
        Self::portal_of(body)?;
        let n = &body[body.len() - 4..];
        Ok(i32::from_be_bytes([n[0], n[1], n[2], n[3]]))
    }

    /// Appends the Execute frame to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        put_message(out, tag::EXECUTE, |b| {
            put_cbytes(b, &self.portal);
            b.put_i32(self.max_rows);
        });
    }

    /// The portal name when it is UTF-8.
    pub fn portal_str(&self) -> Option<&str> {
        as_text(&self.portal)
    }
}

/// FunctionCall: the legacy fast-path call (used by libpq's large-object API). A proxy must relay
/// it; it calls a function by OID, so it is never cacheable.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FunctionCall {
    /// OID of the function to call.
    pub oid: u32,
    /// Argument format codes, with Bind's none/one/each convention.
    pub arg_formats: Vec<i16>,
    /// Argument values, `None` for SQL NULL; slices of the received frame.
    pub args: Vec<Option<Bytes>>,
    /// Format code of the result.
    pub result_format: i16,
}

impl FunctionCall {
    /// Decodes a FunctionCall body.
    pub fn decode(body: Bytes) -> Result<FunctionCall, WireError> {
        let mut r = BodyReader::new(body);
        let msg = FunctionCall {
            oid: r.u32()?,
            arg_formats: r.i16_array()?,
            args: r.values()?,
            result_format: r.i16()?,
        };
        r.finish("trailing bytes after FunctionCall")?;
        Ok(msg)
    }

    /// Appends the FunctionCall frame to `out`.
    ///
    /// # Panics
    /// If a list has more than 65535 entries or a value exceeds `i32::MAX` bytes.
    pub fn encode(&self, out: &mut BytesMut) {
        put_message(out, tag::FUNCTION_CALL, |b| {
            b.put_u32(self.oid);
            put_i16_array(b, &self.arg_formats);
            put_values(b, &self.args);
            b.put_i16(self.result_format);
        });
    }
}

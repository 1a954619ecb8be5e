//! `wire`: the PostgreSQL frontend/backend protocol v3 as pgmemo needs it.
//!
//! This crate is the first step on the query path: it turns bytes from a socket into frames and
//! typed messages and back. It performs no I/O and holds no policy: it never decides whether a
//! query may be cached or where it goes. Partial input returns `Ok(None)`; bodies stay `Bytes`
//! so that frames can be forwarded untouched.

pub mod backend;
pub mod error;
pub mod frame;
pub mod frontend;
pub mod md5;
pub mod replication;
pub mod scram;
pub mod sqlstate;
pub mod startup;

mod buf;
#[cfg(test)]
mod testutil;

pub use error::{ErrorResponse, Severity};
pub use frame::{Frame, FrameHeader, WireError};

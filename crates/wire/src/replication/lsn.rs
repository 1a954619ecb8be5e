//! Log sequence numbers: positions in PostgreSQL's write-ahead log.
//!
//! Every replication message is stamped with LSNs, and the replication consumer reports the LSN
//! it has processed so that the server can recycle WAL; users and logs see them in PostgreSQL's
//! `pg_lsn` text form (`16/B374D848`), e.g. in `pg_replication_slots.confirmed_flush_lsn`.

use std::fmt;
use std::str::FromStr;

use crate::frame::WireError;

/// A position in the WAL (`XLogRecPtr`). A newtype so that LSNs are printed and parsed the way
/// PostgreSQL does it and cannot be mixed up with the other 64-bit fields of the same messages.
///
/// Ordering is WAL order, so the consumer can keep the furthest position with `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    /// `InvalidXLogRecPtr` (`0/0`): what PostgreSQL sends for "no position", e.g. in a
    /// StandbyStatusUpdate field a client does not track.
    pub const INVALID: Lsn = Lsn(0);

    /// Whether this is a real position rather than [`Lsn::INVALID`].
    pub fn is_valid(self) -> bool {
        self != Lsn::INVALID
    }
}

impl From<u64> for Lsn {
    fn from(v: u64) -> Lsn {
        Lsn(v)
    }
}

impl From<Lsn> for u64 {
    fn from(l: Lsn) -> u64 {
        l.0
    }
}

/// The `pg_lsn` text form: high and low 32 bits in upper-case hex without leading zeros.
impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// Parses the `pg_lsn` text form as PostgreSQL's `pg_lsn_in` accepts it: two groups of 1 to 8
/// hex digits (either case) separated by `/`, nothing else (no sign, no spaces).
impl FromStr for Lsn {
    type Err = WireError;

    fn from_str(s: &str) -> Result<Lsn, WireError> {
        const BAD: WireError =
            WireError::Malformed("LSN must be two groups of 1 to 8 hex digits separated by '/'");
        let (hi, lo) = s.split_once('/').ok_or(BAD)?;
        let half = |h: &str| -> Result<u64, WireError> {
            if h.is_empty() || h.len() > 8 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(BAD);
            }
            u32::from_str_radix(h, 16).map(u64::from).map_err(|_| BAD)
        };
        Ok(Lsn((half(hi)? << 32) | half(lo)?))
    }
}

//! Names for the objects tests create on a shared server (tables, schemas, channels,
//! application names): the tests of one binary run in parallel, and several test binaries run
//! against the same local PostgreSQL at once, so a fixed name would collide.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// `prefix_PID_NANOS_N`, a name no other test (in this or another process) uses: the PID keeps
/// processes apart, the clock a later process that got the same PID, the counter the tests of
/// this one.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        nanos,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_differ_and_keep_their_prefix() {
        let (a, b) = (unique("t"), unique("t"));
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("t_{}_", std::process::id())), "{a}");
    }
}

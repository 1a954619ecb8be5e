//! A coarse monotonic clock for the pool's timeouts. Transaction pooling reads the time twice
//! per transaction (when a connection goes back idle, and when it is taken to check
//! `server_lifetime`, `server_idle_timeout` and `server_check_delay`); those are seconds to
//! hours, so the kernel's coarse clock (a few milliseconds' resolution, read without the
//! time-stamp counter) is precise enough, and whole milliseconds compare without the
//! normalisation `Instant::duration_since` does.

use std::time::Duration;

/// A point in time, in milliseconds of the system's monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Tick(u64);

impl Tick {
    /// Now, to within the coarse clock's resolution.
    pub fn now() -> Tick {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the kernel
        // knows, so the call cannot fail.
        unsafe { libc::clock_gettime(COARSE, &mut ts) };
        Tick(ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000)
    }

    /// Milliseconds of the monotonic clock (for spans shown to people).
    pub fn millis(self) -> u64 {
        self.0
    }

    /// Whether at least `span` passed from `earlier` to `self`, in whole milliseconds: a span
    /// is rounded down, so a timeout ends early rather than late (by under a millisecond).
    pub fn reached(self, earlier: Tick, span: Duration) -> bool {
        u128::from(self.0.saturating_sub(earlier.0)) >= span.as_millis()
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
const COARSE: libc::clockid_t = libc::CLOCK_MONOTONIC_COARSE;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const COARSE: libc::clockid_t = libc::CLOCK_MONOTONIC;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reached_compares_whole_milliseconds() {
        let t = Tick(10_000);
        assert!(t.reached(Tick(9_000), Duration::from_secs(1)));
        assert!(!t.reached(Tick(9_001), Duration::from_secs(1)));
        assert!(t.reached(t, Duration::ZERO));
        assert!(t.reached(t, Duration::from_micros(999)));
        assert!(!t.reached(t, Duration::from_micros(1_000)));
        // A reading from later (another thread's) counts as no time passed.
        assert!(!t.reached(Tick(10_500), Duration::from_millis(1)));
    }

    #[test]
    fn now_moves_with_the_monotonic_clock() {
        let (a, start) = (Tick::now(), std::time::Instant::now());
        while start.elapsed() < Duration::from_millis(30) {
            std::hint::spin_loop();
        }
        let b = Tick::now();
        assert!(b.reached(a, Duration::from_millis(20)), "{a:?} -> {b:?}");
        assert!(!b.reached(a, Duration::from_secs(5)), "{a:?} -> {b:?}");
    }
}

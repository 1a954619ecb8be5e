//! A fixed-bucket latency histogram of atomics: recorded on the query path where a cache miss
//! completes, read by the metrics endpoint. Recording is three relaxed atomic additions, no lock.

use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of the buckets in microseconds: 100 µs to 10 s, roughly ×2.5 apart, which
/// spans a primary-key lookup on a local server up to a report query.
pub const BUCKET_BOUNDS_MICROS: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// Buckets plus the one for observations above the last bound (`+Inf`).
const SLOTS: usize = BUCKET_BOUNDS_MICROS.len() + 1;

/// Counts durations into [`BUCKET_BOUNDS_MICROS`]. Lives in [`crate::shared::Shared`] so any
/// step of the query path can record into it without a lock and without a global.
#[derive(Debug)]
pub struct Histogram {
    /// Per-bucket (not cumulative) counts; the last slot is above every bound.
    slots: [AtomicU64; SLOTS],
    sum_micros: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_micros: AtomicU64::new(0),
        }
    }
}

/// One consistent-enough reading of a [`Histogram`], in Prometheus' cumulative form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// `(upper bound in µs, observations ≤ bound)`, one per entry of [`BUCKET_BOUNDS_MICROS`].
    pub buckets: Vec<(u64, u64)>,
    /// All observations (the `+Inf` bucket).
    pub count: u64,
    /// Sum of all observations in microseconds.
    pub sum_micros: u64,
}

impl Histogram {
    /// Records one duration of `micros` microseconds.
    #[inline]
    pub fn observe(&self, micros: u64) {
        let slot = BUCKET_BOUNDS_MICROS.partition_point(|&bound| bound < micros);
        self.slots[slot].fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// The cumulative counts. The total is derived from the buckets, so `+Inf` always equals
    /// the count and buckets never decrease, even while other threads record.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut cumulative = 0;
        let mut buckets = Vec::with_capacity(BUCKET_BOUNDS_MICROS.len());
        for (slot, bound) in self.slots.iter().zip(BUCKET_BOUNDS_MICROS) {
            cumulative += slot.load(Ordering::Relaxed);
            buckets.push((bound, cumulative));
        }
        let count = cumulative + self.slots[SLOTS - 1].load(Ordering::Relaxed);
        HistogramSnapshot {
            buckets,
            count,
            sum_micros: self.sum_micros.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let h = Histogram::default();
        for micros in [0, 100, 101, 2_500, 10_000_000, 10_000_001, u64::MAX / 4] {
            h.observe(micros);
        }
        let s = h.snapshot();
        let at = |bound: u64| s.buckets.iter().find(|(b, _)| *b == bound).unwrap().1;
        assert_eq!(at(100), 2, "0 and the bound itself");
        assert_eq!(at(250), 3);
        assert_eq!(at(1_000), 3);
        assert_eq!(at(2_500), 4);
        assert_eq!(at(10_000_000), 5);
        assert_eq!(s.count, 7);
        assert_eq!(
            s.sum_micros,
            100 + 101 + 2_500 + 10_000_000 + 10_000_001 + u64::MAX / 4
        );
        assert!(s.buckets.windows(2).all(|w| w[0].1 <= w[1].1));
    }
}

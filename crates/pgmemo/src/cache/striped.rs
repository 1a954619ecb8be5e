//! Counters that every worker thread bumps on every hit: a cache-wide hit count, a hot
//! statement's hit count. One atomic shared by all threads is a cache line that each core
//! must take exclusively for every increment, so with many cores serving hits of the same
//! statement the counter, not the lookup, sets the pace (Pgpool-II's shared-memory lock is the
//! extreme of the same effect). Here each group of counters has a stripe per core (up to
//! [`MAX_STRIPES`]) on its own cache lines; a thread adds to the stripe its number picks, and
//! readers (the admin console, the metrics endpoint) sum the stripes.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// More stripes than this cost memory (per tracked statement) for little: contention is
/// spread thin enough by then.
pub const MAX_STRIPES: usize = 16;

/// A group of `N` counters, striped.
#[derive(Debug)]
pub struct Striped<const N: usize> {
    stripes: Box<[Stripe<N>]>,
}

/// One thread's share of a group, alone on its cache lines (128 bytes: adjacent-line
/// prefetching pairs lines).
#[derive(Debug)]
#[repr(align(128))]
struct Stripe<const N: usize>([AtomicU64; N]);

impl<const N: usize> Default for Striped<N> {
    fn default() -> Self {
        Striped {
            stripes: (0..stripe_count())
                .map(|_| Stripe(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }
}

impl<const N: usize> Striped<N> {
    /// Adds `v` to counter `i` (in the calling thread's stripe).
    #[inline]
    pub fn add(&self, i: usize, v: u64) {
        self.mine().0[i].fetch_add(v, Ordering::Relaxed);
    }

    /// Adds to several counters of the group at once: one stripe lookup.
    #[inline]
    pub fn add_each(&self, values: [u64; N]) {
        let stripe = self.mine();
        for (counter, v) in stripe.0.iter().zip(values) {
            if v != 0 {
                counter.fetch_add(v, Ordering::Relaxed);
            }
        }
    }

    /// Counter `i`: the sum over the stripes.
    pub fn get(&self, i: usize) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.0[i].load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }

    #[inline]
    fn mine(&self) -> &Stripe<N> {
        // A power of two: the mask keeps the index in range.
        &self.stripes[thread_slot() & (self.stripes.len() - 1)]
    }
}

/// Stripes per group: the machine's cores, rounded up to a power of two, at most
/// [`MAX_STRIPES`]. Read once per process (it is a system call).
fn stripe_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, usize::from)
            .next_power_of_two()
            .min(MAX_STRIPES)
    })
}

/// Hands each thread its number the first time it counts. Like std's `ThreadId` counter, an
/// identity generator rather than state: nothing reads it but [`thread_slot`]. Numbers, not a
/// hash of something per thread, so that the few worker threads of a small machine land on
/// different stripes rather than colliding by chance.
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SLOT: usize = NEXT_SLOT.fetch_add(1, Ordering::Relaxed);
}

/// The calling thread's number (see [`NEXT_SLOT`]): the runtime's worker threads, started
/// together, get consecutive ones.
#[inline]
fn thread_slot() -> usize {
    SLOT.with(|slot| *slot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_add_to_their_stripes_and_the_sums_are_exact() {
        let group: Arc<Striped<3>> = Arc::default();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let group = Arc::clone(&group);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        group.add(0, 1);
                        group.add_each([0, 2, t]);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(group.get(0), 8000);
        assert_eq!(group.get(1), 16_000);
        assert_eq!(group.get(2), (0..8).sum::<u64>() * 1000);
    }

    #[test]
    fn threads_started_together_get_different_slots() {
        let slots: Vec<usize> = (0..4)
            .map(|_| std::thread::spawn(thread_slot))
            .map(|t| t.join().unwrap())
            .collect();
        let mut distinct = slots.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 4, "{slots:?}");
        assert_eq!(thread_slot(), thread_slot(), "a thread keeps its slot");
    }

    #[test]
    fn a_stripe_is_alone_on_its_cache_lines() {
        assert_eq!(std::mem::align_of::<Stripe<4>>(), 128);
        assert_eq!(std::mem::size_of::<Stripe<4>>(), 128);
        assert!(stripe_count().is_power_of_two() && stripe_count() <= MAX_STRIPES);
    }
}

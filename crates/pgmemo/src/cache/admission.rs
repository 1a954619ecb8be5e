//! Admission: which cacheable misses are stored. Storing a result costs an insert, an
//! allocation and memory that may evict something useful; for a result read once and never
//! again (a lookup over a large key space, a report's one-off parameters) that is pure loss.
//! So, with `cache_admission = auto`, a cheap statement's result is stored from the second
//! miss of the same key that pgmemo sees within a window of recent misses (the "cache on
//! second hit" rule against one-hit wonders); results of statements that are new or take a
//! millisecond or more upstream are stored at once, since a single repeat already pays for
//! them.
//!
//! The window is a direct-mapped table of 32-bit key fingerprints: a miss swaps its
//! fingerprint into its slot, and it was seen recently if the slot held it already.
//! Lock-free (one atomic swap per cheap miss), fixed in size and small enough to stay in the
//! CPU's caches (every cheap miss probes it at a random place), and forgetful by design: a
//! colliding key overwrites the slot, which only delays a store; two keys with the same slot
//! and fingerprint (one in 2^32) only store a result one miss early.

use std::sync::atomic::{AtomicU32, Ordering};

/// Bytes of `cache_size` per slot: the window spans a fraction of the keys the cache can hold,
/// which is what it is for (keys that repeat while they are recent).
const BYTES_PER_SLOT: u64 = 4096;
const MIN_SLOTS: u64 = 1 << 12;
const MAX_SLOTS: u64 = 1 << 20;

/// The recent misses of cheap statements, by key fingerprint.
pub struct Admission {
    slots: Box<[AtomicU32]>,
    hasher: ahash::RandomState,
}

impl Admission {
    /// A window sized for a cache of `cache_size` bytes (4 bytes per slot: 256 KiB, 65,536
    /// keys, for the default 256 MB).
    pub fn new(cache_size: u64) -> Admission {
        let n = (cache_size / BYTES_PER_SLOT)
            .clamp(MIN_SLOTS, MAX_SLOTS)
            .next_power_of_two();
        Admission {
            slots: (0..n).map(|_| AtomicU32::new(0)).collect(),
            hasher: ahash::RandomState::new(),
        }
    }

    /// Notes a miss of `key`; whether the same key missed recently.
    pub fn seen_before(&self, key: &[u8]) -> bool {
        let hash = self.hasher.hash_one(key);
        // The high half picks nothing else; never 0, the empty slot.
        let fingerprint = (hash >> 32) as u32 | 1;
        let slot = &self.slots[hash as usize & (self.slots.len() - 1)];
        slot.load(Ordering::Relaxed) == fingerprint
            || slot.swap(fingerprint, Ordering::Relaxed) == fingerprint
    }

    /// How many keys the window holds at most.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_admitted_on_its_second_miss() {
        let a = Admission::new(0);
        assert_eq!(a.slots(), MIN_SLOTS as usize);
        assert!(!a.seen_before(b"k1"));
        assert!(!a.seen_before(b"k2"));
        assert!(a.seen_before(b"k1"));
        assert!(a.seen_before(b"k1"), "stays seen until its slot is taken");
        assert!(a.seen_before(b"k2"));
    }

    #[test]
    fn the_window_forgets_old_keys() {
        let a = Admission::new(0);
        assert!(!a.seen_before(b"old"));
        // Far more keys than slots: the old key's slot is taken by some other key.
        for i in 0..(a.slots() * 64) {
            a.seen_before(&i.to_le_bytes());
        }
        assert!(!a.seen_before(b"old"));
    }

    #[test]
    fn the_window_grows_with_the_cache() {
        assert_eq!(Admission::new(256 << 20).slots(), 1 << 16);
        assert_eq!(Admission::new(u64::MAX).slots(), MAX_SLOTS as usize);
    }
}

//! The plan memo of one database: plans by [`super::plan_memo_key`] (session context, hints,
//! shape), so a statement shape is parsed and resolved once per context. Every miss of a
//! simple query looks its shape up here, from every worker thread at once, so the memo is
//! split in shards, each under its own lock, chosen by the key's hash: misses of different
//! shapes do not wait for one another. The key is hashed once per lookup: the hash picks the
//! shard and finds the key in the shard's table.
//!
//! Dropping the memo (after DDL or a reload) bumps an epoch under every shard's lock; a plan
//! made from what was known before the drop is not remembered after it (see
//! [`PlanMemo::remember`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::plan::Plan;

/// Shards of the memo: more than the worker threads of most machines pgmemo runs on.
const SHARDS: usize = 16;

/// Most memoized plans per shard before that shard starts over.
const MAX_PLANS_PER_SHARD: usize = 20_000 / SHARDS;

/// A memoized plan, its key and the key's hash.
struct Entry {
    hash: u64,
    key: Box<[u8]>,
    plan: Arc<Plan>,
}

type Shard = hashbrown::HashTable<Entry>;

/// See the module documentation.
pub struct PlanMemo {
    shards: [Mutex<Shard>; SHARDS],
    /// Hashes keys (randomly keyed: statement texts come from clients).
    hasher: ahash::RandomState,
    /// Bumped whenever the memo is dropped, so plans a session keeps for its prepared
    /// statements are dropped too.
    epoch: AtomicU64,
}

impl Default for PlanMemo {
    fn default() -> Self {
        PlanMemo {
            shards: std::array::from_fn(|_| Mutex::new(Shard::default())),
            hasher: ahash::RandomState::new(),
            epoch: AtomicU64::new(0),
        }
    }
}

fn locked(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

impl PlanMemo {
    /// A key's hash and its shard: picked by bits the table does not use for a key's bucket
    /// (the low ones) or its control byte (the top seven).
    fn locate(&self, key: &[u8]) -> (u64, &Mutex<Shard>) {
        let hash = self.hasher.hash_one(key);
        (hash, &self.shards[(hash >> 32) as usize % SHARDS])
    }

    /// The memoized plan for `key`.
    pub fn get(&self, key: &[u8]) -> Option<Arc<Plan>> {
        let (hash, shard) = self.locate(key);
        locked(shard)
            .find(hash, |e| e.hash == hash && *e.key == *key)
            .map(|e| Arc::clone(&e.plan))
    }

    /// Memoizes a plan made from what was known at `epoch` (an [`Self::epoch`] read before the
    /// plan's configuration and catalog facts were): nothing when the memo was dropped since,
    /// as the plan may rest on definitions or table lists that no longer hold, and once in the
    /// memo it would outlive the drop that should have removed it.
    pub fn remember(&self, key: Vec<u8>, plan: Arc<Plan>, epoch: u64) {
        let (hash, shard) = self.locate(&key);
        let mut shard = locked(shard);
        // Read under the shard's lock: `forget` bumps it holding every shard's.
        if self.epoch.load(Ordering::Acquire) != epoch {
            return;
        }
        if shard.len() >= MAX_PLANS_PER_SHARD {
            shard.clear();
        }
        let entry = Entry {
            hash,
            key: key.into_boxed_slice(),
            plan,
        };
        match shard.entry(hash, |e| e.hash == hash && e.key == entry.key, |e| e.hash) {
            hashbrown::hash_table::Entry::Occupied(mut found) => *found.get_mut() = entry,
            hashbrown::hash_table::Entry::Vacant(slot) => {
                slot.insert(entry);
            }
        }
    }

    /// Drops every plan and bumps the epoch.
    pub fn forget(&self) {
        // In index order, the only order any thread takes more than one shard's lock in.
        let mut shards: Vec<_> = self.shards.iter().map(locked).collect();
        for shard in &mut shards {
            shard.clear();
        }
        // Under every lock, so that no plan made before this is remembered after it.
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// Changes whenever the memo is dropped.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Every memoized plan whose key passes `filter`, with what `filter` made of the key.
    pub fn matching<T>(&self, mut filter: impl FnMut(&[u8]) -> Option<T>) -> Vec<(T, Arc<Plan>)> {
        let mut found = Vec::new();
        for shard in &self.shards {
            for e in locked(shard).iter() {
                if let Some(t) = filter(&e.key) {
                    found.push((t, Arc::clone(&e.plan)));
                }
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Arc<Plan> {
        let query = super::super::stats::QueryRegistry::default().get("x");
        Arc::new(super::super::plan::unparsable(query))
    }

    #[test]
    fn plans_are_found_in_their_shard_and_dropped_with_the_epoch() {
        let memo = PlanMemo::default();
        let epoch = memo.epoch();
        for i in 0..100u32 {
            memo.remember(i.to_le_bytes().to_vec(), plan(), epoch);
        }
        assert!((0..100u32).all(|i| memo.get(&i.to_le_bytes()).is_some()));
        assert_eq!(memo.matching(|k| (k[0] < 10).then_some(())).len(), 10);
        memo.forget();
        assert_ne!(memo.epoch(), epoch);
        assert!(memo.get(&1u32.to_le_bytes()).is_none());
        memo.remember(b"late".to_vec(), plan(), epoch);
        assert!(
            memo.get(b"late").is_none(),
            "planned before the drop: not remembered"
        );
        memo.remember(b"new".to_vec(), plan(), memo.epoch());
        assert!(memo.get(b"new").is_some());
    }
}

//! The hash map of the request path. Statement and portal names, statement shapes and cache
//! keys are looked up several times per request; std's SipHash made those lookups a tenth of
//! a cache miss's instructions. ahash keeps per-process random keys, so names a client picks
//! cannot be crafted to collide, at a fraction of the cost.

/// A `HashMap` with ahash's randomly keyed hasher.
pub type Map<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;

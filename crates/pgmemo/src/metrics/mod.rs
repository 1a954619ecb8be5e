//! The Prometheus metrics endpoint: beside the query path, it exposes the counters the admin
//! console shows (`stats`, pools, cache) and the upstream time of cache misses, for tools that
//! scrape rather than run SQL. Off unless `metrics_listen` is set; started and stopped with the
//! listener in [`crate::server`].
//!
//! - `histogram`: the lock-free latency histogram the query path records into.
//! - `exposition`: the text format (HELP/TYPE lines, escaping), independent of pgmemo.
//! - `render`: which figures become which metrics.
//! - `http`: the minimal HTTP/1.1 server answering `GET /metrics`.

mod exposition;
mod histogram;
pub mod http;
mod render;

pub use exposition::{escape_label_value, Exposition, Kind, CONTENT_TYPE};
pub use histogram::{Histogram, HistogramSnapshot, BUCKET_BOUNDS_MICROS};
pub use http::serve;
pub use render::render;

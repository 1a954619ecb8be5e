//! pgmemo: a PostgreSQL wire-protocol proxy that pools server connections and (soon) answers
//! repeated reads from memory.
//!
//! Read it along the path of a query: [`server`] accepts a connection, [`client`] runs the
//! session (startup, authentication, relaying), [`pool`] lends it server connections, and
//! [`shared`] is the one handle to process-wide state that every step receives.

pub mod admin;
pub mod auth;
pub mod cache;
pub mod cancel;
pub mod client;
pub mod config;
pub mod hash;
pub mod invalidate;
pub mod metrics;
pub mod net;
pub mod pool;
pub mod registry;
pub mod server;
pub mod shared;
pub mod stats;
pub mod tls;

pub use config::Config;
pub use server::{Pgmemo, PgmemoHandle, StartError};

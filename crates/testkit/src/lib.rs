//! testkit: dev-only helpers for pgmemo's integration tests. Not part of the query path; it
//! builds the world around it: a real PostgreSQL behind pgmemo, pgmemo itself, and clients.
//!
//! - [`TempPostgres`]: a throwaway cluster (initdb, free port, custom postgresql.conf and
//!   pg_hba.conf lines, stop/start, immediate shutdown and cleanup on drop).
//! - [`LocalPostgres`] / [`local_url`]: the shared server preinstalled on 127.0.0.1:5432.
//! - [`spawn_pgmemo`] / [`PgmemoInstance`]: pgmemo inside the test process;
//!   [`PgmemoProcess`]: the pgmemo binary as a child process.
//! - [`eventually`]: polling with a deadline, the only way tests wait; [`within`]: the
//!   deadline of a whole test.
//! - [`free_port`]: a port nobody listens on, distinct for parallel tests; [`unique`]: a name
//!   no other test uses.
//! - [`connect`], [`rows`], [`sqlstate`]: a client and what it gets back, as text.
//! - [`pg_client`], [`run_ok`]: psql and pgbench with a clean environment and a deadline.
//! - [`CancelGate`]: a forwarder to PostgreSQL that holds cancel requests until released.
//! - [`IsolatedLink`]: a network namespace behind a veth pair whose link can be cut, so a
//!   peer vanishes without closing (needs root).
//!
//! Everything is per-instance (own directory, own port), so tests can run in parallel.

#![warn(missing_docs)]

mod client;
mod eventually;
mod gate;
mod names;
mod netns;
mod pgmemo;
mod ports;
mod postgres;
mod procfs;
mod programs;

pub use client::{
    backend_pid, connect, connect_watched, pg_sleep_running, query_running, rows, sqlstate, url,
    url_with_password,
};
pub use eventually::{assert_eventually, eventually, eventually_some, within, POLL_INTERVAL};
pub use gate::CancelGate;
pub use names::unique;
pub use netns::IsolatedLink;
pub use pgmemo::{pgmemo_config_for, spawn_pgmemo, PgmemoInstance, PgmemoProcess};
pub use ports::free_port;
pub use postgres::{
    chown_to_postgres, local_url, pg_bin, LocalPostgres, TempPostgres, TempPostgresBuilder,
};
pub use procfs::pid_alive;
pub use programs::{assert_pgbench_report, output, pg_client, run_ok, scrub_pg_env};

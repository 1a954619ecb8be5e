//! Step 1 of the query path: accept client connections and spawn one task per client; own the
//! process-wide shutdown (stop accepting, let sessions finish up to `shutdown_timeout`, close).

mod listener;

pub use listener::{Pgmemo, PgmemoHandle, StartError};

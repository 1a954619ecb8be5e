//! What pgmemo knows of whether the server lets a pool's logins in without a password, under
//! `auth_type = upstream`, and the one login at a time that finds out.
//!
//! A login the server trusts needs no relayed exchange: it takes the pool's connections as
//! they are. Until pgmemo knows, every login relays its exchange over a new server
//! connection, and a crowd arriving at once (an application starting 200 connections) would
//! open 200 of them, more than the server's `max_connections` may allow. So while nothing is
//! known, one login finds out (the probe) and the others wait for its answer.

use tokio::sync::watch;

/// Whether the server asks this pool's logins for a password.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// Not known: the next login relays its exchange to find out.
    Unknown,
    /// A login is relaying its exchange to find out; the others wait for it.
    Probing,
    /// The last relayed login got in without a password.
    Trusted,
    /// The server asked the last relayed login for a password: every login relays its own.
    Asks,
}

/// A pool's [`Trust`], which logins wait on while it is being probed.
pub struct TrustState(watch::Sender<Trust>);

impl Default for TrustState {
    fn default() -> Self {
        TrustState(watch::Sender::new(Trust::Unknown))
    }
}

impl TrustState {
    pub fn get(&self) -> Trust {
        *self.0.borrow()
    }

    /// Records what a relayed login learned (ending a probe, if one runs).
    pub fn set(&self, trust: Trust) {
        self.0.send_replace(trust);
    }

    /// Makes the caller the login that finds out, if nothing is known and nobody probes; the
    /// probe ends when the returned guard drops (back to `Unknown` if nothing was learned).
    pub fn probe(&self) -> Option<Probe<'_>> {
        let started = self.0.send_if_modified(|t| {
            let unknown = *t == Trust::Unknown;
            if unknown {
                *t = Trust::Probing;
            }
            unknown
        });
        started.then(|| Probe(self))
    }

    /// Waits until no probe runs.
    pub async fn probed(&self) {
        let mut seen = self.0.subscribe();
        // The sender lives in `self`, so the channel cannot close while this waits.
        let _ = seen.wait_for(|t| *t != Trust::Probing).await;
    }
}

/// The running probe of a [`TrustState`].
pub struct Probe<'a>(&'a TrustState);

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        // A probe that failed before the server said anything (wrong database, server down,
        // the client gone) leaves the question to the next login.
        self.0 .0.send_if_modified(|t| {
            let running = *t == Trust::Probing;
            if running {
                *t = Trust::Unknown;
            }
            running
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_login_probes_and_the_others_wait_for_its_answer() {
        let state = TrustState::default();
        let probe = state.probe().expect("nothing known: this login probes");
        assert!(state.probe().is_none(), "a second login waits");
        assert_eq!(state.get(), Trust::Probing);
        let waiter = async {
            state.probed().await;
            state.get()
        };
        let learn = async {
            tokio::task::yield_now().await;
            state.set(Trust::Trusted);
            drop(probe);
        };
        let (seen, ()) = tokio::join!(waiter, learn);
        assert_eq!(seen, Trust::Trusted);
        assert_eq!(
            state.get(),
            Trust::Trusted,
            "dropping the probe keeps what it learned"
        );
    }

    #[test]
    fn a_probe_that_learned_nothing_leaves_the_question_open() {
        let state = TrustState::default();
        drop(state.probe());
        assert_eq!(state.get(), Trust::Unknown);
        assert!(state.probe().is_some(), "the next login probes");
    }
}

//! The login deadline, on the way from accept to a logged-in session: a client gets
//! `client_login_timeout` from its connection to the end of its authentication, however it
//! spends it (the startup packets, each password reply, the server's part of a relayed
//! exchange). Only waiting for a pool place, which is not the client's doing, does not count.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::ClientError;

/// When a client's time to log in runs out. One value carried through startup and
/// authentication, so that a client cannot earn a fresh `client_login_timeout` per step (a
/// trickled startup, then a silent password request) while it holds a `max_client_conn` slot
/// and, when relayed, a server connection.
#[derive(Debug, Clone, Copy)]
pub struct LoginDeadline {
    at: Instant,
}

impl LoginDeadline {
    /// Starts the clock at accept with `limit` (`client_login_timeout`).
    pub fn start(limit: Duration) -> LoginDeadline {
        LoginDeadline {
            at: Instant::now() + limit,
        }
    }

    /// The instant itself, for steps that report a timeout their own way (the startup).
    pub fn instant(&self) -> Instant {
        self.at
    }

    /// Runs a step of the login; [`ClientError::LoginTimeout`] when the deadline passes first.
    pub async fn bound<T>(
        &self,
        step: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        tokio::time::timeout_at(self.at, step)
            .await
            .unwrap_or(Err(ClientError::LoginTimeout))
    }

    /// Runs a wait that is not the client's doing (the queue for a pool place, bounded by
    /// `query_wait_timeout` of its own) and moves the deadline back by the time it took.
    pub async fn not_counting<T>(&mut self, wait: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let result = wait.await;
        self.at += started.elapsed();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_step_past_the_deadline_is_a_login_timeout() {
        let deadline = LoginDeadline::start(Duration::from_secs(3));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let step = deadline.bound(async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok(())
        });
        assert!(matches!(step.await, Err(ClientError::LoginTimeout)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pool_wait_does_not_count() {
        let mut deadline = LoginDeadline::start(Duration::from_secs(3));
        deadline
            .not_counting(tokio::time::sleep(Duration::from_secs(10)))
            .await;
        let step = deadline.bound(async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok(())
        });
        assert!(step.await.is_ok());
    }
}

//! A client's deadline for queueing in a pool, kept from one wait to the next.
//!
//! Under transaction pooling with more clients than servers nearly every transaction queues
//! for a place. Arming a fresh timer for each wait (register it in tokio's timer wheel, then
//! take it out again a moment later) cost about a tenth of the proxy's work per transaction.
//! A [`WaitTimer`] keeps one timer per client and moves it only when it would fire too early,
//! so most waits reuse it untouched. The price is precision: a wait gives up after
//! `query_wait_timeout` plus at most a quarter of it (and at most one second) more, the same
//! kind of slack PgBouncer's once-a-second timeout check has.

use std::pin::Pin;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// Most a timeout may fire late.
const MAX_SLACK: Duration = Duration::from_secs(1);

/// One client's reusable queueing deadline.
#[derive(Default)]
pub struct WaitTimer {
    sleep: Option<Pin<Box<Sleep>>>,
}

impl WaitTimer {
    /// The timer for a wait that may last `wait`: it fires no sooner than `wait` from now and
    /// no later than `wait` plus its slack.
    pub fn arm(&mut self, wait: Duration) -> Pin<&mut Sleep> {
        let slack = (wait / 4).min(MAX_SLACK);
        let now = Instant::now();
        let earliest = now + wait;
        match &mut self.sleep {
            Some(sleep) => {
                let deadline = sleep.deadline();
                if deadline < earliest || deadline > earliest + slack {
                    sleep.as_mut().reset(earliest + slack);
                }
            }
            None => self.sleep = Some(Box::pin(tokio::time::sleep_until(earliest + slack))),
        }
        self.sleep.as_mut().expect("armed above").as_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn fires_between_the_wait_and_its_slack_and_is_reused_meanwhile() {
        let mut timer = WaitTimer::default();
        let wait = Duration::from_millis(400);
        let first = timer.arm(wait).deadline();
        assert_eq!(first - Instant::now(), Duration::from_millis(500));
        // Within the slack the same deadline serves the next wait.
        tokio::time::advance(Duration::from_millis(60)).await;
        assert_eq!(timer.arm(wait).deadline(), first);
        // Past it, the deadline moves so that the wait is never cut short.
        tokio::time::advance(Duration::from_millis(60)).await;
        let moved = timer.arm(wait).deadline();
        assert!(moved > first);
        assert!(moved - Instant::now() >= wait);
        let start = Instant::now();
        timer.arm(wait).await;
        let waited = Instant::now() - start;
        assert!(waited >= wait && waited <= wait + wait / 4, "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn slack_is_at_most_a_second() {
        let mut timer = WaitTimer::default();
        let wait = Duration::from_secs(120);
        let deadline = timer.arm(wait).deadline();
        assert_eq!(deadline - Instant::now(), wait + MAX_SLACK);
        // A shorter wait than the armed one moves the deadline closer.
        let short = timer.arm(Duration::from_millis(10)).deadline();
        assert!(short - Instant::now() <= Duration::from_millis(13));
    }
}

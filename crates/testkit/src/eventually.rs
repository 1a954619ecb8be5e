//! Polling with a deadline: the only way testkit (and the tests built on it) wait for something;
//! and [`within`], the deadline a whole test runs under.
//!
//! Tests never sleep for a fixed time; they state a condition and how long it may take. The
//! clock is tokio's, so tests running with paused time get a virtual deadline.

use std::future::Future;
use std::time::Duration;

/// How often a condition is re-checked: short enough to keep tests fast, long enough not to
/// hammer a server that is still starting.
pub const POLL_INTERVAL: Duration = Duration::from_millis(15);

/// Re-checks `condition` every [`POLL_INTERVAL`] until it returns true (→ `true`) or `deadline`
/// has passed (→ `false`). The condition is always checked at least once, and once more at the
/// deadline, so a slow last poll does not turn success into failure.
pub async fn eventually<F, Fut>(deadline: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_some(deadline, move || {
        let check = condition();
        async move { check.await.then_some(()) }
    })
    .await
    .is_some()
}

/// Like [`eventually`] but panics with `what` when the deadline passes: for assertions that
/// should read as one line in a test.
pub async fn assert_eventually<F, Fut>(deadline: Duration, what: &str, condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    if !eventually(deadline, condition).await {
        panic!("condition not met within {deadline:?}: {what}");
    }
}

/// Runs `fut` to its end, or panics once `limit` has passed: the bound a test puts around its
/// whole body, so that a hang fails the test instead of blocking the suite.
pub async fn within<T>(limit: Duration, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("test did not finish within {limit:?}"))
}

/// Polls until `probe` yields a value and returns it, or `None` after `deadline`: for waits
/// whose result the test needs (a row that appears, a PID that gets written).
pub async fn eventually_some<T, F, Fut>(deadline: Duration, mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + deadline;
    loop {
        let last_chance = tokio::time::Instant::now() >= end;
        if let Some(value) = probe().await {
            return Some(value);
        }
        if last_chance {
            return None;
        }
        let next = (tokio::time::Instant::now() + POLL_INTERVAL).min(end);
        tokio::time::sleep_until(next).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn succeeds_once_the_condition_holds() {
        let calls = AtomicU32::new(0);
        let ok = eventually(Duration::from_secs(5), || async {
            calls.fetch_add(1, Ordering::SeqCst) >= 3
        })
        .await;
        assert!(ok);
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_at_the_deadline() {
        let start = tokio::time::Instant::now();
        assert!(!eventually(Duration::from_millis(100), || async { false }).await);
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(100) && waited < Duration::from_millis(150));
    }

    #[tokio::test]
    async fn returns_the_probed_value() {
        let mut n = 0;
        let got = eventually_some(Duration::from_secs(5), || {
            n += 1;
            let n = n;
            async move { (n == 2).then_some(n * 10) }
        })
        .await;
        assert_eq!(got, Some(20));
    }

    #[tokio::test(start_paused = true)]
    async fn within_returns_what_finished_in_time() {
        assert_eq!(within(Duration::from_secs(1), async { 7 }).await, 7);
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "test did not finish within 1s")]
    async fn within_panics_at_the_limit() {
        within(Duration::from_secs(1), std::future::pending::<()>()).await;
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "the sky turns green")]
    async fn assert_variant_panics_with_the_message() {
        assert_eventually(Duration::from_millis(50), "the sky turns green", || async {
            false
        })
        .await;
    }
}

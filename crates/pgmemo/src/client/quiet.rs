//! `Quiet`: a future wrapper that polls its inner future only after the inner future itself
//! asked to be woken.
//!
//! `tokio::select!` polls every branch each time the task wakes. In the session relays that
//! meant, at every message, the shutdown watcher's three small locks (two cancellation tokens
//! and a Notify) and a pointless poll of the other pump's idle socket. Wrapped in `Quiet`, each
//! branch is polled once to register, then only when something it waits on fires. Only for
//! futures that wait on wakers alone: one that expects to be re-polled to notice a flag set by
//! another branch would never be.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

struct Flag {
    fired: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        if let Some(task) = self.task.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            task.wake_by_ref();
        }
    }
}

/// See the module documentation.
pub struct Quiet<F> {
    inner: Pin<Box<F>>,
    flag: Arc<Flag>,
    own_waker: Waker,
    task_seen: Option<Waker>,
}

impl<F: Future> Quiet<F> {
    /// Wraps `inner`; the first poll always reaches it.
    pub fn new(inner: F) -> Self {
        let flag = Arc::new(Flag {
            fired: AtomicBool::new(true),
            task: Mutex::new(None),
        });
        Quiet {
            inner: Box::pin(inner),
            own_waker: Waker::from(flag.clone()),
            flag,
            task_seen: None,
        }
    }
}

impl<F: Future> Future for Quiet<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        if !this
            .task_seen
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            // Polled from a new task (or the first time): route wake-ups there and poll now.
            *this.flag.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
            this.task_seen = Some(cx.waker().clone());
            this.flag.fired.store(true, Ordering::Release);
        }
        if !this.flag.fired.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let mut inner_cx = Context::from_waker(&this.own_waker);
        this.inner.as_mut().poll(&mut inner_cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn completes_when_the_inner_future_is_woken() {
        let notify = Arc::new(tokio::sync::Notify::new());
        let n = notify.clone();
        let quiet = Quiet::new(async move { n.notified().await });
        let waiter = tokio::spawn(quiet);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        notify.notify_waiters();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap();
    }

    #[tokio::test]
    async fn is_not_polled_again_without_its_own_wake_up() {
        let polls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let p = polls.clone();
        let mut quiet = Box::pin(Quiet::new(std::future::poll_fn(move |_| {
            p.fetch_add(1, Ordering::Relaxed);
            Poll::<()>::Pending
        })));
        struct Ignore;
        impl Wake for Ignore {
            fn wake(self: Arc<Self>) {}
        }
        let waker = Waker::from(Arc::new(Ignore));
        let mut cx = Context::from_waker(&waker);
        for _ in 0..10 {
            assert!(quiet.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::Relaxed), 1);
    }
}

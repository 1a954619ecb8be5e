//! Single flight: when several sessions miss on the same key at once, one runs the query
//! upstream and stores the result while the others wait for it and then hit, instead of every
//! one of them running the same (possibly expensive) query.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::hash::Map;

/// Longest a miss waits for another session running the same query before running it itself.
pub const WAIT_LIMIT: Duration = Duration::from_secs(10);

/// The keys being filled right now.
#[derive(Debug, Default)]
pub struct Flights {
    running: Mutex<Map<Box<[u8]>, watch::Receiver<()>>>,
}

/// What a session that missed should do.
pub enum Flight {
    /// Run the query; the guard ends the flight when dropped (after the store, or when the
    /// query failed or the session went away).
    Leader(FlightGuard),
    /// Another session runs it: wait, then look again.
    Follower(watch::Receiver<()>),
}

/// Held by the session filling a key.
#[derive(Debug)]
pub struct FlightGuard {
    flights: Arc<Flights>,
    key: Box<[u8]>,
    _done: watch::Sender<()>,
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        self.flights
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

impl Flights {
    /// The flight filling `key` now, if one is: to wait for it without starting one.
    pub fn running(&self, key: &[u8]) -> Option<watch::Receiver<()>> {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }

    /// Joins the flight for `key`, or starts it.
    pub fn join(self: &Arc<Self>, key: &[u8]) -> Flight {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(rx) = running.get(key) {
            return Flight::Follower(rx.clone());
        }
        let (tx, rx) = watch::channel(());
        running.insert(key.into(), rx);
        Flight::Leader(FlightGuard {
            flights: Arc::clone(self),
            key: key.into(),
            _done: tx,
        })
    }

    /// Keys being filled now.
    pub fn len(&self) -> usize {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no key is being filled.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Waits until the leader of a flight is done, at most `limit`.
pub async fn wait(mut rx: watch::Receiver<()>, limit: Duration) {
    // The sender never sends: `changed` returns when it is dropped.
    let _ = tokio::time::timeout(limit, rx.changed()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn followers_wait_for_the_leader() {
        let flights = Arc::new(Flights::default());
        let Flight::Leader(guard) = flights.join(b"k") else {
            panic!("first is the leader")
        };
        let Flight::Follower(rx) = flights.join(b"k") else {
            panic!("second follows")
        };
        let waiter = tokio::spawn(wait(rx, Duration::from_secs(30)));
        assert!(!waiter.is_finished());
        drop(guard);
        waiter.await.unwrap();
        assert!(flights.is_empty());
        assert!(matches!(flights.join(b"k"), Flight::Leader(_)));
    }
}

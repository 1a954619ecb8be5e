//! Free TCP ports on 127.0.0.1 for throwaway servers (PostgreSQL clusters, pgmemo processes).
//!
//! Ports come from *below* the kernel's ephemeral range. A port from `bind(127.0.0.1:0)` lies
//! inside that range, where every outgoing connection a test opens takes its local port, so it
//! can be taken again between [`free_port`] and the server's bind. Below the range only explicit
//! listeners compete; [`free_port`] checks that none holds the port. Callers that start servers
//! still retry on "address in use": another test process may pick the same port, and a process
//! forked by another thread while the probe socket was open keeps it bound until it execs.

use std::collections::BTreeSet;
use std::hash::{BuildHasher as _, Hasher as _};
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;

/// Lowest port handed out: above the usual fixed ports of development services.
const LOWEST_PORT: u16 = 10_000;

/// Ports this process already handed out, so that two tests of one binary never get the same
/// port even if the first server has not bound it yet.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// A port on 127.0.0.1 that nothing listens on right now and that this process has not handed
/// out before.
///
/// Panics only if no local port can be bound at all.
pub fn free_port() -> u16 {
    let mut seen = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((low, high)) = candidate_range() {
        let span = u32::from(high - low) + 1;
        // A random starting point keeps parallel test processes apart.
        let start = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish() as u32;
        for i in 0..span.min(2_000) {
            let port = low + ((start.wrapping_add(i)) % span) as u16;
            if !seen.contains(&port) && TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
                seen.insert(port);
                return port;
            }
        }
    }
    // No usable range below the ephemeral ports: let the kernel choose.
    for _ in 0..64 {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .expect("testkit: cannot bind 127.0.0.1:0 to find a free port")
            .port();
        if seen.insert(port) {
            return port;
        }
    }
    panic!("testkit: the kernel kept returning ports this process already used");
}

/// `LOWEST_PORT` up to just below the kernel's ephemeral range, if that leaves room.
fn candidate_range() -> Option<(u16, u16)> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let ephemeral_low: u16 = range.split_whitespace().next()?.parse().ok()?;
    let high = ephemeral_low.checked_sub(1)?;
    (high >= LOWEST_PORT + 1_000).then_some((LOWEST_PORT, high))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let unique: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(unique.len(), ports.len());
        let (low, high) = candidate_range().expect("Linux with the usual ephemeral range");
        for port in ports {
            assert!((low..=high).contains(&port), "{port}");
            assert!(bindable_soon(port), "free port {port} is not bindable");
        }
    }

    /// A child forked by a parallel test may briefly hold a copy of the probe socket (until it
    /// execs), so "free" means "bindable within a moment".
    fn bindable_soon(port: u16) -> bool {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
                return true;
            }
            if std::time::Instant::now() >= end {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

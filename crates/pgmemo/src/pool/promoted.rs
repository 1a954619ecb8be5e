//! Unnamed statements promoted to named ones under transaction pooling
//! (`max_promoted_statements`). Drivers that send every query as the unnamed extended-protocol
//! statement (libpq's `PQexecParams`, `pgbench -M extended`, JDBC's first executions) make
//! PostgreSQL parse, analyse and plan the same text on every execution. A server connection
//! that sees a text a second time prepares it under a name of pgmemo's own, and later
//! executions of it bind that statement instead: PostgreSQL's plan cache then does what it
//! does for the client's own prepared statements.
//!
//! This module only remembers which texts a connection has seen and prepared; how a request
//! is rewritten and how a failed one is answered exactly as without promotion is the
//! transaction relay's (`client::transaction::promote`).

use std::sync::Arc;

use bytes::Bytes;

use crate::hash::Map;

/// The texts one server connection has seen as clients' unnamed statements, least recently
/// used forgotten beyond `max_promoted_statements` (and closed, if prepared).
#[derive(Default)]
pub struct PromotedStatements {
    slots: Map<u64, Slot>,
    hasher: ahash::RandomState,
    clock: u64,
    /// Numbers the connection's promoted statements: `pgmemo_u<n>` is never reused on it.
    next_name: u64,
    /// Executions that bound a statement prepared earlier.
    pub uses: u64,
    /// Statements prepared.
    pub prepares: u64,
}

/// One text seen.
struct Slot {
    /// The Parse message's body after its (empty) statement name: text and parameter types.
    body: Bytes,
    /// The parse digest of the client that sent it (`ClientSettings::parse_digest`): a
    /// statement is analysed under the session's settings, so it serves only clients that
    /// read its literals the same way.
    settings: Arc<str>,
    used: u64,
    state: SlotState,
}

enum SlotState {
    /// Seen once: the next sighting prepares it.
    Seen,
    /// Prepared (or being prepared) on the connection under this name.
    Prepared(Bytes),
    /// Never promoted while remembered: preparing it failed or said something (a notice)
    /// that binding a prepared statement would not say again.
    Refused,
}

/// What to do with a client's unnamed Parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Promotion {
    /// Send it as it is.
    Plain,
    /// Prepare it under `name` in place of the client's Parse, and bind that.
    Create { key: u64, name: Bytes },
    /// Bind `name`, prepared on the connection already, in place of parsing the text.
    Use { key: u64, name: Bytes },
}

impl PromotedStatements {
    /// Decides for a client's unnamed Parse whose body (after the name) is `body`, sent under
    /// `settings`. Names of prepared statements forgotten to make room go to `close`.
    pub fn consider(
        &mut self,
        body: &[u8],
        settings: &Arc<str>,
        max: usize,
        close: &mut Vec<String>,
    ) -> Promotion {
        let key = self.hasher.hash_one((body, &**settings));
        self.clock += 1;
        let clock = self.clock;
        if let Some(slot) = self.slots.get_mut(&key) {
            if slot.body[..] == *body && *slot.settings == **settings {
                slot.used = clock;
                return match &slot.state {
                    SlotState::Refused => Promotion::Plain,
                    SlotState::Prepared(name) => {
                        self.uses += 1;
                        Promotion::Use {
                            key,
                            name: name.clone(),
                        }
                    }
                    SlotState::Seen => {
                        self.next_name += 1;
                        self.prepares += 1;
                        let name = Bytes::from(format!("pgmemo_u{}", self.next_name));
                        slot.state = SlotState::Prepared(name.clone());
                        Promotion::Create { key, name }
                    }
                };
            }
            // Another text with the same hash: it takes the place.
            self.forget(key, false, close);
        }
        while self.slots.len() >= max.max(1) {
            let Some(oldest) = self
                .slots
                .iter()
                .min_by_key(|(_, s)| s.used)
                .map(|(k, _)| *k)
            else {
                break;
            };
            self.forget(oldest, false, close);
        }
        self.slots.insert(
            key,
            Slot {
                body: Bytes::copy_from_slice(body),
                settings: Arc::clone(settings),
                used: clock,
                state: SlotState::Seen,
            },
        );
        Promotion::Plain
    }

    /// Forgets the text `key` (a prepared statement's name goes to `close`); with `refuse`
    /// it stays remembered as never to be promoted.
    pub fn forget(&mut self, key: u64, refuse: bool, close: &mut Vec<String>) {
        let Some(slot) = self.slots.get_mut(&key) else {
            return;
        };
        if let SlotState::Prepared(name) = &slot.state {
            close.push(String::from_utf8_lossy(name).into_owned());
        }
        if refuse {
            slot.state = SlotState::Refused;
        } else {
            self.slots.remove(&key);
        }
    }

    /// The preparation of `key` failed: the connection holds no statement for it, and the
    /// text is not promoted again while remembered.
    pub fn refuse_unprepared(&mut self, key: u64) {
        if let Some(slot) = self.slots.get_mut(&key) {
            slot.state = SlotState::Refused;
        }
    }

    /// Whether the connection holds the statement `name` prepared for the text `key`.
    pub fn holds(&self, key: u64, name: &[u8]) -> bool {
        self.slots
            .get(&key)
            .is_some_and(|s| matches!(&s.state, SlotState::Prepared(n) if n[..] == *name))
    }

    /// Statements prepared on the connection now.
    #[cfg(test)]
    fn prepared(&self) -> usize {
        self.slots
            .values()
            .filter(|s| matches!(s.state, SlotState::Prepared(_)))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[test]
    fn a_text_is_prepared_at_its_second_sighting_and_bound_after() {
        let mut p = PromotedStatements::default();
        let mut close = Vec::new();
        let utc = digest("");
        let body = b"SELECT $1\0\0\0";
        assert_eq!(p.consider(body, &utc, 10, &mut close), Promotion::Plain);
        let Promotion::Create { key, name } = p.consider(body, &utc, 10, &mut close) else {
            panic!("the second sighting prepares");
        };
        assert_eq!(&name[..], b"pgmemo_u1");
        assert_eq!(
            p.consider(body, &utc, 10, &mut close),
            Promotion::Use {
                key,
                name: name.clone()
            }
        );
        assert_eq!(
            p.consider(body, &digest("8:timezone5:Paris"), 10, &mut close),
            Promotion::Plain,
            "other analysis settings are another statement"
        );
        p.forget(key, false, &mut close);
        assert_eq!(close, ["pgmemo_u1"]);
        assert_eq!(p.consider(body, &utc, 10, &mut close), Promotion::Plain);
        let Promotion::Create { name, key } = p.consider(body, &utc, 10, &mut close) else {
            panic!("prepared again after being forgotten");
        };
        assert_eq!(&name[..], b"pgmemo_u2", "a name is never reused");
        p.forget(key, true, &mut close);
        assert_eq!(p.consider(body, &utc, 10, &mut close), Promotion::Plain);
        assert_eq!(p.consider(body, &utc, 10, &mut close), Promotion::Plain);
        assert_eq!(p.prepared(), 0);
    }

    #[test]
    fn the_least_recently_used_text_makes_room_and_its_statement_is_closed() {
        let mut p = PromotedStatements::default();
        let mut close = Vec::new();
        let utc = digest("");
        for _ in 0..2 {
            p.consider(b"SELECT 1\0\0\0", &utc, 2, &mut close);
        }
        p.consider(b"SELECT 2\0\0\0", &utc, 2, &mut close);
        assert!(close.is_empty());
        assert_eq!(p.prepared(), 1);
        p.consider(b"SELECT 2\0\0\0", &utc, 2, &mut close);
        p.consider(b"SELECT 3\0\0\0", &utc, 2, &mut close);
        assert_eq!(close, ["pgmemo_u1"], "SELECT 1 was used least recently");
        assert_eq!(p.prepared(), 1);
    }
}

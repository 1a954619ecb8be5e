//! The detached client's request as the cache reads it: its shape, its key, its statement
//! text (only on a miss), and its answer from the store.

use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use wire::backend::TransactionStatus;
use wire::FrameHeader;

use super::{refusal, Planned, TxnCache, BIND_COMPLETE, PARSE_AND_BIND_COMPLETE};
use crate::cache::context::Context;
use crate::cache::plan::{Plan, Refusal};
use crate::cache::store::Described;
use crate::client::cached::messages::{
    bind_has_time_word, bind_message, cacheable_shape, parse_message, scan_batch, short_batch,
    Batch, BatchShape,
};
use crate::client::transaction::link::{ClientState, Unnamed};
use crate::pool::{ParamTypes, PreparedStatement};

/// A detached client's request as the cache sees it. Its key (after the context prefix) is
/// in [`TxnCache::tail`]; nothing here is allocated, so a hit allocates nothing.
pub struct Request {
    pub(super) len: usize,
    pub(super) kind: Kind,
    /// A text parameter reads the clock (`now`, `today`, ...).
    pub(super) time_word: bool,
}

pub(super) enum Kind {
    Query,
    Batch {
        /// Its shape; the ranges it holds are of the client's buffer, which starts with the
        /// batch until the request is consumed.
        shape: BatchShape,
        statement: Statement,
    },
}

impl Request {
    /// The request's Describe, as the store answers it (`buf`: the client's buffer, the
    /// request still at its front).
    pub(super) fn described<'b>(&self, buf: &'b [u8]) -> Described<'b> {
        match &self.kind {
            Kind::Query => Described::Portal,
            Kind::Batch { shape, .. } => shape.described(buf),
        }
    }

    /// For a capture: the result formats of a batch that describes its statement.
    pub(super) fn statement_formats(&self, buf: &[u8]) -> Option<Box<[u8]>> {
        match &self.kind {
            Kind::Batch { shape, .. } => shape.statement_formats(buf),
            Kind::Query => None,
        }
    }
}

/// Where a batch's statement text is.
pub(super) enum Statement {
    /// In the batch's Parse (of the unnamed statement), at this range of the client's buffer.
    Parse(std::ops::Range<usize>),
    /// The client's unnamed statement.
    Unnamed,
    /// A statement the client prepared by name.
    Named(Arc<PreparedStatement>),
}

impl TxnCache {
    /// The request at the front of `buf`, if it is one the cache may answer; its key tail
    /// goes to `self.tail`.
    pub(super) fn request(
        &mut self,
        buf: &BytesMut,
        state: &ClientState,
        max_message: usize,
    ) -> Option<Request> {
        let header = FrameHeader::peek(buf, max_message).ok()??;
        let tail = &mut self.tail;
        tail.clear();
        match header.tag {
            b'Q' => {
                // Not a string (no terminator): the server reports it, as it would directly.
                let text = buf.get(5..header.frame_len)?.strip_suffix(b"\0")?;
                tail.extend_from_slice(text);
                Some(Request {
                    len: header.frame_len,
                    kind: Kind::Query,
                    time_word: false,
                })
            }
            b'P' | b'B' => {
                let Batch::Complete(len) = scan_batch(buf, max_message) else {
                    return None;
                };
                let bytes = &buf[..len];
                let (frames, n) = short_batch(bytes)?;
                let shape = cacheable_shape(bytes, &frames[..n])?;
                let bind = &bytes[frames[usize::from(shape.parse)].clone()];
                let bind = bind_message(&bind[5..])?;
                // The statement: parsed in this batch (unnamed only: a named Parse must
                // reach a server), the client's unnamed one, or one it prepared by name.
                let statement = if shape.parse {
                    let m = parse_message(&bytes[frames[0].start + 5..frames[0].end])?;
                    if !m.name.is_empty() {
                        return None;
                    }
                    identity(tail, m.text, m.param_types);
                    Statement::Parse(frames[0].clone())
                } else if bind.statement.is_empty() {
                    let u = state.unnamed.as_ref().filter(|u| u.outcome.is_none())?;
                    let m = parse_message(&u.parse[5..])?;
                    identity(tail, m.text, m.param_types);
                    Statement::Unnamed
                } else {
                    let name = std::str::from_utf8(bind.statement).ok()?;
                    if state.effect_of(name).is_some() {
                        return None;
                    }
                    let s = state.statements.get(name)?;
                    // Prepared before a SET of a setting that decides how its literals read:
                    // it keeps the old reading (as in PostgreSQL), which the session's
                    // context, part of the key, no longer describes.
                    if s.read_under() != &**state.settings.parse_digest() {
                        return None;
                    }
                    let ParamTypes::Oids(oids) = &s.key.types else {
                        return None;
                    };
                    tail.extend_from_slice(&(s.key.text.len() as u32).to_le_bytes());
                    tail.extend_from_slice(s.key.text.as_bytes());
                    tail.extend_from_slice(&(oids.len() as i16).to_be_bytes());
                    for oid in oids.iter() {
                        tail.extend_from_slice(&oid.to_be_bytes());
                    }
                    // Rows the client decodes with a shape it learnt earlier are stored and
                    // served apart for each shape: after DDL, another client's result (of the
                    // new shape) must not reach one that still expects the old (see
                    // `transaction::shape`). A batch that describes its portal tells the
                    // shape with the rows.
                    if matches!(shape.described(bytes), Described::Nothing) {
                        let learnt = state.row_shapes.get(&s.id).copied().unwrap_or(0);
                        tail.push(b'S');
                        tail.extend_from_slice(&learnt.to_le_bytes());
                    } else {
                        tail.push(b'D');
                    }
                    Statement::Named(Arc::clone(s))
                };
                tail.extend_from_slice(bind.tail);
                Some(Request {
                    len,
                    kind: Kind::Batch { shape, statement },
                    time_word: bind_has_time_word(&bind),
                })
            }
            _ => None,
        }
    }

    /// The statement text of `request` (still at the front of `buf`).
    pub(super) fn text(request: &Request, buf: &[u8], state: &ClientState) -> Option<String> {
        let text: &[u8] = match &request.kind {
            Kind::Query => buf.get(5..request.len - 1)?,
            Kind::Batch { statement, .. } => match statement {
                Statement::Parse(r) => parse_message(buf.get(r.start + 5..r.end)?)?.text,
                Statement::Unnamed => {
                    let u = state.unnamed.as_ref()?;
                    return parse_message(&u.parse[5..])
                        .and_then(|m| std::str::from_utf8(m.text).ok().map(str::to_owned));
                }
                Statement::Named(s) => return Some(s.key.text.to_string()),
            },
        };
        std::str::from_utf8(text).ok().map(str::to_owned)
    }

    /// Builds the key of `request` in `self.key`; `None` without a current context.
    pub(super) fn make_key(&mut self, request: &Request, state: &ClientState) -> Option<()> {
        let ctx_id = self.context(state)?.id;
        self.key.clear();
        self.key.extend_from_slice(&self.db.id.to_le_bytes());
        self.key.extend_from_slice(&ctx_id.to_le_bytes());
        self.key.push(match request.kind {
            Kind::Query => b'Q',
            Kind::Batch { .. } => b'E',
        });
        self.key.extend_from_slice(&self.tail);
        Some(())
    }

    /// The answer to `request` from the store, with ReadyForQuery(`status`).
    pub(super) fn hit(
        &mut self,
        request: &Request,
        buf: &[u8],
        state: &ClientState,
        status: TransactionStatus,
    ) -> Option<Vec<u8>> {
        self.make_key(request, state)?;
        let cache = &self.shared.cache;
        let entry = cache.store.get(&self.key)?;
        let prefix: &[u8] = match &request.kind {
            Kind::Query => b"",
            Kind::Batch {
                statement: Statement::Parse(_),
                ..
            } => PARSE_AND_BIND_COMPLETE,
            Kind::Batch { .. } => BIND_COMPLETE,
        };
        let described = request.described(buf);
        if !entry.is_servable(Instant::now) || !entry.can_answer(described) {
            return None;
        }
        let out = &mut self.out;
        out.clear();
        if !entry.answer_into(out, prefix, described) {
            return None;
        }
        out.extend_from_slice(&[b'Z', 0, 0, 0, 5, status.as_byte()]);
        cache.stats.served(&entry);
        Some(std::mem::take(out))
    }

    /// Gives back the buffer a hit's answer was written in.
    pub fn recycle(&mut self, mut out: Vec<u8>) {
        out.clear();
        self.out = out;
    }

    /// Removes an answered request from the client's buffer; a Parse of the unnamed
    /// statement answered with it becomes the client's unnamed statement (unless it already
    /// is: drivers parse the same text every time).
    pub(super) fn consume(
        &mut self,
        buf: &mut BytesMut,
        request: &Request,
        state: &mut ClientState,
    ) {
        if let Kind::Batch {
            statement: Statement::Parse(r),
            ..
        } = &request.kind
        {
            let parse = &buf[r.clone()];
            let same = state
                .unnamed
                .as_ref()
                .is_some_and(|u| u.outcome.is_none() && u.parse[..] == *parse);
            if !same {
                state.parses += 1;
                state.unnamed = Some(Unnamed {
                    seq: state.parses,
                    parse: Bytes::copy_from_slice(parse),
                    outcome: None,
                    plain: false,
                    promoted: None,
                });
            }
        }
        if let Kind::Query = request.kind {
            // A simple Query drops the unnamed statement, answered here or by the server.
            state.unnamed = None;
        }
        let _ = buf.split_to(request.len);
    }
}

/// `len`, text and parameter types as a session-mode key names a statement, so that both
/// pool modes share entries.
pub(super) fn identity(key: &mut Vec<u8>, text: &[u8], param_types: &[u8]) {
    key.extend_from_slice(&(text.len() as u32).to_le_bytes());
    key.extend_from_slice(text);
    key.extend_from_slice(param_types);
}

/// Whether a query text may be `SET`/`RESET pgmemo.cache` (checked fully only then).
pub(super) fn may_switch(text: &[u8]) -> bool {
    let text = text.trim_ascii_start();
    [&b"set"[..], b"reset"].iter().any(|w| {
        text.get(..w.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(w))
    })
}

impl TxnCache {
    /// The answer to a simple Query inside a transaction block, from the store: only while the
    /// block has not written, changed settings or DDL, and runs under READ COMMITTED (the same
    /// conditions under which session pooling serves reads in a block). Ends with
    /// ReadyForQuery('T').
    pub fn hit_in_block(&mut self, text: &[u8], state: &ClientState) -> Option<Bytes> {
        if !self.block_may_hit(state) {
            return None;
        }
        self.tail.clear();
        self.tail.extend_from_slice(text);
        let request = Request {
            len: 0,
            kind: Kind::Query,
            time_word: false,
        };
        let answer = self.answer_in_block(&request, &[], state);
        if answer.is_none() {
            if let Ok(text) = std::str::from_utf8(text) {
                self.fill_in_block(&request, text, &[], state);
            }
        }
        answer
    }

    /// The answer to the extended-protocol read at the front of `buf` (`[Parse] Bind
    /// [Describe] Execute Sync`, as a detached client's) inside a transaction block, under the
    /// conditions of [`Self::hit_in_block`]; on a hit the batch is taken from `buf` (its
    /// unnamed Parse becomes the client's unnamed statement, sent to a server only when a
    /// later request needs it). Ends with ReadyForQuery('T').
    pub fn batch_hit_in_block(
        &mut self,
        buf: &mut BytesMut,
        state: &mut ClientState,
        max_message: usize,
    ) -> Option<Bytes> {
        if !self.block_may_hit(state) {
            return None;
        }
        let request = self.request(buf, state, max_message)?;
        if !matches!(request.kind, Kind::Batch { .. }) {
            return None;
        }
        let Some(bytes) = self.answer_in_block(&request, buf, state) else {
            if let Some(text) = Self::text(&request, buf, state) {
                self.fill_in_block(&request, &text, buf, state);
            }
            return None;
        };
        self.consume(buf, &request, state);
        Some(bytes)
    }

    /// A read in the block that the store could not answer, about to go to the server: when
    /// its plan is known without asking the server (memoized for its shape, or kept for the
    /// client's named statement) and allows storing, its response is captured, and stored
    /// once it ends cleanly with the block still open. The block has not written (nor
    /// changed settings, nor run under a snapshot), so what the read sees is what an
    /// autocommit read would, and the generations snapshotted now keep a write committed
    /// meanwhile from leaving it stale. A shape the memo lacks is planned with the catalog
    /// after the transaction, so its next read in a block is captured.
    fn fill_in_block(&mut self, request: &Request, text: &str, buf: &[u8], state: &ClientState) {
        if !self.fills.is_empty() {
            return;
        }
        let Some(context) = self.context(state).cloned() else {
            return;
        };
        let Some(planned) = self.plan_without_lookup(request, &context, || Some(text.into()))
        else {
            return;
        };
        let Some(plan) = self.storable(request, planned, &context) else {
            return;
        };
        if self.make_key(request, state).is_some() {
            let formats = request.statement_formats(buf);
            self.start_capture(&plan, None, TransactionStatus::InTransaction, formats, 0);
        }
    }

    /// Keeps `planned` as the plan of the request being served (its effects count when the
    /// answer arrives) and returns it when the result may be stored; otherwise counts why not.
    pub(super) fn storable(
        &mut self,
        request: &Request,
        planned: Planned,
        context: &Context,
    ) -> Option<Arc<Plan>> {
        let plan = Arc::clone(&planned.plan);
        let time = planned.time_literal || request.time_word;
        self.planned = Some(planned);
        if let Err(r) = refusal(&plan, self.usable(), time, context) {
            self.shared.cache.stats.refused_query(r, &plan.query);
            return None;
        }
        Some(plan)
    }

    /// A hit for `request` inside a transaction block, ending with ReadyForQuery('T'), as
    /// bytes the queue can hold until the answers before it are out.
    fn answer_in_block(
        &mut self,
        request: &Request,
        buf: &[u8],
        state: &ClientState,
    ) -> Option<Bytes> {
        self.queued_answer(request, buf, state, TransactionStatus::InTransaction)
    }

    /// A hit for `request`, ending with ReadyForQuery(`status`), as bytes the queue can hold
    /// until the answers before it are out.
    pub(super) fn queued_answer(
        &mut self,
        request: &Request,
        buf: &[u8],
        state: &ClientState,
        status: TransactionStatus,
    ) -> Option<Bytes> {
        let answer = self.hit(request, buf, state, status)?;
        let bytes = Bytes::copy_from_slice(&answer);
        self.recycle(answer);
        Some(bytes)
    }

    /// Whether reads in the client's transaction block may be answered from the cache: the
    /// block has not written, changed settings or run DDL, and runs under READ COMMITTED (the
    /// conditions under which session pooling serves reads in a block).
    fn block_may_hit(&self, state: &ClientState) -> bool {
        self.block_refusal(state).is_ok()
    }

    /// Why reads in the client's transaction block may not be answered from the cache nor
    /// stored (see [`Self::block_may_hit`]), with session pooling's reasons: a block that
    /// wrote (or failed) is `TransactionWrote`, one under a snapshot `SnapshotIsolation`.
    pub(super) fn block_refusal(&self, state: &ClientState) -> Result<(), Refusal> {
        let t = &self.txn;
        if state.status == TransactionStatus::Failed || t.writes_data() || t.ddl {
            return Err(Refusal::TransactionWrote);
        }
        self.usable()?;
        if t.settings {
            return Err(Refusal::SettingsUnknown);
        }
        let context = self.context(state).ok_or(Refusal::SettingsUnknown)?;
        if t.snapshot || context.snapshot_by_default() {
            return Err(Refusal::SnapshotIsolation);
        }
        Ok(())
    }
}

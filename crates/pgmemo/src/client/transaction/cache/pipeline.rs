//! Reads pipelined behind the attachment's first request (sent before its answer arrived),
//! outside a transaction block. While every request sent so far is an inert read, a read
//! runs in the state known now: it is answered from the cache in its turn (pgmemo's own
//! answer, queued behind the responses before it) or, on a miss, captured and stored like
//! the first request. Behind anything else it is forwarded as it is.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use wire::backend::TransactionStatus;

use super::request::{Kind, Statement};
use super::TxnCache;
use crate::client::transaction::link::ClientState;

/// How a request about to be sent while attached stands towards the pipeline before it.
pub struct Pipelined {
    /// Nothing is owed to the client before it: the attachment's first request, or one
    /// arriving after every answer.
    pub first: bool,
    /// The request starts with a SET pending or amid COPY: it can only be forwarded (so can
    /// one inside a transaction block, which the client's status tells).
    pub excluded: bool,
    /// ReadyForQuery messages the client will get from the server before this request's.
    pub ahead: usize,
}

impl TxnCache {
    /// Whether requests sent during this attachment may still be looked at by
    /// [`Self::pipelined`]: every one so far was an inert read.
    pub fn watches_pipeline(&self) -> bool {
        self.inert_so_far
    }

    /// Looks at the request at the front of `buf`, about to be sent to the attached server
    /// (see the module's comment): its answer when the cache has it, which takes the request
    /// from `buf`; `None` when it goes to the server, captured if it may be stored. Asked
    /// only while [`Self::watches_pipeline`].
    pub fn pipelined(
        &mut self,
        buf: &mut BytesMut,
        state: &mut ClientState,
        max_message: usize,
        at: Pipelined,
    ) -> Option<Bytes> {
        debug_assert!(self.inert_so_far, "asked only while watching the pipeline");
        if at.first {
            // The first request was looked at before the server was taken; a request
            // arriving once everything was answered was not (and is not looked at now).
            self.inert_so_far = std::mem::take(&mut self.first_unsent);
            return None;
        }
        self.first_unsent = false;
        self.inert_so_far = false;
        if at.excluded || state.status != TransactionStatus::Idle {
            return None;
        }
        let request = self.request(buf, state, max_message)?;
        if let Kind::Batch {
            statement: Statement::Unnamed,
            ..
        } = request.kind
        {
            // The client's unnamed statement is whatever the requests before it left: a Parse
            // among them that fails leaves none on the server.
            return None;
        }
        let context = self.context(state)?.clone();
        let planned = self.plan_without_lookup(&request, &context, || {
            Self::text(&request, buf, state).map(Arc::from)
        })?;
        self.inert_so_far = planned.plan.read.is_ok() && planned.plan.effects.is_empty();
        let inert = self.inert_so_far;
        let plan = self
            .storable(&request, planned, &context)
            .filter(|_| inert)?;
        if let Some(answer) = self.queued_answer(&request, buf, state, TransactionStatus::Idle) {
            self.consume(buf, &request, state);
            return Some(answer);
        }
        // The lookup that missed left the request's key in `self.key`.
        let formats = request.statement_formats(buf);
        self.start_capture(&plan, None, TransactionStatus::Idle, formats, at.ahead);
        None
    }
}

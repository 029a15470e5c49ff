//! Script merging: calls of one [`SharedScript`] queued one after another leave as one script
//! call ([`Merging`], filled by the writer), whose reply array is split back, one element per
//! caller ([`MergedCalls::answer`]).
//!
//! Invariants:
//! - A merged call holds calls of one script only, all by SHA1 or all with the body, at most
//!   [`MAX_MERGED_CALLS`] of them, in the order their callers queued them: the master runs them
//!   in that order and atomically, as it would have run them one after another.
//! - Each caller gets element `i` of the reply array, or, when the reply is not an array of
//!   one element per caller (an error: `BUSY`, `OOM`, …), the same answer as every caller of
//!   the call. One more element, an integer, is the master's write witness after the call
//!   (the lock script adds it when an acquire took its key): the link's [`Witness`] notes it.
//! - A script that [answers its clock](SharedScript::answers_clock) ends its reply array with
//!   the master's clock (µs) as the call read it, after the witness: the link's [`CallClock`]
//!   judges it against the time from when the call was encoded (before it was written) to when
//!   its reply was read, and if the master's clock ran ahead of the clock rule every `OK` of the
//!   call (an acquire that took its key) is handed over as [`CLOCK_AHEAD`]: no vote, undone as
//!   one. Callers never see the clock element, as they never see the witness.
//! - The lock script's merged call leads its arguments with the link's highest witness (the
//!   floor, [`super::Floor`]) as of when it is encoded: every answer read before then, on this
//!   connection or an earlier one, is at or below it.
//! - A merged call the master answered `NOSCRIPT` is queued again at once, call by call with
//!   the body (merged again by the writer), whether or not its callers still wait.

use super::connection::{Answer, AwaitingReply, Outgoing, Payload, Recipients, ReplyTo};
use super::{CallClock, Link, SharedScript, Witness};
use crate::protocol::{encode_script_call, Invoke, Reply, ScriptCall};
use crate::redlock::CLOCK_AHEAD;
use bytes::BytesMut;
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Most calls merged into one script call: enough to amortise the script's fixed cost, few
/// enough that one call keeps the master busy for well under a millisecond.
pub(super) const MAX_MERGED_CALLS: usize = 64;

/// The calls of one [`SharedScript`] gathered by the writer, not yet encoded.
#[derive(Default)]
pub(super) struct Merging {
    script: Option<(Arc<SharedScript>, bool)>,
    calls: Vec<ScriptCall>,
    callers: Vec<Caller>,
    queued_at: Option<Instant>,
}

/// Who waits for one call of a merged script call: where its answer goes, and the
/// confirmation it asked for (asked again if the call is sent again with the body).
pub(super) struct Caller {
    pub(super) reply: Option<ReplyTo>,
    pub(super) confirm: Option<u32>,
}

impl Merging {
    /// Whether no call is gathered.
    pub(super) fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Whether [`MAX_MERGED_CALLS`] calls are gathered.
    pub(super) fn is_full(&self) -> bool {
        self.calls.len() >= MAX_MERGED_CALLS
    }

    /// Whether a call of `script` can join the calls gathered so far.
    pub(super) fn takes(&self, script: &Arc<SharedScript>, by_body: bool) -> bool {
        match &self.script {
            None => true,
            Some((gathered, gathered_by_body)) => {
                Arc::ptr_eq(gathered, script)
                    && *gathered_by_body == by_body
                    && self.calls.len() < MAX_MERGED_CALLS
            }
        }
    }

    pub(super) fn push(
        &mut self,
        script: Arc<SharedScript>,
        call: ScriptCall,
        by_body: bool,
        caller: Caller,
        queued_at: Instant,
    ) {
        self.script.get_or_insert((script, by_body));
        self.queued_at.get_or_insert(queued_at);
        self.calls.push(call);
        self.callers.push(caller);
    }

    /// Encodes the gathered calls as one call, in flight from now on; `witness`: what the
    /// link's master answered so far (the floor the lock script checks).
    pub(super) fn flush(
        &mut self,
        buf: &mut BytesMut,
        queue: &mut VecDeque<AwaitingReply>,
        witness: &Witness,
    ) {
        let (Some((script, by_body)), Some(queued_at)) =
            (self.script.take(), self.queued_at.take())
        else {
            return;
        };
        let invoke = match by_body {
            true => Invoke::Body(script.body),
            false => Invoke::Sha(&script.sha),
        };
        let (lead, len) = script.lead(witness, &self.calls);
        encode_script_call(buf, invoke, script.names(), &lead[..len], self.calls.iter());
        let merged = MergedCalls {
            script,
            by_body,
            calls: std::mem::take(&mut self.calls),
            callers: std::mem::take(&mut self.callers),
        };
        queue.push_back(AwaitingReply {
            replies: 1,
            got: Vec::with_capacity(1),
            to: Recipients::Merged(merged),
            cleanup: None,
            by_body: None,
            confirm: None,
            queued_at,
        });
    }
}

/// The calls of one merged script call, kept until answered (to send again with the body).
pub(super) struct MergedCalls {
    script: Arc<SharedScript>,
    by_body: bool,
    calls: Vec<ScriptCall>,
    callers: Vec<Caller>,
}

impl MergedCalls {
    /// Hands each caller its element of the reply array (`Err`: none will come); calls the
    /// master answered `NOSCRIPT` are queued again on `resend`, with the body, as handed over
    /// at `queued_at`. `link`: the master's, whose witness and clock judge the reply notes;
    /// the master read its clock for the call between `queued_at` (its first caller's
    /// hand-over, the earliest it can have been written: no clock read of its own) and
    /// `read_at` (when the reader read the reply).
    pub(super) fn answer(
        self,
        answer: Answer,
        (queued_at, read_at): (Instant, Instant),
        resend: &mpsc::UnboundedSender<Outgoing>,
        link: &Link,
    ) {
        if !self.by_body && matches!(&answer, Ok(r) if r.is_error_code("NOSCRIPT")) {
            for (call, caller) in self.calls.into_iter().zip(self.callers) {
                let again = Outgoing {
                    payload: Payload::Script {
                        script: self.script.clone(),
                        call,
                        invoke_by_body: true,
                    },
                    replies: 1,
                    reply: caller.reply,
                    cleanup_expires: None,
                    queued_at,
                    confirm: caller.confirm,
                };
                // A closed queue drops the request: its caller sees the channel close.
                let _ = resend.send(again);
            }
            return;
        }
        let txs: Vec<Option<ReplyTo>> = self.callers.into_iter().map(|c| c.reply).collect();
        let mut answer = answer;
        if let Ok(Reply::Array(items)) = &mut answer {
            if self.script.answers_clock {
                strip_clock(items, txs.len(), (queued_at, read_at), &link.call_clock);
            }
            strip_witness(items, txs.len(), &link.witness);
        }
        match answer {
            Ok(Reply::Array(items)) if items.len() == txs.len() => {
                for (tx, item) in txs.into_iter().zip(items) {
                    if let Some(tx) = tx {
                        let _ = tx.send(Ok(item));
                    }
                }
            }
            // An error (`BUSY`, `OOM`, …) concerns every caller of the call alike.
            other => {
                for tx in txs.into_iter().flatten() {
                    let _ = tx.send(other.clone());
                }
            }
        }
    }
}

/// Takes the master's clock (µs) off the end of a reply array of `callers` answers (after the
/// witness, if any) and has `clock` judge it; if it ran ahead, every acquire the call answered
/// `OK` becomes [`CLOCK_AHEAD`]. The master read its clock between the two instants given.
fn strip_clock(
    items: &mut Vec<Reply>,
    callers: usize,
    (sent, read): (Instant, Instant),
    clock: &CallClock,
) {
    if !(callers + 1..=callers + 2).contains(&items.len()) {
        return;
    }
    let Some(&Reply::Integer(master_us @ 0..)) = items.last() else {
        return;
    };
    items.pop();
    if clock.ahead(master_us as u64, sent, read) {
        for item in items.iter_mut().take(callers) {
            if *item == Reply::ok() {
                *item = CLOCK_AHEAD;
            }
        }
    }
}

/// Takes the write witness off the end of a reply array of `callers` answers, if it is there,
/// and notes it.
fn strip_witness(items: &mut Vec<Reply>, callers: usize, witness: &Witness) {
    if items.len() == callers + 1 {
        if let Some(Reply::Integer(value @ 0..)) = items.last() {
            witness.saw(*value as u64);
            items.pop();
        }
    }
}

//! The barrier-aligned merge: one downstream stream out of the backfill actors' outputs.
//!
//! ```text
//!   actor 0 ──▶ ┐   chunks pass as they come (round robin over ready inputs)
//!   actor 1 ──▶ ├──▶ merge ──▶ downstream
//!   actor 2 ──▶ ┘   a barrier blocks its input until every input sent it; then it leaves once
//! ```
//!
//! States, per input: *open* (polled), *blocked* on a barrier (not polled until the barrier
//! is aligned), *ended*. The merge itself:
//!
//! ```text
//!            every input blocked on barrier b: emit b (the dispatcher's original)
//!  Merging ─────────────────────────────────────────────▶ Merging
//!     │  b carries Rescale                                    ▲
//!     └──────────────▶ AwaitingActors ── new inputs ──────────┘
//!     │  b carries Stop, or every input ended
//!     └──────────────▶ Ended
//! ```
//!
//! Invariants:
//! - a barrier leaves only when every actor has sent it, so everything an actor emitted in
//!   an epoch precedes that epoch's barrier downstream (the sink commits whole epochs);
//! - the barrier that leaves is the one the dispatcher received (`originals`): actors may
//!   have been given per-actor variants (a split rate limit, a synthetic first barrier);
//! - after a `Rescale` barrier nothing is read until the runtime hands over the new actors'
//!   outputs, which it does once the store committed that barrier's epoch;
//! - an actor that fails ends the merge with its error; an actor that ends while others
//!   have not is an error (it can only end after `Stop`, `Rescale` or its upstream's end).
//!
//! # Cancel safety
//! [`AlignedMerge`] is a `Stream`; `StreamExt::next` is cancel safe (state lives in the
//! struct, not in the future).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::channel::mpsc;
use futures::{Stream, StreamExt};

use crate::chunk::{Barrier, Message, Mutation};
use crate::error::{Error, Result, internal};

/// One actor's output channel.
pub(crate) type ActorOutput = mpsc::Receiver<Result<Message>>;

/// What the runtime tells the merge.
pub(crate) enum MergeControl {
    /// The actors after a rescale (their outputs, in actor order).
    Actors(Vec<ActorOutput>),
    /// The runtime failed (while dispatching or starting actors).
    Failed(Error),
}

/// Barriers as the dispatcher received them, in order, not yet emitted by the merge.
pub(crate) type Originals = Arc<Mutex<VecDeque<Barrier>>>;

struct Input {
    rx: ActorOutput,
    barrier: Option<Barrier>,
    ended: bool,
}

impl Input {
    fn new(rx: ActorOutput) -> Self {
        Self {
            rx,
            barrier: None,
            ended: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Merging,
    AwaitingActors,
    Ended,
}

/// The merged output of the actors (see the module docs).
pub(crate) struct AlignedMerge {
    inputs: Vec<Input>,
    control: mpsc::Receiver<MergeControl>,
    originals: Originals,
    /// Where the next round robin starts.
    next: usize,
    state: State,
}

impl AlignedMerge {
    pub(crate) fn new(
        inputs: Vec<ActorOutput>,
        control: mpsc::Receiver<MergeControl>,
        originals: Originals,
    ) -> Self {
        Self {
            inputs: inputs.into_iter().map(Input::new).collect(),
            control,
            originals,
            next: 0,
            state: State::Merging,
        }
    }

    fn fail(&mut self, e: Error) -> Poll<Option<Result<Message>>> {
        self.state = State::Ended;
        Poll::Ready(Some(Err(e)))
    }

    /// Every open input is blocked on a barrier: emits it.
    fn emit_aligned(&mut self) -> Poll<Option<Result<Message>>> {
        let mut epoch = None;
        for (i, input) in self.inputs.iter_mut().enumerate() {
            let Some(barrier) = input.barrier.take() else {
                return self.fail(internal!("actor {i} has no aligned barrier"));
            };
            match epoch {
                None => epoch = Some(barrier.epoch),
                Some(e) if e != barrier.epoch => {
                    return self.fail(internal!(
                        "actor {i} sent barrier {:?} where the others sent {e:?}",
                        barrier.epoch
                    ));
                }
                Some(_) => {}
            }
        }
        let Some(epoch) = epoch else {
            return self.fail(internal!("a barrier aligned over no actor"));
        };
        let original = {
            let popped: Option<Option<Barrier>> =
                self.originals.lock().ok().map(|mut o| o.pop_front());
            match popped {
                Some(original) => original,
                None => return self.fail(internal!("the barrier log is poisoned")),
            }
        };
        let barrier = match original {
            Some(b) if b.epoch == epoch => b,
            other => {
                return self.fail(internal!(
                    "the actors sent barrier {epoch:?}, the dispatcher {:?}",
                    other.map(|b| b.epoch)
                ));
            }
        };
        match barrier.mutation {
            Some(Mutation::Rescale { .. }) => self.state = State::AwaitingActors,
            Some(Mutation::Stop) => self.state = State::Ended,
            _ => {}
        }
        Poll::Ready(Some(Ok(Message::Barrier(barrier))))
    }

    fn poll_merging(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Message>>> {
        let n = self.inputs.len();
        for step in 0..n {
            let i = (self.next + step) % n;
            let input = &mut self.inputs[i];
            if input.barrier.is_some() || input.ended {
                continue;
            }
            match input.rx.poll_next_unpin(cx) {
                Poll::Pending => {}
                Poll::Ready(None) => input.ended = true,
                Poll::Ready(Some(Err(e))) => return self.fail(e),
                Poll::Ready(Some(Ok(Message::Barrier(barrier)))) => input.barrier = Some(barrier),
                Poll::Ready(Some(Ok(message))) => {
                    self.next = (i + 1) % n;
                    return Poll::Ready(Some(Ok(message)));
                }
            }
        }
        let ended = self.inputs.iter().filter(|i| i.ended).count();
        let blocked = self.inputs.iter().filter(|i| i.barrier.is_some()).count();
        if ended == n {
            self.state = State::Ended;
            return Poll::Ready(None);
        }
        if ended > 0 && ended + blocked == n {
            let which = self.inputs.iter().position(|i| i.ended).unwrap_or(0);
            return self.fail(Error::Protocol(format!(
                "backfill actor {which} ended while the others wait at a barrier"
            )));
        }
        if blocked == n {
            return self.emit_aligned();
        }
        Poll::Pending
    }
}

impl Stream for AlignedMerge {
    type Item = Result<Message>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.state == State::Ended {
                return Poll::Ready(None);
            }
            match this.control.poll_next_unpin(cx) {
                Poll::Ready(Some(MergeControl::Failed(e))) => return this.fail(e),
                Poll::Ready(Some(MergeControl::Actors(outputs))) => {
                    if this.state != State::AwaitingActors {
                        return this.fail(internal!("new actors without a rescale barrier"));
                    }
                    this.inputs = outputs.into_iter().map(Input::new).collect();
                    this.next = 0;
                    this.state = State::Merging;
                    continue;
                }
                Poll::Ready(None) if this.state == State::AwaitingActors => {
                    return this.fail(internal!("the runtime stopped during a rescale"));
                }
                Poll::Ready(None) | Poll::Pending => {}
            }
            return match this.state {
                State::AwaitingActors => Poll::Pending,
                State::Merging => this.poll_merging(cx),
                State::Ended => Poll::Ready(None),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use arrow_schema::{DataType, Field, Schema};
    use futures::{FutureExt, SinkExt};

    use super::*;
    use crate::chunk::{BarrierKind, EpochPair, StreamChunk};

    fn chunk(k: i64) -> Message {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        Message::Chunk(StreamChunk::from_text(&schema, &format!("+ {k}")).unwrap())
    }

    fn barrier(curr: u64) -> Barrier {
        Barrier::new(EpochPair::new(curr, curr - 1), BarrierKind::Checkpoint)
    }

    fn setup(
        n: usize,
    ) -> (
        Vec<mpsc::Sender<Result<Message>>>,
        mpsc::Sender<MergeControl>,
        Originals,
        AlignedMerge,
    ) {
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| mpsc::channel(4)).unzip();
        let (ctl_tx, ctl_rx) = mpsc::channel(1);
        let originals = Originals::default();
        let merge = AlignedMerge::new(rxs, ctl_rx, originals.clone());
        (txs, ctl_tx, originals, merge)
    }

    fn is_chunk(m: &Option<Option<Result<Message>>>) -> bool {
        matches!(m, Some(Some(Ok(Message::Chunk(_)))))
    }

    #[test]
    fn a_barrier_leaves_only_when_every_actor_sent_it_and_chunks_flow_meanwhile() {
        let (mut txs, _ctl, originals, mut merge) = setup(2);
        originals.lock().unwrap().push_back(barrier(2));
        txs[0].try_send(Ok(Message::Barrier(barrier(2)))).unwrap();
        txs[0].try_send(Ok(chunk(9))).unwrap(); // next epoch, held behind the barrier
        assert!(merge.next().now_or_never().is_none());
        txs[1].try_send(Ok(chunk(1))).unwrap();
        assert!(is_chunk(&merge.next().now_or_never()));
        assert!(merge.next().now_or_never().is_none());
        txs[1].try_send(Ok(Message::Barrier(barrier(2)))).unwrap();
        match merge.next().now_or_never() {
            Some(Some(Ok(Message::Barrier(b)))) => assert_eq!(b.epoch, barrier(2).epoch),
            _ => panic!("the aligned barrier"),
        }
        assert!(is_chunk(&merge.next().now_or_never()));
    }

    #[test]
    fn the_dispatchers_barrier_leaves_not_an_actors_variant() {
        let (mut txs, _ctl, originals, mut merge) = setup(2);
        let original = barrier(2).with_mutation(Mutation::Throttle {
            rows_per_second: Some(10),
        });
        originals.lock().unwrap().push_back(original.clone());
        for (i, tx) in txs.iter_mut().enumerate() {
            let share = barrier(2).with_mutation(Mutation::Throttle {
                rows_per_second: Some(5 + i as u64),
            });
            tx.try_send(Ok(Message::Barrier(share))).unwrap();
        }
        match merge.next().now_or_never() {
            Some(Some(Ok(Message::Barrier(b)))) => assert_eq!(b, original),
            _ => panic!("the aligned barrier"),
        }
    }

    #[test]
    fn mismatched_epochs_and_early_ends_are_errors() {
        let (mut txs, _ctl, originals, mut merge) = setup(2);
        originals.lock().unwrap().push_back(barrier(2));
        txs[0].try_send(Ok(Message::Barrier(barrier(2)))).unwrap();
        txs[1].try_send(Ok(Message::Barrier(barrier(3)))).unwrap();
        assert!(matches!(merge.next().now_or_never(), Some(Some(Err(_)))));
        assert!(matches!(merge.next().now_or_never(), Some(None)));

        let (mut txs, _ctl, _originals, mut merge) = setup(2);
        txs[0].try_send(Ok(Message::Barrier(barrier(2)))).unwrap();
        txs.pop();
        assert!(matches!(merge.next().now_or_never(), Some(Some(Err(_)))));
    }

    #[test]
    fn after_a_rescale_the_merge_waits_for_the_new_actors() {
        let (mut txs, mut ctl, originals, mut merge) = setup(2);
        let count = crate::vnode::VnodeCount::new(4).unwrap();
        let rescale = barrier(2).with_mutation(Mutation::Rescale {
            actors: vec![crate::vnode::VnodeBitmap::full(count)],
        });
        originals.lock().unwrap().push_back(rescale.clone());
        for tx in &mut txs {
            tx.try_send(Ok(Message::Barrier(rescale.clone()))).unwrap();
        }
        assert!(matches!(
            merge.next().now_or_never(),
            Some(Some(Ok(Message::Barrier(_))))
        ));
        drop(txs);
        assert!(merge.next().now_or_never().is_none());
        let (mut tx, rx) = mpsc::channel(4);
        ctl.try_send(MergeControl::Actors(vec![rx])).unwrap();
        tx.try_send(Ok(chunk(1))).unwrap();
        assert!(is_chunk(&merge.next().now_or_never()));
    }

    /// A never-ready actor is a deadlock the timeout turns into a failure, not a hang.
    #[tokio::test]
    async fn a_silent_actor_stalls_its_barrier_and_a_timeout_reports_it() {
        let (mut txs, _ctl, originals, mut merge) = setup(2);
        originals.lock().unwrap().push_back(barrier(2));
        txs[0].send(Ok(Message::Barrier(barrier(2)))).await.unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(50), merge.next()).await;
        assert!(waited.is_err(), "the barrier must wait for actor 1");
    }
}

//! A backfill actor: one [`BackfillExecutor`] over its own vnodes, as its own tokio task.
//!
//! ```text
//!   dispatcher ──bounded──▶ executor (arrangement backfill over the actor's vnodes) ──bounded──▶ merge
//!                                      │ after every message
//!                                      └──▶ stats board (job progress)
//! ```
//!
//! The task pulls the executor's output and sends it on, so a slow merge (or sink) holds the
//! executor back: the channel is bounded and the executor reads its snapshot only when
//! polled. The task ends when the executor's output ends (after `Stop` or the upstream's
//! end), after an error (which it sends on first), or right after it forwarded a barrier
//! carrying `Rescale`: the executor persisted and sealed its progress at that barrier, and
//! the runtime starts the next actors from the committed progress.
//!
//! An actor started by a rescale is given a first barrier made by the runtime (the rescale
//! barrier again, without its mutation): its executor restores progress as of that barrier's
//! `prev` (the committed rescale epoch) and forwards it; the task drops that barrier, which
//! already left the job.

use std::sync::Arc;

use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use tokio::task::JoinHandle;

use crate::backfill::{BackfillConfig, BackfillExecutor};
use crate::chunk::{Message, Mutation};
use crate::error::Result;
use crate::job::aligned_merge::ActorOutput;
use crate::job::progress::StatsBoard;
use crate::store::StateStore;
use crate::vnode::VnodeBitmap;

/// Messages in flight into and out of each actor.
pub(crate) const ACTOR_CHANNEL_CAPACITY: usize = 16;

/// What every actor of a job is made from.
#[derive(Clone)]
pub(crate) struct ActorRecipe<S: StateStore> {
    pub(crate) store: S,
    pub(crate) table: String,
    pub(crate) config: BackfillConfig,
    pub(crate) board: Arc<StatsBoard>,
}

/// A started actor: where its input goes, where its output comes from, its task.
pub(crate) struct Actor {
    pub(crate) input: mpsc::Sender<Result<Message>>,
    pub(crate) output: ActorOutput,
    pub(crate) task: JoinHandle<()>,
}

impl<S: StateStore> ActorRecipe<S> {
    /// Starts actor `index` of `generation` over `vnodes` with this snapshot rate limit.
    /// `resumed`: its first output barrier is the runtime's, and is dropped.
    pub(crate) fn spawn(
        &self,
        generation: u64,
        index: usize,
        vnodes: VnodeBitmap,
        rate_limit: Option<u64>,
        resumed: bool,
    ) -> Result<Actor> {
        let owned = vnodes.len();
        let config = BackfillConfig {
            rate_limit,
            ..self.config.clone()
        };
        let executor = BackfillExecutor::arrangement(&self.store, &self.table, vnodes, config)?;
        let stats = executor.stats();
        let (input, input_rx) = mpsc::channel(ACTOR_CHANNEL_CAPACITY);
        let (mut output_tx, output) = mpsc::channel(ACTOR_CHANNEL_CAPACITY);
        let board = self.board.clone();
        let task = tokio::spawn(async move {
            let mut out = executor.execute(input_rx);
            let mut skip_first = resumed;
            while let Some(item) = out.next().await {
                let (is_err, rescale) = match &item {
                    Err(_) => (true, false),
                    Ok(Message::Barrier(b)) => {
                        (false, matches!(b.mutation, Some(Mutation::Rescale { .. })))
                    }
                    Ok(_) => (false, false),
                };
                let report = board.update(generation, index, owned, stats.borrow().clone());
                if let Err(e) = report {
                    let _ = output_tx.send(Err(e)).await;
                    return;
                }
                if skip_first && matches!(item, Ok(Message::Barrier(_))) {
                    skip_first = false;
                    continue;
                }
                if output_tx.send(item).await.is_err() || is_err || rescale {
                    return;
                }
            }
        });
        Ok(Actor {
            input,
            output,
            task,
        })
    }
}

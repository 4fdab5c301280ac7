//! The barrier injector: epochs and checkpoint marking.
//!
//! Epochs are consecutive integers starting after the committed epoch. The first barrier
//! closes the committed epoch itself (the backfill restores its progress as of it); every
//! `checkpoint_every`-th barrier after it is a checkpoint, and so is a barrier carrying
//! [`Mutation::Stop`], so that a job always ends on a durable state.

use tokio::sync::watch;

use crate::chunk::{Barrier, BarrierKind, EpochPair, Mutation};
use crate::error::{Error, Result, internal};

/// Hands out barriers with increasing epochs.
#[derive(Debug, Clone)]
pub struct BarrierInjector {
    curr: u64,
    injected: u64,
    checkpoint_every: u64,
}

impl BarrierInjector {
    /// Barriers after `committed_epoch`, a checkpoint every `checkpoint_every` (at least 1).
    pub fn new(committed_epoch: u64, checkpoint_every: u64) -> Result<Self> {
        if checkpoint_every == 0 {
            return Err(Error::InvalidConfig(
                "checkpoint-every must be at least 1".into(),
            ));
        }
        Ok(Self {
            curr: committed_epoch,
            injected: 0,
            checkpoint_every,
        })
    }

    /// The epoch open now (the last barrier's `curr`).
    #[cfg(test)]
    pub fn current_epoch(&self) -> u64 {
        self.curr
    }

    /// The next barrier. The first is a normal barrier closing the committed epoch; later
    /// ones are checkpoints every `checkpoint_every`, and always when they carry `Stop`.
    pub fn next(&mut self, mutation: Option<Mutation>) -> Barrier {
        self.next_with(mutation, false)
    }

    /// [`BarrierInjector::next`], a checkpoint also when `checkpoint` (except the first
    /// barrier, which closes the committed epoch).
    pub fn next_with(&mut self, mutation: Option<Mutation>, checkpoint: bool) -> Barrier {
        let epoch = EpochPair::new(self.curr + 1, self.curr);
        let checkpoint = self.injected > 0
            && (checkpoint
                || self.injected.is_multiple_of(self.checkpoint_every)
                || mutation == Some(Mutation::Stop));
        self.curr += 1;
        self.injected += 1;
        let kind = if checkpoint {
            BarrierKind::Checkpoint
        } else {
            BarrierKind::Normal
        };
        let barrier = Barrier::new(epoch, kind);
        match mutation {
            Some(m) => barrier.with_mutation(m),
            None => barrier,
        }
    }
}

/// Bounds the barriers in flight: sent by a source and not yet collected (committed, for a
/// checkpoint) by the job's consumer. A barrier interval shorter than a checkpoint's cost
/// then spaces barriers by that cost instead of queueing them, and the actors read the
/// snapshot between barriers instead of one batch per barrier with a commit each.
#[derive(Debug)]
pub struct InFlight {
    sent: u64,
    limit: u64,
    collected: watch::Receiver<u64>,
}

impl InFlight {
    /// At most `limit` (at least 1) barriers in flight; the consumer adds one to the
    /// returned counter for each barrier it collects.
    pub fn new(limit: u64) -> (Self, watch::Sender<u64>) {
        let (tx, collected) = watch::channel(0);
        let limit = limit.max(1);
        (
            Self {
                sent: 0,
                limit,
                collected,
            },
            tx,
        )
    }

    /// Waits until one more barrier may be sent, and counts it as sent.
    pub async fn acquire(&mut self) -> Result<()> {
        let (sent, limit) = (self.sent, self.limit);
        self.collected
            .wait_for(|&collected| sent.saturating_sub(collected) < limit)
            .await
            .map_err(|_| internal!("the job stopped collecting barriers"))?;
        self.sent += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_follow_the_committed_one_and_checkpoints_come_every_k() {
        let mut b = BarrierInjector::new(7, 3).unwrap();
        let barriers: Vec<Barrier> = (0..7).map(|_| b.next(None)).collect();
        assert_eq!(barriers[0].epoch, EpochPair::new(8, 7));
        assert_eq!(barriers[6].epoch, EpochPair::new(14, 13));
        let checkpoints: Vec<bool> = barriers.iter().map(Barrier::is_checkpoint).collect();
        assert_eq!(checkpoints, [false, false, false, true, false, false, true]);
        assert_eq!(b.current_epoch(), 14);
    }

    #[test]
    fn stop_is_always_a_checkpoint() {
        let mut b = BarrierInjector::new(1, 100).unwrap();
        b.next(None);
        let stop = b.next(Some(Mutation::Stop));
        assert!(stop.is_checkpoint());
        assert_eq!(stop.mutation, Some(Mutation::Stop));
    }

    #[test]
    fn checkpoint_every_zero_is_rejected() {
        assert!(BarrierInjector::new(1, 0).is_err());
    }

    #[tokio::test]
    async fn a_barrier_waits_while_the_limit_is_in_flight() {
        let (mut in_flight, collected) = InFlight::new(2);
        in_flight.acquire().await.unwrap();
        in_flight.acquire().await.unwrap();
        let third =
            tokio::time::timeout(std::time::Duration::from_millis(20), in_flight.acquire()).await;
        assert!(
            third.is_err(),
            "a third barrier went out with two in flight"
        );
        collected.send_modify(|n| *n += 1);
        tokio::time::timeout(std::time::Duration::from_secs(5), in_flight.acquire())
            .await
            .expect("a collected barrier frees a place")
            .unwrap();
        drop(collected);
        assert!(in_flight.acquire().await.is_err(), "the consumer is gone");
    }
}

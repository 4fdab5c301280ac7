//! The barrier injector: epochs and checkpoint marking.
//!
//! Epochs are consecutive integers starting after the committed epoch. The first barrier
//! closes the committed epoch itself (the backfill restores its progress as of it); every
//! `checkpoint_every`-th barrier after it is a checkpoint, and so is a barrier carrying
//! [`Mutation::Stop`], so that a job always ends on a durable state.

use crate::chunk::{Barrier, BarrierKind, EpochPair, Mutation};
use crate::error::{Error, Result};

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
        let epoch = EpochPair::new(self.curr + 1, self.curr);
        let checkpoint = self.injected > 0
            && (self.injected.is_multiple_of(self.checkpoint_every)
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
}

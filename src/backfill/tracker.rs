//! How a backfill tracks its snapshot progress: the [`Tracker`] interface the core drives,
//! and [`ArrangementTracker`], per-vnode progress (the arrangement backfill). The no-shuffle
//! baseline's tracker, one global position, is in `no_shuffle.rs`.

use std::sync::Arc;

use crate::backfill::filter::UpstreamFilter;
use crate::backfill::progress::{ProgressCodec, ProgressMap, SlowVnode, VnodeStateCounts};
use crate::chunk::StreamChunk;
use crate::error::Result;
use crate::key::Position;
use crate::merge::MergeOutput;
use crate::table::TableDesc;
use crate::vnode::{VirtualNode, VnodeBitmap};

/// How a backfill tracks and persists its progress.
pub trait Tracker: Send + 'static {
    /// The upstream table whose snapshot is tracked.
    fn table(&self) -> &Arc<TableDesc>;
    /// The vnodes to scan and the position to scan each after.
    fn scan_plan(&self) -> Vec<(VirtualNode, Option<Position>)>;
    /// The part of [`Tracker::scan_plan`] for `vnodes` (those still to scan, with their
    /// positions); its cost is proportional to `vnodes`, not to the vnodes owned.
    fn scan_plan_for(&self, vnodes: &VnodeBitmap) -> Vec<(VirtualNode, Option<Position>)>;
    /// Snapshot rows were emitted: advance positions, complete exhausted vnodes.
    fn on_snapshot(&mut self, out: &MergeOutput) -> Result<()>;
    /// Every vnode of this epoch's scan plan is exhausted.
    fn on_snapshot_end(&mut self) -> Result<()>;
    /// The filter for buffered upstream chunks, prepared with the current positions.
    fn upstream_filter(&self) -> Result<UpstreamFilter>;
    /// True when the whole snapshot was emitted.
    fn is_finished(&self) -> bool;
    /// The progress rows that changed since the last call, as upserts.
    fn take_changes(&mut self) -> Result<Option<StreamChunk>>;
    /// Owned vnodes per state.
    fn counts(&self) -> VnodeStateCounts;
    /// Snapshot rows emitted in all (including before a restart).
    fn snapshot_rows(&self) -> u64;
    /// True when snapshot rows must leave in global key order (the k-way merge).
    fn needs_global_order(&self) -> bool {
        false
    }
    /// The epoch now open (a barrier passed).
    fn set_epoch(&mut self, _epoch: u64) {}
    /// Up to `n` vnodes in progress the longest, slowest first (none when progress is not
    /// kept per vnode).
    fn slowest(&self, _n: usize) -> Vec<SlowVnode> {
        Vec::new()
    }
}

/// Per-vnode progress: the arrangement backfill.
#[derive(Debug, Clone)]
pub struct ArrangementTracker {
    desc: Arc<TableDesc>,
    progress: ProgressMap,
    codec: ProgressCodec,
}

impl ArrangementTracker {
    /// Tracks `progress` (restored or new) of the upstream table `desc`.
    pub fn new(desc: Arc<TableDesc>, progress: ProgressMap, codec: ProgressCodec) -> Self {
        Self {
            desc,
            progress,
            codec,
        }
    }

    /// The per-vnode progress.
    pub fn progress(&self) -> &ProgressMap {
        &self.progress
    }
}

impl Tracker for ArrangementTracker {
    fn table(&self) -> &Arc<TableDesc> {
        &self.desc
    }

    fn scan_plan(&self) -> Vec<(VirtualNode, Option<Position>)> {
        self.progress
            .iter()
            .filter(|(_, p)| !p.is_completed())
            .map(|(v, p)| (v, p.position().cloned()))
            .collect()
    }

    fn scan_plan_for(&self, vnodes: &VnodeBitmap) -> Vec<(VirtualNode, Option<Position>)> {
        vnodes
            .iter()
            .filter_map(|v| match self.progress.get(v) {
                Some(p) if !p.is_completed() => Some((v, p.position().cloned())),
                _ => None,
            })
            .collect()
    }

    fn on_snapshot(&mut self, out: &MergeOutput) -> Result<()> {
        for advance in &out.progress {
            self.progress
                .advance(advance.vnode, advance.last.clone(), advance.rows as u64)?;
        }
        for vnode in &out.exhausted {
            self.progress.complete(*vnode)?;
        }
        Ok(())
    }

    fn on_snapshot_end(&mut self) -> Result<()> {
        let open: Vec<VirtualNode> = self
            .progress
            .iter()
            .filter(|(_, p)| !p.is_completed())
            .map(|(v, _)| v)
            .collect();
        for vnode in open {
            self.progress.complete(vnode)?;
        }
        Ok(())
    }

    fn upstream_filter(&self) -> Result<UpstreamFilter> {
        UpstreamFilter::for_progress(self.desc.clone(), &self.progress)
    }

    fn is_finished(&self) -> bool {
        self.progress.is_finished()
    }

    fn take_changes(&mut self) -> Result<Option<StreamChunk>> {
        let chunk = self.codec.encode(self.progress.changed())?;
        self.progress.mark_persisted();
        Ok(chunk)
    }

    fn counts(&self) -> VnodeStateCounts {
        self.progress.counts()
    }

    fn snapshot_rows(&self) -> u64 {
        self.progress.total_rows()
    }

    fn set_epoch(&mut self, epoch: u64) {
        self.progress.set_epoch(epoch);
    }

    fn slowest(&self, n: usize) -> Vec<SlowVnode> {
        self.progress.slowest(n)
    }
}

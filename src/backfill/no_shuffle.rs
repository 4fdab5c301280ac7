//! The no-shuffle backfill: the baseline with one global position.
//!
//! Before arrangement backfill, a backfill read the upstream table as one key-ordered stream
//! over all its vnodes and kept a single position: every upstream change at or below it is
//! emitted, everything above dropped. It is simpler, but every epoch re-reads from one
//! position across all vnodes, so it needs the global k-way merge and cannot move vnodes
//! between workers. It shares everything else with the arrangement backfill (core, filter,
//! merge, executor) and is kept for comparison in the oracle tests and benchmarks.
//!
//! Its progress is stored in the same progress table: every owned vnode's row carries the
//! global position (or the finished flag) and the global row count.

use std::sync::Arc;

use crate::backfill::executor::{BackfillConfig, BackfillExecutor};
use crate::backfill::filter::UpstreamFilter;
use crate::backfill::progress::{ProgressCodec, VnodeProgress, VnodeStateCounts};
use crate::backfill::tracker::Tracker;
use crate::chunk::StreamChunk;
use crate::error::{Error, Result, internal};
use crate::key::Position;
use crate::merge::MergeOutput;
use crate::store::{StateStore, StateTable};
use crate::table::TableDesc;
use crate::vnode::{VirtualNode, VnodeBitmap};

/// One global position over all owned vnodes.
#[derive(Debug, Clone)]
pub struct NoShuffleTracker {
    desc: Arc<TableDesc>,
    owned: VnodeBitmap,
    codec: ProgressCodec,
    pos: Option<Position>,
    rows: u64,
    finished: bool,
    dirty: bool,
}

impl NoShuffleTracker {
    /// Restores the global progress from the progress table at `epoch`.
    pub fn restore(
        desc: Arc<TableDesc>,
        codec: ProgressCodec,
        table: &impl StateTable,
        owned: VnodeBitmap,
        epoch: u64,
    ) -> Result<Self> {
        let map = codec.restore(table, owned.clone(), epoch)?;
        let corrupt = |message: &str| Error::CorruptState {
            context: format!("no-shuffle progress in `{}`", codec.desc().name()),
            message: message.to_string(),
        };
        let mut states = map.iter().map(|(_, p)| p);
        let (pos, rows, finished) = match states.next() {
            None | Some(VnodeProgress::NotStarted) => (None, 0, owned.is_empty()),
            Some(VnodeProgress::InProgress { pos, rows }) => (Some(pos.clone()), *rows, false),
            Some(VnodeProgress::Completed { rows }) => (None, *rows, true),
        };
        let first = map.iter().next().map(|(_, p)| p.clone());
        if map.iter().any(|(_, p)| Some(p) != first.as_ref()) {
            return Err(corrupt("vnodes disagree on the global position"));
        }
        Ok(Self {
            desc,
            owned,
            codec,
            pos,
            rows,
            finished,
            dirty: false,
        })
    }

    fn state(&self) -> VnodeProgress {
        match (&self.pos, self.finished) {
            (_, true) => VnodeProgress::Completed { rows: self.rows },
            (Some(pos), false) => VnodeProgress::InProgress {
                pos: pos.clone(),
                rows: self.rows,
            },
            (None, false) => VnodeProgress::NotStarted,
        }
    }
}

impl Tracker for NoShuffleTracker {
    fn table(&self) -> &Arc<TableDesc> {
        &self.desc
    }

    fn scan_plan(&self) -> Vec<(VirtualNode, Option<Position>)> {
        if self.finished {
            return Vec::new();
        }
        self.owned.iter().map(|v| (v, self.pos.clone())).collect()
    }

    fn scan_plan_for(&self, vnodes: &VnodeBitmap) -> Vec<(VirtualNode, Option<Position>)> {
        if self.finished {
            return Vec::new();
        }
        vnodes
            .iter()
            .filter(|v| self.owned.contains(*v))
            .map(|v| (v, self.pos.clone()))
            .collect()
    }

    fn needs_global_order(&self) -> bool {
        true
    }

    fn on_snapshot(&mut self, out: &MergeOutput) -> Result<()> {
        if let Some(last) = out.batch.last_position() {
            if self.pos.as_ref().is_some_and(|pos| last <= *pos) {
                return Err(internal!("no-shuffle position would move backwards"));
            }
            self.pos = Some(last);
            self.rows += out.batch.num_rows() as u64;
            self.dirty = true;
        }
        Ok(())
    }

    fn on_snapshot_end(&mut self) -> Result<()> {
        self.finished = true;
        self.dirty = true;
        Ok(())
    }

    fn upstream_filter(&self) -> Result<UpstreamFilter> {
        UpstreamFilter::global(
            self.desc.clone(),
            &self.owned,
            self.pos.as_ref(),
            self.finished,
        )
    }

    fn is_finished(&self) -> bool {
        self.finished
    }

    fn take_changes(&mut self) -> Result<Option<StreamChunk>> {
        if !self.dirty {
            return Ok(None);
        }
        self.dirty = false;
        let state = self.state();
        if state == VnodeProgress::NotStarted {
            return Ok(None);
        }
        self.codec.encode(self.owned.iter().map(|v| (v, &state)))
    }

    fn counts(&self) -> VnodeStateCounts {
        let n = self.owned.len();
        match self.state() {
            VnodeProgress::NotStarted => VnodeStateCounts {
                not_started: n,
                ..VnodeStateCounts::default()
            },
            VnodeProgress::InProgress { .. } => VnodeStateCounts {
                in_progress: n,
                ..VnodeStateCounts::default()
            },
            VnodeProgress::Completed { .. } => VnodeStateCounts {
                completed: n,
                ..VnodeStateCounts::default()
            },
        }
    }

    fn snapshot_rows(&self) -> u64 {
        self.rows
    }
}

impl<S: StateStore> BackfillExecutor<S, NoShuffleTracker> {
    /// The no-shuffle baseline backfill of `upstream` over `vnodes` (always merged order).
    pub fn no_shuffle(
        store: &S,
        upstream: &str,
        vnodes: VnodeBitmap,
        config: BackfillConfig,
    ) -> Result<Self> {
        Self::open(store, upstream, vnodes, config, |desc, codec| {
            Box::new(move |table: &S::Table, owned: VnodeBitmap, epoch: u64| {
                NoShuffleTracker::restore(desc, codec, table, owned, epoch)
            })
        })
    }
}

//! A bulk load's step ([`StateTable::commit_load_step`](crate::store::StateTable)): the rows a
//! handle wrote since its last step, committed without an epoch, so that a crash during a
//! long load loses only what was written since.
//!
//! ```text
//!  handle: pending ──write_runs──▶ run file ─┐
//!          spilled pieces ───────────────────┴─▶ per vnode, its runs, oldest first
//!  store:  per vnode: the runs follow the base (no tombstone, first key above the base's
//!          last, no delta on the vnode, the chain rule of `VnodeLayer::ordered`)?
//!            yes ─▶ AppendBase edit: the base grows (no rewrite, ever)
//!            no  ─▶ Append edit: deltas of the next epoch (compacted as any delta)
//!          one log record (committed epoch unchanged, staged job values, new files),
//!          fsynced: the step's commit point; then installed in memory
//! ```
//!
//! The table is not live yet (nothing reads or writes it before the load's final commit),
//! so growing a base in place is safe: no reader holds a view of it, and no compaction of
//! the vnode is under way (a vnode with deltas only ever gains deltas from a step). A crash
//! before the record's fsync leaves the state before the step (its file, named by no
//! record, is removed on open); after it, the state with the step.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use hashbrown::HashMap;

use super::file::{DiskRun, MIN_BLOCK_ROWS, RunFile};
use super::record::{EditKind, FileEntry, LogRecord, TableEdit, VnodeEdit};
use super::table::Ordered;
use super::version::{VnodeRuns, run_entry};
use super::{Compaction, DurableStore, compaction};
use crate::error::{Error, Result};
use crate::runs::RunList;
use crate::table::TableDesc;
use crate::vnode::VirtualNode;

/// The last key of the last run of `base`, if any.
fn base_last_key(base: &[DiskRun]) -> Option<Vec<u8>> {
    let last = base.last()?;
    last.len()
        .checked_sub(1)
        .and_then(|i| last.last_key(i).map(<[u8]>::to_vec))
}

/// Whether a step's `runs` of a vnode (ordered as `order` says) extend its committed `runs`'
/// base: no delta on the vnode, the step's rows after the base's, and the whole chain within
/// the rule of [`super::version::VnodeLayer::ordered`] (at most `chain` runs, or none short).
fn extends_base(
    current: &VnodeRuns,
    order: Option<&Option<Ordered>>,
    runs: &[DiskRun],
    chain: usize,
) -> bool {
    let Some(Some(order)) = order else {
        return false;
    };
    if !current.deltas.is_empty() {
        return false;
    }
    if base_last_key(&current.base).is_some_and(|last| last.as_slice() >= order.first.as_slice()) {
        return false;
    }
    let short =
        order.short || (current.base.iter()).any(|run| run.span.rows < MIN_BLOCK_ROWS as u64);
    current.base.len() + runs.len() <= chain.max(1) || !short
}

impl DurableStore {
    /// Commits a load step of table `desc`: `runs` (written, fsynced, oldest first) as each
    /// vnode's base or deltas (see the module docs), with the staged job values.
    pub(super) fn commit_load_step(
        &self,
        desc: &TableDesc,
        runs: Vec<(VirtualNode, DiskRun)>,
        order: &HashMap<VirtualNode, Option<Ordered>>,
    ) -> Result<()> {
        let shared = &self.shared;
        let name = desc.name();
        let manifest_guard = shared.lock_manifest()?;
        let mut per_vnode: BTreeMap<VirtualNode, Vec<DiskRun>> = BTreeMap::new();
        for (vnode, run) in runs {
            per_vnode.entry(vnode).or_default().push(run);
        }
        // What each vnode gains: its runs, and whether they extend its base.
        let (record, keep, gains) = {
            let state = self.read()?;
            state.check_ok()?;
            let table = state.table(name)?;
            if let Some(epoch) = table.sealed.keys().next() {
                return Err(Error::InvalidConfig(format!(
                    "a load step of table `{name}`, which has epoch {epoch} sealed and not \
                     committed: a load step is for a table nothing else writes"
                )));
            }
            let delta_epoch = state.committed.map_or(1, |c| c + 1);
            let chain = shared.options.max_deltas;
            let mut added = Vec::new();
            let mut keep: Vec<Arc<RunFile>> = Vec::new();
            let mut edits = Vec::with_capacity(per_vnode.len());
            let mut gains = Vec::with_capacity(per_vnode.len());
            for (vnode, runs) in per_vnode {
                for run in &runs {
                    let id = run.file.id();
                    if !state.files.contains(id) && !keep.iter().any(|f| f.id() == id) {
                        added.push(FileEntry::new(id, run.file.check()));
                        keep.push(run.file.clone());
                    }
                }
                let current = table.vnodes.get(vnode.index()).ok_or_else(|| {
                    crate::error::internal!("vnode {vnode} out of range of `{name}`")
                })?;
                let as_base = extends_base(current, order.get(&vnode), &runs, chain);
                let (kind, epoch) = match as_base {
                    true => (EditKind::AppendBase, 0),
                    false => (EditKind::Append, delta_epoch),
                };
                edits.push(VnodeEdit {
                    vnode: vnode.get(),
                    kind,
                    runs: runs.iter().map(|run| run_entry(run, epoch)).collect(),
                });
                gains.push((vnode, runs, as_base));
            }
            let record = LogRecord {
                committed_epoch: state.committed,
                next_file_id: shared.next_file_id.load(Ordering::SeqCst),
                meta: (state.staged_meta.iter())
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                added,
                removed: Vec::new(),
                tables: if edits.is_empty() {
                    Vec::new()
                } else {
                    vec![TableEdit {
                        table: name.to_string(),
                        vnodes: edits,
                    }]
                },
            };
            (record, keep, gains)
        };
        shared.persist(&record, &keep)?;
        let deltas = {
            let mut state = self.write()?;
            let state = &mut *state;
            let mut deltas = false;
            if let Some(t) = state.tables.get_mut(name) {
                for (vnode, runs, as_base) in gains {
                    let slot = &mut t.vnodes[vnode.index()];
                    for run in &runs {
                        state.files.add(run);
                    }
                    if as_base {
                        slot.base.extend(runs);
                    } else {
                        let epoch = state.committed.map_or(1, |c| c + 1);
                        slot.deltas.extend(runs.into_iter().map(|run| (epoch, run)));
                        t.dirty.insert(vnode.get());
                        deltas = true;
                    }
                }
            }
            state.meta.extend(record.meta);
            state.staged_meta.clear();
            deltas
        };
        drop(manifest_guard);
        if deltas {
            match shared.options.compaction {
                Compaction::Background => self.wake_compactor(),
                Compaction::Inline => compaction::compact_all(
                    shared,
                    compaction::Policy::of(&shared.options),
                    &std::sync::atomic::AtomicBool::new(false),
                )?,
                Compaction::Manual => {}
            }
        }
        Ok(())
    }
}

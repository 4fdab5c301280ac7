//! One named test per pitfall listed in docs/DESIGN.md section 7.8: bugs the systems before
//! us shipped. Each runs the real executor under the oracle harness (which checks I1-I4 at
//! every barrier) and adds the assertion specific to its pitfall.

mod common;

use arrangement_backfill::backfill::SnapshotOrder;
use arrangement_backfill::backfill::VnodeProgress;
use arrangement_backfill::chunk::{Mutation, StreamChunk};
use arrangement_backfill::store::{MemoryStore, StateStore, StateTable};
use arrangement_backfill::vnode::{self, VnodeBitmap};
use arrow_array::ArrayRef;
use common::{Harness, Kind, Params, Shape, batch_of, table_desc};

fn int_params(seed: u64) -> Params {
    let mut p = Params::new(Shape::Int64, Kind::Arrangement, seed);
    p.steps = 0;
    p
}

#[test]
fn partial_snapshot_batch_at_a_barrier_still_makes_progress() {
    // A barrier right after every single poll: each epoch must keep what it emitted.
    for (vnodes, batch_size) in [(1, 7), (4, 7), (256, 1024)] {
        let mut p = int_params(11);
        p.vnodes = vnodes;
        p.batch_size = batch_size;
        p.initial_rows = 200;
        let mut h = Harness::new(p);
        let mut last = 0;
        while !h.finished() {
            h.poll();
            h.barrier();
            let rows: u64 = h
                .progress_at(h.last_closed_epoch())
                .iter()
                .map(|(_, p)| p.rows())
                .sum();
            assert!(rows > last || h.finished(), "an epoch made no progress");
            last = rows;
        }
        h.check_finish();
    }
}

#[test]
fn vnode_is_hashed_from_the_distribution_key_not_the_whole_pk() {
    let mut p = Params::new(Shape::Composite, Kind::Arrangement, 5);
    p.vnodes = 16;
    p.initial_rows = 150;
    let mut h = Harness::new(p);
    let initial: Vec<_> = h.u.clone().into_iter().collect();
    while !h.finished() {
        h.drain();
        h.send_barrier(true, None);
    }
    h.check_finish();
    // Recompute each row's vnode from `s` alone and compare per-vnode snapshot row counts.
    let batch = batch_of(Shape::Composite, &initial);
    let s_only: Vec<ArrayRef> = vec![batch.column(0).clone()];
    let mut expected = [0u64; 16];
    for row in 0..batch.num_rows() {
        let v = vnode::vnode_of_row(&s_only, row, h.desc.vnode_count()).unwrap();
        expected[v.index()] += 1;
    }
    let progress = h.progress_at(h.last_closed_epoch());
    for (v, state) in progress.iter() {
        assert_eq!(state.rows(), expected[v.index()], "vnode {v}");
    }
}

#[test]
fn completed_vnodes_are_not_read_again_after_a_restart() {
    let mut p = int_params(21);
    p.vnodes = 4;
    // About 25 rows per vnode: a batch holds one vnode's rows, not two.
    p.batch_size = 40;
    p.order = SnapshotOrder::PerVnode;
    p.initial_rows = 100;
    let mut h = Harness::new(p);
    // One unordered read completes one whole vnode.
    h.poll();
    h.push_changes(5);
    h.send_barrier(true, None);
    let progress = h.progress_at(h.last_closed_epoch());
    let completed = progress.iter().filter(|(_, p)| p.is_completed()).count();
    assert!((1..4).contains(&completed), "{completed} vnodes completed");
    h.restart();
    // The harness fails on any duplicate insert (I3) while the run finishes.
    let h = h.run();
    assert_eq!(h.restarts, 1);
}

#[test]
fn a_filtered_update_pair_never_leaves_a_lone_half() {
    let mut p = int_params(3);
    p.vnodes = 1;
    p.batch_size = 3;
    p.initial_rows = 0;
    let mut h = Harness::new(p);
    h.push_text("+ 10 1\n+ 20 2\n+ 30 3\n+ 40 4");
    h.send_barrier(true, None);
    h.poll(); // The snapshot emits 10, 20, 30: the position is 30.
    // Moves across the position both ways, and an update exactly at it.
    h.push_text("U- 20 2\nU+ 35 5\nU- 40 4\nU+ 15 6\nU- 30 3\nU+ 30 7");
    h.send_barrier(true, None);
    h.run();
}

#[test]
fn a_busy_upstream_cannot_starve_the_snapshot() {
    let mut p = int_params(8);
    p.vnodes = 4;
    p.batch_size = 1;
    p.initial_rows = 60;
    let mut h = Harness::new(p);
    // The upstream always has something ready: many epochs of changes queued up front.
    for _ in 0..80 {
        h.push_changes(4);
        h.queue_barrier(true, None);
    }
    h.drain();
    assert!(
        h.finished(),
        "the snapshot never finished under a busy upstream"
    );
    h.run();
}

#[test]
fn the_last_epochs_upstream_rows_survive_exhaustion_found_at_the_barrier() {
    let mut p = int_params(4);
    p.vnodes = 1;
    p.batch_size = 1024;
    p.initial_rows = 0;
    let mut h = Harness::new(p);
    h.push_text("+ 1 1\n+ 2 2");
    h.send_barrier(true, None);
    // No poll: the barrier's owed read finds the snapshot exhausted, and this epoch's
    // changes must still reach the downstream.
    h.push_text("+ 3 3\n- 1 1");
    h.send_barrier(true, None);
    assert!(h.finished());
    h.check_finish();
}

#[test]
fn updates_to_completed_vnodes_flow_while_no_vnode_is_in_progress() {
    let mut p = int_params(9);
    p.vnodes = 4;
    // About 20 rows per vnode: one read completes one vnode and starts no other.
    p.batch_size = 30;
    p.order = SnapshotOrder::PerVnode;
    p.initial_rows = 80;
    let mut h = Harness::new(p);
    h.poll();
    h.send_barrier(true, Some(Mutation::Pause));
    let progress = h.progress_at(h.last_closed_epoch());
    let counts = progress.counts();
    assert_eq!(counts.in_progress, 0);
    assert!(counts.completed > 0 && counts.not_started > 0, "{counts:?}");
    for _ in 0..5 {
        h.push_changes(6);
        h.send_barrier(true, None); // I1 checks that the Completed vnodes got their changes.
    }
    h.send_barrier(true, Some(Mutation::Resume));
    h.run();
}

#[test]
fn finish_is_reported_after_recovering_a_finished_backfill() {
    let mut p = int_params(12);
    p.initial_rows = 30;
    let mut h = Harness::new(p).run();
    assert!(h.finished());
    h.restart();
    assert!(h.finished(), "finish must be reported again after recovery");
    let progress = h.progress_at(h.last_closed_epoch());
    assert!(
        progress
            .iter()
            .all(|(_, p)| matches!(p, VnodeProgress::Completed { .. }))
    );
    h.run();
}

#[test]
fn replicated_buffers_are_bounded_by_checkpoints() {
    let store = MemoryStore::new();
    let desc = store.create_table(table_desc(Shape::Int64, 4)).unwrap();
    let all = VnodeBitmap::full(desc.vnode_count());
    let mut upstream = store.table("t", all.clone()).unwrap();
    let mut replicated = store.replicated_table("t", all).unwrap();
    for epoch in 1..200u64 {
        let rows = [(common::Key::Int(epoch as i64), 0)];
        let chunk = StreamChunk::inserts(batch_of(Shape::Int64, &rows));
        upstream.write(&chunk).unwrap();
        replicated.write(&chunk).unwrap();
        upstream.seal(epoch).unwrap();
        replicated.seal(epoch).unwrap();
        if epoch % 5 == 0 {
            store.commit(epoch).unwrap();
        }
        assert!(replicated.replicated_layers() <= 5, "epoch {epoch}");
    }
}

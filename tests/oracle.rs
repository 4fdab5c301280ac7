//! Oracle tests: the arrangement backfill and the no-shuffle baseline, under a seeded
//! scheduler, checked against a `BTreeMap` replay after every barrier (I1, I3, I4) and at the
//! end (I2). Every case is reproducible from the parameters printed on failure.

mod common;

use arrangement_backfill::backfill::SnapshotOrder;
use common::{Harness, Kind, Params, Shape};

/// Runs `seeds` cases for every combination of the matrix.
fn matrix(kind: Kind, seeds: u64) -> usize {
    let mut cases = 0;
    for shape in [Shape::Int64, Shape::Composite] {
        for vnodes in [1, 4, 256] {
            for batch_size in [1, 7, 1024] {
                for checkpoint_every in [1, 5] {
                    for seed in 0..seeds {
                        let mut p = Params::new(shape, kind, seed * 7919 + vnodes as u64);
                        p.vnodes = vnodes;
                        p.batch_size = batch_size;
                        p.checkpoint_every = checkpoint_every;
                        p.order = if seed % 2 == 0 {
                            SnapshotOrder::Merged
                        } else {
                            SnapshotOrder::PerVnode
                        };
                        p.initial_rows = match seed % 4 {
                            0 => 0, // an empty upstream table
                            1 => 5,
                            2 => 40,
                            _ => 120,
                        };
                        Harness::new(p).run();
                        cases += 1;
                    }
                }
            }
        }
    }
    cases
}

#[test]
fn arrangement_backfill_matches_oracle() {
    assert_eq!(matrix(Kind::Arrangement, 8), 288);
}

#[test]
fn no_shuffle_backfill_matches_oracle() {
    assert_eq!(matrix(Kind::NoShuffle, 8), 288);
}

#[test]
fn arrangement_backfill_matches_oracle_across_restarts() {
    for seed in 0..48u64 {
        let mut p = Params::new(
            if seed % 2 == 0 {
                Shape::Int64
            } else {
                Shape::Composite
            },
            Kind::Arrangement,
            1_000 + seed,
        );
        p.vnodes = [1, 4, 256][seed as usize % 3];
        p.batch_size = [1, 7, 1024][(seed / 3) as usize % 3];
        p.checkpoint_every = if seed % 4 < 2 { 1 } else { 5 };
        p.restart_prob = 0.2;
        p.steps = 120;
        p.initial_rows = 80;
        Harness::new(p).run();
    }
}

#[test]
fn no_shuffle_backfill_matches_oracle_across_restarts() {
    for seed in 0..24u64 {
        let mut p = Params::new(Shape::Int64, Kind::NoShuffle, 2_000 + seed);
        p.vnodes = [1, 4, 256][seed as usize % 3];
        p.checkpoint_every = if seed % 2 == 0 { 1 } else { 5 };
        p.restart_prob = 0.2;
        p.steps = 120;
        p.initial_rows = 80;
        Harness::new(p).run();
    }
}

//! The hash dispatcher: which backfill actor each upstream row goes to.
//!
//! ```text
//!                       vnode column (once per chunk, vectorized)
//!   chunk ──▶ vnodes_of ──▶ owner per row ──▶ one mask per actor ──▶ filter ──▶ actor 0
//!                                                                   └─ filter ──▶ actor 1 ...
//!   barrier, watermark ──▶ broadcast to every actor
//! ```
//!
//! A [`VnodeMap`] says which actor owns each vnode; the sets of all actors partition the
//! table's vnodes (checked when the map is made). [`VnodeMap::dispatch`] computes a chunk's
//! vnode column once with the table's vectorized hash, then builds one boolean mask per actor
//! and filters the chunk with it, so each actor receives only its rows, in their order.
//!
//! Invariants:
//! - every row goes to exactly one actor, the owner of its vnode;
//! - a `U-`/`U+` pair whose halves belong to the same actor stays a pair. The halves of one
//!   update share the primary key, so they share the vnode; a pair whose halves differ in
//!   distribution key (an update that moved the row) is split into a `Delete` for the old
//!   row's actor and an `Insert` for the new row's actor, as [`StreamChunk::filter`] does.
//!   Every downstream change stays valid (I3) because each actor owns both rows' vnodes'
//!   histories on its own.

use arrow_array::BooleanArray;
use arrow_buffer::BooleanBuffer;

use crate::chunk::StreamChunk;
use crate::error::{Error, Result, internal};
use crate::table::TableDesc;
use crate::vnode::{VnodeBitmap, VnodeCount};

/// Which actor owns each vnode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VnodeMap {
    /// The actor of each vnode, indexed by vnode.
    owner: Vec<u32>,
    /// Each actor's vnodes.
    actors: Vec<VnodeBitmap>,
}

impl VnodeMap {
    /// The map of these per-actor vnode sets, which must be non-empty and partition the
    /// vnodes of `count` ([`Error::InvalidConfig`] otherwise).
    pub fn new(count: VnodeCount, actors: Vec<VnodeBitmap>) -> Result<Self> {
        if actors.is_empty() {
            return Err(Error::InvalidConfig(
                "a job needs at least one actor".into(),
            ));
        }
        let mut owner = vec![u32::MAX; count.get()];
        for (i, set) in actors.iter().enumerate() {
            if set.count() != count {
                return Err(Error::InvalidConfig(format!(
                    "actor {i} owns vnodes out of {}, the table has {count}",
                    set.count()
                )));
            }
            if set.is_empty() {
                return Err(Error::InvalidConfig(format!("actor {i} owns no vnode")));
            }
            let index = u32::try_from(i).map_err(|_| internal!("more than 2^32 actors"))?;
            for v in set.iter() {
                let slot = owner
                    .get_mut(v.index())
                    .ok_or_else(|| internal!("vnode {v} beyond the count {count}"))?;
                if *slot != u32::MAX {
                    return Err(Error::InvalidConfig(format!(
                        "vnode {v} is owned by actors {} and {i}",
                        *slot
                    )));
                }
                *slot = index;
            }
        }
        if let Some(v) = owner.iter().position(|o| *o == u32::MAX) {
            return Err(Error::InvalidConfig(format!(
                "vnode {v} is owned by no actor"
            )));
        }
        Ok(Self { owner, actors })
    }

    /// `n` actors over contiguous, even vnode ranges ([`VnodeBitmap::split`]).
    pub fn even(count: VnodeCount, n: usize) -> Result<Self> {
        Self::new(count, VnodeBitmap::split(count, n)?)
    }

    /// The number of actors.
    pub fn actors(&self) -> usize {
        self.actors.len()
    }

    /// Each actor's vnodes.
    pub fn sets(&self) -> &[VnodeBitmap] {
        &self.actors
    }

    /// Splits `chunk` (rows of the table `desc`) by owner: one chunk per actor (`None` for an
    /// actor with no row of it).
    pub fn dispatch(
        &self,
        desc: &TableDesc,
        chunk: &StreamChunk,
    ) -> Result<Vec<Option<StreamChunk>>> {
        let n = self.actors.len();
        if n == 1 {
            return Ok(vec![(!chunk.is_empty()).then(|| chunk.clone())]);
        }
        let mut out = vec![None; n];
        if chunk.is_empty() {
            return Ok(out);
        }
        let vnodes = desc.vnodes_of(chunk.batch())?;
        let owners: Vec<u32> = vnodes
            .iter()
            .map(|v| {
                self.owner
                    .get(v.index())
                    .copied()
                    .ok_or_else(|| internal!("vnode {v} beyond the map's {}", self.owner.len()))
            })
            .collect::<Result<_>>()?;
        let first = owners[0];
        if owners.iter().all(|o| *o == first) {
            out[first as usize] = Some(chunk.clone());
            return Ok(out);
        }
        for (actor, slot) in out.iter_mut().enumerate() {
            let actor = actor as u32;
            let mask = BooleanBuffer::collect_bool(owners.len(), |i| owners[i] == actor);
            if mask.count_set_bits() == 0 {
                continue;
            }
            *slot = Some(chunk.filter(&BooleanArray::new(mask, None))?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::chunk::Op;
    use crate::key::KeyColumn;

    fn desc(vnodes: usize) -> TableDesc {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]));
        TableDesc::new("t", schema, vec![KeyColumn::asc("k")])
            .unwrap()
            .with_vnode_count(VnodeCount::new(vnodes).unwrap())
    }

    #[test]
    fn maps_must_partition_the_vnodes() {
        let count = VnodeCount::new(4).unwrap();
        let all = VnodeBitmap::full(count);
        assert!(VnodeMap::new(count, vec![]).is_err());
        assert!(VnodeMap::new(count, vec![all.clone(), all.clone()]).is_err());
        let mut part = all.clone();
        part.remove(crate::vnode::VirtualNode::new(3));
        assert!(VnodeMap::new(count, vec![part]).is_err());
        assert!(VnodeMap::new(count, vec![all.clone(), VnodeBitmap::empty(count)]).is_err());
        assert_eq!(VnodeMap::even(count, 3).unwrap().actors(), 3);
        assert!(VnodeMap::even(count, 5).is_err());
    }

    /// Differential: every row lands on its vnode's owner, in order, and nothing is lost
    /// or duplicated; update pairs of one key stay pairs.
    #[test]
    fn every_row_goes_to_its_owner_once() {
        let desc = desc(16);
        let text: String = (0..40)
            .map(|k| {
                if k % 5 == 0 {
                    format!("U- {k} 1\nU+ {k} 2\n")
                } else {
                    format!("+ {k} {k}\n")
                }
            })
            .collect();
        let chunk = StreamChunk::from_text(desc.schema(), &text).unwrap();
        for n in 1..=5 {
            let map = VnodeMap::even(desc.vnode_count(), n).unwrap();
            let parts = map.dispatch(&desc, &chunk).unwrap();
            assert_eq!(parts.len(), n);
            let mut rows = 0;
            for (actor, part) in parts.iter().enumerate() {
                let Some(part) = part else { continue };
                rows += part.num_rows();
                for v in desc.vnodes_of(part.batch()).unwrap() {
                    assert!(map.sets()[actor].contains(v));
                }
                let ops = part.ops();
                for (i, op) in ops.iter().enumerate() {
                    match op {
                        Op::UpdateDelete => assert_eq!(ops[i + 1], Op::UpdateInsert),
                        Op::UpdateInsert => assert_eq!(ops[i - 1], Op::UpdateDelete),
                        _ => {}
                    }
                }
            }
            assert_eq!(rows, chunk.num_rows());
        }
    }

    #[test]
    fn a_pair_across_actors_becomes_a_delete_and_an_insert() {
        let desc = desc(2);
        let map = VnodeMap::even(desc.vnode_count(), 2).unwrap();
        // Find two keys in different vnodes.
        let probe = StreamChunk::from_text(desc.schema(), "+ 1 0\n+ 2 0\n+ 3 0\n+ 4 0").unwrap();
        let vnodes = desc.vnodes_of(probe.batch()).unwrap();
        let (a, b) = (1..=4)
            .flat_map(|a| (1..=4).map(move |b| (a, b)))
            .find(|(a, b)| vnodes[*a - 1] != vnodes[*b - 1])
            .unwrap();
        let chunk = StreamChunk::from_text(desc.schema(), &format!("U- {a} 1\nU+ {b} 2")).unwrap();
        let parts = map.dispatch(&desc, &chunk).unwrap();
        let ops: Vec<Vec<Op>> = parts.iter().flatten().map(|p| p.ops().to_vec()).collect();
        assert_eq!(ops.len(), 2);
        assert!(ops.contains(&vec![Op::Delete]));
        assert!(ops.contains(&vec![Op::Insert]));
    }
}

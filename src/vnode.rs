//! TEMPORARY local stand-in, replaced by the vnode branch.
#![allow(missing_docs)]
use crate::error::{Error, Result};
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VirtualNode(u16);
impl VirtualNode {
    pub const ZERO: VirtualNode = VirtualNode(0);
    pub const fn new(v: u16) -> Self {
        Self(v)
    }
    pub const fn get(self) -> u16 {
        self.0
    }
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}
impl std::fmt::Display for VirtualNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VnodeCount(u32);
impl Default for VnodeCount {
    fn default() -> Self {
        Self::DEFAULT
    }
}
impl VnodeCount {
    pub const DEFAULT: VnodeCount = VnodeCount(256);
    pub const MAX: usize = 32768;
    pub fn new(n: usize) -> Result<Self> {
        if n == 0 || n > Self::MAX {
            return Err(Error::InvalidConfig("vnodes".into()));
        }
        Ok(Self(n as u32))
    }
    pub const fn get(self) -> usize {
        self.0 as usize
    }
    pub fn vnodes(self) -> impl Iterator<Item = VirtualNode> {
        (0..self.0).map(|v| VirtualNode(v as u16))
    }
}
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VnodeBitmap {
    count: VnodeCount,
    bits: Vec<bool>,
}
impl VnodeBitmap {
    pub fn full(count: VnodeCount) -> Self {
        Self {
            count,
            bits: vec![true; count.get()],
        }
    }
    pub fn empty(count: VnodeCount) -> Self {
        Self {
            count,
            bits: vec![false; count.get()],
        }
    }
    pub fn from_vnodes(
        count: VnodeCount,
        vnodes: impl IntoIterator<Item = VirtualNode>,
    ) -> Result<Self> {
        let mut b = Self::empty(count);
        for v in vnodes {
            b.insert(v)?;
        }
        Ok(b)
    }
    pub fn count(&self) -> VnodeCount {
        self.count
    }
    pub fn contains(&self, v: VirtualNode) -> bool {
        self.bits.get(v.index()).copied().unwrap_or(false)
    }
    pub fn insert(&mut self, v: VirtualNode) -> Result<()> {
        *self
            .bits
            .get_mut(v.index())
            .ok_or_else(|| Error::InvalidConfig("vnode".into()))? = true;
        Ok(())
    }
    pub fn remove(&mut self, v: VirtualNode) {
        if let Some(b) = self.bits.get_mut(v.index()) {
            *b = false
        }
    }
    pub fn len(&self) -> usize {
        self.bits.iter().filter(|b| **b).count()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn iter(&self) -> impl Iterator<Item = VirtualNode> + '_ {
        self.bits
            .iter()
            .enumerate()
            .filter(|(_, b)| **b)
            .map(|(i, _)| VirtualNode(i as u16))
    }
    pub fn split(count: VnodeCount, n: usize) -> Result<Vec<VnodeBitmap>> {
        let mut out = vec![Self::empty(count); n];
        for v in count.vnodes() {
            out[v.index() * n / count.get()].insert(v)?;
        }
        Ok(out)
    }
}
pub fn check_hashable(_column: &str, _data_type: &DataType) -> Result<()> {
    Ok(())
}
pub fn hash_rows(columns: &[ArrayRef], num_rows: usize) -> Result<Vec<u32>> {
    (0..num_rows).map(|r| hash_row(columns, r)).collect()
}
pub fn compute_vnodes(
    columns: &[ArrayRef],
    num_rows: usize,
    count: VnodeCount,
) -> Result<Vec<VirtualNode>> {
    (0..num_rows)
        .map(|r| vnode_of_row(columns, r, count))
        .collect()
}
pub fn vnode_of_row(columns: &[ArrayRef], row: usize, count: VnodeCount) -> Result<VirtualNode> {
    if columns.is_empty() {
        return Ok(VirtualNode::ZERO);
    }
    Ok(VirtualNode((hash_row(columns, row)? % count.0) as u16))
}
pub fn hash_row(columns: &[ArrayRef], row: usize) -> Result<u32> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::*;
    let mut h = crc32fast::Hasher::new();
    for c in columns {
        if c.is_null(row) {
            h.update(&0xFFFF_FFF0u32.to_le_bytes());
            continue;
        }
        match c.data_type() {
            DataType::Int64 => h.update(&c.as_primitive::<Int64Type>().value(row).to_le_bytes()),
            DataType::Int32 => h.update(&c.as_primitive::<Int32Type>().value(row).to_le_bytes()),
            DataType::UInt16 => h.update(&c.as_primitive::<UInt16Type>().value(row).to_le_bytes()),
            DataType::Utf8 => {
                h.update(c.as_string::<i32>().value(row).as_bytes());
                h.update(&[0xFF]);
            }
            _ => return Err(Error::Internal("stub".into())),
        }
    }
    Ok(h.finalize())
}

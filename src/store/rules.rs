//! The rules every store keeps (see [`super`]), written once for all of them: what a write,
//! a seal, a read and a commit check, what a handle owns, and how a replicated handle keeps
//! its own layers. Each store calls these with its own state; none holds a lock or does
//! I/O.

use std::collections::BTreeMap;

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::{Decimal128Type, DecimalType};
use arrow_schema::{DECIMAL64_MAX_PRECISION, DataType};
use hashbrown::HashMap;

use crate::chunk::StreamChunk;
use crate::error::{Error, Result, internal};
use crate::table::TableDesc;
use crate::vnode::{VirtualNode, VnodeBitmap};

/// The table `name` as a store's lookup found it (`table`), or the error for a table the
/// store does not hold.
pub(crate) fn known<T>(table: Option<T>, name: &str) -> Result<T> {
    table.ok_or_else(|| Error::UnknownTable(name.to_string()))
}

/// A handle on `vnodes` of the table `desc` covers the table's vnode count.
pub(crate) fn check_handle(desc: &TableDesc, vnodes: &VnodeBitmap) -> Result<()> {
    if vnodes.count() != desc.vnode_count() {
        return Err(Error::InvalidConfig(format!(
            "a handle on {} vnodes for table `{}` of {} vnodes",
            vnodes.count().get(),
            desc.name(),
            desc.vnode_count().get()
        )));
    }
    Ok(())
}

/// How errors name a handle on the table `desc`.
pub(crate) fn owner(desc: &TableDesc, replicated: bool) -> String {
    let kind = if replicated { "replicated " } else { "" };
    format!("this {kind}handle on table `{}`", desc.name())
}

/// A handle on `vnodes` of `desc` reads `vnode` only if it owns it.
pub(crate) fn check_owned(
    desc: &TableDesc,
    vnodes: &VnodeBitmap,
    replicated: bool,
    vnode: VirtualNode,
) -> Result<()> {
    if vnodes.contains(vnode) {
        Ok(())
    } else {
        Err(Error::VnodeNotOwned {
            vnode: vnode.get(),
            owner: owner(desc, replicated),
        })
    }
}

/// The checks every handle makes on a write: the table's schema, and rows only in the
/// vnodes it owns. Returns each row's vnode.
pub(crate) fn check_write(
    desc: &TableDesc,
    owned: &VnodeBitmap,
    chunk: &StreamChunk,
    owner: impl FnOnce() -> String,
) -> Result<Vec<VirtualNode>> {
    desc.check_schema(&chunk.schema(), "a write")?;
    check_decimals(chunk.batch())?;
    let vnodes = desc.vnodes_of(chunk.batch())?;
    if let Some(vnode) = vnodes.iter().find(|v| !owned.contains(**v)) {
        return Err(Error::VnodeNotOwned {
            vnode: vnode.get(),
            owner: owner(),
        });
    }
    Ok(vnodes)
}

/// Decimals of precision 18 or less hold at most 18 digits: run files store them as 64-bit
/// decimals, so a value with more (which Arrow does not check when an array is built) is
/// refused here, naming its column, rather than stored wrong.
pub(crate) fn check_decimals(batch: &RecordBatch) -> Result<()> {
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        let DataType::Decimal128(precision, scale) = *field.data_type() else {
            continue;
        };
        if precision > DECIMAL64_MAX_PRECISION {
            continue;
        }
        let array = column.as_primitive::<Decimal128Type>();
        let max = Decimal128Type::MAX_FOR_EACH_PRECISION[usize::from(precision)];
        // Branch-free over every slot, so that it vectorizes; a null slot's value means
        // nothing, so only a hit is looked at again, null-aware.
        let any = (array.values().iter()).fold(false, |out, &v| out | (v > max) | (v < -max));
        if !any {
            continue;
        }
        if let Some(value) = array.iter().flatten().find(|v| *v > max || *v < -max) {
            return Err(Error::decimal_too_long(
                field.name(),
                value,
                precision,
                scale,
            ));
        }
    }
    Ok(())
}

/// The epoch rules of a seal: after the handle's last seal and, for a handle that is not
/// replicated, above the committed epoch.
pub(crate) fn check_seal(
    desc: &TableDesc,
    epoch: u64,
    last_sealed: Option<u64>,
    committed: Option<u64>,
    replicated: bool,
) -> Result<()> {
    if let Some(last) = last_sealed
        && epoch <= last
    {
        return Err(Error::EpochOrder {
            context: format!("seal of table `{}`", desc.name()),
            epoch,
            previous: last,
        });
    }
    if !replicated
        && let Some(committed) = committed
        && epoch <= committed
    {
        return Err(Error::EpochOrder {
            context: format!("seal of table `{}` (already committed)", desc.name()),
            epoch,
            previous: committed,
        });
    }
    Ok(())
}

/// A read of `table` at `epoch` sees the committed data: not below the committed epoch,
/// whose history is compacted away.
pub(crate) fn check_read_epoch(table: &str, epoch: u64, committed: Option<u64>) -> Result<()> {
    match committed {
        Some(committed) if epoch < committed => Err(Error::StaleRead {
            table: table.to_string(),
            epoch,
            committed,
        }),
        _ => Ok(()),
    }
}

/// A commit of `epoch` goes above the committed epoch.
pub(crate) fn check_commit(epoch: u64, committed: Option<u64>) -> Result<()> {
    if let Some(committed) = committed
        && epoch <= committed
    {
        return Err(Error::EpochOrder {
            context: "store commit".into(),
            epoch,
            previous: committed,
        });
    }
    Ok(())
}

/// Adds a handle's sealed `layer` (per vnode) to the store's layer of `epoch` (`slot`): one
/// handle per vnode and epoch.
pub(crate) fn install_sealed<V>(
    slot: &mut HashMap<VirtualNode, V>,
    layer: impl IntoIterator<Item = (VirtualNode, V)>,
    desc: &TableDesc,
    epoch: u64,
) -> Result<()> {
    for (vnode, runs) in layer {
        if slot.insert(vnode, runs).is_some() {
            return Err(internal!(
                "two handles wrote vnode {vnode} of table `{}` in epoch {epoch}",
                desc.name()
            ));
        }
    }
    Ok(())
}

/// A replicated handle's seal of `layer` as `epoch` into its own layers (`local`): the
/// layers at or below the committed epoch are dropped (the store's committed data holds
/// their rows now), and so is `layer` if it is one of them.
pub(crate) fn keep_replicated<L>(
    local: &mut BTreeMap<u64, L>,
    committed: Option<u64>,
    epoch: u64,
    layer: Option<L>,
) {
    let keep_after = committed.map_or(0, |c| c + 1);
    *local = local.split_off(&keep_after);
    if let Some(layer) = layer
        && epoch >= keep_after
    {
        local.insert(epoch, layer);
    }
}

/// The layers of a replicated handle (`local`) a read at `epoch` sees: those above the
/// committed epoch, up to `epoch`, oldest first.
pub(crate) fn replicated_visible<L>(
    local: &BTreeMap<u64, L>,
    committed: Option<u64>,
    epoch: u64,
) -> impl Iterator<Item = &L> {
    let after = committed.map_or(0, |c| c + 1);
    local
        .range(after..)
        .take_while(move |(e, _)| **e <= epoch)
        .map(|(_, layer)| layer)
}

/// The committed job values whose keys start with `prefix`, in key order.
pub(crate) fn meta_with_prefix(
    meta: &BTreeMap<String, String>,
    prefix: &str,
) -> Vec<(String, String)> {
    meta.range(prefix.to_string()..)
        .take_while(|(k, _)| k.starts_with(prefix))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::key::KeyColumn;
    use crate::vnode::VnodeCount;
    use arrow_array::{Decimal128Array, Int64Array};
    use arrow_schema::{Field, Schema};

    fn write_of(values: Vec<Option<i128>>, precision: u8) -> Result<Vec<VirtualNode>> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("price", DataType::Decimal128(precision, 2), true),
        ]));
        let desc = TableDesc::new("t", schema.clone(), vec![KeyColumn::asc("k")])?
            .with_vnode_count(VnodeCount::new(4)?);
        let n = values.len() as i64;
        let prices = Decimal128Array::from(values).with_precision_and_scale(precision, 2)?;
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(0..n)),
                Arc::new(prices),
            ],
        )?;
        let owned = VnodeBitmap::full(desc.vnode_count());
        check_write(&desc, &owned, &StreamChunk::inserts(batch), || "t".into())
    }

    #[test]
    fn a_write_of_a_decimal_with_more_digits_than_its_precision_is_bad_input() {
        let most = 10i128.pow(15) - 1;
        assert!(write_of(vec![Some(most), Some(-most), None], 15).is_ok());
        for bad in [most + 1, -most - 1, i128::from(i64::MAX) + 1] {
            let err = write_of(vec![Some(1), Some(bad)], 15).unwrap_err();
            assert!(matches!(err, Error::InvalidValue { .. }), "{err}");
            assert!(err.is_bad_input());
            assert!(err.to_string().contains("`price`"), "{err}");
            assert!(err.to_string().contains("decimal(15, 2)"), "{err}");
        }
        // Above 18 digits a column is stored as it is: no check of ours.
        assert!(write_of(vec![Some(i128::MAX)], 30).is_ok());
    }
}

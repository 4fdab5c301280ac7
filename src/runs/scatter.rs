//! Reordering rows by writing each input row to its place, instead of reading each output
//! row from its place.
//!
//! A bulk load puts its rows in vnode-then-key order. Read as a gather (`take`,
//! `interleave`), that order visits the input once per vnode, a row here and a row there: in
//! a piece of tens of MB every value read is a cache miss, and the gather of lineitem's 16
//! columns was the load's largest cost (lineitem scale 1, `docs/benchmarks-history.md`). The same
//! permutation written as a scatter reads the input front to back and writes one sequential
//! stream per vnode: within a vnode, rows keep their input order whenever the input was
//! sorted by key, as tables exported in key order are.
//!
//! ```text
//!   gather:  out[i] = in[take[i]]   reads jump, writes run
//!   scatter: out[dest[r]] = in[r]   reads run, writes go to one running stream per vnode
//! ```
//!
//! [`scatter`] handles primitive columns and string and binary views (the load's columns as
//! read from Parquet); the caller gathers any other type.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{BinaryViewType, ByteViewType, StringViewType};
use arrow_array::{
    Array, ArrayRef, ArrowPrimitiveType, GenericByteViewArray, PrimitiveArray,
    downcast_primitive_array,
};
use arrow_buffer::{BooleanBufferBuilder, Buffer, NullBuffer, ScalarBuffer};
use arrow_data::ByteView;
use arrow_schema::DataType;

use crate::error::{Result, internal};

/// Where each input row goes.
#[derive(Debug)]
pub(crate) struct Destinations {
    /// The output row of each input row (rows numbered through the inputs one after
    /// another), or [`Destinations::SKIP`] for a row left out.
    dest: Vec<u32>,
    /// Output rows.
    len: usize,
}

impl Destinations {
    /// A row the output leaves out.
    const SKIP: u32 = u32::MAX;

    /// The destinations of the gather whose output row `i` is input row `take[i]`, among
    /// `input_rows` rows. Each input row may be taken at most once.
    pub(crate) fn of_take(take: &[u32], input_rows: usize) -> Result<Self> {
        if take.len() >= Self::SKIP as usize {
            return Err(internal!("a scatter of {} rows", take.len()));
        }
        let mut dest = vec![Self::SKIP; input_rows];
        for (to, &from) in take.iter().enumerate() {
            let slot = dest
                .get_mut(from as usize)
                .ok_or_else(|| internal!("row {from} taken from {input_rows} rows"))?;
            if *slot != Self::SKIP {
                return Err(internal!("row {from} taken twice"));
            }
            // `to < take.len() < SKIP`, checked above.
            *slot = to as u32;
        }
        Ok(Self {
            dest,
            len: take.len(),
        })
    }

    /// The destinations of each piece's rows.
    fn per_piece<'a>(&'a self, pieces: &[&dyn Array]) -> Option<Vec<&'a [u32]>> {
        let mut at = 0;
        let parts = pieces
            .iter()
            .map(|piece| {
                let part = self.dest.get(at..at + piece.len());
                at += piece.len();
                part
            })
            .collect::<Option<Vec<_>>>()?;
        (at == self.dest.len()).then_some(parts)
    }
}

/// The column whose rows are those of `pieces` one after another (all of one type), with its
/// rows where `dest` puts them; `None` for a type it does not handle, or pieces that do not
/// match `dest`.
pub(crate) fn scatter(pieces: &[&dyn Array], dest: &Destinations) -> Option<ArrayRef> {
    let first = *pieces.first()?;
    if pieces.iter().any(|p| p.data_type() != first.data_type()) {
        return None;
    }
    let parts = dest.per_piece(pieces)?;
    downcast_primitive_array!(
        first => scatter_primitive(first, pieces, &parts, dest.len),
        DataType::Utf8View => scatter_views::<StringViewType>(pieces, &parts, dest.len),
        DataType::BinaryView => scatter_views::<BinaryViewType>(pieces, &parts, dest.len),
        _ => None,
    )
}

/// The output's validity: `None` if no piece has a null.
fn scatter_nulls(pieces: &[&dyn Array], parts: &[&[u32]], len: usize) -> Option<NullBuffer> {
    if pieces.iter().all(|p| p.null_count() == 0) {
        return None;
    }
    let mut valid = BooleanBufferBuilder::new(len);
    valid.append_n(len, false);
    for (piece, part) in pieces.iter().zip(parts) {
        let nulls = piece.logical_nulls();
        for (row, &to) in part.iter().enumerate() {
            if to != Destinations::SKIP && nulls.as_ref().is_none_or(|n| n.is_valid(row)) {
                valid.set_bit(to as usize, true);
            }
        }
    }
    Some(NullBuffer::new(valid.finish()))
}

/// Writes `value(row)` of each row of `part` to its place in `out`.
#[inline(always)]
fn scatter_values<T: Copy>(out: &mut [T], part: &[u32], value: impl Fn(usize) -> T) {
    for (row, &to) in part.iter().enumerate() {
        if let Some(slot) = out.get_mut(to as usize) {
            *slot = value(row);
        }
    }
}

fn scatter_primitive<T: ArrowPrimitiveType>(
    first: &PrimitiveArray<T>,
    pieces: &[&dyn Array],
    parts: &[&[u32]],
    len: usize,
) -> Option<ArrayRef> {
    let mut out = vec![T::Native::default(); len];
    for (piece, part) in pieces.iter().zip(parts) {
        let values = piece.as_primitive_opt::<T>()?.values();
        let values: &[T::Native] = values;
        scatter_values(&mut out, part, |row| values[row]);
    }
    let nulls = scatter_nulls(pieces, parts, len);
    let array = PrimitiveArray::<T>::try_new(ScalarBuffer::from(out), nulls).ok()?;
    Some(Arc::new(array.with_data_type(first.data_type().clone())))
}

/// Views keep pointing into their pieces' buffers: the output holds every piece's buffers,
/// one list after another, and a long value's view its buffer's new index.
#[expect(unsafe_code, reason = "views moved between valid arrays; see SAFETY")]
fn scatter_views<T: ByteViewType>(
    pieces: &[&dyn Array],
    parts: &[&[u32]],
    len: usize,
) -> Option<ArrayRef> {
    let mut out = vec![0u128; len];
    let mut buffers: Vec<Buffer> = Vec::new();
    for (piece, part) in pieces.iter().zip(parts) {
        let piece = piece.as_byte_view_opt::<T>()?;
        let views: &[u128] = piece.views();
        let base = u32::try_from(buffers.len()).ok()?;
        if base == 0 {
            scatter_values(&mut out, part, |row| views[row]);
        } else {
            scatter_values(&mut out, part, |row| rebase(views[row], base));
        }
        buffers.extend(piece.data_buffers().iter().cloned());
    }
    u32::try_from(buffers.len()).ok()?;
    let nulls = scatter_nulls(pieces, parts, len);
    // SAFETY: every output view is a view of a valid array of type `T` (a piece), copied
    // as it is (inline values: the value is in the view) or with its buffer index moved by
    // the number of buffers of the pieces before its own, which is where `buffers` holds
    // that piece's buffers (the list fits u32 indices, checked above); offset, length and
    // prefix are unchanged, so each view still describes the same valid bytes (UTF-8 for
    // strings). `Destinations` puts exactly one input row in each of the `len` slots; a
    // slot left unwritten would hold the zero view, itself a valid (empty, inline) value.
    let array = unsafe { GenericByteViewArray::<T>::new_unchecked(out.into(), buffers, nulls) };
    Some(Arc::new(array))
}

/// `view` with its buffer index moved by `base`, if it points into a buffer.
#[inline(always)]
fn rebase(view: u128, base: u32) -> u128 {
    if view as u32 <= arrow_data::MAX_INLINE_VIEW_LEN {
        view
    } else {
        let mut long = ByteView::from(view);
        // Wrapping: a null slot's view may hold anything, and is never read.
        long.buffer_index = long.buffer_index.wrapping_add(base);
        long.as_u128()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{
        BinaryViewArray, Decimal128Array, Int64Array, StringViewArray, TimestampMillisecondArray,
    };

    /// The gather the scatter must equal: `interleave` of the pieces at `take`.
    fn gathered(pieces: &[&dyn Array], take: &[u32]) -> ArrayRef {
        let mut starts = Vec::new();
        let mut at = 0;
        for p in pieces {
            starts.push(at);
            at += p.len();
        }
        let pairs: Vec<(usize, usize)> = take
            .iter()
            .map(|&row| {
                let row = row as usize;
                let piece = starts.partition_point(|&s| s <= row) - 1;
                (piece, row - starts[piece])
            })
            .collect();
        arrow_select::interleave::interleave(pieces, &pairs).unwrap()
    }

    fn check(pieces: &[&dyn Array], take: &[u32]) {
        let rows = pieces.iter().map(|p| p.len()).sum();
        let dest = Destinations::of_take(take, rows).unwrap();
        let got = scatter(pieces, &dest).expect("a handled type");
        assert_eq!(got.as_ref(), gathered(pieces, take).as_ref());
    }

    /// A permutation of `0..n`, every third row left out (a newer row of its key won).
    fn take_of(n: u32) -> Vec<u32> {
        let mut take: Vec<u32> = (0..n).filter(|r| r % 3 != 1).collect();
        take.sort_by_key(|&r| (r % 7, r));
        take
    }

    #[test]
    fn primitives_with_and_without_nulls_land_where_the_gather_puts_them() {
        let a = Int64Array::from_iter_values(0..50);
        let b = Int64Array::from_iter((0..40).map(|v| (v % 5 != 0).then_some(v * 10)));
        check(&[&a, &b], &take_of(90));
        check(&[&a], &take_of(50));
        let ts = TimestampMillisecondArray::from_iter_values(0..20).with_timezone("+01:00");
        check(&[&ts, &ts.slice(3, 10)], &take_of(30));
        let dec = Decimal128Array::from_iter_values(0..30)
            .with_precision_and_scale(30, 2)
            .unwrap();
        check(&[&dec], &take_of(30));
    }

    #[test]
    fn views_keep_pointing_at_their_own_piece_s_buffers() {
        let long = |i: usize| format!("a value longer than twelve bytes, number {i}");
        let a = StringViewArray::from_iter_values(
            (0..30).map(|i| if i % 2 == 0 { long(i) } else { format!("s{i}") }),
        );
        let b = StringViewArray::from_iter((0..30).map(|i| (i % 4 != 0).then(|| long(100 + i))));
        let c = StringViewArray::from_iter_values((0..5).map(long)).slice(1, 3);
        check(&[&a, &b, &c], &take_of(63));
        let bin = BinaryViewArray::from_iter_values((0..20).map(|i| long(i).into_bytes()));
        check(&[&bin, &bin], &take_of(40));
    }

    #[test]
    fn other_types_and_mismatched_pieces_are_left_to_the_gather() {
        let strings = arrow_array::StringArray::from_iter_values(["a", "b"]);
        let dest = Destinations::of_take(&[1, 0], 2).unwrap();
        assert!(scatter(&[&strings], &dest).is_none());
        let ints = Int64Array::from_iter_values(0..2);
        let more = Int64Array::from_iter_values(0..3);
        assert!(
            scatter(&[&ints, &more], &dest).is_none(),
            "5 rows, 2 destinations"
        );
    }

    #[test]
    fn a_row_taken_twice_or_out_of_range_is_an_error() {
        assert!(Destinations::of_take(&[0, 0], 2).is_err());
        assert!(Destinations::of_take(&[2], 2).is_err());
    }
}

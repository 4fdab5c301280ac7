//! Concatenations and interleaves of columns that are, or hold, dictionaries with narrow
//! keys (8 or 16 bits): the output's dictionary holds each distinct value it uses once, so
//! a key type works whenever the values it has to index fit it.
//!
//! Arrow's `concat` and `interleave` put the rows of several dictionary arrays into one.
//! They concatenate the sources' dictionaries while the sum fits the key type, and merge
//! them beyond that, keeping each referenced value once only as far as a best-effort hash
//! table manages: two values that share a bucket are each kept again for every source
//! that has them. With 32-bit keys that never matters; with narrow keys a gather from many
//! sources (a compaction merging dozens of runs) overflows the key type with
//! "Dictionary key bigger than the key type" although its 100 distinct values fit an
//! `Int8` dictionary. Dictionaries of value types arrow does not merge (views, fixed-size
//! binaries, ...) are concatenated by `MutableArrayData`, which panics when their sum
//! overflows the key type.
//!
//! So a column with narrow dictionary keys goes to arrow first only where arrow cannot
//! panic; when arrow overflows (or could panic), the sources are widened to 32-bit keys (a
//! cast of the keys: the values are shared), gathered by arrow, and the output encoded
//! again in the column's type from its values, each distinct value once (arrow's casts to
//! a dictionary deduplicate exactly). Only an output whose distinct values do not fit the
//! key type is an error, naming the column. Every other column goes to arrow as before.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow_cast::CastOptions;
use arrow_cast::display::FormatOptions;
use arrow_schema::{ArrowError, DataType, Field, FieldRef, Schema, SchemaRef};

use crate::error::{Error, Result, internal};

/// Casts that fail rather than make a value null.
const EXACT: CastOptions<'static> = CastOptions {
    safe: false,
    format_options: FormatOptions::new(),
};

/// The number of distinct values a dictionary of `key` keys can index, for the narrow key
/// types; `None` for the others (32 and 64 bits).
fn narrow_capacity(key: &DataType) -> Option<usize> {
    match key {
        DataType::Int8 => Some(1 << 7),
        DataType::UInt8 => Some(1 << 8),
        DataType::Int16 => Some(1 << 15),
        DataType::UInt16 => Some(1 << 16),
        _ => None,
    }
}

/// Whether `data_type` is, or holds (in a list, struct or map), a dictionary with narrow
/// keys. The containers are those [`map_dictionaries`] looks into.
pub(crate) fn has_narrow_dictionary(data_type: &DataType) -> bool {
    match data_type {
        DataType::Dictionary(key, values) => {
            narrow_capacity(key).is_some() || has_narrow_dictionary(values)
        }
        DataType::List(child)
        | DataType::LargeList(child)
        | DataType::ListView(child)
        | DataType::LargeListView(child)
        | DataType::FixedSizeList(child, _)
        | DataType::Map(child, _) => has_narrow_dictionary(child.data_type()),
        DataType::Struct(fields) => fields.iter().any(|f| has_narrow_dictionary(f.data_type())),
        _ => false,
    }
}

/// `data_type` with each dictionary (key type, value type already mapped) replaced by
/// `f`'s type, in the containers [`has_narrow_dictionary`] looks into.
fn map_dictionaries(data_type: &DataType, f: &dyn Fn(&DataType, DataType) -> DataType) -> DataType {
    let child = |c: &FieldRef| -> FieldRef {
        Arc::new(
            c.as_ref()
                .clone()
                .with_data_type(map_dictionaries(c.data_type(), f)),
        )
    };
    match data_type {
        DataType::Dictionary(key, values) => f(key, map_dictionaries(values, f)),
        DataType::List(c) => DataType::List(child(c)),
        DataType::LargeList(c) => DataType::LargeList(child(c)),
        DataType::ListView(c) => DataType::ListView(child(c)),
        DataType::LargeListView(c) => DataType::LargeListView(child(c)),
        DataType::FixedSizeList(c, n) => DataType::FixedSizeList(child(c), *n),
        DataType::Map(c, sorted) => DataType::Map(child(c), *sorted),
        DataType::Struct(fields) => DataType::Struct(fields.iter().map(child).collect()),
        other => other.clone(),
    }
}

/// `data_type` with narrow dictionary keys widened to `Int32`.
fn widened(data_type: &DataType) -> DataType {
    map_dictionaries(data_type, &|key, values| {
        let key = match narrow_capacity(key) {
            Some(_) => DataType::Int32,
            None => key.clone(),
        };
        DataType::Dictionary(Box::new(key), Box::new(values))
    })
}

/// `data_type` with every dictionary replaced by its values' type.
fn plain(data_type: &DataType) -> DataType {
    map_dictionaries(data_type, &|_, values| values)
}

/// Whether arrow gathers `sources` (of the dictionary type `data_type`) without a panic:
/// the value types it merges, sums of dictionaries that fit the key type, and sources
/// sharing one dictionary. A dictionary inside a container is never tried.
fn arrow_gathers(data_type: &DataType, sources: &[&dyn Array]) -> bool {
    let DataType::Dictionary(key, values) = data_type else {
        return false;
    };
    let merged = matches!(
        values.as_ref(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Binary | DataType::LargeBinary
    ) || values.is_primitive();
    let dictionaries: Vec<&dyn Array> = (sources.iter())
        .filter_map(|s| s.as_any_dictionary_opt().map(|d| d.values().as_ref()))
        .collect();
    // Arrow's own test: the sum must not exceed the key type's largest value.
    let sum: usize = dictionaries.iter().map(|d| d.len()).sum();
    let fits = narrow_capacity(key).is_none_or(|capacity| sum < capacity);
    merged || fits || {
        let first = dictionaries.first().map(|d| d.to_data());
        (dictionaries.iter().skip(1))
            .all(|d| first.as_ref().is_some_and(|f| f.ptr_eq(&d.to_data())))
    }
}

/// The rows `op` gathers from `sources` (each of `field`'s type): `op` itself unless the
/// type has narrow dictionary keys, else as the module says.
fn gather(
    field: &Field,
    sources: &[&dyn Array],
    op: impl Fn(&[&dyn Array]) -> std::result::Result<ArrayRef, ArrowError>,
) -> Result<ArrayRef> {
    let data_type = field.data_type();
    // Sources of another type: arrow reports it.
    if !has_narrow_dictionary(data_type) || sources.iter().any(|s| s.data_type() != data_type) {
        return Ok(op(sources)?);
    }
    if arrow_gathers(data_type, sources) {
        match op(sources) {
            Err(ArrowError::DictionaryKeyOverflowError) => {}
            other => return Ok(other?),
        }
    }
    let wide_type = widened(data_type);
    let wide = (sources.iter())
        .map(|s| arrow_cast::cast_with_options(*s, &wide_type, &EXACT))
        .collect::<std::result::Result<Vec<ArrayRef>, ArrowError>>()?;
    let wide: Vec<&dyn Array> = wide.iter().map(|a| a.as_ref()).collect();
    let gathered = op(&wide)?;
    let values = arrow_cast::cast_with_options(&gathered, &plain(data_type), &EXACT)?;
    arrow_cast::cast_with_options(&values, data_type, &EXACT).map_err(|e| match e {
        ArrowError::DictionaryKeyOverflowError => too_many_values(field, &values),
        e => e.into(),
    })
}

/// The error for `values` (a gathered column of `field`, as values) whose distinct values
/// do not fit the column's dictionary keys.
fn too_many_values(field: &Field, values: &ArrayRef) -> Error {
    let data_type = field.data_type();
    let distinct = match data_type {
        DataType::Dictionary(_, value_type) => {
            let counted = DataType::Dictionary(Box::new(DataType::UInt32), value_type.clone());
            (arrow_cast::cast_with_options(values, &counted, &EXACT).ok())
                .and_then(|d| d.as_any_dictionary_opt().map(|d| d.values().len()))
        }
        _ => None,
    };
    let capacity = match data_type {
        DataType::Dictionary(key, _) => narrow_capacity(key),
        _ => None,
    };
    let what = match (distinct, capacity) {
        (Some(distinct), Some(capacity)) => format!(
            "{distinct} distinct values met in one batch of {} rows, more than the {capacity} \
             its dictionary keys can index ({data_type})",
            values.len()
        ),
        _ => format!(
            "more distinct values met in one batch of {} rows than its dictionary keys can \
             index ({data_type})",
            values.len()
        ),
    };
    Error::InvalidValue {
        column: field.name().clone(),
        message: format!("{what}; declare it with wider keys (Int32) or as plain values"),
    }
}

/// `schema` with narrow dictionary keys widened to `Int32`, if it has any: the schema to
/// read a Parquet file of `schema` with, whose reader would otherwise pack the values of a
/// batch spanning row groups (each with a dictionary of its own) into the narrow keys, and
/// panic when they do not fit.
pub fn widened_schema(schema: &Schema) -> Option<SchemaRef> {
    if !(schema.fields().iter()).any(|f| has_narrow_dictionary(f.data_type())) {
        return None;
    }
    let fields: Vec<FieldRef> = (schema.fields().iter())
        .map(|f| Arc::new(f.as_ref().clone().with_data_type(widened(f.data_type()))))
        .collect();
    Some(Arc::new(Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    )))
}

/// `column`, of `field`'s type with wider dictionary keys ([`widened_schema`]), in `field`'s
/// type: the keys narrowed where the dictionary fits them, else its values encoded again,
/// each distinct value once; an error naming the column when they do not fit.
pub fn narrowed(field: &Field, column: &ArrayRef) -> Result<ArrayRef> {
    let data_type = field.data_type();
    if column.data_type() == data_type {
        return Ok(column.clone());
    }
    if let (DataType::Dictionary(key, _), Some(dictionary)) =
        (data_type, column.as_any_dictionary_opt())
        && narrow_capacity(key).is_some_and(|capacity| dictionary.values().len() <= capacity)
    {
        // Every key indexes the dictionary, so it fits the narrow type.
        return Ok(arrow_cast::cast_with_options(column, data_type, &EXACT)?);
    }
    let values = arrow_cast::cast_with_options(column, &plain(data_type), &EXACT)?;
    arrow_cast::cast_with_options(&values, data_type, &EXACT).map_err(|e| match e {
        ArrowError::DictionaryKeyOverflowError => too_many_values(field, &values),
        e => e.into(),
    })
}

/// The rows of `sources` (each of `field`'s type) one after another: arrow's `concat`,
/// dictionaries with narrow keys merged (see the module).
pub(crate) fn concat(field: &Field, sources: &[&dyn Array]) -> Result<ArrayRef> {
    gather(field, sources, arrow_select::concat::concat)
}

/// The rows `(source, row)` of `sources` (each of `field`'s type): arrow's `interleave`,
/// dictionaries with narrow keys merged (see the module).
pub(crate) fn interleave(
    field: &Field,
    sources: &[&dyn Array],
    indices: &[(usize, usize)],
) -> Result<ArrayRef> {
    gather(field, sources, |s| {
        arrow_select::interleave::interleave(s, indices)
    })
}

/// The rows of `batches` (of `schema`) one after another: arrow's `concat_batches`,
/// dictionaries with narrow keys merged (see the module).
pub fn concat_batches<'a>(
    schema: &SchemaRef,
    batches: impl IntoIterator<Item = &'a RecordBatch>,
) -> Result<RecordBatch> {
    if !(schema.fields().iter()).any(|f| has_narrow_dictionary(f.data_type())) {
        return Ok(arrow_select::concat::concat_batches(schema, batches)?);
    }
    let batches: Vec<&RecordBatch> = batches.into_iter().collect();
    if batches.is_empty() {
        return Ok(RecordBatch::new_empty(schema.clone()));
    }
    let fields = schema.fields();
    if let Some(other) = batches.iter().find(|b| b.num_columns() != fields.len()) {
        return Err(internal!(
            "a concatenation of a batch of {} columns into {} columns",
            other.num_columns(),
            fields.len()
        ));
    }
    let columns = (fields.iter().enumerate())
        .map(|(i, field)| {
            let sources: Vec<&dyn Array> = batches.iter().map(|b| b.column(i).as_ref()).collect();
            concat(field, &sources)
        })
        .collect::<Result<Vec<_>>>()?;
    let rows = batches.iter().map(|b| b.num_rows()).sum();
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &options,
    )?)
}

#[cfg(test)]
mod tests {
    use arrow_array::types::{Int8Type, Int16Type, UInt8Type, UInt16Type};
    use arrow_array::{ArrowPrimitiveType, ListArray, StringArray};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// `array` as its values, as strings (nulls as `None`).
    fn strings(array: &dyn Array) -> Vec<Option<String>> {
        let values = arrow_cast::cast(array, &DataType::Utf8).unwrap();
        (values.as_string::<i32>().iter())
            .map(|v| v.map(str::to_string))
            .collect()
    }

    /// A dictionary of `K` keys and `value_type` values of 300 rows over the labels
    /// `first..first + distinct`, in an order of its own (`seed`), some null.
    fn source(
        key: &DataType,
        value_type: &DataType,
        first: usize,
        distinct: usize,
        seed: u64,
    ) -> ArrayRef {
        let mut rng = StdRng::seed_from_u64(seed);
        let labels = StringArray::from_iter((0..300).map(|_| {
            let label = first + rng.random_range(0..distinct);
            (!rng.random_ratio(1, 10)).then(|| format!("label {label:04}"))
        }));
        let dictionary = DataType::Dictionary(Box::new(key.clone()), Box::new(value_type.clone()));
        arrow_cast::cast(&labels, &dictionary).unwrap()
    }

    /// The largest dictionary the column `array` has (its values' count).
    fn dictionary_len(array: &dyn Array) -> usize {
        array.as_any_dictionary().values().len()
    }

    /// 2 to 40 sources of one key type, each with its own dictionary of the same 100 values
    /// (arrow's own merge overflows 8-bit keys on a few such sources, whose values collide
    /// in its small hash table): concatenated and interleaved, the rows are the sources',
    /// in a dictionary that fits.
    fn many_sources_fit<K: ArrowPrimitiveType>(value_type: DataType) {
        for count in [2, 3, 4, 6, 10, 40] {
            sources_fit::<K>(&value_type, count);
        }
    }

    /// [`many_sources_fit`] of `count` sources.
    fn sources_fit<K: ArrowPrimitiveType>(value_type: &DataType, count: usize) {
        let key = K::DATA_TYPE;
        let field = Field::new(
            "b",
            DataType::Dictionary(Box::new(key.clone()), Box::new(value_type.clone())),
            true,
        );
        let sources: Vec<ArrayRef> = (0..count as u64)
            .map(|seed| source(&key, value_type, 0, 100, seed))
            .collect();
        let refs: Vec<&dyn Array> = sources.iter().map(|s| s.as_ref()).collect();
        let all: Vec<Option<String>> = refs.iter().flat_map(|s| strings(*s)).collect();

        let concatenated = concat(&field, &refs).unwrap();
        assert_eq!(concatenated.data_type(), field.data_type());
        assert_eq!(strings(concatenated.as_ref()), all, "{key}");
        let capacity = narrow_capacity(&key).unwrap();
        assert!(dictionary_len(concatenated.as_ref()) <= capacity);

        let mut rng = StdRng::seed_from_u64(7);
        let indices: Vec<(usize, usize)> = (0..5000)
            .map(|_| (rng.random_range(0..count), rng.random_range(0..300)))
            .collect();
        let gathered = interleave(&field, &refs, &indices).unwrap();
        assert_eq!(gathered.data_type(), field.data_type());
        let each: Vec<Vec<Option<String>>> = refs.iter().map(|s| strings(*s)).collect();
        let expected: Vec<Option<String>> =
            (indices.iter()).map(|&(s, r)| each[s][r].clone()).collect();
        assert_eq!(strings(gathered.as_ref()), expected, "{key}");
        assert!(dictionary_len(gathered.as_ref()) <= capacity);
    }

    #[test]
    fn narrow_keys_hold_the_distinct_values_of_many_sources() {
        many_sources_fit::<Int8Type>(DataType::Utf8);
        many_sources_fit::<UInt8Type>(DataType::Utf8);
        many_sources_fit::<Int16Type>(DataType::Utf8);
        many_sources_fit::<UInt16Type>(DataType::Utf8);
        many_sources_fit::<Int8Type>(DataType::LargeBinary);
    }

    /// Values arrow does not merge (views): arrow concatenates their dictionaries and its
    /// `MutableArrayData` panics once the sum overflows the key type.
    #[test]
    fn dictionaries_of_views_merge_instead_of_panicking() {
        many_sources_fit::<Int8Type>(DataType::Utf8View);
        many_sources_fit::<UInt8Type>(DataType::BinaryView);
    }

    /// A dictionary in a list: merged the same way.
    #[test]
    fn a_dictionary_inside_a_list_merges() {
        let dictionary = DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8));
        let item = Arc::new(Field::new("item", dictionary.clone(), true));
        let field = Field::new("l", DataType::List(item.clone()), true);
        let lists: Vec<ArrayRef> = (0..10)
            .map(|seed| {
                let values = source(&DataType::Int8, &DataType::Utf8, 0, 100, seed);
                let offsets = arrow_buffer::OffsetBuffer::from_lengths([100, 0, 200]);
                Arc::new(ListArray::new(item.clone(), offsets, values, None)) as ArrayRef
            })
            .collect();
        let refs: Vec<&dyn Array> = lists.iter().map(|s| s.as_ref()).collect();
        let plain = DataType::List(Arc::new(Field::new("item", DataType::Utf8, true)));
        let as_plain = |a: &dyn Array| arrow_cast::cast(a, &plain).unwrap();
        let concatenated = concat(&field, &refs).unwrap();
        assert_eq!(concatenated.data_type(), field.data_type());
        let expected = arrow_select::concat::concat(
            &(refs.iter())
                .map(|a| as_plain(*a))
                .collect::<Vec<_>>()
                .iter()
                .map(|a| a.as_ref())
                .collect::<Vec<_>>(),
        )
        .unwrap();
        assert_eq!(&as_plain(concatenated.as_ref()), &expected);
        let indices: Vec<(usize, usize)> = (0..30).map(|i| (i % 10, i % 3)).collect();
        let gathered = interleave(&field, &refs, &indices).unwrap();
        assert_eq!(gathered.data_type(), field.data_type());
        assert_eq!(gathered.len(), 30);
    }

    /// Distinct values beyond the key type: an error naming the column, its count and type.
    #[test]
    fn distinct_values_beyond_the_key_type_name_the_column() {
        let field = Field::new(
            "b",
            DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8)),
            true,
        );
        let a = source(&DataType::Int8, &DataType::Utf8, 0, 100, 1);
        let b = source(&DataType::Int8, &DataType::Utf8, 100, 100, 2);
        let distinct = |s: &ArrayRef| {
            let mut v: Vec<_> = strings(s.as_ref()).into_iter().flatten().collect();
            v.sort();
            v.dedup();
            v.len()
        };
        let total = distinct(&a) + distinct(&b);
        for result in [
            concat(&field, &[a.as_ref(), b.as_ref()]),
            interleave(&field, &[a.as_ref(), b.as_ref()], &[(0, 0), (1, 0)]).and_then(|_| {
                interleave(&field, &[a.as_ref(), b.as_ref()], &{
                    (0..600).map(|i| (i % 2, i / 2)).collect::<Vec<_>>()
                })
            }),
        ] {
            let e = result.unwrap_err();
            assert!(e.is_bad_input(), "{e}");
            let text = e.to_string();
            assert!(text.starts_with("column `b`: "), "{text}");
            assert!(text.contains(&format!("{total} distinct values")), "{text}");
            assert!(text.contains("128") && text.contains("Int8"), "{text}");
        }
    }

    /// Batches: a schema without narrow dictionaries is arrow's concatenation; one with a
    /// narrow dictionary column merges it and keeps the other columns as arrow does.
    #[test]
    fn batches_concatenate_and_interleave_with_dictionaries_merged() {
        let dictionary = DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8));
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, false),
            Field::new("b", dictionary, true),
        ]));
        let batches: Vec<RecordBatch> = (0..30)
            .map(|seed| {
                RecordBatch::try_new(
                    schema.clone(),
                    vec![
                        Arc::new(arrow_array::Int64Array::from_iter_values(0..300)),
                        source(&DataType::Int8, &DataType::Utf8, 0, 100, seed),
                    ],
                )
                .unwrap()
            })
            .collect();
        let all = concat_batches(&schema, &batches).unwrap();
        assert_eq!(all.num_rows(), 9000);
        let expected: Vec<Option<String>> = batches
            .iter()
            .flat_map(|b| strings(b.column(1).as_ref()))
            .collect();
        assert_eq!(strings(all.column(1).as_ref()), expected);
        let refs: Vec<&RecordBatch> = batches.iter().collect();
        let indices: Vec<(usize, usize)> = (0..3000).map(|i| (i % 30, (i * 7) % 300)).collect();
        let gathered = crate::interleave::interleave_batches(&refs, &indices).unwrap();
        let each: Vec<Vec<Option<String>>> = batches
            .iter()
            .map(|b| strings(b.column(1).as_ref()))
            .collect();
        let expected: Vec<Option<String>> =
            (indices.iter()).map(|&(s, r)| each[s][r].clone()).collect();
        assert_eq!(strings(gathered.column(1).as_ref()), expected);
        assert!(dictionary_len(gathered.column(1).as_ref()) <= 128);

        let plain = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let plain_batches: Vec<RecordBatch> =
            batches.iter().map(|b| b.project(&[0]).unwrap()).collect();
        assert_eq!(
            concat_batches(&plain, &plain_batches).unwrap(),
            arrow_select::concat::concat_batches(&plain, &plain_batches).unwrap()
        );
        assert_eq!(concat_batches(&schema, []).unwrap().num_rows(), 0);
    }

    #[test]
    fn narrow_types_are_found_and_widened_in_containers() {
        let d8 = DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8));
        let d32 = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        let list = |t: DataType| DataType::List(Arc::new(Field::new("item", t, true)));
        assert!(has_narrow_dictionary(&d8));
        assert!(!has_narrow_dictionary(&d32));
        assert!(has_narrow_dictionary(&list(d8.clone())));
        assert!(!has_narrow_dictionary(&list(DataType::Utf8)));
        assert_eq!(widened(&list(d8.clone())), list(d32.clone()));
        assert_eq!(plain(&list(d8)), list(DataType::Utf8));
    }
}

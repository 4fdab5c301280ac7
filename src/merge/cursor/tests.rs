//! Tests of the cursors: ranking, galloping, order checks, prefix narrowing.

use std::sync::Arc;

use arrow_array::{Int32Array, RecordBatch, StringArray, UInt8Array};
use arrow_schema::{Field, Schema};

use super::primitive::OrderBits;
use super::*;
use crate::error::Error;
use crate::key::KeyColumn;
use crate::key::first_unordered;
use crate::merge::testing::{int_key, int_rows, keyed};
use crate::runs::KeyedBatch;
use crate::runs::Run;
use arrow_array::BinaryArray;

/// The rows of `batch` as a cursor meets them: a range in the middle of shared rows (the
/// batch three times over), so that every cursor reads at an offset.
fn shared(batch: &KeyedBatch) -> Run {
    let rows = KeyedBatch::concat(&[batch.clone(), batch.clone(), batch.clone()]).unwrap();
    let rows = crate::runs::Rows::new(rows, None).unwrap();
    Run::range(&rows, batch.num_rows(), batch.num_rows()).unwrap()
}

/// A cursor of type `C` on `batch`, moved to `row`.
fn at<C: Cursor>(config: &C::Config, batch: &KeyedBatch, row: usize) -> C {
    let mut cursor = C::open(config, &shared(batch)).unwrap();
    cursor.advance(row);
    cursor
}

/// With `a` as input 0 and `b` as input 1, for every pair of heads: `C` ranks them like
/// `(encoded key, input)`, and counts the rows of `a` before `b`'s head likewise; an
/// exhausted input loses to a live one. Both batches are admitted to `config` first.
fn agrees_with_keys<C: Cursor>(config: &C::Config, a: &KeyedBatch, b: &KeyedBatch) {
    let mut config = config.clone();
    C::admit(&mut config, &shared(a));
    C::admit(&mut config, &shared(b));
    let config = &config;
    for ra in 0..a.num_rows() {
        for rb in 0..b.num_rows() {
            let cursors = [Some(at::<C>(config, a, ra)), Some(at::<C>(config, b, rb))];
            let [Some(ca), Some(cb)] = &cursors else {
                unreachable!()
            };
            let (ea, eb) = (ca.entry(0), cb.entry(1));
            let bound = (b.keys.value(rb), 1);
            let expected = (a.keys.value(ra), 0) < bound;
            assert_eq!(C::beats(ea, eb, &cursors), expected, "rows {ra} {rb}");
            assert_eq!(C::beats(eb, ea, &cursors), !expected, "rows {ra} {rb}");
            assert_eq!((ea.input(), eb.input()), (0, 1));
            assert!(!ea.is_exhausted());
            for max in [1, 2, 3, 100] {
                let before = (ra..a.num_rows())
                    .take(max)
                    .take_while(|&r| (a.keys.value(r), 0) < bound)
                    .count();
                if expected {
                    assert_eq!(ca.rows_before(0, eb, max, &cursors), before);
                }
            }
        }
    }
    let cursors = [Some(C::open(config, &shared(a)).unwrap()), None];
    let (live, done) = (
        cursors[0].as_ref().unwrap().entry(0),
        KeyEntry::exhausted(1),
    );
    assert!(C::beats(live, done, &cursors) && !C::beats(done, live, &cursors));
    assert!(done.is_exhausted() && done.input() == 1);
    let rows = a.num_rows();
    assert_eq!(
        cursors[0]
            .as_ref()
            .unwrap()
            .rows_before(0, done, 100, &cursors),
        rows
    );
}

#[test]
fn primitive_entries_rank_by_exhaustion_then_key_then_input() {
    let config = |descending| PrimitiveConfig {
        column: 0,
        descending,
    };
    let pk = int_key(false);
    let keys = [i64::MIN, -1, 0, 1, i64::MAX];
    let batch = int_rows(&pk, &keys);
    let last = (1 << 63) - 1;
    for descending in [false, true] {
        let mut entries = Vec::new();
        for input in [0, 1, last] {
            for (row, &key) in keys.iter().enumerate() {
                let cursor = at::<I64Cursor>(&config(descending), &batch, row);
                entries.push((cursor.entry(input), (false, key, input)));
            }
            entries.push((KeyEntry::exhausted(input), (true, 0, input)));
        }
        // Sorting the entries sorts by (exhausted, key in key order, input).
        entries.sort_by_key(|&(entry, _)| entry.rank());
        let got: Vec<_> = entries.iter().map(|&(_, unpacked)| unpacked).collect();
        let mut expected = got.clone();
        expected.sort_by(|a, b| {
            let key = if descending {
                b.1.cmp(&a.1)
            } else {
                a.1.cmp(&b.1)
            };
            a.0.cmp(&b.0).then(key).then(a.2.cmp(&b.2))
        });
        assert_eq!(got, expected, "descending {descending}");
        for (entry, (exhausted, _, input)) in entries {
            assert_eq!(entry.input(), input);
            assert_eq!(entry.is_exhausted(), exhausted);
        }
    }
    // Narrow types map through the same bits: the order of every i8 and u8.
    let i8s: Vec<u64> = (i8::MIN..=i8::MAX).map(OrderBits::order_bits).collect();
    let u8s: Vec<u64> = (u8::MIN..=u8::MAX).map(OrderBits::order_bits).collect();
    for bits in [i8s, u8s] {
        assert!(bits.windows(2).all(|w| w[0] < w[1]));
    }
}

#[test]
fn kind_is_primitive_only_for_one_non_null_integer_column() {
    assert!(matches!(
        CursorKind::for_key(&int_key(false)),
        CursorKind::Primitive {
            column: 0,
            descending: false,
            ..
        }
    ));
    assert_eq!(CursorKind::for_key(&int_key(true)), CursorKind::Rows);
    let schema = Schema::new(vec![
        Field::new("s", DataType::Utf8, false),
        Field::new("i", DataType::Int32, false),
    ]);
    let by_s = PrimaryKey::new(&schema, vec![KeyColumn::asc("s")]).unwrap();
    assert_eq!(CursorKind::for_key(&by_s), CursorKind::Rows);
    let both = PrimaryKey::new(&schema, vec![KeyColumn::asc("i"), KeyColumn::asc("s")]);
    assert_eq!(CursorKind::for_key(&both.unwrap()), CursorKind::Rows);
    let i_desc = PrimaryKey::new(&schema, vec![KeyColumn::desc("i")]).unwrap();
    assert_eq!(
        CursorKind::for_key(&i_desc),
        CursorKind::Primitive {
            column: 1,
            data_type: DataType::Int32,
            descending: true
        }
    );
}

#[test]
fn primitive_and_row_cursors_agree_with_encoded_keys() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("s", DataType::Utf8, false),
        Field::new("i", DataType::Int32, false),
    ]));
    // Each batch in key order, as inputs are: the values reversed when descending.
    let batch = |mut i: Vec<i32>, descending: bool| {
        if descending {
            i.reverse();
        }
        let s = StringArray::from(vec!["x"; i.len()]);
        RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(s), Arc::new(Int32Array::from(i))],
        )
        .unwrap()
    };
    for descending in [false, true] {
        let column = if descending {
            KeyColumn::desc("i")
        } else {
            KeyColumn::asc("i")
        };
        let pk = PrimaryKey::new(&schema, vec![column]).unwrap();
        let a = keyed(&pk, batch(vec![i32::MIN, -3, 0, 7], descending));
        let b = keyed(&pk, batch(vec![-3, 1, 7, i32::MAX], descending));
        let config = PrimitiveConfig {
            column: 1,
            descending,
        };
        agrees_with_keys::<I32Cursor>(&config, &a, &b);
        agrees_with_keys::<RowCursor>(&RowConfig::default(), &a, &b);
    }
}

/// Keys as raw bytes, for the row cursor (which never looks at the table rows).
fn raw_keys(keys: &[&[u8]]) -> KeyedBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("i", DataType::Int32, false)]));
    let rows = Int32Array::from_iter_values(0..keys.len() as i32);
    KeyedBatch {
        batch: RecordBatch::try_new(schema, vec![Arc::new(rows)]).unwrap(),
        keys: BinaryArray::from(keys.to_vec()),
    }
}

/// Every pair of heads of inputs `0..n` (one per batch, all admitted to one config),
/// exhausted inputs `n..n + 2` included, ranks like `(exhausted, key bytes, input)`;
/// and `rows_before` counts like the bytes do.
fn row_entries_agree_with_bytes(batches: &[KeyedBatch]) {
    let mut config = RowConfig::default();
    for batch in batches {
        RowCursor::admit(&mut config, &shared(batch));
    }
    // (cursors, the unpacked rank of each input's head)
    let heads = |rows: &[usize]| {
        let mut cursors: Vec<Option<RowCursor>> = (batches.iter().zip(rows))
            .map(|(b, &r)| Some(at::<RowCursor>(&config, b, r)))
            .collect();
        cursors.extend([None, None]);
        cursors
    };
    let rank = |batch: Option<&KeyedBatch>, row: usize, input: usize| match batch {
        Some(b) => (false, b.keys.value(row).to_vec(), input),
        None => (true, Vec::new(), input),
    };
    let n = batches.len();
    for first in 0..n {
        for row in 0..batches[first].num_rows() {
            // Input `first` at `row`, every other input at each of its rows in turn.
            for other in 0..n + 2 {
                let other_rows = batches.get(other).map_or(1, KeyedBatch::num_rows);
                for other_row in 0..other_rows {
                    if other == first {
                        continue;
                    }
                    let mut rows = vec![0; n];
                    rows[first] = row;
                    if other < n {
                        rows[other] = other_row;
                    }
                    let cursors = heads(&rows);
                    let entry = |i: usize| match &cursors[i] {
                        Some(c) => c.entry(i),
                        None => KeyEntry::exhausted(i),
                    };
                    let (a, b) = (entry(first), entry(other));
                    let ra = rank(Some(&batches[first]), row, first);
                    let rb = rank(batches.get(other), other_row, other);
                    let what = format!("{ra:?} vs {rb:?}, skip {}", config.skip);
                    assert_eq!(RowCursor::beats(a, b, &cursors), ra < rb, "{what}");
                    assert_eq!(RowCursor::beats(b, a, &cursors), rb < ra, "{what}");
                    assert_eq!(b.is_exhausted(), other >= n);
                    assert_eq!((a.input(), b.input()), (first, other));
                    if ra < rb {
                        let head = cursors[first].as_ref().unwrap();
                        let before = (row..batches[first].num_rows())
                            .take_while(|&r| rank(Some(&batches[first]), r, first) < rb)
                            .count();
                        assert_eq!(head.rows_before(first, b, 100, &cursors), before, "{what}");
                    }
                }
            }
        }
    }
}

#[test]
fn row_prefix_entries_rank_like_the_bytes() {
    // Shorter than 8 bytes, prefixes of each other, zero tails that pad like the
    // padding, equal 8-byte prefixes with different tails, all-0xFF prefixes.
    let a: &[&[u8]] = &[
        b"",
        b"\0",
        b"\0\0\0\0\0\0\0\0",
        b"\0\0\0\0\0\0\0\0\0",
        b"\x01",
    ];
    let b: &[&[u8]] = &[
        b"\0\0",
        b"\x01\x02\x03\x04\x05\x06\x07\x08",
        b"\x01\x02\x03\x04\x05\x06\x07\x08\x00",
        b"\x01\x02\x03\x04\x05\x06\x07\x08\x09",
        b"\x01\x02\x03\x04\x05\x06\x07\x08\x0a\x00",
    ];
    let c: &[&[u8]] = &[
        b"\x01\x02\x03\x04\x05\x06\x07\x08\x09",
        b"\x01\x02\x03\x04\x05\x06\x07\x09",
        b"\xff\xff\xff\xff\xff\xff\xff\xff",
        b"\xff\xff\xff\xff\xff\xff\xff\xff\x00",
    ];
    row_entries_agree_with_bytes(&[raw_keys(a), raw_keys(b), raw_keys(c)]);
    // Keys sharing leading bytes, so the prefixes skip them: with and without a batch
    // that narrows the skip.
    let d: &[&[u8]] = &[
        b"\x07\x07\x07\x00",
        b"\x07\x07\x07\x01\x02\x03\x04\x05\x06\x07\x08\x09",
    ];
    let e: &[&[u8]] = &[
        b"\x07\x07\x07\x01\x02\x03\x04\x05\x06\x07\x08",
        b"\x07\x07\x07\x02",
    ];
    let f: &[&[u8]] = &[
        b"\x07\x07\x06",
        b"\x07\x07\x07\x01\x02\x03\x04\x05\x06\x07\x08\x08",
    ];
    row_entries_agree_with_bytes(&[raw_keys(d), raw_keys(e)]);
    row_entries_agree_with_bytes(&[raw_keys(d), raw_keys(e), raw_keys(f)]);
}

#[test]
fn row_prefix_entries_rank_composite_keys_with_nulls_and_descending_columns() {
    // (s Utf8 asc, i Int32 desc, nulls largest), and (i Int32 desc nulls first, s asc):
    // many heads share their first 8 bytes.
    let schema = Arc::new(Schema::new(vec![
        Field::new("s", DataType::Utf8, true),
        Field::new("i", DataType::Int32, true),
    ]));
    let rows = |s: Vec<Option<&str>>, i: Vec<Option<i32>>| {
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(s)),
                Arc::new(Int32Array::from(i)),
            ],
        )
        .unwrap()
    };
    let orders = [
        vec![KeyColumn::asc("s"), KeyColumn::desc("i")],
        vec![
            KeyColumn::desc("i").with_nulls_first(true),
            KeyColumn::asc("s"),
        ],
    ];
    for columns in orders {
        let pk = PrimaryKey::new(&schema, columns).unwrap();
        let sorted = |batch: RecordBatch| {
            let keys = pk.encode(&batch).unwrap();
            let mut order: Vec<u32> = (0..batch.num_rows() as u32).collect();
            order.sort_by_key(|&r| keys.value(r as usize).to_vec());
            let batch = arrow_select::take::take_record_batch(
                &batch,
                &arrow_array::UInt32Array::from(order),
            );
            keyed(&pk, batch.unwrap())
        };
        let long = "a long string past eight bytes";
        let a = sorted(rows(
            vec![None, Some(""), Some("a"), Some(long), Some("a"), None],
            vec![Some(1), Some(1), None, Some(2), Some(-7), None],
        ));
        let b = sorted(rows(
            vec![Some("a"), Some(long), Some("b"), None, Some("")],
            vec![Some(1), None, Some(3), Some(1), None],
        ));
        row_entries_agree_with_bytes(&[a, b]);
    }
}

#[test]
fn the_skip_shrinks_to_the_bytes_every_admitted_key_shares() {
    let mut config = RowConfig::default();
    assert!(!config.admit(b"abcx", b"abcy"));
    assert_eq!(config.skip, 3);
    // Inside the shared bytes: nothing changes. A single key keeps them too.
    assert!(!config.admit(b"abca", b"abcz"));
    assert!(!config.admit(b"abc", b"abc"));
    assert_eq!(config.skip, 3);
    // A batch whose own keys share less, or that starts elsewhere: entries are stale.
    assert!(config.admit(b"abd", b"abz"));
    assert_eq!(config.skip, 2);
    assert!(config.admit(b"b", b"b"));
    assert_eq!(config.skip, 0);
    assert!(!config.admit(b"", b"c"));
}

#[test]
fn gallop_finds_the_end_of_every_prefix() {
    for n in 1..40 {
        for end in 1..=n {
            assert_eq!(gallop(n, |i| i < end), end, "n {n} end {end}");
        }
    }
    assert_eq!(gallop(0, |_| unreachable!()), 0);
}

#[test]
fn the_primitive_order_check_agrees_with_the_encoded_keys() {
    let schema = Arc::new(Schema::new(vec![Field::new("i", DataType::Int32, false)]));
    let cases: [&[i32]; 6] = [
        &[],
        &[5],
        &[i32::MIN, -1, 0, 1, i32::MAX],
        &[1, 2, 2, 3],
        &[3, 2, 1, 0, -1],
        &[-4, 7, 9, -2, 10],
    ];
    for values in cases {
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int32Array::from(values.to_vec()))],
        )
        .unwrap();
        for descending in [false, true] {
            let column = if descending {
                KeyColumn::desc("i")
            } else {
                KeyColumn::asc("i")
            };
            let pk = PrimaryKey::new(&schema, vec![column]).unwrap();
            let batch = keyed(&pk, batch.clone());
            let config = PrimitiveConfig {
                column: 0,
                descending,
            };
            let expected = first_unordered(&batch.keys);
            if batch.is_empty() {
                continue;
            }
            let run = shared(&batch);
            assert_eq!(I32Cursor::first_unordered(&config, &run), expected);
            // Not the expected column type: falls back to the encoded keys.
            assert_eq!(I64Cursor::first_unordered(&config, &run), expected);
        }
    }
}

#[test]
fn a_primitive_cursor_rejects_a_wrong_type_or_nulls() {
    let pk = int_key(false);
    let rows = int_rows(&pk, &[1, 2]);
    let wrong_type = PrimitiveConfig {
        column: 1,
        descending: false,
    };
    assert!(matches!(
        I64Cursor::open(&wrong_type, &shared(&rows)),
        Err(Error::SchemaMismatch { .. })
    ));
    let out_of_range = PrimitiveConfig {
        column: 5,
        descending: false,
    };
    assert!(I64Cursor::open(&out_of_range, &shared(&rows)).is_err());
    let nullable = int_key(true);
    let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::UInt8, true)]));
    let with_null = RecordBatch::try_new(
        schema,
        vec![Arc::new(UInt8Array::from(vec![Some(1), None]))],
    )
    .unwrap();
    let with_null = KeyedBatch {
        keys: nullable
            .encode(&int_rows(&nullable, &[1, 2]).batch)
            .unwrap(),
        batch: with_null,
    };
    let config = PrimitiveConfig {
        column: 0,
        descending: false,
    };
    assert!(matches!(
        U8Cursor::open(&config, &shared(&with_null)),
        Err(Error::SchemaMismatch { .. })
    ));
}

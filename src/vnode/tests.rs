//! Tests of the vnode hash (pinned vectors, the vectorized path against the per-row
//! reference) and of the vnode types.

use std::sync::Arc;

use arrow_array::builder::{ListBuilder, StringDictionaryBuilder};
use arrow_array::types::Int32Type;
use arrow_array::{
    BinaryArray, BinaryViewArray, BooleanArray, Date32Array, Date64Array, Decimal128Array,
    DurationMicrosecondArray, DurationMillisecondArray, DurationNanosecondArray,
    DurationSecondArray, Float32Array, Float64Array, Int8Array, Int16Array, Int32Array, Int64Array,
    LargeBinaryArray, LargeStringArray, NullArray, StringArray, StringViewArray,
    Time32MillisecondArray, Time32SecondArray, Time64MicrosecondArray, Time64NanosecondArray,
    TimestampMicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray,
    TimestampSecondArray, UInt8Array, UInt16Array, UInt32Array, UInt64Array, make_array,
    new_null_array,
};
use arrow_buffer::{Buffer, NullBuffer};
use arrow_data::ArrayData;
use arrow_schema::{Field, IntervalUnit};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::strategy::Union;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};

use arrow_array::{Array, ArrayRef};

use super::hash::*;
use super::*;

// ----- helpers -------------------------------------------------------------------------

fn arc(array: impl Array + 'static) -> ArrayRef {
    Arc::new(array)
}

/// A `Float16` array from raw bits (so NaN payloads and -0.0 are exact).
fn f16_array(bits: &[Option<u16>]) -> ArrayRef {
    let values: Vec<u16> = bits.iter().map(|b| b.unwrap_or(0)).collect();
    let nulls = NullBuffer::from(bits.iter().map(Option::is_some).collect::<Vec<_>>());
    let data = ArrayData::builder(DataType::Float16)
        .len(bits.len())
        .add_buffer(Buffer::from_vec(values))
        .nulls(Some(nulls))
        .build()
        .unwrap();
    make_array(data)
}

/// The vectorized CRCs and vnodes, checked row by row against the per-row reference.
fn check_differential(columns: &[ArrayRef], num_rows: usize, count: VnodeCount) {
    let crcs = hash_rows(columns, num_rows).unwrap();
    let vnodes = compute_vnodes(columns, num_rows, count).unwrap();
    assert_eq!(crcs.len(), num_rows);
    assert_eq!(vnodes.len(), num_rows);
    for row in 0..num_rows {
        assert_eq!(
            crcs[row],
            hash_row(columns, row).unwrap(),
            "crc of row {row}"
        );
        assert_eq!(
            vnodes[row],
            vnode_of_row(columns, row, count).unwrap(),
            "vnode of row {row}"
        );
        assert!(vnodes[row].index() < count.get());
    }
}

/// The CRC and vnode (of 256) of a one-row batch, after checking both paths agree.
fn hash_one(columns: &[ArrayRef]) -> (u32, u16) {
    check_differential(columns, 1, VnodeCount::DEFAULT);
    let crc = hash_rows(columns, 1).unwrap()[0];
    let vnode = compute_vnodes(columns, 1, VnodeCount::DEFAULT).unwrap()[0];
    (crc, vnode.get())
}

// ----- pinned test vectors (the persisted contract: never edit these) -----------------

#[test]
fn pinned_int64_one() {
    assert_eq!(crc32fast::hash(&[1, 0, 0, 0, 0, 0, 0, 0]), 0xA988_DFF7);
    let key = arc(Int64Array::from(vec![1]));
    assert_eq!(hash_one(&[key]), (0xA988_DFF7, 247));
}

#[test]
fn pinned_utf8_abc() {
    assert_eq!(crc32fast::hash(b"abc\xFF"), 0x8A5F_87DD);
    for key in [
        arc(StringArray::from(vec!["abc"])),
        arc(LargeStringArray::from(vec!["abc"])),
        arc(StringViewArray::from(vec!["abc"])),
        arc(BinaryArray::from(vec![b"abc".as_slice()])),
        arc(LargeBinaryArray::from(vec![b"abc".as_slice()])),
        arc(BinaryViewArray::from(vec![b"abc".as_slice()])),
    ] {
        assert_eq!(hash_one(&[key]), (0x8A5F_87DD, 221));
    }
}

#[test]
fn pinned_null_of_any_type() {
    assert_eq!(crc32fast::hash(&[0xF0, 0xFF, 0xFF, 0xFF]), 0xA79C_EFA9);
    for key in [
        arc(Int64Array::from(vec![None])),
        arc(StringArray::from(vec![None::<&str>])),
        arc(BooleanArray::from(vec![None])),
        arc(NullArray::new(1)),
        f16_array(&[None]),
    ] {
        assert_eq!(hash_one(&[key]), (0xA79C_EFA9, 169));
    }
}

#[test]
fn pinned_multi_column() {
    // (Int64 1, Utf8 "abc")
    let bytes = [1, 0, 0, 0, 0, 0, 0, 0, b'a', b'b', b'c', 0xFF];
    assert_eq!(crc32fast::hash(&bytes), 0x4B6B_D2C1);
    let columns = [
        arc(Int64Array::from(vec![1])),
        arc(StringArray::from(vec!["abc"])),
    ];
    assert_eq!(hash_one(&columns), (0x4B6B_D2C1, 193));

    // (Utf8 "abc", Int32 -7)
    let bytes = [b'a', b'b', b'c', 0xFF, 0xF9, 0xFF, 0xFF, 0xFF];
    assert_eq!(crc32fast::hash(&bytes), 0xDA9E_E7C7);
    let columns = [
        arc(StringArray::from(vec!["abc"])),
        arc(Int32Array::from(vec![-7])),
    ];
    assert_eq!(hash_one(&columns), (0xDA9E_E7C7, 199));

    // (Boolean true, Int32 NULL, Float64 1.5, Decimal128 12345)
    let mut bytes = vec![1, 0xF0, 0xFF, 0xFF, 0xFF];
    bytes.extend_from_slice(&1.5f64.to_le_bytes());
    bytes.extend_from_slice(&12345i128.to_le_bytes());
    assert_eq!(crc32fast::hash(&bytes), 0x719C_21D4);
    let columns = [
        arc(BooleanArray::from(vec![true])),
        arc(Int32Array::from(vec![None])),
        arc(Float64Array::from(vec![1.5])),
        arc(Decimal128Array::from(vec![12345])
            .with_precision_and_scale(10, 2)
            .unwrap()),
    ];
    assert_eq!(hash_one(&columns), (0x719C_21D4, 212));
}

#[test]
fn pinned_vnode_of_a_non_power_of_two_count() {
    let key = arc(Int64Array::from(vec![1]));
    let count = VnodeCount::new(1000).unwrap();
    assert_eq!(
        compute_vnodes(std::slice::from_ref(&key), 1, count).unwrap()[0].get(),
        735
    );
    assert_eq!(vnode_of_row(&[key], 0, count).unwrap().get(), 735);
}

// ----- floats ----------------------------------------------------------------------------

fn all_equal(crcs: &[u32]) -> bool {
    crcs.windows(2).all(|w| w[0] == w[1])
}

#[test]
fn negative_zero_hashes_as_zero_and_every_nan_alike() {
    let nan64 = [
        f64::NAN,
        -f64::NAN,
        f64::from_bits(0x7FF0_0000_0000_0001), // signalling
        f64::from_bits(0xFFF8_0000_DEAD_BEEF),
    ];
    let zeros = arc(Float64Array::from(vec![0.0, -0.0]));
    let nans = arc(Float64Array::from(nan64.to_vec()));
    assert!(all_equal(
        &hash_rows(std::slice::from_ref(&zeros), 2).unwrap()
    ));
    assert!(all_equal(
        &hash_rows(std::slice::from_ref(&nans), 4).unwrap()
    ));
    check_differential(&[zeros], 2, VnodeCount::DEFAULT);
    check_differential(std::slice::from_ref(&nans), 4, VnodeCount::DEFAULT);
    assert_eq!(
        hash_rows(&[nans], 4).unwrap()[0],
        crc32fast::hash(&f64::NAN.to_le_bytes())
    );

    let zeros = arc(Float32Array::from(vec![0.0, -0.0]));
    let nans = arc(Float32Array::from(vec![
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7F80_0001),
        f32::from_bits(0xFFC0_1234),
    ]));
    assert!(all_equal(
        &hash_rows(std::slice::from_ref(&zeros), 2).unwrap()
    ));
    assert!(all_equal(
        &hash_rows(std::slice::from_ref(&nans), 4).unwrap()
    ));
    check_differential(&[zeros], 2, VnodeCount::DEFAULT);
    check_differential(std::slice::from_ref(&nans), 4, VnodeCount::DEFAULT);
    assert_eq!(
        hash_rows(&[nans], 4).unwrap()[0],
        crc32fast::hash(&f32::NAN.to_le_bytes())
    );

    let zeros = f16_array(&[Some(0x0000), Some(0x8000)]);
    let nans = f16_array(&[Some(0x7E00), Some(0xFE00), Some(0x7C01), Some(0xFFFF)]);
    assert!(all_equal(
        &hash_rows(std::slice::from_ref(&zeros), 2).unwrap()
    ));
    assert!(all_equal(
        &hash_rows(std::slice::from_ref(&nans), 4).unwrap()
    ));
    check_differential(&[zeros], 2, VnodeCount::DEFAULT);
    check_differential(std::slice::from_ref(&nans), 4, VnodeCount::DEFAULT);
    assert_eq!(
        hash_rows(&[nans], 4).unwrap()[0],
        crc32fast::hash(&[0x00, 0x7E])
    );

    // Infinities and ordinary values are not canonicalized.
    let others = arc(Float64Array::from(vec![
        f64::INFINITY,
        f64::NEG_INFINITY,
        -1.0,
    ]));
    let crcs = hash_rows(&[others], 3).unwrap();
    assert_eq!(crcs[2], crc32fast::hash(&(-1.0f64).to_le_bytes()));
    assert_ne!(crcs[0], crcs[1]);
}

// ----- the CRC engine and the reducer -----------------------------------------------------

#[test]
fn crc_engine_matches_crc32fast() {
    let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + i / 5) as u8).collect();
    for len in 0..data.len() {
        let bytes = &data[..len];
        assert_eq!(
            finalize(feed_bytes(CRC_INIT, bytes)),
            crc32fast::hash(bytes)
        );
    }
    let v = 0x0123_4567_89AB_CDEF_FEDC_BA98_7654_3210u128;
    let check = |crc: u32, bytes: &[u8]| assert_eq!(finalize(crc), crc32fast::hash(bytes));
    check(feed_u8(CRC_INIT, v as u8), &(v as u8).to_le_bytes());
    check(feed_u16(CRC_INIT, v as u16), &(v as u16).to_le_bytes());
    check(feed_u32(CRC_INIT, v as u32), &(v as u32).to_le_bytes());
    check(feed_u64(CRC_INIT, v as u64), &(v as u64).to_le_bytes());
    check(feed_u128(CRC_INIT, v), &v.to_le_bytes());
}

// ----- the differential property test ---------------------------------------------------

fn proptest_config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        rng_seed: RngSeed::Fixed(0x7A3E_11D0_5EED_0001),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn f64_value() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => any::<f64>(),
        1 => prop::sample::select(vec![
            0.0,
            -0.0,
            f64::NAN,
            -f64::NAN,
            f64::from_bits(0x7FF0_0000_0000_0001),
            f64::INFINITY,
            f64::NEG_INFINITY,
        ]),
    ]
}

fn f32_value() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => any::<f32>(),
        1 => prop::sample::select(vec![0.0, -0.0, f32::NAN, -f32::NAN, f32::from_bits(0x7F80_0001)]),
    ]
}

/// One column of `len` rows of a random supported type, about one value in five NULL.
fn column(len: usize) -> BoxedStrategy<ArrayRef> {
    fn values<T: fmt::Debug + Clone + 'static>(
        s: impl Strategy<Value = T> + 'static,
        len: usize,
    ) -> impl Strategy<Value = Vec<Option<T>>> {
        vec(option::weighted(0.8, s), len)
    }
    fn strings(v: Vec<Option<String>>) -> Vec<ArrayRef> {
        let refs: Vec<Option<&str>> = v.iter().map(Option::as_deref).collect();
        vec![
            arc(StringArray::from(refs.clone())),
            arc(LargeStringArray::from(refs.clone())),
            arc(StringViewArray::from(refs)),
        ]
    }
    fn binaries(v: Vec<Option<Vec<u8>>>) -> Vec<ArrayRef> {
        let refs: Vec<Option<&[u8]>> = v.iter().map(Option::as_deref).collect();
        vec![
            arc(BinaryArray::from(refs.clone())),
            arc(LargeBinaryArray::from(refs.clone())),
            arc(BinaryViewArray::from(refs)),
        ]
    }
    /// Picks one of several array kinds built from the same values.
    fn pick(s: impl Strategy<Value = Vec<ArrayRef>> + 'static) -> BoxedStrategy<ArrayRef> {
        (s, any::<prop::sample::Index>())
            .prop_map(|(arrays, i)| arrays[i.index(arrays.len())].clone())
            .boxed()
    }
    let arms: Vec<BoxedStrategy<ArrayRef>> = vec![
        Just(arc(NullArray::new(len))).boxed(),
        values(any::<bool>(), len)
            .prop_map(|v| arc(BooleanArray::from(v)))
            .boxed(),
        pick(values(any::<i8>(), len).prop_map(|v| {
            vec![
                arc(Int8Array::from(v.clone())),
                arc(UInt8Array::from(
                    v.iter().map(|x| x.map(|x| x as u8)).collect::<Vec<_>>(),
                )),
            ]
        })),
        pick(values(any::<i16>(), len).prop_map(|v| {
            vec![
                arc(Int16Array::from(v.clone())),
                arc(UInt16Array::from(
                    v.iter().map(|x| x.map(|x| x as u16)).collect::<Vec<_>>(),
                )),
            ]
        })),
        values(any::<u16>(), len)
            .prop_map(|v| f16_array(&v))
            .boxed(),
        pick(values(any::<i32>(), len).prop_map(|v| {
            vec![
                arc(Int32Array::from(v.clone())),
                arc(UInt32Array::from(
                    v.iter().map(|x| x.map(|x| x as u32)).collect::<Vec<_>>(),
                )),
                arc(Date32Array::from(v.clone())),
                arc(Time32SecondArray::from(v.clone())),
                arc(Time32MillisecondArray::from(v)),
            ]
        })),
        pick(values(any::<i64>(), len).prop_map(|v| {
            vec![
                arc(Int64Array::from(v.clone())),
                arc(UInt64Array::from(
                    v.iter().map(|x| x.map(|x| x as u64)).collect::<Vec<_>>(),
                )),
                arc(Date64Array::from(v.clone())),
                arc(Time64MicrosecondArray::from(v.clone())),
                arc(Time64NanosecondArray::from(v.clone())),
                arc(TimestampSecondArray::from(v.clone())),
                arc(TimestampMillisecondArray::from(v.clone()).with_timezone("+01:00")),
                arc(TimestampMicrosecondArray::from(v.clone()).with_timezone("UTC")),
                arc(TimestampNanosecondArray::from(v.clone())),
                arc(DurationSecondArray::from(v.clone())),
                arc(DurationMillisecondArray::from(v.clone())),
                arc(DurationMicrosecondArray::from(v.clone())),
                arc(DurationNanosecondArray::from(v)),
            ]
        })),
        values(any::<i128>(), len)
            .prop_map(|v| {
                arc(Decimal128Array::from(v)
                    .with_precision_and_scale(38, 4)
                    .unwrap())
            })
            .boxed(),
        values(f32_value(), len)
            .prop_map(|v| arc(Float32Array::from(v)))
            .boxed(),
        values(f64_value(), len)
            .prop_map(|v| arc(Float64Array::from(v)))
            .boxed(),
        // Up to 30 bytes so that views are both inline (<= 12 bytes) and out of line.
        pick(values("\\PC{0,30}", len).prop_map(strings)),
        pick(values(vec(any::<u8>(), 0..30), len).prop_map(binaries)),
    ];
    Union::new(arms).boxed()
}

/// Random key columns (0 to 3), all sliced by the same random offset, and a vnode count.
fn batch() -> impl Strategy<Value = (Vec<ArrayRef>, usize, VnodeCount)> {
    let counts = vec![1usize, 3, 7, 100, 256, 1000, 4096, 32767, 32768];
    (
        0usize..70,
        0usize..5,
        0usize..4,
        prop::sample::select(counts),
    )
        .prop_flat_map(|(len, offset, width, count)| {
            (
                vec(column(len + offset), width),
                Just(len),
                Just(offset),
                Just(count),
            )
        })
        .prop_map(|(columns, len, offset, count)| {
            let columns = columns.iter().map(|c| c.slice(offset, len)).collect();
            (columns, len, VnodeCount::new(count).unwrap())
        })
}

proptest! {
    #![proptest_config(proptest_config())]

    /// Differential: the vectorized path equals the crc32fast per-row reference.
    #[test]
    fn vectorized_equals_per_row((columns, num_rows, count) in batch()) {
        check_differential(&columns, num_rows, count);
    }

    /// Differential: the multiply-based remainder equals `%`.
    #[test]
    fn reducer_equals_modulo(crc in any::<u32>(), count in 1usize..=VnodeCount::MAX) {
        let count = VnodeCount::new(count).unwrap();
        let expected = crc % count.get() as u32;
        prop_assert_eq!(u32::from(Reducer::new(count).reduce(crc).get()), expected);
    }
}

#[test]
fn reducer_edge_cases() {
    for count in [1, 2, 3, 255, 256, 257, 1000, 32767, 32768] {
        let reducer = Reducer::new(VnodeCount::new(count).unwrap());
        for crc in [0, 1, 2, 0x7FFF_FFFF, 0x8000_0000, u32::MAX - 1, u32::MAX] {
            assert_eq!(u32::from(reducer.reduce(crc).get()), crc % count as u32);
        }
    }
}

#[test]
fn every_supported_type_with_nulls_and_offsets() {
    let ints = vec![Some(-3i64), None, Some(i64::MAX), Some(0), None, Some(42)];
    let i32s: Vec<Option<i32>> = ints.iter().map(|v| v.map(|v| v as i32)).collect();
    let columns: Vec<ArrayRef> = vec![
        arc(NullArray::new(6)),
        arc(BooleanArray::from(vec![
            Some(true),
            None,
            Some(false),
            Some(true),
            None,
            Some(false),
        ])),
        arc(Int8Array::from(
            ints.iter().map(|v| v.map(|v| v as i8)).collect::<Vec<_>>(),
        )),
        arc(UInt64Array::from(
            ints.iter().map(|v| v.map(|v| v as u64)).collect::<Vec<_>>(),
        )),
        f16_array(&[
            Some(0x3C00),
            None,
            Some(0x8000),
            Some(0x7E01),
            None,
            Some(0xBC00),
        ]),
        arc(Float32Array::from(vec![
            Some(1.0),
            None,
            Some(-0.0),
            Some(f32::NAN),
            None,
            Some(2.5),
        ])),
        arc(Float64Array::from(vec![
            Some(1.0),
            None,
            Some(-0.0),
            Some(f64::NAN),
            None,
            Some(2.5),
        ])),
        arc(StringArray::from(vec![
            Some(""),
            None,
            Some("a"),
            Some("longer than twelve"),
            None,
            Some("z"),
        ])),
        arc(StringViewArray::from(vec![
            Some(""),
            None,
            Some("a"),
            Some("longer than twelve"),
            None,
            Some("z"),
        ])),
        arc(BinaryViewArray::from(vec![
            Some(b"".as_slice()),
            None,
            Some(b"\xFF"),
            Some(b"0123456789abcdef"),
            None,
            Some(b"z"),
        ])),
        arc(Date32Array::from(i32s.clone())),
        arc(Time32MillisecondArray::from(i32s)),
        arc(TimestampNanosecondArray::from(ints.clone()).with_timezone("Europe/Paris")),
        arc(DurationMicrosecondArray::from(ints.clone())),
        arc(
            Decimal128Array::from(ints.iter().map(|v| v.map(i128::from)).collect::<Vec<_>>())
                .with_precision_and_scale(20, 3)
                .unwrap(),
        ),
    ];
    for column in &columns {
        check_hashable("c", column.data_type()).unwrap();
    }
    check_differential(&columns, 6, VnodeCount::DEFAULT);
    for column in &columns {
        check_differential(std::slice::from_ref(column), 6, VnodeCount::new(7).unwrap());
    }
    // Sliced arrays (nonzero offsets, the null bitmap sliced too).
    let sliced: Vec<ArrayRef> = columns.iter().map(|c| c.slice(1, 4)).collect();
    check_differential(&sliced, 4, VnodeCount::DEFAULT);
    let whole = hash_rows(&columns, 6).unwrap();
    assert_eq!(hash_rows(&sliced, 4).unwrap(), whole[1..5]);
}

#[test]
fn singleton_table_is_vnode_zero() {
    let count = VnodeCount::new(1000).unwrap();
    assert_eq!(
        compute_vnodes(&[], 5, count).unwrap(),
        vec![VirtualNode::ZERO; 5]
    );
    assert_eq!(vnode_of_row(&[], 3, count).unwrap(), VirtualNode::ZERO);
    // The CRC of an empty key is that of the empty string.
    assert_eq!(hash_rows(&[], 2).unwrap(), vec![0, 0]);
    assert_eq!(hash_row(&[], 0).unwrap(), 0);
}

// ----- errors ----------------------------------------------------------------------------

fn unsupported_columns() -> Vec<ArrayRef> {
    let mut list = ListBuilder::new(arrow_array::builder::Int32Builder::new());
    list.values().append_value(1);
    list.append(true);
    let mut dict = StringDictionaryBuilder::<Int32Type>::new();
    dict.append_value("a");
    vec![
        arc(list.finish()),
        arc(dict.finish()),
        new_null_array(
            &DataType::Struct(vec![Field::new("a", DataType::Int32, true)].into()),
            1,
        ),
        new_null_array(&DataType::Interval(IntervalUnit::DayTime), 1),
        new_null_array(&DataType::FixedSizeBinary(4), 1),
        new_null_array(&DataType::Decimal256(40, 2), 1),
    ]
}

#[test]
fn unsupported_types_are_errors_not_panics() {
    let good = arc(Int64Array::from(vec![1]));
    for bad in unsupported_columns() {
        let data_type = bad.data_type().clone();
        let is_unsupported = |r: Result<()>| {
            matches!(
                r,
                Err(Error::UnsupportedType {
                    usage: "vnode hashing",
                    ..
                })
            )
        };
        match check_hashable("k", &data_type) {
            Err(Error::UnsupportedType {
                column,
                data_type: t,
                usage,
            }) => {
                assert_eq!(
                    (column.as_str(), &t, usage),
                    ("k", &data_type, "vnode hashing")
                );
            }
            other => panic!("{data_type}: {other:?}"),
        }
        let columns = [good.clone(), bad];
        assert!(
            is_unsupported(hash_rows(&columns, 1).map(drop)),
            "{data_type}"
        );
        assert!(is_unsupported(
            compute_vnodes(&columns, 1, VnodeCount::DEFAULT).map(drop)
        ));
        assert!(is_unsupported(hash_row(&columns, 0).map(drop)));
        assert!(is_unsupported(
            vnode_of_row(&columns, 0, VnodeCount::DEFAULT).map(drop)
        ));
    }
}

#[test]
fn check_hashable_agrees_with_hash_rows() {
    use DataType::*;
    let types = [
        Null,
        Boolean,
        Int8,
        Int16,
        Int32,
        Int64,
        UInt8,
        UInt16,
        UInt32,
        UInt64,
        Float16,
        Float32,
        Float64,
        Utf8,
        LargeUtf8,
        Utf8View,
        Binary,
        LargeBinary,
        BinaryView,
        Date32,
        Date64,
        Time32(TimeUnit::Second),
        Time32(TimeUnit::Millisecond),
        Time64(TimeUnit::Microsecond),
        Time64(TimeUnit::Nanosecond),
        Timestamp(TimeUnit::Second, None),
        Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
        Duration(TimeUnit::Millisecond),
        Decimal128(38, 10),
        Decimal256(40, 0),
        Decimal64(18, 2),
        Decimal32(9, 2),
        FixedSizeBinary(3),
        Interval(IntervalUnit::MonthDayNano),
        Dictionary(Box::new(Int8), Box::new(Utf8)),
        List(Arc::new(Field::new("item", Int32, true))),
    ];
    for data_type in types {
        let column = new_null_array(&data_type, 2);
        let ok = check_hashable("k", &data_type).is_ok();
        assert_eq!(
            hash_rows(std::slice::from_ref(&column), 2).is_ok(),
            ok,
            "{data_type}"
        );
        assert_eq!(hash_row(&[column], 1).is_ok(), ok, "{data_type}");
    }
}

#[test]
fn wrong_lengths_are_errors() {
    let columns = [
        arc(Int64Array::from(vec![1, 2, 3])),
        arc(Int64Array::from(vec![1, 2])),
    ];
    assert!(matches!(
        hash_rows(&columns, 3),
        Err(Error::InvalidChunk(_))
    ));
    assert!(matches!(
        compute_vnodes(&columns, 2, VnodeCount::DEFAULT),
        Err(Error::InvalidChunk(_))
    ));
    assert!(matches!(hash_row(&columns, 2), Err(Error::InvalidChunk(_))));
    assert!(matches!(
        vnode_of_row(&columns, 5, VnodeCount::DEFAULT),
        Err(Error::InvalidChunk(_))
    ));
}

// ----- VirtualNode, VnodeCount, VnodeBitmap --------------------------------------------

#[test]
fn virtual_node_accessors() {
    let v = VirtualNode::new(300);
    assert_eq!(
        (v.get(), v.index(), v.to_string()),
        (300, 300, "300".to_string())
    );
    assert_eq!(VirtualNode::ZERO.get(), 0);
    assert!(VirtualNode::new(2) < VirtualNode::new(10));
}

#[test]
fn vnode_count_bounds() {
    assert!(matches!(VnodeCount::new(0), Err(Error::InvalidConfig(_))));
    assert!(matches!(
        VnodeCount::new(32769),
        Err(Error::InvalidConfig(_))
    ));
    assert!(matches!(
        VnodeCount::new(70000),
        Err(Error::InvalidConfig(_))
    ));
    assert!(matches!(
        VnodeCount::new(usize::MAX),
        Err(Error::InvalidConfig(_))
    ));
    assert_eq!(VnodeCount::new(1).unwrap().get(), 1);
    assert_eq!(VnodeCount::new(VnodeCount::MAX).unwrap().get(), 32768);
    assert_eq!(VnodeCount::default(), VnodeCount::DEFAULT);
    assert_eq!(VnodeCount::DEFAULT.get(), 256);
    let all: Vec<u16> = VnodeCount::new(5)
        .unwrap()
        .vnodes()
        .map(VirtualNode::get)
        .collect();
    assert_eq!(all, [0, 1, 2, 3, 4]);
    assert_eq!(VnodeCount::new(32768).unwrap().vnodes().count(), 32768);
    assert_eq!(
        VnodeCount::new(32768).unwrap().vnodes().last(),
        Some(VirtualNode::new(32767))
    );
}

#[test]
fn bitmap_set_operations() {
    let count = VnodeCount::new(130).unwrap();
    let mut b = VnodeBitmap::empty(count);
    assert!(b.is_empty());
    assert_eq!(b.len(), 0);
    assert_eq!(b.count(), count);
    for v in [0, 63, 64, 129] {
        b.insert(VirtualNode::new(v)).unwrap();
    }
    assert!(matches!(
        b.insert(VirtualNode::new(130)),
        Err(Error::InvalidConfig(_))
    ));
    assert!(!b.contains(VirtualNode::new(130)));
    assert!(!b.contains(VirtualNode::new(u16::MAX)));
    assert!(b.contains(VirtualNode::new(64)) && !b.contains(VirtualNode::new(65)));
    assert_eq!(b.len(), 4);
    b.remove(VirtualNode::new(63));
    b.remove(VirtualNode::new(63));
    b.remove(VirtualNode::new(u16::MAX));
    let got: Vec<u16> = b.iter().map(VirtualNode::get).collect();
    assert_eq!(got, [0, 64, 129]);
    assert_eq!(
        b,
        VnodeBitmap::from_vnodes(count, [129, 0, 64].map(VirtualNode::new)).unwrap()
    );

    let full = VnodeBitmap::full(count);
    assert_eq!(full.len(), 130);
    assert!(full.iter().eq(count.vnodes()));
    assert_eq!(
        full,
        VnodeBitmap::from_vnodes(count, count.vnodes()).unwrap()
    );
    assert!(VnodeBitmap::full(VnodeCount::new(1).unwrap()).contains(VirtualNode::ZERO));
}

#[test]
fn from_vnodes_rejects_out_of_range() {
    let count = VnodeCount::new(10).unwrap();
    let r = VnodeBitmap::from_vnodes(count, [1, 10].map(VirtualNode::new));
    assert!(matches!(r, Err(Error::InvalidConfig(_))));
    let r = VnodeBitmap::from_vnodes(VnodeCount::DEFAULT, [VirtualNode::new(256)]);
    assert!(matches!(r, Err(Error::InvalidConfig(_))));
}

#[test]
fn split_covers_the_universe_once_with_balanced_contiguous_ranges() {
    for count in [1, 2, 3, 63, 64, 65, 100, 256, 1000, 32768] {
        let count = VnodeCount::new(count).unwrap();
        for n in [1, 2, 3, 5, 7, 64, 100, 255, 256, 1000, 32768] {
            if n > count.get() {
                continue;
            }
            let owners = VnodeBitmap::split(count, n).unwrap();
            assert_eq!(owners.len(), n);
            let sizes: Vec<usize> = owners.iter().map(VnodeBitmap::len).collect();
            let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(
                *min >= 1 && max - min <= 1,
                "count {count} n {n}: {min}..{max}"
            );
            // Concatenated in owner order, the ranges are exactly 0..count.
            let all: Vec<VirtualNode> = owners.iter().flat_map(VnodeBitmap::iter).collect();
            assert!(
                all.iter().copied().eq(count.vnodes()),
                "count {count} n {n}"
            );
            assert!(owners.iter().all(|o| o.count() == count));
        }
    }
    let count = VnodeCount::new(10).unwrap();
    assert!(matches!(
        VnodeBitmap::split(count, 0),
        Err(Error::InvalidConfig(_))
    ));
    assert!(matches!(
        VnodeBitmap::split(count, 11),
        Err(Error::InvalidConfig(_))
    ));
    assert_eq!(
        VnodeBitmap::split(count, 1).unwrap(),
        vec![VnodeBitmap::full(count)]
    );
}

// ----- the 64-bit row hash of checksums ----------------------------------------------------

/// [`mix64_rows`] of one row per column tuple.
fn mix_of(columns: &[ArrayRef]) -> Vec<u64> {
    let rows = columns.first().map_or(0, |c| c.len());
    mix64_rows(columns, rows).unwrap()
}

#[test]
fn mix64_is_the_same_for_every_string_layout() {
    let values = [
        Some("a"),
        None,
        Some(""),
        Some("a long string of many words"),
    ];
    let plain = mix_of(&[arc(StringArray::from(values.to_vec()))]);
    assert_eq!(
        mix_of(&[arc(LargeStringArray::from(values.to_vec()))]),
        plain
    );
    assert_eq!(
        mix_of(&[arc(StringViewArray::from(values.to_vec()))]),
        plain
    );
    // Equal values hash equal wherever they sit in an array (offsets, slices).
    let sliced = arc(StringArray::from(values.to_vec())).slice(1, 3);
    assert_eq!(mix_of(&[sliced]), plain[1..].to_vec());
    // Every length: inline views (up to 12 bytes), one block, overlapping last blocks.
    let text = "the quick brown fox jumps over the lazy dog";
    let every: Vec<&str> = (0..=text.len()).map(|n| &text[..n]).collect();
    let plain = mix_of(&[arc(StringArray::from(every.clone()))]);
    assert_eq!(mix_of(&[arc(StringViewArray::from(every.clone()))]), plain);
    assert_eq!(mix_of(&[arc(LargeStringArray::from(every))]), plain);
}

#[test]
fn mix64_covers_every_byte_of_a_string() {
    // A change of any one byte, at any length (the last block of a long string overlaps the
    // one before it), changes the hash.
    let text: Vec<u8> = (0..48u8).map(|i| b'a' + i % 26).collect();
    for n in 1..=text.len() {
        let value = &text[..n];
        let mut changed: Vec<Vec<u8>> = vec![value.to_vec()];
        for at in 0..n {
            let mut v = value.to_vec();
            v[at] ^= 0x20;
            changed.push(v);
        }
        let hashes = mix_of(&[arc(BinaryArray::from_iter_values(changed.iter()))]);
        let distinct: std::collections::HashSet<u64> = hashes.iter().copied().collect();
        assert_eq!(distinct.len(), hashes.len(), "length {n}");
    }
}

#[test]
fn mix64_tells_apart_what_a_checksum_must() {
    // Trailing zero bytes, empty against NULL, where one string ends and the next begins.
    let a = mix_of(&[arc(BinaryArray::from(vec![
        Some(&b"a"[..]),
        Some(&b"a\0"[..]),
        Some(&b""[..]),
        None,
    ]))]);
    let distinct: std::collections::HashSet<u64> = a.iter().copied().collect();
    assert_eq!(distinct.len(), 4, "{a:x?}");
    let split = |x: &str, y: &str| {
        mix_of(&[
            arc(StringArray::from(vec![x])),
            arc(StringArray::from(vec![y])),
        ])
    };
    assert_ne!(split("ab", "c"), split("a", "bc"));
    // Zero bytes of every length: the padding of a short string, the overlapping last block
    // of a long one; only the length tells them apart.
    let zeros = mix_of(&[arc(BinaryArray::from_iter_values(
        (0..=48).map(|n| vec![0u8; n]),
    ))]);
    let distinct: std::collections::HashSet<u64> = zeros.iter().copied().collect();
    assert_eq!(distinct.len(), zeros.len(), "{zeros:x?}");
    // Column order counts.
    let pair = |x: i64, y: i64| {
        mix_of(&[
            arc(Int64Array::from(vec![x])),
            arc(Int64Array::from(vec![y])),
        ])
    };
    assert_ne!(pair(1, 2), pair(2, 1));
    assert_ne!(pair(0, 0), pair(0, 1));
    // One zero and one NaN, as the vnode hash.
    let floats = mix_of(&[arc(Float64Array::from(vec![
        0.0,
        -0.0,
        f64::NAN,
        -f64::NAN,
    ]))]);
    assert_eq!(floats[0], floats[1]);
    assert_eq!(floats[2], floats[3]);
    assert_ne!(floats[0], floats[2]);
    // A million neighbouring keys, no collision in 64 bits.
    let keys = mix_of(&[arc(Int64Array::from_iter_values(0..1_000_000))]);
    let distinct: std::collections::HashSet<u64> = keys.iter().copied().collect();
    assert_eq!(distinct.len(), keys.len());
}

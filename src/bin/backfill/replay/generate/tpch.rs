//! TPC-H shapes (`lineitem`, `orders`) from `tpchgen-arrow`. A row is made again from its
//! order's index: `tpchgen` splits a table into parts, and a part of one order seeks its
//! random streams to that order directly.

use super::*;
use arrow_array::{Date32Array, Decimal128Array, StringViewArray};
use tpchgen::dates::TPCHDate;
use tpchgen::generators::{LineItem, LineItemGenerator, Order, OrderGenerator};
use tpchgen_arrow::{LineItemArrow, OrderArrow};

/// Lines an order may have, at most.
const MAX_LINES: u64 = 7;

/// The number of orders at `scale`, as `tpchgen`'s `i32` part count.
fn order_count(scale: f64) -> Result<i32> {
    let orders = OrderGenerator::calculate_row_count(scale, 1, 1);
    i32::try_from(orders).map_err(|_| {
        Error::config(format!(
            "TPC-H scale {scale} has {orders} orders, more than gen makes again ({})",
            i32::MAX
        ))
    })
}

/// `o_orderkey` / `l_orderkey` of the order with 0-based index `index`.
fn order_key(index: u64) -> i64 {
    OrderGenerator::make_order_key(index as i64 + 1)
}

/// `rows` as a batch of [`LineItemArrow`]'s schema, with the values it gives them.
fn lineitem_batch(rows: &[LineItem<'static>]) -> Result<RecordBatch> {
    let int64 =
        |f: fn(&LineItem<'_>) -> i64| Arc::new(Int64Array::from_iter_values(rows.iter().map(f)));
    let decimal = |f: fn(&LineItem<'_>) -> i64| -> Result<ArrayRef> {
        Ok(Arc::new(
            Decimal128Array::from_iter_values(rows.iter().map(|r| i128::from(f(r))))
                .with_precision_and_scale(15, 2)?,
        ))
    };
    let date = |f: fn(&LineItem<'_>) -> TPCHDate| {
        Arc::new(Date32Array::from_iter_values(
            rows.iter().map(|r| f(r).to_unix_epoch()),
        ))
    };
    let text = |f: fn(&LineItem<'static>) -> &'static str| {
        Arc::new(StringViewArray::from_iter_values(rows.iter().map(f)))
    };
    let columns: Vec<ArrayRef> = vec![
        int64(|r| r.l_orderkey),
        int64(|r| r.l_partkey),
        int64(|r| r.l_suppkey),
        Arc::new(Int32Array::from_iter_values(
            rows.iter().map(|r| r.l_linenumber),
        )),
        decimal(|r| r.l_quantity * 100)?,
        decimal(|r| r.l_extendedprice.into_inner())?,
        decimal(|r| r.l_discount.into_inner())?,
        decimal(|r| r.l_tax.into_inner())?,
        text(|r| r.l_returnflag),
        text(|r| r.l_linestatus),
        date(|r| r.l_shipdate),
        date(|r| r.l_commitdate),
        date(|r| r.l_receiptdate),
        text(|r| r.l_shipinstruct),
        text(|r| r.l_shipmode),
        text(|r| r.l_comment),
    ];
    Ok(RecordBatch::try_new(LineItemArrow::schema_ref(), columns)?)
}

/// `rows` as a batch of [`OrderArrow`]'s schema, with the values it gives them.
fn orders_batch(rows: &[Order<'_>]) -> Result<RecordBatch> {
    let shown = |f: fn(&Order<'_>) -> String| {
        Arc::new(StringViewArray::from_iter_values(rows.iter().map(f)))
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.o_orderkey),
        )),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.o_custkey),
        )),
        shown(|r| r.o_orderstatus.to_string()),
        Arc::new(
            Decimal128Array::from_iter_values(
                rows.iter().map(|r| i128::from(r.o_totalprice.into_inner())),
            )
            .with_precision_and_scale(15, 2)?,
        ),
        Arc::new(Date32Array::from_iter_values(
            rows.iter().map(|r| r.o_orderdate.to_unix_epoch()),
        )),
        Arc::new(StringViewArray::from_iter_values(
            rows.iter().map(|r| r.o_orderpriority),
        )),
        shown(|r| r.o_clerk.to_string()),
        Arc::new(Int32Array::from_iter_values(
            rows.iter().map(|r| r.o_shippriority),
        )),
        Arc::new(StringViewArray::from_iter_values(
            rows.iter().map(|r| r.o_comment),
        )),
    ];
    Ok(RecordBatch::try_new(OrderArrow::schema_ref(), columns)?)
}

/// `lineitem`: key id `order_index << 3 | l_linenumber` (line numbers are 1..=7); slot
/// `order_index * 7 + l_linenumber - 1`, empty past the order's line count.
pub(super) struct Lineitem {
    scale: f64,
    orders: i32,
    snapshot: LineItemArrow,
    indices: [usize; 2],
    /// Fresh keys: the order index and line being handed out, and its line count.
    next_order: u64,
    line: u64,
    lines: u64,
}

impl Lineitem {
    pub(super) fn new(scale: f64) -> Result<Self> {
        let orders = order_count(scale)?;
        let schema = LineItemArrow::schema_ref();
        Ok(Self {
            scale,
            orders,
            snapshot: LineItemArrow::new(LineItemGenerator::new(scale, 1, 1)),
            indices: [
                schema.index_of("l_orderkey")?,
                schema.index_of("l_linenumber")?,
            ],
            next_order: orders as u64,
            line: 0,
            lines: 0,
        })
    }

    /// The number of lines of the order with index `order` (as `tpchgen` draws it).
    fn line_count(order: u64) -> u64 {
        let mut random = OrderGenerator::create_line_count_random();
        random.advance_rows(order as i64);
        random.next_value() as u64
    }
}

impl Shape for Lineitem {
    fn manifest(&self) -> Manifest {
        manifest(
            "lineitem",
            &["l_orderkey", "l_linenumber"],
            Some(&["l_orderkey"]),
            &[],
        )
    }

    fn schema(&self) -> SchemaRef {
        LineItemArrow::schema_ref()
    }

    fn key_indices(&self) -> &[usize] {
        &self.indices
    }

    fn next_snapshot(&mut self) -> Result<Option<RecordBatch>> {
        Ok(self.snapshot.next().transpose()?)
    }

    fn slots(&self) -> u64 {
        self.orders as u64 * MAX_LINES
    }

    fn slot_keys(&self, slots: &[u64], out: &mut VecDeque<u64>) -> Result<()> {
        for &slot in slots {
            let (order, line) = (slot / MAX_LINES, slot % MAX_LINES + 1);
            if line <= Self::line_count(order) {
                out.push_back((order << 3) | line);
            }
        }
        Ok(())
    }

    fn originals(&self, ids: &[u64]) -> Result<RecordBatch> {
        let mut rows: Vec<LineItem<'static>> = Vec::with_capacity(ids.len());
        for &id in ids {
            let (order, line) = (id >> 3, (id & 7) as usize);
            let part = i32::try_from(order + 1)
                .ok()
                .filter(|&p| p <= self.orders && line > 0)
                .ok_or_else(|| internal!("gen: key {id} is not a snapshot lineitem"))?;
            let row = LineItemGenerator::new(self.scale, part, self.orders)
                .iter()
                .nth(line - 1)
                .ok_or_else(|| internal!("gen: key {id} is not a snapshot lineitem"))?;
            rows.push(row);
        }
        lineitem_batch(&rows)
    }

    fn new_key(&mut self, rng: &mut StdRng) -> Result<u64> {
        if self.line >= self.lines {
            if self.lines > 0 {
                self.next_order += 1;
            }
            self.line = 0;
            self.lines = rng.random_range(1..=MAX_LINES);
        }
        self.line += 1;
        Ok((self.next_order << 3) | self.line)
    }

    fn key_columns(&self, ids: &[u64]) -> Result<Vec<ArrayRef>> {
        Ok(vec![
            Arc::new(Int64Array::from_iter_values(
                ids.iter().map(|id| order_key(id >> 3)),
            )),
            Arc::new(Int32Array::from_iter_values(
                ids.iter().map(|id| (id & 7) as i32),
            )),
        ])
    }
}

/// `orders`: key id and slot = the order's index.
pub(super) struct Orders {
    scale: f64,
    orders: i32,
    snapshot: OrderArrow,
    indices: [usize; 1],
    next_order: u64,
}

impl Orders {
    pub(super) fn new(scale: f64) -> Result<Self> {
        let orders = order_count(scale)?;
        Ok(Self {
            scale,
            orders,
            snapshot: OrderArrow::new(OrderGenerator::new(scale, 1, 1)),
            indices: [OrderArrow::schema_ref().index_of("o_orderkey")?],
            next_order: orders as u64,
        })
    }
}

impl Shape for Orders {
    fn manifest(&self) -> Manifest {
        manifest("orders", &["o_orderkey"], None, &[])
    }

    fn schema(&self) -> SchemaRef {
        OrderArrow::schema_ref()
    }

    fn key_indices(&self) -> &[usize] {
        &self.indices
    }

    fn next_snapshot(&mut self) -> Result<Option<RecordBatch>> {
        Ok(self.snapshot.next().transpose()?)
    }

    fn slots(&self) -> u64 {
        self.orders as u64
    }

    fn slot_keys(&self, slots: &[u64], out: &mut VecDeque<u64>) -> Result<()> {
        out.extend(slots);
        Ok(())
    }

    fn originals(&self, ids: &[u64]) -> Result<RecordBatch> {
        let mut rows: Vec<Order<'static>> = Vec::with_capacity(ids.len());
        for &id in ids {
            let part = i32::try_from(id + 1)
                .ok()
                .filter(|&p| p <= self.orders)
                .ok_or_else(|| internal!("gen: key {id} is not a snapshot order"))?;
            let row = OrderGenerator::new(self.scale, part, self.orders)
                .iter()
                .next()
                .ok_or_else(|| internal!("gen: key {id} is not a snapshot order"))?;
            rows.push(row);
        }
        orders_batch(&rows)
    }

    fn new_key(&mut self, _: &mut StdRng) -> Result<u64> {
        self.next_order += 1;
        Ok(self.next_order - 1)
    }

    fn key_columns(&self, ids: &[u64]) -> Result<Vec<ArrayRef>> {
        Ok(vec![Arc::new(Int64Array::from_iter_values(
            ids.iter().map(|&id| order_key(id)),
        ))])
    }
}

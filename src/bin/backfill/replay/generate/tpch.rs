//! TPC-H snapshots (`lineitem`, `orders`) from `tpchgen-arrow`, and their key spaces.

use super::*;

/// `lineitem` keys: id = `l_orderkey << 3 | l_linenumber` (line numbers are 1..=7).
pub(super) struct LineitemKeys {
    indices: [usize; 2],
    next_order: i64,
    line: i32,
    lines: i32,
}

impl KeySpace for LineitemKeys {
    fn key_indices(&self) -> &[usize] {
        &self.indices
    }

    fn new_key(&mut self, rng: &mut StdRng) -> u64 {
        if self.line >= self.lines {
            self.next_order += 1;
            self.line = 0;
            self.lines = rng.random_range(1..=7);
        }
        self.line += 1;
        ((self.next_order as u64) << 3) | self.line as u64
    }

    fn key_columns(&self, ids: &[u64]) -> Vec<ArrayRef> {
        vec![
            Arc::new(Int64Array::from_iter_values(
                ids.iter().map(|id| (id >> 3) as i64),
            )),
            Arc::new(Int32Array::from_iter_values(
                ids.iter().map(|id| (id & 7) as i32),
            )),
        ]
    }
}

pub(super) fn tpch_lineitem(scale: f64) -> Result<Table> {
    use tpchgen::generators::LineItemGenerator;
    use tpchgen_arrow::LineItemArrow;
    let schema = LineItemArrow::schema_ref();
    let pool = concat_all(
        schema.clone(),
        LineItemArrow::new(LineItemGenerator::new(scale, 1, 1)),
    )?;
    let orderkey = schema.index_of("l_orderkey")?;
    let linenumber = schema.index_of("l_linenumber")?;
    let orders = pool.column(orderkey).as_primitive::<Int64Type>();
    let lines = pool.column(linenumber).as_primitive::<Int32Type>();
    let ids: Vec<u64> = orders
        .values()
        .iter()
        .zip(lines.values())
        .map(|(&o, &l)| ((o as u64) << 3) | l as u64)
        .collect();
    let max_order = orders.values().iter().copied().max().unwrap_or(0);
    Ok(Table {
        manifest: manifest(
            "lineitem",
            &["l_orderkey", "l_linenumber"],
            Some(&["l_orderkey"]),
            &[],
        ),
        pool,
        ids,
        keys: Box::new(LineitemKeys {
            indices: [orderkey, linenumber],
            next_order: max_order,
            line: 0,
            lines: 0,
        }),
    })
}

pub(super) fn tpch_orders(scale: f64) -> Result<Table> {
    use tpchgen::generators::OrderGenerator;
    use tpchgen_arrow::OrderArrow;
    let schema = OrderArrow::schema_ref();
    let pool = concat_all(
        schema.clone(),
        OrderArrow::new(OrderGenerator::new(scale, 1, 1)),
    )?;
    let orderkey = schema.index_of("o_orderkey")?;
    let keys = pool.column(orderkey).as_primitive::<Int64Type>();
    let ids: Vec<u64> = keys.values().iter().map(|&k| k as u64).collect();
    let max = keys.values().iter().copied().max().unwrap_or(0);
    Ok(Table {
        manifest: manifest("orders", &["o_orderkey"], None, &[]),
        pool,
        ids,
        keys: Box::new(CountingKeys {
            indices: [orderkey],
            next: max,
        }),
    })
}

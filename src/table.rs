//! Table definitions: schema, primary key, distribution and vnode count.
//!
//! A [`TableDesc`] is everything the store, the vnode hashing and the backfill need to agree
//! on about a table. It is checked once, when the table is defined: unknown columns, a
//! distribution key that is not part of the primary key, or a column type that cannot be
//! hashed are errors here, never panics later.
//!
//! Distribution decides a row's vnode:
//! - [`Distribution::Hash`]: `crc32(distribution-key values) % vnode_count` (see
//!   [`crate::vnode`]); an empty key makes a singleton table (every row in vnode 0).
//! - [`Distribution::VnodeColumn`]: a `UInt16` column holds the vnode itself. Progress tables
//!   use it so that progress rows live in the vnode they describe.

use arrow_array::cast::AsArray;
use arrow_array::types::UInt16Type;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Schema, SchemaRef};

use crate::error::{Error, Result};
use crate::key::{KeyColumn, PrimaryKey};
use crate::vnode::{self, VirtualNode, VnodeCount};

/// How rows are assigned to vnodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Distribution {
    /// Hash of these columns (indices into the table schema); empty means singleton.
    Hash(Vec<usize>),
    /// The vnode is the value of this non-null `UInt16` column.
    VnodeColumn(usize),
}

/// A table's definition. Cheap to clone behind an `Arc`.
#[derive(Debug, Clone)]
pub struct TableDesc {
    name: String,
    schema: SchemaRef,
    pk: PrimaryKey,
    distribution: Distribution,
    vnode_count: VnodeCount,
}

impl TableDesc {
    /// A table distributed by its whole primary key over the default 256 vnodes. Every key
    /// column must be hashable; to distribute by a part of the key (and leave the other key
    /// columns free of that rule), use [`TableDesc::with_distribution`].
    pub fn new(name: impl Into<String>, schema: SchemaRef, pk: Vec<KeyColumn>) -> Result<Self> {
        let dist: Vec<String> = pk.iter().map(|c| c.name.clone()).collect();
        Self::with_distribution(name, schema, pk, &dist)
    }

    /// A table distributed by `dist`, a part of the primary key (empty: a singleton table),
    /// over the default 256 vnodes. Only the distribution-key columns must be hashable.
    pub fn with_distribution<S: AsRef<str>>(
        name: impl Into<String>,
        schema: SchemaRef,
        pk: Vec<KeyColumn>,
        dist: &[S],
    ) -> Result<Self> {
        let name = name.into();
        if let Some(dup) = first_duplicate_name(&schema) {
            return Err(Error::InvalidConfig(format!(
                "table `{name}` has two columns named `{dup}`"
            )));
        }
        let pk = PrimaryKey::new(&schema, pk).map_err(|e| match e {
            Error::UnknownColumn { column, .. } => Error::UnknownColumn {
                column,
                context: format!("table `{name}`"),
            },
            other => other,
        })?;
        let table = Self {
            name,
            schema,
            pk,
            distribution: Distribution::Hash(Vec::new()),
            vnode_count: VnodeCount::DEFAULT,
        };
        table.with_distribution_key(dist)
    }

    /// Distributes by these columns, which must be part of the primary key. An empty list
    /// makes a singleton table.
    pub fn with_distribution_key<S: AsRef<str>>(mut self, columns: &[S]) -> Result<Self> {
        let mut dist = Vec::with_capacity(columns.len());
        for column in columns {
            let column = column.as_ref();
            let idx = self.column_index(column)?;
            if !self.pk.indices().contains(&idx) {
                return Err(Error::InvalidConfig(format!(
                    "distribution key column `{column}` of table `{}` is not part of its primary key",
                    self.name
                )));
            }
            let field = self.schema.field(idx);
            vnode::check_hashable(field.name(), field.data_type())?;
            dist.push(idx);
        }
        self.distribution = Distribution::Hash(dist);
        Ok(self)
    }

    /// Takes each row's vnode from a non-null `UInt16` column.
    pub fn with_vnode_column(mut self, column: &str) -> Result<Self> {
        let idx = self.column_index(column)?;
        let field = self.schema.field(idx);
        if field.data_type() != &DataType::UInt16 {
            return Err(Error::UnsupportedType {
                column: column.into(),
                data_type: field.data_type().clone(),
                usage: "a vnode column (it must be UInt16)",
            });
        }
        self.distribution = Distribution::VnodeColumn(idx);
        Ok(self)
    }

    /// Sets the vnode count.
    pub fn with_vnode_count(mut self, vnode_count: VnodeCount) -> Self {
        self.vnode_count = vnode_count;
        self
    }

    fn column_index(&self, column: &str) -> Result<usize> {
        self.schema
            .index_of(column)
            .map_err(|_| Error::UnknownColumn {
                column: column.into(),
                context: format!("table `{}`", self.name),
            })
    }

    /// The table name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The row schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The primary key.
    pub fn pk(&self) -> &PrimaryKey {
        &self.pk
    }

    /// How rows map to vnodes.
    pub fn distribution(&self) -> &Distribution {
        &self.distribution
    }

    /// The number of vnodes.
    pub fn vnode_count(&self) -> VnodeCount {
        self.vnode_count
    }

    /// The vnode of every row of a batch of this table, vectorized. A batch whose
    /// distribution columns are missing or of another type than the table's is an
    /// [`Error::SchemaMismatch`].
    pub fn vnodes_of(&self, batch: &RecordBatch) -> Result<Vec<VirtualNode>> {
        match &self.distribution {
            Distribution::Hash(columns) => {
                let columns = columns
                    .iter()
                    .map(|&i| self.table_column(batch, i).cloned())
                    .collect::<Result<Vec<_>>>()?;
                vnode::compute_vnodes(&columns, batch.num_rows(), self.vnode_count)
            }
            Distribution::VnodeColumn(idx) => {
                let column = self.table_column(batch, *idx)?;
                if column.null_count() > 0 {
                    return Err(Error::InvalidChunk(format!(
                        "NULL in vnode column `{}` of table `{}`",
                        self.schema.field(*idx).name(),
                        self.name
                    )));
                }
                let values = column.as_primitive::<UInt16Type>().values();
                let count = self.vnode_count.get();
                values
                    .iter()
                    .map(|&v| {
                        if usize::from(v) < count {
                            Ok(VirtualNode::new(v))
                        } else {
                            Err(Error::InvalidChunk(format!(
                                "vnode {v} out of range 0..{count} in table `{}`",
                                self.name
                            )))
                        }
                    })
                    .collect()
            }
        }
    }

    /// Column `i` of a batch of this table, checked against the table's schema.
    fn table_column<'a>(&self, batch: &'a RecordBatch, i: usize) -> Result<&'a ArrayRef> {
        let expected = self.schema.field(i);
        match batch.columns().get(i) {
            Some(column) if column.data_type() == expected.data_type() => Ok(column),
            _ => Err(Error::SchemaMismatch {
                context: format!("a batch of table `{}`", self.name),
                expected: describe(&self.schema),
                found: describe(&batch.schema()),
            }),
        }
    }

    /// Checks that `schema` has this table's column names and types, in order.
    pub fn check_schema(&self, schema: &Schema, context: &str) -> Result<()> {
        if same_fields(schema, &self.schema) {
            Ok(())
        } else {
            Err(Error::SchemaMismatch {
                context: format!("{context} of table `{}`", self.name),
                expected: describe(&self.schema),
                found: describe(schema),
            })
        }
    }
}

/// Whether two schemas have the same column names and exactly the same types, in order
/// (nullability and metadata aside).
pub(crate) fn same_fields(a: &Schema, b: &Schema) -> bool {
    a.fields().len() == b.fields().len()
        && (a.fields().iter().zip(b.fields()))
            .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type())
}

/// The first column name that `schema` has twice, if any.
pub fn first_duplicate_name(schema: &Schema) -> Option<&str> {
    let fields = schema.fields();
    fields
        .iter()
        .enumerate()
        .find(|(i, f)| fields[..*i].iter().any(|g| g.name() == f.name()))
        .map(|(_, f)| f.name().as_str())
}

/// `name: Type, ...`, a short schema description for error messages.
pub fn describe(schema: &Schema) -> String {
    let fields: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect();
    format!("({})", fields.join(", "))
}

/// `(name=value, ...)` of `columns` of `batch`'s row `row` (`NULL` for a null), for messages
/// that name a row or a key.
pub fn describe_row(batch: &RecordBatch, columns: &[usize], row: usize) -> String {
    let options = arrow_cast::display::FormatOptions::default().with_null("NULL");
    let schema = batch.schema();
    let parts: Vec<String> = columns
        .iter()
        .map(|&c| {
            let value =
                arrow_cast::display::ArrayFormatter::try_new(batch.column(c).as_ref(), &options)
                    .map(|f| f.value(row).to_string())
                    .unwrap_or_else(|_| "?".into());
            format!("{}={value}", schema.field(c).name())
        })
        .collect();
    format!("({})", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use arrow_array::{Int64Array, StringArray, UInt16Array};
    use arrow_schema::Field;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("a", DataType::Utf8, false),
            Field::new("b", DataType::Int64, false),
            Field::new("v", DataType::UInt16, false),
        ]))
    }

    #[test]
    fn distribution_key_must_be_part_of_pk() {
        let t = TableDesc::new("t", schema(), vec![KeyColumn::asc("a")]).unwrap();
        assert!(matches!(
            t.clone().with_distribution_key(&["b"]),
            Err(Error::InvalidConfig(m)) if m.contains("`b`")
        ));
        assert!(matches!(
            t.with_distribution_key(&["zz"]),
            Err(Error::UnknownColumn { column, context }) if column == "zz" && context.contains("`t`")
        ));
    }

    #[test]
    fn distribution_key_subset_ignores_other_pk_columns() {
        let t = TableDesc::new(
            "t",
            schema(),
            vec![KeyColumn::asc("a"), KeyColumn::asc("b")],
        )
        .unwrap()
        .with_distribution_key(&["a"])
        .unwrap();
        let batch = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(StringArray::from(vec!["x", "x", "y"])),
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(UInt16Array::from(vec![0, 0, 0])),
            ],
        )
        .unwrap();
        let v = t.vnodes_of(&batch).unwrap();
        assert_eq!(v[0], v[1], "same distribution key, same vnode");
    }

    #[test]
    fn vnode_column_is_checked() {
        let t = TableDesc::new("p", schema(), vec![KeyColumn::asc("v")])
            .unwrap()
            .with_vnode_count(VnodeCount::new(4).unwrap())
            .with_vnode_column("v")
            .unwrap();
        let batch = |v: u16| {
            RecordBatch::try_new(
                schema(),
                vec![
                    Arc::new(StringArray::from(vec!["x"])),
                    Arc::new(Int64Array::from(vec![1])),
                    Arc::new(UInt16Array::from(vec![v])),
                ],
            )
            .unwrap()
        };
        assert_eq!(t.vnodes_of(&batch(3)).unwrap(), vec![VirtualNode::new(3)]);
        assert!(t.vnodes_of(&batch(4)).is_err());
        assert!(matches!(
            TableDesc::new("p", schema(), vec![KeyColumn::asc("v")])
                .unwrap()
                .with_vnode_column("b"),
            Err(Error::UnsupportedType { .. })
        ));
    }

    #[test]
    fn schema_check_names_both_schemas() {
        let t = TableDesc::new("t", schema(), vec![KeyColumn::asc("a")]).unwrap();
        let other = Schema::new(vec![Field::new("a", DataType::Int32, false)]);
        let err = t.check_schema(&other, "a write").unwrap_err().to_string();
        assert!(
            err.contains("a write of table `t`") && err.contains("a: Int32"),
            "{err}"
        );
        assert!(t.check_schema(&schema(), "x").is_ok());
    }
}

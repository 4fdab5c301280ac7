//! The rules of a strict table model, applied key by key in [`super::by_key`] (and row by
//! row by the in-memory reference model of the tests):
//!
//! ```text
//!   +  key absent  -> insert          +  key present -> error (insert of an existing key)
//!   -  key present, same values -> remove      otherwise -> error
//!   U- like -, then U+ like +  (so a pair with different keys is a delete then an insert)
//!   snapshot row: like +, a present key is a duplicate in the snapshot
//! ```
//!
//! and how rows are shown in the messages about them.

use arrow_array::RecordBatch;

/// `(name=value, ...)` of columns `columns` of row `row`, for messages.
pub(crate) fn describe_row(batch: &RecordBatch, columns: &[usize], row: usize) -> String {
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

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

pub(crate) use crate::table::describe_row;

//! `dataset.json`: a dataset's name, primary key, distribution key and key order.
//!
//! ```text
//! {"name": "lineitem",
//!  "primary_key": ["l_orderkey", "l_linenumber"],
//!  "distribution_key": ["l_orderkey"],      optional, default: the primary key
//!  "order": {"l_linenumber": "desc"}}       optional, default: asc (NULLs last)
//! ```
//!
//! Only the shape is checked here (a key is given, no column twice, every `order` entry names
//! a key column); whether the columns exist is checked against the Parquet schema by
//! [`crate::replay::Dataset::open`].

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, internal};
use crate::key::KeyColumn;

/// The manifest file's name inside a dataset directory.
pub const MANIFEST_FILE: &str = "dataset.json";

/// The direction of one key column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Ascending, NULLs last.
    Asc,
    /// Descending, NULLs first (NULL is still the largest value).
    Desc,
}

/// The contents of `dataset.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The table's name.
    pub name: String,
    /// The primary key columns, in key order.
    pub primary_key: Vec<String>,
    /// The distribution key (a subset of the primary key); `None` means the primary key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distribution_key: Option<Vec<String>>,
    /// Per key column direction; absent columns are ascending.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub order: BTreeMap<String, Direction>,
}

impl Manifest {
    /// Reads and checks `dir/dataset.json`. A missing file, malformed JSON or an inconsistent
    /// key are [`Error::Dataset`] errors naming the file.
    pub fn load(dir: &Path) -> Result<Manifest> {
        let path = dir.join(MANIFEST_FILE);
        if super::storage::is_url(dir) {
            let bytes = super::storage::read(&path)?.ok_or_else(|| {
                Error::dataset(
                    &path,
                    "",
                    "missing dataset manifest (is this a dataset directory?)",
                )
            })?;
            let text = String::from_utf8(bytes.to_vec()).map_err(|e| {
                Error::dataset(&path, "", format!("the dataset manifest is not UTF-8: {e}"))
            })?;
            return Self::parse(&path, &text);
        }
        let text = std::fs::read_to_string(&path).map_err(|e| {
            let message = if e.kind() == std::io::ErrorKind::NotFound {
                "missing dataset manifest (is this a dataset directory?)".to_string()
            } else {
                format!("cannot read the dataset manifest: {e}")
            };
            Error::dataset(&path, "", message)
        })?;
        Self::parse(&path, &text)
    }

    /// Parses and checks the manifest `text` read from `path`.
    fn parse(path: &Path, text: &str) -> Result<Manifest> {
        let manifest: Manifest = serde_json::from_str(text).map_err(|e| {
            Error::dataset(
                path,
                format!("line {}, column {}", e.line(), e.column()),
                format!("malformed dataset manifest: {e}"),
            )
        })?;
        manifest
            .check()
            .map_err(|message| Error::dataset(path, "", message))?;
        Ok(manifest)
    }

    /// Writes `dir/dataset.json` (pretty-printed).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(MANIFEST_FILE);
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| internal!("serializing a manifest: {e}"))?;
        std::fs::write(&path, text + "\n").map_err(|e| Error::file(&path, e))?;
        Ok(())
    }

    fn check(&self) -> std::result::Result<(), String> {
        if self.primary_key.is_empty() {
            return Err("`primary_key` is empty: a dataset needs a primary key".into());
        }
        if let Some(dup) = first_duplicate(&self.primary_key) {
            return Err(format!("`primary_key` lists `{dup}` twice"));
        }
        if let Some(dist) = &self.distribution_key {
            if let Some(dup) = first_duplicate(dist) {
                return Err(format!("`distribution_key` lists `{dup}` twice"));
            }
            if let Some(c) = dist.iter().find(|c| !self.primary_key.contains(c)) {
                return Err(format!(
                    "distribution key column `{c}` is not part of the primary key"
                ));
            }
        }
        if let Some(c) = self.order.keys().find(|c| !self.primary_key.contains(c)) {
            return Err(format!(
                "`order` names `{c}`, which is not a primary key column"
            ));
        }
        Ok(())
    }

    /// The primary key with its order.
    pub fn key_columns(&self) -> Vec<KeyColumn> {
        self.primary_key
            .iter()
            .map(|name| match self.order.get(name) {
                Some(Direction::Desc) => KeyColumn::desc(name),
                Some(Direction::Asc) | None => KeyColumn::asc(name),
            })
            .collect()
    }

    /// The distribution key: the given one, or the primary key.
    pub fn distribution_key(&self) -> &[String] {
        self.distribution_key
            .as_deref()
            .unwrap_or(&self.primary_key)
    }
}

fn first_duplicate(names: &[String]) -> Option<&str> {
    names
        .iter()
        .enumerate()
        .find(|(i, n)| names[..*i].contains(n))
        .map(|(_, n)| n.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(text: &str) -> Result<Manifest> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(MANIFEST_FILE), text).unwrap();
        Manifest::load(dir.path())
    }

    #[test]
    fn defaults_and_order() {
        let m = load_text(r#"{"name": "t", "primary_key": ["a", "b"], "order": {"b": "desc"}}"#)
            .unwrap();
        assert_eq!(m.distribution_key(), ["a", "b"]);
        assert_eq!(
            m.key_columns(),
            vec![KeyColumn::asc("a"), KeyColumn::desc("b")]
        );
    }

    #[test]
    fn save_load_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let m = Manifest {
            name: "t".into(),
            primary_key: vec!["s".into(), "i".into()],
            distribution_key: Some(vec!["s".into()]),
            order: [("i".to_string(), Direction::Desc)].into(),
        };
        m.save(dir.path()).unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), m);
    }

    #[test]
    fn missing_manifest_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = Manifest::load(dir.path()).unwrap_err();
        assert!(matches!(err, Error::Dataset { .. }));
        assert!(
            err.to_string().contains("dataset.json") && err.to_string().contains("missing"),
            "{err}"
        );
    }

    #[test]
    fn malformed_json_names_the_file_and_line() {
        let err = load_text("{\"name\": \"t\",\n \"primary_key\": [\"a\"")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("dataset.json: line 2") && err.contains("malformed"),
            "{err}"
        );
        let err = load_text(r#"{"name": "t", "primary_key": ["a"], "order": {"a": "up"}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("dataset.json"), "{err}");
    }

    #[test]
    fn inconsistent_keys_are_errors() {
        for (text, needle) in [
            (r#"{"name": "t", "primary_key": []}"#, "empty"),
            (r#"{"name": "t", "primary_key": ["a", "a"]}"#, "twice"),
            (
                r#"{"name": "t", "primary_key": ["a"], "order": {"b": "desc"}}"#,
                "`b`",
            ),
            (
                r#"{"name": "t", "primary_key": ["a"], "distribution_key": ["b"]}"#,
                "`b`",
            ),
        ] {
            let err = load_text(text).unwrap_err();
            assert!(matches!(err, Error::Dataset { .. }), "{err}");
            assert!(err.to_string().contains(needle), "{text}: {err}");
        }
    }
}

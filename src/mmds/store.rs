//! The data store: one JSON value, replaced by `PUT /mmds`, merged by
//! `PATCH /mmds` (RFC 7396 JSON merge patch), read by `GET /mmds` and by
//! the guest's requests (a JSON pointer path, answered as JSON or in EC2
//! IMDS's text format). Its serialized size is held to a limit
//! (Firecracker's `--mmds-size-limit`): a write that would pass it changes
//! nothing.

use serde_json::{Map, Value};

/// Why a store operation failed (Firecracker's wording).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The new contents would be larger than the limit.
    #[error("The MMDS patch request doesn't fit.")]
    LimitExceeded,
    /// No value at the path.
    #[error("The MMDS resource does not exist.")]
    NotFound,
    /// `PATCH` before any `PUT`.
    #[error("The MMDS data store is not initialized.")]
    NotInitialized,
    /// The IMDS format has only objects and strings.
    #[error("Cannot retrieve value. The value has an unsupported type.")]
    UnsupportedValueType,
}

/// How a guest's `GET` is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// The JSON text of the value.
    Json,
    /// EC2 IMDS: an object's keys one a line (`key/` for an object), a
    /// string as itself.
    Imds,
}

/// The contents and their limit.
#[derive(Debug, Clone)]
pub struct Store {
    data: Value,
    initialized: bool,
    limit: usize,
}

/// RFC 7396: `patch` merged into `target` (a `null` member removes the
/// key; a non-object patch replaces the target).
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(doc) = target {
        for (key, value) in patch {
            if value.is_null() {
                doc.remove(key);
            } else {
                merge_patch(doc.entry(key.as_str()).or_insert(Value::Null), value);
            }
        }
    }
}

fn size_of(v: &Value) -> usize {
    serde_json::to_vec(v).map_or(usize::MAX, |b| b.len())
}

impl Store {
    /// An empty store (`null`, not initialized) that holds at most `limit`
    /// bytes of JSON.
    pub fn new(limit: usize) -> Store {
        Store {
            data: Value::Null,
            initialized: false,
            limit,
        }
    }

    /// The size limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// `PUT /mmds`: the whole contents.
    pub fn put(&mut self, data: Value) -> Result<(), StoreError> {
        if size_of(&data) > self.limit {
            return Err(StoreError::LimitExceeded);
        }
        self.data = data;
        self.initialized = true;
        Ok(())
    }

    /// `PATCH /mmds`: a merge patch; only after a `PUT`.
    pub fn patch(&mut self, patch: &Value) -> Result<(), StoreError> {
        if !self.initialized {
            return Err(StoreError::NotInitialized);
        }
        let mut next = self.data.clone();
        merge_patch(&mut next, patch);
        if size_of(&next) > self.limit {
            return Err(StoreError::LimitExceeded);
        }
        self.data = next;
        Ok(())
    }

    /// `GET /mmds`: the contents (`null` before any `PUT`, as Firecracker).
    pub fn value(&self) -> &Value {
        &self.data
    }

    /// The value at `path` (a JSON pointer, `/a/b`; a trailing `/` is
    /// ignored, `/` is the whole store) in `format`.
    pub fn get(&self, path: &str, format: OutputFormat) -> Result<String, StoreError> {
        let pointer = path.strip_suffix('/').unwrap_or(path);
        let value = self.data.pointer(pointer).ok_or(StoreError::NotFound)?;
        match format {
            OutputFormat::Json => Ok(value.to_string()),
            OutputFormat::Imds => imds_text(value),
        }
    }
}

/// EC2 IMDS's text for a value: the keys of an object one a line (with a
/// `/` after the key of an object), a string as itself; nothing else.
fn imds_text(value: &Value) -> Result<String, StoreError> {
    match value {
        Value::Object(map) => Ok(map
            .iter()
            .map(|(k, v)| {
                if v.is_object() {
                    format!("{k}/")
                } else {
                    k.clone()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")),
        Value::String(s) => Ok(s.clone()),
        _ => Err(StoreError::UnsupportedValueType),
    }
}

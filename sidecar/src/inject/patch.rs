//! The JSON patch (RFC 6902) of an injection: only `add` and `remove` operations.

use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, jsonptr};
use serde::ser::{SerializeSeq as _, SerializeStruct as _};
use serde::{Serialize, Serializer};
use serde_json::Value;

use super::edit::Added;
use crate::Error;

/// A JSON pointer from its unescaped tokens (RFC 6901).
fn pointer<'t>(tokens: impl IntoIterator<Item = &'t str>) -> jsonptr::PointerBuf {
    jsonptr::PointerBuf::from_tokens(tokens)
}

pub(super) fn add<F>(tokens: &[&str], value: OpValue<F>) -> Op<F> {
    Op::Add(pointer(tokens.iter().copied()), value)
}

pub(super) fn remove<F>(tokens: &[&str]) -> Op<F> {
    Op::Remove(pointer(tokens.iter().copied()))
}

/// The value of an `add` operation of an [`InjectionPatch`].
#[derive(Debug)]
pub(super) enum OpValue<F> {
    /// A value taken or derived from the Pod (a lifecycle, the grace period, the status).
    Value(Value),
    /// One added object.
    Added(F),
    /// A list of added objects (for a list the Pod does not have).
    List(Vec<F>),
}

impl OpValue<Value> {
    fn into_value(self) -> Value {
        match self {
            OpValue::Value(v) | OpValue::Added(v) => v,
            OpValue::List(l) => Value::Array(l),
        }
    }
}

impl<F: Serialize> Serialize for OpValue<F> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            OpValue::Value(v) => v.serialize(serializer),
            OpValue::Added(a) => a.serialize(serializer),
            OpValue::List(l) => {
                let mut seq = serializer.serialize_seq(Some(l.len()))?;
                for a in l {
                    seq.serialize_element(a)?;
                }
                seq.end()
            }
        }
    }
}

/// One operation of an [`InjectionPatch`]: injection only adds and removes.
#[derive(Debug)]
pub(super) enum Op<F> {
    Add(jsonptr::PointerBuf, OpValue<F>),
    Remove(jsonptr::PointerBuf),
}

/// Written as `json_patch` writes a `PatchOperation`: `op`, `path`, then `value`.
impl<F: Serialize> Serialize for Op<F> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Op::Add(path, value) => {
                let mut op = serializer.serialize_struct("AddOperation", 3)?;
                op.serialize_field("op", "add")?;
                op.serialize_field("path", path.as_str())?;
                op.serialize_field("value", value)?;
                op.end()
            }
            Op::Remove(path) => {
                let mut op = serializer.serialize_struct("RemoveOperation", 2)?;
                op.serialize_field("op", "remove")?;
                op.serialize_field("path", path.as_str())?;
                op.end()
            }
        }
    }
}

/// The JSON patch (RFC 6902) of an [`Injection`](super::Injection) ([`Injection::patch`](super::Injection::patch)), with the added
/// objects held as `F`. It serialises as the `json_patch::Patch` it converts into.
#[derive(Debug)]
pub struct InjectionPatch<F = Value>(pub(super) Vec<Op<F>>);

impl<F: Added> InjectionPatch<F> {
    /// True when injection changes nothing (an injected Pod with the same annotations).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many operations the patch has.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The patch as JSON (an array of operations).
    pub fn to_json(&self) -> Result<Vec<u8>, Error> {
        let mut out = Vec::with_capacity(8 * 1024);
        serde_json::to_writer(&mut out, self).map_err(Error::Serialize)?;
        Ok(out)
    }
}

impl<F: Serialize> Serialize for InjectionPatch<F> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for op in &self.0 {
            seq.serialize_element(op)?;
        }
        seq.end()
    }
}

impl From<InjectionPatch> for Patch {
    fn from(patch: InjectionPatch) -> Self {
        Patch(
            patch
                .0
                .into_iter()
                .map(|op| match op {
                    Op::Add(path, value) => PatchOperation::Add(AddOperation {
                        path,
                        value: value.into_value(),
                    }),
                    Op::Remove(path) => PatchOperation::Remove(RemoveOperation { path }),
                })
                .collect(),
        )
    }
}

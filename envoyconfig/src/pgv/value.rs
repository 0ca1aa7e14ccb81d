//! The values of a reflected message as the constraint checks read them: a field's value
//! when set, a number of any protobuf numeric type ([`Num`]), a `Duration` in
//! nanoseconds, the scalar inside a wrapper, and map entries in key order with the path
//! text of their keys.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use prost_reflect::{DynamicMessage, MapKey, ReflectMessage, Value};

use crate::error::key_segment;
use crate::wellknown::is_wrapper;

/// A number of any protobuf numeric type, for comparisons.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    pub(super) fn of(value: &Value) -> Option<Num> {
        Some(match value {
            Value::I32(v) => Num::Int(i128::from(*v)),
            Value::I64(v) => Num::Int(i128::from(*v)),
            Value::U32(v) => Num::Int(i128::from(*v)),
            Value::U64(v) => Num::Int(i128::from(*v)),
            Value::EnumNumber(v) => Num::Int(i128::from(*v)),
            Value::F32(v) => Num::Float(f64::from(*v)),
            Value::F64(v) => Num::Float(*v),
            _ => return None,
        })
    }

    pub(super) fn cmp(self, other: Num) -> Option<std::cmp::Ordering> {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => Some(a.cmp(&b)),
            (a, b) => a.as_f64().partial_cmp(&b.as_f64()),
        }
    }

    pub(super) fn as_f64(self) -> f64 {
        match self {
            Num::Int(v) => v as f64,
            Num::Float(v) => v,
        }
    }

    pub(super) fn is_zero(self) -> bool {
        self.as_f64() == 0.0
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::Int(v) => write!(f, "{v}"),
            Num::Float(v) => write!(f, "{v}"),
        }
    }
}

/// A `Duration` message value as nanoseconds.
pub(super) fn duration_nanos(value: &Value) -> Option<Num> {
    let Value::Message(m) = value else {
        return None;
    };
    let seconds = get(m, "seconds").and_then(|v| v.as_i64()).unwrap_or(0);
    let nanos = get(m, "nanos").and_then(|v| v.as_i32()).unwrap_or(0);
    Some(Num::Int(
        i128::from(seconds) * 1_000_000_000 + i128::from(nanos),
    ))
}

/// A field's value when set (`None` when unset, also for fields without presence).
pub(super) fn get(m: &DynamicMessage, name: &str) -> Option<Value> {
    let field = m.descriptor().get_field_by_name(name)?;
    m.has_field(&field)
        .then(|| m.get_field(&field).into_owned())
}

/// The scalar inside a value: the value itself, or a wrapper's (`UInt32Value`, …)
/// `value` field, which PGV checks with the rules of the wrapped type.
pub(super) fn scalar(value: &Value) -> Option<Cow<'_, Value>> {
    match value {
        Value::Message(m) if is_wrapper(m.descriptor().full_name()) => m.get_field_by_number(1),
        Value::Message(_) => None,
        other => Some(Cow::Borrowed(other)),
    }
}

/// Map entries in key order, so the first violation reported is deterministic.
pub(super) fn sorted(entries: &HashMap<MapKey, Value>) -> Vec<(&MapKey, &Value)> {
    let mut out: Vec<(&MapKey, &Value)> = entries.iter().collect();
    out.sort_by(|a, b| a.0.cmp(b.0));
    out
}

pub(super) fn key_text(key: &MapKey) -> String {
    match key {
        MapKey::String(s) => key_segment(s),
        MapKey::Bool(b) => format!("[{b}]"),
        MapKey::I32(v) => format!("[{v}]"),
        MapKey::I64(v) => format!("[{v}]"),
        MapKey::U32(v) => format!("[{v}]"),
        MapKey::U64(v) => format!("[{v}]"),
    }
}

//! Protobuf's well-known types as decoding and checking treat them, and marin3r's
//! placeholder type for an empty `Any`: facts that the loader leniencies, the
//! constraint checks, the canonical encoding and the type registry share.

/// The type URL an empty `Any` (`{}`) is decoded with; the canonical encoding writes it
/// back as an empty `Any` (see [`crate::decode`]). Not accepted from the input.
pub(crate) const EMPTY_ANY_URL: &str = "type.googleapis.com/marin3r.internal.EmptyAny";

/// Whether `type_url` names the placeholder type of an empty `Any` (whatever its host
/// part), which the input may not use.
pub(crate) fn is_empty_any_url(type_url: &str) -> bool {
    let name = |u: &str| {
        u.rsplit_once('/')
            .map_or(u.to_string(), |(_, n)| n.to_string())
    };
    name(type_url) == name(EMPTY_ANY_URL)
}

/// The wrapper types (`UInt32Value`, …): a message whose field 1 holds the value.
pub(crate) fn is_wrapper(name: &str) -> bool {
    matches!(
        name,
        "google.protobuf.DoubleValue"
            | "google.protobuf.FloatValue"
            | "google.protobuf.Int64Value"
            | "google.protobuf.UInt64Value"
            | "google.protobuf.Int32Value"
            | "google.protobuf.UInt32Value"
            | "google.protobuf.BoolValue"
            | "google.protobuf.StringValue"
            | "google.protobuf.BytesValue"
    )
}

/// The types whose `Any` form carries the payload under `"value"` (prost-reflect's list).
pub(crate) fn is_well_known(name: &str) -> bool {
    is_wrapper(name)
        || matches!(
            name,
            "google.protobuf.Any"
                | "google.protobuf.Timestamp"
                | "google.protobuf.Duration"
                | "google.protobuf.Struct"
                | "google.protobuf.FieldMask"
                | "google.protobuf.ListValue"
                | "google.protobuf.Value"
                | "google.protobuf.Empty"
        )
}

//! Schema pieces the derives cannot express.
//!
//! The schemas carry no validation of a field upstream MARIN3R v0.13's CRDs had without
//! it (ranges, enums, CEL rules): adding one would make our CRDs an unsafe upgrade of
//! upstream's (docs/olm.md "Upgrading over upstream's CRDs"). Those rules are `validate()`'s,
//! which the EnvoyDeployment webhook, `marin3r operator render` and the controllers run.

/// A Kubernetes port: `int32` (1–65535 is checked by `validate()`, as upstream's schema
/// has no range).
pub(crate) fn port(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "integer",
        "format": "int32"
    })
}

/// A Go duration string (`"48h"`, `"1h30m"`), as `metav1.Duration` serialises.
pub(crate) fn go_duration(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "string" })
}

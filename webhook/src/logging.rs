//! Bounds on user input written to logs: a denial can quote a whole annotation or a
//! megabyte-sized EnvoyConfig, and a log line must stay small. Every place the webhook
//! logs a value taken from a request goes through [`bounded`], the function that also
//! bounds the values echoed in denial messages (`marin3r_wire::quote`): one rule for
//! logs and messages.

pub use marin3r_wire::quote::{MAX_QUOTED_BYTES as MAX_LOGGED_BYTES, bounded};

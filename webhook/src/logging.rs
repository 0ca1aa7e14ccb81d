//! Bounds on user input written to logs: a denial can quote a whole annotation or a
//! megabyte-sized EnvoyConfig, and a log line must stay small. Every place the webhook
//! logs a value taken from a request goes through [`bounded`].

use std::borrow::Cow;

/// At most this many bytes of a user value are logged.
pub const MAX_LOGGED_BYTES: usize = 1024;

/// `value` unchanged when it is at most [`MAX_LOGGED_BYTES`] long; otherwise its first
/// bytes (cut at a character boundary) followed by `… (N bytes)`, N being its length.
pub fn bounded(value: &str) -> Cow<'_, str> {
    if value.len() <= MAX_LOGGED_BYTES {
        return Cow::Borrowed(value);
    }
    let mut end = MAX_LOGGED_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}… ({} bytes)", &value[..end], value.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_kept() {
        assert_eq!(bounded("denied"), "denied");
        let exact = "x".repeat(MAX_LOGGED_BYTES);
        assert_eq!(bounded(&exact), exact);
    }

    #[test]
    fn long_values_are_cut_and_their_length_given() {
        let long = "é".repeat(MAX_LOGGED_BYTES); // 2 bytes each
        let out = bounded(&long);
        assert!(out.ends_with(&format!("… ({} bytes)", 2 * MAX_LOGGED_BYTES)));
        assert!(out.len() <= MAX_LOGGED_BYTES + "… (2048 bytes)".len());
        assert!(out.starts_with("éé"));
    }
}

//! Bounds on request values echoed back: in denial and validation messages, in HTTP 400
//! bodies and in logs. An annotation or an object field can be megabytes long, and a
//! message quoting it whole would send those megabytes to the API server, to kubectl and
//! to the logs. Every place that echoes a request value goes through [`bounded`] (or
//! [`quoted`], its quoted form); a list of problems, which grows with the request, goes
//! through [`listed`]; and a whole message built elsewhere (a decoder's error) through
//! [`bounded_to`] with [`MAX_MESSAGE_BYTES`].

use std::borrow::Cow;

/// At most this many bytes of one request value are echoed.
pub const MAX_QUOTED_BYTES: usize = 1024;
/// At most this many bytes of a whole message are echoed (a message of several values,
/// each bounded, or a message whose values this crate did not quote).
pub const MAX_MESSAGE_BYTES: usize = 8 * 1024;
/// At most this many problems of one list are echoed; the others are counted.
pub const MAX_LISTED: usize = 10;

/// The first at most `max` bytes of `value`, cut at a character boundary, when `value` is
/// longer than `max`.
fn cut(value: &str, max: usize) -> Option<&str> {
    if value.len() <= max {
        return None;
    }
    let mut end = max;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    Some(&value[..end])
}

/// `value` unchanged when it is at most `max` bytes long; otherwise its first bytes (cut
/// at a character boundary) followed by `… (N bytes)`, N being its length.
pub fn bounded_to(value: &str, max: usize) -> Cow<'_, str> {
    match cut(value, max) {
        None => Cow::Borrowed(value),
        Some(head) => Cow::Owned(format!("{head}… ({} bytes)", value.len())),
    }
}

/// [`bounded_to`] [`MAX_QUOTED_BYTES`]: how one request value is echoed.
pub fn bounded(value: &str) -> Cow<'_, str> {
    bounded_to(value, MAX_QUOTED_BYTES)
}

/// `value` quoted like `{:?}`, bounded like [`bounded`]: the kept head is quoted and the
/// length follows the quotes (`"xxx"… (1048576 bytes)`).
pub fn quoted(value: &str) -> String {
    match cut(value, MAX_QUOTED_BYTES) {
        None => format!("{value:?}"),
        Some(head) => format!("{head:?}… ({} bytes)", value.len()),
    }
}

/// The first [`MAX_LISTED`] of `items` joined with `separator`, followed by
/// `(and N more)` when there are more.
pub fn listed(items: impl IntoIterator<Item = String>, separator: &str) -> String {
    let mut out = String::new();
    let mut more = 0usize;
    for (i, item) in items.into_iter().enumerate() {
        if i >= MAX_LISTED {
            more += 1;
            continue;
        }
        if i > 0 {
            out.push_str(separator);
        }
        out.push_str(&item);
    }
    if more > 0 {
        out.push_str(&format!(" (and {more} more)"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_kept() {
        assert_eq!(bounded("denied"), "denied");
        let exact = "x".repeat(MAX_QUOTED_BYTES);
        assert_eq!(bounded(&exact), exact);
        assert_eq!(quoted("a\"b"), r#""a\"b""#);
        assert_eq!(quoted(&exact), format!("{exact:?}"));
    }

    #[test]
    fn long_values_are_cut_and_their_length_given() {
        let long = "é".repeat(MAX_QUOTED_BYTES); // 2 bytes each
        let out = bounded(&long);
        assert!(out.ends_with(&format!("… ({} bytes)", 2 * MAX_QUOTED_BYTES)));
        assert!(out.len() <= MAX_QUOTED_BYTES + "… (2048 bytes)".len());
        assert!(out.starts_with("éé"));
        let q = quoted(&long);
        assert!(q.starts_with("\"éé"), "{q}");
        assert!(q.ends_with("é\"… (2048 bytes)"), "{q}");
        assert!(q.len() <= MAX_QUOTED_BYTES + "\"\"… (2048 bytes)".len());
        let message = "m".repeat(3 * MAX_MESSAGE_BYTES);
        assert_eq!(
            bounded_to(&message, MAX_MESSAGE_BYTES).len(),
            MAX_MESSAGE_BYTES + "… (24576 bytes)".len()
        );
    }

    #[test]
    fn lists_keep_their_first_items_and_count_the_others() {
        let few = listed((0..3).map(|i| i.to_string()), ", ");
        assert_eq!(few, "0, 1, 2");
        let many = listed((0..100_000).map(|i| i.to_string()), ", ");
        assert_eq!(many, "0, 1, 2, 3, 4, 5, 6, 7, 8, 9 (and 99990 more)");
    }
}

//! Text written for a terminal never carries a control character from elsewhere: a pod
//! name, node id, NACK message, file name or error text holding `ESC[2J` (clear the
//! screen), `ESC[1A` (go to the row above), `ESC]52;c;…BEL` (write the clipboard), an
//! OSC 8 link, a carriage return that overwrites a line, or a bidi override that reorders
//! what is shown is written as visible text instead.
//!
//! The rule, in one place ([`escape`]): the C0 controls (U+0000–U+001F), DEL (U+007F),
//! the C1 controls (U+0080–U+009F, `U+009B` is a one-byte CSI) and the bidi controls
//! (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069) are written the way Rust
//! writes them in a string literal: `\n`, `\t`, `\r`, `\x1b`, `\u{9b}`, `\u{202e}`. A
//! backslash stays as it is. Where:
//!
//! - [`cell`]: a table cell or any one-line value: every control, `\n` and `\t` too (a
//!   newline in a cell would break the table, a tab its alignment);
//! - [`text`]: a whole human-readable message or table: every control but `\n`
//!   (messages have several lines);
//! - [`json`]: JSON that `serde_json` wrote: it escapes C0 itself but leaves DEL, C1
//!   and bidi controls raw; they are written as `\u00XX` / `\uXXXX` escapes, so the
//!   document reads back the same. (YAML needs nothing: `serde_saphyr` double-quotes
//!   and escapes C0, DEL and C1, `\e[2J`; bidi controls may stay in YAML, they move
//!   text but drive no terminal.)
//!
//! Every writer of the `marin3r` binary goes through these: the `marin3r status`
//! tables and messages, `-o json`, `marin3r validate`'s and `operator render`'s
//! messages, and the error line of the binaries.

use std::borrow::Cow;

/// What a character is written as, if it is one the rule escapes.
fn escaped(c: char, keep_newline: bool) -> Option<String> {
    match c {
        '\n' if keep_newline => None,
        '\n' => Some("\\n".to_string()),
        '\t' => Some("\\t".to_string()),
        '\r' => Some("\\r".to_string()),
        '\u{0}'..='\u{1f}' | '\u{7f}' => Some(format!("\\x{:02x}", c as u32)),
        c if is_c1(c) || is_bidi(c) => Some(format!("\\u{{{:x}}}", c as u32)),
        _ => None,
    }
}

fn is_c1(c: char) -> bool {
    ('\u{80}'..='\u{9f}').contains(&c)
}

/// The bidi controls (Unicode's `Bidi_Control` property).
fn is_bidi(c: char) -> bool {
    matches!(
        c,
        '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
    )
}

/// `s` with the characters the rule escapes written as text (`keep_newline`: `\n`
/// stays); borrowed when there are none.
pub fn escape(s: &str, keep_newline: bool) -> Cow<'_, str> {
    if !s.chars().any(|c| escaped(c, keep_newline).is_some()) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match escaped(c, keep_newline) {
            Some(e) => out.push_str(&e),
            None => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A table cell or one-line value: every control escaped, `\n` and `\t` too.
pub fn cell(s: &str) -> Cow<'_, str> {
    escape(s, false)
}

/// A human-readable text of several lines: every control escaped but `\n`.
pub fn text(s: &str) -> Cow<'_, str> {
    escape(s, true)
}

/// JSON written by `serde_json` with the DEL, C1 and bidi controls it leaves raw
/// written as JSON escapes (`\u009b`): the same document, nothing a terminal acts on.
pub fn json(s: &str) -> Cow<'_, str> {
    let raw = |c: char| c == '\u{7f}' || is_c1(c) || is_bidi(c);
    if !s.chars().any(raw) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if raw(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// The error line of the binaries: `error: ` then the error and its causes.
pub fn error_line(e: &anyhow::Error) -> String {
    format!("error: {}", text(&format!("{e:#}")))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// One of each kind of control a terminal acts on, as a hostile value carries them.
    pub(crate) const HOSTILE: [(&str, &str); 12] = [
        ("clear screen", "\u{1b}[2J"),
        ("erase the row above", "\u{1b}[1A\u{1b}[2K"),
        (
            "clipboard write (OSC 52)",
            "\u{1b}]52;c;ZWNobyBwd25lZA==\u{7}",
        ),
        (
            "link (OSC 8)",
            "\u{1b}]8;;https://evil.example\u{1b}\\x\u{1b}]8;;\u{1b}\\",
        ),
        ("carriage return", "ok\rEVIL"),
        ("newline", "a\nb"),
        ("tab", "a\tb"),
        ("NUL and BEL", "\u{0}\u{7}"),
        ("DEL", "\u{7f}"),
        ("C1 CSI", "\u{9b}2J"),
        ("C1 OSC", "\u{9d}52;c;x\u{9c}"),
        ("bidi override", "abc\u{202e}fed"),
    ];

    /// A character the rule escapes.
    pub(crate) fn is_control(c: char) -> bool {
        escaped(c, false).is_some()
    }

    #[test]
    fn every_control_kind_is_written_as_text() {
        for (what, s) in HOSTILE {
            let out = cell(s);
            assert!(!out.chars().any(is_control), "{what}: {out:?}");
            let out = text(s);
            assert!(
                !out.chars().any(|c| c != '\n' && is_control(c)),
                "{what}: {out:?}"
            );
        }
        assert_eq!(cell("\u{1b}[2J"), "\\x1b[2J");
        assert_eq!(cell("a\nb\tc\rd"), "a\\nb\\tc\\rd");
        assert_eq!(text("a\nb\tc"), "a\nb\\tc");
        assert_eq!(cell("\u{9b}\u{202e}\u{7f}"), "\\u{9b}\\u{202e}\\x7f");
        // Everything else is kept, borrowed.
        for plain in ["kuard-0", "ümlaut ✓ 名前", "a\\x1b", ""] {
            assert!(matches!(cell(plain), Cow::Borrowed(_)), "{plain}");
        }
    }

    #[test]
    fn json_keeps_its_value_and_loses_the_raw_controls() {
        let value = serde_json::json!({"pod": HOSTILE.iter().map(|(_, s)| *s).collect::<String>()});
        let written = serde_json::to_string_pretty(&value).unwrap();
        assert!(
            written.chars().any(is_control),
            "serde_json leaves some raw"
        );
        let safe = json(&written);
        assert!(
            !safe.chars().any(|c| c != '\n' && is_control(c)),
            "{safe:?}"
        );
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, value);
    }
}

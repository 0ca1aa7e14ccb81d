//! Golden files of the `marin3r status` tests (`cli/tests/golden/status/`) and the
//! normalisation of what varies between runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

/// Compares `actual` with the golden file `name`, or rewrites it with `UPDATE_GOLDEN=1`.
pub fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/status")
        .join(name);
    if let Err(e) = marin3r_testkit::golden::check(&path, actual) {
        panic!("{e}");
    }
}

/// Every 16-hex-digit version becomes `<vN>` (padded to the same width in tables); each of `ports`
/// becomes `PORT`. Ports are 5 digits (free ports are ephemeral ones), so widths hold.
pub fn normalise(text: &str, ports: &[u16]) -> String {
    let mut out = text.to_string();
    for port in ports {
        out = out.replace(&port.to_string(), "PORT");
    }
    let chars: Vec<char> = out.chars().collect();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut result = String::new();
    let mut i = 0;
    let is_hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
    while i < chars.len() {
        let starts = i == 0 || !chars[i - 1].is_ascii_alphanumeric();
        let ends = i + 16 == chars.len()
            || (i + 16 < chars.len() && !chars[i + 16].is_ascii_alphanumeric());
        if starts && i + 16 <= chars.len() && ends && chars[i..i + 16].iter().all(|c| is_hex(*c)) {
            let version: String = chars[i..i + 16].iter().collect();
            let n = seen.len() + 1;
            let n = *seen.entry(version).or_insert(n);
            // Padded to the same width only inside a table (a column gap follows).
            let token = format!("<v{n}>");
            if chars.get(i + 16) == Some(&' ') && chars.get(i + 17) == Some(&' ') {
                result.push_str(&format!("{token:<16}"));
            } else {
                result.push_str(&token);
            }
            i += 16;
        } else {
            result.push(chars[i]);
            i += 1;
        }
    }
    result
}

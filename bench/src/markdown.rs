//! Figures as the report writes them.

use crate::stats::Spread;

/// `min / **median** / max` with `decimals` decimals; `—` without samples.
pub fn spread(v: &[f64], decimals: usize) -> String {
    match Spread::of(v) {
        Some(s) => format!(
            "{:.d$} / **{:.d$}** / {:.d$}",
            s.min,
            s.median,
            s.max,
            d = decimals
        ),
        None => "—".into(),
    }
}

/// The median of `v` (NaN without samples).
pub fn median(v: &[f64]) -> f64 {
    Spread::of(v).map_or(f64::NAN, |s| s.median)
}

/// A target's verdict.
pub fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "not measured",
    }
}

/// `existing` with `section` (which starts with its `heading` line) in place of the
/// section under `heading` (up to the next `## ` heading), or inserted before the first
/// of `before` (headings) that `existing` has, or appended.
pub fn splice(existing: &str, heading: &str, section: &str, before: &[&str]) -> String {
    let heading_at = |text: &str, heading: &str| -> Option<usize> {
        let mut at = 0;
        for line in text.split_inclusive('\n') {
            if line.trim_end() == heading {
                return Some(at);
            }
            at += line.len();
        }
        None
    };
    let next_heading = |text: &str, from: usize| -> usize {
        let mut at = 0;
        for line in text.split_inclusive('\n') {
            if at > from && line.starts_with("## ") {
                return at;
            }
            at += line.len();
        }
        text.len()
    };
    let section = format!("{}\n\n", section.trim_end());
    if let Some(start) = heading_at(existing, heading) {
        let end = next_heading(existing, start);
        return format!("{}{section}{}", &existing[..start], &existing[end..]);
    }
    if let Some(at) = before.iter().find_map(|h| heading_at(existing, h)) {
        return format!("{}{section}{}", &existing[..at], &existing[at..]);
    }
    let mut out = existing.trim_end().to_string();
    out.push_str("\n\n");
    out.push_str(&section);
    out
}

/// The 1, 5 and 15 minute load averages.
pub fn load_str(l: Option<[f64; 3]>) -> String {
    l.map_or_else(
        || "unknown".into(),
        |[a, b, c]| format!("{a:.2}, {b:.2}, {c:.2}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures() {
        assert_eq!(spread(&[3.0, 1.0, 2.0], 1), "1.0 / **2.0** / 3.0");
        assert_eq!(spread(&[], 1), "—");
        assert!(median(&[]).is_nan());
        assert_eq!(verdict(Some(false)), "**missed**");
        assert_eq!(load_str(Some([1.0, 2.0, 3.5])), "1.00, 2.00, 3.50");
    }

    #[test]
    fn splice_replaces_only_its_own_section() {
        let doc = "# B\n\n## A\n\na\n\n## C\n\nold c\n\n## D\n\nd\n";
        assert_eq!(
            splice(doc, "## C", "## C\n\nnew c", &[]),
            "# B\n\n## A\n\na\n\n## C\n\nnew c\n\n## D\n\nd\n"
        );
        assert_eq!(
            splice(doc, "## E", "## E\n\ne", &["## X", "## D"]),
            "# B\n\n## A\n\na\n\n## C\n\nold c\n\n## E\n\ne\n\n## D\n\nd\n"
        );
        assert_eq!(
            splice(doc, "## E", "## E\n\ne", &[]),
            format!("{}\n\n## E\n\ne\n\n", doc.trim_end())
        );
    }
}

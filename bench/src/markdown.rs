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
}

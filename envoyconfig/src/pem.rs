//! Defence in depth for text from anywhere ([`redact_pem`]): a PEM block
//! (`-----BEGIN … PRIVATE KEY-----` and any other) and a run of 64 or more base64
//! characters (a PEM body line) are replaced. [`crate::decode::DecodeError`]'s `Display`
//! applies it to every text it shows, and the sinks that store or log other text (NACK
//! messages, revision statuses, `marin3r status`) apply it too. A leaf: it reads no
//! schema.

use std::borrow::Cow;

/// `text` with every PEM block (`-----BEGIN …-----` through its `-----END …-----`, or
/// through the base64 that follows when the end is missing) and every run of 64 or more
/// base64 characters (a PEM body line without its header) replaced. For any text that
/// may be stored or logged.
pub fn redact_pem(text: &str) -> Cow<'_, str> {
    const BEGIN: &str = "-----BEGIN ";
    const PEM_SHOWN: &str = "[PEM block not shown]";
    const BASE64_SHOWN: &str = "[base64 not shown]";
    const LONG_RUN: usize = 64;
    let is_b64 = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=');
    if !text.contains(BEGIN) && !has_run(text.as_bytes(), LONG_RUN, is_b64) {
        return Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        if text[i..].starts_with(BEGIN) {
            let end = match text[i..].find("-----END ") {
                Some(e) => {
                    let after = i + e + "-----END ".len();
                    text[after..]
                        .find("-----")
                        .map_or(bytes.len(), |close| after + close + "-----".len())
                }
                None => {
                    // The header, then the base64 body (newlines possibly escaped).
                    let mut j = text[i + BEGIN.len()..]
                        .find("-----")
                        .map_or(bytes.len(), |close| i + BEGIN.len() + close + 5);
                    while j < bytes.len()
                        && (is_b64(bytes[j]) || bytes[j].is_ascii_whitespace() || bytes[j] == b'\\')
                    {
                        j += 1;
                    }
                    j
                }
            };
            out.push_str(PEM_SHOWN);
            i = end;
            continue;
        }
        if is_b64(bytes[i]) {
            let mut j = i;
            while j < bytes.len() && is_b64(bytes[j]) {
                j += 1;
            }
            if j - i >= LONG_RUN {
                out.push_str(BASE64_SHOWN);
            } else {
                out.push_str(&text[i..j]);
            }
            i = j;
            continue;
        }
        let c = text[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&text[i..i + c]);
        i += c;
    }
    Cow::Owned(out)
}

fn has_run(bytes: &[u8], len: usize, is_b64: impl Fn(u8) -> bool) -> bool {
    let mut run = 0;
    for &b in bytes {
        run = if is_b64(b) { run + 1 } else { 0 };
        if run >= len {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_blocks_and_long_base64_runs_are_replaced() {
        let key = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n-----END PRIVATE KEY-----\n";
        assert_eq!(
            redact_pem(&format!("bad: {key}after")),
            "bad: [PEM block not shown]\nafter"
        );
        let escaped = format!("{:?}", &key[..60]);
        assert_eq!(
            redact_pem(&format!("x {escaped} y")),
            "x \"[PEM block not shown]\" y"
        );
        let line = "A".repeat(64);
        assert_eq!(redact_pem(&format!("a {line} b")), "a [base64 not shown] b");
        assert_eq!(
            redact_pem("listener \"https\": filter_chains[0]: bad"),
            "listener \"https\": filter_chains[0]: bad"
        );
    }
}

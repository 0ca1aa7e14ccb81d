//! BoringSSL's cipher rule grammar, as Envoy 1.40 applies it to
//! `TlsParameters.cipher_suites` (joined with `:`) through
//! `SSL_CTX_set_strict_cipher_list`: Envoy refuses the list when this parse fails or
//! selects no cipher.
//!
//! The grammar (BoringSSL `ssl_cipher_process_rulestr`, strict mode):
//!
//! - rules are separated by `:` only (strict mode: no `,`, `;` or space); empty rules
//!   are skipped;
//! - a rule is an optional operator (`-` deletes, `!` kills for good, `+` moves to the
//!   end, `@STRENGTH` sorts by strength) and a name: a cipher (OpenSSL or IETF name) or
//!   an alias, or aliases joined with `+` (their intersection; a cipher name cannot be
//!   joined); after the name, another rule may start without a separator (`ALL!AES`);
//! - `[a|b]` is an equal-preference group of added names; inside it only names and `|`
//!   are allowed, and once a group has appeared no operator may follow (`-`, `!`, `+`,
//!   `@STRENGTH`), so `ALL:-[AES128]` and `[AES128|CHACHA20]:@STRENGTH` are refused;
//! - a list that starts with `DEFAULT` is `ALL` followed by the rest; `DEFAULT`
//!   elsewhere is an unknown name;
//! - adding by alias leaves out the deprecated ciphers (3DES and the two CBC-SHA256
//!   ECDHE suites) unless an alias of the rule names them (`3DES`); naming a cipher
//!   adds it; TLS 1.3 suites are known names that select nothing.
//!
//! Every rule of this file was checked against Envoy 1.40.0 (`envoyconfig/tests/
//! tls_cases/cases.json`, cipher rows).

use std::fmt;

// `SSL_CIPHER` algorithm bits.
const K_RSA: u32 = 1;
const K_ECDHE: u32 = 2;
const K_PSK: u32 = 4;
const K_GENERIC: u32 = 8;
const A_RSA_SIGN: u32 = 1;
const A_RSA_DECRYPT: u32 = 2;
const A_ECDSA: u32 = 4;
const A_PSK: u32 = 8;
const A_GENERIC: u32 = 16;
const E_3DES: u32 = 1;
const E_AES128: u32 = 2;
const E_AES256: u32 = 4;
const E_AES128GCM: u32 = 8;
const E_AES256GCM: u32 = 16;
const E_CHACHA20: u32 = 32;
const E_AES: u32 = E_AES128 | E_AES256 | E_AES128GCM | E_AES256GCM;
const M_SHA1: u32 = 1;
const M_SHA256: u32 = 2;
const M_AEAD: u32 = 4;
const ANY: u32 = !0;

const TLS1: u16 = 0x0301;
const TLS1_2: u16 = 0x0303;
const TLS1_3: u16 = 0x0304;

struct Cipher {
    name: &'static str,
    standard_name: &'static str,
    mkey: u32,
    auth: u32,
    enc: u32,
    mac: u32,
    /// The first TLS version of the suite (`SSL_CIPHER_get_min_version`).
    min_version: u16,
    /// Left out when added by an alias that does not include deprecated suites.
    deprecated: bool,
}

const fn cipher(
    name: &'static str,
    standard_name: &'static str,
    (mkey, auth, enc, mac): (u32, u32, u32, u32),
    min_version: u16,
) -> Cipher {
    Cipher {
        name,
        standard_name,
        mkey,
        auth,
        enc,
        mac,
        min_version,
        deprecated: enc == E_3DES || (mac == M_SHA256 && enc == E_AES128),
    }
}

/// BoringSSL's cipher suites (`kCiphers`), TLS 1.3 ones included: they are known
/// names, but not in the TLS 1.2 list a rule string builds.
const CIPHERS: &[Cipher] = &[
    cipher(
        "DES-CBC3-SHA",
        "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
        (K_RSA, A_RSA_DECRYPT, E_3DES, M_SHA1),
        TLS1,
    ),
    cipher(
        "AES128-SHA",
        "TLS_RSA_WITH_AES_128_CBC_SHA",
        (K_RSA, A_RSA_DECRYPT, E_AES128, M_SHA1),
        TLS1,
    ),
    cipher(
        "AES256-SHA",
        "TLS_RSA_WITH_AES_256_CBC_SHA",
        (K_RSA, A_RSA_DECRYPT, E_AES256, M_SHA1),
        TLS1,
    ),
    cipher(
        "PSK-AES128-CBC-SHA",
        "TLS_PSK_WITH_AES_128_CBC_SHA",
        (K_PSK, A_PSK, E_AES128, M_SHA1),
        TLS1,
    ),
    cipher(
        "PSK-AES256-CBC-SHA",
        "TLS_PSK_WITH_AES_256_CBC_SHA",
        (K_PSK, A_PSK, E_AES256, M_SHA1),
        TLS1,
    ),
    cipher(
        "AES128-GCM-SHA256",
        "TLS_RSA_WITH_AES_128_GCM_SHA256",
        (K_RSA, A_RSA_DECRYPT, E_AES128GCM, M_AEAD),
        TLS1_2,
    ),
    cipher(
        "AES256-GCM-SHA384",
        "TLS_RSA_WITH_AES_256_GCM_SHA384",
        (K_RSA, A_RSA_DECRYPT, E_AES256GCM, M_AEAD),
        TLS1_2,
    ),
    cipher(
        "TLS_AES_128_GCM_SHA256",
        "TLS_AES_128_GCM_SHA256",
        (K_GENERIC, A_GENERIC, E_AES128GCM, M_AEAD),
        TLS1_3,
    ),
    cipher(
        "TLS_AES_256_GCM_SHA384",
        "TLS_AES_256_GCM_SHA384",
        (K_GENERIC, A_GENERIC, E_AES256GCM, M_AEAD),
        TLS1_3,
    ),
    cipher(
        "TLS_CHACHA20_POLY1305_SHA256",
        "TLS_CHACHA20_POLY1305_SHA256",
        (K_GENERIC, A_GENERIC, E_CHACHA20, M_AEAD),
        TLS1_3,
    ),
    cipher(
        "ECDHE-ECDSA-AES128-SHA",
        "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
        (K_ECDHE, A_ECDSA, E_AES128, M_SHA1),
        TLS1,
    ),
    cipher(
        "ECDHE-ECDSA-AES256-SHA",
        "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
        (K_ECDHE, A_ECDSA, E_AES256, M_SHA1),
        TLS1,
    ),
    cipher(
        "ECDHE-RSA-AES128-SHA",
        "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
        (K_ECDHE, A_RSA_SIGN, E_AES128, M_SHA1),
        TLS1,
    ),
    cipher(
        "ECDHE-RSA-AES256-SHA",
        "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
        (K_ECDHE, A_RSA_SIGN, E_AES256, M_SHA1),
        TLS1,
    ),
    cipher(
        "ECDHE-ECDSA-AES128-SHA256",
        "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
        (K_ECDHE, A_ECDSA, E_AES128, M_SHA256),
        TLS1_2,
    ),
    cipher(
        "ECDHE-RSA-AES128-SHA256",
        "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
        (K_ECDHE, A_RSA_SIGN, E_AES128, M_SHA256),
        TLS1_2,
    ),
    cipher(
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        (K_ECDHE, A_ECDSA, E_AES128GCM, M_AEAD),
        TLS1_2,
    ),
    cipher(
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        (K_ECDHE, A_ECDSA, E_AES256GCM, M_AEAD),
        TLS1_2,
    ),
    cipher(
        "ECDHE-RSA-AES128-GCM-SHA256",
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        (K_ECDHE, A_RSA_SIGN, E_AES128GCM, M_AEAD),
        TLS1_2,
    ),
    cipher(
        "ECDHE-RSA-AES256-GCM-SHA384",
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        (K_ECDHE, A_RSA_SIGN, E_AES256GCM, M_AEAD),
        TLS1_2,
    ),
    cipher(
        "ECDHE-PSK-AES128-CBC-SHA",
        "TLS_ECDHE_PSK_WITH_AES_128_CBC_SHA",
        (K_ECDHE, A_PSK, E_AES128, M_SHA1),
        TLS1,
    ),
    cipher(
        "ECDHE-PSK-AES256-CBC-SHA",
        "TLS_ECDHE_PSK_WITH_AES_256_CBC_SHA",
        (K_ECDHE, A_PSK, E_AES256, M_SHA1),
        TLS1,
    ),
    cipher(
        "ECDHE-RSA-CHACHA20-POLY1305",
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        (K_ECDHE, A_RSA_SIGN, E_CHACHA20, M_AEAD),
        TLS1_2,
    ),
    cipher(
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        (K_ECDHE, A_ECDSA, E_CHACHA20, M_AEAD),
        TLS1_2,
    ),
    cipher(
        "ECDHE-PSK-CHACHA20-POLY1305",
        "TLS_ECDHE_PSK_WITH_CHACHA20_POLY1305_SHA256",
        (K_ECDHE, A_PSK, E_CHACHA20, M_AEAD),
        TLS1_2,
    ),
];

impl Cipher {
    /// `SSL_CIPHER_get_bits`.
    fn strength(&self) -> u32 {
        match self.enc {
            E_AES128 | E_AES128GCM => 128,
            E_3DES => 112,
            _ => 256,
        }
    }
}

/// An alias, or the intersection of `+`-joined aliases (`CIPHER_ALIAS`).
#[derive(Clone, Copy)]
struct Alias {
    mkey: u32,
    auth: u32,
    enc: u32,
    mac: u32,
    /// Non-zero: only the suites added in that TLS version.
    min_version: u16,
    include_deprecated: bool,
}

const fn alias(mkey: u32, auth: u32, enc: u32, mac: u32) -> Alias {
    Alias {
        mkey,
        auth,
        enc,
        mac,
        min_version: 0,
        include_deprecated: false,
    }
}

const fn since(min_version: u16) -> Alias {
    Alias {
        min_version,
        ..alias(ANY, ANY, ANY, ANY)
    }
}

/// BoringSSL's aliases (`kCipherAliases`).
const ALIASES: &[(&str, Alias)] = &[
    ("ALL", alias(ANY, ANY, ANY, ANY)),
    ("kRSA", alias(K_RSA, ANY, ANY, ANY)),
    ("kECDHE", alias(K_ECDHE, ANY, ANY, ANY)),
    ("kEECDH", alias(K_ECDHE, ANY, ANY, ANY)),
    ("ECDH", alias(K_ECDHE, ANY, ANY, ANY)),
    ("kPSK", alias(K_PSK, ANY, ANY, ANY)),
    ("aRSA", alias(ANY, A_RSA_SIGN | A_RSA_DECRYPT, ANY, ANY)),
    ("aECDSA", alias(ANY, A_ECDSA, ANY, ANY)),
    ("ECDSA", alias(ANY, A_ECDSA, ANY, ANY)),
    ("aPSK", alias(ANY, A_PSK, ANY, ANY)),
    ("ECDHE", alias(K_ECDHE, ANY, ANY, ANY)),
    ("EECDH", alias(K_ECDHE, ANY, ANY, ANY)),
    ("RSA", alias(K_RSA, A_RSA_SIGN | A_RSA_DECRYPT, ANY, ANY)),
    ("PSK", alias(K_PSK, A_PSK, ANY, ANY)),
    (
        "3DES",
        Alias {
            include_deprecated: true,
            ..alias(ANY, ANY, E_3DES, ANY)
        },
    ),
    ("AES128", alias(ANY, ANY, E_AES128 | E_AES128GCM, ANY)),
    ("AES256", alias(ANY, ANY, E_AES256 | E_AES256GCM, ANY)),
    ("AES", alias(ANY, ANY, E_AES, ANY)),
    ("AESGCM", alias(ANY, ANY, E_AES128GCM | E_AES256GCM, ANY)),
    ("CHACHA20", alias(ANY, ANY, E_CHACHA20, ANY)),
    ("SHA1", alias(ANY, ANY, ANY, M_SHA1)),
    ("SHA", alias(ANY, ANY, ANY, M_SHA1)),
    ("SSLv3", since(TLS1)),
    ("TLSv1", since(TLS1)),
    ("TLSv1.2", since(TLS1_2)),
    ("HIGH", alias(ANY, ANY, ANY, ANY)),
    ("FIPS", alias(ANY, ANY, ANY, ANY)),
];

/// The TLS 1.2 suites a rule string orders (every one of `CIPHERS` but TLS 1.3's); the
/// starting order does not change a verdict.
fn tls12() -> impl Iterator<Item = usize> {
    (0..CIPHERS.len()).filter(|&i| CIPHERS[i].min_version != TLS1_3)
}

/// Why BoringSSL refuses a rule string.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RuleError {
    /// A name that is neither a cipher nor an alias (`INVALID_COMMAND`).
    Unknown(String),
    /// A cipher name joined with `+` (`INVALID_COMMAND`).
    CipherInCombination(String),
    /// `@` not followed by `STRENGTH`.
    NotStrength(String),
    /// Something else where a name was expected, at a byte offset (`INVALID_COMMAND`).
    Syntax(usize),
    /// Something other than a name or `|` inside `[...]`
    /// (`UNEXPECTED_OPERATOR_IN_GROUP`).
    OperatorInGroup(usize),
    /// `-`, `!`, `+` or `@STRENGTH` after a `[...]` group
    /// (`MIXED_SPECIAL_OPERATOR_WITH_GROUPS`).
    OperatorAfterGroup(usize),
    /// A `[` without its `]`.
    UnclosedGroup,
    /// The rules select no cipher (`NO_CIPHER_MATCH`).
    NoCipher,
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(name) => write!(f, "{name:?} is not a cipher suite Envoy knows"),
            Self::CipherInCombination(name) => write!(
                f,
                "{name:?} is a cipher suite: only aliases can be joined with '+'"
            ),
            Self::NotStrength(name) => write!(f, "'@{name}' is not '@STRENGTH'"),
            Self::Syntax(at) => write!(f, "a cipher or alias name is expected at offset {at}"),
            Self::OperatorInGroup(at) => write!(
                f,
                "only names and '|' are allowed inside '[...]' (offset {at})"
            ),
            Self::OperatorAfterGroup(at) => write!(
                f,
                "'-', '!', '+' and '@STRENGTH' are not allowed once a '[...]' group is used \
                 (offset {at})"
            ),
            Self::UnclosedGroup => write!(f, "a '[' group is not closed"),
            Self::NoCipher => write!(f, "the list selects no cipher"),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Add,
    Kill,
    Del,
    Ord,
    Strength,
}

/// What a rule matches.
enum Selector {
    Cipher(usize),
    Strength(u32),
    Alias(Alias),
}

impl Selector {
    fn matches(&self, i: usize) -> bool {
        let c = &CIPHERS[i];
        match self {
            Self::Cipher(id) => *id == i,
            Self::Strength(bits) => c.strength() == *bits,
            Self::Alias(a) => {
                a.mkey & c.mkey != 0
                    && a.auth & c.auth != 0
                    && a.enc & c.enc != 0
                    && a.mac & c.mac != 0
                    && (a.min_version == 0 || c.min_version == a.min_version)
                    && (a.include_deprecated || !c.deprecated)
            }
        }
    }
}

/// The ordered suite list being built (`CIPHER_ORDER`): every TLS 1.2 suite not
/// killed, active or not.
struct List {
    /// (suite, active, in a group with the next one)
    items: Vec<(usize, bool, bool)>,
}

impl List {
    /// `ssl_cipher_apply_rule`: the matched suites keep their relative order and go to
    /// the end (add, move) or the front (delete); killed ones leave the list.
    fn apply(&mut self, selector: &Selector, op: Op, in_group: bool) {
        let mut moved = Vec::new();
        let mut kept = Vec::new();
        for (i, active, group) in self.items.drain(..) {
            let hit = selector.matches(i);
            match op {
                Op::Add if hit && !active => moved.push((i, true, in_group)),
                Op::Ord if hit && active => moved.push((i, true, false)),
                Op::Del if hit && active => moved.push((i, false, false)),
                Op::Kill if hit => {}
                _ => kept.push((i, active, group)),
            }
        }
        self.items = if op == Op::Del {
            moved.into_iter().chain(kept).collect()
        } else {
            kept.into_iter().chain(moved).collect()
        };
    }

    /// `ssl_cipher_strength_sort`: active suites by descending strength, stable.
    fn sort_by_strength(&mut self) {
        let mut bits: Vec<u32> = self
            .items
            .iter()
            .filter(|(_, active, _)| *active)
            .map(|(i, _, _)| CIPHERS[*i].strength())
            .collect();
        bits.sort_unstable_by(|a, b| b.cmp(a));
        bits.dedup();
        for b in bits {
            self.apply(&Selector::Strength(b), Op::Ord, false);
        }
    }

    /// `]`: the last suite of the list ends the group.
    fn close_group(&mut self) {
        if let Some(last) = self.items.last_mut() {
            last.2 = false;
        }
    }
}

fn is_name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_')
}

/// `ssl_cipher_process_rulestr` in strict mode.
fn process(rules: &[u8], list: &mut List, offset: usize) -> Result<(), RuleError> {
    let at = |l: usize| l + offset;
    let mut l = 0;
    let mut in_group = false;
    let mut has_group = false;
    while let Some(&ch) = rules.get(l) {
        let op;
        if in_group {
            match ch {
                b']' => {
                    list.close_group();
                    in_group = false;
                    l += 1;
                    continue;
                }
                b'|' => {
                    l += 1;
                    continue;
                }
                c if c.is_ascii_alphanumeric() => op = Op::Add,
                _ => return Err(RuleError::OperatorInGroup(at(l))),
            }
        } else {
            op = match ch {
                b'-' => Op::Del,
                b'+' => Op::Ord,
                b'!' => Op::Kill,
                b'@' => Op::Strength,
                b'[' => {
                    in_group = true;
                    has_group = true;
                    l += 1;
                    continue;
                }
                _ => Op::Add,
            };
            if op != Op::Add {
                l += 1;
            }
        }
        if has_group && op != Op::Add {
            return Err(RuleError::OperatorAfterGroup(at(l - 1)));
        }
        if ch == b':' {
            l += 1;
            continue;
        }

        let mut multi = false;
        let mut cipher = None;
        let mut alias = Alias {
            include_deprecated: op != Op::Add,
            ..alias(ANY, ANY, ANY, ANY)
        };
        let mut skip = false;
        let name = loop {
            let start = l;
            while rules.get(l).copied().is_some_and(is_name_char) {
                l += 1;
            }
            if l == start {
                return Err(RuleError::Syntax(at(l)));
            }
            let name = String::from_utf8_lossy(&rules[start..l]).into_owned();
            if op == Op::Strength {
                break name;
            }
            let joined = rules.get(l) == Some(&b'+');
            if !multi && !joined {
                cipher = CIPHERS
                    .iter()
                    .position(|c| c.name == name || c.standard_name == name);
            }
            if cipher.is_none() {
                let Some((_, a)) = ALIASES.iter().find(|(n, _)| *n == name) else {
                    if CIPHERS
                        .iter()
                        .any(|c| c.name == name || c.standard_name == name)
                    {
                        return Err(RuleError::CipherInCombination(name));
                    }
                    return Err(RuleError::Unknown(name));
                };
                alias.mkey &= a.mkey;
                alias.auth &= a.auth;
                alias.enc &= a.enc;
                alias.mac &= a.mac;
                alias.include_deprecated |= a.include_deprecated;
                if alias.min_version != 0 && alias.min_version != a.min_version {
                    skip = true;
                } else {
                    alias.min_version = a.min_version;
                }
            }
            if !joined {
                break name;
            }
            l += 1;
            multi = true;
        };

        if op == Op::Strength {
            if name != "STRENGTH" {
                return Err(RuleError::NotStrength(name));
            }
            list.sort_by_strength();
            // The rest of the rule is ignored.
            while rules.get(l).is_some_and(|&c| c != b':') {
                l += 1;
            }
        } else if !skip {
            let selector = cipher.map_or(Selector::Alias(alias), Selector::Cipher);
            list.apply(&selector, op, in_group);
        }
    }
    if in_group {
        return Err(RuleError::UnclosedGroup);
    }
    Ok(())
}

/// The TLS 1.2 suites BoringSSL selects for `rules` (`ssl_create_cipher_list`, strict),
/// in preference order; an error when BoringSSL refuses the string.
pub(crate) fn select(rules: &str) -> Result<Vec<&'static str>, RuleError> {
    let mut list = List {
        items: tls12().map(|i| (i, false, false)).collect(),
    };
    let mut rest = rules.as_bytes();
    let mut offset = 0;
    if let Some(after) = rest.strip_prefix(b"DEFAULT") {
        process(b"ALL", &mut list, 0)?;
        offset = 7;
        rest = after;
        if let Some(after) = rest.strip_prefix(b":") {
            rest = after;
            offset += 1;
        }
    }
    process(rest, &mut list, offset)?;
    let active: Vec<_> = list.items.iter().filter(|(_, a, _)| *a).collect();
    // BoringSSL refuses a list whose last suite is still in a group (cannot happen
    // after a closed group; kept for fidelity).
    if active.last().is_some_and(|(_, _, group)| *group) {
        return Err(RuleError::UnclosedGroup);
    }
    if active.is_empty() {
        return Err(RuleError::NoCipher);
    }
    Ok(active.iter().map(|(i, _, _)| CIPHERS[*i].name).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_leaves_out_the_deprecated_suites_and_3des_brings_them_back() {
        let all = select("ALL").unwrap();
        assert_eq!(all.len(), 19);
        assert!(!all.contains(&"DES-CBC3-SHA"));
        assert!(!all.contains(&"ECDHE-RSA-AES128-SHA256"));
        assert_eq!(select("-ALL:RSA+3DES").unwrap(), ["DES-CBC3-SHA"]);
        assert_eq!(
            select("ECDHE-RSA-AES128-SHA256").unwrap(),
            ["ECDHE-RSA-AES128-SHA256"]
        );
    }

    #[test]
    fn operators_move_delete_and_kill() {
        // `-` then add again: back at the end; `!` for good.
        let l = select("ALL:-AES128-SHA:AES128-SHA").unwrap();
        assert_eq!(l.last(), Some(&"AES128-SHA"));
        assert!(
            !select("ALL:!AES128-SHA:AES128-SHA")
                .unwrap()
                .contains(&"AES128-SHA")
        );
        let l = select("AES128-SHA:ECDHE-RSA-AES128-GCM-SHA256:+AES128-SHA").unwrap();
        assert_eq!(l, ["ECDHE-RSA-AES128-GCM-SHA256", "AES128-SHA"]);
        let l = select("AES128-SHA:ECDHE-RSA-CHACHA20-POLY1305:@STRENGTH").unwrap();
        assert_eq!(l, ["ECDHE-RSA-CHACHA20-POLY1305", "AES128-SHA"]);
        // A later alias without a version after `TLSv1.2` skips the rule.
        assert_eq!(select("TLSv1.2+AES128"), Err(RuleError::NoCipher));
        assert!(select("AES128+TLSv1.2").is_ok());
    }

    #[test]
    fn groups_and_their_restrictions() {
        assert!(select("[ECDHE+AES128|CHACHA20]").is_ok());
        assert_eq!(select("ALL:-[AES128]"), Err(RuleError::Syntax(5)));
        assert_eq!(
            select("[AES128|CHACHA20]:@STRENGTH"),
            Err(RuleError::OperatorAfterGroup(18))
        );
        assert_eq!(
            select("[AES128:CHACHA20]"),
            Err(RuleError::OperatorInGroup(7))
        );
        assert_eq!(select("[AES128"), Err(RuleError::UnclosedGroup));
        assert_eq!(select("[]"), Err(RuleError::NoCipher));
        assert!(select("@STRENGTH:[AES128|CHACHA20]").is_ok());
        assert!(select("-AES:[AES128|CHACHA20]").is_ok());
    }

    #[test]
    fn default_only_as_a_prefix() {
        assert!(select("DEFAULT").is_ok());
        assert!(select("DEFAULT:!AES").is_ok());
        assert_eq!(
            select("ALL:DEFAULT"),
            Err(RuleError::Unknown("DEFAULT".into()))
        );
        assert_eq!(select("DEFAULTX"), Err(RuleError::Unknown("X".into())));
    }
}

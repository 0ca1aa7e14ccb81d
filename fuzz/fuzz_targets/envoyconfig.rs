//! The EnvoyConfig decoder on arbitrary text: whole manifest files (`validate_file`:
//! multi-document YAML or JSON, Secrets, both resource forms) and single resources of
//! every type in JSON and YAML (`decode_str`). Property: never a panic, every error is a
//! value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use marin3r_envoyconfig::envoyconfig::validate_file;
use marin3r_envoyconfig::{ResourceType, Serialization, decode_str};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match selector % 3 {
        0 => {
            let _ = validate_file(text);
        }
        mode => {
            let kind = ResourceType::ALL[usize::from(selector / 3) % ResourceType::ALL.len()];
            let serialization = if mode == 1 {
                Serialization::Json
            } else {
                Serialization::Yaml
            };
            let _ = decode_str(kind, text, serialization);
        }
    }
});

//! One definition of the image: `image/contents.env` is what `scripts/image` builds from;
//! the `Dockerfile` (for users with Docker) must agree with it — the same user, entrypoint,
//! binaries at the same paths, a base with the same packages (distroless cc-debian12) —
//! and the image every manifest and generated object names is the one it builds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `KEY=value` / `KEY="a b"` lines of `image/contents.env` (comments and blanks skipped).
fn contents() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(repo().join("image/contents.env")).unwrap();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("not KEY=value: {l}"));
            (k.to_string(), v.trim_matches('"').to_string())
        })
        .collect()
}

/// The Dockerfile's instructions of its last (runtime) stage, continuation lines joined.
fn runtime_stage() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let joined = text.replace("\\\n", " ");
    let instructions: Vec<(String, String)> = joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (i, rest) = l.split_once(' ').unwrap_or((l, ""));
            (i.to_uppercase(), rest.trim().to_string())
        })
        .collect();
    let last_from = instructions.iter().rposition(|(i, _)| i == "FROM").unwrap();
    instructions[last_from..].to_vec()
}

fn one(stage: &[(String, String)], instruction: &str) -> String {
    let found: Vec<&String> = stage
        .iter()
        .filter(|(i, _)| i == instruction)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{instruction} in the Dockerfile's runtime stage: {found:?}"
    );
    found[0].clone()
}

#[test]
fn the_dockerfile_runtime_stage_matches_the_image_definition() {
    let c = contents();
    let stage = runtime_stage();
    assert_eq!(one(&stage, "FROM"), c["IMAGE_DOCKER_BASE"]);
    assert_eq!(one(&stage, "USER"), c["IMAGE_USER"]);
    assert_eq!(
        one(&stage, "ENTRYPOINT"),
        format!("[\"{}\"]", c["IMAGE_ENTRYPOINT"])
    );
    let copied: BTreeSet<String> = stage
        .iter()
        .filter(|(i, _)| i == "COPY")
        .map(|(_, v)| v.split_whitespace().last().unwrap().to_string())
        .collect();
    let binaries: BTreeSet<String> = c["IMAGE_BINARIES"]
        .split_whitespace()
        .map(|b| format!("/{b}"))
        .collect();
    assert_eq!(
        copied, binaries,
        "binaries the Dockerfile copies vs image/contents.env"
    );
    assert!(
        binaries.contains(&c["IMAGE_ENTRYPOINT"]),
        "the entrypoint is one of the binaries"
    );
    // No ENV/RUN in the runtime stage: its environment is the base's (PATH, SSL_CERT_FILE),
    // which scripts/image writes from the same file.
    for (i, v) in &stage {
        assert!(
            matches!(i.as_str(), "FROM" | "COPY" | "USER" | "ENTRYPOINT"),
            "{i} {v}: the runtime stage may only copy the binaries and set user and entrypoint \
             (anything else must be added to image/contents.env and scripts/image too)"
        );
    }
}

/// The image's user is numeric and not root: the manifests and the operator set no
/// `runAsUser` (OpenShift's restricted-v2 assigns one of the namespace's UIDs and refuses
/// any other), so on Kubernetes the kubelet checks `runAsNonRoot: true` against the
/// image's USER, which it can only do for a number.
#[test]
fn the_image_user_is_numeric_and_not_root() {
    let user = contents()["IMAGE_USER"].clone();
    let (uid, gid) = user.split_once(':').unwrap_or((&user, "0"));
    let uid: u32 = uid
        .parse()
        .unwrap_or_else(|_| panic!("USER {user} is not numeric"));
    let _: u32 = gid
        .parse()
        .unwrap_or_else(|_| panic!("USER {user}: group not numeric"));
    assert_ne!(uid, 0, "USER {user} is root");
    assert_eq!(one(&runtime_stage(), "USER"), user);
}

#[test]
fn the_image_packages_are_the_distroless_cc_set() {
    let c = contents();
    let packages: BTreeSet<&str> = c["IMAGE_PACKAGES"].split_whitespace().collect();
    let distroless_cc: BTreeSet<&str> = [
        "base-files",
        "netbase",
        "tzdata",
        "ca-certificates",
        "libc6",
        "libgcc-s1",
    ]
    .into();
    assert_eq!(packages, distroless_cc);
    assert!(c["IMAGE_DOCKER_BASE"].starts_with("gcr.io/distroless/cc-debian12"));
}

#[test]
fn every_manifest_and_default_names_the_image_scripts_image_builds() {
    let c = contents();
    let version = env!("CARGO_PKG_VERSION");
    let built = format!("{}:v{version}", c["IMAGE_NAME"]);
    assert_eq!(marin3r_wire::images::MARIN3R, built);
    let mut seen = 0;
    let mut stack = vec![repo().join("manifests")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                let text = std::fs::read_to_string(&path).unwrap();
                // `NAME:tag` or `NAME@digest` (not `NAME-bundle`, the OLM images).
                let named = |l: &&str| {
                    l.contains(&format!("{}:", c["IMAGE_NAME"]))
                        || l.contains(&format!("{}@", c["IMAGE_NAME"]))
                };
                for line in text.lines().filter(named) {
                    seen += 1;
                    assert!(
                        line.contains(&built),
                        "{}: {line:?} names another tag than {built}",
                        path.display()
                    );
                }
            }
        }
    }
    assert!(
        seen >= 3,
        "the install manifests name the image ({seen} lines)"
    );
}

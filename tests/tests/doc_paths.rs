//! Every repository path that the docs, scripts, manifests and code comments name exists,
//! so that moving a file or renaming a test leaves no stale pointer behind.
//!
//! Scanned (tracked files, from `git ls-files`):
//! - whole files: `README.md`, `BENCHMARKS.md`, `bench/NOTES.md`, `docs/*.md`,
//!   `Dockerfile` and `scripts/*`;
//! - `#` comments of `manifests/**/*.yaml`;
//! - comments (`//`, `///`, `//!`) of every `.rs` file.
//!
//! Checked:
//! - a **path** is a token whose first component is a top-level directory of the
//!   repository, such as `xds/src/acknack.rs`, `docs/` or `manifests/operator` (also after
//!   `./`). It must exist as a file or a directory. A glob or a placeholder ends the token
//!   at the last `/` before it (`fuzz/fuzz_targets/*.rs` checks `fuzz/fuzz_targets/`).
//!   Container paths such as `/etc/envoy/bootstrap` and crate-relative ones such as
//!   `src/lib.rs` do not start with a top-level directory, so they are not paths here;
//! - `file.rs::name` also needs a `fn name` in that file (a test pointer);
//! - a relative Markdown link (`[x](operator.md#watches)`) needs its target, and for a
//!   Markdown target, its heading (GitHub's anchor of it).
//!
//! Everything that fails is listed at once.
//!
//! Commands are checked the same way ([`every_command_the_docs_and_comments_name_exists`]):
//! in the same files, every `cargo <test|bench|run|build|check|clippy|nextest run>` must
//! name workspace packages (`-p X`) that exist, and each `--test`, `--bench`, `--example`
//! or `--bin` target must exist in that package (or, without `-p`, in some package).
#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Paths that are named on purpose but are not in the repository, each with the reason.
/// Only repository-relative tokens are checked, so only those need an entry here.
const EXCEPTIONS: &[(&str, &str)] = &[
    // Written by `cargo fuzz` and git-ignored (`scripts/fuzz-smoke`, docs/reliability.md).
    ("fuzz/corpus/", "cargo fuzz's working corpus, git-ignored"),
    (
        "fuzz/artifacts/",
        "cargo fuzz's crash artifacts, git-ignored",
    ),
    ("fuzz/target", "cargo fuzz's build directory, git-ignored"),
];

/// Characters a path token is made of (a `*`, `{`, `<` or `…` ends it as a prefix).
fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/')
}

/// Characters that, right before a token, make it part of a longer word or path.
fn glues(c: char) -> bool {
    is_path_char(c) || matches!(c, '~' | '$' | '@' | ':')
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The tracked files, repository-relative with `/` separators.
fn tracked_files(root: &Path) -> Vec<String> {
    let output = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root)
        .output();
    match output {
        Ok(out) if out.status.success() => String::from_utf8(out.stdout)
            .unwrap()
            .split('\0')
            .filter(|f| !f.is_empty())
            .map(str::to_string)
            .collect(),
        // Not a git checkout (a source tarball): every file but build output and
        // hidden directories.
        _ => {
            let mut files = Vec::new();
            walk(root, root, &mut files);
            files
        }
    }
}

fn walk(root: &Path, dir: &Path, files: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" {
                walk(root, &path, files);
            }
        } else {
            let rel = path.strip_prefix(root).unwrap();
            files.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// How a file is scanned: all of it, or only its comments.
#[derive(Clone, Copy, PartialEq)]
enum Scan {
    Whole,
    HashComments,
    RustComments,
}

fn scan_kind(file: &str) -> Option<Scan> {
    let top_md = matches!(file, "README.md" | "BENCHMARKS.md" | "bench/NOTES.md");
    let doc = file.starts_with("docs/") && file.ends_with(".md") && file.matches('/').count() == 1;
    if top_md || doc || file == "Dockerfile" || file.starts_with("scripts/") {
        Some(Scan::Whole)
    } else if file.starts_with("manifests/") && file.ends_with(".yaml") {
        Some(Scan::HashComments)
    } else if file.ends_with(".rs") {
        Some(Scan::RustComments)
    } else {
        None
    }
}

/// Whether `line[..at]` has an even number of unescaped `"`: `at` is outside a string.
fn outside_string(line: &str, at: usize) -> bool {
    let mut quotes = 0;
    let mut escaped = false;
    for c in line[..at].chars() {
        match c {
            '\\' if !escaped => escaped = true,
            '"' if !escaped => quotes += 1,
            _ => escaped = false,
        }
        if c != '\\' {
            escaped = false;
        }
    }
    quotes % 2 == 0
}

/// The part of `line` to scan: a `//` comment of Rust, a `#` comment of YAML.
fn comment(line: &str, scan: Scan) -> Option<&str> {
    let marker = match scan {
        Scan::Whole => return Some(line),
        Scan::RustComments => "//",
        Scan::HashComments => "#",
    };
    let trimmed = line.trim_start();
    if trimmed.starts_with(marker) {
        return Some(trimmed);
    }
    let spaced = format!(" {marker}");
    line.match_indices(&spaced)
        .map(|(at, _)| at)
        .find(|&at| outside_string(line, at))
        .map(|at| &line[at + 1..])
}

/// One path named in a file.
struct Token {
    path: String,
    /// `name` of `path.rs::name`.
    function: Option<String>,
}

/// The repository paths named in `text` (tokens starting with one of `tops`, each
/// given with its `/`).
fn tokens(text: &str, tops: &[String]) -> Vec<Token> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let (at, _) = chars[i];
        let before = |k: usize| i.checked_sub(k).map(|j| chars[j].1);
        let boundary = match before(1) {
            None => true,
            Some('/') if before(2) == Some('.') => before(3).is_none_or(|c| !glues(c)),
            Some(c) => !glues(c),
        };
        if !boundary || !tops.iter().any(|top| text[at..].starts_with(top.as_str())) {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < chars.len() && is_path_char(chars[j].1) {
            j += 1;
        }
        let end = chars.get(j).map_or(text.len(), |&(e, _)| e);
        let mut path = text[at..end].to_string();
        if chars
            .get(j)
            .is_some_and(|&(_, c)| matches!(c, '*' | '{' | '<' | '…'))
        {
            // A glob or a placeholder: what comes before its component is the path.
            path.truncate(path.rfind('/').map_or(0, |s| s + 1));
        }
        while path.ends_with('.') {
            path.pop();
        }
        let rest = &text[end..];
        let function = (path.ends_with(".rs") && rest.starts_with("::"))
            .then(|| {
                let name: String = rest[2..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                (!name.is_empty()).then_some(name)
            })
            .flatten();
        found.push(Token { path, function });
        i = j.max(i + 1);
    }
    found
}

/// `fn name` is defined in `source`.
fn defines(source: &str, name: &str) -> bool {
    source.match_indices(&format!("fn {name}")).any(|(at, m)| {
        source[at + m.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
    })
}

/// GitHub's anchors of the headings of a Markdown file (outside code blocks).
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        if fenced {
            continue;
        }
        let text = heading.trim_start_matches('#').trim();
        let slug: String = text
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while !anchors.insert(unique.clone()) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
    }
    anchors
}

/// The relative link targets of a Markdown line: `[text](target)`.
fn links(line: &str) -> Vec<&str> {
    line.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &line[at + 2..];
            let end = rest.find(')')?;
            let target = &rest[..end];
            let external = target.contains("://") || target.starts_with("mailto:");
            (!external && !target.is_empty() && !target.contains(' ')).then_some(target)
        })
        .collect()
}

#[test]
fn every_path_the_docs_and_comments_name_exists() {
    let root = root();
    let files = tracked_files(&root);
    let tops: BTreeSet<String> = files
        .iter()
        .filter_map(|f| f.split_once('/').map(|(top, _)| format!("{top}/")))
        .collect();
    assert!(
        tops.contains("docs/") && tops.contains("xds/"),
        "tops: {tops:?}"
    );
    let tops: Vec<String> = tops.into_iter().collect();
    let excepted = |path: &str| EXCEPTIONS.iter().any(|(p, _)| path == *p);

    let mut stale = Vec::new();
    let mut scanned = 0;
    for file in &files {
        let Some(scan) = scan_kind(file) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(root.join(file)) else {
            continue; // deleted in the work tree, or not text
        };
        scanned += 1;
        let markdown = file.ends_with(".md");
        for (n, line) in text.lines().enumerate() {
            let at = format!("{file}:{}", n + 1);
            let Some(part) = comment(line, scan) else {
                continue;
            };
            for token in tokens(part, &tops) {
                let path = root.join(&token.path);
                if excepted(&token.path) {
                    continue;
                }
                if !path.exists() {
                    stale.push(format!("{at}: {} does not exist", token.path));
                } else if let Some(name) = &token.function {
                    let source = std::fs::read_to_string(&path).unwrap_or_default();
                    if !defines(&source, name) {
                        stale.push(format!(
                            "{at}: {}::{name}: no `fn {name}` there",
                            token.path
                        ));
                    }
                }
            }
            if !markdown {
                continue;
            }
            for target in links(line) {
                let (target_file, anchor) = match target.split_once('#') {
                    Some((f, a)) => (f, Some(a)),
                    None => (target, None),
                };
                let dir = Path::new(file).parent().unwrap_or(Path::new(""));
                let resolved = if target_file.is_empty() {
                    root.join(file)
                } else {
                    root.join(dir).join(target_file)
                };
                if !resolved.exists() {
                    stale.push(format!("{at}: link {target}: no such file"));
                    continue;
                }
                let is_md = resolved.extension().is_some_and(|e| e == "md");
                if let (Some(anchor), true) = (anchor, is_md) {
                    let headings = anchors(&std::fs::read_to_string(&resolved).unwrap());
                    if !headings.contains(anchor) {
                        stale.push(format!("{at}: link {target}: no such heading"));
                    }
                }
            }
        }
    }
    assert!(scanned > 100, "only {scanned} files scanned");
    assert!(
        stale.is_empty(),
        "{} stale path(s) in docs, scripts and comments (fix the pointer, or add a \
         commented entry to EXCEPTIONS for a path that is not a repository path):\n{}",
        stale.len(),
        stale.join("\n")
    );
}

/// A cargo command named in a file: its packages and targets.
#[derive(Debug, PartialEq)]
struct CargoCommand {
    packages: Vec<String>,
    /// (`test` | `bench` | `example` | `bin`, name)
    targets: Vec<(String, String)>,
}

/// The cargo commands in `text`: `cargo` then a build subcommand, read up to the end of
/// the command (a backtick, a quote, `;`, `|`, `&`, `)` or the end of the line).
fn cargo_commands(text: &str) -> Vec<CargoCommand> {
    const SUBCOMMANDS: [&str; 7] = [
        "test", "bench", "run", "build", "check", "clippy", "nextest",
    ];
    let mut found = Vec::new();
    for (at, _) in text.match_indices("cargo ") {
        let glued = text[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '/'));
        if glued {
            continue;
        }
        let rest = &text[at + "cargo ".len()..];
        let end = rest
            .find(['`', '"', '\'', ';', '|', '&', ')', '\n'])
            .unwrap_or(rest.len());
        let words: Vec<&str> = rest[..end].split_whitespace().collect();
        if !words.first().is_some_and(|w| SUBCOMMANDS.contains(w)) {
            continue;
        }
        let mut command = CargoCommand {
            packages: Vec::new(),
            targets: Vec::new(),
        };
        let mut i = 1;
        while i < words.len() {
            let word = words[i];
            if word == "--" {
                break; // the test binary's own arguments
            }
            let value = words.get(i + 1).map(|v| v.to_string());
            let placeholder = |v: &str| v.contains(['<', '$', '{', '*', '…']) || v.starts_with('-');
            match (word, value) {
                ("-p" | "--package", Some(v)) if !placeholder(&v) => {
                    command.packages.push(v);
                    i += 1;
                }
                ("--test" | "--bench" | "--example" | "--bin", Some(v)) if !placeholder(&v) => {
                    command
                        .targets
                        .push((word.trim_start_matches("--").to_string(), v));
                    i += 1;
                }
                _ => {}
            }
            i += 1;
        }
        found.push(command);
    }
    found
}

/// A workspace package: its name, folder and declared targets (`[[test]] name = …`).
struct Package {
    name: String,
    dir: PathBuf,
    manifest: String,
}

impl Package {
    /// Whether the package has a `kind` target called `name` (cargo's auto-discovered
    /// files, or one declared in its manifest).
    fn has_target(&self, kind: &str, name: &str) -> bool {
        let folder = match kind {
            "test" => "tests",
            "bench" => "benches",
            "example" => "examples",
            _ => "src/bin",
        };
        let declared = format!("[[{kind}]]");
        let file = self.dir.join(folder).join(format!("{name}.rs"));
        let main = self.dir.join(folder).join(name).join("main.rs");
        let named_in_manifest = self.manifest.split(&declared).skip(1).any(|section| {
            section
                .lines()
                .take_while(|l| !l.starts_with("[["))
                .any(|l| l.replace(' ', "") == format!("name=\"{name}\""))
        });
        let binary_is_package =
            kind == "bin" && name == self.name && self.dir.join("src/main.rs").exists();
        file.exists() || main.exists() || named_in_manifest || binary_is_package
    }
}

/// The workspace members of the root manifest.
fn workspace_packages(root: &Path) -> Vec<Package> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("members = "))
        .unwrap();
    members
        .trim_matches(['[', ']'])
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|member| {
            let dir = root.join(member);
            let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
            let name = manifest
                .lines()
                .find_map(|l| l.trim().strip_prefix("name = "))
                .unwrap()
                .trim_matches('"')
                .to_string();
            Package {
                name,
                dir,
                manifest,
            }
        })
        .collect()
}

#[test]
fn every_command_the_docs_and_comments_name_exists() {
    let root = root();
    let packages = workspace_packages(&root);
    assert!(packages.len() > 10 && packages.iter().any(|p| p.name == "marin3r-tests"));
    let mut stale = Vec::new();
    let mut checked = 0;
    for file in tracked_files(&root) {
        let Some(scan) = scan_kind(&file) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(root.join(&file)) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            let Some(part) = comment(line, scan) else {
                continue;
            };
            for command in cargo_commands(part) {
                checked += 1;
                let at = format!("{file}:{}", n + 1);
                let mut named = Vec::new();
                for name in &command.packages {
                    match packages.iter().find(|p| &p.name == name) {
                        Some(p) => named.push(p),
                        None => stale.push(format!("{at}: no workspace package {name}")),
                    }
                }
                let candidates: Vec<&Package> = if command.packages.is_empty() {
                    packages.iter().collect()
                } else {
                    named
                };
                for (kind, name) in &command.targets {
                    if !candidates.iter().any(|p| p.has_target(kind, name)) {
                        stale.push(format!(
                            "{at}: no {kind} target {name} in {:?}",
                            command.packages
                        ));
                    }
                }
            }
        }
    }
    assert!(checked > 30, "only {checked} cargo commands found");
    assert!(
        stale.is_empty(),
        "{} stale command(s) in docs, scripts and comments:\n{}",
        stale.len(),
        stale.join("\n")
    );
}

#[test]
fn the_command_scanner_reads_packages_and_targets() {
    let commands = cargo_commands(
        "run `cargo test -p marin3r-x --test y -- --ignored` or cargo bench -p a --bench b; \
         not xcargo test -p no, nor `cargo fmt -p fmt`, and `cargo test -p <crate>` is a placeholder",
    );
    assert_eq!(
        commands,
        [
            CargoCommand {
                packages: vec!["marin3r-x".into()],
                targets: vec![("test".into(), "y".into())]
            },
            CargoCommand {
                packages: vec!["a".into()],
                targets: vec![("bench".into(), "b".into())]
            },
            CargoCommand {
                packages: vec![],
                targets: vec![]
            },
        ]
    );
    let root = root();
    let packages = workspace_packages(&root);
    let tests = packages.iter().find(|p| p.name == "marin3r-tests").unwrap();
    assert!(tests.has_target("test", "doc_paths") && tests.has_target("bench", "edit_to_serve"));
    assert!(!tests.has_target("test", "no_such_test"));
    let cli = packages.iter().find(|p| p.name == "marin3r").unwrap();
    assert!(cli.has_target("bin", "marin3r"));
}

#[test]
fn the_scanner_finds_what_it_should() {
    let tops: Vec<String> = ["docs/", "xds/", "scripts/", "fuzz/"]
        .into_iter()
        .map(String::from)
        .collect();
    let paths = |text: &str| {
        tokens(text, &tops)
            .into_iter()
            .map(|t| match t.function {
                Some(f) => format!("{}::{f}", t.path),
                None => t.path,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        paths("see `xds/src/acknack.rs::a_test`, docs/design.md. And ./scripts/test"),
        [
            "xds/src/acknack.rs::a_test",
            "docs/design.md",
            "scripts/test"
        ]
    );
    // Not repository paths: absolute, nested in another path, crate-relative, URLs.
    assert!(
        paths("/etc/envoy/xds/x ../docs/a.md src/xds/y https://h/docs/z .venv/xds/").is_empty()
    );
    // A glob or a placeholder ends the path at its directory.
    assert_eq!(
        paths("fuzz/fuzz_targets/*.rs docs/<name>.md"),
        ["fuzz/fuzz_targets/", "docs/"]
    );
    // (Paths that exist: this file's own comments are scanned, and a raw string is not
    // told apart from code.)
    assert_eq!(
        comment(
            r#"    let u = "http://x"; // see docs/design.md"#,
            Scan::RustComments
        ),
        Some("// see docs/design.md")
    );
    assert_eq!(
        comment(r#"let u = "a // docs/design.md";"#, Scan::RustComments),
        None
    );
    assert!(defines("fn a_test() {}", "a_test") && !defines("fn a_test_2() {}", "a_test"));
    let headings =
        anchors("# Title\n## 1.1 Trigger\n```\n# not a heading\n```\n## 6. A ↔ B (`x/y`)\n");
    assert_eq!(
        headings.into_iter().collect::<Vec<_>>(),
        ["11-trigger", "6-a--b-xy", "title"]
    );
    assert_eq!(
        links("[a](design.md#4-x), [b](https://e.org/a), [c](#top)"),
        ["design.md#4-x", "#top"]
    );
}

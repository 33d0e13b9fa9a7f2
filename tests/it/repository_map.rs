//! The repository's map and changelog name only what exists: every repository path that
//! ARCHITECTURE.md and CHANGELOG.md write in a code span or a link, and every test they cite
//! as `file::test`, is there; and the README links both files.
//!
//! A code span or link target is taken for a repository path when it holds nothing but
//! letters, digits and `_ . - /`, at least one letter, and either a `/` or a name ending in
//! `.rs`, `.lua`, `.md` or `.toml`; one that starts with `/` (a route such as `/orders`) or
//! holds `://` (a URL) is not. So Rust paths (`tollgate::key::ClientIp`), calls, URLs and
//! CIDR blocks are left alone. A path followed by `::name` after `.rs` cites a test: the file
//! must exist and define `fn name`.

use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The documents whose paths are checked.
const DOCUMENTS: [&str; 2] = ["ARCHITECTURE.md", "CHANGELOG.md"];

/// What a code span or link names in the repository.
#[derive(Debug, PartialEq, Eq)]
enum Named {
    /// A file or folder (a trailing `/` asks for a folder).
    Path(String),
    /// A test: the file it is in, and the name of its function.
    Test { file: String, name: String },
}

fn read(name: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(name))
        .unwrap_or_else(|error| panic!("cannot read {name}: {error}"))
}

/// The text outside fenced code blocks, whose contents are code, not references.
fn outside_fences(text: &str) -> String {
    let mut kept = String::with_capacity(text.len());
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

/// The contents of the inline code spans, as CommonMark reads them: a run of n backticks
/// opens a span that the next run of exactly n closes, so ``a `b` c`` is one span.
fn code_spans(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let run_at = |at: usize| bytes[at..].iter().take_while(|&&b| b == b'`').count();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'`' {
            i += 1;
            continue;
        }
        let opening = run_at(i);
        let start = i + opening;
        let mut j = start;
        let mut close = None;
        while j < bytes.len() {
            if bytes[j] == b'`' {
                let run = run_at(j);
                if run == opening {
                    close = Some(j);
                    break;
                }
                j += run;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                spans.push(text[start..end].replace('\n', " ").trim().to_owned());
                i = end + opening;
            }
            // An unmatched run is literal backticks.
            None => i = start,
        }
    }
    spans
}

/// The targets of the inline links, `[text](target)`, without a `#fragment`.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].trim();
        let target = target.split('#').next().unwrap_or_default();
        if !target.is_empty() {
            targets.push(target.to_owned());
        }
        rest = &rest[end..];
    }
    targets
}

/// What `token` names in the repository, if it reads as a repository path (see the module
/// docs for the rule).
fn named(token: &str) -> Option<Named> {
    if token.contains("://") || token.starts_with('/') || token.starts_with("mailto:") {
        return None;
    }
    let (path, test) = match token.split_once(".rs::") {
        Some((file, name)) => (format!("{file}.rs"), Some(name)),
        None => (token.to_owned(), None),
    };
    let path_chars = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/');
    if path.is_empty()
        || !path.chars().all(path_chars)
        || !path.chars().any(|c| c.is_ascii_alphabetic())
    {
        return None;
    }
    match test {
        Some(name)
            if !name.is_empty() && name.chars().all(|c| c == '_' || c.is_ascii_alphanumeric()) =>
        {
            Some(Named::Test {
                file: path,
                name: name.to_owned(),
            })
        }
        Some(_) => None,
        None => {
            let file_like = [".rs", ".lua", ".md", ".toml"]
                .iter()
                .any(|extension| path.ends_with(extension));
            (path.contains('/') || file_like).then_some(Named::Path(path))
        }
    }
}

/// Whether `source` defines a function `name` (a test, or a property test's body).
fn defines_fn(source: &str, name: &str) -> bool {
    let definition = format!("fn {name}");
    source.match_indices(&definition).any(|(at, _)| {
        let after = source[at + definition.len()..].chars().next();
        matches!(after, Some('(' | '<'))
    })
}

/// Why `named` does not hold in this repository, if it does not.
fn missing(named: &Named) -> Option<String> {
    let root = Path::new(ROOT);
    match named {
        Named::Path(path) => {
            let on_disk = root.join(path);
            let there = if path.ends_with('/') {
                on_disk.is_dir()
            } else {
                on_disk.exists()
            };
            (!there).then(|| format!("`{path}` does not exist"))
        }
        Named::Test { file, name } => match std::fs::read_to_string(root.join(file)) {
            Err(_) => Some(format!("`{file}::{name}`: `{file}` does not exist")),
            Ok(source) if !defines_fn(&source, name) => {
                Some(format!("`{file}::{name}`: `{file}` defines no `fn {name}`"))
            }
            Ok(_) => None,
        },
    }
}

/// Everything a document names in the repository, in the order it names it.
fn named_in(document: &str) -> Vec<Named> {
    let text = outside_fences(document);
    code_spans(&text)
        .iter()
        .chain(&link_targets(&text))
        .filter_map(|token| named(token))
        .collect()
}

#[test]
fn the_architecture_and_the_changelog_name_only_what_exists() {
    let mut problems = Vec::new();
    for name in DOCUMENTS {
        for named in named_in(&read(name)) {
            if let Some(problem) = missing(&named) {
                problems.push(format!("{name}: {problem}"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} reference(s) to nothing in the repository:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The map is read at all: the request path names its files and the invariants their tests.
#[test]
fn the_architecture_names_files_and_tests() {
    let named = named_in(&read("ARCHITECTURE.md"));
    let paths = named.iter().filter(|n| matches!(n, Named::Path(_))).count();
    let tests = named
        .iter()
        .filter(|n| matches!(n, Named::Test { .. }))
        .count();
    assert!(paths >= 50, "only {paths} paths found in ARCHITECTURE.md");
    assert!(tests >= 4, "only {tests} tests cited in ARCHITECTURE.md");
}

#[test]
fn the_readme_links_the_architecture_and_the_changelog() {
    let readme = read("README.md");
    let targets = link_targets(&outside_fences(&readme));
    let unlinked: Vec<&str> = DOCUMENTS
        .into_iter()
        .filter(|document| !targets.iter().any(|target| target == document))
        .collect();
    assert!(unlinked.is_empty(), "README.md does not link {unlinked:?}");
}

#[test]
fn rust_paths_urls_routes_and_calls_are_not_repository_paths() {
    for token in [
        "tollgate::key::ClientIp",
        "store::CallerKey::MAX_KEY_BYTES",
        "https://docs.rs/tollgate/latest/tollgate/guide/index.html",
        "rediss://",
        "/orders",
        "POST /v1/completions",
        "10.0.0.0/8",
        "ClientIp::new().trusted_proxies([\"10.0.0.0/8\"])?",
        "application/problem+json",
        "Quota::per_second(50)",
        "1.95",
        "#grpc",
    ] {
        assert_eq!(named(token), None, "{token}");
    }
    let path = |p: &str| Some(Named::Path(p.to_owned()));
    assert_eq!(named("src/lib.rs"), path("src/lib.rs"));
    assert_eq!(named("src/http/key/"), path("src/http/key/"));
    assert_eq!(named("README.md"), path("README.md"));
    assert_eq!(named("lua/policies.lua"), path("lua/policies.lua"));
    assert_eq!(
        named("tests/it/counts.rs::local_shares_never_sum_past_the_limit"),
        Some(Named::Test {
            file: "tests/it/counts.rs".to_owned(),
            name: "local_shares_never_sum_past_the_limit".to_owned(),
        })
    );
    assert_eq!(
        code_spans("a `b` and ``c `d` e``, `` ` ``, an unmatched ` here"),
        ["b", "c `d` e", "`"]
    );
    assert_eq!(
        link_targets("[x](docs/guide/leases.md) [y](https://a.b/c#d) [z](#here)"),
        ["docs/guide/leases.md", "https://a.b/c"]
    );
}

#[test]
fn a_cited_test_must_be_defined_in_its_file() {
    let cited = |name: &str| Named::Test {
        file: "tests/it/repository_map.rs".to_owned(),
        name: name.to_owned(),
    };
    assert_eq!(
        missing(&cited("a_cited_test_must_be_defined_in_its_file")),
        None
    );
    assert!(missing(&cited("no_such_test")).is_some());
    assert!(missing(&Named::Path("src/no_such_file.rs".to_owned())).is_some());
    assert!(missing(&Named::Path("src/lib.rs/".to_owned())).is_some());
}

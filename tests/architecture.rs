//! The house rules, checked on the source (issue #43): no import circles
//! between modules, and no production file past ~800 lines. Both are easy
//! to break one line at a time and hard to repair later.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A file's production source: before its test module, without comments.
fn production(src: &str) -> String {
    let body = src.find("#[cfg(test)]").map_or(src, |at| &src[..at]);
    body.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module a file belongs to, as the circles are judged: a top-level
/// module of the crate (`store`, `lease`, `wake`, ...), or one of `fleet`'s
/// (`fleet::node`, `fleet::claim`, ...); `fleet/mod.rs` is `fleet`.
fn unit(rel: &Path) -> String {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    match parts.as_slice() {
        [f, m, ..] if f == "fleet" => format!("fleet::{m}"),
        [first, ..] => first.clone(),
        [] => "lib".into(),
    }
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The module path of a file: `fleet/node/pass.rs` is `fleet::node::pass`,
/// `fleet/node/mod.rs` is `fleet::node`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The unit a module path falls in (see [`unit`]).
fn unit_of(path: &[String]) -> Option<String> {
    match path {
        [f, m, ..] if f == "fleet" => Some(format!("fleet::{m}")),
        [first, ..] => Some(first.clone()),
        [] => None,
    }
}

/// The modules `src` (of module `at`) names: `crate::a::...` and
/// `super::...` chains, resolved from `at`.
fn names(src: &str, at: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = src.as_bytes();
    let mut i = 0;
    while i < src.len() {
        let rest = &src[i..];
        let starts_word = i == 0
            || !(bytes[i - 1].is_ascii_alphanumeric()
                || bytes[i - 1] == b'_'
                || bytes[i - 1] == b':');
        let (mut base, mut tail) = if starts_word && rest.starts_with("crate::") {
            (Vec::new(), &rest["crate::".len()..])
        } else if starts_word && rest.starts_with("super::") {
            let mut base = at.to_vec();
            let mut tail = rest;
            while let Some(t) = tail.strip_prefix("super::") {
                base.pop();
                tail = t;
            }
            (base, tail)
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        // Up to two more segments that name modules (lower case).
        for _ in 0..2 {
            let id = ident_at(tail);
            if id.is_empty() || !id.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
                break;
            }
            base.push(id.to_string());
            match tail[id.len()..].strip_prefix("::") {
                Some(t) => tail = t,
                None => break,
            }
        }
        if let Some(u) = unit_of(&base) {
            out.insert(u);
        }
        i += 1;
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| unit(f.strip_prefix(&root).unwrap()))
        .collect();
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&root).unwrap();
        let u = unit(rel);
        let src = production(&std::fs::read_to_string(f).unwrap());
        let entry = deps.entry(u.clone()).or_default();
        for n in names(&src, &module_path(rel)) {
            // Functions of `fleet/mod.rs` (`crate::fleet::put_checked`)
            // are `fleet`'s.
            let n = if modules.contains(&n) {
                n
            } else if n.starts_with("fleet::") {
                "fleet".to_string()
            } else {
                continue;
            };
            if n != u {
                entry.insert(n);
            }
        }
    }
    deps
}

/// A circle through `start`, if there is one.
fn circle(deps: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn walk(
        deps: &BTreeMap<String, BTreeSet<String>>,
        start: &str,
        at: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in deps.get(at).into_iter().flatten() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(deps, start, next, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    walk(deps, start, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

/// `fleet` (its `mod.rs`: the checked write every writer uses) sits below
/// its submodules, and `lib` re-exports everything: both are left out.
#[test]
fn no_module_imports_one_that_imports_it_back() {
    let deps = graph();
    assert!(
        deps.get("fleet::node")
            .is_some_and(|d| d.contains("fleet::core")),
        "the scan finds nothing: {deps:?}"
    );
    let circles: Vec<String> = deps
        .keys()
        .filter(|m| *m != "fleet" && *m != "lib")
        .filter_map(|m| circle(&deps, m))
        .map(|c| c.join(" -> "))
        .collect();
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_scan_finds_a_circle_when_there_is_one() {
    let mut deps = graph();
    deps.entry("store".into())
        .or_default()
        .insert("wake".into());
    let c = circle(&deps, "store").expect("wake -> store -> wake");
    assert_eq!(c.first().map(String::as_str), Some("store"));
    assert_eq!(c.last().map(String::as_str), Some("store"));
}

/// Past this, a file holds more than one job (docs/map.md names each
/// file's one job).
const MAX_PRODUCTION_LINES: usize = 800;

#[test]
fn no_production_file_is_past_800_lines() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&manifest.join("src"), &mut files);
    rust_files(&manifest.join("bin"), &mut files);
    assert!(files.len() > 50, "{} files", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let src = std::fs::read_to_string(f).unwrap();
            let body = src.find("#[cfg(test)]").map_or(&src[..], |at| &src[..at]);
            let n = body.lines().count();
            (n > MAX_PRODUCTION_LINES).then(|| format!("{}: {n}", f.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files past {MAX_PRODUCTION_LINES} lines: {long:?}"
    );
}

/// Every `LEASEHOLD_*` variable the code reads or sets is in the
/// configuration section of docs/operations.md (issue #44: three were not).
#[test]
fn every_variable_is_documented() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&manifest.join("src"), &mut files);
    rust_files(&manifest.join("bin"), &mut files);
    let mut vars = BTreeSet::new();
    for f in &files {
        let src = std::fs::read_to_string(f).unwrap();
        let mut rest = src.as_str();
        while let Some(at) = rest.find("LEASEHOLD_") {
            rest = &rest[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
                .unwrap_or(rest.len());
            let v = rest[..end].trim_end_matches('_');
            if v.len() > "LEASEHOLD_".len() {
                vars.insert(v.to_string());
            }
            rest = &rest[end.max(1)..];
        }
    }
    // Set by tests only, never read by the product.
    vars.retain(|v| !v.starts_with("LEASEHOLD_TEST") && !v.starts_with("LEASEHOLD_SIM"));
    assert!(vars.contains("LEASEHOLD_STORE"), "{vars:?}");
    let doc = std::fs::read_to_string(manifest.join("docs/operations.md")).unwrap();
    let config = &doc[doc
        .find("## Configuration")
        .expect("a configuration section")..];
    // That section only: up to the next heading of its level.
    let config = &config[..config[3..].find("\n## ").map_or(config.len(), |i| i + 3)];
    let missing: Vec<&String> = vars
        .iter()
        .filter(|v| !config.contains(&format!("`{v}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "not in docs/operations.md's configuration: {missing:?}"
    );
}

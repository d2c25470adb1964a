//! The docs against the tree: ARCHITECTURE.md's file map names every source file of the
//! workspace and nothing else, and every relative link in README.md, SECURITY.md,
//! ARCHITECTURE.md and docs/*.md points to a file that exists. Reads the tree only.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::{Path, PathBuf};

const MAP_HEADING: &str = "## File map";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The paths the file map names: the first backquoted word of each `- ` line between
/// `## File map` and the next `## ` heading.
fn map_paths(architecture: &str) -> Vec<String> {
    architecture
        .lines()
        .skip_while(|l| l.trim_end() != MAP_HEADING)
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| l.strip_prefix("- `"))
        .filter_map(|l| l.split_once('`').map(|(p, _)| p.to_string()))
        .collect()
}

/// Every `*.rs` under `MEMBER/src/` for each workspace member, relative to `root`, with `/`.
fn source_files(root: &Path) -> Vec<String> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(root).expect("under root");
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let mut out = Vec::new();
    for member in members(root) {
        let src = root.join(&member).join("src");
        if src.is_dir() {
            walk(&src, root, &mut out);
        }
    }
    out.sort();
    out
}

/// The workspace members, from the root Cargo.toml's `members = [...]`.
fn members(root: &Path) -> Vec<String> {
    let toml = fs::read_to_string(root.join("Cargo.toml")).expect("read Cargo.toml");
    let list = toml
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .expect("Cargo.toml has a members list");
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect()
}

/// What is wrong with `map` against the tree: paths that do not exist, source files it
/// does not name, paths named twice. Each message says how to fix it.
fn map_errors(map: &[String], exists: impl Fn(&str) -> bool, sources: &[String]) -> Vec<String> {
    let mut errors = Vec::new();
    if map.is_empty() {
        errors.push(format!(
            "ARCHITECTURE.md has no `{MAP_HEADING}` section with `- `path`: …` lines"
        ));
    }
    for (i, p) in map.iter().enumerate() {
        if !exists(p) {
            errors.push(format!(
                "{p}: named in ARCHITECTURE.md's file map but does not exist; remove or rename its line"
            ));
        }
        if map[..i].contains(p) {
            errors.push(format!(
                "{p}: named twice in ARCHITECTURE.md's file map; keep one line"
            ));
        }
    }
    for s in sources {
        if !map.contains(s) {
            errors.push(format!(
                "{s}: not in ARCHITECTURE.md's file map; add a line for {s} to ARCHITECTURE.md's file map (`- `{s}`: what it is for`)"
            ));
        }
    }
    errors
}

/// The relative link targets of a markdown text, outside fenced code blocks, without
/// their `#anchor`; web, mail and same-file anchor links are left out.
fn relative_links(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            rest = &rest[end..];
            let path = target.split('#').next().unwrap_or_default();
            let external = ["http://", "https://", "mailto:"]
                .iter()
                .any(|s| target.starts_with(s));
            if !external && !path.is_empty() {
                out.push(path.to_string());
            }
        }
    }
    out
}

fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["README.md", "SECURITY.md", "ARCHITECTURE.md"]
        .iter()
        .map(|f| root.join(f))
        .collect();
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

#[test]
fn file_map_names_every_source_file() {
    let root = root();
    let arch = fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let errors = map_errors(
        &map_paths(&arch),
        |p| root.join(p).is_file(),
        &source_files(&root),
    );
    assert!(
        errors.is_empty(),
        "ARCHITECTURE.md's file map is out of date:\n{}",
        errors.join("\n")
    );
}

#[test]
fn relative_links_point_to_files() {
    let root = root();
    let mut errors = Vec::new();
    for file in markdown_files(&root) {
        let text =
            fs::read_to_string(&file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let dir = file.parent().expect("a file has a directory");
        for link in relative_links(&text) {
            if !dir.join(&link).exists() {
                let name = file
                    .strip_prefix(&root)
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                errors.push(format!(
                    "{name}: link to {link}, which does not exist; fix the link or add the file"
                ));
            }
        }
    }
    assert!(errors.is_empty(), "broken links:\n{}", errors.join("\n"));
}

#[test]
fn a_hand_made_map_fails_naming_the_file() {
    let arch = "# A\n\n## File map\n\n- `a/src/lib.rs`: the crate\n- `a/src/gone.rs`: moved away\n\n## Next\n\n- `b/src/x.rs`: not in the map section\n";
    let map = map_paths(arch);
    assert_eq!(map, ["a/src/lib.rs", "a/src/gone.rs"]);
    let sources = ["a/src/lib.rs".to_string(), "a/src/new.rs".to_string()];
    let errors = map_errors(&map, |p| sources.iter().any(|s| s == p), &sources);
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0]
            .starts_with("a/src/gone.rs: named in ARCHITECTURE.md's file map but does not exist")
    );
    assert!(errors[1].contains("add a line for a/src/new.rs to ARCHITECTURE.md's file map"));
    assert_eq!(
        map_errors(&[], |_| true, &[]).len(),
        1,
        "an empty map is an error"
    );
    let twice = ["a/src/lib.rs".to_string(), "a/src/lib.rs".to_string()];
    assert_eq!(map_errors(&twice, |_| true, &sources[..1]).len(), 1);
}

#[test]
fn links_are_found_outside_fences_only() {
    let md = "see [a](docs/a.md#x), [web](https://e.org), [here](#top)\n```\n[no](in/fence.md)\n```\n[b](../b.md)\n";
    assert_eq!(relative_links(md), ["docs/a.md", "../b.md"]);
}

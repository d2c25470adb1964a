//! Floors: no crate's modules import each other in a loop. For every module with
//! submodules (the crate root included), its children must form a DAG, where a child uses
//! another when any file under it names a path under the other (`use crate::…`,
//! `crate::…::`, `super::…`). Uses of the parent itself (a `mod.rs` or the crate root) are
//! glue and do not count. A failure prints the loop, e.g. `olliesrv: fs -> model -> fs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every crate with sources.
const CRATES: &[&str] = &[
    "p9",
    "policy",
    "sandbox",
    "beads",
    "link",
    "toolsrv",
    "olliesrv",
    "cli",
    "tests",
    "tests/kit",
];

/// Crates whose loops are still being cut (issue 22). They must still have one: when the
/// last loop goes, this test fails until the crate is taken off the list, so that it is
/// held to floors from then on.
const STILL_LOOPED: &[&str] = &["olliesrv", "sandbox"];

type ModPath = Vec<String>;

/// One crate root (`src/lib.rs`, `src/main.rs` or `src/bin/NAME.rs`) and its module files.
#[derive(Debug)]
struct Root {
    name: String,
    /// Each module file's path below the root and its source.
    files: Vec<(ModPath, String)>,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `a/b.rs` → `[a, b]`, `a/mod.rs` → `[a]`, `lib.rs` → `[]`.
fn mod_path(rel: &Path) -> ModPath {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") || !parts.is_empty() && stem != "mod" {
        parts.push(stem.to_owned());
    }
    parts
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The crate roots of `krate`: the library and main binary share `src/`; each `src/bin/NAME.rs`
/// is its own root with its modules in `src/bin/NAME/`.
fn roots(krate: &str) -> Vec<Root> {
    let src = repo().join(krate).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let mut roots: BTreeMap<String, Vec<(ModPath, String)>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        let text = std::fs::read_to_string(&f).unwrap();
        let mut parts = rel.iter();
        let (root, path) = if rel.starts_with("bin") {
            parts.next();
            let first = parts.next().unwrap().to_string_lossy().into_owned();
            let name = first.trim_end_matches(".rs").to_owned();
            let rest: PathBuf = parts.collect();
            let path = if rest.as_os_str().is_empty() {
                Vec::new()
            } else {
                mod_path(&rest)
            };
            (format!("{krate} (bin {name})"), path)
        } else {
            (krate.to_owned(), mod_path(rel))
        };
        roots.entry(root).or_default().push((path, text));
    }
    roots
        .into_iter()
        .map(|(name, files)| Root { name, files })
        .collect()
}

/// `src` with comments, string and character literals blanked, so that only code is read.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == b'r' && matches!(b.get(i + 1), Some(b'"' | b'#')) && !ident_before(b, i) {
            let hashes = b[i + 1..].iter().take_while(|&&x| x == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            i += 2 + hashes;
            while i < b.len() && !b[i..].starts_with(&close) {
                i += 1;
            }
            i += close.len();
            out.push_str("\"\"");
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == b'\'' {
            // A character literal ('x', '\n', '\u{..}', '"'), or a lifetime ('a).
            let lit_end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&x| x == b'\'')
                    .map(|p| i + 3 + p)
            } else {
                let ch = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + ch) == Some(&b'\'')).then_some(i + 2 + ch)
            };
            match lit_end {
                Some(end) => {
                    out.push_str("' '");
                    i = end;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let ch = src[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

fn ident_before(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// The full paths a use-tree starting at `s` names: `a::b`, `a::{b, c::d}` → `[a,b]`,
/// `[a,c,d]`. Stops at the first character that cannot continue a path.
fn paths(s: &str) -> Vec<ModPath> {
    let mut out = Vec::new();
    tree(s.trim_start(), &mut Vec::new(), &mut out);
    out
}

fn tree<'a>(mut s: &'a str, prefix: &mut ModPath, out: &mut Vec<ModPath>) -> &'a str {
    let depth = prefix.len();
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix('{') {
            s = rest;
            loop {
                s = tree(s, prefix, out).trim_start();
                match s.as_bytes().first() {
                    Some(b',') => s = &s[1..],
                    Some(b'}') => {
                        s = &s[1..];
                        break;
                    }
                    _ => break,
                }
                if s.trim_start().starts_with('}') {
                    s = &s.trim_start()[1..];
                    break;
                }
            }
            prefix.truncate(depth);
            return s;
        }
        let n = s
            .bytes()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == b'_')
            .count();
        if n == 0 {
            break;
        }
        prefix.push(s[..n].to_owned());
        s = &s[n..];
        match s.trim_start().strip_prefix("::") {
            Some(rest) => s = rest,
            None => break,
        }
    }
    if prefix.len() > depth {
        out.push(prefix.clone());
    }
    prefix.truncate(depth);
    s
}

/// Every module path `code` (the file of module `here`) names through `crate::` or
/// `super::`, resolved to the longest known module.
fn uses(code: &str, here: &ModPath, known: &BTreeSet<ModPath>) -> BTreeSet<ModPath> {
    let mut found = BTreeSet::new();
    let b = code.as_bytes();
    for (at, _) in code
        .match_indices("crate::")
        .chain(code.match_indices("super::"))
    {
        if ident_before(b, at)
            || at >= 2 && &code[at - 2..at] == "::" && code[at..].starts_with("super")
        {
            continue;
        }
        let mut base: ModPath = Vec::new();
        let mut rest = &code[at..];
        if let Some(r) = rest.strip_prefix("crate::") {
            rest = r;
        } else {
            // Each `super` is the parent of the module before it.
            base = here.clone();
            while let Some(r) = rest.strip_prefix("super::") {
                rest = r;
                base.pop();
            }
        }
        for p in paths(rest) {
            let full: ModPath = base.iter().cloned().chain(p).collect();
            if let Some(m) = (0..=full.len())
                .rev()
                .map(|k| full[..k].to_vec())
                .find(|m| known.contains(m))
            {
                found.insert(m);
            }
        }
    }
    found
}

/// A loop among the children of one module, as `a -> b -> a`, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        mark: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        mark.insert(n.to_owned(), Mark::Open);
        stack.push(n.to_owned());
        for m in edges.get(n).into_iter().flatten() {
            match mark.get(m.as_str()).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let from = stack.iter().position(|s| s == m).unwrap_or(0);
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(c) = visit(m, edges, mark, stack) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        stack.pop();
        mark.insert(n.to_owned(), Mark::Done);
        None
    }
    let mut mark = BTreeMap::new();
    for n in edges.keys() {
        if mark.get(n.as_str()).copied().unwrap_or(Mark::New) == Mark::New
            && let Some(c) = visit(n, edges, &mut mark, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

/// Every loop in `root`, one line each (`NAME: a -> b -> a`, or `NAME, in x::y: …`).
fn loops(root: &Root) -> Vec<String> {
    let known: BTreeSet<ModPath> = root
        .files
        .iter()
        .flat_map(|(p, _)| (0..=p.len()).map(|k| p[..k].to_vec()))
        .collect();
    // Which modules each module file names.
    let mut named: Vec<(ModPath, BTreeSet<ModPath>)> = Vec::new();
    for (path, text) in &root.files {
        named.push((path.clone(), uses(&code_only(text), path, &known)));
    }
    let mut out = Vec::new();
    for parent in &known {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, targets) in &named {
            if from.len() <= parent.len() || !from.starts_with(parent) {
                continue;
            }
            let a = &from[parent.len()];
            for t in targets {
                if t.len() > parent.len() && t.starts_with(parent) && &t[parent.len()] != a {
                    edges
                        .entry(a.clone())
                        .or_default()
                        .insert(t[parent.len()].clone());
                }
            }
        }
        if let Some(c) = find_cycle(&edges) {
            let at = if parent.is_empty() {
                String::new()
            } else {
                format!(", in {}", parent.join("::"))
            };
            out.push(format!("{}{at}: {}", root.name, c.join(" -> ")));
        }
    }
    out
}

#[test]
fn no_crate_has_an_import_loop() {
    let mut problems = Vec::new();
    for krate in CRATES {
        let rs = roots(krate);
        assert!(!rs.is_empty(), "{krate}: no sources found");
        let found: Vec<String> = rs.iter().flat_map(loops).collect();
        if !STILL_LOOPED.contains(krate) {
            problems.extend(found);
        } else if found.is_empty() {
            problems.push(format!(
                "{krate}: no loop left; take it off STILL_LOOPED in tests/tests/floors.rs"
            ));
        } else {
            eprintln!("still looped (issue 22): {}", found.join("; "));
        }
    }
    assert!(
        problems.is_empty(),
        "modules that import each other in a loop (move the shared part down a floor, or \
         have the upper module pass what the lower one needs):\n{}",
        problems.join("\n")
    );
}

fn root(files: &[(&str, &str)]) -> Root {
    Root {
        name: "k".into(),
        files: files
            .iter()
            .map(|(p, t)| (mod_path(Path::new(p)), (*t).to_owned()))
            .collect(),
    }
}

#[test]
fn a_loop_is_found_and_named() {
    let r = root(&[
        ("lib.rs", "mod a; mod b; mod c; use crate::a::X;"),
        ("a.rs", "use crate::{b::Y, c};"),
        ("b.rs", "fn f() { crate::c::g() }"),
        ("c.rs", "use crate::a::Z;"),
    ]);
    assert_eq!(loops(&r), ["k: a -> b -> c -> a"]);
}

#[test]
fn a_loop_between_siblings_via_super_is_found() {
    let r = root(&[
        ("lib.rs", "mod t;"),
        ("t/mod.rs", "mod x; mod y; use self::x::A;"),
        ("t/x.rs", "use super::y::B;"),
        ("t/y.rs", "fn g() { super::x::C }"),
    ]);
    assert_eq!(loops(&r), ["k, in t: x -> y -> x"]);
}

#[test]
fn comments_strings_and_the_parent_are_not_uses() {
    let r = root(&[
        ("lib.rs", "mod a; mod b; use crate::a::A; use crate::b::B;"),
        (
            "a.rs",
            "// crate::b::B\nconst S: &str = \"crate::b\"; use crate::error_chain; fn f<'a>(c: char) -> bool { c == '\"' }",
        ),
        (
            "b.rs",
            "/* crate::a */ const R: &str = r#\"crate::a::A\"#; use crate::a::A;",
        ),
    ]);
    assert!(loops(&r).is_empty(), "{:?}", loops(&r));
}

#[test]
fn grouped_uses_are_expanded() {
    assert_eq!(
        paths("{a::{b, c::d}, e} ;"),
        [vec!["a", "b"], vec!["a", "c", "d"], vec!["e"]]
    );
    assert_eq!(paths("x::y::Z;"), [vec!["x", "y", "Z"]]);
}

//! Floors: no crate's modules import each other in a loop. For every module with
//! submodules (the crate root included), its children must form a DAG, where a child uses
//! another when any file under it names a path under the other (`use crate::…`,
//! `crate::…::`, `super::…`). Uses of the parent itself (a `mod.rs` or the crate root) are
//! glue and do not count; a name a module re-exports from a child (`pub use child::Name`)
//! counts as a use of that child; test modules (`#[cfg(test)] mod …`) are left out. A failure
//! prints the loop, e.g. `olliesrv: fs -> model -> fs`. olliesrv is also held to the order of
//! its `lib.rs`: each module imports only the ones declared after it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every crate with sources.
const CRATES: &[&str] = &[
    "p9",
    "policy",
    "sandbox",
    "beads",
    "proxy",
    "link",
    "toolsrv",
    "olliesrv",
    "cli",
    "tests",
    "tests/kit",
];

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
fn uses(
    code: &str,
    here: &ModPath,
    known: &BTreeSet<ModPath>,
    reexports: &BTreeMap<ModPath, ModPath>,
) -> BTreeSet<ModPath> {
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
            // A name a module re-exports from a child counts as a use of that child.
            let m = (0..=full.len()).rev().find_map(|k| {
                let m = full[..k].to_vec();
                reexports
                    .get(&m)
                    .cloned()
                    .or_else(|| known.contains(&m).then_some(m))
            });
            if let Some(m) = m {
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
/// `code` (comments and strings already gone) without its `#[cfg(test)] mod NAME { … }`
/// blocks: a test may build its inputs with any module of its crate, so test modules do not
/// make floors.
fn without_test_modules(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let t = after.trim_start();
        let is_mod = t.starts_with("mod ") || t.starts_with("pub(crate) mod ");
        let open = t.find('{');
        let semi = t.find(';');
        match (is_mod, open) {
            (true, Some(o)) if semi.is_none_or(|s| s > o) => {
                let body = &t[o..];
                let mut depth = 0usize;
                let mut end = body.len();
                for (i, c) in body.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                rest = &body[end..];
            }
            _ => {
                out.push_str("#[cfg(test)]");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[test]
fn test_modules_make_no_floors() {
    let r = root(&[
        ("lib.rs", "mod a; mod b;"),
        (
            "a.rs",
            "use crate::b::x;\n#[cfg(test)]\nmod tests { use crate::b::y; fn f() { {} } }",
        ),
        (
            "b.rs",
            "fn g() {}\n#[cfg(test)]\nmod tests {\n    use crate::a::z;\n}\n#[cfg(test)]\nfn h() { crate::a::w(); }",
        ),
    ]);
    // b's test module is left out; a function under cfg(test) is not a module and counts.
    let found = loops(&r);
    assert_eq!(found.len(), 1, "{found:?}");
    let r = root(&[
        ("lib.rs", "mod a; mod b;"),
        ("a.rs", "use crate::b::x;"),
        (
            "b.rs",
            "#[cfg(test)]\nmod tests {\n    use crate::a::z;\n}\n",
        ),
    ]);
    assert!(loops(&r).is_empty());
}

/// The names module `here` re-exports from its children (`pub use child::Name;`,
/// `pub(crate) use child::{A, B as C};`): `here::Name` → `here::child`.
fn reexported(code: &str, here: &ModPath, known: &BTreeSet<ModPath>) -> BTreeMap<ModPath, ModPath> {
    let mut out = BTreeMap::new();
    for stmt in code.split(';') {
        let t = stmt.trim();
        let Some(rest) = t
            .strip_prefix("pub use ")
            .or_else(|| t.strip_prefix("pub(crate) use "))
            .or_else(|| t.strip_prefix("pub(super) use "))
        else {
            continue;
        };
        let Some((child, items)) = rest.split_once("::") else {
            continue;
        };
        let mut target = here.clone();
        target.push(child.trim().to_owned());
        if !known.contains(&target) {
            continue;
        }
        let items = items.trim().trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            let name = item.rsplit(" as ").next().unwrap_or("").trim();
            let name = name.rsplit("::").next().unwrap_or("").trim();
            if name.is_empty() || name == "self" || name == "*" {
                continue;
            }
            let mut key = here.clone();
            key.push(name.to_owned());
            out.insert(key, target.clone());
        }
    }
    out
}

#[test]
fn a_loop_through_a_reexport_is_found() {
    let r = root(&[
        ("lib.rs", "mod st;"),
        (
            "st/mod.rs",
            "mod a; mod b; pub use a::A; pub(crate) use b::{B, C as D};",
        ),
        ("st/a.rs", "use crate::st::D;"),
        ("st/b.rs", "use crate::st::A;"),
    ]);
    let found = loops(&r);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("a -> b -> a"), "{found:?}");
}

/// Which modules each module file of `root` names.
fn named(root: &Root) -> (BTreeSet<ModPath>, Vec<(ModPath, BTreeSet<ModPath>)>) {
    let known: BTreeSet<ModPath> = root
        .files
        .iter()
        .flat_map(|(p, _)| (0..=p.len()).map(|k| p[..k].to_vec()))
        .collect();
    let mut reexports = BTreeMap::new();
    for (path, text) in &root.files {
        reexports.extend(reexported(&code_only(text), path, &known));
    }
    let named = root
        .files
        .iter()
        .map(|(path, text)| {
            let code = without_test_modules(&code_only(text));
            (path.clone(), uses(&code, path, &known, &reexports))
        })
        .collect();
    (known, named)
}

/// The uses among the children of `parent`: child → the children it names.
fn edges(
    named: &[(ModPath, BTreeSet<ModPath>)],
    parent: &ModPath,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, targets) in named {
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
    edges
}

fn loops(root: &Root) -> Vec<String> {
    let (known, named) = named(root);
    let mut out = Vec::new();
    for parent in &known {
        if let Some(c) = find_cycle(&edges(&named, parent)) {
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

/// The modules a crate root declares (`mod x;`, `pub mod x;`, `pub(crate) mod x;`), in order.
fn declared(lib: &str) -> Vec<String> {
    code_only(lib)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l
                .strip_prefix("pub(crate) mod ")
                .or_else(|| l.strip_prefix("pub mod "))
                .or_else(|| l.strip_prefix("mod "))?;
            rest.strip_suffix(';').map(str::to_owned)
        })
        .collect()
}

/// Uses that go up: a module naming one declared before it. Empty when the declaration order
/// is a floor order.
fn upward(order: &[String], edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let rank = |m: &str| order.iter().position(|o| o == m);
    let mut out = Vec::new();
    for (from, tos) in edges {
        for to in tos {
            match (rank(from), rank(to)) {
                (Some(f), Some(t)) if t < f => out.push(format!("{from} -> {to}")),
                (Some(_), Some(_)) => {}
                _ => out.push(format!("{from} -> {to}: not declared in lib.rs")),
            }
        }
    }
    out
}

/// olliesrv's `lib.rs` lists its modules top floor first: each may import only those
/// declared after it.
#[test]
fn olliesrv_modules_import_only_lower_floors() {
    let lib = std::fs::read_to_string(repo().join("olliesrv/src/lib.rs")).unwrap();
    let order = declared(&lib);
    assert!(order.len() > 5, "{order:?}");
    let rs = roots("olliesrv");
    let root = rs
        .iter()
        .find(|r| r.name == "olliesrv")
        .expect("olliesrv's lib root");
    let (_, named) = named(root);
    let up = upward(&order, &edges(&named, &Vec::new()));
    assert!(
        up.is_empty(),
        "olliesrv: imports from a lower floor back up (order of olliesrv/src/lib.rs: {}):\n{}",
        order.join(" > "),
        up.join("\n")
    );
}

#[test]
fn an_upward_use_is_found() {
    let order = declared("mod top;\n// mod gone;\npub mod mid;\npub(crate) mod low;\n");
    assert_eq!(order, ["top", "mid", "low"]);
    let mut e: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    e.entry("top".into()).or_default().insert("low".into());
    e.entry("mid".into()).or_default().insert("low".into());
    assert!(upward(&order, &e).is_empty());
    e.entry("low".into()).or_default().insert("top".into());
    assert_eq!(upward(&order, &e), ["low -> top"]);
}

#[test]
fn no_crate_has_an_import_loop() {
    let mut problems = Vec::new();
    for krate in CRATES {
        let rs = roots(krate);
        assert!(!rs.is_empty(), "{krate}: no sources found");
        problems.extend(rs.iter().flat_map(loops));
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

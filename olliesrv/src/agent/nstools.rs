//! The agent's file tools on its bead namespace. A `file_read` or `file_write` whose path
//! lies under one of the agent's mount points (`/ctx/notes/a.md` under `/ctx`) is served by
//! olliesrv through the agent's union view — the same view `session/S/agent/A/ns/ctx/` shows
//! over 9P — instead of going to toolsrv, whose sandbox does not hold the namespace. Reads
//! search the members in order, creates land in the create target's kind folder (or the
//! shadow layer), and read-only members are never written (see `ollie_beads`).
//!
//! The arguments and the result text are the same as toolsrv's (`offset`/`limit` with
//! numbered lines, `start_line`/`end_line` ranges, the same one-line summaries), so the model
//! cannot tell where a file lives except by its path.

use serde_json::Value;

use crate::state::Agent;

/// Lines `file_read` returns without a limit, and at most (as toolsrv).
const DEFAULT_READ_LINES: u64 = 2000;
const MAX_READ_LINES: u64 = 100_000;
/// Longest `content` of `file_write` (as toolsrv).
const MAX_CONTENT: usize = 8 << 20;

/// Serves `name(args)` when it is a file tool on a namespace path: `None` when it is not
/// (the call goes to toolsrv), else the result text or the error.
pub fn file_tool(a: &Agent, name: &str, args: &Value) -> Option<Result<String, String>> {
    if name != "file_read" && name != "file_write" {
        return None;
    }
    let path = args.get("path").and_then(Value::as_str)?;
    if !path.starts_with('/') || !a.ns_points().iter().any(|p| under(path, p)) {
        return None;
    }
    Some(match name {
        "file_read" => read(a, path, args),
        _ => write(a, path, args),
    })
}

/// Whether `path` is `point` or below it.
fn under(path: &str, point: &str) -> bool {
    path.strip_prefix(point)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

fn check_keys(tool: &str, args: &Value, allowed: &[&str]) -> Result<(), String> {
    let Some(o) = args.as_object() else {
        return Err(format!("{tool}: the arguments are not a JSON object"));
    };
    for k in o.keys() {
        if !allowed.contains(&k.as_str()) {
            return Err(format!("{tool}: unknown argument {k:?}"));
        }
    }
    Ok(())
}

/// An optional integer argument of at least `min`.
fn opt_u64(tool: &str, args: &Value, key: &str, min: u64) -> Result<Option<u64>, String> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= min => Ok(Some(n)),
            _ => Err(format!(
                "{tool}: {key} must be an integer of at least {min}"
            )),
        },
    }
}

fn read(a: &Agent, path: &str, args: &Value) -> Result<String, String> {
    check_keys("file_read", args, &["path", "offset", "limit"])?;
    let first = opt_u64("file_read", args, "offset", 1)?.unwrap_or(1);
    let want = opt_u64("file_read", args, "limit", 1)?
        .unwrap_or(DEFAULT_READ_LINES)
        .min(MAX_READ_LINES);
    let data = a
        .ns_read(path)
        .unwrap_or_else(|| Err(format!("{path}: not in the namespace")))?;
    // From line `first`, at most `want + 1` lines (one more tells that more follow).
    let skip = usize::try_from(first - 1).unwrap_or(usize::MAX);
    let take = usize::try_from(want + 1).unwrap_or(usize::MAX);
    let mut start = data.len();
    let mut seen = 0usize;
    if skip == 0 {
        start = 0;
    } else {
        for (i, b) in data.iter().enumerate() {
            if *b == b'\n' {
                seen += 1;
                if seen == skip {
                    start = i + 1;
                    break;
                }
            }
        }
    }
    let rest = &data[start..];
    let end = rest
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(take - 1)
        .map_or(rest.len(), |(i, _)| i + 1);
    Ok(ollie_link::tools::number_lines(&rest[..end], first, want))
}

fn write(a: &Agent, path: &str, args: &Value) -> Result<String, String> {
    check_keys(
        "file_write",
        args,
        &["path", "content", "start_line", "end_line"],
    )?;
    let content = args
        .get("content")
        .and_then(Value::as_str)
        .ok_or("file_write: content must be a string")?;
    if content.len() > MAX_CONTENT {
        return Err(format!(
            "file_write: content is {} bytes; at most {MAX_CONTENT}",
            content.len()
        ));
    }
    let start = opt_u64("file_write", args, "start_line", 1)?;
    let end = opt_u64("file_write", args, "end_line", 0)?;
    let missing = || format!("{path}: not in the namespace");
    match (start, end) {
        (None, None) => {
            let n = a
                .ns_write(path, content.as_bytes())
                .unwrap_or_else(|| Err(missing()))?;
            Ok(format!("wrote {n} bytes to {path}\n"))
        }
        (Some(s), Some(e)) if e + 1 >= s => {
            let old = a.ns_read(path).unwrap_or_else(|| Err(missing()))?;
            let (text, summary) = splice(&old, s, e, content, path)?;
            a.ns_write(path, &text).unwrap_or_else(|| Err(missing()))?;
            Ok(format!("{summary}\n"))
        }
        (Some(_), Some(_)) => Err("file_write: end_line must be at least start_line - 1".into()),
        _ => Err("file_write: give both start_line and end_line, or neither".into()),
    }
}

/// `old` with lines `s..=e` replaced by `content` (`e = s - 1` inserts before line `s`),
/// and the summary toolsrv gives.
fn splice(
    old: &[u8],
    s: u64,
    e: u64,
    content: &str,
    path: &str,
) -> Result<(Vec<u8>, String), String> {
    let lines: Vec<&[u8]> = old.split_inclusive(|b| *b == b'\n').collect();
    let n = lines.len() as u64;
    if s > n + 1 {
        return Err(format!(
            "file_write: start_line {s} is past the end of {path} ({n} lines)"
        ));
    }
    let mut body = content.as_bytes().to_vec();
    if !body.is_empty() && !body.ends_with(b"\n") {
        body.push(b'\n');
    }
    let added = body.iter().filter(|b| **b == b'\n').count();
    let keep_before = usize::try_from(s - 1)
        .unwrap_or(usize::MAX)
        .min(lines.len());
    let skip_to = usize::try_from(e).unwrap_or(usize::MAX).min(lines.len());
    let mut out = Vec::with_capacity(old.len() + body.len());
    for l in &lines[..keep_before] {
        out.extend_from_slice(l);
    }
    if keep_before > 0 && !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    out.extend_from_slice(&body);
    for l in &lines[skip_to.max(keep_before)..] {
        out.extend_from_slice(l);
    }
    let summary = if e < s {
        format!("inserted {added} lines before line {s} of {path}")
    } else {
        format!("replaced lines {s}-{e} of {path} with {added} lines")
    };
    Ok((out, summary))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_under_a_point_only_at_a_component_boundary() {
        assert!(under("/ctx", "/ctx"));
        assert!(under("/ctx/notes/a.md", "/ctx"));
        assert!(!under("/ctxx/a", "/ctx"));
        assert!(!under("/other/a", "/ctx"));
    }

    #[test]
    fn splicing_replaces_and_inserts_lines_like_toolsrv() {
        let old = b"one\ntwo\nthree\n";
        let (t, s) = splice(old, 2, 2, "TWO", "/ctx/f").unwrap();
        assert_eq!(t, b"one\nTWO\nthree\n");
        assert_eq!(s, "replaced lines 2-2 of /ctx/f with 1 lines");
        let (t, s) = splice(old, 1, 0, "zero\n", "/ctx/f").unwrap();
        assert_eq!(t, b"zero\none\ntwo\nthree\n");
        assert_eq!(s, "inserted 1 lines before line 1 of /ctx/f");
        let (t, _) = splice(old, 4, 3, "four", "/ctx/f").unwrap();
        assert_eq!(t, b"one\ntwo\nthree\nfour\n");
        let (t, _) = splice(b"a\nb", 3, 2, "c", "/ctx/f").unwrap();
        assert_eq!(t, b"a\nb\nc\n");
        assert!(splice(old, 6, 6, "x", "/ctx/f").is_err());
    }
}

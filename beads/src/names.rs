//! Slugs, short names, mount points and `file://` URIs.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::Error;

/// Names a mount point may not have: the served `ns/` directory already holds these files.
pub const RESERVED_POINT_NAMES: &[&str] = &["ctl", "table"];

/// Checks a slug: 1–64 characters of `[a-z0-9._-]`, not starting with `.` or `-`.
pub fn validate_slug(slug: &str) -> Result<(), Error> {
    check(slug, false).map_err(|reason| Error::InvalidSlug {
        slug: slug.to_string(),
        reason,
    })
}

/// Checks a short name (a mount alias or a `names.json` key): the slug rules with upper case
/// allowed, so the seed's `A`, `B`, `C` are names.
pub fn validate_name(name: &str) -> Result<(), Error> {
    check(name, true).map_err(|reason| Error::InvalidName {
        name: name.to_string(),
        reason,
    })
}

fn check(s: &str, upper: bool) -> Result<(), &'static str> {
    if s.is_empty() {
        return Err("empty");
    }
    if s.len() > 64 {
        return Err("longer than 64 characters");
    }
    if s.starts_with('.') || s.starts_with('-') {
        return Err("starts with . or -");
    }
    let ok = |c: char| {
        c.is_ascii_lowercase()
            || c.is_ascii_digit()
            || matches!(c, '.' | '_' | '-')
            || (upper && c.is_ascii_uppercase())
    };
    if !s.chars().all(ok) {
        return Err(if upper {
            "has a character outside A-Z a-z 0-9 . _ -"
        } else {
            "has a character outside a-z 0-9 . _ -"
        });
    }
    Ok(())
}

/// Turns any string into a valid short name (invalid characters become `-`; empty → `bead`).
pub(crate) fn sanitize_name(s: &str) -> String {
    let mapped: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trimmed: String = mapped
        .trim_start_matches(['.', '-'])
        .chars()
        .take(64)
        .collect();
    if trimmed.is_empty() {
        "bead".to_string()
    } else {
        trimmed
    }
}

/// Validates and normalises a mount point: `/NAME` with NAME a valid short name, one trailing
/// `/` tolerated. Nested points (`/a/b`) and the root are refused, as are `/ctl` and `/table`
/// (the served `ns/` directory already has those files).
pub fn parse_point(point: &str) -> Result<String, Error> {
    let bad = |reason| Error::InvalidPoint {
        point: point.to_string(),
        reason,
    };
    let Some(rest) = point.strip_prefix('/') else {
        return Err(bad("not absolute"));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Err(bad("the root cannot be a mount point"));
    }
    if rest.contains('/') {
        return Err(bad("nested mount points are not supported"));
    }
    if check(rest, true).is_err() {
        return Err(bad(
            "the name must be 1-64 of A-Z a-z 0-9 . _ -, not starting with . or -",
        ));
    }
    if RESERVED_POINT_NAMES.contains(&rest) {
        return Err(bad("ctl and table are reserved"));
    }
    Ok(format!("/{rest}"))
}

/// The directory a point is served as: `/ctx` → `ctx`.
pub fn point_dir_name(point: &str) -> &str {
    let p = point.strip_prefix('/').unwrap_or(point);
    p.strip_suffix('/').unwrap_or(p)
}

/// The `file://` URI of a directory: `file://` + the percent-encoded absolute path + `/`.
pub fn file_uri(dir: &Path) -> String {
    let mut s = String::from("file://");
    for &b in dir.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~!$&'()*+,;=:@".contains(&b) {
            s.push(char::from(b));
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    if !s.ends_with('/') {
        s.push('/');
    }
    s
}

/// Decodes `file:///abs/path/` (or `file://localhost/abs/path/`) to an absolute path.
/// `http(s)://` is [`Error::RemoteBead`]; other schemes, hosts, queries, fragments, bad
/// escapes and NUL are [`Error::InvalidUri`].
pub fn parse_file_uri(uri: &str) -> Result<PathBuf, Error> {
    let bad = |reason: &str| Error::InvalidUri {
        uri: uri.to_string(),
        reason: reason.to_string(),
    };
    let lower = uri.get(..8).unwrap_or(uri).to_ascii_lowercase();
    if lower.starts_with("https://") || lower.starts_with("http://") {
        return Err(Error::RemoteBead {
            uri: uri.to_string(),
        });
    }
    let Some(rest) = uri.strip_prefix("file://") else {
        return Err(bad("only file:// uris are supported"));
    };
    let path = if rest.starts_with('/') {
        rest
    } else if let Some(p) = rest
        .strip_prefix("localhost")
        .filter(|p| p.starts_with('/'))
    {
        p
    } else {
        return Err(bad(
            "a file uri with a host is not supported (use file:///path)",
        ));
    };
    if path.contains(['?', '#']) {
        return Err(bad("queries and fragments are not supported"));
    }
    let mut out = Vec::with_capacity(path.len());
    let b = path.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .ok_or_else(|| bad("truncated %-escape"))?;
            let s = std::str::from_utf8(hex).map_err(|_| bad("bad %-escape"))?;
            let v = u8::from_str_radix(s, 16).map_err(|_| bad("bad %-escape"))?;
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    if out.contains(&0) {
        return Err(bad("the path contains NUL"));
    }
    Ok(PathBuf::from(OsString::from_vec(out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_and_names() {
        for ok in ["plan9-beads", "a", "x.y_z-1", &"a".repeat(64)] {
            validate_slug(ok).unwrap();
        }
        for bad in ["", ".x", "-x", "Upper", "a b", "a/b", &"a".repeat(65), "é"] {
            assert!(validate_slug(bad).is_err(), "{bad:?}");
        }
        validate_name("A").unwrap();
        assert!(validate_name("a/b").is_err());
        assert_eq!(sanitize_name("My Bead!"), "My-Bead-");
        assert_eq!(sanitize_name("..."), "bead");
    }

    #[test]
    fn points_are_single_absolute_names() {
        assert_eq!(parse_point("/ctx").unwrap(), "/ctx");
        assert_eq!(parse_point("/ctx/").unwrap(), "/ctx");
        assert_eq!(point_dir_name("/ctx"), "ctx");
        for bad in ["ctx", "/", "/a/b", "/ctl", "/table", "/.x", "/a b", ""] {
            assert!(parse_point(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn uris_round_trip() {
        let p = Path::new("/tmp/a b/c%d/ü");
        let u = file_uri(p);
        assert_eq!(u, "file:///tmp/a%20b/c%25d/%C3%BC/");
        assert_eq!(
            parse_file_uri(&u).unwrap(),
            PathBuf::from("/tmp/a b/c%d/ü/")
        );
        assert_eq!(
            parse_file_uri("file://localhost/x/y/").unwrap(),
            PathBuf::from("/x/y")
        );
        assert!(matches!(
            parse_file_uri("https://redfish.acequia.io/.agents/A/"),
            Err(Error::RemoteBead { .. })
        ));
        assert!(matches!(
            parse_file_uri("HTTP://x/"),
            Err(Error::RemoteBead { .. })
        ));
        for bad in [
            "ftp://x/",
            "file://host/x",
            "file:///x%2",
            "file:///x%zz",
            "file:///a%00b",
            "file:///x?y",
        ] {
            assert!(
                matches!(parse_file_uri(bad), Err(Error::InvalidUri { .. })),
                "{bad}"
            );
        }
    }
}

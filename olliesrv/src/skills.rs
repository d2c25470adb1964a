//! Skills: directories holding a `SKILL.md` (front matter with `name` and `description`, then
//! instructions) found in the configured skill paths (`skill_paths` in config.toml; default:
//! `$XDG_DATA_HOME/ollie/skills`, else `~/.local/share/ollie/skills`).
//!
//! - Union: the paths are searched in order and the first path with a valid skill of a name
//!   wins; a later one of the same name is shadowed (listed as such in `skills/idx`). New
//!   skills are created on disk in the first path.
//! - Served at the root as `skills/` ([`idx_text`], `SkillNode`), read-only for agents.
//!   The owner creates skills there (`create_skill`: `mkdir skills/NAME`, then write its
//!   `SKILL.md`): new skills go into the first skill path, and only skills in the first path
//!   can be changed over 9P (files and directories created, written, truncated, renamed in
//!   place, removed); skills from later paths are read-only. A directory in the first path
//!   that is not a valid skill yet is listed (and walkable) so it can be finished, but it is
//!   not in `idx` or any prompt. Symbolic links inside a skill are never followed.
//! - Agents see the winning skills in their system prompt ([`prompt_section`]: name,
//!   description, where the `SKILL.md` is) and read them with `file_read`, through a read-only
//!   grant of every skill path ([`grantable`]) that toolsrv adds to every policy of the
//!   session with `Policy::with_grants` (the boot message's `read_grants`). A skill path inside a secret location (say
//!   `~/.config/ollie/skills`, beside the API keys) can never be granted; `file_read`
//!   of a skill file there, and of any skill file in a remote session (whose tools run on a
//!   host without these paths), is served by olliesrv itself ([`file_read`]), from the same
//!   resolution the 9P view uses.
//!
//! Nothing is cached: every listing, lookup and turn scans again, so `invalidate` (which
//! reloads `skill_paths`) and changes on disk show at once. Bounds: `SKILL.md` at most
//! [`MAX_SKILL_MD`] bytes, at most [`MAX_SKILLS`] skills, descriptions at most
//! [`MAX_DESCRIPTION`] characters, the prompt section at most [`MAX_PROMPT_SECTION`] bytes.
//! An invalid skill is skipped with one warning line in the log (each distinct problem is
//! logged once).
//!
//! Tested by the unit tests below (front matter, union and clash rules, containment, policy
//! grants) and by `tests/tests/skills.rs` (the served files, the prompt, `file_read` and a
//! denied `file_write` through the real toolsrv).
//!
//! [`idx_text`]: crate::skills::idx_text
//! [`prompt_section`]: crate::skills::prompt_section
//! [`grantable`]: crate::skills::grantable
//! [`file_read`]: crate::skills::file_read
//! [`MAX_SKILL_MD`]: crate::skills::MAX_SKILL_MD
//! [`MAX_SKILLS`]: crate::skills::MAX_SKILLS
//! [`MAX_DESCRIPTION`]: crate::skills::MAX_DESCRIPTION
//! [`MAX_PROMPT_SECTION`]: crate::skills::MAX_PROMPT_SECTION

use std::collections::BTreeSet;
use std::fs::{File, Metadata};
use std::io::{ErrorKind, Read};
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value;

use crate::config::Config;

/// The file that makes a directory a skill.
pub const SKILL_FILE: &str = "SKILL.md";
/// The largest `SKILL.md` accepted.
pub const MAX_SKILL_MD: u64 = 64 * 1024;
/// The most skills (winners and shadowed together) a scan takes.
pub const MAX_SKILLS: usize = 200;
/// The longest skill name.
pub const MAX_NAME: usize = 64;
/// The longest description, in characters.
pub const MAX_DESCRIPTION: usize = 1024;
/// The largest skills section of a system prompt.
pub const MAX_PROMPT_SECTION: usize = 32 * 1024;
/// The most directory entries looked at per skill path.
pub(crate) const MAX_ENTRIES: usize = 4096;

/// The two keys of a `SKILL.md` front matter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontMatter {
    pub name: String,
    pub description: String,
}

/// Whether `s` is a skill name: 1-64 lowercase letters and digits in words joined by single
/// hyphens (`pdf-forms`, `deploy2`).
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && s.split('-').all(|w| {
            !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// A value without its quotes (`'x'`, `"x"`); `None` for an unterminated quote.
fn unquote(v: &str) -> Option<&str> {
    for q in ['"', '\''] {
        if let Some(rest) = v.strip_prefix(q) {
            return rest.strip_suffix(q);
        }
    }
    Some(v)
}

/// Parses the front matter of a `SKILL.md`: a first line `---`, `key: value` lines, a line
/// `---`. `name` and `description` are required (once each, one line each, not empty);
/// other keys (`license`, `metadata`, …) and their indented continuation lines are allowed
/// and ignored, but a value of `name` or `description` may not continue on the next line.
pub fn parse_front_matter(text: &str) -> Result<FrontMatter, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.lines();
    if lines.next().map(str::trim_end) != Some("---") {
        return Err("does not start with a front matter line \"---\"".into());
    }
    let (mut name, mut description) = (None::<String>, None::<String>);
    let mut last_key = "";
    let mut closed = false;
    for (i, line) in lines.enumerate() {
        let n = i + 2;
        let line = line.trim_end();
        if line == "---" {
            closed = true;
            break;
        }
        if line.is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        if line.starts_with([' ', '\t']) {
            if matches!(last_key, "name" | "description") {
                return Err(format!(
                    "line {n}: {last_key} continues on another line (write it on one line)"
                ));
            }
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            return Err(format!("line {n}: expected \"key: value\""));
        };
        let key = key.trim();
        last_key = match key {
            "name" => "name",
            "description" => "description",
            _ => "",
        };
        if last_key.is_empty() {
            continue;
        }
        let value = value.trim();
        if value.starts_with(['|', '>']) {
            return Err(format!(
                "line {n}: {key}: block values are not supported (write it on one line)"
            ));
        }
        let value = unquote(value)
            .ok_or_else(|| format!("line {n}: {key}: unterminated quote"))?
            .trim();
        if value.chars().any(char::is_control) {
            return Err(format!(
                "line {n}: {key}: control characters are not allowed"
            ));
        }
        let slot = if key == "name" {
            &mut name
        } else {
            &mut description
        };
        if slot.is_some() {
            return Err(format!("line {n}: {key} is given twice"));
        }
        *slot = Some(value.to_owned());
    }
    if !closed {
        return Err("the front matter has no closing \"---\" line".into());
    }
    let name = name
        .filter(|v| !v.is_empty())
        .ok_or("name is missing or empty")?;
    if !valid_name(&name) {
        return Err(format!(
            "name {:?} is not a skill name (1-{MAX_NAME} lowercase letters and digits, words joined by '-')",
            crate::util::clip(&name)
        ));
    }
    let description = description
        .filter(|v| !v.is_empty())
        .ok_or("description is missing or empty")?;
    let chars = description.chars().count();
    if chars > MAX_DESCRIPTION {
        return Err(format!(
            "description is {chars} characters (at most {MAX_DESCRIPTION})"
        ));
    }
    Ok(FrontMatter { name, description })
}

/// A valid skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    /// The skill directory's real absolute path.
    pub dir: PathBuf,
}

/// The skills of the configured paths: the winners, and the shadowed ones (a valid skill of
/// a name a path before it already had), each sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalog {
    pub skills: Vec<Skill>,
    pub shadowed: Vec<Skill>,
}

/// Problems already logged (each once; bounded).
static WARNED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Logs `msg` as a warning the first time it is seen.
fn warn(msg: String) {
    let mut seen = WARNED.lock().unwrap_or_else(|p| p.into_inner());
    if seen.len() >= 1024 || !seen.insert(msg.clone()) {
        return;
    }
    let shown: String = msg.escape_debug().take(500).collect();
    tracing::warn!("{shown}");
}

/// After `invalidate`: forgets which problems were logged and scans again (logging each
/// problem once more); returns the number of active skills.
pub fn invalidate(config: &Config) -> usize {
    WARNED.lock().unwrap_or_else(|p| p.into_inner()).clear();
    scan(config).skills.len()
}

/// The configured skill paths.
pub fn paths(config: &Config) -> &[PathBuf] {
    config.skill_paths.as_deref().unwrap_or_default()
}

/// Reads and checks `dir/SKILL.md` for the skill directory `dir` named `dir_name`: `None`
/// when `dir` is not a skill (no `SKILL.md`), else the skill or why it is invalid.
fn load(dir: &Path, dir_name: &str) -> Option<Result<Skill, String>> {
    let file = dir.join(SKILL_FILE);
    let md = match std::fs::symlink_metadata(&file) {
        Err(e) if e.kind() == ErrorKind::NotFound => return None,
        Err(e) => return Some(Err(format!("{}: {e}", file.display()))),
        Ok(md) => md,
    };
    Some(load_file(dir, dir_name, &file, &md))
}

fn load_file(dir: &Path, dir_name: &str, file: &Path, md: &Metadata) -> Result<Skill, String> {
    if !md.is_file() {
        return Err(format!(
            "{}: not a regular file (symbolic links are not followed)",
            file.display()
        ));
    }
    if md.len() > MAX_SKILL_MD {
        return Err(format!(
            "{}: larger than {} KiB",
            file.display(),
            MAX_SKILL_MD / 1024
        ));
    }
    let mut bytes = Vec::new();
    File::open(file)
        .and_then(|f| f.take(MAX_SKILL_MD + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("{}: {e}", file.display()))?;
    if bytes.len() as u64 > MAX_SKILL_MD {
        return Err(format!(
            "{}: larger than {} KiB",
            file.display(),
            MAX_SKILL_MD / 1024
        ));
    }
    let text =
        String::from_utf8(bytes).map_err(|_| format!("{}: not utf-8 text", file.display()))?;
    let fm = parse_front_matter(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    if fm.name != dir_name {
        return Err(format!(
            "{}: name {:?} is not the directory's name {:?}",
            file.display(),
            fm.name,
            crate::util::clip(dir_name)
        ));
    }
    let real = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(Skill {
        name: fm.name,
        description: fm.description,
        dir: real,
    })
}

/// The skill directory `root/name` if it is a real directory (not a symbolic link).
fn skill_dir(root: &Path, name: &str) -> Option<PathBuf> {
    let dir = root.join(name);
    let md = std::fs::symlink_metadata(&dir).ok()?;
    md.is_dir().then_some(dir)
}

/// Scans `paths` in order (see the module documentation). Invalid skills are logged and
/// skipped; a missing path has none.
pub fn scan_paths(paths: &[PathBuf]) -> Catalog {
    let mut cat = Catalog::default();
    let mut names = BTreeSet::new();
    let mut total = 0usize;
    'roots: for root in paths {
        let entries = match std::fs::read_dir(root) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => {
                warn(format!(
                    "skills: cannot read skill path {}: {e}",
                    root.display()
                ));
                continue;
            }
        };
        let mut found: Vec<String> = Vec::new();
        for entry in entries.take(MAX_ENTRIES).flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if !name.starts_with('.') {
                found.push(name);
            }
        }
        found.sort();
        for name in found {
            let path = root.join(&name);
            let Ok(md) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if md.file_type().is_symlink() {
                if path.join(SKILL_FILE).exists() {
                    warn(format!(
                        "skills: skipped {}: a symbolic link (a skill must be a real directory in its skill path)",
                        path.display()
                    ));
                }
                continue;
            }
            if !md.is_dir() {
                continue;
            }
            let skill = match load(&path, &name) {
                None => continue,
                Some(Err(e)) => {
                    warn(format!("skills: skipped invalid skill: {e}"));
                    continue;
                }
                Some(Ok(s)) => s,
            };
            if total == MAX_SKILLS {
                warn(format!(
                    "skills: more than {MAX_SKILLS} skills; the rest (from {}) are ignored",
                    path.display()
                ));
                break 'roots;
            }
            total += 1;
            if names.insert(skill.name.clone()) {
                cat.skills.push(skill);
            } else {
                cat.shadowed.push(skill);
            }
        }
    }
    cat.skills.sort_by(|a, b| a.name.cmp(&b.name));
    cat.shadowed.sort_by(|a, b| a.name.cmp(&b.name));
    cat
}

/// Scans the configured skill paths.
pub fn scan(config: &Config) -> Catalog {
    scan_paths(paths(config))
}

/// The winning skill named `name` (the first path holding a valid one), without scanning
/// everything.
pub fn lookup(config: &Config, name: &str) -> Option<Skill> {
    if !valid_name(name) {
        return None;
    }
    paths(config)
        .iter()
        .filter_map(|root| skill_dir(root, name))
        .find_map(|dir| load(&dir, name).and_then(Result::ok))
}

/// The text of `skills/idx`: one line per skill, `NAME<TAB>STATE<TAB>DIR<TAB>DESCRIPTION`,
/// STATE `active` for the skill agents see and `shadowed` for one hidden by a skill of the
/// same name in an earlier path; sorted by name, the active one first.
pub fn idx_text(cat: &Catalog) -> String {
    let mut rows: Vec<(&Skill, &str)> = cat
        .skills
        .iter()
        .map(|s| (s, "active"))
        .chain(cat.shadowed.iter().map(|s| (s, "shadowed")))
        .collect();
    // Stable: the active one, then the shadowed in path order.
    rows.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    rows.iter()
        .map(|(s, state)| {
            format!(
                "{}\t{state}\t{}\t{}\n",
                s.name,
                s.dir.display(),
                s.description
            )
        })
        .collect()
}

/// The skills section of a system prompt ("" without skills).
pub fn prompt_section(cat: &Catalog) -> String {
    if cat.skills.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\n\nSkills: instructions for particular kinds of task. When a task matches a skill's \
         description, read its SKILL.md with file_read before you start, and follow it; files \
         it mentions are in the same directory. Skill directories are read-only.\n",
    );
    for (i, k) in cat.skills.iter().enumerate() {
        let line = format!(
            "- {}: {} ({})\n",
            k.name,
            k.description,
            k.dir.join(SKILL_FILE).display()
        );
        if s.len() + line.len() > MAX_PROMPT_SECTION {
            s.push_str(&format!(
                "({} more skills are not listed)\n",
                cat.skills.len() - i
            ));
            break;
        }
        s.push_str(&line);
    }
    s.truncate(s.trim_end().len());
    s
}

// ---------------------------------------------------------------------------------------
// Read grants

/// The skill paths a policy can grant: real, existing directories, as absolute UTF-8 paths,
/// outside every secret location of `home` and of this server ([`crate::secrets::server`]).
pub fn grantable(config: &Config, home: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in paths(config) {
        let Ok(real) = p.canonicalize() else {
            continue;
        };
        if !real.is_dir() || real.to_str().is_none_or(|s| s.contains(['{', '}'])) {
            continue;
        }
        let secret = ollie_policy::secrets::secret_containing(&real, home)
            .or_else(|| ollie_policy::secrets::secret_in(&real, &crate::secrets::server()));
        if let Some(secret) = secret {
            warn(format!(
                "skills: {} is inside the secret location {}, which no policy can grant; agents read its skills through olliesrv (file_read only)",
                real.display(),
                secret.display()
            ));
            continue;
        }
        if !out.contains(&real) {
            out.push(real);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// file_read of skills no policy can grant

/// The winning skill file at absolute `path`, when it is inside a skill whose path no policy
/// can grant (with `every`: inside any skill): its real path. `None` when `path` is not such
/// a file (the call goes to toolsrv).
fn ungranted_file(
    config: &Config,
    path: &Path,
    home: &Path,
    every: bool,
) -> Option<Result<PathBuf, String>> {
    let granted = if every {
        Vec::new()
    } else {
        grantable(config, home)
    };
    for root in paths(config) {
        let Ok(real_root) = root.canonicalize() else {
            continue;
        };
        if granted.contains(&real_root) {
            continue;
        }
        let Ok(rel) = path
            .strip_prefix(root)
            .or_else(|_| path.strip_prefix(&real_root))
        else {
            continue;
        };
        let mut parts = rel.components();
        let Some(Component::Normal(name)) = parts.next() else {
            return None;
        };
        let name = name.to_str()?;
        let rest: Vec<&str> = parts
            .map(|c| match c {
                Component::Normal(s) => s.to_str().unwrap_or(".."),
                _ => "..",
            })
            .collect();
        return Some(match lookup(config, name) {
            Some(skill) if skill.dir == real_root.join(name) => {
                resolve_in(&skill.dir, &rest.join("/")).and_then(|(p, md)| {
                    if md.is_file() {
                        Ok(p)
                    } else {
                        Err(format!("{}: not a regular file", path.display()))
                    }
                })
            }
            _ => Err(format!("{}: file does not exist", path.display())),
        });
    }
    None
}

/// Serves `file_read` of a skill file that no policy can grant (see the module
/// documentation), or of any skill file when the session's tools run on another host
/// (`remote`: the skill paths are this host's): `None` for any other call, else the result
/// text (as toolsrv's: numbered lines from `offset`, at most `limit`).
pub fn file_read(
    config: &Config,
    tool: &str,
    args: &Value,
    remote: bool,
) -> Option<Result<String, String>> {
    if tool != "file_read" {
        return None;
    }
    let path = args.get("path").and_then(Value::as_str)?;
    if !path.starts_with('/') {
        return None;
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from);
    let real = match ungranted_file(config, Path::new(path), &home, remote)? {
        Ok(p) => p,
        Err(e) => return Some(Err(e)),
    };
    Some(read_window(&real, args))
}

/// `file_read`'s result for the file at `real`: the lines `args` ask for, numbered.
fn read_window(real: &Path, args: &Value) -> Result<String, String> {
    if let Some(o) = args.as_object()
        && let Some(k) = o
            .keys()
            .find(|k| !["path", "offset", "limit"].contains(&k.as_str()))
    {
        return Err(format!("file_read: unknown argument {k:?}"));
    }
    let int = |k: &str| match args.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|n| *n >= 1)
            .map(Some)
            .ok_or_else(|| format!("file_read: {k} must be an integer of at least 1")),
    };
    let first = int("offset")?.unwrap_or(1);
    let want = int("limit")?.unwrap_or(2000).min(100_000);
    let data = read_capped(real, 16 << 20)?;
    let skip = usize::try_from(first - 1).unwrap_or(usize::MAX);
    let text: Vec<&[u8]> = data.split_inclusive(|b| *b == b'\n').collect();
    let from = skip.min(text.len());
    let to = from
        .saturating_add(usize::try_from(want + 1).unwrap_or(usize::MAX))
        .min(text.len());
    let window: Vec<u8> = text[from..to].concat();
    Ok(ollie_link::tools::number_lines(&window, first, want))
}

fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|f| f.take(cap).read_to_end(&mut bytes))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(bytes)
}

// ---------------------------------------------------------------------------------------
// skills/NAME/… over 9P

/// `rel` (a `/`-separated path below a skill directory, "" for the directory itself) as a
/// path under `dir`, with its metadata: every element must be a plain name (no `.` or `..`)
/// that is not a symbolic link.
pub fn resolve_in(dir: &Path, rel: &str) -> Result<(PathBuf, Metadata), String> {
    let mut p = dir.to_path_buf();
    let mut md = std::fs::symlink_metadata(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    for part in rel.split('/').filter(|s| !s.is_empty()) {
        if part == "." || part == ".." || part.contains('\0') {
            return Err(format!("{part:?}: file does not exist"));
        }
        if !md.is_dir() {
            return Err(format!("{}: not a directory", p.display()));
        }
        p.push(part);
        md = std::fs::symlink_metadata(&p).map_err(|e| match e.kind() {
            ErrorKind::NotFound => format!("{part}: file does not exist"),
            _ => format!("{part}: {e}"),
        })?;
        if md.file_type().is_symlink() {
            return Err(format!(
                "{part}: file does not exist (symbolic links in skills are not followed)"
            ));
        }
    }
    Ok((p, md))
}

/// Where `skills/NAME` is on disk, and whether the owner may change it there: the winning
/// skill's directory, else a directory NAME in the first skill path that is not (yet) a valid
/// skill (one being written). Only skills in the first path are writable; a skill from a later
/// path (a team's, a package's) stays read-only.
pub(crate) fn base(config: &Config, name: &str) -> Option<(PathBuf, bool)> {
    let first = paths(config).first().and_then(|p| p.canonicalize().ok());
    if let Some(s) = lookup(config, name) {
        let writable = first.as_deref().is_some_and(|f| s.dir.parent() == Some(f));
        return Some((s.dir, writable));
    }
    if !valid_name(name) {
        return None;
    }
    skill_dir(&first?, name).map(|d| (d, true))
}

/// The names of directories in the first skill path that are not valid skills yet (listed
/// in `skills/` so their owner can finish them).
pub(crate) fn pending(config: &Config, cat: &Catalog) -> Vec<(String, PathBuf)> {
    let Some(first) = paths(config).first() else {
        return Vec::new();
    };
    let Ok(rd) = std::fs::read_dir(first) else {
        return Vec::new();
    };
    rd.take(MAX_ENTRIES)
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let dir = skill_dir(first, &name)?;
            (valid_name(&name) && !cat.skills.iter().any(|s| s.name == name)).then_some((name, dir))
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn fm(text: &str) -> Result<FrontMatter, String> {
        parse_front_matter(text)
    }

    #[test]
    fn front_matter_with_both_keys() {
        let t = "---\nname: pdf-forms\ndescription: Fill in PDF forms.\n---\n# Body\n";
        assert_eq!(
            fm(t).unwrap(),
            FrontMatter {
                name: "pdf-forms".into(),
                description: "Fill in PDF forms.".into()
            }
        );
        // Quotes, CRLF, other keys with nested values, comments, a BOM.
        let t = "\u{feff}---\r\n# c\r\nname: \"deploy2\"\r\nlicense: MIT\r\nmetadata:\r\n  a: b\r\ndescription: 'Ship it: now'\r\n---\r\n";
        assert_eq!(
            fm(t).unwrap(),
            FrontMatter {
                name: "deploy2".into(),
                description: "Ship it: now".into()
            }
        );
    }

    #[test]
    fn front_matter_errors() {
        let cases = [
            ("name: x\n", "does not start"),
            ("---\nname: x\ndescription: y\n", "no closing"),
            ("---\ndescription: y\n---\n", "name is missing"),
            ("---\nname:\ndescription: y\n---\n", "name is missing"),
            ("---\nname: x\n---\n", "description is missing"),
            (
                "---\nname: x\ndescription: \"\"\n---\n",
                "description is missing",
            ),
            (
                "---\nname: Bad Name\ndescription: y\n---\n",
                "not a skill name",
            ),
            ("---\nname: a--b\ndescription: y\n---\n", "not a skill name"),
            ("---\nname: -a\ndescription: y\n---\n", "not a skill name"),
            ("---\nname: ../x\ndescription: y\n---\n", "not a skill name"),
            (
                "---\nname: x\nname: y\ndescription: y\n---\n",
                "given twice",
            ),
            (
                "---\nname: x\ndescription: >\n  long\n---\n",
                "block values",
            ),
            ("---\nname: x\ndescription: a\n  b\n---\n", "continues"),
            ("---\nname: x\ndescription: \"a\n---\n", "unterminated"),
            (
                "---\nname: x\ndescription: a\tb\n---\n",
                "control characters",
            ),
            ("---\nname x\ndescription: y\n---\n", "key: value"),
        ];
        for (t, want) in cases {
            let e = fm(t).unwrap_err();
            assert!(e.contains(want), "{t:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let long = format!(
            "---\nname: x\ndescription: {}\n---\n",
            "d".repeat(MAX_DESCRIPTION + 1)
        );
        assert!(fm(&long).unwrap_err().contains("at most 1024"));
        let ok = format!(
            "---\nname: {}\ndescription: {}\n---\n",
            "a".repeat(MAX_NAME),
            "d".repeat(MAX_DESCRIPTION)
        );
        assert!(fm(&ok).is_ok());
        let too_long = format!("---\nname: {}\ndescription: d\n---\n", "a".repeat(65));
        assert!(fm(&too_long).is_err());
    }

    pub(crate) fn skill(root: &Path, name: &str, desc: &str) -> PathBuf {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join(SKILL_FILE),
            format!("---\nname: {name}\ndescription: {desc}\n---\nbody\n"),
        )
        .unwrap();
        d
    }

    #[test]
    fn union_first_path_wins_and_invalid_ones_are_skipped() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        skill(&a, "deploy", "first");
        skill(&b, "deploy", "second");
        skill(&b, "lint", "only in b");
        // Invalid: bad front matter, name not the directory's, no SKILL.md, a symlink.
        let bad = b.join("broken");
        std::fs::create_dir_all(&bad).unwrap();
        std::fs::write(bad.join(SKILL_FILE), "no front matter").unwrap();
        let other = b.join("other");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(
            other.join(SKILL_FILE),
            "---\nname: lint\ndescription: x\n---\n",
        )
        .unwrap();
        std::fs::create_dir_all(b.join("plain")).unwrap();
        std::os::unix::fs::symlink(a.join("deploy"), b.join("linked")).unwrap();
        // An invalid skill in the first path does not shadow a valid one later.
        let inv = a.join("lint");
        std::fs::create_dir_all(&inv).unwrap();
        std::fs::write(inv.join(SKILL_FILE), "---\nname: lint\n---\n").unwrap();

        let cat = scan_paths(&[a.clone(), t.path().join("missing"), b.clone()]);
        let names: Vec<(&str, &str)> = cat
            .skills
            .iter()
            .map(|s| (s.name.as_str(), s.description.as_str()))
            .collect();
        assert_eq!(names, [("deploy", "first"), ("lint", "only in b")]);
        assert_eq!(cat.shadowed.len(), 1);
        assert_eq!(cat.shadowed[0].description, "second");
        let real_a = a.canonicalize().unwrap();
        let real_b = b.canonicalize().unwrap();
        assert_eq!(cat.skills[0].dir, real_a.join("deploy"));
        let idx = idx_text(&cat);
        assert_eq!(
            idx,
            format!(
                "deploy\tactive\t{}\tfirst\ndeploy\tshadowed\t{}\tsecond\nlint\tactive\t{}\tonly in b\n",
                real_a.join("deploy").display(),
                real_b.join("deploy").display(),
                real_b.join("lint").display()
            )
        );
        let cfg = Config {
            skill_paths: Some(vec![a.clone(), b.clone()]),
            ..Config::builtin()
        };
        assert_eq!(lookup(&cfg, "lint").unwrap().dir, real_b.join("lint"));
        assert_eq!(lookup(&cfg, "deploy").unwrap().description, "first");
        assert!(lookup(&cfg, "linked").is_none());
        assert!(lookup(&cfg, "..").is_none());
    }

    #[test]
    fn prompt_section_lists_the_winners_and_is_empty_without_skills() {
        assert_eq!(prompt_section(&Catalog::default()), "");
        let t = tempfile::tempdir().unwrap();
        skill(t.path(), "deploy", "Ship it.");
        let cat = scan_paths(&[t.path().to_path_buf()]);
        let s = prompt_section(&cat);
        let want = format!(
            "- deploy: Ship it. ({}/deploy/SKILL.md)",
            t.path().canonicalize().unwrap().display()
        );
        assert!(s.starts_with("\n\nSkills: "), "{s}");
        assert!(s.ends_with(&want), "{s}");
    }

    #[test]
    fn policies_get_read_grants_only() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path().join("home");
        let secret_skills = home.join(".config/ollie/skills");
        std::fs::create_dir_all(&secret_skills).unwrap();
        let open = t.path().join("skills");
        std::fs::create_dir_all(&open).unwrap();
        let cfg = Config {
            skill_paths: Some(vec![
                secret_skills.clone(),
                open.clone(),
                t.path().join("no"),
            ]),
            ..Config::builtin()
        };
        let real = open.canonicalize().unwrap();
        assert_eq!(grantable(&cfg, &home), std::slice::from_ref(&real));
        // What toolsrv does with them (`read_grants` in the boot message): every policy
        // gains a read grant, never write or exec.
        for (name, text) in &cfg.policies {
            let ctx = ollie_policy::ResolveContext {
                workdir: t.path().join("work"),
                home: home.clone(),
                extra_secrets: Vec::new(),
            };
            let policy = ollie_policy::Policy::from_toml(text)
                .unwrap()
                .with_grants(&[ollie_policy::Grant::Read(real.clone())], &ctx)
                .unwrap();
            let r = policy.resolve(&ctx).unwrap();
            assert!(r.fs.read.contains(&real), "{name}");
            assert!(!r.fs.write.iter().any(|w| real.starts_with(w)), "{name}");
            assert!(!r.fs.exec.iter().any(|w| real.starts_with(w)), "{name}");
        }
        // Without skill paths there is nothing to grant.
        let none = Config {
            skill_paths: Some(Vec::new()),
            ..Config::builtin()
        };
        assert!(grantable(&none, &home).is_empty());
    }

    #[test]
    fn file_read_serves_only_ungranted_skill_files() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path().join("home");
        let root = home.join(".config/ollie/skills");
        let d = skill(&root, "deploy", "x");
        std::fs::write(d.join("notes.txt"), "one\ntwo\nthree\n").unwrap();
        let cfg = Config {
            skill_paths: Some(vec![root.clone()]),
            ..Config::builtin()
        };
        let file = d.join("notes.txt");
        let got = ungranted_file(&cfg, &file, &home, false).unwrap().unwrap();
        assert_eq!(got, d.canonicalize().unwrap().join("notes.txt"));
        assert!(
            ungranted_file(&cfg, &root.join("deploy/../../config.toml"), &home, false)
                .unwrap()
                .is_err()
        );
        assert!(
            ungranted_file(&cfg, &root.join("nope/SKILL.md"), &home, false)
                .unwrap()
                .is_err()
        );
        assert!(ungranted_file(&cfg, Path::new("/etc/passwd"), &home, false).is_none());
        // A granted path goes to toolsrv.
        let open = t.path().join("open");
        skill(&open, "lint", "y");
        let cfg2 = Config {
            skill_paths: Some(vec![open.clone()]),
            ..Config::builtin()
        };
        assert!(ungranted_file(&cfg2, &open.join("lint/SKILL.md"), &home, false).is_none());
        // For a remote session every skill file is served here.
        assert!(ungranted_file(&cfg2, &open.join("lint/SKILL.md"), &home, true).is_some());
    }
}

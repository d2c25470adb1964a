//! The tools: what each one runs in the sandbox, its JSON schema, and how its result reads.
//!
//! Every tool is one sandboxed command under the calling agent's policy — the file tools
//! too (`sed` reads, `sh` + coreutils write), so Landlock, the mount namespace and seccomp
//! decide what a file tool can touch, exactly as for `execute_code`. Nothing runs in
//! toolsrv's own process.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

/// Longest `code` (passed as one argument; the kernel caps one argument at 128 KiB).
pub const MAX_CODE: usize = 96 * 1024;
/// Longest `content` for `file_write` (fed on stdin).
pub const MAX_CONTENT: usize = 8 << 20;
/// Steps of one `execute_pipe`.
pub const MAX_STEPS: usize = 16;
/// Lines `file_read` returns when no limit is given, and the most it returns.
pub const DEFAULT_READ_LINES: u64 = 2000;
pub const MAX_READ_LINES: u64 = 100_000;

pub use ollie_link::tools::{TOOLS, ToolDef, names};

/// An interpreter `execute_code` can use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Language {
    /// The name models use (`bash`, `python3`, …).
    pub name: &'static str,
    /// Other accepted names.
    pub aliases: &'static [&'static str],
    /// The program (looked up in the sandbox's PATH).
    pub program: &'static str,
    /// The flag that takes code as its argument.
    pub flag: &'static str,
}

/// Interpreters we know how to call, in preference order.
pub const KNOWN_LANGUAGES: &[Language] = &[
    Language {
        name: "bash",
        aliases: &["shell"],
        program: "bash",
        flag: "-c",
    },
    Language {
        name: "sh",
        aliases: &[],
        program: "sh",
        flag: "-c",
    },
    Language {
        name: "python3",
        aliases: &["python", "py"],
        program: "python3",
        flag: "-c",
    },
    Language {
        name: "node",
        aliases: &["javascript", "js"],
        program: "node",
        flag: "-e",
    },
    Language {
        name: "perl",
        aliases: &[],
        program: "perl",
        flag: "-e",
    },
    Language {
        name: "ruby",
        aliases: &[],
        program: "ruby",
        flag: "-e",
    },
    Language {
        name: "php",
        aliases: &[],
        program: "php",
        flag: "-r",
    },
    Language {
        name: "lua",
        aliases: &[],
        program: "lua",
        flag: "-e",
    },
    Language {
        name: "zsh",
        aliases: &[],
        program: "zsh",
        flag: "-c",
    },
];

/// Directories searched for interpreters (the shipped policies' PATH).
const SEARCH: &[&str] = &["/usr/local/bin", "/usr/bin", "/bin"];

/// The known interpreters installed on this host. Whether a policy lets a tool execute
/// one is still the sandbox's decision at run time.
pub fn installed_languages() -> Vec<Language> {
    use std::os::unix::fs::PermissionsExt;
    KNOWN_LANGUAGES
        .iter()
        .filter(|l| {
            SEARCH.iter().any(|d| {
                std::fs::metadata(Path::new(d).join(l.program))
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
        })
        .cloned()
        .collect()
}

/// What the tools need to know about the session.
#[derive(Debug, Clone)]
pub struct ToolEnv {
    pub languages: Vec<Language>,
    pub tools_dir: Option<PathBuf>,
}

impl ToolEnv {
    fn language(&self, name: &str) -> Result<&Language, String> {
        let n = name.trim().to_ascii_lowercase();
        self.languages
            .iter()
            .find(|l| l.name == n || l.aliases.contains(&n.as_str()))
            .ok_or_else(|| {
                format!(
                    "language {:?} is not available (installed: {})",
                    crate::payload::clip(name),
                    self.languages
                        .iter()
                        .map(|l| l.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }

    /// The scripts in the tools directory (names only), sorted.
    pub fn scripts(&self) -> Vec<String> {
        let Some(dir) = &self.tools_dir else {
            return Vec::new();
        };
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| valid_script_name(n).is_ok())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// The JSON schema (OpenAI-style function parameters) of `tool`.
    pub fn schema(&self, tool: &str) -> Option<Value> {
        let escalate = json!({
            "type": "object",
            "description": "ask a human for more than the sandbox allows, for this call only",
            "properties": {
                "grants": {"type": "array", "items": {"type": "string"},
                    "description": "net, net:PORT, net:DOMAIN (through the session's proxy), read:PATH, write:PATH or unsandboxed"},
                "reason": {"type": "string"}
            },
            "required": ["grants", "reason"],
            "additionalProperties": false
        });
        let background = json!({"type": "boolean",
            "description": "run in the background: the call returns at once with a process id, and the output arrives later as a <system-proc-complete> message"});
        let langs: Vec<&str> = self.languages.iter().map(|l| l.name).collect();
        let params = match tool {
            "execute_code" => json!({
                "type": "object",
                "properties": {
                    "language": {"type": "string", "enum": langs},
                    "code": {"type": "string"},
                    "timeout_s": {"type": "integer", "minimum": 1,
                        "description": "wall-clock limit; can only lower the policy's"},
                    "background": background,
                    "escalate": escalate
                },
                "required": ["language", "code"],
                "additionalProperties": false
            }),
            "execute_tool" => json!({
                "type": "object",
                "properties": {
                    // An empty enum is an invalid schema for some APIs: without scripts,
                    // any name is allowed by the schema and refused when called.
                    "name": match self.scripts() {
                        s if s.is_empty() => json!({"type": "string",
                            "description": "no scripts are installed in this session"}),
                        s => json!({"type": "string", "enum": s}),
                    },
                    "args": {"type": "array", "items": {"type": "string"}},
                    "background": background,
                    "escalate": escalate
                },
                "required": ["name"],
                "additionalProperties": false
            }),
            "execute_pipe" => json!({
                "type": "object",
                "properties": {
                    "steps": {"type": "array", "minItems": 1, "maxItems": MAX_STEPS,
                        "items": {"type": "object",
                            "properties": {"language": {"type": "string", "enum": langs},
                                "code": {"type": "string"}},
                            "required": ["language", "code"],
                            "additionalProperties": false}},
                    "background": background,
                    "escalate": escalate
                },
                "required": ["steps"],
                "additionalProperties": false
            }),
            "file_read" => json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "offset": {"type": "integer", "minimum": 1,
                        "description": "first line to return (1-based)"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_READ_LINES,
                        "description": "lines to return"}
                },
                "required": ["path"],
                "additionalProperties": false
            }),
            "file_write" => json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"},
                    "start_line": {"type": "integer", "minimum": 1,
                        "description": "with end_line: replace these lines (inclusive)"},
                    "end_line": {"type": "integer", "minimum": 0,
                        "description": "end_line = start_line - 1 inserts before start_line"}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
            _ => return None,
        };
        let def = TOOLS.iter().find(|t| t.name == tool)?;
        Some(json!({
            "name": def.name,
            "description": def.description,
            "read_only": def.read_only,
            "parameters": params
        }))
    }
}

/// How a finished run becomes the tool's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Render {
    /// The combined output as it arrived.
    Output,
    /// `file_read`: number stdout's lines from `first`; `want` lines were asked for (one
    /// more was read to tell whether more follow).
    Lines { first: u64, want: u64 },
    /// `file_write`: a one-line summary.
    Wrote { path: String, summary: String },
    /// The payload's `output=split`: `{"stdout":"…","stderr":"…"}` and a newline.
    Split,
}

/// One sandboxed command a tool call becomes.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub argv: Vec<OsString>,
    pub stdin: Option<Vec<u8>>,
    pub timeout_seconds: Option<u64>,
    /// Shown in `stat`, `proc/list` consumers and completion messages.
    pub summary: String,
    pub render: Render,
}

/// Applies a payload's `stdin=` and `output=split` to a planned call: only for the tools whose
/// stdin and result are the program's own (`execute_code`, `execute_tool`, `execute_pipe`).
pub fn take_payload_io(inv: &mut Invocation, p: &crate::payload::Payload) -> Result<(), String> {
    let own = inv.stdin.is_none() && matches!(inv.render, Render::Output);
    if let Some(s) = &p.stdin {
        if !own {
            return Err(format!(
                "stdin= is for execute_code, execute_tool and execute_pipe; {} feeds its own stdin",
                p.tool
            ));
        }
        inv.stdin = Some(s.as_bytes().to_vec());
    }
    if p.split {
        if !own {
            return Err(format!(
                "output=split is for execute_code, execute_tool and execute_pipe, not {}",
                p.tool
            ));
        }
        inv.render = Render::Split;
    }
    Ok(())
}

/// The escalation argument, if a call carries one (refused until the broker exists).
pub fn escalation(args: &Map<String, Value>) -> Option<&Value> {
    args.get("escalate")
}

struct Args<'a> {
    tool: &'a str,
    m: &'a Map<String, Value>,
}

impl<'a> Args<'a> {
    fn check_keys(&self, valid: &[&str]) -> Result<(), String> {
        for k in self.m.keys() {
            if !valid.contains(&k.as_str()) {
                return Err(format!(
                    "{}: unknown argument {:?} (valid: {})",
                    self.tool,
                    crate::payload::clip(k),
                    valid.join(", ")
                ));
            }
        }
        Ok(())
    }

    fn str(&self, k: &str) -> Result<&'a str, String> {
        match self.m.get(k) {
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(format!("{}: {k} must be a string", self.tool)),
            None => Err(format!("{}: missing argument {k}", self.tool)),
        }
    }

    /// An optional boolean (`background`: which of `proc/new` and `proc/new.bg` runs the
    /// call is the caller's choice, so toolsrv only checks its type).
    fn opt_bool(&self, k: &str) -> Result<Option<bool>, String> {
        match self.m.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(format!("{}: {k} must be true or false", self.tool)),
        }
    }

    fn opt_u64(&self, k: &str, min: u64) -> Result<Option<u64>, String> {
        match self.m.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n >= min => Ok(Some(n)),
                _ => Err(format!(
                    "{}: {k} must be an integer of at least {min}",
                    self.tool
                )),
            },
        }
    }
}

fn code_arg(tool: &str, code: &str) -> Result<OsString, String> {
    if code.len() > MAX_CODE {
        return Err(format!(
            "{tool}: code is {} bytes; at most {MAX_CODE} (write it to a file with file_write and run that)",
            code.len()
        ));
    }
    if code.contains('\0') {
        return Err(format!("{tool}: code contains a NUL byte"));
    }
    Ok(OsString::from(code))
}

fn path_arg(tool: &str, p: &str) -> Result<OsString, String> {
    if p.is_empty() {
        return Err(format!("{tool}: path is empty"));
    }
    if p.contains('\0') {
        return Err(format!("{tool}: path contains a NUL byte"));
    }
    Ok(OsString::from(p))
}

/// Script names for `execute_tool`: a plain file name.
pub fn valid_script_name(n: &str) -> Result<(), String> {
    if n.is_empty()
        || n.contains('/')
        || n.contains('\0')
        || n == "."
        || n == ".."
        || n.contains("..")
        || n.starts_with('.')
    {
        return Err(format!(
            "execute_tool: {:?} is not a tool name (no '/', no '..', not hidden)",
            crate::payload::clip(n)
        ));
    }
    Ok(())
}

fn summary_of(s: &str) -> String {
    let first = s.lines().next().unwrap_or("");
    let mut out = crate::payload::clip(first);
    if s.lines().nth(1).is_some() && !out.ends_with('…') {
        out.push('…');
    }
    out
}

/// Turns a tool call into the command to run. `cmd` is the payload's `cmd=` shorthand
/// (bash code for `execute_code`).
pub fn plan(
    env: &ToolEnv,
    tool: &str,
    args: &Map<String, Value>,
    cmd: Option<&str>,
) -> Result<Invocation, String> {
    let a = Args { tool, m: args };
    if cmd.is_some() && tool != "execute_code" {
        return Err(format!(
            "cmd= is shorthand for execute_code only; give {tool} its args= as JSON"
        ));
    }
    match tool {
        "execute_code" => plan_execute_code(env, &a, cmd),
        "execute_tool" => plan_execute_tool(env, &a),
        "execute_pipe" => plan_execute_pipe(env, &a),
        "file_read" => plan_file_read(&a),
        "file_write" => plan_file_write(&a),
        other => Err(format!(
            "unknown tool {:?} (tools: {})",
            crate::payload::clip(other),
            names().join(", ")
        )),
    }
}

/// `execute_code`: the language's interpreter running the code (or `cmd=` as bash).
fn plan_execute_code(env: &ToolEnv, a: &Args<'_>, cmd: Option<&str>) -> Result<Invocation, String> {
    let (tool, args) = (a.tool, a.m);
    let (lang, code) = match cmd {
        Some(c) => {
            if !args.is_empty() {
                return Err("give either cmd= or args=, not both".into());
            }
            (env.language("bash")?, c)
        }
        None => {
            a.check_keys(&["language", "code", "timeout_s", "background", "escalate"])?;
            a.opt_bool("background")?;
            (env.language(a.str("language")?)?, a.str("code")?)
        }
    };
    Ok(Invocation {
        argv: vec![lang.program.into(), lang.flag.into(), code_arg(tool, code)?],
        stdin: None,
        timeout_seconds: a.opt_u64("timeout_s", 1)?,
        summary: summary_of(code),
        render: Render::Output,
    })
}

/// `execute_tool`: a script of the tools directory with string arguments.
fn plan_execute_tool(env: &ToolEnv, a: &Args<'_>) -> Result<Invocation, String> {
    let args = a.m;
    a.check_keys(&["name", "args", "background", "escalate"])?;
    a.opt_bool("background")?;
    let name = a.str("name")?;
    valid_script_name(name)?;
    let dir = env
        .tools_dir
        .as_ref()
        .ok_or("execute_tool: this session has no tools directory")?;
    let script = dir.join(name);
    match std::fs::symlink_metadata(&script) {
        Ok(m) if m.is_file() => {}
        _ => {
            return Err(format!(
                "execute_tool: no tool named {:?} (available: {})",
                name,
                env.scripts().join(", ")
            ));
        }
    }
    let mut argv: Vec<OsString> = vec![script.into()];
    match args.get("args") {
        None | Some(Value::Null) => {}
        Some(Value::Array(v)) => {
            for x in v {
                match x {
                    Value::String(s) if !s.contains('\0') => argv.push(s.into()),
                    _ => {
                        return Err("execute_tool: args must be an array of strings".into());
                    }
                }
            }
        }
        Some(_) => return Err("execute_tool: args must be an array of strings".into()),
    }
    let summary = argv[1..].iter().fold(name.to_owned(), |s, x| {
        format!("{s} {}", x.to_string_lossy())
    });
    Ok(Invocation {
        argv,
        stdin: None,
        timeout_seconds: None,
        summary: summary_of(&summary),
        render: Render::Output,
    })
}

/// `execute_pipe`: one shell running the steps as a pipeline, the code as positional arguments.
fn plan_execute_pipe(env: &ToolEnv, a: &Args<'_>) -> Result<Invocation, String> {
    let args = a.m;
    a.check_keys(&["steps", "background", "escalate"])?;
    a.opt_bool("background")?;
    let steps = match args.get("steps") {
        Some(Value::Array(v)) if !v.is_empty() && v.len() <= MAX_STEPS => v,
        _ => {
            return Err(format!(
                "execute_pipe: steps must be an array of 1 to {MAX_STEPS} {{language, code}} objects"
            ));
        }
    };
    // One shell runs the pipeline; the programs and code travel as positional
    // arguments, so no code is ever spliced into shell syntax.
    let shell = env.language("bash").or_else(|_| env.language("sh"))?;
    let mut script = String::new();
    if shell.name == "bash" {
        script.push_str("set -o pipefail; ");
    }
    let mut argv: Vec<OsString> = vec![shell.program.into(), "-c".into()];
    let mut positional: Vec<OsString> = Vec::new();
    let mut shown = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        let Value::Object(m) = s else {
            return Err(format!("execute_pipe: steps[{i}] must be an object"));
        };
        let sa = Args {
            tool: "execute_pipe",
            m,
        };
        sa.check_keys(&["language", "code"])?;
        let lang = env.language(sa.str("language")?)?;
        let code = sa.str("code")?;
        let base = positional.len() + 1;
        if i > 0 {
            script.push_str(" | ");
        }
        script.push_str(&format!(
            "\"${{{}}}\" \"${{{}}}\" \"${{{}}}\"",
            base,
            base + 1,
            base + 2
        ));
        positional.push(lang.program.into());
        positional.push(lang.flag.into());
        positional.push(code_arg("execute_pipe", code)?);
        shown.push(summary_of(code));
    }
    argv.push(script.into());
    argv.push("execute_pipe".into());
    argv.extend(positional);
    Ok(Invocation {
        argv,
        stdin: None,
        timeout_seconds: None,
        summary: shown.join(" | "),
        render: Render::Output,
    })
}

/// `file_read`: `sed` printing the asked lines and one more.
fn plan_file_read(a: &Args<'_>) -> Result<Invocation, String> {
    let tool = a.tool;
    a.check_keys(&["path", "offset", "limit"])?;
    let path = a.str("path")?;
    let first = a.opt_u64("offset", 1)?.unwrap_or(1);
    let want = a
        .opt_u64("limit", 1)?
        .unwrap_or(DEFAULT_READ_LINES)
        .min(MAX_READ_LINES);
    // One line past the range tells whether more follow.
    let last = first.saturating_add(want);
    Ok(Invocation {
        argv: vec![
            "sed".into(),
            "-n".into(),
            format!("{first},{last}p;{last}q").into(),
            "--".into(),
            path_arg(tool, path)?,
        ],
        stdin: None,
        timeout_seconds: None,
        summary: format!("read {}", crate::payload::clip(path)),
        render: Render::Lines { first, want },
    })
}

/// `file_write`: the whole file, or a range of its lines, written from stdin.
fn plan_file_write(a: &Args<'_>) -> Result<Invocation, String> {
    let tool = a.tool;
    a.check_keys(&["path", "content", "start_line", "end_line"])?;
    let path = a.str("path")?;
    let content = a.str("content")?;
    if content.len() > MAX_CONTENT {
        return Err(format!(
            "file_write: content is {} bytes; at most {MAX_CONTENT}",
            content.len()
        ));
    }
    let start = a.opt_u64("start_line", 1)?;
    let end = a.opt_u64("end_line", 0)?;
    let p = path_arg(tool, path)?;
    let (argv, stdin, summary) = match (start, end) {
        (None, None) => (
            vec![
                "sh".into(),
                "-c".into(),
                // Create missing parent directories; write through the sandbox.
                "d=$(dirname -- \"$1\") && mkdir -p -- \"$d\" && cat > \"$1\"".into(),
                "file_write".into(),
                p,
            ],
            content.as_bytes().to_vec(),
            format!("wrote {} bytes to {path}", content.len()),
        ),
        (Some(s), Some(e)) if e + 1 >= s => {
            let mut body = content.as_bytes().to_vec();
            if !body.is_empty() && !body.ends_with(b"\n") {
                body.push(b'\n');
            }
            let lines = body.iter().filter(|b| **b == b'\n').count();
            (
                vec![
                    "sh".into(),
                    "-c".into(),
                    REPLACE_LINES.into(),
                    "file_write".into(),
                    p,
                    s.to_string().into(),
                    e.to_string().into(),
                ],
                body,
                if e < s {
                    format!("inserted {lines} lines before line {s} of {path}")
                } else {
                    format!("replaced lines {s}-{e} of {path} with {lines} lines")
                },
            )
        }
        (Some(_), Some(_)) => {
            return Err("file_write: end_line must be at least start_line - 1".into());
        }
        _ => {
            return Err("file_write: give both start_line and end_line, or neither".into());
        }
    };
    Ok(Invocation {
        argv,
        stdin: Some(stdin),
        timeout_seconds: None,
        summary: format!("write {}", crate::payload::clip(path)),
        render: Render::Wrote {
            path: path.to_owned(),
            summary,
        },
    })
}

/// Replaces lines `$2..=$3` of the file `$1` with stdin, keeping the file's inode and
/// mode (the new text is assembled in a temporary file beside it, then copied over).
const REPLACE_LINES: &str = r#"f=$1 s=$2 e=$3
[ -f "$f" ] || { echo "file_write: $f: not a regular file" >&2; exit 1; }
n=$(wc -l < "$f") || exit 1
if [ -s "$f" ] && [ -n "$(tail -c 1 -- "$f")" ]; then n=$((n + 1)); fi
[ "$s" -le $((n + 1)) ] || { echo "file_write: start_line $s is past the end of $f ($n lines)" >&2; exit 1; }
t=$(mktemp -- "$f.ollie.XXXXXX") || exit 1
{ head -n $((s - 1)) -- "$f"; cat; tail -n +$((e + 1)) -- "$f"; } > "$t" && cat -- "$t" > "$f"
r=$?
rm -f -- "$t"
exit $r"#;

/// The error output of the programs behind `file_read` and `file_write` (sed, sh, cat, …)
/// as the tool's own: each line names the tool, not the program (`sed: can't read x: No such
/// file or directory` becomes `file_read: cannot read x: No such file or directory`).
fn in_tool_words(tool: &str, stderr: &[u8]) -> String {
    const PROGRAMS: &[&str] = &[
        "sed: ",
        "cat: ",
        "mkdir: ",
        "dirname: ",
        "head: ",
        "tail: ",
        "wc: ",
        "mktemp: ",
        "sh: ",
        "file_write: ",
    ];
    let text = String::from_utf8_lossy(stderr);
    let mut out = String::new();
    for line in text.lines() {
        let mut rest = line;
        if let Some(p) = PROGRAMS.iter().find(|p| rest.starts_with(**p)) {
            rest = &rest[p.len()..];
            // sh and the script name the script's line: `sh: 1: cannot create x: …`.
            if let Some((n, after)) = rest.split_once(": ")
                && !n.is_empty()
                && n.bytes()
                    .all(|b| b.is_ascii_digit() || b == b' ' || b.is_ascii_alphabetic())
                && n.split_whitespace()
                    .last()
                    .is_some_and(|w| w.bytes().all(|b| b.is_ascii_digit()))
            {
                rest = after;
            }
        }
        // sh's `cannot create PATH` is a failed write of the file itself.
        let rest = rest.replace("can't read ", "cannot read ");
        let rest = match rest.strip_prefix("cannot create ") {
            Some(p) if !p.starts_with("directory") => format!("cannot write {p}"),
            _ => rest,
        };
        out.push_str(&format!("{tool}: {rest}\n"));
    }
    out
}

/// Renders a finished run's result text (without the header line).
pub fn render(render: &Render, combined: &[u8], stdout: &[u8], stderr: &[u8], ok: bool) -> String {
    match render {
        Render::Output => String::from_utf8_lossy(combined).into_owned(),
        Render::Split => {
            let mut line = json!({
                "stdout": String::from_utf8_lossy(stdout),
                "stderr": String::from_utf8_lossy(stderr),
            })
            .to_string();
            line.push('\n');
            line
        }
        Render::Lines { first, want } => {
            if !ok {
                return in_tool_words("file_read", stderr);
            }
            ollie_link::tools::number_lines(stdout, *first, *want)
        }
        Render::Wrote { summary, .. } => {
            if ok {
                format!("{summary}\n")
            } else {
                in_tool_words("file_write", stderr)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> ToolEnv {
        ToolEnv {
            languages: KNOWN_LANGUAGES.to_vec(),
            tools_dir: None,
        }
    }

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn every_tool_has_a_schema() {
        let e = env();
        for t in TOOLS {
            let s = e.schema(t.name).unwrap();
            assert_eq!(s["name"], t.name);
            assert_eq!(s["parameters"]["type"], "object");
        }
        assert!(e.schema("nope").is_none());
    }

    #[test]
    fn execute_code_plans() {
        let e = env();
        let i = plan(
            &e,
            "execute_code",
            &obj(json!({"language":"python","code":"print(1)","timeout_s":5})),
            None,
        )
        .unwrap();
        assert_eq!(i.argv, ["python3", "-c", "print(1)"]);
        assert_eq!(i.timeout_seconds, Some(5));
        let i = plan(&e, "execute_code", &Map::new(), Some("echo hi")).unwrap();
        assert_eq!(i.argv, ["bash", "-c", "echo hi"]);
        for bad in [
            json!({"language":"cobol","code":"x"}),
            json!({"language":"bash"}),
            json!({"language":"bash","code":"x","extra":1}),
            json!({"language":"bash","code":"x","timeout_s":0}),
            json!({"language":"bash","code":"x".repeat(MAX_CODE + 1)}),
        ] {
            assert!(
                plan(&e, "execute_code", &obj(bad.clone()), None).is_err(),
                "{bad}"
            );
        }
        assert!(plan(&e, "file_read", &Map::new(), Some("x")).is_err());
    }

    #[test]
    fn pipe_never_splices_code_into_the_script() {
        let e = env();
        let i = plan(
            &e,
            "execute_pipe",
            &obj(
                json!({"steps":[{"language":"bash","code":"echo '$(x)' \"; rm -rf /"},
                {"language":"python3","code":"import sys"}]}),
            ),
            None,
        )
        .unwrap();
        let script = i.argv[2].to_string_lossy().into_owned();
        assert!(!script.contains("rm -rf"), "{script}");
        assert_eq!(i.argv[3], "execute_pipe");
        assert_eq!(i.argv[6], "echo '$(x)' \"; rm -rf /");
        assert!(plan(&e, "execute_pipe", &obj(json!({"steps":[]})), None).is_err());
    }

    #[test]
    fn script_names() {
        for bad in ["", "a/b", "..", "../x", ".hidden", "a..b"] {
            assert!(valid_script_name(bad).is_err(), "{bad:?}");
        }
        assert!(valid_script_name("fmt-check.sh").is_ok());
    }

    #[test]
    fn file_tool_errors_name_the_tool_not_the_program() {
        let lines = Render::Lines { first: 1, want: 5 };
        assert_eq!(
            render(
                &lines,
                b"",
                b"",
                b"sed: can't read nope: No such file or directory\n",
                false
            ),
            "file_read: cannot read nope: No such file or directory\n"
        );
        let wrote = Render::Wrote {
            path: "x".into(),
            summary: String::new(),
        };
        for (err, want) in [
            (
                &b"sh: 1: cannot create /w/x: Read-only file system\n"[..],
                "file_write: cannot write /w/x: Read-only file system\n",
            ),
            (
                b"mkdir: cannot create directory '/w/d': Permission denied\n",
                "file_write: cannot create directory '/w/d': Permission denied\n",
            ),
            (
                b"file_write: line 2: /w/x: Permission denied\n",
                "file_write: /w/x: Permission denied\n",
            ),
        ] {
            assert_eq!(render(&wrote, b"", b"", err, false), want);
        }
    }

    #[test]
    fn file_read_numbers_lines_and_says_when_more_follow() {
        let r = Render::Lines { first: 3, want: 2 };
        let out = render(&r, b"", b"c\nd\ne\n", b"", true);
        assert_eq!(
            out,
            "     3\tc\n     4\td\n[more lines follow; continue with offset=5]\n"
        );
        let out = render(&r, b"", b"c\nd", b"", true);
        assert_eq!(out, "     3\tc\n     4\td\n");
        assert!(render(&r, b"", b"a\0b", b"", true).contains("binary"));
        assert!(render(&r, b"", b"", b"", true).contains("shorter"));
    }

    #[test]
    fn file_write_ranges() {
        let e = env();
        assert!(
            plan(
                &e,
                "file_write",
                &obj(json!({"path":"a","content":"x","start_line":3,"end_line":1})),
                None
            )
            .is_err()
        );
        assert!(
            plan(
                &e,
                "file_write",
                &obj(json!({"path":"a","content":"x","start_line":3})),
                None
            )
            .is_err()
        );
        let i = plan(
            &e,
            "file_write",
            &obj(json!({"path":"a","content":"x","start_line":3,"end_line":2})),
            None,
        )
        .unwrap();
        assert_eq!(i.stdin.as_deref(), Some(&b"x\n"[..]));
    }
}

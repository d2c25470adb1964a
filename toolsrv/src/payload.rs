//! The `proc/new` payload: `key=value` lines.
//!
//! Keys: `tool=` (required), `agent=`, `cmd=`, `args=` (a JSON object), `cwd=`, `record=`
//! (`0` or `1`; `1` puts the run record before a blocking `proc/new` result), `stdin=` (bytes
//! fed to the program's stdin, at most [`MAX_STDIN`]; for the tools that do not feed their own:
//! `execute_code`, `execute_tool`, `execute_pipe`) and `output=` (`combined`, the default: the
//! result is the output as it arrived; `split`: the result is one line of JSON,
//! `{"stdout":"…","stderr":"…"}`, for the same three tools). In every
//! value except `args` a newline is written `\n` and a backslash that precedes `n` or
//! another backslash is written `\\`; any other backslash is kept as it is (shell code is
//! full of them). `args` is JSON taken verbatim — JSON already escapes its newlines.
//! Blank lines are ignored; a key given twice, an unknown key or a line without `=` is an
//! error naming it.

use std::collections::BTreeMap;

/// The keys a payload may carry.
pub const KEYS: &[&str] = &[
    "tool", "agent", "cmd", "args", "cwd", "record", "stdin", "output",
];

/// The longest `stdin=` value (after unescaping).
pub const MAX_STDIN: usize = 1 << 20;

/// A parsed payload.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Payload {
    pub tool: String,
    pub agent: Option<String>,
    pub cmd: Option<String>,
    pub args: Option<serde_json::Map<String, serde_json::Value>>,
    pub cwd: Option<String>,
    /// `record=`: `Some(true)` asks for the run record as the first line of a blocking
    /// `proc/new` reply (`proc/new.bg` refuses the key).
    pub record: Option<bool>,
    /// `stdin=`: what the program reads on its stdin (default: nothing, `/dev/null`).
    pub stdin: Option<String>,
    /// `output=split`: stdout and stderr apart, as one JSON line.
    pub split: bool,
}

/// Undoes the value escaping (`\n` → newline, `\\` → backslash).
pub fn unescape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let mut it = v.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\\' {
            match it.peek() {
                Some('n') => {
                    it.next();
                    out.push('\n');
                    continue;
                }
                Some('\\') => {
                    it.next();
                    out.push('\\');
                    continue;
                }
                _ => {}
            }
        }
        out.push(c);
    }
    out
}

/// Escapes a value for a payload line (the inverse of [`unescape`]).
pub use ollie_link::escape_value as escape;

/// Parses a payload.
pub fn parse(text: &str) -> Result<Payload, String> {
    let mut seen: BTreeMap<&str, String> = BTreeMap::new();
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!(
                "payload line {:?} is not key=value (keys: {})",
                clip(line),
                KEYS.join(", ")
            ));
        };
        let k = k.trim();
        let Some(&key) = KEYS.iter().find(|x| **x == k) else {
            return Err(format!(
                "unknown payload key {:?} (valid: {})",
                clip(k),
                KEYS.join(", ")
            ));
        };
        let v = if key == "args" {
            v.to_owned()
        } else {
            unescape(v)
        };
        if seen.insert(key, v).is_some() {
            return Err(format!("payload key {key:?} given twice"));
        }
    }
    let tool = seen
        .remove("tool")
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| "payload has no tool= line".to_owned())?;
    let args = match seen.remove("args") {
        None => None,
        Some(a) => match serde_json::from_str::<serde_json::Value>(&a) {
            Ok(serde_json::Value::Object(m)) => Some(m),
            Ok(_) => return Err("args= must be a JSON object".into()),
            Err(e) => return Err(format!("args= is not valid JSON: {e}")),
        },
    };
    let record = match seen.remove("record").as_deref() {
        None => None,
        Some("0") => Some(false),
        Some("1") => Some(true),
        Some(v) => {
            return Err(format!("record= must be 0 or 1, not {:?}", clip(v)));
        }
    };
    let stdin = seen.remove("stdin");
    if let Some(s) = &stdin
        && s.len() > MAX_STDIN
    {
        return Err(format!("stdin= is {} bytes; at most {MAX_STDIN}", s.len()));
    }
    let split = match seen.remove("output").as_deref() {
        None | Some("combined") => false,
        Some("split") => true,
        Some(v) => {
            return Err(format!(
                "output= must be combined or split, not {:?}",
                clip(v)
            ));
        }
    };
    let (tool, cmd, args) = shell_alias(tool.trim(), seen.remove("cmd"), args)?;
    Ok(Payload {
        tool,
        agent: seen.remove("agent").map(|a| a.trim().to_owned()),
        cmd,
        args,
        cwd: seen.remove("cwd"),
        record,
        stdin,
        split,
    })
}

type Args = serde_json::Map<String, serde_json::Value>;

/// `tool=shell` (the seed's name) is `execute_code` running bash: its command is `cmd=`,
/// `args={"cmd":"…"}`, or both when they agree.
fn shell_alias(
    tool: &str,
    cmd: Option<String>,
    args: Option<Args>,
) -> Result<(String, Option<String>, Option<Args>), String> {
    if tool != "shell" {
        return Ok((tool.to_owned(), cmd, args));
    }
    let from_args = match args {
        None => None,
        Some(a) => match (a.len(), a.get("cmd")) {
            (1, Some(serde_json::Value::String(c))) => Some(c.clone()),
            _ => return Err("tool=shell takes args={\"cmd\":\"…\"} and nothing else".into()),
        },
    };
    let cmd = match (cmd, from_args) {
        (Some(c), Some(a)) if c != a => {
            return Err("tool=shell: cmd= and args= name different commands".into());
        }
        (Some(c), _) | (None, Some(c)) => c,
        (None, None) => return Err("tool=shell needs cmd= (or args={\"cmd\":\"…\"})".into()),
    };
    Ok(("execute_code".to_owned(), Some(cmd), None))
}

/// At most 60 characters of `s`, for error messages.
pub fn clip(s: &str) -> String {
    ollie_link::text::clip(s, 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_seed_example() {
        let p = parse("tool=execute_code\nagent=a1\ncmd=go test ./...\n").unwrap();
        assert_eq!(p.tool, "execute_code");
        assert_eq!(p.agent.as_deref(), Some("a1"));
        assert_eq!(p.cmd.as_deref(), Some("go test ./..."));
        let p = parse(
            r#"tool=file_read
args={"path":"a\nb","limit":3}"#,
        )
        .unwrap();
        assert_eq!(p.args.unwrap()["path"], "a\nb");
    }

    #[test]
    fn shell_is_execute_code_running_bash() {
        // The seed's own example: cmd= and args= naming the same command.
        let p =
            parse("tool=shell\nagent=a1\ncmd=go test ./...\nargs={\"cmd\":\"go test ./...\"}\n")
                .unwrap();
        assert_eq!(p.tool, "execute_code");
        assert_eq!(p.cmd.as_deref(), Some("go test ./..."));
        assert_eq!(p.args, None);
        let p = parse("tool=shell\nargs={\"cmd\":\"ls\"}").unwrap();
        assert_eq!(
            (p.tool.as_str(), p.cmd.as_deref()),
            ("execute_code", Some("ls"))
        );
        for (text, why) in [
            ("tool=shell\ncmd=a\nargs={\"cmd\":\"b\"}", "different"),
            ("tool=shell", "needs cmd="),
            ("tool=shell\nargs={\"cmd\":\"ls\",\"x\":1}", "nothing else"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn escapes_round_trip() {
        for v in ["a\nb", "back\\slash", "\\n literally", "x\\", "tab\\t"] {
            assert_eq!(unescape(&escape(v)), v);
        }
        assert_eq!(unescape(r"printf 'a\tb'"), r"printf 'a\tb'");
        assert_eq!(unescape(r"echo a\nb"), "echo a\nb");
    }

    #[test]
    fn errors_name_the_problem() {
        assert!(parse("").unwrap_err().contains("no tool="));
        assert!(parse("tool=x\nbogus=1").unwrap_err().contains("bogus"));
        assert!(parse("tool=x\ntool=y").unwrap_err().contains("twice"));
        assert!(
            parse("tool=x\nno equals")
                .unwrap_err()
                .contains("key=value")
        );
        assert!(parse("tool=x\nargs=[1]").unwrap_err().contains("object"));
        assert!(parse("tool=x\nargs={").unwrap_err().contains("JSON"));
    }

    #[test]
    fn record_is_0_or_1() {
        assert_eq!(parse("tool=x").unwrap().record, None);
        assert_eq!(parse("tool=x\nrecord=0").unwrap().record, Some(false));
        assert_eq!(parse("record=1\r\ntool=x\r\n").unwrap().record, Some(true));
        for bad in ["2", "", "true", " 1", "1 ", "01", "yes"] {
            let e = parse(&format!("tool=x\nrecord={bad}")).unwrap_err();
            assert!(e.starts_with("record= must be 0 or 1"), "{bad:?}: {e}");
            assert!(!e.contains('\n'), "{e:?}");
        }
        let e = parse("tool=x\nrecord=1\nrecord=1").unwrap_err();
        assert!(e.contains("\"record\" given twice"), "{e}");
        let e = parse("tool=x\nrecord=0\nrecord=1").unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn stdin_and_output() {
        let p = parse("tool=x\nstdin={\"a\":1}\\n2\\n\noutput=split").unwrap();
        assert_eq!(p.stdin.as_deref(), Some("{\"a\":1}\n2\n"));
        assert!(p.split);
        let p = parse("tool=x\noutput=combined").unwrap();
        assert!(!p.split && p.stdin.is_none());
        let e = parse("tool=x\noutput=both").unwrap_err();
        assert!(e.starts_with("output= must be combined or split"), "{e}");
        let big = format!("tool=x\nstdin={}", "y".repeat(MAX_STDIN + 1));
        assert!(parse(&big).unwrap_err().contains("at most"));
    }
}

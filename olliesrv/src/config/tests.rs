//! The configuration's unit tests: `config.toml`, agent profiles and user policies parsed from
//! text and from temporary config directories, each error checked to name its file and key and
//! to fit one line.

use super::profile::{MAX_PROMPT_FILE_BYTES, TOOL_NAMES};
use super::*;

fn parse(s: &str) -> Result<Config, ConfigError> {
    Config::parse(s, Path::new("config.toml"))
}

#[test]
fn skill_paths_are_absolute_or_home_relative_and_default_beside_the_file() {
    let c = parse("skill_paths = [\"/srv/skills\", \"~/my-skills\"]").unwrap();
    let home = PathBuf::from(std::env::var_os("HOME").unwrap());
    assert_eq!(
        c.skill_paths,
        Some(vec![PathBuf::from("/srv/skills"), home.join("my-skills")])
    );
    assert_eq!(parse("skill_paths = []").unwrap().skill_paths, Some(vec![]));
    for (bad, want) in [
        (
            "[\"skills\"]",
            "skill_paths[0]: \"skills\" must be an absolute path or start with ~/",
        ),
        ("[\"/a\", \"~\"]", "skill_paths[1]: "),
        ("[\"/a/../b\"]", "must not contain . or .. elements"),
        ("[\"/a/./b\"]", "must not contain . or .. elements"),
        ("[\"/a\", \"/a\"]", "skill_paths[1]: \"/a\" is listed twice"),
        ("\"/a\"", "skill_paths: invalid type"),
    ] {
        let e = parse(&format!("skill_paths = {bad}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{bad}: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
    // Unset: the data directory's (not beside config.toml, whose directory holds keys).
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("config.toml"), "").unwrap();
    let c = Config::load_file(&d.path().join("config.toml")).unwrap();
    let want = default_skill_dir().unwrap_or_else(|| d.path().join("skills"));
    assert_eq!(c.skill_paths, Some(vec![want.clone()]));
    assert!(want.ends_with("ollie/skills") && !want.starts_with(d.path()));
    assert_eq!(Config::builtin().skill_paths, None);
}

#[test]
fn operators_are_users_and_groups_and_bad_names_are_refused() {
    let c = parse("operators = [\"alice\", \"@ollie-admin\", \"svc$\"]").unwrap();
    assert_eq!(
        c.operators,
        vec![
            Operator::User("alice".into()),
            Operator::Group("ollie-admin".into()),
            Operator::User("svc$".into()),
        ]
    );
    assert!(parse("").unwrap().operators.is_empty());
    for bad in [
        "\"\"",
        "\"@\"",
        "\"-rf\"",
        "\"a b\"",
        "\"al/ice\"",
        "\"a\\nb\"",
    ] {
        let e = parse(&format!("operators = [\"ok\", {bad}]"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("operators[1]"), "{bad}: {e}");
        assert!(!e.contains('\n'), "{bad}: {e}");
    }
    assert!(parse("operators = \"alice\"").is_err());
}

#[test]
fn money_context_and_approval_settings() {
    let c = parse(
        "cost_cap_usd = 2.5\ncompact_at = 0.5\nbypass_timeout_s = 30\n\n[prices.\"m-1\"]\ninput_per_mtok = 3.0\noutput_per_mtok = 15.0\n\n[backends.x]\nkind = \"anthropic\"\napi_key_file = \"/k/key\"\ncontext_limit = 200000\n",
    )
    .unwrap();
    assert_eq!(c.cost_cap_usd, Some(2.5));
    assert_eq!(c.compact_at, 0.5);
    assert_eq!(c.bypass_timeout_s, 30);
    assert_eq!(
        c.prices["m-1"],
        Price {
            input_per_mtok: 3.0,
            output_per_mtok: 15.0
        }
    );
    assert_eq!(
        c.backends["x"].api_key_file.as_deref(),
        Some(Path::new("/k/key"))
    );
    assert_eq!(c.backends["x"].context_limit, Some(200_000));
    assert_eq!(c.beads_dir, None);
    let b = parse("beads_dir = \"/srv/beads\"").unwrap();
    assert_eq!(b.beads_dir.as_deref(), Some(Path::new("/srv/beads")));
    let d = parse("").unwrap();
    assert_eq!(
        (d.cost_cap_usd, d.compact_at, d.bypass_timeout_s),
        (None, DEFAULT_COMPACT_AT, DEFAULT_BYPASS_TIMEOUT_S)
    );
    assert_eq!(
        parse("toolsrv_liveness_s = 3").unwrap().toolsrv_liveness,
        Some(std::time::Duration::from_secs(3))
    );
    assert_eq!(
        parse("toolsrv_liveness_s = 0").unwrap().toolsrv_liveness,
        None
    );
    assert_eq!(
        d.toolsrv_liveness,
        Some(std::time::Duration::from_secs(DEFAULT_TOOLSRV_LIVENESS_S))
    );
    for (text, want) in [
        (
            "toolsrv_liveness_s = -1",
            "toolsrv_liveness_s: -1 is out of range",
        ),
        (
            "cost_cap_usd = 0.0",
            "cost_cap_usd: 0 is not a positive amount",
        ),
        ("compact_at = 1.5", "compact_at: 1.5 is out of range"),
        (
            "bypass_timeout_s = 0",
            "bypass_timeout_s: 0 is out of range",
        ),
        (
            "[prices.m]\ninput_per_mtok = -1.0\noutput_per_mtok = 1.0",
            "prices.\"m\".input_per_mtok: -1 is not a price",
        ),
        (
            "[prices.m]\ninput_per_mtok = 1.0",
            "missing field `output_per_mtok`",
        ),
        (
            "[backends.x]\nkind = \"openai\"\napi_key_file = \"key\"",
            "backends.x.api_key_file: must be an absolute path",
        ),
        (
            "[backends.x]\nkind = \"openai\"\ncontext_limit = 0",
            "backends.x.context_limit: 0 is out of range",
        ),
        (
            "beads_dir = \"beads\"",
            "beads_dir: \"beads\" must be an absolute path",
        ),
        ("beads_dir = 1", "beads_dir: invalid type"),
        ("beads-dir = \"/x\"", "beads-dir"),
    ] {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains(want), "{text}: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

#[test]
fn backend_timeouts_default_parse_and_are_refused_where_they_do_nothing() {
    let c = parse(
        "[backends.x]\nkind = \"openai\"\nconnect_timeout_s = 3\nfirst_byte_timeout_s = 600\nidle_timeout_s = 45\n\n[backends.y]\nkind = \"ollama\"\n",
    )
    .unwrap();
    let s = std::time::Duration::from_secs;
    assert_eq!(
        c.backends["x"].timeouts,
        Timeouts {
            connect: s(3),
            first_byte: s(600),
            idle: s(45)
        }
    );
    assert_eq!(
        c.backends["y"].timeouts,
        Timeouts {
            connect: s(10),
            first_byte: s(300),
            idle: s(120)
        }
    );
    for (text, want) in [
        (
            "[backends.x]\nkind = \"openai\"\nidle_timeout_s = 0",
            "backends.x.idle_timeout_s: 0 is out of range (1..=3600)",
        ),
        (
            "[backends.x]\nkind = \"anthropic\"\nconnect_timeout_s = 3601",
            "backends.x.connect_timeout_s: 3601 is out of range (1..=3600)",
        ),
        (
            "[backends.x]\nkind = \"openai\"\nfirst_byte_timeout_s = \"1\"",
            "invalid type",
        ),
        (
            "[backends.r]\nkind = \"replay\"\nfile = \"/t.jsonl\"\nfirst_byte_timeout_s = 5",
            "backends.r.first_byte_timeout_s: only HTTP backends take timeouts",
        ),
        (
            "[backends.x]\nkind = \"openai\"\nread_timeout_s = 5",
            "read_timeout_s",
        ),
    ] {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains(want), "{text}: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

#[test]
fn tool_choice_and_prefill_parse_and_are_refused_where_they_do_nothing() {
    let c = parse(
        "[backends.l]\nkind = \"openai\"\ntool_choice = \"required_first\"\ntool_prefill = \"<tool_call>\\n\"\n\n[backends.a]\nkind = \"anthropic\"\ntool_choice = \"required_first\"\n\n[backends.o]\nkind = \"openai\"\ntool_choice = \"auto\"\n",
    )
    .unwrap();
    let l = &c.backends["l"];
    assert!(l.force_first_tool);
    assert_eq!(l.tool_prefill.as_deref(), Some("<tool_call>\n"));
    assert!(c.backends["a"].force_first_tool);
    assert!(!c.backends["o"].force_first_tool);
    assert_eq!(c.backends["o"].tool_prefill, None);
    for (text, want) in [
        (
            "[backends.x]\nkind = \"openai\"\ntool_choice = \"required\"",
            "backends.x.tool_choice: unknown value \"required\" (valid: auto, required_first)",
        ),
        (
            "[backends.x]\nkind = \"ollama\"\ntool_choice = \"required_first\"",
            "backends.x.tool_choice: only openai and anthropic backends can force a tool call (this one is ollama)",
        ),
        (
            "[backends.r]\nkind = \"replay\"\nfile = \"/t.jsonl\"\ntool_choice = \"required_first\"",
            "backends.r.tool_choice: only openai and anthropic backends",
        ),
        (
            "[backends.x]\nkind = \"openai\"\ntool_prefill = \"<tool_call>\"",
            "backends.x.tool_prefill: a prefill starts forced tool calls: set tool_choice = \"required_first\"",
        ),
        (
            "[backends.x]\nkind = \"anthropic\"\ntool_choice = \"required_first\"\ntool_prefill = \"{\"",
            "backends.x.tool_prefill: only openai backends take a prefill (this one is anthropic)",
        ),
        (
            "[backends.x]\nkind = \"openai\"\ntool_choice = \"required_first\"\ntool_prefill = \"\"",
            "backends.x.tool_prefill: empty",
        ),
        (
            "[backends.x]\nkind = \"openai\"\ntool_choice = true",
            "invalid type",
        ),
    ] {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains(want), "{text}: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

#[test]
fn accepts_the_documented_example() {
    let c = parse(
        r#"
default_backend = "local"

[backends.local]
kind = "openai"
base_url = "http://127.0.0.1:8080/v1"
api_key_env = "OPENAI_API_KEY"
model = "some-model"

[backends.demo]
kind = "replay"
file = "/path/to/turns.jsonl"

[remotes.buildbox]
command = ["ssh", "buildbox", "toolsrv", "--stdio"]
"#,
    )
    .unwrap();
    assert_eq!(c.default_backend.as_deref(), Some("local"));
    assert_eq!(c.backends.keys().collect::<Vec<_>>(), ["demo", "local"]);
    assert_eq!(c.backends["demo"].kind, BackendKind::Replay);
    assert_eq!(c.remotes["buildbox"].command[0], "ssh");
}

#[test]
fn remotes_take_a_command_or_a_host() {
    let c = parse(
        "[remotes.a]\nhost = \"me@build\"\n\n[remotes.b]\nhost = \"b\"\ntoolsrv = \"/opt/ollie/toolsrv\"\n\n[remotes.c]\ncommand = [\"/usr/bin/ssh\", \"c\", \"toolsrv\", \"--stdio\"]\n",
    )
    .unwrap();
    assert_eq!(
        c.remotes["a"].command,
        Remote::ssh_command("me@build", "toolsrv")
    );
    let a = &c.remotes["a"].command;
    assert_eq!(a[0], "ssh");
    assert_eq!(&a[a.len() - 3..], ["me@build", "toolsrv", "--stdio"]);
    assert!(a.iter().any(|w| w == "BatchMode=yes"), "{a:?}");
    let b = &c.remotes["b"].command;
    assert_eq!(&b[b.len() - 2..], ["/opt/ollie/toolsrv", "--stdio"]);
    assert_eq!(c.remotes["c"].command[0], "/usr/bin/ssh");
    for (text, want) in [
        ("[remotes.r]\n", "remotes.r: needs command"),
        (
            "[remotes.r]\nhost = \"h\"\ncommand = [\"x\"]",
            "remotes.r: give either command or host",
        ),
        ("[remotes.r]\nhost = \"-oProxyCommand=x\"", "remotes.r.host"),
        ("[remotes.r]\nhost = \"a b\"", "remotes.r.host"),
        ("[remotes.r]\nhost = \"\"", "remotes.r.host"),
        (
            "[remotes.r]\nhost = \"h\"\ntoolsrv = \"\"",
            "remotes.r.toolsrv",
        ),
        (
            "[remotes.r]\ncommand = [\"ssh\"]\ntoolsrv = \"t\"",
            "remotes.r.toolsrv: only with host",
        ),
        ("[remotes.r]\ncommand = [\"\"]", "remotes.r.command"),
        ("[remotes.r]\nhost = \"h\"\nport = 22", "port"),
        ("[remotes.\"a b\"]\nhost = \"h\"", "remote names use"),
    ] {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains(want), "{text:?}: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

#[test]
fn errors_name_the_key_and_fit_one_line() {
    let cases = [
        ("colour = 1", "colour"),
        (
            "[backends.x]\nkind = \"gpt\"",
            "backends.x.kind: unknown kind \"gpt\"",
        ),
        ("[backends.x]\nkind = \"replay\"", "backends.x.file"),
        (
            "[backends.x]\nkind = \"openai\"\nbase_url = \"ftp://x\"",
            "backends.x.base_url",
        ),
        ("[backends.x]\nkind = \"openai\"\nextra = 1", "extra"),
        (
            "default_backend = \"nope\"",
            "default_backend: no backend named \"nope\"",
        ),
        ("[remotes.r]\ncommand = []", "remotes.r.command"),
        ("[backends.\"a/b\"]\nkind = \"openai\"", "backends.a/b"),
        ("default_backend = ", "line 1: default_backend: "),
        (
            "\n\n[remotes.r]\ncommand = 1",
            "line 4: command: invalid type",
        ),
    ];
    for (text, want) in cases {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains(want), "{text:?}: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

/// A config directory with a config.toml defining backends `local` and `demo`.
fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("config.toml"),
        "[backends.local]\nkind = \"openai\"\n[backends.demo]\nkind = \"replay\"\nfile = \"/t.jsonl\"\n",
    )
    .unwrap();
    for (name, text) in files {
        let p = d.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    d
}

fn load(d: &tempfile::TempDir) -> Result<Config, ConfigError> {
    Config::load_file(&d.path().join("config.toml"))
}

fn load_err(files: &[(&str, &str)]) -> String {
    let d = dir_with(files);
    let e = load(&d).unwrap_err().to_string();
    assert!(!e.contains('\n'), "{e}");
    e
}

const USER_POLICY: &str = "[network]\nmode = \"off\"\n";

#[test]
fn profile_with_every_key() {
    let d = dir_with(&[
        ("agents/prompts/coder.md", "You write code.\n"),
        ("policy/strict.toml", USER_POLICY),
        (
            "agents/coder.toml",
            r#"
backend = "local"
model = "big-model"
system_prompt_file = "prompts/coder.md"
tools = ["file_read", "execute_code"]
policy = "strict"
max_steps = 1000
escalations = ["net", "write"]
temperature = 0.2
max_tokens = 4096
top_p = 1
context_limit = 128000
"#,
        ),
        (
            "agents/inline.toml",
            "system_prompt = \"hi\"\npolicy = \"network\"\ntemperature = 2\n",
        ),
    ]);
    let c = load(&d).unwrap();
    assert_eq!(
        c.profiles.keys().collect::<Vec<_>>(),
        ["coder", "default", "inline"]
    );
    assert_eq!(
        c.profiles["coder"],
        Profile {
            name: "coder".into(),
            backend: Some("local".into()),
            model: Some("big-model".into()),
            system_prompt: Some("You write code.\n".into()),
            tools: vec!["file_read".into(), "execute_code".into()],
            policy: "strict".into(),
            max_steps: 1000,
            escalations: vec!["net".into(), "write".into()],
            temperature: Some(0.2),
            max_tokens: Some(4096),
            top_p: Some(1.0),
            context_limit: Some(128_000),
            hooks: HookSet::default(),
        }
    );
    let inline = &c.profiles["inline"];
    assert_eq!(inline.system_prompt.as_deref(), Some("hi"));
    assert_eq!(inline.policy, "network");
    assert_eq!(inline.temperature, Some(2.0));
    // Unset keys take the defaults.
    assert_eq!(inline.tools, TOOL_NAMES);
    assert_eq!(inline.max_steps, 50);
    assert!(inline.escalations.is_empty() && inline.backend.is_none());
}

#[test]
fn absolute_prompt_file() {
    let other = tempfile::tempdir().unwrap();
    let prompt = other.path().join("p.txt");
    std::fs::write(&prompt, "abs").unwrap();
    let text = format!("system_prompt_file = {:?}\n", prompt.to_str().unwrap());
    let d = dir_with(&[("agents/a.toml", &text)]);
    assert_eq!(
        load(&d).unwrap().profiles["a"].system_prompt.as_deref(),
        Some("abs")
    );
}

#[test]
fn profile_errors_name_the_file_and_key() {
    let cases: &[(&str, &str)] = &[
        ("colour = 1", "unknown field `colour`"),
        (
            "backend = \"nope\"",
            "backend: no backend named \"nope\" in config.toml (defined: demo, local)",
        ),
        ("model = \"\"", "model: must not be empty"),
        (
            "system_prompt = \"a\"\nsystem_prompt_file = \"p.md\"",
            "system_prompt_file: set system_prompt or system_prompt_file, not both",
        ),
        (
            "system_prompt_file = \"missing.md\"",
            "system_prompt_file: cannot read ",
        ),
        (
            "system_prompt_file = \"\"",
            "system_prompt_file: must name a file",
        ),
        ("system_prompt_file = \".\"", "is not a regular file"),
        (
            "tools = [\"file_read\", \"rm_rf\"]",
            "tools[1]: unknown tool \"rm_rf\" (valid: execute_code, execute_tool, execute_pipe, file_read, file_write)",
        ),
        (
            "tools = [\"file_read\", \"file_read\"]",
            "tools[1]: \"file_read\" is listed twice",
        ),
        (
            "policy = \"lax\"",
            "policy: unknown policy \"lax\" (valid: network, packages, readonly, workspace)",
        ),
        (
            "max_steps = 0",
            "max_steps: 0 is out of range (valid: 1 to 1000)",
        ),
        ("max_steps = 1001", "max_steps: 1001 is out of range"),
        (
            "escalations = [\"root\"]",
            "escalations[0]: unknown escalation \"root\" (valid: net, read, write, unsandboxed)",
        ),
        (
            "temperature = 3",
            "temperature: 3 is out of range (valid: 0.0 to 2.0)",
        ),
        ("temperature = nan", "temperature: NaN is out of range"),
        (
            "top_p = -0.1",
            "top_p: -0.1 is out of range (valid: 0.0 to 1.0)",
        ),
        (
            "max_tokens = 0",
            "max_tokens: 0 is out of range (valid: 1 to 1000000)",
        ),
        (
            "context_limit = 10000001",
            "context_limit: 10000001 is out of range",
        ),
        ("\nmax_steps = \"ten\"", "line 2: max_steps: invalid type"),
        ("tools = \"file_read\"", "line 1: tools: invalid type"),
        ("tools = [\n  1,\n]", "line 2: invalid type"),
    ];
    for (text, want) in cases {
        let e = load_err(&[("agents/p.toml", text)]);
        assert!(e.contains("agents/p.toml"), "{text:?}: {e}");
        assert!(e.contains(want), "{text:?}: {e}");
    }
}

#[test]
fn hooks_parse_and_errors_name_the_key() {
    let d = dir_with(&[(
        "agents/h.toml",
        "hook_policy = \"workspace\"\nhook_timeout_s = 30\n[hooks]\npre_tool = [\"./check\", \"echo ok\"]\nturn_error = [\"notify\"]\n",
    )]);
    let c = load(&d).unwrap();
    let h = &c.profiles["h"].hooks;
    assert_eq!((h.policy.as_str(), h.timeout_s), ("workspace", 30));
    assert_eq!(h.commands["pre_tool"], ["./check", "echo ok"]);
    assert_eq!(h.commands["turn_error"], ["notify"]);
    assert_eq!(c.profiles["default"].hooks, HookSet::default());
    assert_eq!(HookSet::default().policy, "readonly");
    let many = format!(
        "[hooks]\npost_tool = [{}]",
        vec!["\"x\""; hook_limits::MAX_PER_EVENT + 1].join(", ")
    );
    let long = format!(
        "[hooks]\npre_turn = [\"{}\"]",
        "x".repeat(hook_limits::MAX_COMMAND + 1)
    );
    let cases: &[(&str, &str)] = &[
        (
            "[hooks]\non_save = [\"x\"]",
            "hooks.on_save: unknown event (valid: agent_spawn, pre_turn, post_turn, pre_tool, post_tool, pre_compact, post_compact, turn_error)",
        ),
        (
            "[hooks]\npre_tool = [\" \"]",
            "hooks.pre_tool[0]: empty command",
        ),
        ("[hooks]\npre_tool = \"x\"", "invalid type"),
        (&many, "hooks.post_tool: 17 commands; at most 16"),
        (&long, "hooks.pre_turn[0]: the command is 16385 bytes"),
        (
            "hook_policy = \"lax\"",
            "hook_policy: unknown policy \"lax\" (valid: network, packages, readonly, workspace)",
        ),
        (
            "hook_timeout_s = 0",
            "hook_timeout_s: 0 is out of range (valid: 1 to 300)",
        ),
        (
            "hook_timeout_s = 301",
            "hook_timeout_s: 301 is out of range",
        ),
    ];
    for (text, want) in cases {
        let e = load_err(&[("agents/p.toml", text)]);
        assert!(e.contains("agents/p.toml"), "{text:?}: {e}");
        assert!(e.contains(want), "{text:?}: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

#[test]
fn prompt_file_must_be_small_utf8() {
    let big = "x".repeat(MAX_PROMPT_FILE_BYTES as usize + 1);
    let e = load_err(&[
        ("agents/big.md", &big),
        ("agents/p.toml", "system_prompt_file = \"big.md\""),
    ]);
    assert!(e.contains("agents/p.toml: system_prompt_file: "), "{e}");
    assert!(e.contains("big.md is larger than 256 KiB"), "{e}");
    let exact = "x".repeat(MAX_PROMPT_FILE_BYTES as usize);
    let d = dir_with(&[
        ("agents/ok.md", &exact),
        ("agents/p.toml", "system_prompt_file = \"ok.md\""),
    ]);
    assert_eq!(load(&d).unwrap().profiles["p"].system_prompt, Some(exact));

    let d = dir_with(&[("agents/p.toml", "system_prompt_file = \"bin.md\"")]);
    std::fs::write(d.path().join("agents/bin.md"), [0xff, 0xfe]).unwrap();
    let e = load(&d).unwrap_err().to_string();
    assert!(e.contains("agents/p.toml: system_prompt_file: "), "{e}");
    assert!(e.contains("bin.md is not utf-8 text"), "{e}");
}

#[test]
fn bad_profile_names_are_errors() {
    for name in [".hidden", "a b", "x".repeat(65).as_str(), ""] {
        let file = format!("agents/{name}.toml");
        let e = load_err(&[(&file, "")]);
        assert!(e.contains(&format!("{name}.toml: bad profile name")), "{e}");
        assert!(e.contains("not starting with '.'"), "{e}");
    }
    let ok = "A-z_0.9".to_owned() + &"x".repeat(57);
    let d = dir_with(&[(&format!("agents/{ok}.toml"), "")]);
    assert!(load(&d).unwrap().profiles.contains_key(&ok));
}

#[test]
fn other_files_and_directories_are_ignored() {
    let d = dir_with(&[
        ("agents/notes.txt", "colour = 1"),
        ("agents/bad name.md", ""),
        ("agents/sub.toml/x.toml", "colour = 1"),
        ("agents/nested/y.toml", "colour = 1"),
        ("agents/.swp", ""),
        ("policy/README", "not toml"),
    ]);
    let c = load(&d).unwrap();
    assert_eq!(c.profiles.keys().collect::<Vec<_>>(), ["default"]);
    assert_eq!(c.policies.len(), ollie_policy::SHIPPED_PROFILES.len());
}

#[test]
fn default_profile_exists_without_files() {
    let want = Profile::builtin_default();
    assert_eq!(want.tools, TOOL_NAMES);
    assert_eq!(want.policy, "workspace");
    assert_eq!(want.max_steps, 50);
    assert!(want.backend.is_none() && want.model.is_none());
    // No agents/ or policy/ directory at all.
    let d = dir_with(&[]);
    let c = load(&d).unwrap();
    assert_eq!(c.profiles.len(), 1);
    assert_eq!(c.profiles[DEFAULT_PROFILE], want);
    // No file at all.
    assert_eq!(Config::builtin().profiles[DEFAULT_PROFILE], want);
    assert_eq!(Config::default(), Config::builtin());
    // Text only.
    assert_eq!(parse("").unwrap().profiles[DEFAULT_PROFILE], want);
}

#[test]
fn default_profile_is_replaceable() {
    let d = dir_with(&[(
        "agents/default.toml",
        "policy = \"readonly\"\nmax_steps = 5",
    )]);
    let c = load(&d).unwrap();
    let p = &c.profiles[DEFAULT_PROFILE];
    assert_eq!((p.policy.as_str(), p.max_steps), ("readonly", 5));
    assert_eq!(p.tools, TOOL_NAMES);
}

#[test]
fn shipped_policies_are_present() {
    let want: BTreeMap<String, String> = ollie_policy::SHIPPED_PROFILES
        .iter()
        .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
        .collect();
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        ["network", "packages", "readonly", "workspace"]
    );
    assert_eq!(Config::builtin().policies, want);
    assert_eq!(parse("").unwrap().policies, want);
    assert_eq!(load(&dir_with(&[])).unwrap().policies, want);
    for text in want.values() {
        ollie_policy::Policy::from_toml(text).unwrap();
    }
}

#[test]
fn user_policy_is_validated_and_kept_as_text() {
    let d = dir_with(&[
        ("policy/strict.toml", USER_POLICY),
        ("agents/a.toml", "policy = \"strict\""),
    ]);
    let c = load(&d).unwrap();
    assert_eq!(c.policies["strict"], USER_POLICY);
    assert_eq!(c.policies.len(), ollie_policy::SHIPPED_PROFILES.len() + 1);
    assert_eq!(c.profiles["a"].policy, "strict");
}

#[test]
fn invalid_user_policy_names_file_and_key() {
    let e = load_err(&[("policy/bad.toml", "[fs]\nwrite = [\"relative\"]\n")]);
    assert!(e.contains("policy/bad.toml: fs.write[0]: "), "{e}");
    let e = load_err(&[("policy/bad.toml", "colour = 1\n")]);
    assert!(
        e.contains("policy/bad.toml: line 1: unknown field `colour`"),
        "{e}"
    );
    let e = load_err(&[("policy/.x.toml", USER_POLICY)]);
    assert!(e.contains(".x.toml: bad policy name"), "{e}");
}

#[test]
fn limits_take_every_key_and_refuse_bad_values() {
    let c = parse(
        "[limits]\nfids_per_connection = 100\nafids_per_connection = 2\nrequests_per_connection = 50\nconnections = 9\nconnections_per_peer = 3\nattach_timeout_s = 0\n",
    )
    .unwrap();
    let l = c.limits;
    assert_eq!(
        (
            l.max_fids,
            l.max_afids,
            l.max_inflight,
            l.max_conns,
            l.max_conns_per_peer
        ),
        (100, 2, 50, 9, 3)
    );
    assert_eq!(l.attach_timeout, None);
    assert_eq!(
        parse("").unwrap().limits,
        ollie_p9::server::Limits::default()
    );
    for (text, want) in [
        (
            "fids_per_connection = 0",
            "limits.fids_per_connection: 0 is out of range",
        ),
        ("connections = -1", "limits.connections: -1 is out of range"),
        (
            "attach_timeout_s = 4000",
            "limits.attach_timeout_s: 4000 is out of range",
        ),
        (
            "fids_per_connection = 4\nafids_per_connection = 8",
            "limits.afids_per_connection: 8 is more than fids_per_connection (4)",
        ),
        ("fids = 1", "unknown field `fids`"),
    ] {
        let e = parse(&format!("[limits]\n{text}\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{text}: {e}");
    }
}

#[test]
fn a_bad_key_is_shown_escaped() {
    let e = parse("[backends.\"x\\u001b]0;title\\u0007\"]\nkind = \"replay\"\n")
        .unwrap_err()
        .to_string();
    assert!(!e.contains('\u{1b}') && !e.contains('\u{7}'), "{e:?}");
    assert!(
        e.contains("backends.x\\u{1B}]0;title\\u{7}: backend names use"),
        "{e}"
    );
}

#[test]
fn text_the_file_chose_is_shown_escaped_in_every_error() {
    // A file name: a prompt file that cannot be read, and one that is not a regular file.
    let e = load_err(&[("agents/p.toml", "system_prompt_file = \"a\\nb\\t.md\"")]);
    assert!(e.contains("system_prompt_file: cannot read "), "{e}");
    assert!(e.contains("a\\u{A}b\\u{9}.md"), "{e}");
    let e = load_err(&[
        ("agents/d\u{1b}[2J/x", ""),
        ("agents/p.toml", "system_prompt_file = \"d\\u001b[2J\""),
    ]);
    assert!(e.contains("d\\u{1B}[2J is not a regular file"), "{e}");
    // A name in agents/ that cannot be read (a dangling link).
    let d = dir_with(&[]);
    std::fs::create_dir(d.path().join("agents")).unwrap();
    std::os::unix::fs::symlink("/nonexistent", d.path().join("agents/a\nb.toml")).unwrap();
    let e = load(&d).unwrap_err().to_string();
    assert!(
        e.starts_with("cannot read config ") && e.ends_with("agents/a\\u{A}b.toml"),
        "{e}"
    );
    // The decoder quoting a key.
    let e = parse("\"x\\u001b]0;t\\u0007\" = 1")
        .unwrap_err()
        .to_string();
    assert!(!e.chars().any(char::is_control), "{e:?}");
    assert!(e.contains("unknown field `x\\u{1B}]0;t\\u{7}`"), "{e}");
}

#[test]
fn user_policy_cannot_use_a_shipped_name() {
    for (name, _) in ollie_policy::SHIPPED_PROFILES {
        let e = load_err(&[(&format!("policy/{name}.toml"), USER_POLICY)]);
        assert!(
            e.contains(&format!(
                "policy: {name}.toml: \"{name}\" is a shipped policy"
            )),
            "{e}"
        );
        assert!(
            e.contains("shipped: readonly, workspace, network, packages"),
            "{e}"
        );
    }
}

#[test]
fn profiles_and_policies_load_without_a_main_file() {
    let d = dir_with(&[
        ("policy/strict.toml", USER_POLICY),
        ("agents/a.toml", "policy = \"strict\""),
    ]);
    let c = Config::builtin().load_dir(d.path()).unwrap();
    assert!(c.path.is_none());
    assert_eq!(c.profiles["a"].policy, "strict");
    // Backends come from config.toml; without one, none are valid.
    std::fs::write(d.path().join("agents/b.toml"), "backend = \"local\"").unwrap();
    let e = Config::builtin()
        .load_dir(d.path())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("backend: no backend named \"local\" in config.toml (defined: none)"),
        "{e}"
    );
}

#[test]
fn dir_of_a_bare_file_name_is_the_current_directory() {
    assert_eq!(dir_of(Path::new("config.toml")), Path::new("."));
    assert_eq!(
        dir_of(Path::new("/etc/ollie/config.toml")),
        Path::new("/etc/ollie")
    );
}

//! toolsrv: the per-session tool server, and the only place ollie ever runs a tool.
//!
//! One toolsrv process per session, started by olliesrv (`ollie_link::spawn::Toolsrv::spawn`) with one
//! end of a socketpair as its link (fd 3) and its boot message — the per-session master key
//! and the session's configuration (`ollie_link::boot`) — on a sealed memfd (fd 4); never in argv or
//! the environment. Before any thread exists it takes both, closes every other fd, makes
//! itself non-dumpable and applies its own restrictions (`ollie_sandbox::harden`: seccomp
//! deny-list, Landlock scopes and no TCP unless a policy grants it, no_new_privs), then
//! serves 9P2000 on the link until it closes, and exits; every tool dies with it (each
//! policy's prepared sandbox ends when its control link closes).
//!
//! - [`auth`]: Tauth with per-identity secrets derived from the master key.
//! - [`binding`]: what an approval is bound to (argv, cwd, environment, file hashes).
//! - [`egress`]: the proxy of runs under `network.mode = "proxy"` (egress by domain).
//! - [`fs`]: the tree (`ctl`, `tools`, `info`, `bypass/`, `proc/`).
//! - [`session`]: policies, prepared sandboxes, agents' tool sets, starting processes.
//! - [`procs`]: the bounded process table and the completion log.
//! - [`tools`]: what each tool runs in the sandbox, its schema, its result.
//! - [`payload`]: the `proc/new` key=value payload.

pub mod auth;
pub mod binding;
pub mod broker;
pub mod egress;
pub mod fs;
pub mod payload;
pub mod procs;
pub mod quiesce;
pub mod session;
pub mod tools;

pub use ollie_link::boot;

pub use ollie_link::error_chain;

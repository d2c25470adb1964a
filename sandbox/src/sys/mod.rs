//! Every raw system call of the crate, and the code that runs between `clone` and `execve`.
//!
//! The child side ([`spawn_init`]) runs in a copy of a possibly multithreaded process, so it
//! only uses data prepared by the parent (C strings, pointer arrays, BPF programs, fds) and
//! async-signal-safe system calls: it never allocates, locks, or unwinds.
//!
//! The files, each using only those after it: `zygote` (prepared sandboxes) → `child` (the
//! one-shot runtime) → `mount` (the mount-namespace steps) → `netns` (a proxied run's network
//! namespace) → `stage` (failure reports) → `probe` (feature probes) → `raw` (thin
//! wrappers). The rest of the crate names everything as `sys::X`, through the re-exports
//! below.
#![allow(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod child;
mod mount;
mod netns;
mod probe;
mod raw;
mod stage;
mod zygote;

pub(crate) use child::*;
pub(crate) use mount::*;
pub(crate) use probe::*;
pub use probe::{ipc_namespaces, network_namespaces, seccomp_available, user_namespaces};
pub(crate) use raw::*;
pub(crate) use stage::*;
pub(crate) use zygote::*;

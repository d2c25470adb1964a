//! Bead namespaces (DESIGN.md §7, seed 002): the bead registry, per-session mount tables driven
//! by the seed's five commands, the session namespace file, and union views over real bead
//! directories. Filesystem code only — no 9P, no async: olliesrv serves a [`Namespace`] as
//! `session/{s}/ns/` (`ctl`, `table`, one directory per point) and toolsrv gives sandboxed
//! commands the same view.
//!
//! Guarantees:
//! - A union operation never creates, changes, renames or removes anything in a read-only
//!   member, nor outside the kind folders of the create target; everything else it writes is
//!   in the namespace's own shadow layer.
//! - A path inside a view never leaves its layer: `..`, `.`, empty components, absolute paths
//!   and NUL are refused before any filesystem call, and symlinks that resolve outside their
//!   layer are refused (see "Path safety" for the residual races).
//! - Write authority is checked when `-c` is mounted and again on every write into the create
//!   target, so a revoked delegation takes effect at once.
//! - A command that fails changes nothing; the error is one lowercase line.
//! - Directories are created 0700, files 0600; metadata and namespace files are written
//!   atomically and durably (temp file, fsync, rename, fsync of the directory).
//!
//! Not guaranteed here: who may *read* a bead. Reads happen with the host's privileges (olliesrv
//! runs as its user, so the kernel's checks apply); a host serving several users must decide
//! who may mount what. Hosts serialise access to one [`Namespace`] themselves (it is plain data).
//!
//! Tested by unit tests next to the code: one or more per rule of the seed, over real
//! directories in temporary dirs (`src/tests.rs`); the test that needs root to `chown` prints
//! `SKIP …` and returns when not root. Run as root and as an unprivileged user.
//!
//! # Beads and the registry
//!
//! A bead is a directory holding a regular file `agent.json` ([`Bead::open`]); a directory
//! without one is refused, so a namespace can never mount an arbitrary directory. Its identity
//! is its canonical absolute path (symlinks resolved); its URI is `file://` + that path
//! (percent-encoded outside `A-Z a-z 0-9 / - . _ ~ ! $ & ' ( ) * + , ; = : @`) + `/`.
//!
//! The [`Registry`] is `$XDG_DATA_HOME/ollie/beads/` (else `$HOME/.local/share/ollie/beads/`),
//! the seed's `.agents/`. [`Registry::start`] creates `<root>/<uuid-v4>/` with
//! - `about.md`: `# <slug or "untitled">`, a blank line, `created: YYYY-MM-DD`, `uuid: <uuid>`;
//! - `agent.json`: `{"created": RFC 3339 UTC, "owner": uid, "slug": slug or null, "uuid": …}`;
//! - `names.json`: a JSON object short name → bead URI; `{slug: own URI}` or `{}`;
//! - `<YYYY-MM-DD>/{notes,skills,artifacts}/` for today (UTC).
//!
//! The bead is assembled as `<root>/.tmp-<uuid>/` and renamed into place. Slugs are 1–64 of
//! `[a-z0-9._-]`, not starting with `.` or `-`, and unique among registry slugs (a second bead
//! with a taken slug is refused, because the slug is a short name). `agent.json` is read
//! leniently (unknown keys ignored) so beads made by other tools mount; metadata files over
//! 1 MiB or behind a symlink are not read.
//!
//! # Naming a bead
//!
//! [`Registry::resolve`]: `file:///abs/dir/` (or `file://localhost/…`) and absolute paths name
//! a bead directly; `http(s)://…` is refused with "remote beads are not supported: …"; a UUID
//! (any case, optional trailing `/`) is `<root>/<uuid>/`; anything else is a short name (the
//! slug rules with upper case allowed, e.g. the seed's `A`), resolved first through the
//! namespace's own member names, then through every registry bead's slug and `names.json`.
//! Several distinct beads for one short name is an error listing their URIs. (Short-name
//! lookup reads every registry bead's metadata; the registry is expected to stay small.)
//!
//! # Write authority (`-c`)
//!
//! [`decide_write`] (pure) on [`bead_facts`]: the caller (`Env::uid`) may write a bead if
//! - it owns the bead directory and the directory's owner-write bit is set (every kind), or
//! - the bead's `delegations.json` delegates kind folders to its uid. The file is a JSON array
//!   of `{"uid": N, "write_paths": ["notes/", "artifacts/"]}` (unknown keys refused; each path
//!   exactly `notes/`, `skills/` or `artifacts/`, the `/` optional; entries for one uid add up).
//!   It is trusted only if it is a regular file (not a symlink) owned by the bead directory's
//!   owner, and neither it nor the bead directory is writable by group or others.
//!
//! Root is not special. `-c` is allowed when the caller may write at least one kind; each
//! create into the target then needs that kind (`"artifacts/ is not delegated to uid N"`).
//! Delegation is authorisation only: the host process still needs filesystem permission.
//!
//! # Mount points, members and commands
//!
//! A point is `/NAME` (NAME as a short name), served as the directory `NAME`
//! ([`point_dir_name`]): nested points (`/a/b`) and the root are refused, and so are `/ctl` and
//! `/table`, the `ns/` directory's own files. A point exists while it has members; each member
//! has a bead, a name unique at the point, and the create bit.
//!
//! [`Command::parse`] reads `start [slug]`, `mount [-b|-a] [-c] BEAD POINT`,
//! `unmount [BEAD] POINT`, `ns` and `rfork` (also `bead-…`); flags combine (`-bc`, `-ac`,
//! `-b -c`). [`Namespace::execute`] runs them:
//! - `mount`: `-b` puts the bead first, `-a` last, neither replaces every member of the point.
//!   A bead already at the point is moved, taking the new flags (it loses `-c` unless given
//!   again). The member's name is the short name it was named by, else its slug, else its
//!   directory name; a clash at the point gets `-2`, `-3`, …. `-c` requires write authority
//!   and fails if another member of the point already has it ("/ctx already has a create
//!   target: C (…); …"). A successful `-c` settles the shadow layer (below).
//! - `unmount BEAD POINT` removes the member whose name is BEAD, else the member BEAD resolves
//!   to; `unmount POINT` removes the point. Unknown points and members are errors.
//! - `start [slug]`: with no open bead ([`Namespace::started`]), births one and opens it; with
//!   one open that has no slug yet, records the slug in its `agent.json`, `names.json` and
//!   `about.md` title; a different slug than the one it has is refused (the bead is not
//!   renamed). It returns the open bead's URI.
//! - `list`: the registry's beads, one `SLUG<TAB>UUID<TAB>CREATED<TAB>URI` line each.
//! - `rfork` returns [`Outcome::Rfork`]: the host replaces the shared namespace by
//!   [`Namespace::rfork`] (a deep copy; give it its own shadow root).
//!
//! # The `ns` table
//!
//! The seed's example lost its whitespace; this crate prints, per point in the order points
//! were first mounted, a line `POINT (union)` and then one line per member in search order:
//! two spaces, `[N]` (1-based), the name, the URI and `read` or `read,create*`, separated by
//! single spaces, every line ending in `\n` (the empty table is empty):
//!
//! ```text
//! /ctx (union)
//!   [1] A file:///home/u/.local/share/ollie/beads/…/ read
//!   [2] B file:///home/u/.local/share/ollie/beads/…/ read
//!   [3] C file:///home/u/.local/share/ollie/beads/…/ read,create*
//! ```
//!
//! Every point is labelled `(union)`: even a single member is unioned with the shadow layer.
//!
//! # The session namespace file
//!
//! [`Namespace::to_json`] writes the seed's object — `profile` (`acequia/session-namespace`),
//! `session`, `mounts` (`bead` URI, `point`, `order` ∈ `before|after|replace`, `create`,
//! `name`) — plus `started`, the open bead's URI, when there is one. Mounts are listed per point
//! in search order; the first member of a point keeps the order it was mounted with and every
//! later member is written as `after`, so replaying the list rebuilds the table exactly (a
//! `mount B; mount -b A` history is written as A `before`, B `after`).
//! [`Namespace::from_json`] is strict (unknown or missing keys, duplicate keys, another
//! profile, an empty session, bad points, names, orders or URIs, remote beads, a name used
//! twice at a point, a second `create` at a point: each an error naming the key path) and
//! replays with the `mount` rules. It reads nothing from disk: beads are taken on trust
//! (a missing one simply contributes nothing), and write authority is re-checked on every
//! write. It does not move shadow files; call [`Namespace::settle`] for that. Save with
//! [`Namespace::save`] (atomic, 0600).
//!
//! # Union views
//!
//! The layers of a point, in search order: the **shadow layer** `<Env::shadow_root>/<NAME>/`
//! (the chat's own emissions; it always holds `notes/`, `skills/` and `artifacts/`, created on
//! first use, so every view offers the three kind folders), then the members in search order.
//! A member shows its bead directory as it is, except that `notes/`, `skills/` and
//! `artifacts/` at its top level are the merge of every dated `<YYYY-MM-DD>/<kind>/` folder,
//! newest date first, then a plain `<kind>/`; the dated folders also stay visible as they are.
//! Only regular files and directories are shown; names that are not UTF-8, sockets, fifos and
//! devices are not.
//!
//! - [`Namespace::lookup`]: the first layer that has the path wins. Walking is per component:
//!   only layers whose object is a directory continue, and only if the winner is a directory,
//!   so a file in an earlier layer hides a directory of the same name in a later one
//!   (`ENOTDIR` below it). `""` is the point itself (the shadow directory).
//! - [`Namespace::read_dir`]: the union of the directories that continue; the first layer to
//!   have a name wins; sorted by name.
//! - [`Namespace::create`] (file or directory; the name must be new and its parent a directory
//!   of the view): a path under a kind folder goes to the create target's
//!   `<today>/<kind>/…` (UTC) when one is pinned, else to the shadow layer; every other path
//!   goes to the shadow layer. Missing parent directories are made in that layer.
//! - [`Namespace::open_write`]: a file in the shadow layer, or in the create target under a kind
//!   folder the caller may write, is written in place; any other file is first **copied up**
//!   into the shadow layer, which shadows every member, and the copy is returned.
//! - [`Namespace::settle`] (run by every successful `mount -c`): the seed's "shadow locally until
//!   one is" (pinned) — regular files under the shadow layer's kind folders move to the target's
//!   `<today>/<kind>/…`. A file stays (and is reported, [`SettleReport::kept`]) when its kind is
//!   not writable, when a member searched before the target has the same path (moving would
//!   hide it), when today's folder already has it, or when moving fails. Other shadow files stay.
//! - [`Namespace::remove`] and [`Namespace::rename`] act only on a name won by the shadow layer
//!   or by the create target under a kind folder with authority; a name won by any other member
//!   is refused ("permission denied: /ctx/x is in read-only bead A (…)"). There are no
//!   whiteouts: removing a name can uncover the same name in a later layer. A directory must be
//!   empty in its layer. The point and the kind folders cannot be removed or renamed. `rename`
//!   requires a new destination whose parent is a directory of the view, and routes it like a
//!   create; a destination in another layer is `EXDEV` (copy and remove instead).
//!
//! ## Path safety
//!
//! Paths are split into components and refused on `..`, `.`, empty components, a leading `/`
//! and NUL. Each component is looked up with `lstat`; a symlink is resolved and must stay under
//! its layer's canonical root, else it is refused (`EACCES`) and left out of listings; dangling
//! symlinks count as absent. Directories are created one component at a time, refusing
//! symlinks; files are created with `O_CREAT|O_EXCL|O_NOFOLLOW` and opened with `O_NOFOLLOW`.
//! Residual limits: checks and uses are separate system calls, so someone who can write inside a
//! layer (its owner, or a tool granted the create target) can swap a checked directory for a
//! symlink between the check and the use; `rename` can replace a destination created in that
//! window. Serve views only from layers whose writers you trust as much as the host, or put the
//! host in a sandbox that confines it to the registry and state directories.
//!
//! # Errors
//!
//! One [`Error`] enum; [`Error::errno`] maps it to `ENOENT`, `EACCES`, `EEXIST`, `EINVAL`,
//! `ENOTDIR`, `EISDIR`, `ENOTEMPTY`, `EXDEV`, `EBUSY` or the OS error. Messages of union
//! operations contain the phrase plan9port's 9pfuse maps to the same errno (`file does not
//! exist`, `permission denied`, `file already exists`, …), so a 9P server can send them as is.
#![forbid(unsafe_code)]

mod authority;
mod clock;
mod command;
mod error;
mod exec;
mod ids;
mod layout;
mod names;
mod namespace;
mod registry;
mod store;
mod union;

pub use authority::{
    BeadFacts, DELEGATIONS_FILE, Delegation, Delegations, KindSet, WriteDecision, WriteGrant,
    bead_facts, current_uid, decide_write, parse_delegations, write_authority,
};
pub use clock::utc_today;
pub use command::{Command, MountFlags, Order};
pub use error::Error;
pub use exec::{MountReport, Outcome};
pub use ids::{is_uuid, new_uuid_v4};
pub use layout::Kind;
pub use names::{
    RESERVED_POINT_NAMES, file_uri, parse_file_uri, parse_point, point_dir_name, validate_name,
    validate_slug,
};
pub use namespace::{Env, Member, Namespace, PROFILE, Point};
pub use registry::{AgentInfo, Bead, MAX_META_BYTES, Named, Registry};
pub use store::{DIR_MODE, FILE_MODE, write_atomic};
pub use union::{Entry, Kept, Layer, Moved, NodeKind, OverlayLayers, Resolved, SettleReport};

#[cfg(test)]
mod tests;

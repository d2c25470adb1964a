//! The mount-namespace steps between `clone` and `execve`: pid 1's mount plan
//! ([`MountStep`], [`run_mounts`]: the one-shot init stage's, or a prepared session's
//! zygote's) and a prepared call's own protected paths and unions, with the Landlock rules
//! that name what they mount. Uses `netns`, `stage` and `raw`.
//!
//! Child only: raw, async-signal-safe system calls on data prepared by the parent (C strings,
//! fixed arrays on the stack); a failed step reports its stage and exits.

use std::ffi::{CStr, CString};
use std::os::fd::RawFd;

use super::netns::replace_file;
use super::raw::*;
use super::stage::*;

/// Most detached mounts (writable trees, pinned directories, overlays) one plan holds at once.
pub(super) const MAX_SLOTS: usize = 64;

/// One step of the mount-namespace set-up, executed by the init stage.
#[derive(Debug)]
pub(crate) enum MountStep {
    /// `mount --make-rprivate /`.
    MakePrivate,
    /// Clone the tree at `path` (recursively) into detached slot `slot`, before `/` goes
    /// read-only, so it stays writable.
    CloneTree { path: CString, slot: usize },
    /// Make every mount read-only and nosuid (recursively, from `/`).
    ReadOnlyAll,
    /// Attach detached slot `slot` at `path`.
    Attach { slot: usize, path: CString },
    /// Bind `path` onto itself read-only (a protected island inside a writable tree).
    ProtectReadOnly { path: CString },
    /// Mount a fresh tmpfs (`options`: size, inodes, mode) at `path`, nosuid/nodev/noexec, and
    /// grant `rule_access` beneath it in the run's Landlock ruleset (the rule must name the
    /// new tmpfs root: Landlock does not look at hidden mount points).
    PrivateTmpfs {
        path: CString,
        options: CString,
        rule_access: u64,
    },
    /// Hide `path` from the tool: an empty tmpfs of mode 0 (nothing to list, stat or watch)
    /// over a directory, `/dev/null` bound over a file; read-only, nosuid, nodev, noexec. A
    /// path gone by then is skipped (there is nothing left to hide).
    Hide { path: CString, dir: bool },
    /// Replace the root by a fresh tmpfs (`options`) that holds one entry per entry of the
    /// host's `/` (`entries`: directories and files bound recursively from the host, symlinks
    /// recreated) plus empty directories for union points; the tmpfs is mounted on `stage`
    /// (an existing host directory) after every bind source has been cloned, made read-only,
    /// and `pivot_root`ed into; the old root is detached. `root_rule_access` (the Landlock
    /// rights the policy grants on the host's `/` itself, usually none) is granted on the new
    /// root, which is another inode.
    NewRoot {
        stage: CString,
        options: CString,
        entries: Vec<RootEntry>,
        root_rule_access: u64,
    },
    /// Create an overlay (`lowerdir+` per entry of `lowers`, in search order; `upperdir`,
    /// `workdir`; `userxattr`) as a detached nosuid, nodev mount in slot `slot`. Every layer
    /// is opened without following symlinks (the paths are resolved by the parent) and passed
    /// by fd. Runs before
    /// [`MountStep::ReadOnlyAll`]: the overlay takes its own private clone of the upper
    /// directory's mount, which must be writable then.
    UnionCreate {
        lowers: Vec<CString>,
        upper: CString,
        work: CString,
        slot: usize,
    },
    /// Create a read-only overlay of `lowers` only (a merge of nested lower layers) and
    /// attach it at `at`, an empty directory of the new root, where a union's
    /// [`MountStep::UnionCreate`] then takes it as one lower layer.
    MergeCreate { lowers: Vec<CString>, at: CString },
    /// Attach the overlay in slot `slot` at `point` (after [`MountStep::ReadOnlyAll`], so it
    /// stays writable), and grant `rule_access` beneath it in the run's Landlock ruleset (the
    /// rule must name the overlay's root; 0: no rule).
    UnionAttach {
        slot: usize,
        point: CString,
        rule_access: u64,
    },
    /// Replace the file at `path` by a read-only file holding `content` (a detached tmpfs's,
    /// see `netns::replace_file`; a proxied run's `/etc/resolv.conf`), and grant
    /// `rule_access` (file rights) on it in the run's Landlock ruleset: the rule must name the
    /// new file, Landlock does not look at the mount point beneath it.
    ReplaceFile {
        path: CString,
        content: Vec<u8>,
        rule_access: u64,
    },
}

/// One entry of the new root ([`MountStep::NewRoot`]).
#[derive(Debug)]
pub(crate) struct RootEntry {
    /// The entry's name in the new root (one component).
    pub name: CString,
    /// The host path it comes from (`/name`).
    pub source: CString,
    pub kind: RootKind,
}

/// What a [`RootEntry`] becomes.
#[derive(Debug)]
pub(crate) enum RootKind {
    /// An empty directory with the host's tree bound onto it recursively.
    Dir,
    /// An empty file with the host's file bound onto it.
    File,
    /// A symlink with this target.
    Symlink(CString),
    /// An empty directory (a union point).
    Point,
}

/// At most this many entries in a new root (the child keeps their clones on its stack).
pub(crate) const MAX_ROOT_ENTRIES: usize = 256;

/// Runs the mount plan of pid 1 (the init stage or the zygote), in order. Child only.
pub(super) fn run_mounts(mounts: &[MountStep]) {
    let mut slots = [-1 as RawFd; MAX_SLOTS];
    let root = c"/";
    for step in mounts {
        // SAFETY: every pointer below is a valid C string or a live struct; these are raw
        // mount-API syscalls in the child's own (new) mount namespace.
        unsafe {
            match step {
                MountStep::MakePrivate => check(
                    Stage::Mount,
                    libc::mount(
                        std::ptr::null(),
                        root.as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ) as libc::c_long,
                ),
                MountStep::CloneTree { path, slot } => {
                    slots[*slot] = clone_tree(path, true, Stage::Mount)
                }
                MountStep::ReadOnlyAll => {
                    mount_setattr(
                        libc::AT_FDCWD,
                        root.as_ptr(),
                        AT_RECURSIVE as libc::c_uint,
                        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID,
                    );
                }
                MountStep::Attach { slot, path } => attach(slots[*slot], path, Stage::Mount),
                MountStep::ProtectReadOnly { path } => bind_read_only(path, Stage::Mount),
                MountStep::PrivateTmpfs {
                    path,
                    options,
                    rule_access,
                } => mount_private_tmpfs(path, options, *rule_access),
                MountStep::Hide { path, dir } => hide(path, *dir),
                MountStep::NewRoot {
                    stage,
                    options,
                    entries,
                    root_rule_access,
                } => {
                    pivot_to_new_root(stage, options, entries);
                    if *root_rule_access != 0 {
                        add_rule_beneath(root, *root_rule_access);
                    }
                }
                MountStep::UnionCreate {
                    lowers,
                    upper,
                    work,
                    slot,
                } => slots[*slot] = create_overlay(lowers, Some((upper, work))),
                MountStep::MergeCreate { lowers, at } => {
                    attach(create_overlay(lowers, None), at, Stage::Mount)
                }
                MountStep::UnionAttach {
                    slot,
                    point,
                    rule_access,
                } => {
                    attach(slots[*slot], point, Stage::Mount);
                    if *rule_access != 0 {
                        add_rule_beneath(point, *rule_access);
                    }
                }
                MountStep::ReplaceFile {
                    path,
                    content,
                    rule_access,
                } => {
                    if let Err(e) = replace_file(path, content) {
                        fail(Stage::Mount, e);
                    }
                    if *rule_access != 0 {
                        add_rule_on(path, *rule_access, 0);
                    }
                }
            }
        }
    }
}

/// Most writable trees inside protected islands one call re-attaches.
pub(crate) const MAX_CALL_REATTACH: usize = 16;

/// The protected islands of one prepared call, in the call's own mount namespace (a copy of
/// the session's, made by the per-call init's clone): each entry is a kind byte and a path —
/// `w` a writable tree inside an island, `p` a directory pinned by a bind onto itself, `r` a
/// protected path bound read-only (and nosuid). In the order the one-shot plan uses: the
/// writable trees cloned first (the read-only binds would hide them), then the pins, the
/// read-only binds, and the writable trees attached again on top. Child only (raw syscalls
/// on the call's prepared strings; the clones live in a fixed array on the stack).
///
/// # Safety
/// Every pointer in `entries` is a NUL-terminated string of at least two bytes that stays
/// alive and unchanged for the duration of the call.
pub(super) unsafe fn protect_call_islands(entries: &[*const libc::c_char]) {
    if entries.is_empty() {
        return;
    }
    let root = c"/";
    // SAFETY: raw mount syscall on valid C strings, in this process's own mount namespace.
    check(Stage::CallIslands, unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) as libc::c_long
    });
    // SAFETY: the caller's contract: each entry is a kind byte followed by a C string path.
    let split = |e: *const libc::c_char| unsafe { (*e as u8, CStr::from_ptr(e.add(1))) };
    let mut clones = [-1 as RawFd; MAX_CALL_REATTACH];
    let mut n = 0;
    for &e in entries {
        let (kind, path) = split(e);
        if kind == b'w' {
            if n == MAX_CALL_REATTACH {
                fail(Stage::CallIslands, libc::E2BIG);
            }
            clones[n] = clone_tree(path, true, Stage::CallIslands);
            n += 1;
        }
    }
    for &e in entries {
        let (kind, path) = split(e);
        match kind {
            b'p' => attach(
                clone_tree(path, true, Stage::CallIslands),
                path,
                Stage::CallIslands,
            ),
            b'r' => bind_read_only(path, Stage::CallIslands),
            b'w' => {}
            _ => fail(Stage::CallIslands, libc::EINVAL),
        }
    }
    let mut i = 0;
    for &e in entries {
        let (kind, path) = split(e);
        if kind == b'w' {
            attach(clones[i], path, Stage::CallIslands);
            i += 1;
        }
    }
}

/// [`MountStep::ProtectReadOnly`]: `path` bound onto itself read-only and nosuid (a clone of
/// the mount at `path`, without its submounts, made read-only, attached there). Child only.
fn bind_read_only(path: &CStr, stage: Stage) {
    let fd = clone_tree(path, false, stage);
    mount_setattr(
        fd,
        c"".as_ptr(),
        libc::AT_EMPTY_PATH as libc::c_uint,
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID,
    );
    attach(fd, path, stage);
}

/// `open_tree(path, OPEN_TREE_CLONE)`: a detached copy of the mount at `path`, with its
/// submounts when `recursive`, never following a final symlink; a failure fails
/// `stage`. Child only.
fn clone_tree(path: &CStr, recursive: bool, stage: Stage) -> RawFd {
    let recursive = if recursive {
        AT_RECURSIVE as libc::c_ulong
    } else {
        0
    };
    // SAFETY: raw syscall; `path` is a valid C string.
    let fd = unsafe {
        libc::syscall(
            SYS_OPEN_TREE,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE
                | libc::O_CLOEXEC as libc::c_ulong
                | recursive
                | libc::AT_SYMLINK_NOFOLLOW as libc::c_ulong,
        )
    };
    check(stage, fd);
    fd as RawFd
}

/// `move_mount` of the detached mount `fd` onto `path`, then closes `fd`; a failure fails
/// `stage`. Child only.
fn attach(fd: RawFd, path: &CStr, stage: Stage) {
    // SAFETY: raw syscalls; `path` and the empty path are valid C strings.
    unsafe {
        check(
            stage,
            libc::syscall(
                SYS_MOVE_MOUNT,
                fd,
                c"".as_ptr(),
                libc::AT_FDCWD,
                path.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            ),
        );
        libc::close(fd);
    }
}

/// The init stage's [`MountStep::NewRoot`]. Child only (raw syscalls on prepared data; the
/// clones live in a fixed array on the stack).
///
/// Every bind source is cloned first (detached copies of the host's trees, submounts
/// included, taken before the tmpfs hides `stage`); then the tmpfs is mounted on `stage`,
/// populated, made read-only, and becomes the root: `pivot_root(".", ".")` stacks the old
/// root on the new one, and `umount2(".", MNT_DETACH)` takes it out of the namespace. The
/// clones keep the host's mount locks (an unprivileged namespace cannot unmount what the
/// host stacked inside a tree), and `pivot_root` moves the root's lock to the new root.
fn pivot_to_new_root(stage: &CStr, options: &CStr, entries: &[RootEntry]) {
    let mut fds = [-1 as RawFd; MAX_ROOT_ENTRIES];
    let empty = c"";
    // SAFETY: (whole function) valid C strings, stack arrays and structs; raw syscalls in the
    // child's own mount namespace; every fd opened here is closed before returning.
    unsafe {
        for (i, e) in entries.iter().enumerate().take(MAX_ROOT_ENTRIES) {
            let recursive = match e.kind {
                RootKind::Dir => AT_RECURSIVE as libc::c_ulong,
                RootKind::File => 0,
                RootKind::Symlink(_) | RootKind::Point => continue,
            };
            let fd = libc::syscall(
                SYS_OPEN_TREE,
                libc::AT_FDCWD,
                e.source.as_ptr(),
                OPEN_TREE_CLONE
                    | libc::O_CLOEXEC as libc::c_ulong
                    | recursive
                    | libc::AT_SYMLINK_NOFOLLOW as libc::c_ulong,
            );
            if fd < 0 {
                // Gone since the parent listed `/`: the new root simply lacks it.
                if errno() == libc::ENOENT {
                    continue;
                }
                fail(Stage::Mount, errno());
            }
            fds[i] = fd as RawFd;
        }
        check(
            Stage::Mount,
            libc::mount(
                c"tmpfs".as_ptr(),
                stage.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                options.as_ptr().cast(),
            ) as libc::c_long,
        );
        let dir = libc::open(
            stage.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        );
        if dir < 0 {
            fail(Stage::Mount, errno());
        }
        for (i, e) in entries.iter().enumerate().take(MAX_ROOT_ENTRIES) {
            let name = e.name.as_ptr();
            let r = match &e.kind {
                RootKind::Dir | RootKind::File if fds[i] < 0 => continue,
                RootKind::Dir | RootKind::Point => libc::mkdirat(dir, name, 0o755),
                RootKind::File => {
                    let f = libc::openat(
                        dir,
                        name,
                        libc::O_WRONLY
                            | libc::O_CREAT
                            | libc::O_EXCL
                            | libc::O_NOFOLLOW
                            | libc::O_CLOEXEC,
                        0o644 as libc::c_uint,
                    );
                    if f >= 0 {
                        libc::close(f);
                    }
                    f
                }
                RootKind::Symlink(target) => libc::symlinkat(target.as_ptr(), dir, name),
            };
            check(Stage::Mount, r as libc::c_long);
            if fds[i] >= 0 {
                check(
                    Stage::Mount,
                    libc::syscall(
                        SYS_MOVE_MOUNT,
                        fds[i],
                        empty.as_ptr(),
                        dir,
                        name,
                        MOVE_MOUNT_F_EMPTY_PATH,
                    ),
                );
                libc::close(fds[i]);
            }
        }
        // The new root's own entries never change (whatever ReadOnlyAll does later).
        mount_setattr(
            dir,
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        );
        check(Stage::Mount, libc::fchdir(dir) as libc::c_long);
        libc::close(dir);
        let dot = c".";
        check(
            Stage::UnionRoot,
            libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()),
        );
        check(
            Stage::Mount,
            libc::umount2(dot.as_ptr(), libc::MNT_DETACH) as libc::c_long,
        );
        check(Stage::Mount, libc::chdir(c"/".as_ptr()) as libc::c_long);
    }
}

/// `mount_setattr(dirfd, path, flags)` setting `attr_set` (nothing cleared, propagation
/// unchanged); a failure fails the mount stage. Child only.
fn mount_setattr(
    dirfd: libc::c_int,
    path: *const libc::c_char,
    flags: libc::c_uint,
    attr_set: u64,
) {
    mount_setattr_flags(dirfd, path, flags, attr_set, 0, Stage::Mount);
}

/// `mount_setattr(dirfd, path, flags)` setting `attr_set` and clearing `attr_clr`
/// (propagation unchanged); a failure fails `stage`. Child only.
fn mount_setattr_flags(
    dirfd: libc::c_int,
    path: *const libc::c_char,
    flags: libc::c_uint,
    attr_set: u64,
    attr_clr: u64,
    stage: Stage,
) {
    let attr = MountAttr {
        attr_set,
        attr_clr,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: raw syscall on a live struct of the size passed; `path` is a C string.
    check(stage, unsafe {
        libc::syscall(
            SYS_MOUNT_SETATTR,
            dirfd,
            path,
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    });
}

/// The init stage's [`MountStep::UnionCreate`] and [`MountStep::MergeCreate`]: a detached
/// overlay mount, nosuid and nodev (and read-only without an upper layer). Returns its fd.
/// Child only (raw syscalls on prepared data).
fn create_overlay(lowers: &[CString], upper_work: Option<(&CString, &CString)>) -> RawFd {
    let fs = overlay_context(Stage::Mount);
    for l in lowers {
        overlay_layer(fs, c"lowerdir+", libc::AT_FDCWD, l, 0, Stage::Mount);
    }
    if let Some((upper, work)) = upper_work {
        overlay_layer(fs, c"upperdir", libc::AT_FDCWD, upper, 0, Stage::Mount);
        overlay_layer(fs, c"workdir", libc::AT_FDCWD, work, 0, Stage::Mount);
    }
    overlay_mount(fs, upper_work.is_some(), Stage::Mount)
}

/// A new overlayfs context (`fsopen`); a failure fails `stage`. Child only.
fn overlay_context(stage: Stage) -> RawFd {
    // SAFETY: raw syscall on a valid C string.
    let fs = unsafe { libc::syscall(SYS_FSOPEN, c"overlay".as_ptr(), FSOPEN_CLOEXEC) };
    check(stage, fs);
    fs as RawFd
}

/// Opens the directory `path` (relative to `dirfd`) without following any symlink, with the
/// extra `resolve` flags, and hands it to the overlay context `fs` as `key` (by fd, Linux
/// 6.13+). The parent resolved the paths: a component swapped for a symlink since then fails
/// the run instead of pointing the overlay elsewhere. Child only.
fn overlay_layer(fs: RawFd, key: &CStr, dirfd: RawFd, path: &CStr, resolve: u64, stage: Stage) {
    let how = OpenHow {
        flags: (libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | resolve,
    };
    // SAFETY: valid C strings and a live struct of the size passed; raw syscalls; the layer's
    // fd is closed before returning.
    unsafe {
        let fd = libc::syscall(
            SYS_OPENAT2,
            dirfd,
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        );
        check(stage, fd);
        overlay_fd(fs, key, fd as RawFd, stage);
        libc::close(fd as RawFd);
    }
}

/// Hands the open directory or detached mount `fd` to the overlay context `fs` as `key`.
/// Child only.
fn overlay_fd(fs: RawFd, key: &CStr, fd: RawFd, stage: Stage) {
    // SAFETY: raw syscall on a valid C string.
    check(stage, unsafe {
        libc::syscall(
            SYS_FSCONFIG,
            fs,
            FSCONFIG_SET_FD,
            key.as_ptr(),
            std::ptr::null::<libc::c_char>(),
            fd,
        )
    });
}

/// Creates the overlay of context `fs` (closed here) and returns its detached mount: nosuid,
/// nodev, and read-only unless `writable`. Child only.
fn overlay_mount(fs: RawFd, writable: bool, stage: Stage) -> RawFd {
    let null = std::ptr::null::<libc::c_char>();
    // SAFETY: raw new-mount-API syscalls on valid C strings; the context fd is closed before
    // returning, the mount fd is the caller's.
    unsafe {
        // Overlay metadata in `user.overlay.*` xattrs: `trusted.*` needs privileges over the
        // whole host, which a user namespace never has.
        check(
            stage,
            libc::syscall(
                SYS_FSCONFIG,
                fs,
                FSCONFIG_SET_FLAG,
                c"userxattr".as_ptr(),
                null,
                0,
            ),
        );
        check(
            stage,
            libc::syscall(SYS_FSCONFIG, fs, FSCONFIG_CMD_CREATE, null, null, 0),
        );
        let mnt = libc::syscall(
            SYS_FSMOUNT,
            fs,
            FSMOUNT_CLOEXEC,
            if writable {
                MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
            } else {
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
            },
        );
        check(stage, mnt);
        libc::close(fs);
        mnt as RawFd
    }
}

/// Most hidden directories one prepared call uncovers to reach its union layers.
pub(crate) const MAX_CALL_UNCOVER: usize = 16;

/// Most merges in one union of a prepared call (a merge takes at least two of the union's
/// at most 500 lower layers).
const MAX_CALL_MERGES: usize = 256;

/// The empty directory of a prepared union session's new root that pads merges.
pub(crate) const CALL_EMPTY_DIR: &CStr = c"/.ollie-empty";

/// The bead unions of one prepared call, in the call's own mount namespace (a copy of the
/// session's, whose new root holds the points), and the call's Landlock rules for them.
/// Each entry is a kind byte and a path, in this order:
/// - `h`: a hidden directory that holds layers. It is uncovered first (its hiding tmpfs
///   unmounted in this namespace only) and hidden again once the overlays exist.
/// - Per union: `b` the directory that holds the upper and work layers, whose mount is
///   cloned and made writable (the session's mounts are all read-only, and overlayfs takes
///   its upper layer's mount as it is); `u` and `k` the upper and work layers relative to
///   it (opened beneath it, on that one mount); then the lower layers in search order, `l`
///   one used directly, `m` one of a merge (consecutive `m`s are overlaid read-only first,
///   padded with [`CALL_EMPTY_DIR`], and the merge's detached mount stands for them; it is
///   never attached anywhere); last
///   `U` the point, where the overlay is attached, with `access` granted beneath it (on the
///   overlay's root: Landlock does not look at mount points).
///
/// Then the rules that the session's own mounts added to the session's ruleset (the new
/// root's, the private tmpfs mounts'; in `session_mounts`) are added to the call's ruleset,
/// which replaces it. Child only (raw syscalls on the call's prepared strings).
///
/// # Safety
/// Every pointer in `entries` is a NUL-terminated string of at least two bytes that stays
/// alive and unchanged for the duration of the call.
pub(super) unsafe fn mount_call_unions(
    entries: &[*const libc::c_char],
    access: u64,
    session_mounts: &[MountStep],
) {
    const S: Stage = Stage::CallUnions;
    if entries.is_empty() {
        return;
    }
    let bad = || fail(S, libc::EINVAL);
    // SAFETY: the caller's contract: each entry is a kind byte followed by a C string path.
    let split = |e: *const libc::c_char| unsafe { (*e as u8, CStr::from_ptr(e.add(1))) };
    let mut uncovered: [&CStr; MAX_CALL_UNCOVER] = [c""; MAX_CALL_UNCOVER];
    let mut nuncovered = 0;
    let mut base: RawFd = -1;
    let (mut upper, mut work): (Option<&CStr>, Option<&CStr>) = (None, None);
    let mut fs: RawFd = -1;
    let mut merge: RawFd = -1;
    let mut merged = [-1 as RawFd; MAX_CALL_MERGES];
    let mut nmerged = 0;
    for &e in entries {
        let (kind, path) = split(e);
        if kind != b'm' && merge >= 0 {
            // The merge's run is over: it becomes one lower layer of the union.
            overlay_layer(merge, c"lowerdir+", libc::AT_FDCWD, CALL_EMPTY_DIR, 0, S);
            let m = overlay_mount(merge, false, S);
            // Its root opened for reading (an O_PATH mount fd is not accepted as a layer).
            overlay_layer(fs, c"lowerdir+", m, c".", 0, S);
            // The mount fd stays open until the union exists: closing the last one dissolves
            // the detached mount, and overlayfs takes its layers' mounts only then.
            if nmerged == merged.len() {
                fail(S, libc::E2BIG);
            }
            merged[nmerged] = m;
            nmerged += 1;
            merge = -1;
        }
        match kind {
            b'h' => {
                if nuncovered == MAX_CALL_UNCOVER || base >= 0 || fs >= 0 {
                    bad();
                }
                // SAFETY: raw umount2 on a valid C string, in this call's mount namespace.
                check(S, unsafe {
                    libc::umount2(path.as_ptr(), libc::MNT_DETACH) as libc::c_long
                });
                uncovered[nuncovered] = path;
                nuncovered += 1;
            }
            b'b' => {
                if base >= 0 {
                    bad();
                }
                base = clone_tree(path, false, S);
                mount_setattr_flags(
                    base,
                    c"".as_ptr(),
                    libc::AT_EMPTY_PATH as libc::c_uint,
                    MOUNT_ATTR_NOSUID,
                    MOUNT_ATTR_RDONLY,
                    S,
                );
            }
            b'u' => upper = Some(path),
            b'k' => work = Some(path),
            b'l' | b'm' => {
                if fs < 0 {
                    fs = overlay_context(S);
                }
                let ctx = if kind == b'l' {
                    fs
                } else {
                    if merge < 0 {
                        merge = overlay_context(S);
                    }
                    merge
                };
                overlay_layer(ctx, c"lowerdir+", libc::AT_FDCWD, path, 0, S);
            }
            b'U' => {
                let (Some(u), Some(w)) = (upper, work) else {
                    bad()
                };
                if base < 0 || fs < 0 {
                    bad();
                }
                let beneath = RESOLVE_BENEATH | RESOLVE_NO_XDEV;
                overlay_layer(fs, c"upperdir", base, u, beneath, S);
                overlay_layer(fs, c"workdir", base, w, beneath, S);
                attach(overlay_mount(fs, true, S), path, S);
                // SAFETY: closing descriptors this process opened.
                unsafe {
                    libc::close(base);
                    for m in &merged[..nmerged] {
                        libc::close(*m);
                    }
                }
                nmerged = 0;
                (base, fs, upper, work) = (-1, -1, None, None);
                if access != 0 {
                    add_rule_beneath(path, access);
                }
            }
            _ => bad(),
        }
    }
    if base >= 0 || fs >= 0 || merge >= 0 {
        bad();
    }
    for path in &uncovered[..nuncovered] {
        hide(path, true);
    }
    for step in session_mounts {
        match step {
            MountStep::PrivateTmpfs {
                path, rule_access, ..
            } if *rule_access != 0 => add_rule_beneath(path, *rule_access),
            MountStep::NewRoot {
                root_rule_access, ..
            } if *root_rule_access != 0 => add_rule_beneath(c"/", *root_rule_access),
            MountStep::ReplaceFile {
                path, rule_access, ..
            } if *rule_access != 0 => add_rule_on(path, *rule_access, 0),
            _ => {}
        }
    }
}

/// Grants `access` beneath the directory at `path` (as the child's mounts have it now) in
/// the run's Landlock ruleset (`FD_RULESET`). Child only.
fn add_rule_beneath(path: &CStr, access: u64) {
    add_rule_on(path, access, libc::O_DIRECTORY);
}

/// Grants `access` on the object at `path` (opened with `flags` besides `O_PATH`, never
/// following a final symlink; a file takes file rights only) in the run's Landlock ruleset
/// (`FD_RULESET`). Child only.
fn add_rule_on(path: &CStr, access: u64, flags: libc::c_int) {
    // SAFETY: a valid C string and a live, packed rule struct; the O_PATH fd is closed before
    // returning.
    unsafe {
        let fd = libc::open(
            path.as_ptr(),
            libc::O_PATH | libc::O_CLOEXEC | libc::O_NOFOLLOW | flags,
        );
        if fd < 0 {
            fail(Stage::Mount, errno());
        }
        let attr = LandlockPathBeneathAttr {
            allowed_access: access,
            parent_fd: fd,
        };
        check(
            Stage::Landlock,
            libc::syscall(
                SYS_LANDLOCK_ADD_RULE,
                FD_RULESET,
                LANDLOCK_RULE_PATH_BENEATH,
                &attr as *const LandlockPathBeneathAttr,
                0u32,
            ),
        );
        libc::close(fd);
    }
}

/// The init stage's [`MountStep::Hide`]. Child only (raw syscalls on prepared data).
pub(super) fn hide(path: &CStr, dir: bool) {
    const LOCKED: libc::c_ulong =
        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: valid C strings; raw mount(2) calls in the child's own mount namespace.
    let r = unsafe {
        if dir {
            libc::mount(
                c"tmpfs".as_ptr(),
                path.as_ptr(),
                c"tmpfs".as_ptr(),
                LOCKED,
                c"size=4096,nr_inodes=2,mode=0".as_ptr().cast(),
            )
        } else {
            libc::mount(
                c"/dev/null".as_ptr(),
                path.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        }
    };
    if r < 0 {
        let e = errno();
        if e == libc::ENOENT {
            return;
        }
        fail(Stage::Mount, e);
    }
    if !dir {
        mount_setattr(
            libc::AT_FDCWD,
            path.as_ptr(),
            0,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        );
    }
}

/// The init stage's [`MountStep::PrivateTmpfs`]: mount, then add the Landlock rule for the new
/// root through the inherited ruleset fd. Child only (raw syscalls, no allocation).
fn mount_private_tmpfs(path: &CStr, options: &CStr, rule_access: u64) {
    // SAFETY: valid C strings; a raw mount(2) in the child's own mount namespace.
    unsafe {
        check(
            Stage::Mount,
            libc::mount(
                c"tmpfs".as_ptr(),
                path.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                options.as_ptr().cast(),
            ) as libc::c_long,
        );
    }
    if rule_access != 0 {
        add_rule_beneath(path, rule_access);
    }
}

#!/bin/sh
# Runs the policy, sandbox, escape, toolsrv, broker, approval hold, egress, authority, openai,
# limits, hooks and remote suites, and the README's `o mount` walk-through, as the unprivileged
# user `ollietest`.
#
# Run as root from anywhere: builds the test binaries (`cargo test --no-run`) and the binaries
# the cross-process suites start (toolsrv, olliesrv, o, ollie-9p), copies them to a
# world-readable temporary directory (the suites find the binaries through OLLIE_BIN_DIR),
# creates `ollietest` if missing, delegates a memory cgroup to it (a child of root's own, v1 or
# v2, chowned to the user, as systemd's Delegate=yes or an administrator would), and runs each
# test binary as that user inside it with OLLIE_TEST_REQUIRE passed through, so the sandbox's
# delegated-cgroup path is what runs. Exits non-zero if anything fails.
set -eu

if [ "$(id -u)" != 0 ]; then
    echo "test-unprivileged.sh: must run as root (it creates and switches to user ollietest)" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
: "${CARGO_TARGET_DIR:=$PWD/target}"
export CARGO_TARGET_DIR
user=ollietest

list=$(mktemp)
trap 'rm -f "$list"' EXIT
# Test executables only: a package's own binaries (ollie-cli's `o`) are listed too.
build() {
    cargo test "$@" --no-run --message-format=json-render-diagnostics \
        | grep '"profile":{[^}]*"test":true' \
        | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' >>"$list"
}
# Every sandbox suite (proxy_netns: network namespaces made by an unprivileged user too).
build -p ollie-policy -p ollie-sandbox
build -p ollie-tests --test escapes --test toolsrv --test broker --test approval_hold
# Egress by domain: proxied runs in network namespaces of their own, through toolsrv's proxy.
build -p ollie-tests --test egress
# What a client attached as agent may do; redaction of a tool call that really runs; the
# bounds on 9P clients.
build -p ollie-tests --test authority --test llm_openai --test limits
# Lifecycle hooks run sandboxed in toolsrv under their own policy.
build -p ollie-tests --test hooks
# Remote sessions: the suite's own sshd runs as this user too (no privilege separation).
build -p ollie-tests --test remote
# The mount goes through the setuid fusermount3 (scripts/deps.sh installs fuse3).
build -p ollie-cli --test o_mount_walkthrough --test o_mount
# o doctor and the run record agree about the (delegated) memory cgroup.
build -p ollie-cli --test o_doctor
cargo build -p ollie-toolsrv -p ollie-olliesrv -p ollie-cli --bins

dir=$(mktemp -d /tmp/ollie-unpriv.XXXXXX)
trap 'rm -f "$list"; rm -rf "$dir"' EXIT
chmod 755 "$dir"
mkdir "$dir/bin"
for b in toolsrv olliesrv o ollie-9p; do
    cp "$CARGO_TARGET_DIR/debug/$b" "$dir/bin/"
done
n=0
while read -r exe; do
    [ -n "$exe" ] || continue
    n=$((n + 1))
    cp "$exe" "$dir/$n-$(basename "$exe")"
done <"$list"
chmod -R a+rX "$dir"
if [ "$n" = 0 ]; then
    echo "test-unprivileged.sh: no test binaries were built" >&2
    exit 1
fi

if ! id "$user" >/dev/null 2>&1; then
    useradd --create-home --shell /bin/sh "$user"
fi

# A memory cgroup delegated to the user: the test binaries start in it ($procs), and the
# sandbox makes each run's (or session's) memory cgroup inside it.
# - cgroup v1 (hybrid hosts, CI): a child of root's own memory cgroup; the user owns the
#   directory, its cgroup.procs and tasks, so it can create children and move its own
#   processes there.
# - cgroup v2: a child D of root's own cgroup (or of its parent: a cgroup holding processes
#   cannot enable controllers for its children) with memory and pids enabled for D's children,
#   owned by the user with cgroup.procs and cgroup.subtree_control, and a leaf D/tests for the
#   test binaries; runs go next to it in D.
# Root field "/" mounts only (what hosts and containers have).
delegated= procs=
mount_of() { # mount_of FSTYPE [CONTROLLER]: the first such cgroup mount point
    awk -v t="$1" -v c="${2:-}" '{
        for (i = 7; i <= NF && $i != "-"; i++) {}
        if ($(i + 1) != t || $4 != "/") next
        if (c != "" && ("," $(i + 3) ",") !~ ("," c ",")) next
        print $5; exit
    }' /proc/self/mountinfo
}
v1=$(mount_of cgroup memory)
v2=$(mount_of cgroup2)
if [ -n "$v1" ]; then
    own=$(awk -F: '("," $2 ",") ~ /,memory,/ { print $3; exit }' /proc/self/cgroup)
    d="$v1${own%/}/ollie-unpriv-$$"
    if mkdir "$d" 2>/dev/null; then
        chown "$user:" "$d" "$d/cgroup.procs" "$d/tasks"
        delegated=$d procs="$d/cgroup.procs"
    fi
elif [ -n "$v2" ]; then
    own=$(awk -F: '$1 == 0 { print $3; exit }' /proc/self/cgroup)
    for base in "$v2${own%/}" "$(dirname "$v2${own%/}")"; do
        grep -qw memory "$base/cgroup.subtree_control" 2>/dev/null || continue
        d="$base/ollie-unpriv-$$"
        mkdir "$d" 2>/dev/null || continue
        for c in memory pids; do
            echo "+$c" >"$d/cgroup.subtree_control" 2>/dev/null || true
        done
        mkdir "$d/tests"
        chown "$user:" "$d" "$d/cgroup.procs" "$d/cgroup.subtree_control" "$d/cgroup.threads" \
            "$d/tests" "$d/tests/cgroup.procs" "$d/tests/cgroup.subtree_control" "$d/tests/cgroup.threads"
        delegated=$d procs="$d/tests/cgroup.procs"
        break
    done
fi
if [ -n "$delegated" ]; then
    echo "test-unprivileged.sh: memory cgroup delegated to $user: $delegated"
    # Removed when the script ends (what the runs left, deepest first, then it).
    trap 'rm -f "$list"; rm -rf "$dir"; find "$delegated" -depth -type d -exec rmdir {} + 2>/dev/null' EXIT
else
    echo "test-unprivileged.sh: no memory cgroup can be delegated here (v1 memory: ${v1:-none}, v2: ${v2:-none}): the memory-cgroup cases skip (fail under OLLIE_TEST_REQUIRE=all)" >&2
fi

in_cgroup() { # in_cgroup CMD…: CMD, started in the delegated cgroup if there is one
    if [ -n "$procs" ]; then
        sh -c 'echo $$ >"$1" && shift && exec "$@"' sh "$procs" "$@"
    else
        "$@"
    fi
}

# corpus_cargo_build is left to the root run: the Rust toolchain lives in root's home, which
# this user cannot read (the run would only prove that, not anything about the sandbox).
# without_a_memory_cgroup_the_run_runs_and_says_so too: it switches to an undelegated uid,
# which needs root (this user's own case is the o_doctor test that runs here).
status=0
for bin in "$dir"/*; do
    [ -f "$bin" ] || continue
    echo "== $(basename "$bin") as $user"
    if ! (cd "$dir" && in_cgroup runuser -u "$user" -- env -i \
        PATH=/usr/local/bin:/usr/bin:/bin \
        HOME="$(getent passwd "$user" | cut -d: -f6)" \
        TMPDIR=/tmp LANG=C.UTF-8 \
        OLLIE_TEST_REQUIRE="${OLLIE_TEST_REQUIRE:-}" \
        OLLIE_BIN_DIR="$dir/bin" \
        RUST_BACKTRACE=0 \
        "$bin" --test-threads=2 --skip corpus_cargo_build \
        --skip without_a_memory_cgroup_the_run_runs_and_says_so); then
        status=1
    fi
done
exit "$status"

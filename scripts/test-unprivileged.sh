#!/bin/sh
# Runs the policy, sandbox, escape, toolsrv, broker, hooks and remote suites, and the README's
# `o mount` walk-through, as the unprivileged user `ollietest`.
#
# Run as root from anywhere: builds the test binaries (`cargo test --no-run`) and the binaries
# the cross-process suites start (toolsrv, olliesrv, o, ollie-9p), copies them to a
# world-readable temporary directory (the suites find the binaries through OLLIE_BIN_DIR),
# creates `ollietest` if missing, and runs each test binary as that user with
# OLLIE_TEST_REQUIRE passed through. Exits non-zero if anything fails.
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
build -p ollie-policy -p ollie-sandbox
build -p ollie-tests --test escapes --test toolsrv --test broker
# Lifecycle hooks run sandboxed in toolsrv under their own policy.
build -p ollie-tests --test hooks
# Remote sessions: the suite's own sshd runs as this user too (no privilege separation).
build -p ollie-tests --test remote
# The mount goes through the setuid fusermount3 (scripts/deps.sh installs fuse3).
build -p ollie-cli --test o_mount_walkthrough --test o_mount
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

# corpus_cargo_build is left to the root run: the Rust toolchain lives in root's home, which
# this user cannot read (the run would only prove that, not anything about the sandbox).
status=0
for bin in "$dir"/*; do
    [ -f "$bin" ] || continue
    echo "== $(basename "$bin") as $user"
    if ! (cd "$dir" && runuser -u "$user" -- env -i \
        PATH=/usr/local/bin:/usr/bin:/bin \
        HOME="$(getent passwd "$user" | cut -d: -f6)" \
        TMPDIR=/tmp LANG=C.UTF-8 \
        OLLIE_TEST_REQUIRE="${OLLIE_TEST_REQUIRE:-}" \
        OLLIE_BIN_DIR="$dir/bin" \
        RUST_BACKTRACE=0 \
        "$bin" --test-threads=2 --skip corpus_cargo_build); then
        status=1
    fi
done
exit "$status"

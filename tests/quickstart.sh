#!/usr/bin/env bash
# quickstart.sh: performs README.md's set-up command and quickstart block, exactly as written,
# on a fresh clone of this checkout's HEAD with a temporary HOME and NAMESPACE, and fails
# unless the demo model's sandboxed tool call wrote its file. README and behaviour cannot drift.
#
#   tests/quickstart.sh
#
# The clone's target/ is a link to this checkout's, so dependencies already built are reused
# (the workspace's own crates are built again for the clone). Prints the time from clone to
# the first tool result.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readme=$root/README.md
fail() {
	echo "quickstart: FAIL: $*" >&2
	exit 1
}

# The set-up command: the first indented `scripts/run.sh` line under "## Set up".
run_cmd=$(awk '/^## Set up/ { on = 1 } on && /^    scripts\/run\.sh/ { sub(/^    /, ""); print; exit }' "$readme")
[ -n "$run_cmd" ] || fail "README.md has no '    scripts/run.sh' line under '## Set up'"
# The quickstart block: the ```sh fence after the quickstart marker.
block=$(awk '/<!-- quickstart:/ { on = 1; next } on && /^```sh/ { inb = 1; next } inb && /^```/ { exit } inb { print }' "$readme")
[ -n "$block" ] || fail "README.md has no quickstart block after its <!-- quickstart: --> marker"

tmp=$(mktemp -d /tmp/ollie-quickstart.XXXXXX)
server=
cleanup() {
	if [ -n "$server" ]; then
		kill -TERM -- "-$server" 2>/dev/null || true
		wait "$server" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

start=$SECONDS
git clone -q "$root" "$tmp/ollie"
ln -s "${CARGO_TARGET_DIR:-$root/target}" "$tmp/ollie/target"
mkdir -p "$tmp/home" "$tmp/ns"
chmod 700 "$tmp/ns"
# rustup and cargo keep the toolchain and the crates under the real HOME.
export RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup} CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}
export HOME=$tmp/home NAMESPACE=$tmp/ns
unset XDG_CONFIG_HOME XDG_STATE_HOME XDG_DATA_HOME XDG_CACHE_HOME OLLIE_TOOLSRV

# The server, as the README's set-up command starts it (its own process group, to stop it).
(cd "$tmp/ollie" && exec setsid bash -c "$run_cmd" >"$tmp/server.log" 2>&1) &
server=$!
for _ in $(seq 1 4500); do
	[ -S "$NAMESPACE/ollie" ] && break
	kill -0 "$server" 2>/dev/null || fail "the server exited: $(tail -n 20 "$tmp/server.log")"
	sleep 0.2
done
[ -S "$NAMESPACE/ollie" ] || fail "no socket at $NAMESPACE/ollie after 15 minutes: $(tail -n 20 "$tmp/server.log")"
built=$SECONDS

# The quickstart block, verbatim, from the checkout.
out=$(cd "$tmp/ollie" && bash -euo pipefail -c "$block" 2>"$tmp/quickstart.err") ||
	fail "the quickstart block failed: $(cat "$tmp/quickstart.err") $out"
done_at=$SECONDS
echo "$out"
grep -q 'hello from the sandbox' <<<"$out" || fail "cat hello.txt did not show the tool's output"
[ -f "$HOME/demo/hello.txt" ] || fail "$HOME/demo/hello.txt is missing"
# The tool ran in the session's sandbox: the chat's tool result carries the run record.
log=$("$tmp/ollie/target/release/ollie-9p" read session/demo/agent/main/log)
grep -q '^\[\[\[tool_result' <<<"$log" || fail "the agent's log has no tool result: $log"
grep -q 'landlock' <<<"$log" || fail "the tool result has no sandbox record: $log"
echo "quickstart: PASS: clone to first tool result $((done_at - start)) s (build and start $((built - start)) s, quickstart $((done_at - built)) s)"

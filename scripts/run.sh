#!/usr/bin/env bash
# run.sh: builds every binary once (olliesrv, toolsrv, o, ollie-9p; release, by scripts/build.sh,
# which links toolsrv statically) and starts olliesrv in the foreground with its toolsrv found
# next to it.
#
#   scripts/run.sh [--demo] [OLLIESRV-ARGS…]
#
# --demo serves with an offline demo model (the replay backend playing scripts/demo/turns.jsonl:
# one sandboxed tool call, then a reply), from a config written to target/demo/, so nothing of
# yours is touched. Without it, olliesrv reads ~/.config/ollie/config.toml as usual.
# Honours CARGO_TARGET_DIR. Stop the server with Ctrl-C.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
demo=0
if [ "${1:-}" = --demo ]; then
	demo=1
	shift
fi

cd "$root"
scripts/build.sh
target=${CARGO_TARGET_DIR:-$root/target}
case $target in /*) ;; *) target=$root/$target ;; esac
bin=$target/release
for b in olliesrv toolsrv o ollie-9p; do
	[ -x "$bin/$b" ] || {
		echo "run.sh: $bin/$b was not built" >&2
		exit 1
	}
done

args=()
if [ "$demo" = 1 ]; then
	dir=$target/demo
	mkdir -p "$dir"
	cp "$root/scripts/demo/turns.jsonl" "$dir/turns.jsonl"
	cat >"$dir/config.toml" <<EOF
# Written by scripts/run.sh --demo: the replay backend plays turns.jsonl, one line per model call.
default_backend = "demo"

[backends.demo]
kind = "replay"
file = "$dir/turns.jsonl"
EOF
	args=(--config "$dir/config.toml")
fi

echo "run.sh: starting olliesrv; in another shell: export PATH=$bin:\$PATH" >&2
exec "$bin/olliesrv" "${args[@]}" "$@"

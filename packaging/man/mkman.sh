#!/bin/bash
# mkman.sh BIN-DIR OUT-DIR VERSION: writes OUT-DIR/NAME.1 for olliesrv, toolsrv, o and ollie-9p
# (the programs in BIN-DIR) with help2man. Used by packaging/deb/build.sh and
# packaging/install.sh.
#
# help2man reads each program's --help through help-filter.awk (which only moves paragraphs so
# that they land in the right sections), adds NAME.h2m from this directory, and for programs
# with subcommands each subcommand's --help (subcommands.sh). Programs without --version get
# VERSION. Set SOURCE_DATE_EPOCH for a reproducible date.
set -euo pipefail

die() {
	echo "mkman.sh: $*" >&2
	exit 1
}
[ $# -eq 3 ] || die "usage: mkman.sh BIN-DIR OUT-DIR VERSION"
bin_dir=$1 out=$2 version=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command -v help2man >/dev/null 2>&1 || die "help2man not found (apt install help2man)"

work=$(mktemp -d "${TMPDIR:-/tmp}/ollie-man.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$out" "$work/wrap"

declare -A summary=(
	[olliesrv]="the ollie 9P server: sessions, agents and everything else as files"
	[toolsrv]="ollie's per-session tool server (started by olliesrv)"
	[o]="the ollie command line: sessions, agents, approvals, beads and the tool sandbox"
	[ollie-9p]="read and write files on a 9P server (like plan9port's 9p)"
)
for b in olliesrv toolsrv o ollie-9p; do
	real=$(cd "$bin_dir" && pwd)/$b
	[ -x "$real" ] || die "$bin_dir has no executable $b"
	wrap=$work/wrap/$b
	cat >"$wrap" <<WRAP
#!/bin/sh
if [ "\$1" = --help ]; then "$real" --help | awk -f "$here/help-filter.awk"; else exec "$real" "\$@"; fi
WRAP
	chmod 0755 "$wrap"
	args=(--no-info --section=1 --name="${summary[$b]}" --source="ollie $version" --manual="ollie")
	if ! "$real" --version >/dev/null 2>&1; then
		args+=(--version-string="$version")
	fi
	if [ -f "$here/$b.h2m" ]; then
		args+=(--include="$here/$b.h2m")
	fi
	if [[ $("$real" --help) == *$'\n'Commands:* ]]; then
		"$here/subcommands.sh" "$real" >"$work/$b.commands.h2m" ||
			die "cannot list the subcommands of $b"
		args+=(--include="$work/$b.commands.h2m")
	fi
	help2man --locale=C.UTF-8 "${args[@]}" --output="$out/$b.1" "$wrap" 2>"$work/help2man.err" ||
		die "help2man $b failed: $(tail -n 1 "$work/help2man.err")"
done

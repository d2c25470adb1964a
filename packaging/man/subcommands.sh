#!/bin/bash
# subcommands.sh PROGRAM: a help2man include file with a COMMANDS section holding the --help
# of each of PROGRAM's subcommands (clap's "Commands:" list, recursively; "help" skipped),
# each as a subsection: prose filled, "TERM  description" lines as tagged paragraphs, other
# indented lines (examples) verbatim.
set -euo pipefail
prog=$1
name=$(basename "$prog")

to_roff() {
	awk '
	function esc(s) {
		gsub(/\\/, "\\e", s); gsub(/-/, "\\-", s)
		if (s ~ /^[.'"'"']/) s = "\\&" s
		return s
	}
	/^[ \t]*$/ { para = 1; next }
	/^Usage:/ { printf ".PP\n.nf\n%s\n.fi\n", esc($0); para = 0; next }
	/^[A-Za-z][A-Za-z ]*:$/ { printf ".PP\n\\fB%s\\fR\n", esc($0); para = 0; next }
	/^ / {
		line = $0; sub(/^ +/, "", line)
		if (match(line, /[^ ]  +[^ ]/)) {
			printf ".TP\n\\fB%s\\fR\n%s\n", esc(substr(line, 1, RSTART)), esc(substr(line, RSTART + RLENGTH - 1))
		} else {
			printf ".nf\n  %s\n.fi\n", esc(line)
		}
		para = 0; next
	}
	{ if (para) print ".PP"; print esc($0); para = 0 }'
}

commands_of() { # ARGS...: the subcommands listed by PROGRAM ARGS... --help
	"$prog" "$@" --help | awk '
		/^Commands:/ { on = 1; next }
		on && !/^  [a-z]/ { on = 0 }
		on && $1 != "help" { print $1 }'
}

emit() { # ARGS...: each subcommand of PROGRAM ARGS...
	local c
	for c in $(commands_of "$@"); do
		printf '.SS "%s"\n' "$(printf '%s' "$name $* $c" | sed -e 's/  */ /g' -e 's/-/\\-/g')"
		"$prog" "$@" "$c" --help | to_roff
		emit "$@" "$c"
	done
}

echo '[COMMANDS]'
emit

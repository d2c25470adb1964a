# help-filter.awk: reorders a program's --help text (clap's layout, or toolsrv's) so that
# help2man puts each part in the right manual section; the words are unchanged.
#   - toolsrv's "usage:" and its continuation lines become help2man's "Usage:" and "or:";
#   - prose after the Commands/Arguments/Options blocks (clap's after_help) moves up, into
#     DESCRIPTION, instead of trailing inside OPTIONS; indented lines in it are continuations;
#   - an "EXAMPLES:" paragraph becomes help2man's "Examples:" (the EXAMPLES section);
#   - the "EXIT STATUS ...:" (or "exit status:") sentence, up to the first line ending in
#     ".", becomes a custom "*Exit Status*" section.
# Usage: PROGRAM --help | awk -f help-filter.awk
function flush_para(   i, first, in_exit) {
	if (n == 0)
		return
	first = para[1]
	if (first ~ /^(Commands|Arguments|Options):/) {
		for (i = 1; i <= n; i++) blocks = blocks para[i] "\n"
		blocks = blocks "\n"
		nblocks++
	} else if (first ~ /^EXAMPLES?:$/) {
		for (i = 2; i <= n; i++) examples = examples para[i] "\n"
	} else if (first ~ /^[Uu]sage:/ || (nblocks == 0 && nprose == 0 && first !~ /^(EXIT STATUS|[Ee]xit status)/)) {
		# The summary and the usage, before anything else. A lower-case "usage:" and its
		# indented continuation lines become "Usage:" and "   or:" lines for help2man.
		if (first ~ /^usage:/) {
			sub(/^usage:/, "Usage:", para[1])
			for (i = 2; i <= n; i++) if (para[i] ~ /^ +[^ ]/) { sub(/^ +/, "   or: ", para[i]) }
		}
		for (i = 1; i <= n; i++) head = head para[i] "\n"
		head = head "\n"
	} else {
		in_exit = 0
		for (i = 1; i <= n; i++) {
			if (!in_exit && para[i] ~ /^(EXIT STATUS|[Ee]xit status)[^:]*:/) {
				in_exit = 1
				line = para[i]
				sub(/^[^:]*: */, "", line)
				exit_text = exit_text line "\n"
			} else if (in_exit) {
				exit_text = exit_text para[i] "\n"
			} else {
				# An indented line inside prose continues the sentence above it.
				if (i > 1)
					sub(/^[ \t]+/, "", para[i])
				prose = prose para[i] "\n"
				continue
			}
			if (para[i] ~ /\.$/)
				in_exit = 0
		}
		if (prose != "" && prose !~ /\n\n$/)
			prose = prose "\n"
		nprose++
	}
	n = 0
}
/^[ \t]*$/ { flush_para(); next }
{ para[++n] = $0 }
END {
	flush_para()
	printf "%s%s%s", head, prose, blocks
	if (examples != "")
		printf "Examples:\n%s\n", examples
	if (exit_text != "")
		printf "*Exit Status*\n\n%s", exit_text
}

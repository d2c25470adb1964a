#!/bin/bash
# install.sh: installs ollie on hosts without the Debian package (packaging/deb/build.sh makes
# that one; use it on Debian and Ubuntu).
#
#   packaging/install.sh [--prefix DIR] [--bin-dir DIR]            system-wide, as root
#   packaging/install.sh --user [--prefix DIR] [--bin-dir DIR]     for yourself
#   packaging/install.sh [--user] --uninstall [--purge]
#
# System mode (root): the programs to PREFIX/bin (default /usr/local), olliesrv.socket and
# olliesrv.service to /etc/systemd/system (ExecStart pointing at PREFIX/bin), the drop-in
# examples to PREFIX/share/ollie/systemd, sysusers.d and tmpfiles.d files to /etc (the system
# user and group "ollie", /srv/ollie), /etc/ollie/config.toml when there is none, man pages
# to PREFIX/share/man when help2man is installed, completions of o and ollie-9p for bash,
# zsh and fish to PREFIX/share/{bash-completion/completions,zsh/site-functions,
# fish/vendor_completions.d}; then the socket is enabled (and started when systemd runs).
#
# --user: the programs to PREFIX/bin (default ~/.local), the user units to
# ~/.config/systemd/user, man pages to PREFIX/share/man, completions to
# ~/.local/share/bash-completion/completions, ~/.local/share/zsh/site-functions (add it to
# zsh's fpath) and ~/.config/fish/completions; then
# `systemctl --user enable --now olliesrv.socket` when your user manager runs.
#
# Without --bin-dir the programs are built by scripts/build.sh (release, toolsrv linked
# statically; honouring CARGO_TARGET_DIR). Everything installed is listed in a manifest
# (/var/lib/ollie-install.manifest, or ~/.local/share/ollie/install.manifest with --user),
# and --uninstall removes exactly that: the configuration only when unchanged, the state
# (/var/lib/ollie, /etc/ollie, an empty /srv/ollie; with --user ~/.local/state/ollie) only
# with --purge. The system user and group "ollie" are kept.
set -euo pipefail

die() {
	echo "install.sh: $*" >&2
	exit 1
}
say() { echo "install.sh: $*"; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
bins=(olliesrv toolsrv o ollie-9p)

prefix=
bin_dir=
user=0
uninstall=0
purge=0
while [ $# -gt 0 ]; do
	case $1 in
	--prefix)
		[ $# -ge 2 ] || die "--prefix needs a directory"
		prefix=$2
		shift
		;;
	--prefix=*) prefix=${1#--prefix=} ;;
	--bin-dir)
		[ $# -ge 2 ] || die "--bin-dir needs a directory"
		bin_dir=$2
		shift
		;;
	--bin-dir=*) bin_dir=${1#--bin-dir=} ;;
	--user) user=1 ;;
	--uninstall) uninstall=1 ;;
	--purge) purge=1 ;;
	-h | --help)
		sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
		exit 0
		;;
	*) die "unknown argument '$1' (valid: --prefix DIR, --bin-dir DIR, --user, --uninstall, --purge)" ;;
	esac
	shift
done
[ "$purge" = 0 ] || [ "$uninstall" = 1 ] || die "--purge goes with --uninstall"

if [ "$user" = 1 ]; then
	if [ -z "${HOME:-}" ] || [ ! -d "$HOME" ]; then die "HOME is not set or not a directory"; fi
	prefix=${prefix:-$HOME/.local}
	unit_dir=${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user
	manifest=${XDG_DATA_HOME:-$HOME/.local/share}/ollie/install.manifest
	state_dirs=("${XDG_STATE_HOME:-$HOME/.local/state}/ollie")
	systemctl_=(systemctl --user)
else
	[ "$(id -u)" = 0 ] || die "system mode needs root (run it with sudo, or use --user)"
	prefix=${prefix:-/usr/local}
	unit_dir=/etc/systemd/system
	manifest=/var/lib/ollie-install.manifest
	state_dirs=(/var/lib/ollie /run/ollie /etc/ollie)
	systemctl_=(systemctl)
fi
# The prefix ends up in ExecStart= lines: absolute, and nothing systemd would need quoted.
case $prefix in /*) ;; *) die "--prefix must be an absolute path (got '$prefix')" ;; esac
[[ $prefix =~ ^[A-Za-z0-9._/+-]+$ ]] ||
	die "--prefix '$prefix' has characters unit files would need quoted; use letters, digits, '.', '_', '+', '-' and '/'"
prefix=${prefix%/}

# Does a systemd manager run for this mode?
manager_runs() {
	if [ "$user" = 1 ]; then
		command -v systemctl >/dev/null 2>&1 && systemctl --user show-environment >/dev/null 2>&1
	else
		[ -d /run/systemd/system ]
	fi
}

# ---------------------------------------------------------------------------------------------
# Uninstall
# ---------------------------------------------------------------------------------------------
if [ "$uninstall" = 1 ]; then
	if [ ! -f "$manifest" ]; then
		# Nothing installed (any more); --purge still removes the state left behind.
		[ "$purge" = 1 ] || die "no $manifest: nothing was installed by install.sh$([ "$user" = 1 ] && echo " --user")"
		say "no $manifest: removing only the state"
		manifest_in=/dev/null
	else
		manifest_in=$manifest
	fi
	if command -v systemctl >/dev/null 2>&1; then
		while IFS=$'\t' read -r kind path _; do
			[ "$kind" = enabled ] || continue
			if manager_runs; then
				"${systemctl_[@]}" disable --now "$path" >/dev/null 2>&1 || true
			elif [ "$user" = 0 ]; then
				systemctl disable "$path" >/dev/null 2>&1 || true
			fi
			say "disabled $path"
		done <"$manifest_in"
		if manager_runs; then
			"${systemctl_[@]}" stop olliesrv.service olliesrv.socket >/dev/null 2>&1 || true
		fi
	fi
	dirs=()
	while IFS=$'\t' read -r kind path sum; do
		case $kind in
		file)
			if [ -e "$path" ] || [ -L "$path" ]; then
				rm -f "$path"
				say "removed $path"
			fi
			;;
		config)
			[ -e "$path" ] || continue
			if [ "$purge" = 1 ] || [ "$(sha256sum <"$path" | cut -d' ' -f1)" = "$sum" ]; then
				rm -f "$path"
				say "removed $path"
			else
				say "kept $path (changed since it was installed; --purge removes it)"
			fi
			;;
		dir) dirs=("$path" "${dirs[@]}") ;;
		esac
	done <"$manifest_in"
	# The manifest goes first: it may sit in one of those directories.
	if [ "$manifest_in" = "$manifest" ]; then rm -f "$manifest"; fi
	# Directories this script created, deepest first, when nothing else is in them.
	for d in "${dirs[@]}"; do
		if [ -d "$d" ] && rmdir "$d" 2>/dev/null; then say "removed $d/"; fi
	done
	if manager_runs; then "${systemctl_[@]}" daemon-reload || true; fi
	if [ "$purge" = 1 ]; then
		for d in "${state_dirs[@]}"; do
			if [ -e "$d" ]; then
				rm -rf "$d"
				say "removed $d"
			fi
		done
		if [ "$user" = 0 ] && [ -d /srv/ollie ]; then
			if rmdir /srv/ollie 2>/dev/null; then say "removed /srv/ollie/"; else say "kept /srv/ollie (not empty)"; fi
		fi
	else
		for d in "${state_dirs[@]}"; do
			if [ -e "$d" ]; then say "kept $d (--purge removes it)"; fi
		done
	fi
	if [ "$user" = 0 ] && getent passwd ollie >/dev/null; then
		say "kept the system user and group ollie (userdel ollie removes them)"
	fi
	say "uninstalled"
	exit 0
fi

# ---------------------------------------------------------------------------------------------
# Install
# ---------------------------------------------------------------------------------------------
if [ "$user" = 0 ] && command -v dpkg-query >/dev/null 2>&1 &&
	[ "$(dpkg-query -W -f='${Status}' ollie 2>/dev/null || true)" = "install ok installed" ]; then
	die "the Debian package ollie is installed; remove it first (dpkg -r ollie) or keep using it"
fi
command -v systemctl >/dev/null 2>&1 || say "warning: systemctl not found; the units are installed but not enabled"

version=$(awk '
	/^\[/ { section = $0 }
	section == "[workspace.package]" && $1 == "version" { gsub(/"/, "", $3); print $3; exit }
' "$root/Cargo.toml")
[ -n "$version" ] || die "no version in [workspace.package] of $root/Cargo.toml"

if [ -z "$bin_dir" ]; then
	command -v cargo >/dev/null 2>&1 ||
		die "cargo not found: build first (scripts/build.sh) and pass --bin-dir target/release"
	target_dir=${CARGO_TARGET_DIR:-$root/target}
	case $target_dir in /*) ;; *) target_dir=$root/$target_dir ;; esac
	say "building (scripts/build.sh --locked: release, toolsrv static; target dir $target_dir)"
	"$root/scripts/build.sh" --locked || die "cargo build failed"
	bin_dir=$target_dir/release
fi
for b in "${bins[@]}"; do
	[ -x "$bin_dir/$b" ] || die "$bin_dir has no executable $b"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/ollie-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
new_manifest=$work/manifest
if [ -f "$manifest" ]; then cp "$manifest" "$new_manifest"; else : >"$new_manifest"; fi
record() { # KIND PATH [SHA256]
	local IFS=$'\t'
	printf '%s\n' "$*" >>"$new_manifest"
}
# Creates DIR and its missing parents, recording each one created.
make_dir() {
	local d=$1 missing=()
	while [ ! -d "$d" ]; do
		missing=("$d" "${missing[@]}")
		d=$(dirname "$d")
	done
	for d in "${missing[@]}"; do
		mkdir -m 0755 "$d"
		record dir "$d"
	done
}
put() { # SRC DEST MODE
	make_dir "$(dirname "$2")"
	install -m "$3" "$1" "$2"
	record file "$2"
	say "installed $2"
}
# A unit with ExecStart=/usr/bin/... pointing at PREFIX/bin instead.
put_unit() { # SRC DEST
	sed -E "s#^(Exec[A-Za-z]+=[-@:!+]*)/usr/bin/#\\1$prefix/bin/#" "$1" >"$work/unit"
	put "$work/unit" "$2" 0644
}

# Stop a running server first: its binaries are replaced. The socket keeps listening.
restart=0
if manager_runs && "${systemctl_[@]}" is-active --quiet olliesrv.service 2>/dev/null; then
	restart=1
fi

# Programs.
for b in "${bins[@]}"; do
	install -m 0755 "$bin_dir/$b" "$work/$b"
	if command -v strip >/dev/null 2>&1; then
		strip --remove-section=.comment --remove-section=.note "$work/$b"
	fi
	put "$work/$b" "$prefix/bin/$b" 0755
done

# Units, users, directories, configuration.
if [ "$user" = 1 ]; then
	for f in "$here"/systemd/user/olliesrv.socket "$here"/systemd/user/olliesrv.service; do
		[ -f "$f" ] || die "$f is missing"
		put_unit "$f" "$unit_dir/$(basename "$f")"
	done
else
	for f in "$here"/systemd/olliesrv.socket "$here"/systemd/olliesrv.service; do
		[ -f "$f" ] || die "$f is missing"
		put_unit "$f" "$unit_dir/$(basename "$f")"
	done
	for f in "$here"/systemd/dropins/*.conf; do
		[ -f "$f" ] || continue
		put "$f" "$prefix/share/ollie/systemd/$(basename "$f")" 0644
	done
	put "$here/sysusers.d/ollie.conf" /etc/sysusers.d/ollie.conf 0644
	put "$here/tmpfiles.d/ollie.conf" /etc/tmpfiles.d/ollie.conf 0644

	if getent passwd ollie >/dev/null; then
		say "the system user ollie exists"
	elif command -v systemd-sysusers >/dev/null 2>&1; then
		systemd-sysusers /etc/sysusers.d/ollie.conf
		say "created the system user and group ollie (systemd-sysusers)"
	else
		getent group ollie >/dev/null || groupadd --system ollie
		useradd --system --gid ollie --home-dir /var/lib/ollie --no-create-home \
			--shell "$(command -v nologin || echo /usr/sbin/nologin)" --comment "ollie agent supervisor" ollie
		say "created the system user and group ollie (useradd)"
	fi
	if [ ! -e /srv/ollie ]; then
		record dir /srv/ollie
		if command -v systemd-tmpfiles >/dev/null 2>&1 && [ -e /proc/self ]; then
			systemd-tmpfiles --create /etc/tmpfiles.d/ollie.conf || true
		fi
		if [ ! -e /srv/ollie ]; then
			mkdir -p /srv/ollie
			chown ollie:ollie /srv/ollie
			chmod 2770 /srv/ollie
		fi
		say "created /srv/ollie (shared workspaces: group ollie, mode 2770)"
	fi

	if [ -e /etc/ollie/config.toml ]; then
		say "kept the existing /etc/ollie/config.toml"
	else
		make_dir /etc/ollie
		install -m 0644 "$here/config/config.toml" /etc/ollie/config.toml
		record config /etc/ollie/config.toml "$(sha256sum </etc/ollie/config.toml | cut -d' ' -f1)"
		say "installed /etc/ollie/config.toml"
	fi
fi

# Man pages.
if command -v help2man >/dev/null 2>&1; then
	if "$here/man/mkman.sh" "$prefix/bin" "$work/man" "$version"; then
		for b in "${bins[@]}"; do
			gzip -9n -c "$work/man/$b.1" >"$work/man/$b.1.gz"
			put "$work/man/$b.1.gz" "$prefix/share/man/man1/$b.1.gz" 0644
		done
	else
		say "warning: could not make the man pages"
	fi
else
	say "help2man not found: no man pages"
fi

# Shell completions, generated by the programs from their own parsers.
if [ "$user" = 1 ]; then
	data_home=${XDG_DATA_HOME:-$HOME/.local/share}
	bash_dir=$data_home/bash-completion/completions
	zsh_dir=$data_home/zsh/site-functions
	fish_dir=${XDG_CONFIG_HOME:-$HOME/.config}/fish/completions
else
	bash_dir=$prefix/share/bash-completion/completions
	zsh_dir=$prefix/share/zsh/site-functions
	fish_dir=$prefix/share/fish/vendor_completions.d
fi
for b in o ollie-9p; do
	for place in "bash $bash_dir/$b" "zsh $zsh_dir/_$b" "fish $fish_dir/$b.fish"; do
		read -r shell path <<<"$place"
		"$prefix/bin/$b" completions "$shell" >"$work/completion" ||
			die "$b completions $shell failed"
		put "$work/completion" "$path" 0644
	done
done

# The manifest, before anything can fail in systemd.
make_dir "$(dirname "$manifest")"
awk '!seen[$0]++' "$new_manifest" >"$work/manifest.sorted"
install -m 0644 "$work/manifest.sorted" "$manifest"
say "wrote $manifest"

# systemd.
record_enabled() {
	if ! grep -q "^enabled	olliesrv.socket\$" "$manifest"; then
		printf 'enabled\tolliesrv.socket\n' >>"$manifest"
	fi
}
if manager_runs; then
	"${systemctl_[@]}" daemon-reload
	"${systemctl_[@]}" enable --now olliesrv.socket
	record_enabled
	if [ "$restart" = 1 ]; then
		"${systemctl_[@]}" try-restart olliesrv.service
		say "restarted olliesrv.service (new binaries)"
	fi
	say "enabled and started olliesrv.socket"
elif [ "$user" = 0 ] && command -v systemctl >/dev/null 2>&1; then
	# No running systemd (a chroot or container being prepared): the links only.
	systemctl enable olliesrv.socket >/dev/null 2>&1 && record_enabled &&
		say "enabled olliesrv.socket (systemd is not running; it starts at the next boot)"
else
	say "no user manager runs: later, systemctl --user daemon-reload && systemctl --user enable --now olliesrv.socket"
fi

if [ "$user" = 1 ]; then
	case ":$PATH:" in *":$prefix/bin:"*) ;; *) say "note: $prefix/bin is not in your PATH" ;; esac
	say "done: your olliesrv listens on \$XDG_RUNTIME_DIR/ollie/ollie; configuration in ~/.config/ollie/config.toml"
	say "  zsh completions: add fpath+=($zsh_dir) before compinit in ~/.zshrc"
else
	say "done: members of the group ollie may use unix!/run/ollie/ollie (usermod -aG ollie NAME);"
	say "  configuration in /etc/ollie/config.toml; model backends need the network drop-in:"
	say "  install -D -m 0644 $prefix/share/ollie/systemd/network.conf /etc/systemd/system/olliesrv.service.d/network.conf"
fi

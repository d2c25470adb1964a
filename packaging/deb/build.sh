#!/bin/bash
# Builds the Debian package "ollie" with dpkg-deb (no debhelper, no cargo-deb).
#
#   packaging/deb/build.sh [--release|--debug] [--out DIR] [--bin-dir DIR]
#
#   --release      build with the release profile (default)
#   --debug        build with the dev profile (target/debug)
#   --out DIR      where the .deb goes (default: $CARGO_TARGET_DIR/debian, else target/debian)
#   --bin-dir DIR  package the prebuilt olliesrv, toolsrv, o and ollie-9p in DIR; no cargo build
#
# Environment: CARGO_TARGET_DIR (honoured as cargo does); OLLIE_DEB_VERSION (the full Debian
# version, e.g. 0.1.1-1; "-1" is added when it has no revision; default: the workspace
# version with revision 1); OLLIE_DEB_MAINTAINER; SOURCE_DATE_EPOCH (default: the last
# commit's time), which makes the package reproducible.
#
# Needs: cargo (also with --bin-dir: the copyright file lists the crates linked in, from
# `cargo tree`/`cargo metadata`), dpkg-dev (dpkg-shlibdeps), help2man, binutils (strip), perl.
# The last line on stdout is the path of the .deb; progress goes to stderr.
set -euo pipefail

die() {
	echo "build.sh: $*" >&2
	exit 1
}
say() { echo "build.sh: $*" >&2; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found (apt install $2)"; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
packaging=$root/packaging

profile=release
out=
bin_dir=
while [ $# -gt 0 ]; do
	case $1 in
	--release) profile=release ;;
	--debug) profile=debug ;;
	--out)
		[ $# -ge 2 ] || die "--out needs a directory"
		out=$2
		shift
		;;
	--out=*) out=${1#--out=} ;;
	--bin-dir)
		[ $# -ge 2 ] || die "--bin-dir needs a directory"
		bin_dir=$2
		shift
		;;
	--bin-dir=*) bin_dir=${1#--bin-dir=} ;;
	-h | --help)
		sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
		exit 0
		;;
	*) die "unknown argument '$1' (valid: --release, --debug, --out DIR, --bin-dir DIR)" ;;
	esac
	shift
done

need dpkg-deb dpkg
need dpkg-shlibdeps dpkg-dev
need help2man help2man
need strip binutils
need perl perl
need cargo "a Rust toolchain (https://rustup.rs)"

bins=(olliesrv toolsrv o ollie-9p)
pkg=ollie
maintainer=${OLLIE_DEB_MAINTAINER:-ollie developers <ollie@ollie.invalid>}
arch=$(dpkg --print-architecture)

# The workspace version: `version = "X.Y.Z"` in [workspace.package].
upstream=$(awk '
	/^\[/ { section = $0 }
	section == "[workspace.package]" && $1 == "version" { gsub(/"/, "", $3); print $3; exit }
' "$root/Cargo.toml")
[ -n "$upstream" ] || die "no version in [workspace.package] of $root/Cargo.toml"
version=${OLLIE_DEB_VERSION:-$upstream-1}
case $version in *-*) ;; *) version=$version-1 ;; esac
dpkg --validate-version "$version" >/dev/null 2>&1 || die "'$version' is not a valid Debian version"

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2>/dev/null || date +%s)
fi
export SOURCE_DATE_EPOCH

target_dir=${CARGO_TARGET_DIR:-$root/target}
case $target_dir in /*) ;; *) target_dir=$root/$target_dir ;; esac
out=${out:-$target_dir/debian}

if [ -n "$bin_dir" ]; then
	for b in "${bins[@]}"; do
		[ -x "$bin_dir/$b" ] || die "--bin-dir $bin_dir has no executable $b"
	done
else
	build_profile=()
	[ "$profile" = debug ] && build_profile=(--debug)
	say "scripts/build.sh ${build_profile[*]} --locked (target dir $target_dir; toolsrv static)"
	"$root/scripts/build.sh" "${build_profile[@]}" --locked >&2 ||
		die "cargo build failed"
	bin_dir=$target_dir/$profile
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/ollie-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
# dpkg-shlibdeps wants debian/control and the package tree in debian/PACKAGE.
dest=$work/src/debian/$pkg
umask 022
mkdir -p "$dest/DEBIAN"

# --- binaries ---------------------------------------------------------------------------------
install -d "$dest/usr/bin"
for b in "${bins[@]}"; do
	install -m 0755 "$bin_dir/$b" "$dest/usr/bin/$b"
	# What dh_strip does for executables.
	strip --remove-section=.comment --remove-section=.note "$dest/usr/bin/$b"
done

# --- systemd units, sysusers, tmpfiles ---------------------------------------------------------
install_dir_files() { # SRC-DIR DEST-DIR MODE GLOB...: copies whichever of the files exist
	local src=$1 dst=$2 mode=$3 glob f
	shift 3
	[ -d "$src" ] || return 0
	for glob in "$@"; do
		for f in "$src"/$glob; do
			[ -f "$f" ] || continue
			install -D -m "$mode" "$f" "$dst/$(basename "$f")"
		done
	done
}
install_dir_files "$packaging/systemd" "$dest/usr/lib/systemd/system" 0644 '*.socket' '*.service'
install_dir_files "$packaging/systemd/user" "$dest/usr/lib/systemd/user" 0644 '*.socket' '*.service'
install_dir_files "$packaging/systemd/dropins" "$dest/usr/share/$pkg/systemd" 0644 '*.conf'
[ -f "$dest/usr/lib/systemd/system/olliesrv.socket" ] || die "packaging/systemd/olliesrv.socket is missing"
[ -f "$dest/usr/lib/systemd/system/olliesrv.service" ] || die "packaging/systemd/olliesrv.service is missing"
install -D -m 0644 "$packaging/sysusers.d/ollie.conf" "$dest/usr/lib/sysusers.d/ollie.conf"
install -D -m 0644 "$packaging/tmpfiles.d/ollie.conf" "$dest/usr/lib/tmpfiles.d/ollie.conf"

# --- configuration -----------------------------------------------------------------------------
install -D -m 0644 "$packaging/config/config.toml" "$dest/etc/ollie/config.toml"

install -D -m 0644 "$here/lintian-overrides" "$dest/usr/share/lintian/overrides/$pkg"

# --- documentation -----------------------------------------------------------------------------
doc=$dest/usr/share/doc/$pkg
install -d "$doc/examples/policy"
install -m 0644 "$packaging"/policy/*.toml "$doc/examples/policy/"
# Not compressed (unlike what dh_compress would do): the units and man pages link to
# /usr/share/doc/ollie/README.md, and Markdown is read as it is.
for f in README.md SECURITY.md ARCHITECTURE.md; do
	install -m 0644 "$root/$f" "$doc/$f"
done
# The topic files the three above link to, at the same relative place.
install -d "$doc/docs"
install -m 0644 "$root"/docs/*.md "$doc/docs/"

# changelog.Debian: packaging/deb/changelog, with an entry for this version on top when the
# file does not have one (a bumped workspace version or OLLIE_DEB_VERSION).
changelog=$work/changelog.Debian
top=$(sed -n '1s/^[^ ]* (\([^)]*\)).*/\1/p' "$here/changelog")
if [ "$top" != "$version" ]; then
	rev=$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)
	{
		printf '%s (%s) UNRELEASED; urgency=medium\n\n' "$pkg" "$version"
		printf '  * Build of ollie %s from the source tree (git %s).\n\n' "$upstream" "$rev"
		printf ' -- %s  %s\n\n' "$maintainer" "$(LC_ALL=C date -u -R -d "@$SOURCE_DATE_EPOCH")"
		cat "$here/changelog"
	} >"$changelog"
else
	cp "$here/changelog" "$changelog"
fi
gzip -9n -c "$changelog" >"$doc/changelog.Debian.gz"
chmod 0644 "$doc/changelog.Debian.gz"

# copyright: ollie itself (the workspace's license), then every crate linked into the binaries
# (normal dependencies on this host, no build scripts or proc-macros), then the license texts.
license=$(awk '
	/^\[/ { section = $0 }
	section == "[workspace.package]" && $1 == "license" { sub(/^[^=]*= *"/, ""); sub(/".*$/, ""); print; exit }
' "$root/Cargo.toml")
[ -n "$license" ] || die "no license in [workspace.package] of $root/Cargo.toml"
first_year=$(git -C "$root" log --max-parents=0 --format=%cd --date=format:%Y 2>/dev/null | sort | sed -n 1p) || true
last_year=$(LC_ALL=C date -u -d "@$SOURCE_DATE_EPOCH" +%Y)
years=${first_year:-$last_year}
[ "$years" = "$last_year" ] || years=$years-$last_year
crates=$work/crates
(cd "$root" && cargo tree --locked --offline -e normal,no-proc-macro --prefix none \
	-f '{p}' -p ollie-olliesrv -p ollie-toolsrv -p ollie-cli) >"$crates.tree" 2>"$work/tree.err" ||
	(cd "$root" && cargo tree --locked -e normal,no-proc-macro --prefix none \
		-f '{p}' -p ollie-olliesrv -p ollie-toolsrv -p ollie-cli) >"$crates.tree" 2>"$work/tree.err" ||
	die "cargo tree failed: $(tail -n 1 "$work/tree.err")"
(cd "$root" && cargo metadata --locked --offline --format-version 1 2>/dev/null ||
	cargo metadata --locked --format-version 1) >"$crates.json" || die "cargo metadata failed"
{
	cat <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: ollie
Upstream-Contact: $maintainer
Comment: The programs are statically linked with the Rust crates listed below (from
 crates.io, at the versions in the workspace's Cargo.lock); "vendor/NAME-VERSION"
 stands for the source of crate NAME at VERSION.

Files: *
Copyright: $years ollie developers
License: $license

EOF
	perl "$here/crates-copyright.pl" "$crates.tree" "$crates.json"
	cat "$here/licenses.dep5"
} >"$doc/copyright"
chmod 0644 "$doc/copyright"
# Every license named must have its text.
missing=$(perl -e '
	my (%named, %text, $in_files);
	while (<>) {
		if (/^Files:/) { $in_files = 1 } elsif (/^$/) { $in_files = 0 }
		next unless /^License: *(.*?)\s*$/;
		my $expr = $1;
		if ($in_files) { $named{$_} = 1 for grep { length } split /\s*(?:,|\bor\b|\band\b)\s*/, $expr }
		else { $text{$expr} = 1 }
	}
	print join(" ", grep { !$text{$_} } sort keys %named), "\n";
' "$doc/copyright")
[ -z "$missing" ] || die "copyright: no text for license(s) $missing: add them to packaging/deb/licenses.dep5"

# --- man pages (help2man, see packaging/man/mkman.sh) -----------------------------------------------
man=$dest/usr/share/man/man1
install -d "$man"
"$packaging/man/mkman.sh" "$dest/usr/bin" "$work/man" "$upstream" || die "cannot make the man pages"
for b in "${bins[@]}"; do
	gzip -9n -c "$work/man/$b.1" >"$man/$b.1.gz"
	chmod 0644 "$man/$b.1.gz"
done

# --- shell completions (generated by the programs from their own parsers) -----------------------
for b in o ollie-9p; do
	for place in "bash usr/share/bash-completion/completions/$b" \
		"zsh usr/share/zsh/vendor-completions/_$b" \
		"fish usr/share/fish/vendor_completions.d/$b.fish"; do
		read -r shell path <<<"$place"
		"$dest/usr/bin/$b" completions "$shell" >"$work/completion" ||
			die "$b completions $shell failed"
		[ -s "$work/completion" ] || die "$b completions $shell printed nothing"
		install -D -m 0644 "$work/completion" "$dest/$path"
	done
done

# --- control -----------------------------------------------------------------------------------
cat >"$work/src/debian/control" <<EOF
Source: $pkg
Maintainer: $maintainer

Package: $pkg
Architecture: any
EOF
shlibs=$(cd "$work/src" && dpkg-shlibdeps -O -e "${bins[@]/#/debian/$pkg/usr/bin/}" 2>"$work/shlibdeps.err") ||
	die "dpkg-shlibdeps failed: $(tail -n 1 "$work/shlibdeps.err")"
shlibs=${shlibs#shlibs:Depends=}
[ -n "$shlibs" ] || die "dpkg-shlibdeps found no dependencies"
rm "$work/src/debian/control"

# Installed-Size as dpkg-gencontrol computes it: KiB per file rounded up, 1 per other entry.
installed_size=$(find "$dest" -mindepth 1 -path "$dest/DEBIAN" -prune -o -printf '%y %s\n' |
	awk '$1 == "f" { s += int(($2 + 1023) / 1024); next } { s += 1 } END { print s }')

control=$(<"$here/control.in")
control=${control//@VERSION@/$version}
control=${control//@ARCH@/$arch}
control=${control//@MAINTAINER@/$maintainer}
control=${control//@DEPENDS@/$shlibs}
control=${control//@INSTALLED_SIZE@/$installed_size}
printf '%s\n' "$control" >"$dest/DEBIAN/control"
for s in postinst prerm postrm; do
	install -m 0755 "$here/$s" "$dest/DEBIAN/$s"
done
(cd "$dest" && find etc -type f -printf '/%p\n' | LC_ALL=C sort) >"$dest/DEBIAN/conffiles"
chmod 0644 "$dest/DEBIAN/control" "$dest/DEBIAN/conffiles"
(cd "$dest" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z |
	xargs -0 md5sum) >"$dest/DEBIAN/md5sums"
chmod 0644 "$dest/DEBIAN/md5sums"

# Reproducible: every entry has the same time.
find "$dest" -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +

mkdir -p "$out"
out=$(cd "$out" && pwd)
deb=$out/${pkg}_${version}_$arch.deb
dpkg-deb --root-owner-group --build "$dest" "$deb" >&2
say "built $(du -h "$deb" | cut -f1) $deb"
echo "$deb"

#!/usr/bin/env bash
# The real boot test: boots a Debian bookworm rootfs with systemd in `systemd-nspawn --boot`,
# installs the ollie Debian package inside and checks the deployment end to end (socket
# activation, Type=notify, sessions, Landlock-enforced tools, restart, clean stop, the user
# units, purge). The checks are packaging/boot-test/check.sh, run inside the container by
# the unit packaging/boot-test/ollie-boot-check.service; its exit status becomes nspawn's.
#
#   scripts/boot-test.sh [--keep] [--shell] [--timeout SECONDS]
#
#   --keep       keep the log directory (console, journal, per-step logs, the .deb) and print
#                its path; it is also kept when the test fails
#   --shell      boot the same container with a root shell on the console instead of running
#                the checks (run /opt/ollie-test/check.sh, `poweroff` to leave); no timeout
#   --timeout S  bound the boot and the checks (default 420 s; OLLIE_BOOT_TEST_TIMEOUT)
#
# Environment:
#   OLLIE_DEB=PATH       use this .deb instead of building one with packaging/deb/build.sh
#   OLLIE_CI_CACHE=DIR   where the rootfs is cached (default /var/cache/ollie-ci)
#   OLLIE_CI_MIRROR=URL  the Debian mirror for debootstrap (default http://deb.debian.org/debian)
#
# Needs root, systemd-nspawn (systemd-container) and debootstrap. The rootfs is built once
# into OLLIE_CI_CACHE/bookworm-<hash> (hash of the package list) and never modified: the
# container runs on a tmpfs overlay (--volatile=overlay). Exit status: 0 PASS, 1 FAIL,
# 2 usage or missing prerequisites.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
HERE=$ROOT/packaging/boot-test
SUITE=bookworm
# Bump when the way the rootfs is made changes (not only its package list).
ROOTFS_FORMAT=1

keep=0
shell=0
timeout_s=${OLLIE_BOOT_TEST_TIMEOUT:-420}
while [ $# -gt 0 ]; do
	case $1 in
	--keep) keep=1 ;;
	--shell) shell=1 ;;
	--timeout)
		timeout_s=${2:?--timeout needs a number of seconds}
		shift
		;;
	--timeout=*) timeout_s=${1#--timeout=} ;;
	-h | --help)
		sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
		exit 0
		;;
	*)
		echo "boot-test: unknown argument: $1 (see --help)" >&2
		exit 2
		;;
	esac
	shift
done

T0=$(date +%s)
say() { printf 'boot-test: %s\n' "$*"; }
fail() {
	say "FAIL: $*"
	exit 1
}
# Seconds since T0 or since $1, with one decimal.
elapsed() { awk -v a="${1:-$T0}" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

[ "$(id -u)" = 0 ] || {
	echo "boot-test: must run as root (systemd-nspawn, debootstrap)" >&2
	exit 2
}
for c in systemd-nspawn debootstrap flock timeout; do
	command -v "$c" >/dev/null || {
		echo "boot-test: $c not found (apt-get install systemd-container debootstrap)" >&2
		exit 2
	}
done

LOGDIR=$(mktemp -d /tmp/ollie-boot-test.XXXXXX)
CACHE=${OLLIE_CI_CACHE:-/var/cache/ollie-ci}
MIRROR=${OLLIE_CI_MIRROR:-http://deb.debian.org/debian}
tmp_rootfs=
child=

# run_child OUT ERR COMMAND…: runs a long command in the background, its output to the files
# OUT and ERR, and waits for it, so that a signal to this script is handled at once (bash runs
# traps only between foreground commands) and reaches the command.
run_child() {
	local out=$1 err=$2
	shift 2
	"$@" >"$out" 2>"$err" &
	child=$!
	local rc=0
	wait "$child" || rc=$?
	child=
	return "$rc"
}

cleanup() {
	local rc=$?
	if [ -n "$child" ]; then
		kill -TERM "$child" 2>/dev/null || true
		wait "$child" 2>/dev/null || true
	fi
	if [ -n "$tmp_rootfs" ] && [ -e "$tmp_rootfs" ]; then
		# An interrupted debootstrap may leave /proc, /sys… mounted in the target.
		findmnt -rn -o TARGET | grep -F "$tmp_rootfs/" | sort -r | xargs -r -n1 umount -l || true
		rm -rf --one-file-system "$tmp_rootfs"
	fi
	if [ "$keep" = 1 ] || [ "$rc" != 0 ]; then
		[ -d "$LOGDIR" ] && say "logs: $LOGDIR"
	else
		rm -rf --one-file-system "$LOGDIR"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- The rootfs ------------------------------------------------------------------------------
# The package list, comments stripped, sorted, comma-separated for --include.
PKGS=$(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$HERE/packages" | grep -v '^$' | sort -u | paste -sd, -)
HASH=$(printf 'format=%s\nsuite=%s\nvariant=minbase\ninclude=%s\n' "$ROOTFS_FORMAT" "$SUITE" "$PKGS" |
	sha256sum | cut -c1-16)
ROOTFS=$CACHE/$SUITE-$HASH
STAMP=etc/ollie-ci-rootfs

t=$(date +%s.%N)
mkdir -p "$CACHE"
if [ ! -f "$ROOTFS/$STAMP" ]; then
	# One builder at a time; a second run waits and then finds the rootfs.
	exec 9>"$CACHE/.lock"
	flock 9
	if [ ! -f "$ROOTFS/$STAMP" ]; then
		# Leftovers of interrupted builds (we hold the lock, so nobody is building them).
		for d in "$CACHE/.$SUITE-"*.tmp; do
			[ -e "$d" ] || continue
			findmnt -rn -o TARGET | grep -F "$d/" | sort -r | xargs -r -n1 umount -l || true
			rm -rf --one-file-system "$d"
		done
		[ -e "$ROOTFS" ] && rm -rf --one-file-system "$ROOTFS" # no stamp: not ours, or broken
		tmp_rootfs=$CACHE/.$SUITE-$HASH.tmp
		say "building the rootfs $ROOTFS (debootstrap $SUITE, log: $LOGDIR/debootstrap.log)"
		if ! run_child "$LOGDIR/debootstrap.log" "$LOGDIR/debootstrap.log" timeout 900 \
			debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$tmp_rootfs" "$MIRROR"; then
			tail -n 20 "$LOGDIR/debootstrap.log" | sed 's/^/  | /'
			fail "debootstrap failed (or took more than 900 s)"
		fi
		# The stamp says the rootfs is complete; nothing else is changed in what debootstrap made.
		printf 'format=%s\nsuite=%s\ninclude=%s\n' "$ROOTFS_FORMAT" "$SUITE" "$PKGS" >"$tmp_rootfs/$STAMP"
		sync -f "$tmp_rootfs/$STAMP"
		mv -T "$tmp_rootfs" "$ROOTFS" # rename(2): the cache is either complete or absent
		tmp_rootfs=
	fi
	exec 9>&-
	say "rootfs built in $(elapsed "$t") s"
else
	say "rootfs: $ROOTFS (cached)"
fi

# --- The package -------------------------------------------------------------------------------
t=$(date +%s.%N)
if [ -n "${OLLIE_DEB:-}" ]; then
	DEB=$(realpath "$OLLIE_DEB")
	[ -f "$DEB" ] || fail "OLLIE_DEB=$OLLIE_DEB: no such file"
	say "package: $DEB (OLLIE_DEB)"
else
	[ -x "$ROOT/packaging/deb/build.sh" ] || fail "packaging/deb/build.sh is missing (or set OLLIE_DEB=path)"
	say "building the package (packaging/deb/build.sh --release; log: $LOGDIR/deb-build.log)"
	mkdir -p "$LOGDIR/deb"
	if ! run_child "$LOGDIR/deb-build.out" "$LOGDIR/deb-build.log" \
		"$ROOT/packaging/deb/build.sh" --release --out "$LOGDIR/deb"; then
		tail -n 30 "$LOGDIR/deb-build.log" "$LOGDIR/deb-build.out" | sed 's/^/  | /'
		fail "packaging/deb/build.sh failed"
	fi
	DEB=$(tail -n 1 "$LOGDIR/deb-build.out")
	[ -f "$DEB" ] || fail "packaging/deb/build.sh printed '$DEB', not a file"
	say "package: $DEB, built in $(elapsed "$t") s"
fi

# --- Boot ------------------------------------------------------------------------------------------
mkdir -p "$LOGDIR/out" "$LOGDIR/journal"
machine=ollie-boot-test-$$
nspawn=(
	systemd-nspawn
	--boot
	--directory="$ROOTFS"
	# The cached rootfs stays untouched: / is an overlay with a tmpfs upper layer.
	--volatile=overlay
	# No machined on the host (PID 1 is not systemd): do not register, and stay in our own
	# cgroup instead of asking systemd for a scope.
	--register=no
	--keep-unit
	--machine="$machine"
	# Its own network namespace (only a loopback): nothing in the test needs the network, and
	# with CAP_NET_ADMIN in the container PrivateNetwork= of olliesrv.service can bring its
	# own loopback up (on the host's network namespace systemd logs "Failed to configure
	# loopback network device … Operation not permitted").
	--private-network
	# nspawn's own seccomp filter (an allow-list, systemd 252) does not list the Landlock
	# calls: without this the sandbox sees no Landlock ("landlock ABI 0 < required 7") and
	# refuses every tool. Everything else the sandbox uses passes nspawn's filter for a
	# container with CAP_SYS_ADMIN (unshare of user, mount and pid namespaces from an
	# unprivileged user, mount and the new mount API, seccomp, prctl): the run records of
	# the landlock and user_units steps show it.
	--system-call-filter="landlock_create_ruleset landlock_add_rule landlock_restrict_self"
	# PID 1's status lines without colour codes, so the console log reads as text.
	--setenv=SYSTEMD_COLORS=0
	# The checks, the package and the results (read-write), and a persistent journal the
	# host can read after the container is gone (even when it was killed by the timeout).
	--bind-ro="$HERE:/opt/ollie-test"
	--bind-ro="$DEB:/opt/ollie-deb/ollie.deb"
	--bind="$LOGDIR/out:/opt/ollie-out"
	--bind="$LOGDIR/journal:/var/log/journal"
	--bind-ro="$HERE/ollie-boot-check.service:/etc/systemd/system/ollie-boot-check.service"
)

if [ "$shell" = 1 ]; then
	say "booting $ROOTFS with a root shell on the console"
	say "run /opt/ollie-test/check.sh for the checks (results in $LOGDIR/out); poweroff to leave"
	keep=1
	SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 "${nspawn[@]}" --console=interactive \
		--bind-ro="$HERE/autologin.conf:/etc/systemd/system/console-getty.service.d/autologin.conf" || true
	exit 0
fi

say "booting the container (timeout ${timeout_s} s; console: $LOGDIR/console.log)"
t=$(date +%s.%N)
set +e
# SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1: the container gets the unified cgroup hierarchy (cgroup2
# at /sys/fs/cgroup), as on a Debian 12 host booted with systemd. Without it, on a host whose
# PID 1 is not systemd (cgroup v1 controllers plus /sys/fs/cgroup/unified), nspawn mirrors
# that hybrid layout read-only and systemd in the container logs errors about it ("Failed to
# attach 1 to compat systemd cgroup /init.scope"); the stop step reads the service's cgroup
# at /sys/fs/cgroup/….
# Arguments after the options go to the container's PID 1 (systemd reads them as its kernel
# command line): run the checks once booted, and no getty on the console (its "login:"
# prompt would interleave with the check output).
# timeout: TERM first (nspawn halts the container), KILL 20 s later.
SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 timeout -k 20 "$timeout_s" "${nspawn[@]}" --console=read-only \
	systemd.wants=ollie-boot-check.service systemd.mask=console-getty.service \
	systemd.show_status=error 2>&1 |
	sed -u 's/\r$//' | tee "$LOGDIR/console.log" |
	sed -un 's/^\(\[[^]]*\] \)\{0,1\}check\.sh\[[0-9]*\]: \(ok - \|not ok - \|skip - \|# \)/  \2/p'
rc=${PIPESTATUS[0]}
set -e
boot_s=$(elapsed "$t")

report=$LOGDIR/out/report.txt
journal_tail() {
	say "journal (units ollie*, olliesrv*, user@*, without the checks' own lines; last 150):"
	journalctl -D "$LOGDIR/journal" --no-pager -o short-monotonic \
		-u 'ollie*' -u 'olliesrv*' -u 'user@*' 2>&1 | grep -Ev ' (check\.sh|runuser)\[[0-9]+\]: ' |
		tail -n 150 | sed 's/^/  | /'
	if ! grep -q . "$report" 2>/dev/null; then
		say "console (last 40 lines):"
		tail -n 40 "$LOGDIR/console.log" | sed 's/^/  | /'
	fi
}

if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
	running=$(cat "$LOGDIR/out/current-step" 2>/dev/null || echo "none (the checks did not start)")
	journal_tail
	fail "timed out after ${timeout_s} s (step running: $running)"
fi
if [ ! -s "$report" ]; then
	journal_tail
	fail "the container exited with status $rc before the checks reported (see the console above)"
fi
notok=$(grep -c '^not ok' "$report" || true)
skipped=$(grep -c '^skip' "$report" || true)
if [ "$rc" != 0 ] || [ "$notok" != 0 ] || ! grep -q '^# result: PASS' "$report"; then
	journal_tail
	fail "$notok step(s) failed: $(grep '^not ok' "$report" | sed 's/^not ok - //;s/[: ].*//' | paste -sd, -)$(
		[ "$skipped" = 0 ] || echo "; $skipped skipped: $(grep '^skip' "$report" | sed 's/^skip - //;s/[: ].*//' | paste -sd, -)"
	) (container exit status $rc)"
fi
say "boot and checks took $boot_s s"
say "PASS in $(elapsed) s"

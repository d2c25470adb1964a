#!/bin/bash
# shellcheck disable=SC2317 # functions are called indirectly (step NAME FUNCTION)
# The boot test's checks, run inside the booted container by ollie-boot-check.service (see
# scripts/boot-test.sh): install the ollie package and check the deployment end to end.
# Each step prints `ok - STEP[: facts] (N s)`, `not ok - STEP: reason (N s)` or
# `skip - STEP: …` (when a step it needs did not pass); the report is also written to
# $OUT/report.txt, each step's output to $OUT/steps/STEP.log and its shell trace to STEP.trace.
# Exit status: 0 when every step passed, 1 otherwise.
#
# By hand, in `scripts/boot-test.sh --shell`:  /opt/ollie-test/check.sh [STEP…]
# (with step names, only those run, in the order given, ignoring what they need).
set -uo pipefail
export PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 SYSTEMD_COLORS=0 SYSTEMD_PAGER=
# `systemctl` waits for jobs; never let it ask for a password on the console.
export SYSTEMD_ASK_PASSWORD_AGENT=0

TESTDIR=$(cd "$(dirname "$0")" && pwd)
OUT=${OLLIE_TEST_OUT:-/opt/ollie-out}
DEB=${OLLIE_TEST_DEB:-/opt/ollie-deb/ollie.deb}
REPORT=$OUT/report.txt
SOCK=/run/ollie/ollie
ADDR="unix!$SOCK"
# The unprivileged user of the user-unit step.
TUSER=alice

mkdir -p "$OUT/steps"
: >"$REPORT"
T0=$(date +%s.%N)
declare -A RESULT

say() { printf '%s\n' "$*" | tee -a "$REPORT"; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# --- helpers for the steps (they run in a subshell with set -e and xtrace) ------------------
DETAIL=/dev/null
NOTE=/dev/null
# The step's failure reason (its first line is shown), then the step ends.
die() {
	printf '%s\n' "$*" >>"$DETAIL"
	exit 1
}
# A short fact for the step's "ok" line (the notes are joined with "; ").
note() {
	printf '%s\n' "$*" >>"$NOTE"
	echo "note: $*"
}
# ollie-9p as root on the system socket, bounded (a read that blocks must not hang the test).
o9() { timeout 30 ollie-9p -a "$ADDR" "$@"; }
# poll SECONDS COMMAND…: run COMMAND every 0.2 s until it succeeds; fails after SECONDS.
poll() {
	local deadline
	deadline=$(($(date +%s) + $1))
	shift
	until "$@"; do
		[ "$(date +%s)" -lt "$deadline" ] || return 1
		sleep 0.2
	done
}
# wait_for SECONDS WHAT COMMAND…: poll, and end the step when it times out.
wait_for() {
	local s=$1 what=$2
	shift 2
	poll "$s" "$@" || die "timed out after $s s waiting for $what"
}
# prop UNIT PROPERTY: one property of a system unit.
prop() { systemctl show -p "$2" --value "$1"; }
active() { [ "$(systemctl is-active "$1")" = active ]; }
# no_procs WHAT pgrep-args…: fails (with the processes) when pgrep finds any.
no_procs() {
	local what=$1 found
	shift
	if found=$(pgrep -a "$@"); then
		die "$what still running: $(printf '%s' "$found" | paste -sd';' -)"
	fi
}
# The journal of a unit since this boot, for step logs.
unit_journal() { journalctl -b --no-pager -o short-monotonic "$@" | tail -n 40; }

# check_run_record RECORD_JSON: Landlock enforced (ABI ≥ 1), seccomp applied, sandboxed.
check_run_record() {
	local rec=$1
	printf '%s\n' "$rec" | jq -e . >/dev/null || die "the run record is not JSON: $rec"
	printf '%s\n' "$rec" | jq -c '{landlock: .layers.landlock | {abi, required_abi, status, path_rules},
		seccomp: .layers.seccomp | {profile, filters, instructions}, namespaces: .layers.namespaces,
		no_new_privs: .layers.no_new_privs, unsandboxed: .layers.unsandboxed, exit: .exit}'
	local status abi
	status=$(printf '%s' "$rec" | jq -r '.layers.landlock.status')
	abi=$(printf '%s' "$rec" | jq -r '.layers.landlock.abi')
	case $status in
	fully_enforced | partially_enforced) ;;
	*) die "Landlock status is '$status', not enforced" ;;
	esac
	[ "$abi" -ge 1 ] 2>/dev/null || die "Landlock ABI is '$abi'"
	printf '%s' "$rec" | jq -e '.layers.seccomp.filters >= 1 and .layers.seccomp.instructions > 0' >/dev/null ||
		die "seccomp not applied: $(printf '%s' "$rec" | jq -c .layers.seccomp)"
	printf '%s' "$rec" | jq -e '.layers.no_new_privs == true and .layers.unsandboxed == false' >/dev/null ||
		die "no_new_privs/unsandboxed wrong: $(printf '%s' "$rec" | jq -c '.layers | {no_new_privs, unsandboxed}')"
	# Memory: the run's own memory cgroup, or (none in these units) memfd_create denied, so
	# shared memory held by a file descriptor cannot escape RLIMIT_AS.
	printf '%s' "$rec" | jq -e '.layers.memory.bound == "cgroup" or .layers.memory.memfd == "denied"' >/dev/null ||
		die "memory unbounded: $(printf '%s' "$rec" | jq -c .layers.memory)"
	note "memory $(printf '%s' "$rec" | jq -r '"\(.layers.memory.bound), memfd \(.layers.memory.memfd)"')"
	note "Landlock $status (ABI $abi), seccomp $(printf '%s' "$rec" | jq -r '"\(.layers.seccomp.filters) filter(s), \(.layers.seccomp.allowed_syscalls) syscalls allowed"')"
}

# tool_output LOG: the output in the tool_result blocks of an agent's log (not the call, which
# quotes the code).
tool_output() { printf '%s\n' "$1" | awk '/^\[\[\[tool_result/ { f = 1; next } /^\]\]\]$/ { f = 0 } f'; }

# check_escape_output LOG WORKSPACE ESCAPES…: the tool wrote in its workspace and nowhere else.
check_escape_output() {
	local output ws=$2 p
	output=$(tool_output "$1")
	shift 2
	printf '%s\n' "$output" | grep -q 'WROTE-INSIDE' || die "the tool could not write in its workspace: $output"
	[ "$(cat "$ws/inside.txt" 2>/dev/null)" = inside ] || die "$ws/inside.txt missing after the tool wrote it"
	for p in "$@"; do
		if printf '%s\n' "$output" | grep -qF "ESCAPED $p"; then
			die "the tool wrote outside its workspace: $p"
		fi
		printf '%s\n' "$output" | grep -qF "DENIED $p" || die "no verdict for $p in the tool's output: $output"
		[ ! -e "$p" ] || die "$p exists after the tool tried to write it"
	done
}

# The agent's single process with a run record: proc/N (the first numeric entry).
first_proc() {
	local base=$1 list
	shift
	list=$("$@" ls "$base/proc") || die "cannot list $base/proc"
	printf '%s\n' "$list" | sed 's:/$::' | grep -E '^[0-9]+$' | sort -n | head -n 1
}

# --- the steps ------------------------------------------------------------------------------

# a. install without network; the user and group; the socket listens, the service waits.
step_install() {
	[ -f "$DEB" ] || die "no package at $DEB"
	dpkg-deb -I "$DEB" | sed -n '/Package:/,$p'
	local out
	out=$(timeout 120 dpkg -i "$DEB" 2>&1) || die "dpkg -i failed: $(printf '%s' "$out" | tail -n 3 | paste -sd' ' -)"
	printf '%s\n' "$out"
	dpkg -s ollie | grep -q '^Status: install ok installed' || die "dpkg -s ollie: not installed"
	local f
	for f in /usr/bin/olliesrv /usr/bin/toolsrv /usr/bin/o /usr/bin/ollie-9p \
		/usr/lib/systemd/system/olliesrv.socket /usr/lib/systemd/system/olliesrv.service \
		/usr/lib/systemd/user/olliesrv.socket /usr/lib/systemd/user/olliesrv.service \
		/etc/ollie/config.toml; do
		[ -e "$f" ] || die "$f not installed"
	done
	# The installed units, as systemd sees them (no man(1) in this rootfs: the pages' presence
	# is checked directly).
	local v
	v=$(systemd-analyze verify --man=no olliesrv.socket olliesrv.service 2>&1) ||
		die "systemd-analyze verify failed: $(printf '%s' "$v" | paste -sd' ' -)"
	[ -z "$v" ] || die "systemd-analyze verify: $(printf '%s' "$v" | paste -sd' ' -)"
	for f in olliesrv toolsrv o ollie-9p; do
		[ -s "/usr/share/man/man1/$f.1.gz" ] || die "no man page for $f"
	done
	getent passwd ollie || die "no user ollie"
	getent group ollie || die "no group ollie"
	[ "$(getent passwd ollie | cut -d: -f6)" = /var/lib/ollie ] || die "ollie's home is not /var/lib/ollie"
	[ "$(stat -c '%a %U %G' /srv/ollie)" = "2770 ollie ollie" ] ||
		die "/srv/ollie is $(stat -c '%a %U %G' /srv/ollie 2>&1), not 2770 ollie ollie"
	[ "$(systemctl is-enabled olliesrv.socket)" = enabled ] || die "olliesrv.socket is $(systemctl is-enabled olliesrv.socket), not enabled"
	active olliesrv.socket || die "olliesrv.socket is $(systemctl is-active olliesrv.socket) after installation"
	[ -S "$SOCK" ] || die "no socket at $SOCK"
	[ "$(stat -c '%a %U %G' "$SOCK")" = "660 ollie ollie" ] || die "$SOCK is $(stat -c '%a %U %G' "$SOCK"), not 660 ollie ollie"
	local st
	st=$(systemctl is-active olliesrv.service || true)
	[ "$st" = inactive ] || die "olliesrv.service is '$st' before the first connection (not socket-activated)"
	no_procs olliesrv -x olliesrv
}

# b. the first connection starts the service; Type=notify readiness.
step_activation() {
	local out
	out=$(o9 ls) || die "ollie-9p ls on $SOCK failed (status $?): $out"
	printf '%s\n' "$out"
	printf '%s\n' "$out" | grep -qx 'session/' || die "the root has no session/: $out"
	wait_for 20 "olliesrv.service to become active" active olliesrv.service
	systemctl show -p Type,Result,ActiveState,SubState,NRestarts,MainPID,ExecMainStartTimestampMonotonic,ActiveEnterTimestampMonotonic,StatusText olliesrv.service
	[ "$(prop olliesrv.service Type)" = notify ] || die "Type is $(prop olliesrv.service Type), not notify"
	[ "$(prop olliesrv.service SubState)" = running ] || die "SubState is $(prop olliesrv.service SubState)"
	[ "$(prop olliesrv.service NRestarts)" = 0 ] || die "NRestarts is $(prop olliesrv.service NRestarts)"
	[ "$(prop olliesrv.service Result)" = success ] || die "Result is $(prop olliesrv.service Result)"
	local pid user start ready
	pid=$(prop olliesrv.service MainPID)
	user=$(ps -o user= -p "$pid")
	[ "$user" = ollie ] || die "olliesrv (pid $pid) runs as '$user', not ollie"
	start=$(prop olliesrv.service ExecMainStartTimestampMonotonic)
	ready=$(prop olliesrv.service ActiveEnterTimestampMonotonic)
	note "started by the first connection, READY=1 after $(((ready - start) / 1000)) ms"
	# (install saw the service inactive, so this connection is what started it.)
	[ "$ready" -gt 0 ] || die "no ActiveEnterTimestamp"
}

# c. the replay backends configured (and the service restarted), then a session through the
# socket, in a shared workspace under /srv/ollie.
step_session() {
	cat >>/etc/ollie/config.toml <<-'EOF'

		# --- added by the boot test ---
		default_backend = "escape"
		[backends.escape]
		kind = "replay"
		file = "/etc/ollie/boot-test-escape.jsonl"
		[backends.bg]
		kind = "replay"
		file = "/etc/ollie/boot-test-bg.jsonl"
	EOF
	install -m 0644 "$TESTDIR/turns-escape.jsonl" /etc/ollie/boot-test-escape.jsonl
	install -m 0644 "$TESTDIR/turns-bg.jsonl" /etc/ollie/boot-test-bg.jsonl
	timeout 60 systemctl restart olliesrv.service || die "systemctl restart after the configuration change failed"
	wait_for 20 "olliesrv.service to become active" active olliesrv.service
	o9 read backends || die "cannot read backends"
	o9 read backends | grep -q escape || die "the replay backend 'escape' is not configured"
	install -d -o ollie -g ollie -m 2770 /srv/ollie/proj
	local out
	out=$(echo "name=proj cwd=/srv/ollie/proj" | o9 rdwr session/new) || die "session/new failed: $out"
	[ "$out" = proj ] || die "session/new replied '$out', not proj"
	o9 ls session | grep -qx proj/ || die "session/proj not listed"
	wait_for 10 "a toolsrv process (user ollie)" pgrep -u ollie -x toolsrv
	o9 read session/idx
	pgrep -a -u ollie
	note "session proj in /srv/ollie/proj, toolsrv pid $(pgrep -u ollie -x toolsrv | paste -sd, -)"
}

# d. an agent's execute_code runs sandboxed: it writes in the workspace, not outside it; the
# run record says Landlock and seccomp were enforced.
ESCAPES_SYSTEM=(/var/lib/ollie/escape /srv/ollie/escape-test /srv/escape-test)
step_landlock() {
	rm -f /srv/ollie/proj/inside.txt
	local reply log n rec
	reply=$(printf 'name=esc backend=escape prompt=run the boot test\n' | o9 rdwr session/proj/agent/new) ||
		die "agent/new with prompt= failed: $reply"
	printf '%s\n' "$reply"
	log=$(o9 read session/proj/agent/esc/log) || die "cannot read the agent's log"
	printf '%s\n' "$log"
	printf '%s\n' "$log" | grep -q '\[\[\[tool_result' || die "no tool_result in the agent's log"
	check_escape_output "$log" /srv/ollie/proj "${ESCAPES_SYSTEM[@]}"
	tool_output "$log" | grep -q 'NO-READ-STATE' || die "the tool could read /var/lib/ollie (olliesrv's state)"
	note "wrote in its workspace, denied writing ${ESCAPES_SYSTEM[*]} and reading /var/lib/ollie"
	n=$(first_proc session/proj/agent/esc o9)
	[ -n "$n" ] || die "no process in session/proj/agent/esc/proc"
	rec=$(o9 read "session/proj/agent/esc/proc/$n/record") || die "cannot read proc/$n/record: $rec"
	check_run_record "$rec"
}

# e. sessions, agents and chats survive a restart of the service.
step_restart() {
	local before after log
	before=$(prop olliesrv.service MainPID)
	timeout 60 systemctl restart olliesrv.service || die "systemctl restart failed"
	wait_for 20 "olliesrv.service to become active" active olliesrv.service
	after=$(prop olliesrv.service MainPID)
	[ "$before" != "$after" ] || die "MainPID unchanged ($after): not restarted"
	[ "$(prop olliesrv.service Result)" = success ] || die "Result is $(prop olliesrv.service Result)"
	active olliesrv.socket || die "olliesrv.socket is $(systemctl is-active olliesrv.socket) after the restart"
	o9 read session/idx || die "cannot read session/idx after the restart"
	o9 ls session | grep -qx proj/ || die "session proj is gone after the restart"
	o9 read session/proj/agent/idx | grep -q "^esc$(printf '\t')" || die "agent esc is gone after the restart: $(o9 read session/proj/agent/idx)"
	log=$(o9 read session/proj/agent/esc/log) || die "cannot read esc's log after the restart"
	tool_output "$log" | grep -q 'WROTE-INSIDE' || die "esc's log lost its tool result: $log"
	printf '%s\n' "$log" | grep -q 'boot-test: done' || die "esc's log lost the final answer: $log"
	note "session proj, agent esc and its log restored (MainPID $before -> $after)"
}

# e2. an upgrade (the same package repacked with a higher version) restarts the running
# server on the new files, keeps the edited conffile, and the state survives.
step_upgrade() {
	local dir next before after ver
	dir=$(mktemp -d)
	dpkg-deb -R "$DEB" "$dir/pkg" || die "dpkg-deb -R failed"
	ver=$(sed -n 's/^Version: //p' "$dir/pkg/DEBIAN/control")
	sed -i "s/^Version: .*/Version: ${ver%-*}-2/" "$dir/pkg/DEBIAN/control"
	next="$dir/ollie-next.deb"
	dpkg-deb --root-owner-group -b "$dir/pkg" "$next" >/dev/null || die "dpkg-deb -b failed"
	before=$(prop olliesrv.service MainPID)
	[ "$before" != 0 ] || die "olliesrv.service is not running before the upgrade"
	local out
	out=$(timeout 120 dpkg -i --force-confold "$next" 2>&1) ||
		die "dpkg -i (upgrade) failed: $(printf '%s' "$out" | tail -n 3 | paste -sd' ' -)"
	printf '%s\n' "$out"
	[ "$(dpkg-query -W -f '${Version}' ollie)" = "${ver%-*}-2" ] || die "the version after the upgrade is $(dpkg-query -W -f '${Version}' ollie)"
	wait_for 20 "olliesrv.service to become active" active olliesrv.service
	after=$(prop olliesrv.service MainPID)
	[ "$before" != "$after" ] || die "MainPID unchanged ($after): the upgrade did not restart the server"
	active olliesrv.socket || die "olliesrv.socket is $(systemctl is-active olliesrv.socket) after the upgrade"
	grep -q 'added by the boot test' /etc/ollie/config.toml || die "the upgrade replaced the edited /etc/ollie/config.toml"
	o9 ls session | grep -qx proj/ || die "session proj is gone after the upgrade"
	rm -rf "$dir"
	note "upgraded to ${ver%-*}-2: server restarted (MainPID $before -> $after), config and session proj kept"
}

# f. stopping the service and the socket leaves no process (a background tool was running).
step_stop() {
	local reply cg pid t cgdir
	reply=$(printf 'name=bg backend=bg prompt=start the background job\n' | o9 rdwr session/proj/agent/new) ||
		die "agent/new (background job) failed: $reply"
	printf '%s\n' "$reply"
	if ! poll 15 pgrep -u ollie -f 'sleep 300'; then
		local bglog
		bglog=$(o9 read session/proj/agent/bg/log || true)
		printf '%s\n' "$bglog"
		die "the background tool 'sleep 300' is not running: $(printf '%s\n' "$bglog" | grep -m 1 -i 'error' || echo 'no error in the agent log')"
	fi
	o9 read session/proj/agent/bg/proc/top || true
	pgrep -a -u ollie
	cg=$(prop olliesrv.service ControlGroup)
	[ -n "$cg" ] || die "olliesrv.service has no ControlGroup"
	pid=$(pgrep -u ollie -f 'sleep 300' | head -n 1)
	grep -q "$cg" "/proc/$pid/cgroup" || die "the background tool (pid $pid) is not in $cg: $(cat "/proc/$pid/cgroup")"
	# What runs before the stop, to name whatever systemd has to kill.
	ps -eo pid,ppid,user,comm,args >"$OUT/steps/stop.ps"
	local cursor killed
	cursor=$(journalctl -n 0 --show-cursor -o cat | sed -n 's/^-- cursor: //p')
	t=$(date +%s.%N)
	timeout 60 systemctl stop olliesrv.service olliesrv.socket || die "systemctl stop failed or took over 60 s"
	note "stopped in $(since "$t") s with a background tool running"
	systemctl show -p Result,ExecMainCode,ExecMainStatus,ActiveState olliesrv.service
	unit_journal -u olliesrv.service
	no_procs "processes of user ollie" -u ollie
	no_procs olliesrv -x olliesrv
	no_procs toolsrv -x toolsrv
	cgdir=/sys/fs/cgroup$cg
	if [ -d "$cgdir" ] && [ -n "$(cat "$cgdir/cgroup.procs" 2>/dev/null)" ]; then
		die "the service's cgroup $cg still has processes: $(paste -sd' ' "$cgdir/cgroup.procs")"
	fi
	[ "$(prop olliesrv.service Result)" = success ] ||
		die "the stop was not clean: Result=$(prop olliesrv.service Result) (a timeout means SIGKILL after TimeoutStopSec)"
	# A clean exit on SIGTERM, not a death by it (ExecMainCode 1 = exited).
	{ [ "$(prop olliesrv.service ExecMainCode)" = 1 ] && [ "$(prop olliesrv.service ExecMainStatus)" = 0 ]; } ||
		die "olliesrv did not exit 0 on SIGTERM: ExecMainCode=$(prop olliesrv.service ExecMainCode) ExecMainStatus=$(prop olliesrv.service ExecMainStatus)"
	# Everything must have exited on olliesrv's own SIGTERM handling: nothing left for
	# systemd's final SIGKILL of the control group (KillMode=control-group).
	killed=$(journalctl --after-cursor="$cursor" -u olliesrv.service --no-pager -o cat |
		grep -E 'Killing process|left-over process' || true)
	if [ -n "$killed" ]; then
		local pid2 what=""
		for pid2 in $(printf '%s\n' "$killed" | sed -n 's/.*[Kk]illing process \([0-9]*\).*/\1/p'); do
			what="$what; $(awk -v p="$pid2" '$1 == p' "$OUT/steps/stop.ps" | tr -s ' ')"
		done
		die "systemd had to SIGKILL left-over processes after olliesrv exited: $(printf '%s' "$killed" | paste -sd';' -) [before the stop:${what#;}]"
	fi
	[ ! -e "$SOCK" ] || die "$SOCK still exists after stopping the socket"
	# The tool was asked to stop (SIGTERM, with its grace period) before anything was killed:
	# its trap wrote this file in the workspace.
	[ -s /srv/ollie/proj/got-term.txt ] ||
		die "the background tool never got SIGTERM (no /srv/ollie/proj/got-term.txt)"
}

# g. the user units, for an unprivileged user with lingering.
as_user() {
	runuser -u "$TUSER" -- env XDG_RUNTIME_DIR="/run/user/$TUID" \
		DBUS_SESSION_BUS_ADDRESS="unix:path=/run/user/$TUID/bus" "$@"
}
uo9() { as_user timeout 30 ollie-9p -a "unix!/run/user/$TUID/ollie/ollie" "$@"; }
uprop() { as_user systemctl --user show -p "$2" --value "$1"; }
step_user_units() {
	getent passwd "$TUSER" >/dev/null || useradd -m -s /bin/bash "$TUSER"
	TUID=$(id -u "$TUSER")
	local home
	home=$(getent passwd "$TUSER" | cut -d: -f6)
	loginctl enable-linger "$TUSER" || die "loginctl enable-linger $TUSER failed"
	wait_for 30 "user@$TUID.service (its private socket)" test -S "/run/user/$TUID/systemd/private"
	as_user mkdir -p "$home/.config/ollie" "$home/proj"
	as_user cp "$TESTDIR/turns-user.jsonl" "$home/.config/ollie/turns.jsonl"
	as_user sh -c "cat > '$home/.config/ollie/config.toml'" <<-EOF
		default_backend = "demo"
		[backends.demo]
		kind = "replay"
		file = "$home/.config/ollie/turns.jsonl"
	EOF
	as_user systemctl --user enable --now olliesrv.socket || die "systemctl --user enable --now olliesrv.socket failed"
	[ "$(as_user systemctl --user is-active olliesrv.socket)" = active ] || die "the user olliesrv.socket is not active"
	[ -S "/run/user/$TUID/ollie/ollie" ] || die "no socket at /run/user/$TUID/ollie/ollie"
	[ "$(as_user systemctl --user is-active olliesrv.service)" != active ] || die "the user olliesrv.service runs before the first connection"
	local out
	out=$(uo9 ls) || die "ollie-9p ls on the user socket failed: $out"
	printf '%s\n' "$out" | grep -qx session/ || die "the root has no session/: $out"
	wait_for 20 "the user olliesrv.service to become active" test "$(as_user systemctl --user is-active olliesrv.service)" = active
	as_user systemctl --user show -p Type,Result,SubState,NRestarts,MainPID olliesrv.service
	[ "$(uprop olliesrv.service Type)" = notify ] || die "the user service's Type is $(uprop olliesrv.service Type)"
	[ "$(uprop olliesrv.service SubState)" = running ] || die "the user service is $(uprop olliesrv.service SubState)"
	note "$TUSER's olliesrv.service started by its socket (Type=notify, running)"
	out=$(echo "name=mine cwd=$home/proj" | uo9 rdwr session/new) || die "session/new failed: $out"
	[ "$out" = mine ] || die "session/new replied '$out'"
	local reply log n rec
	reply=$(printf 'name=esc prompt=run the boot test\n' | uo9 rdwr session/mine/agent/new) ||
		die "agent/new with prompt= failed: $reply"
	log=$(uo9 read session/mine/agent/esc/log) || die "cannot read the agent's log"
	printf '%s\n' "$log"
	check_escape_output "$log" "$home/proj" "$home/escape" "$home/.config/ollie/escape"
	tool_output "$log" | grep -q 'NO-READ-CONFIG' || die "the tool could read ~/.config/ollie/config.toml"
	note "wrote in ~/proj, denied writing ~/escape ~/.config/ollie/escape and reading ~/.config/ollie/config.toml"
	n=$(first_proc session/mine/agent/esc uo9)
	[ -n "$n" ] || die "no process in session/mine/agent/esc/proc"
	rec=$(uo9 read "session/mine/agent/esc/proc/$n/record") || die "cannot read proc/$n/record: $rec"
	check_run_record "$rec"
	# Stopping the user units leaves nothing of ollie behind either.
	as_user systemctl --user disable --now olliesrv.socket olliesrv.service || die "systemctl --user disable --now failed"
	no_procs "the user's olliesrv" -u "$TUSER" -x olliesrv
	no_procs "the user's toolsrv" -u "$TUSER" -x toolsrv
	[ "$(uprop olliesrv.service Result)" = success ] || die "the user service stopped with Result=$(uprop olliesrv.service Result)"
}

# After the step, passed or not: the user's units stopped, lingering off (user@UID ends).
post_user_units() {
	TUID=$(id -u "$TUSER") || return 0
	as_user systemctl --user disable --now olliesrv.socket olliesrv.service || true
	loginctl disable-linger "$TUSER" || true
	poll 20 test ! -e "/run/user/$TUID/systemd/private" || echo "user@$TUID.service still running"
}

# h. purge stops a running server and removes the state, the configuration and the units.
step_purge() {
	# A running server with a session (and so a toolsrv) first. When that fails, the purge
	# and its checks still run; the step then fails with the first reason.
	local first=
	systemctl start olliesrv.socket || first="cannot start olliesrv.socket again"
	install -d -o ollie -g ollie -m 2770 /srv/ollie/purge
	if [ -z "$first" ] && ! echo "name=purge cwd=/srv/ollie/purge" | o9 rdwr session/new; then
		first="no session through $SOCK before the purge (the purge itself was checked)"
	fi
	if [ -z "$first" ] && ! poll 10 pgrep -u ollie -x toolsrv; then
		first="no toolsrv running before the purge"
	fi
	pgrep -a -u ollie || true
	rmdir /srv/ollie/purge
	local out
	out=$(timeout 120 dpkg --purge ollie 2>&1) || die "dpkg --purge failed: $(printf '%s' "$out" | tail -n 3 | paste -sd' ' -)"
	printf '%s\n' "$out"
	no_procs "processes of user ollie" -u ollie
	no_procs olliesrv -x olliesrv
	no_procs toolsrv -x toolsrv
	local left="" f
	for f in /var/lib/ollie /etc/ollie /run/ollie /usr/bin/olliesrv /usr/bin/toolsrv /usr/bin/o \
		/usr/bin/ollie-9p /usr/lib/systemd/system/olliesrv.* /lib/systemd/system/olliesrv.* \
		/usr/lib/systemd/user/olliesrv.* /etc/systemd/system/olliesrv.* /etc/systemd/system/*/olliesrv.* \
		/etc/systemd/user/olliesrv.* /etc/systemd/user/*/olliesrv.* \
		/var/lib/systemd/deb-systemd-helper-enabled/*olliesrv* \
		/var/lib/systemd/deb-systemd-helper-enabled/*/olliesrv* \
		/var/lib/systemd/deb-systemd-helper-masked/*olliesrv*; do
		if [ -e "$f" ] || [ -L "$f" ]; then left="$left $f"; fi
	done
	[ -z "$left" ] || die "left after the purge: $left"
	left=$({ systemctl list-unit-files --no-legend 'olliesrv*' || true; } | paste -sd';' -)
	[ -z "$left" ] || die "systemd still knows unit files: $left"
	for u in olliesrv.service olliesrv.socket; do
		st=$(systemctl is-active "$u" || true)
		[ "$st" = inactive ] || die "$u is '$st' after the purge"
	done
	if dpkg -s ollie 2>/dev/null | grep -q '^Status:.*installed'; then
		die "dpkg still has ollie: $(dpkg -s ollie | grep ^Status)"
	fi
	# Kept by design (postrm): the user and group, and /srv/ollie with users' workspaces.
	note "kept as designed: user $(getent passwd ollie | cut -d: -f1), $(ls -d /srv/ollie 2>/dev/null || echo 'no /srv/ollie')"
	[ -z "$first" ] || die "$first"
}

# --- driver ---------------------------------------------------------------------------------
# step NAME FUNCTION NEEDS…: run FUNCTION unless a step it needs did not pass.
step() {
	local name=$1 fn=$2 need t rc
	shift 2
	if [ "$ONLY" = 0 ]; then
		for need in "$@"; do
			if [ "${RESULT[$need]:-}" != ok ]; then
				RESULT[$name]=skip
				say "skip - $name: not run, $need did not pass"
				return
			fi
		done
	fi
	echo "$name" >"$OUT/current-step"
	DETAIL=$OUT/steps/$name.detail
	NOTE=$OUT/steps/$name.note
	: >"$DETAIL"
	: >"$NOTE"
	t=$(date +%s.%N)
	(
		set -eE
		trap 'printf "line %s: \`%s\` failed (status %s)\n" "$LINENO" "$BASH_COMMAND" "$?" >>"$DETAIL"' ERR
		# The trace in its own file; the step's output (shown when it fails) in .log.
		exec 9>"$OUT/steps/$name.trace"
		BASH_XTRACEFD=9
		set -x
		"$fn"
	) >"$OUT/steps/$name.log" 2>&1 </dev/null
	rc=$?
	if [ "$rc" = 0 ]; then
		RESULT[$name]=ok
		if [ -s "$NOTE" ]; then
			say "ok - $name: $(awk 'NR > 1 { printf "; " } { printf "%s", $0 }' "$NOTE") ($(since "$t") s)"
		else
			say "ok - $name ($(since "$t") s)"
		fi
	else
		RESULT[$name]=fail
		say "not ok - $name: $(head -n 1 "$DETAIL" | cut -c1-400) ($(since "$t") s)"
		# The step's trace, last lines, for the console.
		tail -n 15 "$OUT/steps/$name.log" | sed 's/^/#   | /' | tee -a "$REPORT"
	fi
	rm -f "$OUT/current-step"
	# Undo what the step leaves behind even when it failed, so later steps stand alone.
	if declare -F "post_$name" >/dev/null; then
		("post_$name") >>"$OUT/steps/$name.log" 2>&1 </dev/null
	fi
}

STEPS=(install activation session landlock restart upgrade stop user_units purge)
declare -A NEEDS=(
	[install]=""
	[activation]="install"
	[session]="activation"
	[landlock]="session"
	[restart]="landlock"
	[upgrade]="restart"
	[stop]="session"
	[user_units]="install"
	[purge]="install"
)
ONLY=0
if [ $# -gt 0 ]; then
	ONLY=1
	STEPS=("$@")
fi

say "# ollie boot test: $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r), $(systemctl --version | head -n 1)"
for s in "${STEPS[@]}"; do
	declare -F "step_$s" >/dev/null || {
		say "not ok - $s: no such step (steps: ${STEPS[*]})"
		RESULT[$s]=fail
		continue
	}
	# shellcheck disable=SC2086
	step "$s" "step_$s" ${NEEDS[$s]:-}
done

passed=0 failed=0
for s in "${STEPS[@]}"; do
	if [ "${RESULT[$s]}" = ok ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
journalctl -b --no-pager -o short-monotonic >"$OUT/journal.txt" 2>&1 || true
journalctl --sync 2>/dev/null || true
if [ "$failed" = 0 ]; then
	say "# result: PASS ($passed/${#STEPS[@]} steps, $(since "$T0") s)"
	exit 0
fi
say "# result: FAIL ($failed of ${#STEPS[@]} steps did not pass, $(since "$T0") s)"
exit 1

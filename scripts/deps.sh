#!/usr/bin/env bash
# Installs what the test suite needs beyond the Rust toolchain, if it is missing.
# Idempotent; safe to run on a fresh machine (as root for apt packages).
set -euo pipefail

# command → Debian package. The escape suite's shell probes use these tools; a probe whose tool
# is missing would prove nothing, so the suite refuses to run without them under
# OLLIE_TEST_REQUIRE=all. bwrap is for the spawn benchmark. The systemd tools check the units
# and stand in for the service manager; nspawn, debootstrap and the dpkg tools are for the
# package and the boot test; fusermount3 (setuid) lets a user other than root `o mount`. sshd
# and ssh-keygen are for the remote-session suite (tests/tests/remote.rs: its own sshd on
# 127.0.0.1). cmake and g++ build llama-server for the real-model suite (tests/tests/llama.rs,
# scripts/local-model.sh --prepare). curl, pip, npm and git are the egress suite's clients
# (tests/tests/egress.rs: real installs through the session's proxy from local origins).
tools="python3:python3 pip3:python3-pip git:git make:make gcc:gcc curl:curl wget:wget
ssh:openssh-client ssh-keygen:openssh-client sshd:openssh-server ping:iputils-ping strace:strace gdb:gdb tmux:tmux screen:screen
dbus-send:dbus busctl:systemd systemd-run:systemd gpg-connect-agent:gnupg flock:util-linux
unshare:util-linux ipcmk:util-linux runuser:util-linux setsid:util-linux ps:procps
useradd:passwd sudo:sudo bwrap:bubblewrap
systemd-analyze:systemd systemd-socket-activate:systemd systemd-nspawn:systemd-container
debootstrap:debootstrap dpkg-deb:dpkg dpkg-shlibdeps:dpkg-dev help2man:help2man
fusermount3:fuse3 cmake:cmake g++:g++ npm:npm"
need_apt=()
for pair in $tools; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need_apt+=("${pair#*:}")
done
if [ "${#need_apt[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      $(printf '%s\n' "${need_apt[@]}" | sort -u) >/dev/null
  else
    echo "deps: missing packages ${need_apt[*]} and not root; install them first" >&2
    exit 1
  fi
fi

# py9p (Python 3) is an independent 9P client for the interop suite.
if ! python3 -c 'import py9p' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check p9fs==0.0.4
fi

# cargo-fuzz for the decoder fuzz target (runs on stable with RUSTC_BOOTSTRAP=1).
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install --quiet --locked cargo-fuzz
fi

# sshd started by root needs its privilege separation directory (the package's service would
# create it; the remote suite starts sshd itself).
if [ "$(id -u)" = 0 ] && [ ! -d /run/sshd ]; then
  mkdir -p -m 0755 /run/sshd
fi

# `o mount` as a user other than root goes through the setuid fusermount3, which opens
# /dev/fuse as the calling user: Debian's udev rule makes it 0666, but containers without udev
# leave it 0600.
if [ "$(id -u)" = 0 ] && [ -c /dev/fuse ] && [ "$(stat -c %a /dev/fuse)" != 666 ]; then
  chmod 0666 /dev/fuse
fi

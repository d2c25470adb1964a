#!/usr/bin/env bash
# Installs what the test suite needs beyond the Rust toolchain, if it is missing.
# Idempotent; safe to run on a fresh machine (as root for apt packages).
set -euo pipefail

need_apt=()
command -v python3 >/dev/null || need_apt+=(python3 python3-pip)
command -v git >/dev/null || need_apt+=(git)
command -v make >/dev/null || need_apt+=(make)
command -v gcc >/dev/null || need_apt+=(gcc)
if [ "${#need_apt[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
  else
    echo "deps: missing ${need_apt[*]} and not root; install them first" >&2
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

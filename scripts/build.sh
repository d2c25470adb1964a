#!/usr/bin/env bash
# build.sh: builds the four programs, olliesrv, toolsrv, o and ollie-9p, into target/release
# (target/debug with --debug; CARGO_TARGET_DIR is honoured), with toolsrv linked statically.
#
#   scripts/build.sh [--debug] [CARGO-OPTION…]     e.g. scripts/build.sh --locked
#
# Why toolsrv alone is static: olliesrv starts one toolsrv per session, and a static toolsrv
# maps no shared libraries. It starts about a quarter of a millisecond sooner, and its idle
# resident memory as /proc shows it is under 4 MiB instead of about 4.4 MiB (libc, libm,
# libgcc_s and ld.so pages it touched). toolsrv resolves no host names and looks up a user only
# when it has neither a home from olliesrv nor $HOME; the others resolve host and user names
# through NSS modules, which a static glibc loads only from the exact glibc it was built with.
#
# `cargo rustc` passes `+crt-static` to the toolsrv binary alone: its dependencies are the same
# as in a plain `cargo build`. A later `cargo build` of toolsrv links it dynamically again;
# both work.
set -euo pipefail

profile=(--release)
if [ "${1:-}" = --debug ]; then
	profile=()
	shift
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build "${profile[@]}" "$@" -p ollie-olliesrv -p ollie-cli --bins
cargo rustc "${profile[@]}" "$@" -p ollie-toolsrv --bin toolsrv -- -C target-feature=+crt-static

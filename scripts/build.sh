#!/usr/bin/env bash
# build.sh: builds the four programs, olliesrv, toolsrv, o and ollie-9p, into target/release
# (target/debug with --debug; CARGO_TARGET_DIR is honoured), with toolsrv linked statically.
#
#   scripts/build.sh [--debug] [CARGO-OPTION…]     e.g. scripts/build.sh --locked
#
# Why toolsrv, and only toolsrv, is static: docs/toolsrv.md ("Linked statically").
# `cargo rustc` passes `+crt-static` to the toolsrv binary alone: its dependencies are the same
# as in a plain `cargo build`, which links it dynamically again; both work.
set -euo pipefail

profile=(--release)
if [ "${1:-}" = --debug ]; then
	profile=()
	shift
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build "${profile[@]}" "$@" -p ollie-olliesrv -p ollie-cli --bins
cargo rustc "${profile[@]}" "$@" -p ollie-toolsrv --bin toolsrv -- -C target-feature=+crt-static

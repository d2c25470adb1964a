#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, every unit, integration, interop and
# escape test (sandbox suites also as an unprivileged user when run as root), and a fuzz smoke
# run. Set OLLIE_TEST_REQUIRE=all to turn every "SKIP <test>: <reason>" into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh

echo "== fmt"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== build"
cargo build --workspace --bins
echo "== test (as $(id -un))"
cargo test --workspace
if [ "$(id -u)" = 0 ]; then
  echo "== sandbox suites as an unprivileged user"
  scripts/test-unprivileged.sh
elif [ "${OLLIE_TEST_REQUIRE:-}" = all ]; then
  echo "test.sh: not root, so the root run of the sandbox suites is missing" >&2
  exit 1
fi
echo "== fuzz (${FUZZ_SECONDS:-60}s per target)"
scripts/fuzz.sh
echo "test.sh: all passed"

#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, every unit, integration, interop and
# escape test (sandbox suites also as an unprivileged user when run as root), a fuzz smoke
# run, the systemd units' checks and, as root, the boot test of the Debian package. Set
# OLLIE_TEST_REQUIRE=all to turn every "SKIP <test>: <reason>" into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh

# Every test runner's output also goes to a log, to sum the results at the end.
log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "== fmt"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== build"
cargo build --workspace --bins
echo "== test (as $(id -un))"
cargo test --workspace 2>&1 | tee -a "$log"
if [ "$(id -u)" = 0 ]; then
  echo "== sandbox suites as an unprivileged user"
  scripts/test-unprivileged.sh 2>&1 | tee -a "$log"
elif [ "${OLLIE_TEST_REQUIRE:-}" = all ]; then
  echo "test.sh: not root, so the root run of the sandbox suites is missing" >&2
  exit 1
fi
echo "== fuzz (${FUZZ_SECONDS:-60}s per target)"
scripts/fuzz.sh
echo "== systemd units (verify, exposure)"
scripts/check-units.sh
echo "== boot test (the Debian package under systemd in a booted container)"
if [ "$(id -u)" = 0 ]; then
  scripts/boot-test.sh
elif [ "${OLLIE_TEST_REQUIRE:-}" = all ]; then
  echo "test.sh: not root, so the boot test cannot run" >&2
  exit 1
else
  echo "SKIP boot-test: needs root (systemd-nspawn, debootstrap)"
fi
# One closing line for the whole run (both users), summed from every "test result" line.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"

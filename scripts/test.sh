#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, rustdoc warnings, every unit,
# integration, interop and escape test (sandbox suites also as an unprivileged user when run as
# root), a fuzz smoke run, a one-minute soak, the systemd units' checks, the README's quickstart
# on a fresh clone and, as root, the boot test of the Debian package. Set
# OLLIE_TEST_REQUIRE=all to turn every "SKIP <test>: <reason>" into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh

# Every test runner's output also goes to a log, to sum the results at the end.
log=$(mktemp)
trap 'rm -f "$log" "${llama_log:-}"' EXIT

# Each stage's wall time, printed at the end (where CI's time goes).
times="" stage_name="" stage_start=$SECONDS
stage() {
  [ -z "$stage_name" ] || times="$times $stage_name $((SECONDS - stage_start))s"
  stage_name=$1 stage_start=$SECONDS
  [ -z "$1" ] || echo "== $1"
}

# llama-server and its model for the real-model suite (tests/tests/llama.rs), built once into
# the cache outside the repository (about 6 minutes cold, nothing warm); in the background,
# where the lint and build stages leave a core idle.
llama_log=$(mktemp)
scripts/local-model.sh --prepare >"$llama_log" 2>&1 &
llama_pid=$!

stage fmt
cargo fmt --all -- --check
stage clippy
cargo clippy --workspace --all-targets -- -D warnings
stage doc
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --document-private-items --quiet
stage build
cargo build --workspace --bins
stage "llama-server (scripts/local-model.sh --prepare)"
if ! wait "$llama_pid"; then
  cat "$llama_log" >&2
  if [ "${OLLIE_TEST_REQUIRE:-}" = all ]; then
    echo "test.sh: llama-server could not be prepared" >&2
    exit 1
  fi
fi
stage "test (as $(id -un))"
cargo test --workspace 2>&1 | tee -a "$log"
if [ "$(id -u)" = 0 ]; then
  stage "sandbox suites as an unprivileged user"
  scripts/test-unprivileged.sh 2>&1 | tee -a "$log"
elif [ "${OLLIE_TEST_REQUIRE:-}" = all ]; then
  echo "test.sh: not root, so the root run of the sandbox suites is missing" >&2
  exit 1
fi
stage "soak smoke (${SOAK_SECONDS:-60}s, debug binaries)"
SOAK_SECONDS="${SOAK_SECONDS:-60}" cargo bench -p ollie-tests --bench soak --profile dev
stage "fuzz (${FUZZ_SECONDS:-60}s per target)"
scripts/fuzz.sh
stage "systemd units (verify, exposure)"
scripts/check-units.sh
stage "quickstart (README's commands on a fresh clone)"
tests/quickstart.sh
stage "boot test (the Debian package under systemd in a booted container)"
if [ "$(id -u)" = 0 ]; then
  scripts/boot-test.sh
elif [ "${OLLIE_TEST_REQUIRE:-}" = all ]; then
  echo "test.sh: not root, so the boot test cannot run" >&2
  exit 1
else
  echo "SKIP boot-test: needs root (systemd-nspawn, debootstrap)"
fi
stage ""
echo "times:$times"
# One closing line for the whole run (both users), summed from every "test result" line.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"

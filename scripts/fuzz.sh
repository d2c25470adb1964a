#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/fuzz_targets/ for FUZZ_SECONDS seconds each (default 60).
# Installs cargo-fuzz if it is missing. cargo-fuzz needs nightly compiler flags; with only a
# stable toolchain we enable them with RUSTC_BOOTSTRAP=1. Exits non-zero as soon as a target
# crashes (the crashing input is left in fuzz/artifacts/<target>/).
#
# Usage: scripts/fuzz.sh            # every target, 60 s each
#        FUZZ_SECONDS=300 scripts/fuzz.sh
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
secs="${FUZZ_SECONDS:-60}"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked || cargo install cargo-fuzz
fi

cd "$root/fuzz"
shopt -s nullglob
targets=(fuzz_targets/*.rs)
if [ "${#targets[@]}" -eq 0 ]; then
    echo "fuzz.sh: no targets in fuzz/fuzz_targets/" >&2
    exit 1
fi

for t in "${targets[@]}"; do
    name="$(basename "$t" .rs)"
    echo "fuzz.sh: fuzzing $name for ${secs}s" >&2
    if ! cargo fuzz run "$name" -- -max_total_time="$secs" -print_final_stats=1; then
        echo "fuzz.sh: $name crashed; see fuzz/artifacts/$name/" >&2
        exit 1
    fi
done
echo "fuzz.sh: all ${#targets[@]} target(s) ran ${secs}s without a crash" >&2

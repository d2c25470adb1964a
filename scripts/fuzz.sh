#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/fuzz_targets/ for FUZZ_SECONDS seconds each (default 60),
# starting from its committed corpus, fuzz/corpus/<target>/ (small and minimized: replayed
# first, so every input that once found new coverage is run again). New inputs go to a
# scratch directory and are dropped, unless --keep: then those that add coverage are merged
# into fuzz/corpus/<target>/ (libFuzzer's -merge=1) for committing. Installs cargo-fuzz if
# it is missing. cargo-fuzz needs nightly compiler flags; with only a stable toolchain we
# enable them with RUSTC_BOOTSTRAP=1. Exits non-zero as soon as a target crashes (the
# crashing input is left in fuzz/artifacts/<target>/: make it a regression test).
#
# Usage: scripts/fuzz.sh                          # every target, 60 s each (CI: less)
#        FUZZ_SECONDS=600 scripts/fuzz.sh --keep  # the long run by hand, corpus updated
#        scripts/fuzz.sh --keep stream            # only the named targets
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
secs="${FUZZ_SECONDS:-60}"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked || cargo install cargo-fuzz
fi

keep=0
if [ "${1:-}" = --keep ]; then
    keep=1
    shift
fi

cd "$root/fuzz"
shopt -s nullglob
if [ "$#" -gt 0 ]; then
    targets=()
    for n in "$@"; do targets+=("fuzz_targets/$n.rs"); done
else
    targets=(fuzz_targets/*.rs)
fi
if [ "${#targets[@]}" -eq 0 ]; then
    echo "fuzz.sh: no targets in fuzz/fuzz_targets/" >&2
    exit 1
fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for t in "${targets[@]}"; do
    name="$(basename "$t" .rs)"
    [ -f "$t" ] || { echo "fuzz.sh: no target $name" >&2; exit 1; }
    mkdir -p "corpus/$name" "$scratch/$name"
    echo "fuzz.sh: fuzzing $name for ${secs}s (corpus: $(find "corpus/$name" -type f | wc -l) inputs)" >&2
    if ! cargo fuzz run "$name" "$scratch/$name" "corpus/$name" -- \
        -max_total_time="$secs" -print_final_stats=1; then
        echo "fuzz.sh: $name crashed; see fuzz/artifacts/$name/" >&2
        exit 1
    fi
    if [ "$keep" = 1 ]; then
        cargo fuzz run "$name" "corpus/$name" "$scratch/$name" -- -merge=1 >/dev/null 2>&1
        echo "fuzz.sh: corpus/$name now holds $(find "corpus/$name" -type f | wc -l) inputs" >&2
    fi
done
echo "fuzz.sh: all ${#targets[@]} target(s) ran ${secs}s without a crash" >&2

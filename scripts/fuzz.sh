#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ (libFuzzer through libfuzzer-sys, built on the stable
# toolchain with LLVM's coverage instrumentation) for SECONDS in total, shared equally,
# and prints each target's executions. Exits non-zero when a target crashes, panics,
# hangs (10 s on one input) or runs out of memory, naming the folder that holds the
# reproducer (fuzz/artifacts/<target>/); copy it under fuzz/regressions/<target>/ and
# `cargo test --test fuzz_regressions` replays it from then on.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      default: 60 seconds, every target
#
# Each target starts from its corpus (fuzz/corpus/<target>/, kept between runs, not
# committed) and its seeds (fuzz/seeds/<target>/, made by scripts/fuzz-seeds.py from the
# tests' fixtures and ../shared/traces/).
set -euo pipefail
cd "$(dirname "$0")/.."

total=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^foldgate-fuzz$')
fi
per=$(( total / ${#targets[@]} ))
[ "$per" -ge 1 ] || per=1

host=$(rustc -vV | sed -n 's/^host: //p')
# Coverage-guided, on stable: the flags `cargo fuzz build -s none` passes, spelled out.
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
export CARGO_TARGET_DIR=${FUZZ_TARGET_DIR:-$PWD/target/fuzz}
echo "building ${#targets[@]} fuzz targets ($host, release, instrumented)"
(cd fuzz && cargo build --release --locked --target "$host" --bins)
bin=$CARGO_TARGET_DIR/$host/release

python3 scripts/fuzz-seeds.py fuzz/seeds
failed=()
printf '%-20s %12s %10s %s\n' target executions seconds result
for t in "${targets[@]}"; do
    corpus=fuzz/corpus/$t artifacts=fuzz/artifacts/$t/
    mkdir -p "$corpus" "$artifacts" fuzz/seeds/"$t"
    log=$(mktemp)
    set +e
    "$bin/$t" -max_total_time="$per" -timeout=10 -rss_limit_mb=4096 -max_len=262144 \
        -print_final_stats=1 -artifact_prefix="$artifacts" "$corpus" fuzz/seeds/"$t" >"$log" 2>&1
    status=$?
    set -e
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    secs=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    if [ $status -eq 0 ]; then
        printf '%-20s %12s %10s %s\n' "$t" "${runs:-?}" "$per" ok
    else
        printf '%-20s %12s %10s %s\n' "$t" "${runs:-?}" "$per" "FAILED (exit $status): reproducer in $artifacts"
        grep -E "panicked|ERROR: libFuzzer|SUMMARY|Test unit written" "$log" | head -8 | sed 's/^/    /'
        failed+=("$t")
    fi
    : "${secs:=}"
    rm -f "$log"
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "crashes or hangs in: ${failed[*]}" >&2
    exit 1
fi
echo "no crash, no hang"

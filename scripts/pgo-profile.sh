#!/usr/bin/env bash
# Records the execution profile that optimized builds use (pgo/foldgate.profdata, read
# by pgo/rustc-wrapper; see pgo/README.md).
#
# 1. Builds foldgate instrumented (`-Cprofile-generate`, release profile) in
#    target/pgo-generate.
# 2. Runs it as users do, in front of scripts/mock-chat-upstream.py: chat completions,
#    Responses and Messages requests, whole and streamed, of 2 KiB and 50 KiB, with
#    compaction on (the default) and off, and conversations past the trigger, compacted
#    (scripts/chat-load.py); then `foldgate replay` of the recorded conversations
#    (../shared/traces/dev.jsonl, and the Responses and Messages rewrites of them that
#    tests/compaction_trail.rs leaves in target/tmp), which compacts them at two
#    windows: the engine's work, counting and folding. Code no run reaches is
#    optimized as cold (for size), so what users run must be in these runs.
# 3. Merges what the runs wrote into pgo/foldgate.profdata, the request path weighted
#    to three quarters of the counts, and writes the major version of the LLVM that
#    wrote it to pgo/llvm-major.
#
# Run it after changing the request path or the engine, after a dependency update and
# after a compiler update: the profile names functions by their symbols, whose hashes
# follow the compiler and the dependencies; a function changed since the profile was
# recorded is optimized as without one.
#
# Usage: scripts/pgo-profile.sh [TRACES.jsonl]
# Needs llvm-profdata of the compiler's LLVM (rustup component add llvm-tools) and
# python3.
set -euo pipefail
cd "$(dirname "$0")/.."
traces=$(realpath "${1:-../shared/traces/dev.jsonl}")

host=$(rustc -vV | sed -n 's/^host: //p')
llvm=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
profdata="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
if [ ! -x "$profdata" ]; then
    echo "llvm-profdata is missing: rustup component add llvm-tools" >&2
    exit 1
fi

raw=$(realpath -m target/pgo-generate/raw)
rm -rf "$raw"
mkdir -p "$raw"
CARGO_TARGET_DIR=target/pgo-generate RUSTFLAGS="-Cprofile-generate=$raw" \
    cargo build --release --locked --bin foldgate
bin=target/pgo-generate/release/foldgate
# The build's own build scripts and procedural macros ran instrumented too: only the
# runs below belong in the profile.
rm -f "$raw"/*.profraw

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
    for _ in $(seq 300); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null && return 0
        sleep 0.2
    done
    echo "nothing listens on $1" >&2
    exit 1
}
mock_port=$(free_port)
python3 scripts/mock-chat-upstream.py "$mock_port" bench & pids+=($!)
wait_port "$mock_port"

# serve COMPACTION PROFILE LOAD: foldgate serving, its profile written to PROFILE when
# it exits, while LOAD PORT sends it requests.
serve() {
    local compaction=$1 profile=$2 load=$3 port
    port=$(free_port)
    LLVM_PROFILE_FILE=$profile FOLDGATE_LISTEN=127.0.0.1:$port \
        FOLDGATE_UPSTREAM_URL=http://127.0.0.1:$mock_port/v1 \
        FOLDGATE_UPSTREAM__ANTHROPIC_URL=http://127.0.0.1:$mock_port \
        FOLDGATE_COMPACTION__ENABLED=$compaction \
        "$bin" serve 2>"$work/serve.log" & serve=$!
    wait_port "$port"
    "$load" "$port"
    kill -TERM "$serve"
    wait "$serve" || true
}
# Every API, whole and streamed, 2 KiB and 50 KiB, below the trigger; chat, the most
# common, weighs most.
below_trigger() {
    for api in chat responses messages; do
        for stream in 0 1; do
            for kb in 2 50; do
                n=400
                [ "$api" != chat ] && n=150
                [ "$stream" = 1 ] && n=100
                SHAPE=bench STREAM=$stream python3 scripts/chat-load.py "$1" "$n" "$kb" "$api"
            done
        done
    done
}
# Conversations past the trigger: compacted when first seen, then with their folds
# reused.
past_trigger() {
    SHAPE=bench STREAM=0 python3 scripts/chat-load.py "$1" 12 700 chat
    SHAPE=bench STREAM=0 python3 scripts/chat-load.py "$1" 6 700 responses
    SHAPE=bench STREAM=0 python3 scripts/chat-load.py "$1" 6 1000 messages
}

# Two parts, recorded apart: the request path (every request runs it) and the
# engine's work (requests that are compacted, the recorded conversations replayed).
serve true "$raw/path-%m.profraw" below_trigger
serve false "$raw/path-%m.profraw" below_trigger
serve true "$raw/engine-%m.profraw" past_trigger
replays=("chat $traces")
for api in Responses Messages; do
    file=target/tmp/trail-$api.jsonl
    if [ -s "$file" ]; then
        replays+=("${api,,} $file")
    else
        echo "no $file (cargo test --test compaction_trail writes it): $api replay left out" >&2
    fi
done
for window in 16000 32000; do
    for replay in "${replays[@]}"; do
        read -r api file <<<"$replay"
        LLVM_PROFILE_FILE="$raw/engine-%m.profraw" \
            "$bin" replay --json --api "$api" --window "$window" "$file" >/dev/null
    done
done

# The engine's loops count some 250 times what the request path does: merged as they
# are, the request path would be under 1 % of the counts, below what LLVM takes for
# hot, and a 2 KB request gained nothing (docs/PERFORMANCE.md, ninth pass). The request
# path is weighted to three quarters of the merged counts.
for part in path engine; do
    "$profdata" merge -o "$raw/$part.profdata" "$raw/$part"-*.profraw
done
total() { "$profdata" show "$raw/$1.profdata" | sed -n 's/^Total count: //p'; }
weight=$(python3 -c "print(max(1, round(3 * $(total engine) / max(1, $(total path)))))")
# Not `--sparse`: the functions that never ran stay in it with their zero counts, so
# that LLVM knows them cold (optimized for size, laid out apart) instead of unknown.
"$profdata" merge -o pgo/foldgate.profdata \
    "--weighted-input=$weight,$raw/path.profdata" "--weighted-input=1,$raw/engine.profdata"
echo "$llvm" >pgo/llvm-major
# Cargo builds every crate again when its flags change: the profile's digest in them
# makes a new profile reach every crate (.cargo/config.toml).
digest=$(sha256sum pgo/foldgate.profdata | cut -c1-16)
sed -i "s/^rustflags = .*/rustflags = [\"--cfg=foldgate_profile=\\\\\"$digest\\\\\"\"]/" .cargo/config.toml
echo "pgo/foldgate.profdata written ($(du -k pgo/foldgate.profdata | cut -f1) KiB, LLVM $llvm, request path weighted $weight)"

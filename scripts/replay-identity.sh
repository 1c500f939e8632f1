#!/usr/bin/env bash
# Checks that a change forwards the same bytes: replays every recorded conversation with
# `foldgate replay` at two revisions (BASE and the working tree), at each window, and
# compares the SHA-256 of every conversation's forwarded bodies (the `forwarded_sha256`
# of `foldgate replay --json`). Exits 1 naming the conversations that differ.
#
#   scripts/replay-identity.sh BASE_REV [TRACES.jsonl]
#
# Each conversation is replayed as chat completions, and (APIS, default "chat responses
# messages") as Responses and Anthropic Messages bodies: the traces rewritten in those
# shapes by `tests/compaction_trail.rs`, which writes them to target/tmp/trail-*.jsonl
# (run first when they are missing).
#
# BASE_REV must already report `forwarded_sha256`. WINDOWS (default "16000 32000") sets
# the windows. Both builds use the release profile without LTO (same code, faster to
# build), each in its own target directory under target/replay-identity/.
set -euo pipefail
cd "$(dirname "$0")/.."

base=${1:?usage: scripts/replay-identity.sh BASE_REV [TRACES.jsonl]}
traces=$(realpath "${2:-../shared/traces/dev.jsonl}")
windows=${WINDOWS:-"16000 32000"}
out=target/replay-identity
mkdir -p "$out"
out=$(realpath "$out")

tree="$out/base-tree"
git worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
git worktree add --detach "$tree" "$base" >/dev/null
trap 'git worktree remove --force "$tree" 2>/dev/null || true' EXIT

export CARGO_PROFILE_RELEASE_LTO=off CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16
(cd "$tree" && cargo build --release --quiet --bin foldgate --target-dir "$out/base")
cargo build --release --quiet --bin foldgate --target-dir "$out/head"

# One line per conversation: id and hash, then the total.
hashes() {
    python3 -c '
import json, sys
run = json.load(sys.stdin)
if "forwarded_sha256" not in run["total"]:
    sys.exit("this revision does not report forwarded_sha256")
for c in run["conversations"]:
    print(c["id"], c["forwarded_sha256"])
print("total", run["total"]["forwarded_sha256"])'
}

apis=${APIS:-"chat responses messages"}
records() {
    case "$1" in
        chat) echo "$traces" ;;
        responses) echo target/tmp/trail-Responses.jsonl ;;
        messages) echo target/tmp/trail-Messages.jsonl ;;
    esac
}
for api in $apis; do
    if [ "$api" != chat ] && [ ! -s "$(records "$api")" ]; then
        cargo test --quiet --test compaction_trail >/dev/null
    fi
done

status=0
for api in $apis; do
    for w in $windows; do
        for side in base head; do
            "$out/$side/release/foldgate" replay --json --api "$api" --window "$w" "$(records "$api")" \
                | hashes >"$out/$side-$api-$w.txt" || true
            if [ ! -s "$out/$side-$api-$w.txt" ]; then
                echo "replay at $side ($api, window $w) gave no hashes" >&2
                exit 2
            fi
        done
        if diff -q "$out/base-$api-$w.txt" "$out/head-$api-$w.txt" >/dev/null; then
            echo "$api, window $w: $(($(wc -l <"$out/head-$api-$w.txt") - 1)) conversations forward identical bodies ($(tail -1 "$out/head-$api-$w.txt"))"
        else
            echo "$api, window $w: forwarded bodies differ:"
            diff "$out/base-$api-$w.txt" "$out/head-$api-$w.txt" | grep '^>' | head -20
            status=1
        fi
    done
done
exit $status

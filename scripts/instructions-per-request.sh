#!/usr/bin/env bash
# User-space instructions per proxied chat request below the compaction trigger: foldgate
# in its default configuration (compaction on, `info` log with the access-log line),
# foldgate with compaction off, and nginx, side by side, counted by valgrind's callgrind:
# unlike timings, the counts hardly move between runs or with other load on the
# machine, so a change's effect on the work per request shows even when the latency
# bench cannot resolve it.
#
# Each proxy runs alone under callgrind (foldgate with one connection thread, nginx with
# one worker and no master), in front of the same Python mock upstream (1.2 KB
# chat.completion with usage). The request is a conversation of system prompt, user
# turns, tool calls, tool results and assistant answers padded to BODY_KB KiB, as the
# latency bench sends. Sequential keep-alive requests warm it up, the counters are
# zeroed, N more requests are counted. Prints instructions per request and the ratios to
# nginx; `KEEP_PROFILES=1` also keeps foldgate's callgrind files
# (target/foldgate-default.callgrind, target/foldgate-off.callgrind, counted by
# instruction; open with callgrind_annotate --inclusive=yes).
#
# `API=responses` sends the same conversation as a Responses API request (`instructions`,
# `input` items with function calls and their outputs) to `/v1/responses`; `API=messages`
# as an Anthropic Messages request (`system`, `tool_use` and `tool_result` blocks) to
# `/v1/messages`, answered by the mock in the Messages shape.
#
# `SHAPE=bench` shapes the exchange as the latency bench (benches/proxy_latency.rs)
# does: the request's keys sorted and compact, as `serde_json` writes them, and the
# bench's answer (its `MOCK_RESPONSE`, with OpenAI's full usage details) instead of the
# short one.
#
# `STREAM=1` asks for an event stream (`"stream": true`; chat also asks for its usage);
# the mock answers one in the API's shape.
#
# Usage: [BODY_KB=2] [API=chat|responses|messages] [SHAPE=plain|bench] [STREAM=0|1] \
#        [BIN=path/to/foldgate] scripts/instructions-per-request.sh [N]   (default N 2000)
# Needs valgrind, nginx and python3 (apt-get install -y valgrind nginx python3).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-2000}
BODY_KB=${BODY_KB:-2}
API=${API:-chat}
case "$API" in chat|responses|messages) ;; *) echo "API is chat, responses or messages, not $API" >&2; exit 2 ;; esac
SHAPE=${SHAPE:-plain}
case "$SHAPE" in plain|bench) ;; *) echo "SHAPE is plain or bench, not $SHAPE" >&2; exit 2 ;; esac
export SHAPE
STREAM=${STREAM:-0}
case "$STREAM" in 0|1) ;; *) echo "STREAM is 0 or 1, not $STREAM" >&2; exit 2 ;; esac
export STREAM
for tool in valgrind callgrind_control callgrind_annotate python3; do
    command -v "$tool" >/dev/null || { echo "$tool is missing (apt-get install -y valgrind python3)" >&2; exit 1; }
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$NGINX" ] || { echo "nginx is missing (apt-get install -y nginx)" >&2; exit 1; }

# BIN: another foldgate binary to count (e.g. a build of an earlier commit).
BIN=${BIN:-target/release/foldgate}
[ "${SKIP_BUILD:-0}" = 1 ] || [ "$BIN" != target/release/foldgate ] || cargo build --release --quiet
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MOCK_PORT=$(free_port); FG_PORT=$(free_port); NG_PORT=$(free_port)

cat >"$work/nginx.conf" <<EOF
daemon off; master_process off; worker_processes 1; pid $work/nginx.pid; error_log $work/nginx.err;
events { worker_connections 1024; }
http { access_log off; client_body_temp_path $work; proxy_temp_path $work;
  upstream up { server 127.0.0.1:$MOCK_PORT; keepalive 64; }
  server { listen 127.0.0.1:$NG_PORT; keepalive_requests 1000000;
    location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection "";
                 proxy_request_buffering off; proxy_buffering off; } } }
EOF

python3 scripts/mock-chat-upstream.py "$MOCK_PORT" "$SHAPE" & pids+=($!)

wait_port() {
    for _ in $(seq 300); do
        python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null && return 0
        sleep 0.2
    done
    echo "nothing listens on $1 ($2)" >&2; tail -30 "$work/$2.err" >&2; exit 1
}

# Kept profiles count by instruction too (scripts/hot-functions.py reads them).
dump_instr=()
[ "${KEEP_PROFILES:-0}" = 1 ] && dump_instr=(--dump-instr=yes)

# count NAME PORT CMD...: instructions per request of CMD proxying to the mock.
count() {
    local name=$1 port=$2; shift 2
    local out="$work/$name.callgrind"
    valgrind --tool=callgrind "${dump_instr[@]}" --callgrind-out-file="$out" "$@" >/dev/null 2>"$work/$name.err" & local pid=$!
    pids+=("$pid")
    wait_port "$port" "$name"
    python3 scripts/chat-load.py "$port" 300 "$BODY_KB" "$API"
    callgrind_control -z "$pid" >/dev/null 2>&1
    python3 scripts/chat-load.py "$port" "$N" "$BODY_KB" "$API"
    callgrind_control -d "$pid" >/dev/null 2>&1
    sleep 1
    kill "$pid"; wait "$pid" 2>/dev/null || true
    local dump total
    dump=$(ls -t "$out".* | head -1)
    total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }')
    case "$name" in foldgate-*) [ "${KEEP_PROFILES:-0}" = 1 ] && cp "$dump" "target/$name.callgrind" ;; esac
    echo $((total / N))
}

foldgate_env() {
    export FOLDGATE_SERVER__WORKERS=1 FOLDGATE_LISTEN=127.0.0.1:$FG_PORT
    export FOLDGATE_UPSTREAM_URL=http://127.0.0.1:$MOCK_PORT/v1
    export FOLDGATE_UPSTREAM__ANTHROPIC_URL=http://127.0.0.1:$MOCK_PORT
}
fg=$(foldgate_env; count foldgate-default "$FG_PORT" "$BIN" serve)
off=$(foldgate_env; export FOLDGATE_COMPACTION__ENABLED=false
    count foldgate-off "$FG_PORT" "$BIN" serve)
ng=$(count nginx "$NG_PORT" "$NGINX" -c "$work/nginx.conf")
kind=$API; [ "$STREAM" = 1 ] && kind="$API streaming"
echo "user-space instructions per $BODY_KB KiB $kind request ($N sequential, callgrind):"
echo "  foldgate, default configuration  $fg"
echo "  foldgate, compaction off         $off"
echo "  nginx                            $ng"
python3 -c "print('  ratio to nginx: default %.2f, compaction off %.2f' % ($fg / $ng, $off / $ng))"
[ "${KEEP_PROFILES:-0}" = 1 ] && echo "  profiles: target/foldgate-default.callgrind, target/foldgate-off.callgrind"
exit 0

#!/usr/bin/env bash
# Proxy passthrough latency: direct vs nginx vs foldgate (benches/proxy_latency.rs).
# Installs nginx when it is missing (Debian/Ubuntu, needs root), builds the bench at
# normal priority, then runs it at real-time priority (SCHED_FIFO 1) when allowed, so
# builds sharing the machine cannot preempt the bench or the proxies; PROXYBENCH_RT=0
# runs it at normal priority. The bench writes docs/PERFORMANCE.md.
# Other knobs are environment variables, see the header of benches/proxy_latency.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "nginx is missing; run as root (or: sudo apt-get install -y nginx-light)" >&2
        exit 1
    fi
    apt-get update
    # nginx-light is gone from newer Debian releases; plain nginx is the same server.
    apt-get install -y --no-install-recommends nginx-light \
        || apt-get install -y --no-install-recommends nginx
    # The package may start a system nginx on port 80; the bench runs its own instance.
    if command -v systemctl >/dev/null 2>&1; then systemctl stop nginx 2>/dev/null || true; fi
    /usr/sbin/nginx -s quit 2>/dev/null || true
fi

# Never compile at real-time priority: that would starve everything else on the machine.
# foldgate is measured as `cargo build --release` makes it, the binary users run: the one
# `cargo bench` builds beside the bench has the dev-dependencies' features unified in
# (tokio's `test-util` clock among them), about 670 instructions more a request.
# PROXYBENCH_FOLDGATE_BIN names another binary.
if [ -z "${PROXYBENCH_FOLDGATE_BIN:-}" ]; then
    cargo build --release --locked
    mkdir -p target/bench-proxy
    cp target/release/foldgate target/bench-proxy/foldgate
    export PROXYBENCH_FOLDGATE_BIN="$PWD/target/bench-proxy/foldgate"
    # How much of the request path's layout (build.rs) the measured binary has.
    python3 scripts/hot-functions.py --check || true
fi
cargo bench --bench proxy_latency --no-run

run=()
if [ "${PROXYBENCH_RT:-1}" != 0 ] && command -v chrt >/dev/null 2>&1 && chrt -f 1 true 2>/dev/null; then
    run=(chrt -f 1)
fi
exec "${run[@]}" cargo bench --bench proxy_latency "$@"

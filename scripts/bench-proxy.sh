#!/usr/bin/env bash
# Proxy passthrough latency: direct vs nginx vs foldgate (benches/proxy_latency.rs).
# Installs nginx when it is missing (Debian/Ubuntu, needs root), then runs the bench,
# which builds foldgate with the bench profile and writes docs/PERFORMANCE.md.
# Knobs are environment variables, see the header of benches/proxy_latency.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "nginx is missing; run as root (or: sudo apt-get install -y nginx-light)" >&2
        exit 1
    fi
    apt-get update
    # nginx-light is gone from newer Debian releases; plain nginx is the same binary family.
    apt-get install -y --no-install-recommends nginx-light \
        || apt-get install -y --no-install-recommends nginx
    # The package starts a system nginx on port 80; the bench runs its own instance.
    if command -v systemctl >/dev/null 2>&1; then systemctl stop nginx 2>/dev/null || true; fi
fi

exec cargo bench --bench proxy_latency "$@"

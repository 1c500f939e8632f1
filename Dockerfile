# syntax=docker/dockerfile:1
# Multi-stage build: compile in the Rust image, run from a slim Debian with only CA
# certificates (for `upstream.tls_roots = "system"`) and a non-root user.

# The toolchain is pinned: linker/hot-functions.txt names the request path's functions
# by their mangled paths (build.rs, docs/PERFORMANCE.md), which another compiler may
# spell or inline otherwise and so lay out less of.
FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin foldgate \
    && cp target/release/foldgate /usr/local/bin/foldgate

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin foldgate
COPY --from=builder /usr/local/bin/foldgate /usr/local/bin/foldgate
USER foldgate
# The default (127.0.0.1:8080) is unreachable from outside a container.
ENV FOLDGATE_LISTEN=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["foldgate"]
CMD ["serve"]

# syntax=docker/dockerfile:1
# wsd in a container: `docker build -t wsd .`, then see README ("Container").

# --- build: the pinned toolchain (rust-toolchain.toml) builds one binary.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p wsd \
 && strip target/release/wsd

# --- runtime: debian-slim, a non-root user, the workspace on a volume.
FROM debian:bookworm-slim
# tini reaps the commands `wsd exec` starts and forwards SIGTERM to wsd;
# bubblewrap runs them sandboxed under `wsd serve --sandbox` (README,
# "Sandboxed commands": Docker's default seccomp profile refuses the
# namespaces it makes, and wsd then refuses to start).
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini=0.19.* bubblewrap=0.8.* \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --create-home --home-dir /home/wsd wsd \
 && mkdir -p /workspace \
 && chown wsd:wsd /workspace
COPY --from=build /src/target/release/wsd /usr/local/bin/wsd
COPY docker/entrypoint.sh /usr/local/bin/wsd-entrypoint
USER 10001:10001
WORKDIR /workspace
VOLUME ["/workspace"]
ENV WSD_ROOT=/workspace \
    WSD_LISTEN=0.0.0.0:45678
EXPOSE 45678
# `wsd status` exits non-zero when the daemon is down or hung.
HEALTHCHECK --interval=30s --timeout=10s --start-period=10s --retries=3 \
  CMD ["wsd-entrypoint", "health", "--timeout", "5s"]
ENTRYPOINT ["tini", "--", "wsd-entrypoint"]

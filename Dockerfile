# syntax=docker/dockerfile:1
# The `marin3r` image: every subcommand (webhook, discovery-service, init-manager,
# shutdown-manager, …) in one static-ish binary on distroless, running as non-root.
#
#   docker build -t quay.io/marin3r-rs/marin3r:v0.1.0 .

FROM rust:1.95-bookworm AS builder
# protoc and the google/protobuf/*.proto includes compile Envoy's type registry
# (xds/build.rs).
RUN apt-get update \
    && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# `cargo fetch` downloads every package of the lock file: xds/build.rs runs
# `cargo metadata --frozen`, which needs all of them, not only those of `marin3r`.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo fetch --locked \
    && cargo build --release --locked -p marin3r \
    && install -m 0755 target/release/marin3r /marin3r \
    && install -m 0755 target/release/marin3r-shutdown-manager /marin3r-shutdown-manager

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /marin3r /marin3r
# `marin3r shutdown-manager` execs this smaller binary when it is next to /marin3r.
COPY --from=builder /marin3r-shutdown-manager /marin3r-shutdown-manager
# nonroot (65532); numeric so that Kubernetes' runAsNonRoot can verify it.
USER 65532:65532
ENTRYPOINT ["/marin3r"]

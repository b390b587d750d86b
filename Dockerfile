# syntax=docker/dockerfile:1
#
# One image with both meatspace binaries:
#   meatspace-api-server  (the default command)
#   meatspace-controller
#
#   docker build -t meatspace:0.1.0 .
#
# The Helm chart (deploy/helm/meatspace) runs this image as
# `<image.repository>:<image.tag>`, by default `meatspace:<chart appVersion>`
# (0.1.0), and picks the binary with `command:`. Push it under your
# registry's name and set image.repository accordingly.
#
# Image names here are unqualified (the builder's default registry).

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=trixie

# ---- build -------------------------------------------------------------------
FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS build
WORKDIR /src
COPY . .
# The cache mounts keep the registry and build artefacts between builds;
# the binaries are copied out of the cached target directory in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
        --bin meatspace-api-server --bin meatspace-controller \
 && mkdir -p /out \
 && cp target/release/meatspace-api-server target/release/meatspace-controller /out/

# ---- runtime -----------------------------------------------------------------
# Same Debian release as the builder, so the glibc the binaries link matches.
FROM debian:${DEBIAN_RELEASE}-slim
ARG APP_UID=10001
RUN groupadd --system --gid "${APP_UID}" meatspace \
 && useradd --system --uid "${APP_UID}" --gid meatspace --home-dir /var/lib/meatspace \
        --no-create-home --shell /usr/sbin/nologin meatspace \
 && install -d -o meatspace -g meatspace -m 0750 /var/lib/meatspace
COPY --from=build /out/meatspace-api-server /out/meatspace-controller /usr/local/bin/
# Without DATABASE_URL the API server keeps a SQLite file here; the chart
# always sets a PostgreSQL URL and a read-only root filesystem. Listening
# beyond loopback needs a public URL: the default suits
# `docker run -p 8080:8080`; the chart sets the real one.
ENV MEATSPACE_DATA_DIR=/var/lib/meatspace \
    MEATSPACE_LISTEN_ADDR=0.0.0.0:8080 \
    MEATSPACE_PUBLIC_URL=http://localhost:8080 \
    MEATSPACE_CONTROLLER_LISTEN_ADDR=0.0.0.0:9091
WORKDIR /var/lib/meatspace
# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER ${APP_UID}:${APP_UID}
EXPOSE 8080 9091
CMD ["meatspace-api-server"]

# The cloud-controller-manager image, the same as `hack/image` builds: static (musl) binaries on an empty
# base (scratch), run as 65532:65532, with /etc/passwd and /etc/group naming that user and a CA bundle for
# the aws provider's HTTPS client. The root filesystem is exactly
#   /usr/local/bin/cloud-controller-manager   the manager (the entrypoint)
#   /usr/local/bin/local-agent                the `local` cloud's node agent (loadBalancer.mode: agents),
#                                             run by its DaemonSet with this command
#   /etc/passwd, /etc/group, /etc/ssl/certs/ca-certificates.crt
# No shell, no libc.
#
# CI builds the same image without a container engine (none runs on this project's machines): `hack/image`
# assembles it with umoci into target/image/ and `hack/image --check` checks its config and runs the
# binaries from its unpacked root filesystem (docs/deploy.md, "The image"). This file is for building
# with an engine (docker, podman, buildah, kaniko); CI does not build it, and
# crates/cloud-controller-manager-bin/tests/dockerfile.rs checks that it runs the same build and names the
# same binaries, paths, files, user, entrypoint and labels as hack/image. What an engine adds that
# hack/image's image has not: an Env with PATH (BuildKit gives every image it builds from scratch one; a
# Dockerfile cannot remove it) and WorkingDir /.
#
#   docker build --build-arg CCM_GIT_COMMIT=$(git rev-parse --short=12 HEAD) -t cloud-controller-manager .
#   docker build --build-arg FEATURES=provider-aws --build-arg TITLE=cloud-controller-manager-aws \
#     --build-arg CCM_GIT_COMMIT=... -t cloud-controller-manager-aws .      # the aws provider
FROM rust:1.95-bookworm AS build
# ring's C code is compiled with musl-gcc for the musl target. cargo-auditable records the crates
# compiled into each binary in it (an ELF section image scanners read), as hack/image does; its version is
# the one hack/cargo-tools pins.
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && rustup target add x86_64-unknown-linux-musl \
    && cargo install --locked --version =0.7.7 cargo-auditable
WORKDIR /src
COPY . .
# `--version` names the commit; the build context has no .git (.dockerignore).
ARG CCM_GIT_COMMIT=unknown
# Extra provider features, e.g. `provider-aws` (the default features link `fake` and `local`).
ARG FEATURES=
RUN CCM_GIT_COMMIT=$CCM_GIT_COMMIT CC_x86_64_unknown_linux_musl=musl-gcc \
    cargo auditable build --release --locked --target x86_64-unknown-linux-musl -p cloud-controller-manager-bin \
        ${FEATURES:+--features "$FEATURES"} \
    && install -D -m 0755 target/x86_64-unknown-linux-musl/release/cloud-controller-manager \
        /rootfs/usr/local/bin/cloud-controller-manager \
    && install -D -m 0755 target/x86_64-unknown-linux-musl/release/local-agent \
        /rootfs/usr/local/bin/local-agent \
    && install -D -m 0644 /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/ca-certificates.crt \
    && printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
        > /rootfs/etc/passwd \
    && printf 'root:x:0:\nnonroot:x:65532:\n' > /rootfs/etc/group \
    && chmod 0644 /rootfs/etc/passwd /rootfs/etc/group \
    && find /rootfs -type d -exec chmod 0755 {} +

FROM scratch
COPY --from=build /rootfs/ /
ARG CCM_GIT_COMMIT=unknown
# hack/image's labels: the title is the image's name (cloud-controller-manager-aws for the aws variant),
# the version, licenses and source the crate's (tests/dockerfile.rs checks them against Cargo.toml), the
# revision the commit. Not org.opencontainers.image.created, which hack/image sets to the commit's time
# and a build without .git does not know (the engine records the build's time in the config).
ARG TITLE=cloud-controller-manager
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title=$TITLE \
      org.opencontainers.image.description="The Kubernetes cloud-controller-manager, in Rust" \
      org.opencontainers.image.version=$VERSION \
      org.opencontainers.image.revision=$CCM_GIT_COMMIT \
      org.opencontainers.image.licenses=Apache-2.0 \
      org.opencontainers.image.source=https://example.invalid/ccm-rs
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/cloud-controller-manager"]

# The cloud-controller-manager image: a static (musl) binary on an empty base (scratch), run as
# 65532:65532, with /etc/passwd and /etc/group naming that user and a CA bundle for the aws provider's
# HTTPS client. No shell, no libc.
#
# CI builds the same image without a Docker engine (none runs on this project's machines): `hack/image`
# assembles it with umoci into target/image/ and `hack/image --check` checks its config and runs the
# binary from its unpacked root filesystem (docs/deploy.md, "The image"). This file is for building
# with an engine (docker, podman, buildah, kaniko); CI does not build it.
#
#   docker build --build-arg CCM_GIT_COMMIT=$(git rev-parse --short=12 HEAD) -t cloud-controller-manager .
#   docker build --build-arg FEATURES=provider-aws ... -t cloud-controller-manager-aws .   # the aws provider
FROM rust:1.95-bookworm AS build
# ring's C code is compiled with musl-gcc for the musl target.
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
# `--version` names the commit; the build context may have no .git.
ARG CCM_GIT_COMMIT=unknown
# Extra provider features, e.g. `provider-aws` (the default features link `fake` and `local`).
ARG FEATURES=
RUN CCM_GIT_COMMIT=$CCM_GIT_COMMIT CC_x86_64_unknown_linux_musl=musl-gcc \
    cargo build --release --locked --target x86_64-unknown-linux-musl -p cloud-controller-manager-bin \
        ${FEATURES:+--features "$FEATURES"} \
    && install -D -m 0755 target/x86_64-unknown-linux-musl/release/cloud-controller-manager \
        /rootfs/usr/local/bin/cloud-controller-manager \
    && install -D -m 0644 /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/ca-certificates.crt \
    && printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
        > /rootfs/etc/passwd \
    && printf 'root:x:0:\nnonroot:x:65532:\n' > /rootfs/etc/group

FROM scratch
COPY --from=build /rootfs/ /
ARG CCM_GIT_COMMIT=unknown
LABEL org.opencontainers.image.title=cloud-controller-manager \
      org.opencontainers.image.revision=$CCM_GIT_COMMIT
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/cloud-controller-manager"]

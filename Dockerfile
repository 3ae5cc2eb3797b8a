# The cloud-controller-manager image (with the providers its default features link; build your own
# provider's binary the same way). No Docker engine runs on this project's machines, so CI does not build
# it; `cargo build --release` is what it wraps.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# `--version` names the commit; the build context may have no .git (docker build --build-arg CCM_GIT_COMMIT=$(git rev-parse --short=12 HEAD)).
ARG CCM_GIT_COMMIT=unknown
RUN CCM_GIT_COMMIT=$CCM_GIT_COMMIT cargo build --release --locked -p cloud-controller-manager-bin

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/cloud-controller-manager /usr/local/bin/cloud-controller-manager
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/cloud-controller-manager"]

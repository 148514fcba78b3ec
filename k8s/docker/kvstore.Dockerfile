# syntax=docker/dockerfile:1
# dtrain kvstore shard: Debian slim with the shared libraries the binary needs.
#   docker build -f k8s/docker/kvstore.Dockerfile -t $REGISTRY/dtrain/kvstore:$TAG .
# Build arguments (tools/images sets them; the defaults are the public images):
#   BUILD_BASE, RUNTIME_BASE  the Debian bookworm images of the two stages
#   BINARIES=build            compile with Bazel in the build stage (default);
#   BINARIES=prebuilt         take the binaries from the build context instead,
#                             a directory laid out like the build stage's /out
#                             (tools/images: this machine's Bazel outputs)
ARG BUILD_BASE=debian:bookworm
ARG RUNTIME_BASE=debian:bookworm-slim
ARG BINARIES=build

FROM ${BUILD_BASE} AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      bazel-bootstrap g++ pkg-config libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev \
      protobuf-compiler libabsl-dev prometheus-cpp-dev zlib1g-dev python3 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN bazel build -c opt //services/kvstore:kvstore_server \
 && install -D bazel-bin/services/kvstore/kvstore_server /out/kvstore_server

FROM scratch AS prebuilt
COPY . /out/

FROM ${BINARIES} AS binaries

FROM ${RUNTIME_BASE}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libprometheus-cpp-pull1.0 \
      libprometheus-cpp-core1.0 libcivetweb1 zlib1g \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/dtrain/kvstore && chown 65532:65532 /var/lib/dtrain/kvstore
COPY --from=binaries /out/kvstore_server /usr/local/bin/
USER 65532:65532
EXPOSE 7070 9401
ENTRYPOINT ["/usr/local/bin/kvstore_server"]
CMD ["--listen=0.0.0.0:7070", "--metrics_listen=0.0.0.0:9401", "--data_dir=/var/lib/dtrain/kvstore"]

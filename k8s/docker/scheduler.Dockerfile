# syntax=docker/dockerfile:1
# dtrain scheduler: Debian slim with the shared libraries the binary needs.
#   docker build -f k8s/docker/scheduler.Dockerfile -t $REGISTRY/dtrain/scheduler:$TAG .
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
      protobuf-compiler libabsl-dev prometheus-cpp-dev zlib1g-dev libpng-dev libturbojpeg0-dev \
      libjpeg62-turbo-dev libdnnl-dev python3 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN bazel build -c opt //services/scheduler:scheduler_server //services/trainctl:trainctl \
 && install -D bazel-bin/services/scheduler/scheduler_server /out/scheduler_server \
 && install -D bazel-bin/services/trainctl/trainctl /out/trainctl

FROM scratch AS prebuilt
COPY . /out/

FROM ${BINARIES} AS binaries

FROM ${RUNTIME_BASE}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libprometheus-cpp-pull1.0 \
      libprometheus-cpp-core1.0 libcivetweb1 zlib1g libpng16-16 libturbojpeg0 libjpeg62-turbo \
      libdnnl2 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/dtrain/scheduler && chown 65532:65532 /var/lib/dtrain/scheduler
COPY --from=binaries /out/scheduler_server /out/trainctl /usr/local/bin/
USER 65532:65532
EXPOSE 7000 9400
ENTRYPOINT ["/usr/local/bin/scheduler_server"]
CMD ["--listen=0.0.0.0:7000", "--metrics_listen=0.0.0.0:9400", "--data_dir=/var/lib/dtrain/scheduler"]

# syntax=docker/dockerfile:1
# dtrain trainer daemon on NVIDIA's CUDA runtime image with cuDNN (NCCL comes
# with it). Built on Debian bookworm like the rest (the workspace uses
# Debian's gRPC/Abseil/oneDNN); the Debian shared libraries it needs that the
# Ubuntu base lacks or has at other versions are copied next to the binary
# (RPATH-free: LD_LIBRARY_PATH). The same image serves the cpu overlay: the
# CUDA libraries load without a GPU and --devices=cpu trains on the CPU.
# Fashion-MNIST (Debian's dataset-fashion-mnist) is in the image.
#   docker build -f k8s/docker/trainer.Dockerfile -t $REGISTRY/dtrain/trainer:$TAG .
# Build arguments (tools/images sets them; the defaults are the public images):
#   CUDA_DEVEL_IMAGE, CUDA_RUNTIME_IMAGE  the CUDA toolkit of the build stage and
#                             the runtime base (tools/images: stand-ins made from
#                             this machine's /usr/local/cuda)
#   CUDA_RUNTIME_PACKAGES     apt packages added to the runtime base (NVIDIA's
#                             repository; empty for a base that has them)
#   BUILD_BASE                the Debian bookworm image of the build stage
#   BINARIES=build            compile with Bazel in the build stage (default);
#   BINARIES=prebuilt         take bin/, lib/ and datasets/ from the build
#                             context instead, laid out like the build stage's
#                             /out (tools/images: this machine's Bazel outputs)
ARG CUDA_VERSION=13.0.0
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:${CUDA_VERSION}-cudnn-devel-ubuntu24.04
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:${CUDA_VERSION}-cudnn-runtime-ubuntu24.04
ARG BUILD_BASE=debian:bookworm
ARG BINARIES=build

FROM ${CUDA_DEVEL_IMAGE} AS cuda

FROM ${BUILD_BASE} AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      bazel-bootstrap g++ pkg-config libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev \
      protobuf-compiler libabsl-dev prometheus-cpp-dev libdnnl-dev zlib1g-dev libpng-dev \
      libturbojpeg0-dev libjpeg62-turbo-dev \
      dataset-fashion-mnist python3 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=cuda /usr/local/cuda /usr/local/cuda
WORKDIR /src
COPY . .
RUN bazel build -c opt //services/trainer:trainer \
 && install -D bazel-bin/services/trainer/trainer /out/bin/trainer \
 && mkdir -p /out/lib /out/datasets \
 && ldd /out/bin/trainer | awk '/=> \// {print $3}' \
      | grep -vE '/usr/local/cuda|/libc\.so|/libm\.so|/libdl\.so|/librt\.so|/libpthread\.so|/ld-linux' \
      | xargs -I{} cp -L {} /out/lib/ \
 && cp -r /usr/share/datasets/fashion-mnist /out/datasets/

FROM scratch AS prebuilt
COPY . /out/

FROM ${BINARIES} AS binaries

FROM ${CUDA_RUNTIME_IMAGE}
ARG CUDA_RUNTIME_PACKAGES=libcublas-13-0
RUN if [ -n "$CUDA_RUNTIME_PACKAGES" ]; then \
      apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        $CUDA_RUNTIME_PACKAGES && rm -rf /var/lib/apt/lists/*; \
    fi \
 && mkdir -p /var/lib/dtrain/checkpoints && chown 65532:65532 /var/lib/dtrain/checkpoints
COPY --from=binaries /out/bin/trainer /usr/local/bin/trainer
COPY --from=binaries /out/lib/ /opt/dtrain/lib/
COPY --from=binaries /out/datasets/fashion-mnist /usr/share/datasets/fashion-mnist
ENV LD_LIBRARY_PATH=/opt/dtrain/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/trainer"]
CMD ["--devices=cpu", "--work_dir=/var/lib/dtrain/checkpoints"]

# syntax=docker/dockerfile:1
# dtrain trainer daemon on NVIDIA's CUDA runtime image with cuDNN (NCCL comes
# with it). Built on Debian bookworm like the rest (the workspace uses
# Debian's gRPC/Abseil/oneDNN); the Debian shared libraries it needs that the
# Ubuntu base lacks or has at other versions are copied next to the binary
# (RPATH-free: LD_LIBRARY_PATH). The same image serves the cpu overlay: the
# CUDA libraries load without a GPU and --devices=cpu trains on the CPU.
# Fashion-MNIST (Debian's dataset-fashion-mnist) is in the image.
#   docker build -f k8s/docker/trainer.Dockerfile -t $REGISTRY/dtrain/trainer:$TAG .
ARG CUDA_VERSION=13.0.0
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-devel-ubuntu24.04 AS cuda

FROM debian:bookworm AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      bazel-bootstrap g++ pkg-config libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev \
      protobuf-compiler libabsl-dev prometheus-cpp-dev libdnnl-dev zlib1g-dev \
      dataset-fashion-mnist python3 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=cuda /usr/local/cuda /usr/local/cuda
WORKDIR /src
COPY . .
RUN bazel build -c opt //services/trainer:trainer \
 && install -D bazel-bin/services/trainer/trainer /out/bin/trainer \
 && mkdir -p /out/lib \
 && ldd /out/bin/trainer | awk '/=> \// {print $3}' \
      | grep -vE '/usr/local/cuda|/libc\.so|/libm\.so|/libdl\.so|/librt\.so|/libpthread\.so|/ld-linux' \
      | xargs -I{} cp -L {} /out/lib/

FROM nvidia/cuda:${CUDA_VERSION}-cudnn-runtime-ubuntu24.04
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libcublas-13-0 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/dtrain/checkpoints && chown 65532:65532 /var/lib/dtrain/checkpoints
COPY --from=build /out/bin/trainer /usr/local/bin/trainer
COPY --from=build /out/lib/ /opt/dtrain/lib/
COPY --from=build /usr/share/datasets/fashion-mnist /usr/share/datasets/fashion-mnist
ENV LD_LIBRARY_PATH=/opt/dtrain/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/trainer"]
CMD ["--devices=cpu", "--work_dir=/var/lib/dtrain/checkpoints"]

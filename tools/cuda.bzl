"""cuda_library: .cu files compiled by nvcc into a cc_library.

Code for sm_80 (A100) and sm_90 (H100/H200) plus compute_90 PTX, so newer GPUs
JIT-compile it. The result links into ordinary cc_binary/cc_test targets and
runs on machines without a GPU (the CUDA runtime then reports no device).

    cuda_library(
        name = "kernels",
        srcs = ["add.cu"],
        hdrs = ["add.h"],          # headers the .cu files and users include
        deps = ["//libs/base"],    # C++ deps of the host code around it
    )
"""

NVCC = "/usr/local/cuda/bin/nvcc"

CUDA_ARCH_FLAGS = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

def cuda_library(name, srcs, hdrs = [], cuda_hdrs = [], deps = [], nvcc_flags = [], visibility = None, **kwargs):
    objs = []
    for src in srcs:
        if not src.endswith(".cu"):
            fail("cuda_library srcs must be .cu files, got " + src)
        obj = "_objs/%s/%s.o" % (name, src[:-len(".cu")])
        objs.append(obj)
        native.genrule(
            name = "%s_nvcc_%s" % (name, src.replace("/", "_").replace(".", "_")),
            srcs = [src] + hdrs + cuda_hdrs,
            outs = [obj],
            cmd = " ".join([
                NVCC,
                "-c",
                "-std=c++17",
                "-O3",
                "--expt-relaxed-constexpr",
                "-Xcompiler=-fPIC",
                "-I.",
                "-I$(GENDIR)",
                "-I/usr/local/cuda/include",
            ] + CUDA_ARCH_FLAGS + nvcc_flags + [
                "-o $@",
                "$(location %s)" % src,
            ]),
            message = "nvcc " + src,
        )
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        visibility = visibility,
        **kwargs
    )

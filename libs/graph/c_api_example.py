#!/usr/bin/python3
"""Runs a saved dtrain model from Python through the C ABI (c_api.h), with
ctypes only: no dtrain Python package, no model code.

    bazel build //libs/graph:libdtrain_c.so //libs/graph:hybridize_bench
    bazel-bin/libs/graph/hybridize_bench --iters 1 --reps 1 --save /tmp/mlp.dtmodel
    libs/graph/c_api_example.py bazel-bin/libs/graph/libdtrain_c.so /tmp/mlp.dtmodel 1,512

Feeds the input element i = sin(0.01 * i) (as run_saved_model does without
--input) and prints the output. Exits 1 with dt_last_error() on failure.
"""
import ctypes
import math
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    lib_path, model_path, shape_arg = sys.argv[1:]
    lib = ctypes.CDLL(lib_path)
    lib.dt_model_load.restype = ctypes.c_void_p
    lib.dt_model_load.argtypes = [ctypes.c_char_p]
    lib.dt_model_run.restype = ctypes.c_int
    lib.dt_model_run.argtypes = [
        ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int64),
        ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_int64,
        ctypes.POINTER(ctypes.c_int64)]
    lib.dt_model_free.argtypes = [ctypes.c_void_p]
    lib.dt_last_error.restype = ctypes.c_char_p

    model = lib.dt_model_load(model_path.encode())
    if not model:
        sys.exit("load failed: " + lib.dt_last_error().decode())
    try:
        dims = [int(d) for d in shape_arg.split(",")]
        count = math.prod(dims)
        x = (ctypes.c_float * count)(*[math.sin(0.01 * i) for i in range(count)])
        shape = (ctypes.c_int64 * len(dims))(*dims)
        capacity = ctypes.c_int64(0)
        needed = ctypes.c_int64(0)
        out = (ctypes.c_float * 1)()
        # First call with no room: learn the output size, then run for real.
        if lib.dt_model_run(model, x, shape, len(dims), out, capacity, ctypes.byref(needed)) != 0:
            if needed.value <= 0:
                sys.exit("run failed: " + lib.dt_last_error().decode())
        out = (ctypes.c_float * needed.value)()
        if lib.dt_model_run(model, x, shape, len(dims), out, needed, ctypes.byref(needed)) != 0:
            sys.exit("run failed: " + lib.dt_last_error().decode())
        print("output=" + " ".join("%.9g" % v for v in out))
    finally:
        lib.dt_model_free(model)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Prints, one per line, the library folders of the NVIDIA wheels (cuDNN,
cuBLAS, NCCL, the CUDA runtime) installed for this Python: the lib/ and
lib64/ folders under site-packages/nvidia/*/ that hold shared libraries.
Used by tools/gpu-check on the GPU machine, where these wheels (PyTorch's
dependencies) are the only cuDNN and NCCL there are.

Looks through the `nvidia` namespace package's paths first, then globs every
site-packages folder. Prints nothing (exit 0) when there are none.
"""
import glob
import os
import site
import sys


def candidates():
    roots = []
    try:
        import nvidia  # namespace package of the NVIDIA wheels

        roots.extend(list(getattr(nvidia, "__path__", [])))
    except ImportError:
        pass
    paths = []
    try:
        paths.extend(site.getsitepackages())
    except AttributeError:
        pass
    try:
        paths.append(site.getusersitepackages())
    except AttributeError:
        pass
    paths.extend(p for p in sys.path if p.endswith("-packages"))
    for p in paths:
        roots.append(os.path.join(p, "nvidia"))
    seen = set()
    for root in roots:
        for d in sorted(glob.glob(os.path.join(root, "*", "lib*"))):
            real = os.path.realpath(d)
            if real in seen or not os.path.isdir(real):
                continue
            if glob.glob(os.path.join(real, "*.so*")):
                seen.add(real)
                yield real


def main():
    for d in candidates():
        print(d)


if __name__ == "__main__":
    main()

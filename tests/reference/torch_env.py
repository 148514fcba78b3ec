#!/usr/bin/python3
"""One key=value line describing the PyTorch build the numbers came from.

Debian's torch 1.13 is built with BLAS_INFO=generic and links libblas.so.3;
on this machine that resolves to the reference (netlib) BLAS, which is
unoptimized and single-threaded, so Linear layers (addmm) are much slower
than in a pip/MKL build. Convolutions go through oneDNN (mkldnn) and are
fast. Always quote this line next to PyTorch throughput figures.
"""
import os
import re
import subprocess

import torch


def describe():
    cfg = torch.__config__.show()
    m = re.search(r"BLAS_INFO=([^,\s]+)", cfg)
    blas_info = m.group(1) if m else "unknown"
    libs = set()
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                base = os.path.basename(path)
                if re.search(r"blas|mkl_|libdnnl", base):
                    libs.add(os.path.realpath(path))
    except OSError:
        pass
    try:
        deb = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", "python3-torch"],
            capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        deb = ""
    return ("torch_version=%s debian_python3_torch=%s blas_info=%s mkldnn=%s torch_threads=%d "
            "linked=%s" % (torch.__version__, deb or "none", blas_info,
                           torch.backends.mkldnn.is_available(),
                           torch.get_num_threads(),
                           ",".join(sorted(libs)) or "none"))


if __name__ == "__main__":
    print(describe())

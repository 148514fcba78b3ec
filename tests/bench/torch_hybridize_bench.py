#!/usr/bin/python3
"""The chapter's hybridize experiment in PyTorch: eager vs torch.jit.script.

    /usr/bin/python3 tests/bench/torch_hybridize_bench.py [--iters 1000] [--reps 5]

Model: mlp_chapter (Linear(512,256), ReLU, Linear(256,128), ReLU,
Linear(128,2)), PyTorch default init (torch.manual_seed(0)), input x of
shape [1,512] from torch.randn (batch 1), one thread
(torch.set_num_threads(1)), under torch.no_grad(). For each variant
(eager nn.Sequential, then torch.jit.script of the same module) it runs
20 warm-up calls (the JIT profiling executor optimizes during the first
calls), then --reps repetitions of --iters forward passes, and reports the
best repetition as microseconds per forward. It also checks that both
variants give the same output.

Output (key=value):
    framework=pytorch eager_us_per_forward=<n>
    framework=pytorch jit_us_per_forward=<n>
plus informational lines (build/BLAS, all repetitions, speedup). Note that
Debian's torch does Linear layers with the generic reference BLAS.
"""
import argparse
import os
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "reference"))

import torch  # noqa: E402

import models  # noqa: E402
import torch_env  # noqa: E402


def bench(net, x, iters, reps, warmup=20):
    for _ in range(warmup):
        net(x)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            net(x)
        times.append(time.perf_counter() - t0)
    return [1e6 * t / iters for t in times]


def main():
    ap = argparse.ArgumentParser(description="eager vs torch.jit.script")
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = models.mlp_chapter().eval()
    x = torch.randn(size=(1, 512))
    with torch.no_grad():
        eager = bench(net, x, args.iters, args.reps)
        scripted = torch.jit.script(net)
        jit = bench(scripted, x, args.iters, args.reps)
        same = torch.allclose(net(x), scripted(x), rtol=1e-5, atol=1e-6)

    print(torch_env.describe())
    print("iters=%d reps=%d outputs_match=%s" % (args.iters, args.reps, same))
    print("eager_us_all=%s" % ",".join("%.2f" % t for t in eager))
    print("jit_us_all=%s" % ",".join("%.2f" % t for t in jit))
    print("jit_speedup=%.3f" % (min(eager) / min(jit)))
    print("framework=pytorch eager_us_per_forward=%.2f" % min(eager))
    print("framework=pytorch jit_us_per_forward=%.2f" % min(jit))


if __name__ == "__main__":
    main()

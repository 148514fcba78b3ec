#!/usr/bin/env python3
"""PyTorch side of tools/gpu-check: training throughput of the chapter's
ResNet-18 (tests/reference/models.py) on one GPU, in the precisions that
//libs/cuda:gpu_train_bench measures, with the same step:

    python3 tools/gpu/torch_resnet_bench.py --precisions fp32,tf32,bf16 \
        --batch_size 256 --steps 30 --warmup 5

Each step: zero_grad, forward, mean cross-entropy, backward, SGD step
(torch.optim.SGD, lr 0.1, no momentum; d2l's normal(0, 0.01) init), on a pool
of 8 random batches made on the GPU (uniform [0, 1), labels (j * 7 + i) % 10),
cycled. cudnn.benchmark is on (dtrain times cuDNN's algorithms too).
  fp32  allow_tf32 off for cuBLAS and cuDNN
  tf32  allow_tf32 on for both
  bf16  torch.autocast(bfloat16) with f32 weights (PyTorch's usual mixed
        precision; dtrain instead keeps bf16 parameter copies and f32 masters)
--compile: the model wrapped in torch.compile (TorchInductor, Triton kernels;
the second anchor of issue 34); compilation happens in the warmup steps
(warmup_seconds says how long), the timed steps run the compiled code.
Lines then say framework=pytorch_compile.

FLOPs: 2 x multiply-adds of every Conv2d and Linear in one forward pass,
counted with forward hooks on a batch of 2, times 3 for forward + backward,
the same rule as gpu_train_bench (whose count is analytic: the two must
agree, and tools/gpu-check prints both).

Output: key=value lines, one group per precision, each ending in
samples_per_second=<n>.
"""
import argparse
import contextlib
import os
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "reference"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import models  # noqa: E402


def forward_flops_per_sample(model, input_shape, device):
    macs = [0]
    n = 2

    def conv_hook(mod, inp, out):
        kh, kw = mod.kernel_size
        macs[0] += out.numel() // n * (mod.in_channels // mod.groups) * kh * kw

    def linear_hook(mod, inp, out):
        macs[0] += out.numel() // n * mod.in_features

    hooks = []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            hooks.append(m.register_forward_hook(conv_hook))
        elif isinstance(m, nn.Linear):
            hooks.append(m.register_forward_hook(linear_hook))
    with torch.no_grad():
        model(torch.zeros((n,) + tuple(input_shape), device=device))
    for h in hooks:
        h.remove()
    return 2 * macs[0]


def run(args, precision, device):
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(args.seed)
    model = models.build(args.model)
    models.init_d2l(model)
    model.to(device).train()
    fwd_flops = forward_flops_per_sample(model, models.input_shape(args.model), device)
    if args.compile:
        model = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    classes = models.num_classes(args.model)
    g = torch.Generator(device=device).manual_seed(args.seed + 1)
    xs, ys = [], []
    for i in range(8):
        xs.append(torch.rand((args.batch_size,) + models.input_shape(args.model),
                             generator=g, device=device))
        ys.append(torch.tensor([(j * 7 + i) % classes for j in range(args.batch_size)],
                               device=device))
    autocast = (lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16)) \
        if precision == "bf16" else contextlib.nullcontext

    def step(i):
        with autocast():
            loss = F.cross_entropy(model(xs[i % 8]), ys[i % 8])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    t0 = time.perf_counter()
    loss = None
    for i in range(args.warmup):
        loss = step(i)
    torch.cuda.synchronize(device)
    first = float(loss) if loss is not None else 0.0
    t1 = time.perf_counter()
    for i in range(args.steps):
        loss = step(args.warmup + i)
    torch.cuda.synchronize(device)
    t2 = time.perf_counter()
    secs = t2 - t1
    sps = args.batch_size * args.steps / secs
    train_flops = 3 * fwd_flops
    print("framework=%s model=%s precision=%s batch_size=%d device=%s"
          % ("pytorch_compile" if args.compile else "pytorch", args.model, precision,
             args.batch_size, device))
    print("warmup_steps=%d warmup_seconds=%.3f first_loss=%.4f"
          % (args.warmup, t1 - t0, first))
    print("steps=%d seconds=%.3f ms_per_step=%.3f last_loss=%.4f"
          % (args.steps, secs, 1000 * secs / args.steps, float(loss)))
    print("forward_flops_per_sample=%d train_flops_per_sample=%d" % (fwd_flops, train_flops))
    print("tflops=%.2f" % (train_flops * sps / 1e12))
    print("peak_memory_mb=%.1f" % (torch.cuda.max_memory_allocated(device) / 1048576.0))
    print("samples_per_second=%.1f" % sps, flush=True)
    del model, opt, xs, ys
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet18", choices=("mlp", "lenet", "resnet18"))
    ap.add_argument("--batch_size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--precisions", default="fp32,tf32,bf16")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("framework=pytorch status=skipped reason=no_cuda_device", flush=True)
        sys.stderr.write("torch_resnet_bench: torch sees no CUDA device\n")
        return 3
    device = torch.device(args.device)
    print("torch_version=%s cuda=%s cudnn=%s gpu=\"%s\"" % (
        torch.__version__, torch.version.cuda, torch.backends.cudnn.version(),
        torch.cuda.get_device_name(device)), flush=True)
    for p in args.precisions.split(","):
        if p not in ("fp32", "tf32", "bf16"):
            sys.stderr.write("torch_resnet_bench: unknown precision %r\n" % p)
            return 2
        run(args, p, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())

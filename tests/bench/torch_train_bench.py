#!/usr/bin/python3
"""PyTorch (CPU) training throughput for the chapter's models.

    /usr/bin/python3 tests/bench/torch_train_bench.py --model lenet \
        --batch_size 256 --steps 50 --warmup 5 --threads 2 [--data]

Each step is one SGD minibatch step (zero_grad, forward, mean softmax
cross-entropy, backward, optimizer step) in train mode. The first --warmup
steps are not timed; the next --steps are, and
samples_per_second = steps * batch_size / timed seconds.

Data: random inputs of the right shape (uniform [0,1), labels uniform 0..9,
a pool of 8 batches generated up front and cycled) unless --data is given,
in which case real Fashion-MNIST training images are read (gzip IDX files,
pixels / 255) and visited in dtrain's deterministic order
(epoch_order(60000, seed, epoch)), batches = consecutive slices; gathering a
batch (a tensor index) is inside the timed loop.

Init: d2l's init_weights by default (--init d2l): normal(0, 0.01) on every
Linear/Conv2d weight, biases zero, BatchNorm gamma 1 / beta 0; --init torch
keeps PyTorch's default init. Optimizer: torch.optim.SGD(lr=--lr, default
0.1 for throughput; the chapter uses 0.2 for LeNet), no momentum or decay.

Note: Debian's torch uses the generic (reference netlib) BLAS here, so
Linear-heavy models (mlp) are slow; the first output line says which BLAS
was linked (see tests/reference/torch_env.py).

Output: key=value lines; the last two are
    framework=pytorch model=<m> batch_size=<b> threads=<t> samples_per_second=<n>
    peak_rss_mb=<n>          (resource.getrusage(RUSAGE_SELF).ru_maxrss / 1024)
"""
import argparse
import os
import resource
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "reference"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import models  # noqa: E402
import torch_env  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(
        description="PyTorch CPU training throughput (dtrain comparison)")
    ap.add_argument("--model", choices=("mlp", "lenet", "resnet18"),
                    required=True)
    ap.add_argument("--batch_size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20,
                    help="timed steps (after warm-up)")
    ap.add_argument("--warmup", type=int, default=3,
                    help="untimed steps before timing")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch.set_num_threads")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--init", choices=("d2l", "torch"), default="d2l")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", nargs="?", const="/usr/share/datasets/"
                    "fashion-mnist", default=None, metavar="DIR",
                    help="use real Fashion-MNIST (default dir: %(const)s)")
    return ap.parse_args()


class RandomBatches:
    def __init__(self, model_name, batch_size, seed, pool=8):
        g = torch.Generator().manual_seed(seed + 1)
        shape = (pool, batch_size) + models.input_shape(model_name)
        self.x = torch.rand(shape, generator=g)
        self.y = torch.randint(0, models.num_classes(model_name),
                               (pool, batch_size), generator=g)
        self.i = 0

    def next(self):
        k = self.i % self.x.shape[0]
        self.i += 1
        return self.x[k], self.y[k]


class FashionBatches:
    def __init__(self, data_dir, batch_size, seed):
        import fashion_mnist
        from epoch_order_ref import load_epoch_order
        x, y = fashion_mnist.load("train", data_dir)
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)
        self.epoch_order, self.order_source = load_epoch_order()
        self.batch_size, self.seed = batch_size, seed
        self.epoch, self.pos = 0, 0
        self._new_epoch()

    def _new_epoch(self):
        self.order = torch.tensor(
            self.epoch_order(self.x.shape[0], self.seed, self.epoch),
            dtype=torch.int64)
        self.pos = 0

    def next(self):
        if self.pos >= self.order.numel():
            self.epoch += 1
            self._new_epoch()
        idx = self.order[self.pos:self.pos + self.batch_size]
        self.pos += self.batch_size
        return self.x[idx], self.y[idx]


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = models.build(args.model)
    if args.init == "d2l":
        models.init_d2l(model)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    if args.data:
        batches = FashionBatches(args.data, args.batch_size, args.seed)
        data_desc = "fashion-mnist"
    else:
        batches = RandomBatches(args.model, args.batch_size, args.seed)
        data_desc = "random"

    def step():
        x, y = batches.next()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    nparams = sum(p.numel() for p in model.parameters())
    print("%s numpy_version=%s" % (torch_env.describe(), np.__version__))
    print("model=%s params=%d init=%s lr=%g data=%s seed=%d" % (
        args.model, nparams, args.init, args.lr, data_desc, args.seed))
    if args.data:
        print("data_order=%s" % batches.order_source)

    t0 = time.perf_counter()
    loss = None
    for _ in range(args.warmup):
        loss = step()
    if loss is not None:
        loss.item()
    warm_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    last_loss = loss.item() if loss is not None else float("nan")
    secs = time.perf_counter() - t0

    sps = args.steps * args.batch_size / secs if secs > 0 else 0.0
    print("warmup_steps=%d warmup_seconds=%.4f" % (args.warmup, warm_s))
    print("steps=%d seconds=%.4f ms_per_step=%.3f last_loss=%.6f" % (
        args.steps, secs, 1000.0 * secs / max(args.steps, 1), last_loss))
    print("framework=pytorch model=%s batch_size=%d threads=%d "
          "samples_per_second=%.1f" % (args.model, args.batch_size,
                                       args.threads, sps))
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print("peak_rss_mb=%.1f" % (rss_kb / 1024.0))


if __name__ == "__main__":
    main()

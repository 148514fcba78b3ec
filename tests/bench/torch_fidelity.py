#!/usr/bin/python3
"""The chapter's LeNet training on Fashion-MNIST, in PyTorch (CPU), visiting
the data in dtrain's deterministic order -- the accuracy reference for the
C++ trainer.

    /usr/bin/python3 tests/bench/torch_fidelity.py [--epochs 10] \
        [--threads 2] [--seed 0] [--data DIR] [--init_from CKPT]

Setup (multi-GPU-from-scratch section, one device):
  * model: models.lenet() (Conv2d(1,20,3), ReLU, AvgPool2d(2),
    Conv2d(20,50,5), ReLU, AvgPool2d(2), Flatten, Linear(800,128), ReLU,
    Linear(128,10));
  * init: torch.manual_seed(seed), then normal(0, 0.01) on every Conv2d and
    Linear weight in module order, all biases zero (d2l's init_weights /
    the section's `randn(...) * 0.01` and `zeros(...)`);
    with --init_from CKPT the weights are instead loaded from a dtrain
    checkpoint (train_local --save_initial=CKPT), matched by state_dict
    name: every model parameter/buffer must be present with exactly the
    same shape and dtype float32, and the checkpoint may hold nothing else
    (optimizer state, e.g. "<param>.momentum_buffer", excepted); otherwise
    the script exits with status 1 naming the problem. This starts PyTorch
    from dtrain's exact initial weights (tests/bench/compare_fidelity.sh);
  * data: Fashion-MNIST train (60000) / t10k (10000) from Debian's gzip IDX
    files, pixels / 255, no normalization;
  * order: for printed epoch e (1-based) the training samples are visited in
    epoch_order(60000, seed, e - 1) (libs/data/epoch_order.py, falling back
    to tests/reference/epoch_order_ref.py), minibatches are consecutive
    slices of 256 of that order, the last partial batch (96) is kept;
  * step: mean softmax cross-entropy, loss.backward(), plain SGD lr 0.2
    (equivalent to the section's summed loss + d2l.sgd dividing by the
    minibatch size), no momentum / weight decay.
Per epoch it prints
    epoch=<e> loss=<l> train_acc=<a> test_acc=<t> seconds=<s>
loss / train_acc: mean training loss and accuracy over the epoch's
minibatches as they were trained (weighted by batch size, like d2l's
train_ch6); test_acc: accuracy on t10k after the epoch (eval mode,
no_grad, batches of 256); seconds: wall time of the epoch's training loop
(evaluation excluded). Lines starting with '#' describe the run.
"""
import argparse
import datetime
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "reference"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import fashion_mnist  # noqa: E402
import models  # noqa: E402
import torch_env  # noqa: E402
from torch_util import evaluate, load_dtrain_state, train_epoch  # noqa: E402
from epoch_order_ref import load_epoch_order  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description="LeNet fidelity reference")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch_size", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--data", default=fashion_mnist.DEFAULT_DIR)
    ap.add_argument("--init_from", default=None, metavar="CKPT",
                    help="start from the weights in this dtrain checkpoint "
                    "(train_local --save_initial) instead of torch's RNG")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    epoch_order, order_src = load_epoch_order()
    xtr, ytr = fashion_mnist.load("train", args.data)
    xte, yte = fashion_mnist.load("t10k", args.data)
    xtr, ytr = torch.from_numpy(xtr), torch.from_numpy(ytr)
    xte, yte = torch.from_numpy(xte), torch.from_numpy(yte)
    n = xtr.shape[0]

    torch.manual_seed(args.seed)
    model = models.init_d2l(models.lenet(), zero_bias=True)
    init_desc = "normal(0,0.01)+zero_bias"
    if args.init_from:
        try:
            meta = load_dtrain_state(model, args.init_from)
        except (ValueError, OSError) as e:
            print("torch_fidelity.py: --init_from: %s" % e, file=sys.stderr)
            sys.exit(1)
        init_desc = "dtrain_checkpoint:%s(model=%s,seed=%s,epochs_done=%s)" % (
            args.init_from, meta.get("model", "?"), meta.get("seed", "?"),
            meta.get("epochs_done", "?"))
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    print("# torch_fidelity.py: chapter LeNet on Fashion-MNIST")
    print("# date=%s" % datetime.datetime.now().astimezone().strftime(
        "%Y-%m-%d %H:%M:%S %Z"))
    print("# %s numpy_version=%s" % (torch_env.describe(), np.__version__))
    print("# model=lenet init=%s seed=%d "
          "batch_size=%d lr=%g optimizer=sgd loss=cross_entropy_mean "
          "epochs=%d threads=%d" % (init_desc, args.seed, args.batch_size,
                                    args.lr, args.epochs, args.threads))
    print("# data=%s train=%d test=%d order=%s "
          "(epoch e uses epoch_order(%d, %d, e-1))" % (
              args.data, n, xte.shape[0], order_src, n, args.seed))
    sys.stdout.flush()

    for e in range(1, args.epochs + 1):
        loss, train_acc, secs = train_epoch(model, opt, xtr, ytr,
                                            epoch_order(n, args.seed, e - 1),
                                            args.batch_size)
        test_acc = evaluate(model, xte, yte)
        print("epoch=%d loss=%.6f train_acc=%.4f test_acc=%.4f seconds=%.2f"
              % (e, loss, train_acc, test_acc, secs))
        sys.stdout.flush()

if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Trains a model of export_onnx.BUILDERS in PyTorch exactly as dtrain's
Train (libs/train/train.h) trains its ONNX export: the accuracy reference of
tests/accuracy/onnx_accuracy_test.

    torch_train_reference.py NAME --init_from CKPT --seed S --epochs E \\
        --batch_size B --lr LR [--momentum M] [--train_limit N] \\
        [--test_limit N] [--threads T] [--data DIR]

  * model: export_onnx.BUILDERS[NAME]() (the architecture the test's
    NAME.onnx was exported from), its weights and batch-norm statistics
    loaded by state_dict name from the dtrain checkpoint CKPT (Train's
    save_initial_path), so both sides start from the same weights;
  * data: Fashion-MNIST from Debian's gzip IDX files, pixels / 255; the
    first train_limit training and test_limit test images (0: all);
  * order: epoch e (1-based) visits the training images in dtrain's
    epoch_order(n, seed, e - 1) (tests/reference/epoch_order_ref.py), in
    consecutive batches of batch_size, the last partial batch kept;
  * step: mean softmax cross-entropy, torch.optim.SGD(lr, momentum);
    Dropout draws its masks from torch's RNG (torch.manual_seed(seed)), so
    with Dropout the two runs are alike only in distribution.
Prints one line per epoch, checked by the test:
    epoch=<e> loss=<l> train_acc=<a> test_acc=<t> seconds=<s>
(test_acc: eval mode, after the epoch). Lines starting with '#' describe
the run.
"""
import argparse
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import export_onnx  # noqa: E402
import fashion_mnist  # noqa: E402
import torch_env  # noqa: E402
from epoch_order_ref import epoch_order  # noqa: E402
from torch_util import evaluate, load_dtrain_state, train_epoch  # noqa: E402


def load_split(split, limit, data_dir):
    x, y = fashion_mnist.load(split, data_dir)
    if limit > 0:
        x, y = x[:limit], y[:limit]
    return torch.from_numpy(x.copy()), torch.from_numpy(y.copy())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("name", choices=sorted(export_onnx.BUILDERS))
    ap.add_argument("--init_from", required=True, metavar="CKPT")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch_size", type=int, default=128)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--train_limit", type=int, default=0)
    ap.add_argument("--test_limit", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default=fashion_mnist.DEFAULT_DIR)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    xtr, ytr = load_split("train", args.train_limit, args.data)
    xte, yte = load_split("t10k", args.test_limit, args.data)
    model = export_onnx.BUILDERS[args.name]()
    try:
        meta = load_dtrain_state(model, args.init_from, model_name=args.name)
    except (ValueError, OSError) as e:
        print("torch_train_reference.py: --init_from: %s" % e, file=sys.stderr)
        sys.exit(1)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    n = xtr.shape[0]
    print("# %s" % torch_env.describe())
    print("# model=%s init_from=%s (seed=%s) seed=%d batch_size=%d lr=%g momentum=%g "
          "epochs=%d train=%d test=%d" % (args.name, args.init_from, meta.get("seed", "?"),
                                          args.seed, args.batch_size, args.lr, args.momentum,
                                          args.epochs, n, xte.shape[0]))
    sys.stdout.flush()
    for e in range(1, args.epochs + 1):
        loss, train_acc, secs = train_epoch(model, opt, xtr, ytr,
                                            epoch_order(n, args.seed, e - 1), args.batch_size)
        print("epoch=%d loss=%.6f train_acc=%.4f test_acc=%.4f seconds=%.2f"
              % (e, loss, train_acc, evaluate(model, xte, yte), secs))
        sys.stdout.flush()

if __name__ == "__main__":
    main()

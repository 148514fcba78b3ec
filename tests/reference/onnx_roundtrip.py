#!/usr/bin/python3
"""Round trip of a model trained by dtrain back into ONNX and PyTorch.

    onnx_roundtrip.py NAME TRAINED.onnx X.f32 Y.f32
    onnx_roundtrip.py NAME TRAINED.onnx --test_accuracy [--test_limit N]

NAME is one of export_onnx.BUILDERS. Loads TRAINED.onnx with python3-onnx and
runs onnx.checker.check_model (full check, with shape inference); copies its
initializers into a fresh PyTorch NAME model by state_dict name (every
parameter and buffer but num_batches_tracked must be there); then, in eval
mode:

  X.f32 Y.f32      runs it on X (float32, [N, 1, 28, 28]) and compares with
                   dtrain's eval outputs Y (float32, [N, 10]). Prints
                   max_abs_diff=D and match=1 when
                   |torch - dtrain| <= 1e-4 + 1e-4 |dtrain| everywhere
                   (match=0 and exit status 1 otherwise).
  --test_accuracy  prints test_acc=A, its accuracy on the first N (0: all)
                   Fashion-MNIST test images (Debian's files).
Both print checker=ok and copied=K first.
"""
import argparse
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import numpy_helper  # noqa: E402
import torch  # noqa: E402

import export_onnx  # noqa: E402


def load_trained(name, path):
    """The PyTorch NAME model with TRAINED.onnx's initializers, after the
    full checker passed."""
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    print("checker=ok")
    net = export_onnx.BUILDERS[name]()
    state = net.state_dict()
    copied = 0
    for init in model.graph.initializer:
        if init.name in state:
            value = torch.from_numpy(numpy_helper.to_array(init).copy())
            assert state[init.name].shape == value.shape, init.name
            state[init.name].copy_(value)
            copied += 1
    missing = [k for k in state if not k.endswith("num_batches_tracked")]
    assert copied == len(missing), (copied, len(missing))
    print("copied=%d" % copied)
    return net


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("name", choices=sorted(export_onnx.BUILDERS))
    ap.add_argument("trained")
    ap.add_argument("x", nargs="?")
    ap.add_argument("y", nargs="?")
    ap.add_argument("--test_accuracy", action="store_true")
    ap.add_argument("--test_limit", type=int, default=0)
    args = ap.parse_args()
    if args.test_accuracy == (args.x is not None):
        ap.error("give X.f32 Y.f32 or --test_accuracy")
    net = load_trained(args.name, args.trained)
    if args.test_accuracy:
        import fashion_mnist
        from torch_util import evaluate
        x, y = fashion_mnist.load("t10k")
        if args.test_limit > 0:
            x, y = x[:args.test_limit], y[:args.test_limit]
        print("test_acc=%.6f" % evaluate(net, torch.from_numpy(x.copy()),
                                         torch.from_numpy(y.copy())))
        return
    x = torch.from_numpy(np.fromfile(args.x, dtype=np.float32).reshape(-1, 1, 28, 28))
    y = np.fromfile(args.y, dtype=np.float32).reshape(x.shape[0], -1)
    net.eval()
    with torch.no_grad():
        ours = net(x).numpy()
    diff = np.abs(ours - y)
    print("max_abs_diff=%.3g" % diff.max())
    ok = bool(np.all(diff <= 1e-4 + 1e-4 * np.abs(y)))
    print("match=%d" % int(ok))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

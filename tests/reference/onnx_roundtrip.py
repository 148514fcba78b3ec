#!/usr/bin/python3
"""Round trip of a model trained by dtrain back into ONNX and PyTorch.

    onnx_roundtrip.py NAME TRAINED.onnx X.f32 Y.f32

NAME is one of export_onnx.BUILDERS. Loads TRAINED.onnx with python3-onnx and
runs onnx.checker.check_model (full check, with shape inference); copies its
initializers into a fresh PyTorch NAME model by state_dict name; runs it in
eval mode on X (float32, [N, 1, 28, 28]) and compares with dtrain's eval
outputs Y (float32, [N, 10]). Prints checker=ok, copied=K,
max_abs_diff=D and match=1 when |torch - dtrain| <= 1e-4 + 1e-4 |dtrain|
everywhere (match=0 and exit status 1 otherwise).
"""
import os
import sys

import numpy as np
import onnx
from onnx import numpy_helper
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_onnx  # noqa: E402


def main():
    name, path, x_path, y_path = sys.argv[1:5]
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
    x = torch.from_numpy(np.fromfile(x_path, dtype=np.float32).reshape(-1, 1, 28, 28))
    y = np.fromfile(y_path, dtype=np.float32).reshape(x.shape[0], -1)
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

#!/usr/bin/python3
"""Small hand-built ONNX models covering every op the importer supports.

    tests/reference/onnx_small_models.py DIR

Writes DIR/seed_NAME for each model (python3-onnx's helper, opset 13, inputs
[N, 1, 8, 8] or [N, 16], each within the fuzzer's caps). Used twice: as the
seeds of the onnx fuzzer (tests/fuzz/onnx_fuzzer.cc; the committed corpus
tests/fuzz/corpus/onnx started from these and grew with `tools/fuzz run
onnx` + `tools/fuzz merge onnx`), and by libs/onnx's tests (a genrule), which
check that every one imports and trains.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(0)


def w(name, *shape):
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32) * 0.5, name)


def ints(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def model(nodes, inits, in_shape, out_classes, name):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"] + list(in_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", out_classes])
    g = helper.make_graph(nodes, name, [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    onnx.checker.check_model(m)
    return m


def seeds():
    n = helper.make_node
    out = {}
    out["lenet"] = model([
        n("Conv", ["x", "c1.w", "c1.b"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("Relu", ["a"], ["b"]),
        n("Constant", [], ["p"], value=ints("pv", [0] * 8)),
        n("Pad", ["b", "p"], ["bp"], mode="constant"),
        n("AveragePool", ["bp"], ["c"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Flatten", ["c"], ["d"], axis=1),
        n("Gemm", ["d", "fc.w", "fc.b"], ["y"], transB=1),
    ], [w("c1.w", 2, 1, 3, 3), w("c1.b", 2), w("fc.w", 4, 32), w("fc.b", 4)], [1, 8, 8], 4,
        "lenet")
    out["resblock"] = model([
        n("Conv", ["x", "c.w"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("BatchNormalization", ["a", "bn.w", "bn.b", "bn.m", "bn.v"], ["b"], epsilon=1e-5,
          momentum=0.9),
        n("Relu", ["b"], ["c"]),
        n("Conv", ["c", "c2.w", "c2.b"], ["d"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("Add", ["d", "a"], ["e"]),
        n("MaxPool", ["e"], ["f"], kernel_shape=[2, 2], strides=[2, 2]),
        n("GlobalAveragePool", ["f"], ["g"]),
        n("Reshape", ["g", "shape"], ["h"]),
        n("Gemm", ["h", "fc.w"], ["i"], transB=1),
        n("LogSoftmax", ["i"], ["y"], axis=1),
    ], [w("c.w", 2, 1, 3, 3), w("bn.w", 2), w("bn.b", 2), w("bn.m", 2),
        numpy_helper.from_array(np.ones(2, np.float32), "bn.v"), w("c2.w", 2, 2, 3, 3),
        w("c2.b", 2), ints("shape", [-1, 2]), w("fc.w", 3, 2)], [1, 8, 8], 3, "resblock")
    out["grouped"] = model([
        n("Conv", ["x", "c.w"], ["a"], kernel_shape=[3, 3], pads=[1, 0, 2, 1], strides=[2, 1],
          dilations=[1, 2], group=1),
        n("LeakyRelu", ["a"], ["b"], alpha=0.1),
        n("Conv", ["b", "g.w", "g.b"], ["c"], kernel_shape=[1, 1], group=2),
        n("Sigmoid", ["c"], ["d"]),
        n("Mul", ["d", "s"], ["e"]),
        n("Tanh", ["e"], ["f"]),
        n("Transpose", ["f"], ["t"], perm=[0, 1, 3, 2]),
        n("Concat", ["f", "f"], ["g"], axis=1),
        n("Flatten", ["g"], ["h"]),
        n("MatMul", ["h", "fc.w"], ["i"]),
        n("Sub", ["i", "fc.b"], ["j"]),
        n("Div", ["j", "two"], ["y"]),
    ], [w("c.w", 4, 1, 3, 3), w("g.w", 4, 2, 1, 1), w("g.b", 4), w("s", 1, 4, 1, 1),
        w("fc.w", 8 * 5 * 5, 3), w("fc.b", 3),
        numpy_helper.from_array(np.array(2.0, np.float32), "two")], [1, 8, 8], 3, "grouped")
    out["mlp_gelu"] = model([
        n("Gemm", ["x", "w1", "b1"], ["a"], transB=1),
        n("Constant", [], ["sqrt2"], value=numpy_helper.from_array(np.array(1.4142135, np.float32))),
        n("Div", ["a", "sqrt2"], ["b"]),
        n("Erf", ["b"], ["c"]),
        n("Constant", [], ["one"], value=numpy_helper.from_array(np.array(1.0, np.float32))),
        n("Add", ["c", "one"], ["d"]),
        n("Mul", ["a", "d"], ["e"]),
        n("Constant", [], ["half"], value=numpy_helper.from_array(np.array(0.5, np.float32))),
        n("Mul", ["e", "half"], ["f"]),
        n("Identity", ["f"], ["g"]),
        n("Constant", [], ["ratio"], value=numpy_helper.from_array(np.array(0.25, np.float32))),
        n("Dropout", ["g", "ratio"], ["h"]),
        n("Gemm", ["h", "w2", "b2"], ["i"], transB=0),
        n("Softmax", ["i"], ["y"], axis=-1),
    ], [w("w1", 8, 16), w("b1", 8), w("w2", 8, 5), w("b2", 5)], [16], 5, "mlp_gelu")
    return out


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    for name, m in seeds().items():
        with open(os.path.join(out_dir, "seed_" + name), "wb") as f:
            f.write(m.SerializeToString())


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Writes tests/reference/torch_reference.json: PyTorch forward outputs and
gradients for a fully deterministic setup that a C++ test can rebuild
without any weight file.

Usage:  /usr/bin/python3 tests/reference/make_reference.py [--out PATH]

RECIPE (everything below is what this script does; reproduce it exactly)
========================================================================
Models: tests/reference/models.py (nn.Sequential; parameter names and the
order of model.named_parameters() are listed per case in the JSON under
"params", in order).

1. Parameter init ("sinusoid"):
   Iterate model.named_parameters() in order, index p = 0, 1, 2, ...
   (buffers are NOT parameters and do not take an index).
   Flatten the parameter row-major in PyTorch layout
     conv weight [out, in, kh, kw], linear weight [out, in], vectors [n].
   Element k (0-based) of parameter p is
       value = float32( scale * sin(0.5 + 0.1*p + 0.7*k) )
   evaluated in IEEE double, left to right, without FMA contraction:
       a = 0.5 + 0.1*p          (double; 0.1*p is double(0.1) * double(p))
       arg = a + 0.7*k          (0.7*k is double(0.7) * double(k))
       s = sin(arg)             (libm sin: Python math.sin == glibc sin ==
                                 C++ std::sin(double) on Linux)
       value = (float)(scale * s)   (round-to-nearest-even cast)
   scale:
       rank >= 2: scale = 1.0 / sqrt((double)fan_in),
                  fan_in = numel / shape[0] (integer division;
                  conv: in*kh*kw, linear: in)
       rank 1   : scale = 0.1   (all biases, and BatchNorm weight (gamma)
                                 and bias (beta) as well)
   BatchNorm buffers keep the PyTorch defaults: running_mean = 0,
   running_var = 1, momentum 0.1, eps 1e-5.
   (numpy's float64 np.sin uses SVML on AVX-512 machines and differs from
   libm in the last double bit for ~60% of arguments; after the cast to
   float32 no difference was observed, but this script uses math.sin.)

2. Input:
   x has shape [B,1,28,28] (mlp, lenet, resnet18; mlp's Flatten turns it into
   [B,784]) or [B,512] (mlp_chapter). Flattened row-major, element k is
       x[k] = (float)(0.5 + 0.5*sin(0.3*k))      (double, libm sin)
   i.e. a = 0.3*k; s = sin(a); v = 0.5 + 0.5*s; cast to float32.
   Labels: y[i] = (3*i + 1) % 10 (int64), i = 0..B-1. For mlp_chapter
   (2 classes) only B = 1 is used, so y = [1].

3. Step: model.train() (BatchNorm normalizes with the biased batch variance
   and updates running stats: running_mean = 0.9*running_mean + 0.1*mean,
   running_var = 0.9*running_var + 0.1*var_unbiased (n/(n-1) correction)),
   logits = model(x) in float32, loss = nn.CrossEntropyLoss()(logits, y)
   (mean over the batch of softmax cross-entropy), loss.backward() once, on
   zero-initialised gradients. No optimizer step.

4. Cases: mlp B=4, mlp_chapter B=1, lenet B=4, resnet18 B=2, and
   "resnet18_eval": the same resnet18 model right after its training case
   (exactly one training-mode forward has updated the running stats), then
   model.eval() and a forward of the same x under torch.no_grad(); it records
   the eval logits and, for every BatchNorm, running_mean/running_var sum
   and first 3 elements (the first BN is module "1").

JSON layout (all floats are float32 values printed as Python float = the
exact double of the float32, via repr; sums/norms are accumulated in float64
from the float32 values):
  {"meta": {...}, "cases": [ {
     "name", "model", "batch", "mode": "train"|"eval",
     "input": {"shape", "sum", "first": [x0,x1,x2]}, "labels": [...],
     "logits": [B*C row-major], "logits_shape": [B,C], "loss",
     "params": [ {"name", "shape", "numel", "init_sum",
                  "sample_indices": [0, numel//3, numel-1],
                  "init_samples": [...], "grad_sum", "grad_abs_sum",
                  "grad_l2", "grad_samples": [...]} ... ],
     "f64_check": {"logits_max_abs_diff", "loss_abs_diff",
                   "grad_l2_max_rel_diff"}   # float32 vs the same recipe
                                            # run in float64: a tolerance hint
                                            # (rel diff floored at 1e-3 of
                                            # the largest grad_l2)
Each param record also has "grad_l2_f64" (grad_l2 of the float64 run), and
"grad_is_rounding_noise": true where that is < 1e-6 of the case's largest
grad_l2: in resnet18 the conv biases directly followed by a train-mode
BatchNorm (0.bias, *.conv1.bias, *.conv2.bias) have a mathematically zero
gradient (BN subtracts the per-channel mean); their float32 values (~1e-11)
are rounding noise and must be compared with an absolute tolerance only.
  } ... ] }
The eval case has "bn_stats" instead of "params"/"loss".
Threads: torch.set_num_threads(1).
"""
import argparse
import datetime
import json
import math
import os
import platform
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import models  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def sinusoid_values(p, shape):
    """float32 numpy array (flat) with the sinusoid init of parameter p."""
    n = int(np.prod(shape)) if len(shape) else 1
    if len(shape) >= 2:
        fan_in = n // shape[0]
        scale = 1.0 / math.sqrt(float(fan_in))
    else:
        scale = 0.1
    a = 0.5 + 0.1 * p
    out = np.empty(n, dtype=np.float64)
    msin = math.sin
    for k in range(n):
        out[k] = scale * msin(a + 0.7 * float(k))
    return out.astype(np.float32)


def sinusoid_values_fast(p, shape):
    """Same as sinusoid_values, vectorised argument, libm sin per element."""
    n = int(np.prod(shape)) if len(shape) else 1
    if len(shape) >= 2:
        scale = 1.0 / math.sqrt(float(n // shape[0]))
    else:
        scale = 0.1
    arg = (0.5 + 0.1 * p) + 0.7 * np.arange(n, dtype=np.float64)
    s = np.fromiter(map(math.sin, arg.tolist()), dtype=np.float64, count=n)
    return (scale * s).astype(np.float32)


def sinusoid_init(model):
    with torch.no_grad():
        for p, (_, param) in enumerate(model.named_parameters()):
            v = sinusoid_values_fast(p, tuple(param.shape))
            param.copy_(torch.from_numpy(v).reshape(param.shape))
    return model


def make_input(model_name, batch):
    shape = (batch,) + models.input_shape(model_name)
    n = int(np.prod(shape))
    k = np.arange(n, dtype=np.float64) * 0.3
    s = np.fromiter(map(math.sin, k.tolist()), dtype=np.float64, count=n)
    x = (0.5 + 0.5 * s).astype(np.float32).reshape(shape)
    y = np.array([(3 * i + 1) % 10 for i in range(batch)], dtype=np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def f(v):
    """float32 (tensor element / numpy scalar) -> exact Python float."""
    return float(np.float32(v))


def sample_indices(numel):
    return [0, numel // 3, numel - 1]


def run_train(model_name, batch, dtype=torch.float32):
    torch.manual_seed(0)  # irrelevant (init is overwritten), kept for safety
    model = sinusoid_init(models.build(model_name))
    x, y = make_input(model_name, batch)
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    model = model.to(dtype)
    model.train()
    model.zero_grad(set_to_none=False)
    logits = model(x.to(dtype))
    loss = nn.CrossEntropyLoss()(logits, y)
    loss.backward()
    return model, x, y, init, logits.detach(), loss.detach()


def param_record(name, param, init):
    g = param.grad.detach().double().reshape(-1)
    flat_init = init.double().reshape(-1)
    numel = g.numel()
    idx = sample_indices(numel)
    return {
        "name": name,
        "shape": list(param.shape),
        "numel": numel,
        "init_sum": float(flat_init.sum()),
        "sample_indices": idx,
        "init_samples": [f(flat_init[i]) for i in idx],
        "grad_sum": float(g.sum()),
        "grad_abs_sum": float(g.abs().sum()),
        "grad_l2": float(torch.sqrt((g * g).sum())),
        "grad_samples": [f(g[i]) for i in idx],
    }


def input_record(x, y):
    xf = x.double().reshape(-1)
    return ({"shape": list(x.shape), "sum": float(xf.sum()),
             "first": [f(xf[i]) for i in range(3)]},
            [int(v) for v in y])


def bn_stats(model):
    out = []
    for name, m in model.named_modules():
        if isinstance(m, nn.BatchNorm2d):
            rm = m.running_mean.detach().double()
            rv = m.running_var.detach().double()
            out.append({
                "name": name,
                "num_batches_tracked": int(m.num_batches_tracked),
                "running_mean_sum": float(rm.sum()),
                "running_mean_first": [f(rm[i]) for i in range(3)],
                "running_var_sum": float(rv.sum()),
                "running_var_first": [f(rv[i]) for i in range(3)],
            })
    return out


def train_case(model_name, batch):
    model, x, y, init, logits, loss = run_train(model_name, batch)
    m64, _, _, _, logits64, loss64 = run_train(model_name, batch,
                                               torch.float64)
    inp, labels = input_record(x, y)
    params = [param_record(n, p, init[n]) for n, p in model.named_parameters()]
    l2_64 = [float(p64.grad.norm()) for p64 in m64.parameters()]
    floor = 1e-3 * max(l2_64)
    rel = 0.0
    for rec, b in zip(params, l2_64):
        rec["grad_l2_f64"] = b
        if b < 1e-6 * max(l2_64):
            rec["grad_is_rounding_noise"] = True
        rel = max(rel, abs(rec["grad_l2"] - b) / max(b, floor))
    case = {
        "name": model_name,
        "model": model_name,
        "batch": batch,
        "mode": "train",
        "input": inp,
        "labels": labels,
        "logits_shape": list(logits.shape),
        "logits": [f(v) for v in logits.reshape(-1)],
        "loss": f(loss),
        "params": params,
        "f64_check": {
            "logits_max_abs_diff":
                float((logits.double() - logits64).abs().max()),
            "loss_abs_diff": abs(float(loss) - float(loss64)),
            "grad_l2_max_rel_diff": rel,
        },
    }
    return case, model, x, y, m64


def eval_case(model, x, y, m64):
    model.eval()
    m64.eval()
    with torch.no_grad():
        logits = model(x)
        logits64 = m64(x.double())
    inp, labels = input_record(x, y)
    return {
        "name": "resnet18_eval",
        "model": "resnet18",
        "batch": int(x.shape[0]),
        "mode": "eval",
        "note": "same model right after the resnet18 training case (one "
                "train-mode forward updated running stats), then eval()",
        "input": inp,
        "labels": labels,
        "logits_shape": list(logits.shape),
        "logits": [f(v) for v in logits.reshape(-1)],
        "bn_stats": bn_stats(model),
        "f64_check": {
            "logits_max_abs_diff":
                float((logits.double() - logits64).abs().max()),
        },
    }


def self_check():
    # The vectorised init must equal the literal scalar loop.
    for p, shape in ((0, (20, 1, 3, 3)), (5, (128,)), (7, (10, 128))):
        a = sinusoid_values(p, shape)
        b = sinusoid_values_fast(p, shape)
        assert np.array_equal(a, b), (p, shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE,
                                                  "torch_reference.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    self_check()

    cases = []
    for name, batch in (("mlp", 4), ("mlp_chapter", 1), ("lenet", 4),
                        ("resnet18", 2)):
        case, model, x, y, m64 = train_case(name, batch)
        cases.append(case)
        print("case=%s batch=%d loss=%r logits0=%r f64_logit_diff=%.3g" % (
            name, batch, case["loss"], case["logits"][0],
            case["f64_check"]["logits_max_abs_diff"]))
        if name == "resnet18":
            ev = eval_case(model, x, y, m64)
            cases.append(ev)
            print("case=resnet18_eval logits0=%r bn1_rm_sum=%r bn1_rv_sum=%r"
                  % (ev["logits"][0], ev["bn_stats"][0]["running_mean_sum"],
                     ev["bn_stats"][0]["running_var_sum"]))

    doc = {
        "meta": {
            "generator": "tests/reference/make_reference.py",
            "recipe": "see the docstring of the generator",
            "torch_version": torch.__version__,
            "numpy_version": np.__version__,
            "python": platform.python_version(),
            "date_utc": datetime.datetime.utcnow().strftime(
                "%Y-%m-%dT%H:%M:%SZ"),
            "threads": 1,
            "dtype": "float32",
        },
        "cases": cases,
    }
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    print("wrote %s (%d bytes)" % (args.out, os.path.getsize(args.out)))


if __name__ == "__main__":
    main()

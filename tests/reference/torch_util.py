#!/usr/bin/python3
"""PyTorch helpers shared by the reference scripts.

    load_dtrain_state(model, path, model_name)  dtrain checkpoint -> model
    train_epoch(model, opt, x, y, order, batch)  one epoch in dtrain's order
    evaluate(model, x, y)                        test accuracy, eval mode
"""
import time

import numpy as np
import torch

import dtrain_checkpoint


def load_dtrain_state(model, path, model_name="lenet"):
    """Copies the tensors of dtrain checkpoint `path` into `model` by
    state_dict name. Returns the checkpoint's metadata. Raises ValueError
    (a dtrain_checkpoint.CheckpointError for a bad file) when the file is
    not a valid checkpoint or does not match the model exactly. Batch norm's
    num_batches_tracked (dtrain keeps no such counter) stays as it is;
    optimizer state ("<param>.momentum_buffer") is ignored."""
    metadata, tensors = dtrain_checkpoint.read_checkpoint(path)
    state = {k: v for k, v in model.state_dict().items()
             if not k.endswith("num_batches_tracked")}
    problems = []
    if metadata.get("model", model_name) != model_name:
        problems.append("it holds model %r, not %r"
                        % (metadata["model"], model_name))
    for name, dst in state.items():
        src = tensors.get(name)
        if src is None:
            problems.append("missing tensor %r (model needs %s %s)"
                            % (name, list(dst.shape), dst.dtype))
        elif tuple(src.shape) != tuple(dst.shape):
            problems.append("tensor %r has shape %s, the model needs %s"
                            % (name, list(src.shape), list(dst.shape)))
        elif src.dtype != np.float32 or dst.dtype != torch.float32:
            problems.append("tensor %r is %s, the model needs %s"
                            % (name, src.dtype, dst.dtype))
    for name in tensors:
        if name not in state and not name.endswith(".momentum_buffer"):
            problems.append("unexpected tensor %r (not in the model's "
                            "state_dict)" % name)
    if problems:
        raise ValueError("%s (model %s) does not match the PyTorch model: %s"
                         % (path, metadata.get("model", "?"),
                            "; ".join(problems)))
    with torch.no_grad():
        for name, dst in state.items():
            dst.copy_(torch.from_numpy(tensors[name]))
    return metadata


def evaluate(model, x, y, batch_size=256):
    """The fraction of x the model classifies as y, in eval mode (batch norm
    with running statistics, no dropout); leaves the model in train mode."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for s in range(0, x.shape[0], batch_size):
            out = model(x[s:s + batch_size])
            correct += int((out.argmax(dim=1) == y[s:s + batch_size]).sum())
    model.train()
    return correct / x.shape[0]


def train_epoch(model, opt, x, y, order, batch_size):
    """One epoch of mean softmax cross-entropy steps over x[order] in
    consecutive batches of batch_size (the last partial batch kept), as
    dtrain's loader cuts dtrain's epoch order (epoch_order_ref.py). Returns
    (mean loss, training accuracy, seconds): loss and accuracy over the
    batches as they were trained, weighted by batch size."""
    order = torch.tensor(order, dtype=torch.int64)
    loss_fn = torch.nn.CrossEntropyLoss()
    t0 = time.perf_counter()
    loss_sum, correct = 0.0, 0
    for s in range(0, order.numel(), batch_size):
        idx = order[s:s + batch_size]
        xb, yb = x[idx], y[idx]
        opt.zero_grad(set_to_none=True)
        out = model(xb)
        loss = loss_fn(out, yb)
        loss.backward()
        opt.step()
        loss_sum += float(loss) * idx.numel()
        correct += int((out.argmax(dim=1) == yb).sum())
    n = order.numel()
    return loss_sum / n, correct / n, time.perf_counter() - t0

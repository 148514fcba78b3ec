#!/usr/bin/python3
"""Minimal Fashion-MNIST reader (gzip IDX files, numpy only).

Default location: Debian's /usr/share/datasets/fashion-mnist/
{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz. Images are returned as
float32 [N,1,28,28] with pixels / 255 (no normalization, like d2l's
ToTensor()), labels as int64 [N].
"""
import gzip
import os

import numpy as np

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as fh:
        data = fh.read()
    zero, dtype_code, ndim = data[0] << 8 | data[1], data[2], data[3]
    if zero != 0 or dtype_code != 0x08:
        raise ValueError("%s: not an unsigned-byte IDX file" % path)
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big")
            for i in range(ndim)]
    offset = 4 + 4 * ndim
    arr = np.frombuffer(data, dtype=np.uint8, offset=offset)
    if arr.size != int(np.prod(dims)):
        raise ValueError("%s: size mismatch %d vs %r" % (path, arr.size,
                                                          dims))
    return arr.reshape(dims)


def load(split, data_dir=DEFAULT_DIR):
    """split: 'train' or 't10k' (alias 'test')."""
    if split == "test":
        split = "t10k"
    images = read_idx(os.path.join(data_dir,
                                   "%s-images-idx3-ubyte.gz" % split))
    labels = read_idx(os.path.join(data_dir,
                                   "%s-labels-idx1-ubyte.gz" % split))
    x = (images.astype(np.float32) / np.float32(255.0)).reshape(
        -1, 1, images.shape[1], images.shape[2])
    return x, labels.astype(np.int64)

#!/usr/bin/env python3
"""Writes the seed inputs of the checkpoint and saved_model fuzzers.

  tests/fuzz/make_seeds.py checkpoint DIR          small valid checkpoints
  tests/fuzz/make_seeds.py saved_model DIR FILE... saved_model_fuzzer inputs
                                                   from real .dtmodel files

The committed corpora (tests/fuzz/corpus/) were made with it; the format is
libs/checkpoint/checkpoint.h's, the saved_model input format is described in
tests/fuzz/saved_model_fuzzer.cc.
"""
import os
import struct
import sys

MAGIC = b"\x89DTRAIN-CKPT\r\n\x1a\n"


def crc32c(data, crc=0):
    table = crc32c.table
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


crc32c.table = _table()


def checkpoint(metadata, tensors, minor=0, extra_header=b""):
    body = b""
    for k, v in sorted(metadata.items()):
        e = struct.pack("<I", len(k)) + k + struct.pack("<I", len(v)) + v
        body += e + struct.pack("<I", crc32c(e))
    for name, dtype, shape, data in tensors:
        h = struct.pack("<I", len(name)) + name + struct.pack("<iI", dtype, len(shape))
        h += b"".join(struct.pack("<q", d) for d in shape) + struct.pack("<Q", len(data))
        body += h + struct.pack("<I", crc32c(h)) + data + struct.pack("<I", crc32c(data))
    header_size = 48 + len(extra_header)
    size = header_size + len(body) + 12
    h = MAGIC + struct.pack("<IIIIIQ", 1, minor, header_size, len(metadata), len(tensors), size)
    h += extra_header
    h += struct.pack("<I", crc32c(h))
    out = h + body + struct.pack("<Q", size)
    return out + struct.pack("<I", crc32c(out))


def read_checkpoint(blob):
    """(metadata, [(name, dtype, shape)]) of a checkpoint, CRCs unchecked."""
    header_size, nmeta, ntensors = struct.unpack_from("<III", blob, 24)
    p = header_size
    meta = {}
    for _ in range(nmeta):
        (k,) = struct.unpack_from("<I", blob, p)
        key = blob[p + 4:p + 4 + k]
        p += 4 + k
        (v,) = struct.unpack_from("<I", blob, p)
        meta[key] = blob[p + 4:p + 4 + v]
        p += 4 + v + 4
    tensors = []
    for _ in range(ntensors):
        (n,) = struct.unpack_from("<I", blob, p)
        name = blob[p + 4:p + 4 + n]
        p += 4 + n
        dtype, rank = struct.unpack_from("<iI", blob, p)
        p += 8
        shape = list(struct.unpack_from("<%dq" % rank, blob, p))
        p += 8 * rank
        (length,) = struct.unpack_from("<Q", blob, p)
        p += 8 + 4 + length + 4
        tensors.append((name, dtype, shape))
    return meta, tensors


def main():
    kind, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    if kind == "checkpoint":
        seeds = {
            "empty": checkpoint({}, []),
            "small": checkpoint({b"model": b"lenet", b"step": b"1200"},
                                [(b"w", 0, [2, 3], bytes(range(24))),
                                 (b"b", 0, [3], b"\x00" * 12)]),
            "scalar_and_zero_dim": checkpoint({}, [(b"s", 4, [], b"\x01" * 8),
                                                   (b"z", 0, [0, 5], b"")]),
            "minor_1_header": checkpoint({b"k": b"v"}, [(b"t", 5, [4], b"abcd")], minor=1,
                                         extra_header=b"\x07\x00\x00\x00"),
        }
        for name, blob in seeds.items():
            with open(os.path.join(out, name + ".dtckpt"), "wb") as f:
                f.write(blob)
    elif kind == "saved_model":
        for path in sys.argv[3:]:
            meta, tensors = read_checkpoint(open(path, "rb").read())
            seed = meta[b"graph"] + b"\x00"
            for name, dtype, shape in tensors:
                seed += bytes([len(name)]) + name + bytes([dtype, len(shape)])
                seed += b"".join(struct.pack("<I", d) for d in shape)
            base = os.path.basename(path).replace(".dtmodel", "")
            with open(os.path.join(out, base), "wb") as f:
                f.write(seed)
    else:
        sys.exit("unknown kind " + kind)


if __name__ == "__main__":
    main()

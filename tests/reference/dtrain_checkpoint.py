#!/usr/bin/python3
"""Pure-Python (+ numpy) reader of dtrain checkpoint files, format 1.x.

The format is documented in libs/checkpoint/checkpoint.h (header, metadata
entries, tensor records, footer; every part covered by a CRC-32C). This
reader follows the same checks, in the same order, as the C++ ReadCheckpoint:
magic, major version, header size and CRC (then a newer major version is
rejected), file_size against the real size, the counts against the bytes
available, each metadata entry and tensor record (limits, then CRC), and the
footer (file_size and the whole-file CRC).

    from dtrain_checkpoint import read_checkpoint
    metadata, tensors = read_checkpoint("/tmp/init.ckpt")
    metadata["model"]          # 'lenet'
    tensors["0.weight"].shape  # (20, 1, 3, 3), numpy float32

    /usr/bin/python3 tests/reference/dtrain_checkpoint.py FILE   # summary
    /usr/bin/python3 tests/reference/dtrain_checkpoint.py --self_test

Tensors come back as numpy arrays in native byte order, shaped as stored
(row-major), in file order. The dtype code is dtrain's DType
(libs/tensor/dtype.h): 0 float32, 1 float16, 2 bfloat16 (numpy has no
bfloat16: returned as the raw uint16 bit patterns), 3 int32, 4 int64,
5 uint8. Another code raises UnknownDTypeError. A record whose data length
is not product(shape) * element size is corrupt (CorruptCheckpointError).

Errors (all subclasses of CheckpointError, a ValueError; messages start with
"checkpoint <path>: "):
  NotACheckpointError      bad magic bytes (or not a regular file)
  UnsupportedVersionError  a major format version newer than 1
  CorruptCheckpointError   truncated, trailing bytes, checksum mismatch,
                           field out of range, duplicate key or name
  UnknownDTypeError        a record's dtype code is not one listed above
A missing file raises the usual OSError (FileNotFoundError).

Metadata keys/values and tensor names are decoded as UTF-8; bytes that are
not UTF-8 are kept with the 'surrogateescape' error handler.
"""
import collections
import os
import struct
import sys

import numpy as np

MAGIC = b"\x89DTRAIN-CKPT\r\n\x1a\n"
MAJOR_VERSION = 1
MINOR_VERSION = 0

HEADER_SIZE_V1 = 48
STABLE_PREFIX_SIZE = len(MAGIC) + 12        # magic, major, minor, header_size
MIN_ANY_HEADER_SIZE = STABLE_PREFIX_SIZE + 4
MAX_HEADER_SIZE = 4096
FOOTER_SIZE = 12
MAX_RANK = 8
MAX_NAME_LENGTH = 4096
MAX_KEY_LENGTH = 4096
MAX_VALUE_LENGTH = 64 << 20
MIN_METADATA_ENTRY_SIZE = 12                # key_length, value_length, crc
MIN_TENSOR_RECORD_SIZE = 4 + 1 + 4 + 4 + 8 + 4 + 4
INT64_MAX = (1 << 63) - 1

# dtrain DType code -> numpy dtype (little-endian on disk).
DTYPES = {
    0: np.dtype("<f4"),
    1: np.dtype("<f2"),
    2: np.dtype("<u2"),   # bfloat16 bit patterns
    3: np.dtype("<i4"),
    4: np.dtype("<i8"),
    5: np.dtype("u1"),
}
DTYPE_NAMES = {0: "float32", 1: "float16", 2: "bfloat16", 3: "int32",
               4: "int64", 5: "uint8"}


class CheckpointError(ValueError):
    """Base class of every error about a checkpoint's contents."""


class NotACheckpointError(CheckpointError):
    pass


class UnsupportedVersionError(CheckpointError):
    pass


class CorruptCheckpointError(CheckpointError):
    pass


class UnknownDTypeError(CheckpointError):
    pass


# ---------------------------------------------------------------------------
# CRC-32C (Castagnoli): reflected polynomial 0x82F63B78, initial value and
# final XOR 0xFFFFFFFF. Table-driven, slicing-by-8 over whole 8-byte words
# (the same tables as the C++ portable implementation), byte at a time for
# the tail. crc32c(b"123456789") == 0xE3069283.


def _make_tables():
    poly = 0x82F63B78
    t0 = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        t0.append(c)
    tables = [t0]
    for _ in range(7):
        prev = tables[-1]
        tables.append([(prev[i] >> 8) ^ t0[prev[i] & 0xFF] for i in range(256)])
    return [tuple(t) for t in tables]


_T = _make_tables()


def crc32c_extend(crc, data):
    """CRC-32C of the data that produced `crc` followed by `data`."""
    t0, t1, t2, t3, t4, t5, t6, t7 = _T
    c = (crc ^ 0xFFFFFFFF) & 0xFFFFFFFF
    mv = memoryview(data).cast("B")
    n = len(mv)
    whole = n - n % 8
    if whole:
        # Pairs of little-endian u32 words, as slicing-by-8 consumes them.
        words = struct.unpack("<%dI" % (whole // 4), mv[:whole])
        for k in range(0, len(words), 2):
            lo = c ^ words[k]
            hi = words[k + 1]
            c = (t7[lo & 0xFF] ^ t6[(lo >> 8) & 0xFF] ^
                 t5[(lo >> 16) & 0xFF] ^ t4[lo >> 24] ^
                 t3[hi & 0xFF] ^ t2[(hi >> 8) & 0xFF] ^
                 t1[(hi >> 16) & 0xFF] ^ t0[hi >> 24])
    for b in mv[whole:]:
        c = t0[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def crc32c(data):
    """CRC-32C of `data` (bytes-like)."""
    return crc32c_extend(0, data)


def _crc32c_bytewise(data):
    """Plain one-table version, used only by the self-test."""
    t0 = _T[0]
    c = 0xFFFFFFFF
    for b in bytes(data):
        c = t0[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


# ---------------------------------------------------------------------------


def _hex(crc):
    return "0x%08x" % crc


def _quote(name):
    return repr(name)


def _decode(b):
    return b.decode("utf-8", "surrogateescape")


class _Parser(object):
    def __init__(self, path, buf):
        self.path = path
        self.buf = buf          # bytes of the whole file
        self.actual_size = len(buf)
        self.pos = 0
        self.file_size = 0
        self.metadata_count = 0
        self.tensor_count = 0

    # -- helpers ------------------------------------------------------------
    def corrupt(self, what):
        return CorruptCheckpointError("checkpoint %s: %s" % (self.path, what))

    def truncated(self, needed):
        return self.corrupt("truncated: file has %d bytes, expected at least %d"
                            % (self.actual_size, needed))

    def body_left(self):
        return self.file_size - FOOTER_SIZE - self.pos

    def need(self, n, what):
        if n > self.body_left():
            raise self.corrupt(
                "%s at offset %d needs %d bytes, but only %d remain before the "
                "footer (corrupt length or count)"
                % (what, self.pos, n, self.body_left()))

    def take(self, n):
        # Callers have checked with need() / the header sizes; this guards
        # against reader bugs rather than file contents.
        if self.pos + n > self.actual_size:
            raise self.truncated(self.pos + n)
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    # -- parts --------------------------------------------------------------
    def parse(self):
        self.parse_header()
        metadata = collections.OrderedDict()
        for i in range(self.metadata_count):
            self.parse_metadata_entry(i, metadata)
        tensors = collections.OrderedDict()
        first_index = {}
        for i in range(self.tensor_count):
            name, array = self.parse_tensor_record(i)
            if name in first_index:
                raise self.corrupt("duplicate tensor name %s (tensor records %d "
                                   "and %d)" % (_quote(name), first_index[name], i))
            first_index[name] = i
            tensors[name] = array
        self.parse_footer()
        return dict(metadata), tensors

    def parse_header(self):
        have = min(self.actual_size, len(MAGIC))
        magic = self.buf[:have]
        if magic != MAGIC[:have]:
            hint = ""
            if have >= 12 and magic[:12] == MAGIC[:12]:
                hint = "; its line endings look altered (copied in text mode?)"
            raise NotACheckpointError(
                "checkpoint %s: not a dtrain checkpoint (file starts with %r, "
                "expected %r)%s" % (self.path, magic, MAGIC, hint))
        if self.actual_size < STABLE_PREFIX_SIZE:
            raise self.truncated(HEADER_SIZE_V1 + FOOTER_SIZE)
        major, minor, header_size = struct.unpack_from("<III", self.buf, len(MAGIC))
        version = "%d.%d" % (major, minor)
        if major == 0:
            raise self.corrupt("invalid format version %s" % version)
        newer = major > MAJOR_VERSION
        min_header = MIN_ANY_HEADER_SIZE if newer else HEADER_SIZE_V1
        size_ok = (min_header <= header_size <= MAX_HEADER_SIZE and
                   (newer or minor > 0 or header_size == HEADER_SIZE_V1))
        if not size_ok:
            raise self.corrupt("invalid header size %d for format version %s"
                               % (header_size, version))
        min_file = header_size + (0 if newer else FOOTER_SIZE)
        if self.actual_size < min_file:
            raise self.truncated(min_file)
        header = self.buf[:header_size]
        stored = struct.unpack_from("<I", header, header_size - 4)[0]
        actual = crc32c(header[:header_size - 4])
        if stored != actual:
            raise self.corrupt(
                "header checksum mismatch (stored %s, computed %s)%s"
                % (_hex(stored), _hex(actual),
                   "; the header claims format version %s" % version if newer else ""))
        if newer:
            raise UnsupportedVersionError(
                "checkpoint %s: unsupported format version %s; this reader reads "
                "format version %d.x (up to %d.%d). Was it written by a newer "
                "dtrain?" % (self.path, version, MAJOR_VERSION, MAJOR_VERSION,
                             MINOR_VERSION))
        self.metadata_count, self.tensor_count, self.file_size = struct.unpack_from(
            "<IIQ", header, 28)
        self.pos = header_size   # fields a newer minor version appended are skipped
        if self.file_size > self.actual_size:
            raise self.corrupt("truncated: header says the file has %d bytes, "
                               "but it has %d" % (self.file_size, self.actual_size))
        if self.file_size < self.actual_size:
            raise self.corrupt("file has %d bytes, but its header says %d (data "
                               "appended after the footer?)"
                               % (self.actual_size, self.file_size))
        min_body = (self.metadata_count * MIN_METADATA_ENTRY_SIZE +
                    self.tensor_count * MIN_TENSOR_RECORD_SIZE)
        if min_body > self.body_left():
            raise self.corrupt("%d metadata entries and %d tensor records cannot "
                               "fit in %d bytes of body"
                               % (self.metadata_count, self.tensor_count,
                                  self.body_left()))

    def parse_metadata_entry(self, i, metadata):
        what = "metadata entry %d" % i
        start = self.pos
        self.need(4, what)
        key_length = self.u32()
        if key_length > MAX_KEY_LENGTH:
            raise self.corrupt("%s: key length %d exceeds the limit of %d"
                               % (what, key_length, MAX_KEY_LENGTH))
        self.need(key_length + 4, what)
        key = self.take(key_length)
        value_length = self.u32()
        if value_length > MAX_VALUE_LENGTH:
            raise self.corrupt("%s: value length %d exceeds the limit of %d"
                               % (what, value_length, MAX_VALUE_LENGTH))
        self.need(value_length + 4, what)
        value = self.take(value_length)
        crc = crc32c(self.buf[start:self.pos])
        stored = self.u32()
        if stored != crc:
            raise self.corrupt("checksum mismatch in %s (stored %s, computed %s)"
                               % (what, _hex(stored), _hex(crc)))
        key = _decode(key)
        if key in metadata:
            raise self.corrupt("%s: duplicate metadata key %s" % (what, _quote(key)))
        metadata[key] = _decode(value)

    def parse_tensor_record(self, i):
        what = "tensor record %d" % i
        start = self.pos
        self.need(4, what)
        name_length = self.u32()
        if name_length == 0 or name_length > MAX_NAME_LENGTH:
            raise self.corrupt("%s: name length %d is outside 1..%d"
                               % (what, name_length, MAX_NAME_LENGTH))
        self.need(name_length + 8, what)
        name = self.take(name_length)
        dtype_code = struct.unpack("<i", self.take(4))[0]
        rank = self.u32()
        if rank > MAX_RANK:
            raise self.corrupt("%s: rank %d exceeds the limit of %d"
                               % (what, rank, MAX_RANK))
        self.need(8 * rank + 12, what)
        shape = list(struct.unpack("<%dq" % rank, self.take(8 * rank)))
        data_length = self.u64()
        crc = crc32c(self.buf[start:self.pos])
        stored = self.u32()
        if stored != crc:
            raise self.corrupt("checksum mismatch in the header of %s (stored %s, "
                               "computed %s)" % (what, _hex(stored), _hex(crc)))
        # The record header is intact from here on: the name can be trusted.
        name = _decode(name)
        what = "tensor %s (record %d)" % (_quote(name), i)
        if any(d < 0 for d in shape):
            raise self.corrupt("%s: negative dimension in shape %s" % (what, shape))
        elements = 1
        for d in shape:
            elements *= d
        if elements > INT64_MAX:
            raise self.corrupt("%s: element count of shape %s overflows int64"
                               % (what, shape))
        left = self.body_left()
        if data_length > left or left - data_length < 4:
            raise self.corrupt("%s: data length %d plus its checksum does not fit "
                               "in the %d bytes left before the footer (corrupt "
                               "length or count)" % (what, data_length, left))
        data = self.take(data_length)
        data_crc = crc32c(data)
        stored = self.u32()
        if stored != data_crc:
            raise self.corrupt("checksum mismatch in the data of %s (stored %s, "
                               "computed %s)" % (what, _hex(stored), _hex(data_crc)))
        # Container checks done; now the dense-tensor check (ValidateRecord).
        if dtype_code not in DTYPES:
            raise UnknownDTypeError(
                "checkpoint %s: %s has dtype code %d, which this reader does not "
                "know (known: %s)" % (self.path, what, dtype_code,
                                      ", ".join("%d=%s" % kv for kv in
                                                sorted(DTYPE_NAMES.items()))))
        dt = DTYPES[dtype_code]
        if data_length != elements * dt.itemsize:
            raise self.corrupt("%s: data has %d bytes, expected %d (%d elements "
                               "of %d bytes, dtype %s, shape %s)"
                               % (what, data_length, elements * dt.itemsize,
                                  elements, dt.itemsize, DTYPE_NAMES[dtype_code],
                                  shape))
        array = np.frombuffer(data, dtype=dt).reshape(shape)
        array = array.astype(dt.newbyteorder("="), copy=True)  # writable, native
        return name, array

    def parse_footer(self):
        left = self.body_left()
        if left != 0:
            raise self.corrupt("%d unexpected bytes at offset %d, after the last "
                               "tensor record" % (left, self.pos))
        footer_size = self.u64()
        actual = crc32c(self.buf[:self.pos])
        stored = self.u32()
        if footer_size != self.file_size:
            raise self.corrupt("footer says the file has %d bytes, the header "
                               "says %d" % (footer_size, self.file_size))
        if stored != actual:
            raise self.corrupt("whole-file checksum mismatch (stored %s, computed %s)"
                               % (_hex(stored), _hex(actual)))


def read_checkpoint(path):
    """Reads and verifies the dtrain checkpoint at `path`.

    Returns (metadata, tensors): metadata a dict of str -> str, tensors an
    OrderedDict of name -> numpy array in file order. Raises a
    CheckpointError subclass (see the module docstring) when the file is not
    a valid 1.x checkpoint, OSError when it cannot be read.
    """
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isfile(path):
        raise NotACheckpointError("checkpoint %s: not a regular file (a directory?)"
                                  % path)
    with open(path, "rb") as fh:
        buf = fh.read()
    return _Parser(path, buf).parse()


def _self_test():
    assert crc32c(b"123456789") == 0xE3069283, hex(crc32c(b"123456789"))
    assert crc32c(b"") == 0
    rng = np.random.RandomState(0)
    for n in (0, 1, 7, 8, 9, 15, 16, 17, 100, 1031):
        data = rng.randint(0, 256, size=n).astype(np.uint8).tobytes()
        assert crc32c(data) == _crc32c_bytewise(data), n
        for cut in (0, n // 3, n):
            assert crc32c_extend(crc32c(data[:cut]), data[cut:]) == crc32c(data), (n, cut)
    # 32 zero bytes / 32 0xFF bytes: RFC 3720 (iSCSI) test vectors.
    assert crc32c(b"\x00" * 32) == 0x8A9136AA
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E
    print("dtrain_checkpoint self-test: OK")


def main(argv):
    if len(argv) == 2 and argv[1] == "--self_test":
        _self_test()
        return 0
    if len(argv) != 2 or argv[1].startswith("-"):
        print("usage: %s FILE | --self_test" % argv[0], file=sys.stderr)
        return 2
    try:
        metadata, tensors = read_checkpoint(argv[1])
    except (CheckpointError, OSError) as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    for k, v in metadata.items():
        print("metadata %s=%s" % (k, v))
    for name, a in tensors.items():
        print("tensor %s dtype=%s shape=%s mean=%.6g std=%.6g" % (
            name, a.dtype, list(a.shape),
            float(a.astype(np.float64).mean()) if a.size else 0.0,
            float(a.astype(np.float64).std()) if a.size else 0.0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

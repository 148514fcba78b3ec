#!/usr/bin/env bash
# `trainctl data check` and `data pack` on an image folder this test writes
# (gray PNGs made with Python's zlib, 3 classes): counts, classes in name
# order, the histogram, -o json; pack to shards and check them; a corrupt
# image fails the check naming the file, and --skip_corrupt counts it.
set -euo pipefail
TRAINCTL="$1"
DIR="${TEST_TMPDIR:-$(mktemp -d)}/data_cmd"
rm -rf "$DIR"
mkdir -p "$DIR"
python3 - "$DIR/folder" <<'PY'
import os, struct, sys, zlib
root = sys.argv[1]
def png(value):
    def chunk(t, d):
        return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
    raw = b''.join(b'\x00' + bytes([(value + x + y) % 256 for x in range(8)]) for y in range(6))
    return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 8, 6, 8, 0, 0, 0, 0)) +
            chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))
for cls, count in (('zebra', 2), ('ant', 4), ('moth', 3)):
    os.makedirs(os.path.join(root, cls))
    for i in range(count):
        open(os.path.join(root, cls, '%03d.png' % i), 'wb').write(png(i * 10))
PY
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$TRAINCTL" data check "$DIR/folder")
echo "$out" | grep -q "samples 9  shape 1 x 6 x 8  classes 3" || fail "summary: $out"
# Classes sorted by name: ant (4), moth (3), zebra (2).
echo "$out" | grep -Eq "^  0 +ant +4$" || fail "class 0: $out"
echo "$out" | grep -Eq "^  2 +zebra +2$" || fail "class 2: $out"

json=$("$TRAINCTL" data check -o json "$DIR/folder")
python3 - "$json" <<'PY' || fail "json: $json"
import json, sys
d = json.loads(sys.argv[1])["train"]
assert d["format"] == "image_folder" and d["samples"] == 9, d
assert [c["name"] for c in d["classes"]] == ["ant", "moth", "zebra"], d
assert [c["samples"] for c in d["classes"]] == [4, 3, 2], d
assert (d["channels"], d["height"], d["width"]) == (1, 6, 8), d
PY

packed=$("$TRAINCTL" data pack --format=webdataset --shard_size=4 "$DIR/folder" "$DIR/shards")
echo "$packed" | grep -q "train: 9 samples in 3 shards: $DIR/shards/train-{000000..000002}.tar" \
  || fail "pack: $packed"
out=$("$TRAINCTL" data check "$DIR/shards/train-{000000..000002}.tar")
echo "$out" | grep -q "samples 9  shape 1 x 6 x 8  classes 3" || fail "packed summary: $out"
echo "$out" | grep -Eq "^  0 +4$" || fail "packed class 0: $out"

head -c 30 "$DIR/folder/moth/001.png" > "$DIR/cut.png" && mv "$DIR/cut.png" "$DIR/folder/moth/001.png"
if err=$("$TRAINCTL" data check "$DIR/folder" 2>&1); then fail "corrupt image accepted: $err"; fi
echo "$err" | grep -q "moth/001.png (sample 5): corrupt PNG" || fail "corrupt message: $err"
out=$("$TRAINCTL" data check --skip_corrupt "$DIR/folder")
echo "$out" | grep -q "samples 8  shape 1 x 6 x 8  classes 3  corrupt skipped 1" \
  || fail "skip_corrupt: $out"
if "$TRAINCTL" data pack --format=tfrecord "$DIR/folder" "$DIR/x" 2>/dev/null; then
  fail "unknown output format accepted"
fi
echo "PASS"

#!/usr/bin/python3
"""Reference implementation of dtrain's deterministic epoch order.

Local stand-in for libs/data/epoch_order.py (written in parallel by another
engineer); run this file to compare the two when both exist:

    /usr/bin/python3 tests/reference/epoch_order_ref.py

Algorithm (all arithmetic mod 2^64, seed >= 0):
    a = list(range(n))
    state = seed ^ (epoch * 0xD1B54A32D192ED03)
    next():                          # splitmix64
        state += 0x9E3779B97F4A7C15
        z = state
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        return z ^ (z >> 31)
    for i from n-1 down to 1:        # Fisher-Yates
        j = next() % (i + 1)
        swap a[i], a[j]
With shuffle=False the order is list(range(n)).
"""
import os
import sys

MASK = (1 << 64) - 1
GOLDEN_ARGS = ((10, 0, 0), (10, 0, 1), (10, 42, 3), (1, 5, 5), (2, 0, 0))


def epoch_order(n, seed, epoch, shuffle=True):
    a = list(range(n))
    if not shuffle or n < 2:
        return a
    state = (seed ^ (epoch * 0xD1B54A32D192ED03)) & MASK
    for i in range(n - 1, 0, -1):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z = z ^ (z >> 31)
        j = z % (i + 1)
        a[i], a[j] = a[j], a[i]
    return a


def load_epoch_order():
    """Returns (epoch_order, source): libs/data/epoch_order.py when present,
    else this file's implementation."""
    root = os.path.abspath(os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "..", ".."))
    path = os.path.join(root, "libs", "data", "epoch_order.py")
    if os.path.exists(path):
        import importlib.util
        dont = sys.dont_write_bytecode
        sys.dont_write_bytecode = True
        spec = importlib.util.spec_from_file_location("dtrain_epoch_order",
                                                      path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.dont_write_bytecode = dont
        return mod.epoch_order, "libs/data/epoch_order.py"
    return epoch_order, "tests/reference/epoch_order_ref.py"


def main():
    for args in GOLDEN_ARGS:
        print("epoch_order%r = %r" % (args, epoch_order(*args)))
    big = epoch_order(60000, 0, 0)
    assert sorted(big) == list(range(60000))
    print("epoch_order(60000, 0, 0)[:8] = %r" % big[:8])
    other, src = load_epoch_order()
    if src.startswith("libs/"):
        bad = 0
        for args in GOLDEN_ARGS + ((60000, 0, 0), (60000, 0, 9),
                                   (60000, 7, 2), (1000, 3, 4)):
            mine = epoch_order(*args)
            theirs = [int(v) for v in other(*args)]
            if mine != theirs:
                bad += 1
                print("MISMATCH for %r" % (args,))
        print("compare with %s: %s" % (src, "OK" if bad == 0 else "FAILED"))
        sys.exit(1 if bad else 0)
    print("libs/data/epoch_order.py not present; nothing to compare")


if __name__ == "__main__":
    main()

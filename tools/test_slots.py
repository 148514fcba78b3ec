#!/usr/bin/env python3
"""How long the tests of a `bazel test` take on 2 cores with N of them at a
time (.bazelrc's --local_test_jobs), replayed from measured numbers:

    bazel test --run_under=$PWD/tools/testcpu --nocache_test_results //...
    tools/test_slots.py "$(bazel info bazel-testlogs)" build/test-logs/bazel-test.profile.gz

Each test's CPU and wall seconds alone come from the testcpu line at the end
of its test.log (shards apart); the order in which the tests start comes from
the profile of a run (tools/test keeps the last one). The replay starts
tests in that order while fewer than N run; when the running tests ask for
more than the 2 cores (each its CPU over its wall seconds), all of them slow
down in proportion. Exclusive targets run alone at the end. Prints, for each
N, the phase's seconds and the idle core-seconds in it, as key=value lines.
It is a model (no memory, cache or I/O effects), good for comparing N.
"""
import gzip
import json
import os
import re
import sys

CORES = 2.0
EXCLUSIVE = {"tests/netlab/netlab_test", "tests/e2e/straggler_e2e_test"}


def measured(testlogs):
    tests = {}
    for d, _, files in os.walk(testlogs):
        if "test.log" not in files:
            continue
        with open(os.path.join(d, "test.log"), errors="replace") as f:
            m = re.findall(r"testcpu cpu_seconds=([0-9.]+) wall_seconds=([0-9.]+)", f.read())
        if m:
            tests[os.path.relpath(d, testlogs)] = (sum(float(c) for c, _ in m),
                                                   max(sum(float(w) for _, w in m), 0.05))
    # A target sharded since: its old top-level log is stale.
    for name in [n for n in tests if any(k.startswith(n + "/shard_") for k in tests)]:
        del tests[name]
    return tests


def start_order(profile):
    with gzip.open(profile) as f:
        events = json.load(f)["traceEvents"]
    order = []
    for e in sorted((e for e in events if e.get("ph") == "X" and
                     e.get("cat") == "action processing" and e["name"].startswith("Testing //")),
                    key=lambda e: e["ts"]):
        m = re.match(r"Testing //(.*):(\S+)(?: \(shard (\d+) of (\d+)\))?", e["name"])
        if m:
            order.append(f"{m.group(1)}/{m.group(2)}" +
                         (f"/shard_{m.group(3)}_of_{m.group(4)}" if m.group(3) else ""))
    return order


def replay(tests, order, slots, dt=0.1):
    queue = [t for t in order if t in tests and t not in EXCLUSIVE]
    running, t, idle = {}, 0.0, 0.0
    while queue or running:
        while queue and len(running) < slots:
            name = queue.pop(0)
            running[name] = tests[name][1]
        demand = sum(tests[n][0] / tests[n][1] for n in running)
        speed = min(1.0, CORES / demand) if demand > 0 else 1.0
        idle += max(0.0, CORES - demand) * dt
        for n in list(running):
            running[n] -= dt * speed
            if running[n] <= 0:
                del running[n]
        t += dt
    return t + sum(tests[n][1] for n in EXCLUSIVE if n in tests), idle


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    tests, order = measured(argv[1]), start_order(argv[2])
    if not tests:
        print(f"test_slots: no testcpu lines under {argv[1]}: run the tests under "
              "--run_under=$PWD/tools/testcpu first", file=sys.stderr)
        return 1
    unmeasured = [t for t in order if t not in tests]
    print(f"tests_measured={len(tests)} cpu_seconds={sum(c for c, _ in tests.values()):.0f} "
          f"wall_seconds={sum(w for _, w in tests.values()):.0f} "
          f"started_unmeasured={len(unmeasured)}")
    for slots in (1, 2, 3, 4, 5):
        seconds, idle = replay(tests, order, slots)
        print(f"local_test_jobs={slots} phase_seconds={seconds:.0f} idle_core_seconds={idle:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

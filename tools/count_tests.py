#!/usr/bin/env python3
"""Counts test cases for tools/test from Bazel's build events and test logs.

usage: count_tests.py BEP_JSON TESTLOGS_DIR TARGET...

Every expected test target gets counted: a target whose tests ran counts its
GoogleTest cases from test.xml (passed, failed, skipped, disabled; every
shard's test.xml for a sharded target); a target
that did not run (failed to build, cancelled) counts as one failure. Skipped
cases (GTEST_SKIP, which says why) and disabled ones (a DISABLED_ prefix:
never run, never looked at) are reported apart: disabled cases are listed by
name, since a disabled test is one nobody is checking. Prints the failing
targets, the disabled cases, the 10 slowest targets with their seconds (from
the build events' test results; "cached" when Bazel reused an earlier run),
and then one line: "N passed, N failed[, N skipped]". Exits 1 if anything
failed.
"""
import glob
import json
import os
import sys
import xml.etree.ElementTree as ET


def label_dir(label):
    # //libs/base:status_test -> libs/base/status_test
    pkg, _, name = label.lstrip("/").partition(":")
    return os.path.join(pkg, name)


def xml_files(testlogs, label, from_events=None):
    """The test.xml files of one target: those its build events name (one
    per shard and run), else its own, else one per shard
    (shard_<i>_of_<n>/test.xml; a sharded target has no top-level one, but
    a test log directory may keep one from before the target was sharded)."""
    named = [p for p in (from_events or {}).get(label, []) if os.path.exists(p)]
    if named:
        return sorted(set(named))
    top = os.path.join(testlogs, label_dir(label), "test.xml")
    if os.path.exists(top):
        return [top]
    return sorted(glob.glob(os.path.join(testlogs, label_dir(label), "shard_*_of_*", "test.xml")))


def count_xml(path):
    """(passed, failed, skipped, [disabled case names]) of one test.xml."""
    passed = failed = skipped = 0
    disabled = []
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.get("result") == "suppressed" or case.get("status") == "notrun":
            # GoogleTest writes DISABLED_ cases as status="notrun"
            # result="suppressed".
            disabled.append("%s.%s" % (case.get("classname", "?"), case.get("name", "?")))
        elif case.get("result") == "skipped" or case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, disabled


def xml_seconds(path):
    """The run time a test.xml records (its root's time attribute), or None."""
    try:
        return float(ET.parse(path).getroot().get("time"))
    except (ET.ParseError, OSError, TypeError, ValueError):
        return None


def slowest(durations, cached, n=10):
    """Lines naming the n slowest targets, slowest first, with their seconds."""
    ranked = sorted(durations.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    if not ranked:
        return []
    lines = ["slowest %d test targets (seconds):" % len(ranked)]
    for label, secs in ranked:
        lines.append("  %7.1f  %s%s" % (secs, label, " (cached)" if cached.get(label) else ""))
    return lines


def main():
    bep, testlogs, targets = sys.argv[1], sys.argv[2], sys.argv[3:]
    status = {}
    # label -> seconds: the sum of its test actions (shards, runs, attempts),
    # each as Bazel timed it; label -> whether every action came from a cache.
    durations = {}
    cached = {}
    xmls = {}  # label -> the test.xml paths its test results name
    if os.path.exists(bep):
        with open(bep) as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                summary = ev.get("id", {}).get("testSummary")
                if summary:
                    status[summary["label"]] = ev.get("testSummary", {}).get("overallStatus", "NO_STATUS")
                result = ev.get("id", {}).get("testResult")
                if result:
                    r = ev.get("testResult", {})
                    label = result["label"]
                    ms = int(r.get("testAttemptDurationMillis", 0) or 0)
                    durations[label] = durations.get(label, 0.0) + ms / 1000.0
                    hit = bool(r.get("cachedLocally") or
                               r.get("executionInfo", {}).get("cachedRemotely"))
                    cached[label] = cached.get(label, True) and hit
                    for out in r.get("testActionOutput", []):
                        uri = out.get("uri", "")
                        if out.get("name") == "test.xml" and uri.startswith("file://"):
                            xmls.setdefault(label, []).append(uri[len("file://"):])
    passed = failed = skipped = 0
    bad = []
    disabled = []
    for t in targets:
        st = status.get(t)
        files = xml_files(testlogs, t, xmls)
        if st is None:
            failed += 1
            bad.append("%s (did not run: failed to build or was cancelled)" % t)
            continue
        if not files:
            if st in ("PASSED", "FLAKY"):
                passed += 1
            else:
                failed += 1
                bad.append("%s (%s)" % (t, st))
            continue
        p = f = s = 0
        for xml in files:
            xp, xf, xs, d = count_xml(xml)
            p, f, s = p + xp, f + xf, s + xs
            disabled += ["%s %s" % (t, name) for name in d if "%s %s" % (t, name) not in disabled]
        if st not in ("PASSED", "FLAKY") and f == 0:
            # Crashed or timed out after the last case it recorded.
            f = 1
        passed, failed, skipped = passed + p, failed + f, skipped + s
        if f:
            bad.append("%s (%s)" % (t, st))
    for b in bad:
        print("FAILED: " + b)
    if disabled:
        print("disabled (DISABLED_, not run, not counted): %d" % len(disabled))
        for d in disabled:
            print("  DISABLED: " + d)
    for t in targets:
        if t not in durations and t in status:
            secs = [xml_seconds(path) for path in xml_files(testlogs, t, xmls)]
            secs = [x for x in secs if x is not None]
            if secs:
                durations[t] = sum(secs)
    for line in slowest(durations, cached):
        print(line)
    line = "%d passed, %d failed" % (passed, failed)
    if skipped:
        line += ", %d skipped" % skipped
    print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

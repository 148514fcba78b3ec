#!/usr/bin/env python3
"""tools/count_tests.py against a made-up run: a plain target, a sharded one
(its cases in shard_<i>_of_<n>/test.xml, no top-level test.xml) and a
failed one; the final line counts every shard's cases."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def write_xml(path, cases):
    """cases: (name, "ok" | "fail" | "skip")."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = []
    for name, how in cases:
        inner = {"ok": "", "fail": "<failure message='x'/>",
                 "skip": "<skipped message='why'/>"}[how]
        body.append("<testcase name='%s' status='run' result='%s' time='1.5'>%s</testcase>"
                    % (name, "skipped" if how == "skip" else "completed", inner))
    with open(path, "w") as f:
        f.write("<?xml version='1.0'?><testsuites tests='%d' time='3'><testsuite name='S'>%s"
                "</testsuite></testsuites>" % (len(cases), "".join(body)))


class CountTestsTest(unittest.TestCase):
    def run_count(self, statuses, layout, outputs=None):
        with tempfile.TemporaryDirectory() as d:
            logs = os.path.join(d, "testlogs")
            for rel, cases in layout.items():
                write_xml(os.path.join(logs, rel), cases)
            bep = os.path.join(d, "bep.json")
            with open(bep, "w") as f:
                for label, rels in (outputs or {}).items():
                    for rel in rels:
                        f.write(json.dumps({
                            "id": {"testResult": {"label": label}},
                            "testResult": {"testAttemptDurationMillis": 2000, "testActionOutput": [
                                {"name": "test.log", "uri": "file://" + os.path.join(logs, "x")},
                                {"name": "test.xml", "uri": "file://" + os.path.join(logs, rel)}]}})
                                + "\n")
                for label, st in statuses.items():
                    f.write(json.dumps({"id": {"testSummary": {"label": label}},
                                        "testSummary": {"overallStatus": st}}) + "\n")
            p = subprocess.run([sys.executable, os.path.join(HERE, "count_tests.py"), bep, logs]
                               + list(statuses), capture_output=True, text=True)
            return p.returncode, p.stdout

    def test_every_shard_is_counted(self):
        rc, out = self.run_count(
            {"//a:plain_test": "PASSED", "//a:sharded_test": "PASSED"},
            {"a/plain_test/test.xml": [("A", "ok"), ("B", "skip")],
             "a/sharded_test/shard_1_of_2/test.xml": [("C", "ok"), ("D", "ok")],
             "a/sharded_test/shard_2_of_2/test.xml": [("E", "ok"), ("F", "ok"), ("G", "ok")]})
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.strip().splitlines()[-1], "6 passed, 0 failed, 1 skipped")
        # Its seconds: the shards' together (test.xml times, no build events).
        self.assertIn("6.0  //a:sharded_test", out)

    def test_the_build_events_name_the_files_over_a_stale_one(self):
        # A test.xml left from before the target was sharded: the build
        # events name the shards' files, and those are counted.
        rc, out = self.run_count(
            {"//a:sharded_test": "PASSED"},
            {"a/sharded_test/test.xml": [("Old", "ok")],
             "a/sharded_test/shard_1_of_2/test.xml": [("C", "ok"), ("D", "ok")],
             "a/sharded_test/shard_2_of_2/test.xml": [("E", "ok")]},
            outputs={"//a:sharded_test": ["a/sharded_test/shard_1_of_2/test.xml",
                                          "a/sharded_test/shard_2_of_2/test.xml"]})
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.strip().splitlines()[-1], "3 passed, 0 failed")
        self.assertIn("4.0  //a:sharded_test", out)  # the two results' seconds

    def test_a_failed_case_in_one_shard_fails_the_run(self):
        rc, out = self.run_count(
            {"//a:sharded_test": "FAILED"},
            {"a/sharded_test/shard_1_of_2/test.xml": [("C", "ok")],
             "a/sharded_test/shard_2_of_2/test.xml": [("E", "fail")]})
        self.assertEqual(rc, 1, out)
        self.assertIn("FAILED: //a:sharded_test (FAILED)", out)
        self.assertEqual(out.strip().splitlines()[-1], "1 passed, 1 failed")

    def test_a_target_that_never_ran_is_a_failure(self):
        rc, out = self.run_count({"//a:plain_test": "PASSED"}, {})
        self.assertEqual(out.strip().splitlines()[-1], "1 passed, 0 failed")
        with tempfile.TemporaryDirectory() as d:
            bep = os.path.join(d, "bep.json")
            open(bep, "w").close()
            p = subprocess.run([sys.executable, os.path.join(HERE, "count_tests.py"), bep, d,
                                "//a:gone_test"], capture_output=True, text=True)
            self.assertEqual(p.returncode, 1)
            self.assertIn("//a:gone_test (did not run", p.stdout)


if __name__ == "__main__":
    unittest.main()

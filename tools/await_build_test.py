#!/usr/bin/env python3
"""tools/await_build.py against a build event file written while it waits,
as Bazel appends to it: it returns once the labels are built (not before),
fails on a failed target, and fails when the build ends without them."""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def completed(label, success=True):
    return json.dumps({"id": {"targetCompleted": {"label": label}},
                       "completed": {"success": success}}) + "\n"


FINISHED = json.dumps({"id": {"buildFinished": {}}, "finished": {}}) + "\n"
PROGRESS = json.dumps({"id": {"progress": {"opaqueCount": 1}}, "progress": {}}) + "\n"


class AwaitBuildTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.bep = os.path.join(self.dir.name, "bep.json")
        self.done = os.path.join(self.dir.name, "bazel-returned")

    def tearDown(self):
        self.dir.cleanup()

    def start(self, *labels):
        return subprocess.Popen(
            [sys.executable, os.path.join(HERE, "await_build.py"), self.bep, self.done, *labels],
            stderr=subprocess.PIPE, text=True)

    def append(self, text):
        with open(self.bep, "a") as f:
            f.write(text)

    def test_returns_once_every_label_is_built(self):
        p = self.start("//a:x", "//b:y")
        # Not before the file exists, nor with one label of two built.
        time.sleep(1.5)
        self.assertIsNone(p.poll())
        self.append(PROGRESS + completed("//a:x") + completed("//c:other"))
        time.sleep(2.5)
        self.assertIsNone(p.poll())
        # An event split across two writes is read once it is whole.
        line = completed("//b:y")
        self.append(line[:20])
        time.sleep(2.5)
        self.assertIsNone(p.poll())
        self.append(line[20:])
        self.assertEqual(p.wait(timeout=10), 0, p.stderr.read())

    def test_a_failed_label_fails(self):
        p = self.start("//a:x", "//b:y")
        self.append(completed("//a:x", success=False))
        self.assertEqual(p.wait(timeout=10), 1)
        self.assertIn("failed to build //a:x", p.stderr.read())

    def test_a_finished_build_without_the_labels_fails(self):
        p = self.start("//a:x", "//b:y")
        self.append(completed("//a:x") + FINISHED)
        self.assertEqual(p.wait(timeout=10), 1)
        self.assertIn("finished without //b:y", p.stderr.read())

    def test_bazel_returning_without_a_last_event_fails(self):
        p = self.start("//a:x")
        threading.Timer(1.0, lambda: open(self.done, "w").close()).start()
        self.assertEqual(p.wait(timeout=10), 1)
        self.assertIn("finished without //a:x", p.stderr.read())

    def test_labels_built_before_bazel_returned_still_count(self):
        self.append(completed("//a:x"))
        open(self.done, "w").close()
        p = self.start("//a:x")
        self.assertEqual(p.wait(timeout=10), 0, p.stderr.read())


if __name__ == "__main__":
    unittest.main()

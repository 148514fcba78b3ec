#!/usr/bin/env python3
"""Waits, while a `bazel test` runs, until its build events say that every
given target is built, so that work needing those binaries (tools/test: the
GPU bundle and the images) can start beside the tests instead of after them.

    tools/await_build.py BEP_JSON_FILE DONE_FILE LABEL...

BEP_JSON_FILE is the --build_event_json_file that Bazel appends to as it
builds; DONE_FILE is a file the caller creates once `bazel test` has
returned (Bazel may end without a last event, for example when killed).
Exits 0 once every LABEL has a successful targetCompleted event; 1 when one
of them failed, or when the build finished (its buildFinished event, or
DONE_FILE) without them all, naming the missing ones on stderr; 2 on bad
usage. Only reads the file: Bazel's server lock stays with `bazel test`.
"""
import json
import os
import sys
import time

POLL_S = 1.0


def scan(f, pending, state):
    """Reads the complete lines appended to `f` since the last call."""
    while True:
        pos = f.tell()
        line = f.readline()
        if not line:
            return
        if not line.endswith("\n"):  # Bazel is still writing this event
            f.seek(pos)
            return
        try:
            event = json.loads(line)
        except ValueError:
            continue
        ident = event.get("id", {})
        if "buildFinished" in ident:
            state["finished"] = True
        done = ident.get("targetCompleted")
        if done and done.get("label") in pending:
            if event.get("completed", {}).get("success"):
                pending.discard(done["label"])
            else:
                state["failed"].append(done["label"])


def main(argv):
    if len(argv) < 4:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    bep, done_file, labels = argv[1], argv[2], set(argv[3:])
    pending = set(labels)
    state = {"finished": False, "failed": []}
    f = None
    while True:
        # Whether bazel had returned before this last read of the file.
        returned = os.path.exists(done_file)
        if f is None and os.path.exists(bep):
            f = open(bep)
        if f is not None:
            scan(f, pending, state)
        if not pending:
            return 0
        if state["failed"]:
            print("await_build: failed to build " + " ".join(sorted(state["failed"])),
                  file=sys.stderr)
            return 1
        if state["finished"] or returned:
            print("await_build: the build finished without " + " ".join(sorted(pending)),
                  file=sys.stderr)
            return 1
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv))

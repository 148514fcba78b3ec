#!/usr/bin/env python3
"""The real GPU job of tools/gpu-check (issue 34): a local cluster with CUDA
trainers on the GPU machine, ResNet-18 on Fashion-MNIST at the d2l concise
multi-GPU section's settings, submitted with `trainctl submit --wait`, test
accuracy and seconds per epoch next to the seed's table.

    python3 tools/gpu/gpu_job.py --bundle DIR --data_dir DIR [--epochs 4] [--budget_s 300] [--gpus N]

DIR (--bundle) is the unpacked GPU bundle: runfiles/dtrain/services/...
holds trainctl, trainer, scheduler_server and kvstore_server as Bazel lays
them out (trainctl finds the others next to itself). --data_dir holds the
four Fashion-MNIST IDX files (train-images-idx3-ubyte.gz, ...).

What it runs:
  1. `trainctl cluster up --trainers=2 --restart=never --trainer_bin=W`: the
     scheduler and two trainer daemons, mutual TLS, each a process with its
     own directory and log. W is a two-line wrapper that runs the bundled
     trainer with `--devices=cuda:0 --cuda_collective=tcp --data_roots=...`
     appended (absl takes the last --devices), so both trainers offer the
     one GPU and share it through the host (TCP) collective.
  2. Job A: one CUDA trainer, batch 256, lr 0.1, 4 epochs (the seed's first
     table: test accuracy 0.87, 0.90, 0.92, 0.91 at 13.6 s per epoch).
  3. Job B: two trainer processes on the same GPU, ALLREDUCE over TCP
     (gradients staged through host memory), batch 512, lr 0.2 (the seed's
     second table, which ran on two GPUs).
  With --gpus N > 1 (a multi-GPU machine; default: what nvidia-smi lists)
  trainer i runs on cuda:i with NCCL between trainers (the wrapper reads
  its --name=trainer-<i>), the cluster has N trainers, job B runs on two
  GPUs (the seed's own second setting) and job C on all N (batch 256 per
  GPU, lr 0.1 per 256: the linear scaling rule), reporting its speedup
  over job A; docs/gpu.md says what a 2- and an 8-GPU check must show.
  All: plain SGD, d2l's normal(0, 0.01) init, seed 1. `trainctl submit
  --wait` watches each job to its end; meanwhile `trainctl get ID -o json`
  is polled to record each epoch's test accuracy and training seconds (the
  job status holds only the last epoch's).

Output (key=value lines; the run phase of tools/gpu-check prints them):
  job=A epoch=1 test_acc=0.8712 seconds=3.41 seed_test_acc=0.87 seed_seconds=13.6
  job=A status=SUCCEEDED final_test_acc=... min_acc=0.90 pass=yes wall_s=...
Exit status: 0 when both jobs SUCCEEDED and job A reached --min_acc; 1 when
not; 2 for a setup error (a missing binary or data file, the cluster not
starting); 3 when there is no GPU (nvidia-smi finds none): nothing ran.

--cpu_dry_run runs the same path with CPU trainers, LeNet, 2 epochs on 2,560
images and no accuracy bar: a check of this script on a machine without a
GPU (run it by hand; tools/gpu-check does not).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

SEED_A = {"acc": [0.87, 0.90, 0.92, 0.91], "seconds": 13.6}
# d2l's second table (2 GPUs, batch 512, lr 0.2) prints only the final
# figure; the run phase prints B's epochs next to A's seed for reference.
SEED_B_NOTE = "seed: 2 GPUs, batch 512, lr 0.2 (d2l 12.5 concise)"


def log(msg):
    print(msg, flush=True)


def run(cmd, env, timeout, check=True):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError("%s failed (rc %d):\n%s" % (" ".join(cmd[:3]), p.returncode,
                                                       p.stdout[-3000:]))
    return p


def list_gpus():
    """(the GPUs nvidia-smi lists, why there are none)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], "nvidia-smi: %s" % e
    gpus = [l for l in out.stdout.splitlines() if l.startswith("GPU ")]
    if out.returncode != 0 or not gpus:
        return [], "nvidia-smi -L found no GPU (rc %d)" % out.returncode
    return gpus, ""


def job_status(ctl, env, job_id):
    p = run([ctl, "get", job_id, "-o", "json"], env, 30, check=False)
    if p.returncode != 0:
        return None
    try:
        return json.loads(p.stdout)
    except ValueError:
        return None


def run_job(name, ctl, env, spec, deadline, out_dir):
    """Submits `spec` with --wait and polls it; returns (status dict, epochs)."""
    cmd = [ctl, "submit", "--wait", "--name=" + name] + ["--%s=%s" % kv for kv in spec.items()]
    log("job=%s submit: %s" % (name, " ".join(cmd[1:])))
    wait_log = open(os.path.join(out_dir, "job-%s-wait.log" % name), "w")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=wait_log, text=True)
    first = proc.stdout.readline()  # "submitted <id>"
    if not first.startswith("submitted "):
        proc.kill()
        raise RuntimeError("submit printed %r, not 'submitted <id>' (see %s)" %
                           (first, wait_log.name))
    job_id = first.split()[1]
    rest = []
    reader = threading.Thread(target=lambda: rest.extend(proc.stdout))
    reader.start()
    t0 = time.time()
    epochs = {}  # epoch -> (test_acc, epoch_seconds, at)
    last = None
    while proc.poll() is None:
        if time.time() > deadline:
            log("job=%s status=TIMEOUT after %.0fs; cancelling" % (name, time.time() - t0))
            run([ctl, "cancel", job_id, "--reason=gpu_job.py budget"], env, 30, check=False)
            proc.kill()
            break
        st = job_status(ctl, env, job_id)
        if st is not None:
            last = st
            e = int(st.get("epoch", 0))
            if e > 0 and e not in epochs and st.get("test_accuracy", -1) >= 0:
                epochs[e] = (st.get("test_accuracy", -1), st.get("epoch_seconds", 0),
                             time.time() - t0)
        time.sleep(0.2)
    proc.wait()
    reader.join(timeout=10)
    wait_log.write("".join(rest))
    wait_log.close()
    st = job_status(ctl, env, job_id) or last or {}
    e = int(st.get("epoch", 0))
    if e > 0 and e not in epochs:
        epochs[e] = (st.get("test_accuracy", -1), st.get("epoch_seconds", 0), time.time() - t0)
    return job_id, st, epochs, time.time() - t0, proc.returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--data_dir", required=True)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--budget_s", type=float, default=300)
    ap.add_argument("--min_acc", type=float, default=0.90)
    ap.add_argument("--out", default=None, help="logs (default: a temporary directory)")
    ap.add_argument("--cpu_dry_run", action="store_true")
    ap.add_argument("--gpus", type=int, default=0,
                    help="GPUs to use (0: every GPU nvidia-smi lists)")
    ap.add_argument("--keep", action="store_true", help="keep the cluster directory")
    a = ap.parse_args()
    deadline = time.time() + a.budget_s

    svc = os.path.join(os.path.abspath(a.bundle), "runfiles", "dtrain", "services")
    ctl = os.path.join(svc, "trainctl", "trainctl")
    trainer = os.path.join(svc, "trainer", "trainer")
    missing = [p for p in (ctl, trainer, os.path.join(svc, "scheduler", "scheduler_server"))
               if not os.access(p, os.X_OK)]
    data_dir = os.path.realpath(a.data_dir)
    for f in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
              "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        if not os.path.isfile(os.path.join(data_dir, f)):
            missing.append(os.path.join(data_dir, f))
    if missing:
        log("job status=SETUP_ERROR missing: %s" % " ".join(missing))
        return 2
    gpus = 1
    if not a.cpu_dry_run:
        found, why = list_gpus()
        if not found:
            log("job status=skipped: no GPU (%s)" % why)
            return 3
        gpus = min(a.gpus, len(found)) if a.gpus > 0 else len(found)
        log("job gpus=%d first=\"%s\"" % (gpus, found[0]))

    work = tempfile.mkdtemp(prefix="dtrain-gpu-job.")
    out_dir = a.out or work
    os.makedirs(out_dir, exist_ok=True)
    cluster = os.path.join(work, "cluster")
    wrapper = os.path.join(work, "trainer-cuda")
    # Trainer i (cluster up names it trainer-<i>) on cuda:(i mod gpus); TCP
    # between trainers sharing one GPU, NCCL when each has its own.
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\n")
        if a.cpu_dry_run:
            f.write("dev=cpu\n")
        else:
            f.write("i=0\nfor arg in \"$@\"; do case \"$arg\" in --name=trainer-*) "
                    "i=${arg#--name=trainer-} ;; esac; done\n")
            f.write("dev=cuda:$((i %% %d))\n" % gpus)
        f.write("exec %s \"$@\" --devices=$dev --cuda_collective=%s --data_roots=%s\n" %
                (trainer, "nccl" if gpus > 1 else "tcp", os.path.dirname(data_dir)))
    os.chmod(wrapper, 0o755)
    env = dict(os.environ)
    rc = 1
    try:
        t_up = time.time()
        up = run([ctl, "cluster", "up", "--dir=" + cluster, "--trainers=%d" % max(2, gpus),
                  "--restart=never",
                  "--trainer_bin=" + wrapper, "--start_timeout_s=60"], env, 120, check=False)
        if up.returncode != 0:
            log("job status=SETUP_ERROR cluster up failed (rc %d):" % up.returncode)
            for line in up.stdout.splitlines()[-20:]:
                log("    | " + line)
            return 2
        for line in up.stdout.splitlines():
            if line.startswith("export "):
                for kv in line[len("export "):].split():
                    k, _, v = kv.partition("=")
                    env[k] = v
        log("job cluster=up seconds=%.1f dir=%s" % (time.time() - t_up, cluster))
        common = {"model": "resnet18", "epochs": a.epochs, "device_kind": "cuda",
                  "devices_per_trainer": 1, "sync": "ALLREDUCE", "seed": 1,
                  "data_dir": data_dir, "init": "normal"}
        if a.cpu_dry_run:
            common.update({"model": "lenet", "epochs": 2, "device_kind": "cpu",
                           "train_limit": 2560, "test_limit": 1000})
        jobs = [("A", dict(common, num_trainers=1, batch_size=256, lr=0.1)),
                ("B", dict(common, num_trainers=2, batch_size=512, lr=0.2))]
        if gpus > 2:
            jobs.append(("C", dict(common, num_trainers=gpus, batch_size=256 * gpus,
                                   lr=round(0.1 * gpus, 4))))
        mean_seconds = {}
        rc = 0
        for name, spec in jobs:
            job_id, st, epochs, wall, wait_rc = run_job(name, ctl, env, spec, deadline, out_dir)
            for e in sorted(epochs):
                acc, secs, _ = epochs[e]
                seed = ""
                if name == "A" and e <= len(SEED_A["acc"]):
                    seed = " seed_test_acc=%.2f seed_seconds=%.1f" % (SEED_A["acc"][e - 1],
                                                                      SEED_A["seconds"])
                log("job=%s epoch=%d test_acc=%.4f seconds=%.2f%s" % (name, e, acc, secs, seed))
            state = st.get("state", "UNKNOWN")
            final = st.get("test_accuracy", -1)
            secs = [epochs[e][1] for e in sorted(epochs) if epochs[e][1] > 0]
            mean_s = sum(secs) / len(secs) if secs else 0
            mean_seconds[name] = mean_s
            speedup = ""
            if name != "A" and mean_seconds.get("A", 0) > 0 and mean_s > 0:
                speedup = " speedup_vs_A=%.2f" % (mean_seconds["A"] / mean_s)
            bar = a.min_acc if (name == "A" and not a.cpu_dry_run) else 0
            passed = state == "SUCCEEDED" and final >= bar
            log("job=%s id=%s status=%s trainers=%s batch=%s lr=%s final_test_acc=%.4f "
                "mean_epoch_seconds=%.2f seed_epoch_seconds=%s min_acc=%.2f pass=%s "
                "submit_wait_rc=%s wall_s=%.1f gpus=%d collective=%s%s%s" %
                (name, job_id, state, spec["num_trainers"], spec["batch_size"], spec["lr"], final,
                 mean_s, SEED_A["seconds"] if name == "A" else "n/a", bar,
                 "yes" if passed else "NO", wait_rc, wall, gpus,
                 "nccl" if gpus > 1 else ("none" if name == "A" else "tcp"), speedup,
                 " (%s)" % SEED_B_NOTE if name == "B" else ""))
            if not passed:
                rc = 1
                msg = st.get("error_message") or st.get("message") or ""
                if msg:
                    log("    error: %s" % msg[:500])
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        log("job status=SETUP_ERROR %s" % str(e)[:2000])
        rc = 2
    finally:
        run([ctl, "cluster", "down", "--dir=" + cluster, "--grace_s=10"], env, 60, check=False)
        for name in os.listdir(cluster) if os.path.isdir(cluster) else []:
            if name.endswith(".log") and out_dir != work:
                shutil.copy(os.path.join(cluster, name), os.path.join(out_dir, "job-" + name))
        if not a.keep and out_dir != work:
            shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())

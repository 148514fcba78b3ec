#!/usr/bin/env python3
"""Lists the metric names the rules and the dashboard use, with the service
expected to export each, one per line: NAME<TAB>EXPORTER.

EXPORTER is a Prometheus job (dtrain-scheduler, dtrain-kvstore, dtrain-trainer) or
several, comma-separated (dtrain_rpc_server_*: every scaffolded server), "prometheus"
for `up` (per scraped job: the job is given in the selector), "kubelet" for
metrics no dtrain service exports (kubelet_volume_stats_*), or "UNKNOWN"
(a test failure). Recording-rule outputs (names with a colon) are checked to
be recorded by the rules, not exported.

  metric_names.py RULES.yml... DASHBOARD.json...
"""
import json
import re
import sys

import yaml

KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "offset", "bool", "inf", "nan", "sum", "min", "max", "avg",
            "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values",
            "group", "le"}


def exprs_of(path):
    if path.endswith(".json"):
        def walk(o):
            if isinstance(o, dict):
                if "expr" in o and isinstance(o["expr"], str):
                    yield o["expr"]
                for v in o.values():
                    yield from walk(v)
            elif isinstance(o, list):
                for v in o:
                    yield from walk(v)
        yield from walk(json.load(open(path)))
    else:
        for group in yaml.safe_load(open(path))["groups"]:
            for rule in group["rules"]:
                yield rule["expr"]


def recorded(paths):
    out = set()
    for p in paths:
        if p.endswith((".yml", ".yaml")):
            for group in yaml.safe_load(open(p))["groups"]:
                out |= {r["record"] for r in group["rules"] if "record" in r}
    return out


def names(expr):
    """(metric, job-or-None) pairs in a PromQL expression."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)         # string literals
    e = re.sub(r"\$\{?\w+\}?", "1", e)                     # Grafana variables
    e = re.sub(r"\[[^\]]*\]", "", e)                       # ranges [5m]
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    out = []
    # Remember the job="..." selector of each metric before dropping matchers.
    raw = re.sub(r"\$\{?\w+\}?", "1", expr)
    jobs = {}
    for m in re.finditer(r'([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}', raw):
        j = re.search(r'job\s*=~?\s*"([^"]*)"', m.group(2))
        if j:
            jobs.setdefault(m.group(1), set()).update(j.group(1).split("|"))
    e = re.sub(r"\{[^}]*\}", " ", e)                        # label matchers
    for m in re.finditer(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(\s*\()?", e):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in KEYWORDS or re.fullmatch(r"\d+[smhdwy]", name):
            continue
        out.append((name, jobs.get(name)))
    return out


# The services whose gRPC server is the scaffold of libs/rpc/server.h, which
# exports dtrain_rpc_server_* (the trainer's serves health, reflection and
# Admin.Ping: its probes' calls).
RPC_SERVERS = "dtrain-kvstore,dtrain-scheduler,dtrain-trainer"


def exporter(name):
    if name.startswith("dtrain_rpc_server_"):
        return RPC_SERVERS
    if name.startswith("dtrain_scheduler_"):
        return "dtrain-scheduler"
    if name.startswith("dtrain_kvstore_"):
        return "dtrain-kvstore"
    if name.startswith(("dtrain_trainer_", "dtrain_job_")):
        return "dtrain-trainer"
    if name == "up":
        return "prometheus"
    if name.startswith("kubelet_"):
        return "kubelet"
    return "UNKNOWN"


def main(paths):
    rec = recorded(paths)
    seen = {}
    for p in paths:
        for expr in exprs_of(p):
            for name, jobs in names(expr):
                if ":" in name:
                    if name not in rec:
                        print(f"{name}\tUNRECORDED")
                    continue
                seen.setdefault(name, set()).update(jobs or ())
    for name in sorted(seen):
        exp = exporter(name)
        if exp == "prometheus":
            for job in sorted(seen[name]) or ["ANY"]:
                print(f"up\tprometheus:{job}")
        else:
            print(f"{name}\t{exp}")


if __name__ == "__main__":
    main(sys.argv[1:])

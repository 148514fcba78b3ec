#!/usr/bin/env python3
"""Policy checks on rendered manifests (one file per overlay): what the schema
cannot say. Exits 1 with one line per violation."""
import sys

import yaml

errors = []


def err(f, o, msg):
    errors.append(f"{f}: {o['kind']}/{o['metadata']['name']}: {msg}")


for f in sys.argv[1:]:
    docs = [d for d in yaml.safe_load_all(open(f)) if d]
    by = {}
    for d in docs:
        by.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
        if d["kind"] == "Secret":
            err(f, d, "Secrets are created by the operator of the cluster, never committed")
        if d["kind"] != "Namespace" and d["metadata"].get("namespace") != "dtrain":
            err(f, d, "not in namespace dtrain")
    gpu = "gpu" in f.rsplit("/", 1)[-1]
    for kind in ("Deployment", "StatefulSet"):
        for name, w in by.get(kind, {}).items():
            pod = w["spec"]["template"]["spec"]
            psc = pod.get("securityContext", {})
            if not psc.get("runAsNonRoot") or psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
                err(f, w, "pod must set runAsNonRoot and seccompProfile RuntimeDefault")
            if pod.get("automountServiceAccountToken") is not False:
                err(f, w, "must not mount a service account token")
            sa = pod.get("serviceAccountName")
            if sa not in by.get("ServiceAccount", {}):
                err(f, w, f"service account {sa} not defined")
            for vol in pod.get("volumes", []):
                if "configMap" in vol and vol["configMap"]["name"] not in by.get("ConfigMap", {}):
                    err(f, w, f"ConfigMap {vol['configMap']['name']} not defined")
                if "persistentVolumeClaim" in vol and vol["persistentVolumeClaim"]["claimName"] not in by.get("PersistentVolumeClaim", {}):
                    err(f, w, f"PVC {vol['persistentVolumeClaim']['claimName']} not defined")
                if "hostPath" in vol:
                    err(f, w, "hostPath volume")
            for c in pod["containers"]:
                sc = c.get("securityContext", {})
                if (sc.get("allowPrivilegeEscalation") is not False or sc.get("readOnlyRootFilesystem") is not True
                        or sc.get("privileged") or sc.get("capabilities", {}).get("drop") != ["ALL"]
                        or sc.get("capabilities", {}).get("add")):
                    err(f, w, f"container {c['name']}: needs no privilege escalation, read-only root, drop ALL")
                res = c.get("resources", {})
                for k in ("cpu", "memory"):
                    if k not in res.get("requests", {}) or k not in res.get("limits", {}):
                        err(f, w, f"container {c['name']}: {k} request and limit")
                wants_gpu = "nvidia.com/gpu" in res.get("limits", {})
                if name == "dtrain-trainer" and wants_gpu != gpu:
                    err(f, w, f"nvidia.com/gpu limit {'missing' if gpu else 'in the cpu overlay'}")
                if name != "dtrain-trainer" and wants_gpu:
                    err(f, w, "only trainers take GPUs")
                if not any("--flagfile=/etc/dtrain/" in a for a in c.get("args", [])):
                    err(f, w, "flags must come from the ConfigMap flagfile")
                if name in ("dtrain-scheduler", "dtrain-kvstore"):
                    grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
                    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                        if c.get(probe, {}).get("grpc", {}).get("port") != grpc_port:
                            err(f, w, f"{probe} must be a gRPC health check on port {grpc_port}")
                    ann = w["spec"]["template"]["metadata"].get("annotations", {})
                    mport = next(p["containerPort"] for p in c["ports"] if p["name"] == "metrics")
                    if ann.get("prometheus.io/scrape") != "true" or ann.get("prometheus.io/port") != str(mport):
                        err(f, w, "prometheus.io/scrape and prometheus.io/port annotations")
    for name in ("dtrain-kvstore", "dtrain-trainer"):
        s = by.get("StatefulSet", {}).get(name)
        svc = by.get("Service", {}).get(name)
        if not s or not svc or svc["spec"].get("clusterIP") != "None" or s["spec"]["serviceName"] != name:
            errors.append(f"{f}: {name} needs a StatefulSet with a headless Service")
        if name not in by.get("PodDisruptionBudget", {}):
            errors.append(f"{f}: {name} needs a PodDisruptionBudget")
    kv = by.get("StatefulSet", {}).get("dtrain-kvstore")
    if kv and not kv["spec"].get("volumeClaimTemplates"):
        errors.append(f"{f}: kvstore needs a volume per shard")
    # KVSTORE jobs: the trainers' --kvstore names every shard, in shard order,
    # by its stable DNS name under the headless Service
    # (<pod>.<service>.<namespace>.svc.cluster.local:<grpc port>), and the
    # shard index is the pod's ordinal.
    kv_svc = by.get("Service", {}).get("dtrain-kvstore")
    tr = by.get("StatefulSet", {}).get("dtrain-trainer")
    if kv and kv_svc and tr:
        ns = kv["metadata"]["namespace"]
        port = next(p["port"] for p in kv_svc["spec"]["ports"] if p["name"] == "grpc")
        want = ",".join(f"dtrain-kvstore-{i}.{kv['spec']['serviceName']}.{ns}.svc.cluster.local:{port}"
                        for i in range(kv["spec"].get("replicas", 1)))
        cms = [v["configMap"]["name"] for v in tr["spec"]["template"]["spec"].get("volumes", [])
               if "configMap" in v]
        flags = [line for cm in cms for data in by.get("ConfigMap", {}).get(cm, {}).get("data", {}).values()
                 for line in data.splitlines()]
        got = [line.split("=", 1)[1] for line in flags if line.startswith("--kvstore=")]
        if got != [want]:
            err(f, tr, f"trainer flags must hold --kvstore={want} (every kvstore pod, shard-major), not {got}")
        # Replicated shards: pod k is replica k % R of shard k / R (R =
        # KVSTORE_REPLICAS, the ordinal from apps.kubernetes.io/pod-index),
        # the StatefulSet runs num_shards * R pods, the replicas know the
        # scheduler, and the trainers' --kvstore_replicas is R.
        c = kv["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value", e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath"))
               for e in c.get("env", [])}
        cmd = " ".join(c.get("command", []) + c.get("args", []))
        if env.get("POD_INDEX") != "metadata.labels['apps.kubernetes.io/pod-index']" or \
                "--shard_index=$$((POD_INDEX / KVSTORE_REPLICAS))" not in cmd or \
                "--replica_index=$$((POD_INDEX % KVSTORE_REPLICAS))" not in cmd:
            err(f, kv, "--shard_index and --replica_index must come from the pod's ordinal "
                       "(POD_INDEX from apps.kubernetes.io/pod-index; shard = k / R, replica = k % R)")
        r = env.get("KVSTORE_REPLICAS")
        r = int(r) if r and r.isdigit() else 0
        kv_cms = [v["configMap"]["name"] for v in kv["spec"]["template"]["spec"].get("volumes", [])
                  if "configMap" in v]
        kv_flags = [line for cm in kv_cms
                    for data in by.get("ConfigMap", {}).get(cm, {}).get("data", {}).values()
                    for line in data.splitlines()]
        shards = [int(line.split("=", 1)[1]) for line in kv_flags if line.startswith("--num_shards=")]
        if r < 1 or len(shards) != 1 or kv["spec"].get("replicas", 1) != shards[0] * r:
            err(f, kv, f"runs {kv['spec'].get('replicas', 1)} pods, not --num_shards {shards} * "
                       f"KVSTORE_REPLICAS {r}")
        if not any(line.startswith("--scheduler=") for line in kv_flags):
            err(f, kv, "kvstore flags need --scheduler (the shard map's owner)")
        got_r = [line.split("=", 1)[1] for line in flags if line.startswith("--kvstore_replicas=")]
        if got_r != [str(r)]:
            err(f, tr, f"trainer flags must hold --kvstore_replicas={r} (KVSTORE_REPLICAS), not {got_r}")
    sched = by.get("Deployment", {}).get("dtrain-scheduler")
    if sched and sched["spec"].get("strategy", {}).get("type") != "Recreate":
        errors.append(f"{f}: the scheduler's RWO log volume needs strategy Recreate")
    np = by.get("NetworkPolicy", {})
    dd = np.get("default-deny")
    if not dd or dd["spec"]["podSelector"] != {} or set(dd["spec"]["policyTypes"]) != {"Ingress", "Egress"}:
        errors.append(f"{f}: a default-deny NetworkPolicy for ingress and egress")
    for p in np.values():
        for rule in p["spec"].get("ingress", []) + p["spec"].get("egress", []):
            if not rule.get("from", rule.get("to")):
                errors.append(f"{f}: NetworkPolicy {p['metadata']['name']} has a rule open to everything")
    labels = [pm["metadata"]["name"] for pm in by.get("PodMonitor", {}).values()]
    if "operator" in f and sorted(labels) != ["dtrain-kvstore", "dtrain-scheduler", "dtrain-trainer"]:
        errors.append(f"{f}: PodMonitors for the scheduler, the kvstore and the trainers")
    print(f"policy: {f.rsplit('/', 1)[-1]}: {len(docs)} objects checked")

for e in errors:
    print("FAIL", e)
sys.exit(1 if errors else 0)

#!/usr/bin/env bash
# Renders the overlays cpu and gpu, each also with the prometheus-operator
# component, with `kubectl kustomize` (offline) and
#  1. validates every rendered object against the Kubernetes API JSON schemas
#     (schema/k8s_validate.mjs: kubernetes-models' validators generated from
#     the Kubernetes OpenAPI spec, bundled; run with node), and checks that a
#     deliberately broken object is rejected (the validator is live);
#  2. checks the project's policies (policy_check.py): security contexts,
#     requests and limits, gRPC probes, GPUs only in the gpu overlay, no
#     Secret objects, NetworkPolicies, scrape annotations, the trainers'
#     --kvstore naming every kvstore pod by its DNS name, shard and replica
#     from the pod ordinal, pods = --num_shards * KVSTORE_REPLICAS = the
#     trainers' --kvstore_replicas, ...; and that a wrong shard list, a
#     kvstore Service that is not headless and a wrong --kvstore_replicas
#     fail them;
#  3. checks that no file under k8s/ holds a key, token or password.
set -euo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
R="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-dtrain}"
[ -d "$R/k8s" ] || R=$(cd "$(dirname "$0")/../.." && pwd)
K="$R/k8s"
command -v kubectl >/dev/null || fail "kubectl not installed (tools/setup)"
command -v node >/dev/null || fail "node not installed (Debian package nodejs; tools/setup)"
export HOME="${TEST_TMPDIR:-$(mktemp -d)}"
out=$(mktemp -d "${TEST_TMPDIR:-/tmp}/render.XXXXXX")
# kustomize refuses symlinked files outside its root; Bazel's runfiles are
# symlinks, so render from a real copy.
cp -rL "$K" "$out/k8s"
n=0
for ov in cpu gpu; do
  kubectl kustomize "$out/k8s/overlays/$ov" >"$out/$ov.yaml" || fail "kustomize $ov"
  mkdir -p "$out/k8s/overlays/$ov-operator"
  cat >"$out/k8s/overlays/$ov-operator/kustomization.yaml" <<EOK
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [../$ov]
components: [../../components/prometheus-operator]
EOK
  kubectl kustomize "$out/k8s/overlays/$ov-operator" >"$out/$ov-operator.yaml" || fail "kustomize $ov + operator"
  n=$((n+2))
done
node "$K/tests/schema/k8s_validate.mjs" "$out"/{cpu,gpu,cpu-operator,gpu-operator}.yaml; n=$((n+1))
# Negative control: a wrong type and a missing required field must be rejected.
sed -e '0,/replicas: 1/s//replicas: "one"/' "$out/cpu.yaml" >"$out/bad1.yaml"
python3 - "$out/cpu.yaml" "$out/bad2.yaml" <<'EOP'
import sys, yaml
docs = list(yaml.safe_load_all(open(sys.argv[1])))
for d in docs:
    if d["kind"] == "StatefulSet":
        del d["spec"]["selector"]; break
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
EOP
for b in bad1 bad2; do
  if node "$K/tests/schema/k8s_validate.mjs" "$out/$b.yaml" >"$out/$b.log" 2>&1; then
    fail "the schema validator accepted $b.yaml"; fi
done
grep -q "replicas must be" "$out/bad1.log" || { cat "$out/bad1.log"; fail "unexpected error for bad1"; }
grep -q "selector" "$out/bad2.log" || { cat "$out/bad2.log"; fail "unexpected error for bad2"; }
n=$((n+1))
python3 "$K/tests/policy_check.py" "$out"/{cpu,gpu,cpu-operator,gpu-operator}.yaml; n=$((n+1))
# Negative control: a third kvstore shard the trainers' --kvstore does not
# name, and a kvstore Service that is not headless, must be rejected.
python3 - "$out/cpu.yaml" "$out/bad3.yaml" "$out/bad4.yaml" <<'EOP'
import sys, yaml
docs = list(yaml.safe_load_all(open(sys.argv[1])))
for d in docs:
    if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "dtrain-kvstore":
        d["spec"]["replicas"] = 3
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
docs = list(yaml.safe_load_all(open(sys.argv[1])))
for d in docs:
    if d["kind"] == "Service" and d["metadata"]["name"] == "dtrain-kvstore":
        del d["spec"]["clusterIP"]
yaml.safe_dump_all(docs, open(sys.argv[3], "w"))
EOP
if python3 "$K/tests/policy_check.py" "$out/bad3.yaml" >"$out/bad3.log" 2>&1; then
  fail "policy_check accepted 3 kvstore shards with --kvstore naming 1"; fi
grep -q "dtrain-kvstore-2.dtrain-kvstore.dtrain.svc.cluster.local:7070" "$out/bad3.log" ||
  { cat "$out/bad3.log"; fail "unexpected error for bad3"; }
if python3 "$K/tests/policy_check.py" "$out/bad4.yaml" >"$out/bad4.log" 2>&1; then
  fail "policy_check accepted a kvstore Service that is not headless"; fi
grep -q "dtrain-kvstore needs a StatefulSet with a headless Service" "$out/bad4.log" ||
  { cat "$out/bad4.log"; fail "unexpected error for bad4"; }
# Negative control: trainers told another number of replicas per shard than
# the kvstore pods use.
sed -e 's/--kvstore_replicas=2/--kvstore_replicas=1/' "$out/cpu.yaml" >"$out/bad5.yaml"
if python3 "$K/tests/policy_check.py" "$out/bad5.yaml" >"$out/bad5.log" 2>&1; then
  fail "policy_check accepted trainers with --kvstore_replicas=1 and 2 replicas per shard"; fi
grep -q "trainer flags must hold --kvstore_replicas=2" "$out/bad5.log" ||
  { cat "$out/bad5.log"; fail "unexpected error for bad5"; }
n=$((n+1))
# No credentials committed: private keys, tokens, passwords, Secrets with data.
if grep -rIlE --exclude=k8s_validate.mjs --exclude=manifests_test.sh -e '-----BEGIN [A-Z ]*PRIVATE KEY-----|\b(ghp|gho|glpat|xox[bp])[-_][A-Za-z0-9]{10,}|AKIA[0-9A-Z]{16}|"auths"[[:space:]]*:|password[[:space:]]*[:=][[:space:]]*[^[:space:]<$]' \
    "$K"; then
  fail "the files above look like they hold credentials"; fi
n=$((n+1))
echo "$n passed, 0 failed"

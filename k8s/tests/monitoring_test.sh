#!/usr/bin/env bash
# promtool check config (k8s/monitoring/prometheus.yml with its rule files),
# promtool check rules, promtool test rules (alert unit tests), the
# PrometheusRule of the prometheus-operator component equals the rule files,
# the Grafana dashboard is valid JSON whose every query names only metrics a
# dtrain service exports (metric_names.py), and the metric-name extractor
# itself works.   monitoring_test.sh --regen rewrites the PrometheusRule.
set -euo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
R="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-dtrain}"
[ -d "$R/k8s" ] || R=$(cd "$(dirname "$0")/../.." && pwd)
K="$R/k8s"
command -v promtool >/dev/null || fail "promtool not installed (Debian package prometheus; tools/setup)"
gen_rule() {
python3 - "$K" <<'EOP'
import sys, yaml
k = sys.argv[1]
out = []
for f, name in [("dtrain.rules.yml", "dtrain"), ("dtrain-kubelet.rules.yml", "dtrain-kubelet")]:
    d = yaml.safe_load(open(f"{k}/monitoring/rules/{f}"))
    out.append({"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
                "metadata": {"name": name, "namespace": "dtrain", "labels": {"app.kubernetes.io/name": "dtrain"}}, "spec": d})
sys.stdout.write("# GENERATED from k8s/monitoring/rules/*.yml; //k8s:monitoring_test checks they match.\n"
                 "# Regenerate: k8s/tests/monitoring_test.sh --regen\n")
yaml.safe_dump_all(out, sys.stdout, sort_keys=False, width=120)
EOP
}
if [ "${1:-}" = --regen ]; then gen_rule >"$K/components/prometheus-operator/prometheusrule.yaml"; exit 0; fi
n=0
# promtool resolves rule_files relative to the config file.
promtool check config "$K/monitoring/prometheus.yml"; n=$((n+1))
promtool check rules "$K"/monitoring/rules/*.yml; n=$((n+1))
promtool test rules "$K/tests/rules_test.yml"; n=$((n+1))
diff <(gen_rule) "$K/components/prometheus-operator/prometheusrule.yaml" \
  || fail "prometheusrule.yaml is stale: run k8s/tests/monitoring_test.sh --regen"; n=$((n+1))
python3 - "$K/dashboards/dtrain.json" <<'EOP'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["uid"] and d["title"], "dashboard needs uid and title"
ids = set(); exprs = 0
def walk(panels):
    global exprs
    for p in panels:
        assert p["id"] not in ids, f"duplicate panel id {p['id']}"; ids.add(p["id"])
        for t in p.get("targets", []):
            assert t["expr"].strip(), f"empty query in {p['title']}"
            assert t.get("datasource", p.get("datasource", {})).get("uid") == "${datasource}", p["title"]
            exprs += 1
        walk(p.get("panels", []))
walk(d["panels"])
assert exprs >= 15, exprs
print(f"dashboard: {len(ids)} panels, {exprs} queries")
EOP
n=$((n+1))
python3 "$K/tests/metric_names.py" "$K"/monitoring/rules/*.yml "$K"/dashboards/*.json >"${TEST_TMPDIR:-/tmp}/names.tsv"
if grep -P '\t(UNKNOWN|UNRECORDED)' "${TEST_TMPDIR:-/tmp}/names.tsv"; then fail "metrics no dtrain service exports"; fi
grep -q $'^dtrain_scheduler_trainers_alive\tdtrain-scheduler$' "${TEST_TMPDIR:-/tmp}/names.tsv" || fail "extractor"
# The extractor must see through functions, matchers, grouping and ranges.
python3 - "$K/tests" <<'EOP'
import sys; sys.path.insert(0, sys.argv[1]); import metric_names as m
got = m.names('sum by (job, le) (rate(foo_bucket{job="a|b",x=~"up"}[5m])) / on (job) bar unless absent(up{job="c"}) > 0.5')
assert sorted(got, key=str) == sorted([("foo_bucket", {"a", "b"}), ("bar", None), ("up", {"c"})], key=str), got
EOP
n=$((n+2))
echo "$n passed, 0 failed"

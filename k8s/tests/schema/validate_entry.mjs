// Entry point of k8s_validate.mjs (bundled by regen.sh; do not edit the bundle).
// Validates every object of multi-document YAML files against the Kubernetes
// API JSON schemas that the npm package kubernetes-models generates from the
// Kubernetes OpenAPI spec (and @kubernetes-models/prometheus-operator for the
// operator's CRDs). Also fails on objects whose kind is not in the table and
// on duplicate objects within a file. Not checked: fields no schema defines (the Kubernetes
// OpenAPI schemas allow extra properties; the API server's field validation
// rejects them).
//   node k8s_validate.mjs FILE...
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";
import { Namespace } from "kubernetes-models/v1/Namespace";
import { ServiceAccount } from "kubernetes-models/v1/ServiceAccount";
import { ConfigMap } from "kubernetes-models/v1/ConfigMap";
import { Service } from "kubernetes-models/v1/Service";
import { PersistentVolumeClaim } from "kubernetes-models/v1/PersistentVolumeClaim";
import { Deployment } from "kubernetes-models/apps/v1/Deployment";
import { StatefulSet } from "kubernetes-models/apps/v1/StatefulSet";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1/PodDisruptionBudget";
import { NetworkPolicy } from "kubernetes-models/networking.k8s.io/v1/NetworkPolicy";
import { Role } from "kubernetes-models/rbac.authorization.k8s.io/v1/Role";
import { RoleBinding } from "kubernetes-models/rbac.authorization.k8s.io/v1/RoleBinding";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";
import { PodMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PodMonitor";
import { PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";

const models = [Namespace, ServiceAccount, ConfigMap, Service, PersistentVolumeClaim, Deployment,
  StatefulSet, PodDisruptionBudget, NetworkPolicy, Role, RoleBinding, ServiceMonitor, PodMonitor,
  PrometheusRule];
const byType = new Map(models.map((m) => [`${m.apiVersion}/${m.kind}`, m]));

let errors = 0, objects = 0;
for (const file of process.argv.slice(2)) {
  const seen = new Set();  // per file: each is one rendered overlay
  for (const doc of parseAllDocuments(readFileSync(file, "utf8"))) {
    if (doc.errors.length) { console.error(`${file}: YAML: ${doc.errors[0].message}`); errors++; continue; }
    const obj = doc.toJS();
    if (obj == null) continue;
    objects++;
    const id = `${obj.apiVersion}/${obj.kind} ${obj.metadata?.namespace ?? ""}/${obj.metadata?.name}`;
    if (seen.has(id)) { console.error(`${file}: duplicate ${id}`); errors++; }
    seen.add(id);
    const Model = byType.get(`${obj.apiVersion}/${obj.kind}`);
    if (!Model) { console.error(`${file}: ${id}: no schema for this apiVersion/kind`); errors++; continue; }
    try {
      new Model(obj).validate();
    } catch (e) {
      console.error(`${file}: ${id}: ${e.message}`);
      errors++;
    }
  }
}
console.log(`k8s_validate: ${objects} objects, ${errors} errors`);
process.exit(errors || objects === 0 ? 1 : 0);

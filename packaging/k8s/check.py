#!/usr/bin/env python3
"""Checks packaging/k8s/*.yaml offline: schemas, then exit-code policies against docs/exit-codes.md.

Usage: check.py [REPO_ROOT]   (run with the Python of a venv holding kubernetes-validate; it brings PyYAML)

1. Schemas. `kubernetes-validate --strict` knows only Kubernetes' own kinds and *passes* a custom resource
   with a warning ("Couldn't find schema"), so that warning counts as a failure here. For the custom resources
   (Volcano Job, PyTorchJob) the embedded pod templates are validated as v1 PodTemplates, and their own
   fields are checked against the field names of those APIs (names only: no types).
2. Policies. For every code in the table (128+n as 129..159), what each manifest's controller would do with
   a pod that exited with it is compared with what the table asks. A PyTorchJob cannot express some of the
   table (see GAPS); any other disagreement, or a gap that closed, fails.
"""
import pathlib
import re
import subprocess
import sys
import tempfile

import yaml

# What each controller does with a failed pod, as the table's words: "fail", "retry" (run again: in place or
# anywhere), "reschedule" (a new pod, placed by the scheduler), "success".
ACCEPTS = {"success": {"success"}, "fail": {"fail"}, "retry": {"retry", "reschedule", "restart in place"}, "reschedule": {"reschedule"}}

# Kubeflow's restartPolicy ExitCode re-creates a pod only for these codes and fails the job on any other.
KUBEFLOW_RETRYABLE = {130, 137, 138, 143}
GAPS = {
    "PyTorchJob": {c: "a PyTorchJob's ExitCode policy fails the job on it"
                   for c in [3, 75] + [128 + n for n in range(1, 32) if 128 + n not in KUBEFLOW_RETRYABLE]},
}

# Field names of the custom resources' APIs (Volcano batch/v1alpha1, Kubeflow kubeflow.org/v1).
FIELDS = {
    ("Job", "spec"): {"schedulerName", "minAvailable", "maxRetry", "plugins", "policies", "tasks", "queue",
                      "ttlSecondsAfterFinished", "priorityClassName", "minSuccess", "volumes", "runningEstimate",
                      "networkTopology"},
    ("Job", "policy"): {"event", "events", "action", "exitCode", "timeout"},
    ("Job", "task"): {"name", "replicas", "template", "policies", "minAvailable", "maxRetry", "topologyPolicy",
                      "dependsOn"},
    ("PyTorchJob", "spec"): {"elasticPolicy", "runPolicy", "pytorchReplicaSpecs", "nprocPerNode"},
    ("PyTorchJob", "elasticPolicy"): {"rdzvBackend", "rdzvHost", "rdzvPort", "rdzvId", "rdzvConf", "standalone",
                                      "nProcPerNode", "minReplicas", "maxReplicas", "maxRestarts", "metrics"},
    ("PyTorchJob", "runPolicy"): {"cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds",
                                  "backoffLimit", "schedulingPolicy", "suspend", "managedBy"},
    ("PyTorchJob", "replica"): {"replicas", "template", "restartPolicy"},
}
VOLCANO_ACTIONS = {"RestartJob": "reschedule", "RestartTask": "reschedule", "RestartPod": "reschedule",
                   "TerminateJob": "fail", "AbortJob": "fail", "CompleteJob": "success"}


def read_table(path):
    """{code: intent} from the table's rows: a first cell that is a code (or 128+n), the rest its words."""
    intents = {}
    for line in path.read_text().splitlines():
        cells = [c.strip().strip("`*") for c in line.strip().strip("|").split("|")]
        if not line.lstrip().startswith("|") or len(cells) < 2:
            continue
        words = " ".join(cells[1:]).lower()
        if re.fullmatch(r"\d+", cells[0]):
            codes = [int(cells[0])]
        elif re.fullmatch(r"128\s*\+\s*n", cells[0], re.IGNORECASE):
            codes = [128 + n for n in range(1, 32)]
        else:
            continue
        for code in codes:
            intents[code] = intent(code, words)
    return intents


def intent(code, words):
    if code == 0:
        return "success"
    if re.search(r"(do )?not requeue|fail the job", words):
        return "fail"
    if "reschedule" in words:
        return "reschedule"
    if re.search(r"requeue|restart|retry", words):
        return "retry"
    return "fail"


def job_outcome(spec, code):
    """batch/v1 Job: the first podFailurePolicy rule matching the code; none is Count."""
    if code == 0:
        return "success"
    if spec["template"]["spec"].get("restartPolicy") != "Never":
        return "restart in place"
    trainer = muster_container(spec["template"])
    for rule in spec.get("podFailurePolicy", {}).get("rules", []):
        on = rule.get("onExitCodes")
        if on is None or on.get("containerName", trainer) != trainer:
            continue
        if (code in on["values"]) == (on["operator"] == "In"):
            return {"FailJob": "fail", "FailIndex": "fail", "Ignore": "reschedule",
                    "Count": "reschedule" if spec.get("backoffLimit", 6) > 0 else "fail"}[rule["action"]]
    return "reschedule" if spec.get("backoffLimit", 6) > 0 else "fail"


def volcano_outcome(spec, code):
    """Volcano Job: task policies, then the job's, in order; a failed pod matches its exit code or PodFailed."""
    if code == 0:
        return "success"
    task = spec["tasks"][0]
    if task["template"]["spec"].get("restartPolicy") != "Never":
        return "restart in place"
    for policy in task.get("policies", []) + spec.get("policies", []):
        events = policy.get("events", []) + ([policy["event"]] if "event" in policy else [])
        if policy.get("exitCode") == code or "PodFailed" in events or "*" in events:
            return VOLCANO_ACTIONS.get(policy["action"], f"action {policy['action']}")
    return "nothing"


def pytorchjob_outcome(spec, code):
    if code == 0:
        return "success"
    policy = spec["pytorchReplicaSpecs"]["Worker"].get("restartPolicy", "Never")
    if policy == "ExitCode":
        return "reschedule" if code in KUBEFLOW_RETRYABLE else "fail"
    return {"Never": "fail"}.get(policy, "restart in place")


def muster_container(template):
    names = [c["name"] for c in template["spec"]["containers"] if c.get("command", [""])[0] == "muster"]
    if len(names) != 1:
        raise SystemExit(f"expected one container with command muster, found {names}")
    return names[0]


def known_fields(kind, what, obj, errors, where):
    unknown = set(obj) - FIELDS[(kind, what)]
    if unknown:
        errors.append(f"{where}: unknown {kind} {what} field(s) {sorted(unknown)}")


def custom_resource(doc, errors, where):
    """The pod templates of a Volcano Job or PyTorchJob, after checking its field names."""
    kind, spec = doc["kind"], doc["spec"]
    known_fields(kind, "spec", spec, errors, where)
    if kind == "Job":
        for p in spec.get("policies", []):
            known_fields(kind, "policy", p, errors, where)
        for t in spec["tasks"]:
            known_fields(kind, "task", t, errors, where)
        return [t["template"] for t in spec["tasks"]]
    for part in ("elasticPolicy", "runPolicy"):
        known_fields(kind, part, spec.get(part, {}), errors, where)
    for r in spec["pytorchReplicaSpecs"].values():
        known_fields(kind, "replica", r, errors, where)
    return [r["template"] for r in spec["pytorchReplicaSpecs"].values()]


def kubernetes_validate(path, errors):
    cli = pathlib.Path(sys.executable).parent / "kubernetes-validate"
    run = subprocess.run([str(cli), "--strict", str(path)], capture_output=True, text=True)
    out = run.stdout + run.stderr
    if run.returncode != 0 or "Couldn't find schema" in out:
        errors.append(f"kubernetes-validate --strict {path}:\n{out.strip()}")


def check(root):
    errors = []
    table = read_table(root / "docs/exit-codes.md")
    missing = {0, 1, 2, 3, 4, 75, 143} - set(table)
    if missing:
        errors.append(f"docs/exit-codes.md: no row for code(s) {sorted(missing)}")
    outcomes = {"Job": job_outcome, "PyTorchJob": pytorchjob_outcome}
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted((root / "packaging/k8s").glob("*.yaml")):
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
            custom = [d for d in docs if not d["apiVersion"].startswith(("v1", "batch/", "apps/", "rbac.authorization.k8s.io/"))]
            if len(custom) < len(docs):
                kubernetes_validate(path, errors)
            for doc in custom:
                templates = custom_resource(doc, errors, path.name)
                pods = [{"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"t{i}"}, "template": t}
                        for i, t in enumerate(templates)]
                pod_file = pathlib.Path(tmp) / f"{path.stem}-{doc['kind']}-pods.yaml"
                pod_file.write_text(yaml.safe_dump_all(pods))
                kubernetes_validate(pod_file, errors)
            for doc in docs:
                if doc["kind"] in ("Job", "PyTorchJob"):
                    volcano = doc["apiVersion"].startswith("batch.volcano.sh/")
                    outcome = volcano_outcome if volcano else outcomes[doc["kind"]]
                    errors += policy_errors(path.name, doc["kind"], lambda c: outcome(doc["spec"], c), table)
                    errors += rendezvous_errors(path.name, doc)
    errors += rbac_errors(root)
    return errors


def pod_templates(doc):
    if doc["kind"] == "Job" and doc["apiVersion"].startswith("batch/"):
        return [doc["spec"]["template"]]
    return custom_resource(doc, [], "")


def rendezvous_errors(name, doc):
    """Every pod of a training manifest meets its peers in the API server, as the service account muster."""
    errors = []
    for t in pod_templates(doc):
        container = next(c for c in t["spec"]["containers"] if c["name"] == muster_container(t))
        if "--rdzv-backend=k8s" not in container.get("args", []):
            errors.append(f"{name}: the muster container's args lack --rdzv-backend=k8s")
        if t["spec"].get("serviceAccountName") != "muster":
            errors.append(f"{name}: the pod template's serviceAccountName is not muster (rbac.yaml binds that one)")
        pod_name = {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
        if pod_name not in container.get("env", []):
            errors.append(f"{name}: the muster container lacks POD_NAME from metadata.name (its Job then owns the Leases)")
    return errors


def rbac_errors(root):
    """rbac.yaml's Role grants on Leases exactly the verbs the store checks for at start (src/store/k8s/access.rs),
    and on pods only get (src/store/k8s/owner.rs: the pod's controller owns the job's Leases); its RoleBinding
    gives that Role to the service account muster."""
    source = (root / "src/store/k8s/access.rs").read_text()
    found = re.search(r"pub const VERBS: \[&str; \d+\] = \[([^\]]*)\]", source)
    if not found:
        return ["src/store/k8s/access.rs: no VERBS constant to check rbac.yaml's Role against"]
    verbs = set(re.findall(r'"([a-z]+)"', found.group(1)))
    docs = {d["kind"]: d for d in yaml.safe_load_all((root / "packaging/k8s/rbac.yaml").read_text()) if d}
    errors = []
    role, binding = docs.get("Role"), docs.get("RoleBinding")
    if role is None or binding is None or "ServiceAccount" not in docs:
        return ["rbac.yaml: a ServiceAccount, a Role and a RoleBinding are expected"]
    rules = role.get("rules", [])
    wanted = [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": sorted(verbs)},
              {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    if [{**r, "verbs": sorted(r.get("verbs", []))} for r in rules] != wanted:
        errors.append(f"rbac.yaml: the Role must grant exactly {wanted} (the store's verbs), it grants {rules}")
    subjects = [(s.get("kind"), s.get("name")) for s in binding.get("subjects", [])]
    if subjects != [("ServiceAccount", docs["ServiceAccount"]["metadata"]["name"])]:
        errors.append(f"rbac.yaml: the RoleBinding binds {subjects}, not the ServiceAccount it defines")
    if binding.get("roleRef", {}).get("name") != role["metadata"]["name"]:
        errors.append("rbac.yaml: the RoleBinding refers to another Role")
    return errors


def policy_errors(name, kind, outcome, table):
    errors, gaps = [], GAPS.get(kind, {})
    for code, wanted in sorted(table.items()):
        got = outcome(code)
        agrees = got in ACCEPTS[wanted]
        if code in gaps and agrees:
            errors.append(f"{name}: exit {code} is listed in GAPS ({gaps[code]}) but the manifest gives {got}, "
                          "as the table asks: remove it from GAPS")
        elif code not in gaps and not agrees:
            errors.append(f"{name}: exit {code}: docs/exit-codes.md says {wanted}, the manifest gives {got}")
    return errors


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parents[2]).resolve()
    errors = check(root)
    for e in errors:
        print(f"packaging/k8s/check.py: {e}", file=sys.stderr)
    if errors:
        sys.exit(1)
    print("packaging/k8s: schemas valid; exit-code policies match docs/exit-codes.md (PyTorchJob's known gaps: "
          "3, 75 and the signals other than 130, 137, 138 and 143 fail the job); every pod meets its peers in the "
          "API server as the service account rbac.yaml binds, whose Role grants the store's verbs and no more, "
          "and names its pod (POD_NAME) so that its Job owns the rendezvous Leases")


if __name__ == "__main__":
    main()

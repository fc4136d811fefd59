"""deploy/k8s: every document passes the Kubernetes JSON schemas (offline), and the pieces agree.

kubernetes-validate bundles the schemas in its wheel and resolves $refs from them locally, so
this needs no network and no cluster. It is a schema lint only: nothing here runs on a cluster.
"""
from __future__ import annotations

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from conftest import ROOT

K8S = ROOT / "deploy" / "k8s"
FILES = sorted(K8S.glob("*.yaml")) + sorted(K8S.glob("*.yml"))


def documents() -> list[tuple[str, dict]]:
    docs = []
    for path in FILES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((f"{path.name}:{doc.get('kind')}", doc))
    return docs


def one(kind: str) -> dict:
    found = [d for _, d in documents() if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def test_there_are_manifests():
    assert {"Deployment", "Service", "HorizontalPodAutoscaler"} <= {d["kind"] for _, d in documents()}


@pytest.mark.parametrize("name,doc", documents(), ids=lambda v: v if isinstance(v, str) else "")
def test_document_matches_kubernetes_schema(name, doc):
    # strict: unknown fields (typos such as `initialDelay`) fail too.
    kubernetes_validate.validate(doc, latest_version(), strict=True)


def test_validator_rejects_a_broken_manifest():
    """Guard against a validator that silently accepts anything (e.g. a missing schema)."""
    bad = dict(one("Deployment"))
    bad["spec"] = dict(bad["spec"], replicas="one")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, latest_version(), strict=True)


def container(name: str = "tritonserver") -> dict:
    (c,) = [c for c in one("Deployment")["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


def test_probes_hit_triton_health_endpoints_and_the_stub_check():
    c = container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    for probe, path in (("readinessProbe", "/v2/health/ready"), ("startupProbe", "/v2/health/live")):
        get = c[probe]["httpGet"]
        assert get["path"] == path, probe
        assert ports.get(get["port"], get["port"]) == 8000, probe
    # Liveness also catches a dead stub, which Triton 2.51's health endpoints do not report.
    command = c["livenessProbe"]["exec"]["command"]
    assert command[:2] == ["python3", "/opt/ditserve/scripts/check_stubs.py"] and "127.0.0.1:8000" in command
    assert (ROOT / "scripts" / "check_stubs.py").exists()
    # A full checkpoint loads for minutes: the startup probe must allow at least 10 of them.
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600


def test_deployment_requests_a_gpu_and_shared_memory():
    spec = one("Deployment")["spec"]["template"]["spec"]
    c = container()
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert any(e["name"] == "DITSERVE_DEPLOYMENT" for e in c["env"])
    shm = [v for v in spec["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
    assert shm and any(m["mountPath"] == "/dev/shm" and m["name"] == shm[0]["name"] for m in c["volumeMounts"])


def test_service_exposes_the_three_ports_of_the_deployment():
    svc = one("Service")["spec"]
    assert svc["type"] == "ClusterIP"
    assert svc["selector"].items() <= one("Deployment")["spec"]["template"]["metadata"]["labels"].items()
    assert {p["name"]: p["port"] for p in svc["ports"]} == {"http": 8000, "grpc": 8001, "metrics": 8002,
                                                            "openai": 8080}


def test_the_front_end_runs_beside_triton_in_the_pod_with_a_required_key(monkeypatch):
    """The `frontend` container's wiring is what the front end's own code reads: its command
    parses with frontend.__main__'s parser, the key arrives in the variable that parser reads,
    the probed routes exist in the app, and the media folder is a mounted, size-limited volume."""
    from frontend.__main__ import parser

    c = container("frontend")
    assert c["image"] == container()["image"] and c["command"][:3] == ["python3", "-m", "frontend"]
    (key,) = [e for e in c["env"] if e["name"] == "DITSERVE_API_KEY"]
    assert not key["valueFrom"]["secretKeyRef"].get("optional", False), "the key must not be skippable"
    assert key["valueFrom"]["secretKeyRef"] == {"name": "ditserve-frontend", "key": "api-key"}
    assert "kubectl create secret generic ditserve-frontend --from-literal=api-key=" in \
        (ROOT / "docs" / "frontend.md").read_text(), "the docs create the Secret the pod reads"
    monkeypatch.setenv(key["name"], "from-the-secret")
    args = parser().parse_args(c["command"][3:])
    assert args.api_key == "from-the-secret", "the parser reads the key from the variable the pod sets"
    grpc = {p["name"]: p["containerPort"] for p in container()["ports"]}["grpc"]
    assert args.triton_url == f"127.0.0.1:{grpc}" and args.host == "0.0.0.0"
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"openai": args.port}
    routes = {route.path for route in frontend_routes()}
    for probe, path in (("readinessProbe", "/health"), ("livenessProbe", "/")):
        assert c[probe]["httpGet"] == {"path": path, "port": "openai"} and path in routes, probe
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == args.media_dir]
    (volume,) = [v for v in one("Deployment")["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    limit = volume["emptyDir"]["sizeLimit"]
    assert limit.endswith("Gi") and args.media_max_bytes < int(limit[:-2]) * 2**30, "the store stays inside its volume"


def frontend_routes() -> list:
    """The routes of the front end's app, routers included."""
    from frontend.app import Settings, create_app

    return [route for route in create_app(Settings()).router.routes if hasattr(route, "path")]


def test_hpa_targets_the_deployment_on_a_triton_queue_metric():
    hpa = one("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    dep = one("Deployment")
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == (dep["apiVersion"], "Deployment", dep["metadata"]["name"])
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"].startswith("nv_inference_")
    assert metric["pods"]["target"]["type"] == "AverageValue"

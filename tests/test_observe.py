"""Watching the registry (issue 48): /metrics scraped by a real Prometheus, batch
metrics in a textfile and a real Pushgateway, /healthz and /readyz, JSON logs,
spans received by a real OTLP/HTTP receiver."""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from registry.refs.aliases import set_alias
from registry.api import Registry
from registry.lifecycle.yank import yank
from registry.store import open_store
from registry.web import create_app
from tests.conftest import run_cli
from tests.hub_util import publish, release_files, tiny_bert
from tests.support.obs_servers import OtlpReceiver, Prometheus, Pushgateway
from tests.web_util import serve

TOKEN = "s3cret-token-value"


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """tiny@1 (alias prod) passes; tiny@2 is yanked."""
    root = tmp_path_factory.mktemp("obs")
    url = str(root / "store")
    src = tiny_bert(root, 1)
    publish(url, src, "tiny", "1")
    publish(url, src, "tiny", "2")
    with open_store(url) as s:
        set_alias(s, "tiny", "prod", "1")
        yank(s, "tiny", "2", "a bad eval")
    return url


@pytest.fixture
def client(store_url: str, tmp_path: Path) -> Iterator[TestClient]:
    with Registry(store_url, db=f"sqlite:///{tmp_path / 'i.db'}") as reg:
        app = create_app(reg, token=TOKEN, hosts=frozenset({"testserver"}))
        with TestClient(app, raise_server_exceptions=False) as c:
            yield c


def sample(text: str, name: str, **labels: str) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def scrape(c: TestClient) -> str:
    r = c.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200
    return r.text


def test_probes_answer_without_token_or_host_and_metrics_need_the_token(
        client: TestClient) -> None:
    for host in ("testserver", "10.1.2.3:8080"):  # a kubelet probes the pod's IP
        h = client.get("/healthz", headers={"Host": host})
        assert (h.status_code, h.json()) == (200, {"status": "ok"})
        r = client.get("/readyz", headers={"Host": host})
        assert r.status_code == 200
        assert r.json()["checks"] == {"store": "ok", "index": "ok", "keys": "ok"}
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Host": "evil.example",
                                           "Authorization": f"Bearer {TOKEN}"}).status_code == 421
    text = scrape(client)
    assert sample(text, "registry_http_requests_total", route="health", code="200") >= 4
    assert sample(text, "process_resident_memory_bytes") > 0


def test_readyz_fails_while_the_store_is_gone(store_url: str, tmp_path: Path) -> None:
    root = tmp_path / "store"
    shutil.copytree(store_url, root)
    with Registry(str(root), db=f"sqlite:///{tmp_path / 'i.db'}") as reg, \
            TestClient(create_app(reg, hosts=frozenset({"testserver"}))) as c:
        assert c.get("/readyz").status_code == 200
        shutil.rmtree(root)
        import time
        time.sleep(2.1)  # past the verdict's life (READY_TTL)
        r = c.get("/readyz")
        assert r.status_code == 503
        assert r.json() == {"status": "unavailable",
                            "checks": {"store": "failed", "index": "ok", "keys": "ok"}}
        assert str(tmp_path) not in r.text  # nothing about the store for anonymous probes


def test_hub_refusals_and_bytes_are_counted(client: TestClient, store_url: str) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    before = scrape(client)
    r = client.get("/registry/tiny/resolve/2/config.json", headers=auth)
    assert r.status_code == 403 and r.headers["x-error-code"] == "GatedRepo"
    ok = client.get("/registry/tiny/resolve/prod/model.safetensors", headers=auth)
    assert ok.status_code == 200
    after = scrape(client)
    assert sample(after, "registry_refusals_total", reason="yank") - \
        sample(before, "registry_refusals_total", reason="yank") == 1
    assert sample(after, "registry_http_requests_total", route="hub_file", code="403",
                  method="GET") - sample(before, "registry_http_requests_total",
                                         route="hub_file", code="403", method="GET") == 1
    sent = sample(after, "registry_http_response_bytes_total", route="hub_file") - \
        sample(before, "registry_http_response_bytes_total", route="hub_file")
    assert sent >= len(ok.content) > 0
    read = sample(after, "registry_store_read_bytes_total") - \
        sample(before, "registry_store_read_bytes_total")
    assert read >= len(ok.content)  # the bytes sent were read from the store (and checked)
    assert sample(after, "registry_pieces_verified_total", result="ok") > \
        sample(before, "registry_pieces_verified_total", result="ok")


def test_prometheus_scrapes_the_mirror_after_a_pull_through_it(store_url: str,
                                                               tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    with serve(store_url, f"sqlite:///{tmp_path / 'i.db'}", "--mirror-cache",
               str(tmp_path / "mirror"), "--token-file", str(token)) as base:
        prom = Prometheus(tmp_path / "prom", base.removeprefix("http://"), token_file=token)
        try:
            r = run_cli("pull", "tiny@prod", "--from", base, "--to", str(tmp_path / "m"),
                        "--cache", str(tmp_path / "cache"), env={"HF_TOKEN": TOKEN})
            assert r.returncode == 0, r.stderr
            files = release_files(store_url, "tiny", "1")
            sizes = sum((tmp_path / "m" / p).stat().st_size for p in files if p != "MANIFEST.json")
            assert prom.value('up{job="registry"}') == 1
            misses = prom.settled('registry_mirror_cache_requests_total{result="miss"}',
                                  len(files) - 1)
            assert misses == len(files) - 1  # each released file fetched once
            assert prom.settled("registry_store_read_bytes_total", sizes) == sizes
            assert prom.settled("registry_mirror_cache_size_bytes", sizes) == sizes
            assert prom.value('sum(registry_http_requests_total{route="hub_file",code="200"})') \
                >= len(files) - 1
            assert prom.value('registry_http_time_to_first_byte_seconds_count{route="hub_file"}'
                              ) >= len(files) - 1
            # every query of the Grafana dashboard is valid PromQL over these series
            dash = json.loads((Path(__file__).resolve().parent.parent / "deploy" / "helm" /
                               "modeldir-registry" / "dashboards" / "registry.json").read_text())
            for panel in dash["panels"]:
                for target in panel["targets"]:
                    expr = target["expr"].replace("$job", ".*").replace("$__rate_interval", "1m")
                    prom.query(expr)  # asserts status success
            assert prom.query('registry_mirror_cache_size_bytes{job=~".*"}')
        finally:
            prom.stop()


def test_a_batch_pull_writes_its_metrics_to_a_textfile_and_a_pushgateway(
        store_url: str, tmp_path: Path) -> None:
    prom_file = tmp_path / "registry.prom"
    gateway = Pushgateway(tmp_path)
    try:
        r = run_cli("--metrics-file", str(prom_file), "--metrics-push", gateway.url, "pull",
                    "tiny@1", "--store", store_url, "--to", str(tmp_path / "m"),
                    "--cache", str(tmp_path / "c"), "--json")
        assert r.returncode == 0, r.stderr
        text = prom_file.read_text()
        size = json.loads(r.stdout)["transferred"]  # what the pull itself says it read
        assert size > 0
        assert sample(text, "registry_command_exit_code", command="pull") == 0
        assert sample(text, "registry_store_read_bytes_total") == size
        assert sample(text, "registry_command_last_success_timestamp_seconds", command="pull") > 0
        pushed = gateway.metrics()
        assert sample(pushed, "registry_command_exit_code", command="pull", job="registry") == 0
        assert sample(pushed, "registry_store_read_bytes_total", job="registry") == size
        refused = run_cli("--metrics-file", str(prom_file), "pull", "tiny@2", "--store",
                          store_url, "--to", str(tmp_path / "m2"), "--cache", str(tmp_path / "c"))
        assert refused.returncode == 1
        text = prom_file.read_text()
        assert sample(text, "registry_command_exit_code", command="pull") == 1
        assert sample(text, "registry_refusals_total", reason="yank") == 1
        assert sample(text, "registry_command_last_success_timestamp_seconds",
                      command="pull") == 0
    finally:
        gateway.stop()


def test_bad_metrics_destinations_are_one_line_and_exit_2(tmp_path: Path) -> None:
    r = run_cli("--metrics-file", str(tmp_path / "no" / "x.prom"), "ls")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such folder" in r.stderr
    r = run_cli("--metrics-file", str(tmp_path / "x.txt"), "ls")
    assert r.returncode == 2 and "*.prom" in r.stderr
    r = run_cli("--metrics-push", "ftp://gw", "ls")
    assert r.returncode == 2 and "http" in r.stderr


def test_json_logs_errors_and_requests_without_secrets(store_url: str, tmp_path: Path) -> None:
    r = run_cli("--log-format", "json", "pull", "nosuch@1", "--store", store_url,
                "--to", str(tmp_path / "m"))
    assert r.returncode == 3
    (line,) = r.stderr.splitlines()
    doc = json.loads(line)
    assert doc["level"] == "error" and doc["error"]["exit_code"] == 3
    assert doc["error"]["class"] == "NotCommittedError" and doc["ts"].endswith("Z")
    token = tmp_path / "token"
    token.write_text(TOKEN)
    with serve(store_url, f"sqlite:///{tmp_path / 'i.db'}", "--token-file", str(token),
               env={"REGISTRY_LOG_FORMAT": "json"}) as base:
        req = urllib.request.Request(base + "/api/v1/models?token=" + TOKEN,
                                     headers={"Authorization": f"Bearer {TOKEN}"})
        assert urllib.request.urlopen(req, timeout=10).status == 200
    # serve() ended the process: its stderr holds the request lines
    # (read back through the log the fixture keeps)
    logs = _served_log()
    lines = [json.loads(x) for x in logs.splitlines() if x.startswith("{")]
    mine = [x for x in lines if x.get("path") == "/api/v1/models"]
    assert mine and mine[-1]["status"] == 200 and mine[-1]["route"] == "api"
    assert TOKEN not in logs


def test_text_request_log_has_each_request_and_no_secret(store_url: str,
                                                          tmp_path: Path) -> None:
    """``serve --request-log`` (text): one line per request, refused ones too;
    the token sent in Authorization (Bearer and Basic), in a cookie and in the
    query string is in none of them, and a decoded ``%0A`` forges no line."""
    import base64
    import urllib.error

    token = tmp_path / "token"
    token.write_text(TOKEN)
    basic = base64.b64encode(f"user:{TOKEN}".encode()).decode()
    with serve(store_url, f"sqlite:///{tmp_path / 'i.db'}", "--token-file", str(token),
               "--request-log") as base:
        req = urllib.request.Request(base + f"/api/v1/models?token={TOKEN}&page=1",
                                     headers={"Authorization": f"Bearer {TOKEN}",
                                              "Cookie": f"session={TOKEN}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
        req = urllib.request.Request(
            base + f"/registry/tiny/resolve/prod/config.json?access_token={TOKEN}",
            headers={"Authorization": f"Basic {basic}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        for path, auth, code in (("/api/v1/models", f"Bearer {TOKEN}-wrong", 401),
                                 ("/api/v1/nosuch%0Aforged%20line", f"Bearer {TOKEN}", 404)):
            req = urllib.request.Request(base + path, headers={"Authorization": auth})
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=10)
            e.value.close()  # the error holds the connection
            assert e.value.code == code
    log = _served_log()
    assert TOKEN not in log and basic not in log
    lines = [x for x in log.splitlines() if " request method=" in x
             and "openapi.json" not in x]  # the fixture's readiness probe
    assert len(lines) == 4, log
    assert any(" method=GET path=/api/v1/models route=api status=200 " in x for x in lines)
    assert any(f"route=hub_file status=200 bytes={len(body)} " in x for x in lines)
    assert any("route=api status=401" in x for x in lines)
    assert any("path=/api/v1/nosuch%0Aforged%20line route=api status=404" in x for x in lines)
    assert not any(x.startswith("forged") for x in log.splitlines())


def _served_log() -> str:
    from tests import web_util

    return getattr(web_util, "last_stderr", "")


def descendants(spans: list[dict[str, str]], root: dict[str, str]) -> list[dict[str, str]]:
    """The spans below ``root`` in its trace (children, their children...)."""
    out, ids = [], {root["spanId"]}
    grew = True
    while grew:
        grew = False
        for s in spans:
            if s["parentSpanId"] in ids and s["spanId"] not in ids:
                ids.add(s["spanId"])
                out.append(s)
                grew = True
    return out


def test_spans_of_a_served_request_and_a_pull_reach_an_otlp_receiver(
        store_url: str, tmp_path: Path) -> None:
    receiver = OtlpReceiver()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
           "OTEL_SERVICE_NAME": "registry-test"}
    try:
        trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        with serve(store_url, f"sqlite:///{tmp_path / 'i.db'}", env=env) as base:
            req = urllib.request.Request(
                base + "/registry/tiny/resolve/prod/config.json",
                headers={"traceparent": f"00-{trace_id}-{parent}-01"})
            assert urllib.request.urlopen(req, timeout=10).status == 200
            spans = receiver.wait_for("GET hub_file")
        server = [s for s in spans if s["name"] == "GET hub_file"][0]
        assert server["traceId"] == trace_id and server["parentSpanId"] == parent
        kids = {s["name"] for s in descendants(spans, server)}
        assert "registry.gates" in kids  # the gate decision
        assert any(k.startswith("store.") for k in kids)  # the store calls
        assert "registry.piece_check" in kids or "store.iter_range" in kids
        # a fresh interpreter, so the SDK's exit handler flushes the spans
        r = run_cli("pull", "tiny@prod", "--store", store_url, "--to", str(tmp_path / "m"),
                    "--cache", str(tmp_path / "c"), env={**env, "REGISTRY_TEST_FORK": "0"})
        assert r.returncode == 0, r.stderr
        spans = receiver.wait_for("registry.pull")
        pull = [s for s in spans if s["name"] == "registry.pull"][0]
        below = {s["name"] for s in descendants(spans, pull)}
        assert "registry.fetch" in below  # downloads on worker threads stay in the trace
        assert any(n.startswith("store.") for n in below)
        # store calls are never traces of their own
        assert not [s for s in spans if s["name"].startswith("store.") and not s["parentSpanId"]]
    finally:
        receiver.stop()


def test_tracing_is_asked_for_only_by_the_otel_variables() -> None:
    from registry.obs.tracing import wanted

    assert not wanted({})
    assert wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert wanted({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})
    assert not wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                       "OTEL_TRACES_EXPORTER": "none"})


def test_registry_metrics_0_drops_metrics_but_keeps_the_probes(
        store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_METRICS", "0")
    with Registry(store_url, db=f"sqlite:///{tmp_path / 'i.db'}") as reg, \
            TestClient(create_app(reg, hosts=frozenset({"testserver"}))) as c:
        assert c.get("/metrics").status_code == 404
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200


def test_a_tampered_piece_is_counted_failed_and_refused_for_integrity(
        store_url: str, tmp_path: Path) -> None:
    root = tmp_path / "store"
    shutil.copytree(store_url, root)
    weights = root / "models" / "tiny" / "1" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[100] ^= 0xFF  # the first piece no longer matches its digest
    weights.chmod(0o644)
    weights.write_bytes(bytes(data))
    with Registry(str(root), db=f"sqlite:///{tmp_path / 'i.db'}") as reg, \
            TestClient(create_app(reg, token=TOKEN, hosts=frozenset({"testserver"}))) as c:
        before = scrape(c)
        r = c.get("/registry/tiny/resolve/1/model.safetensors",
                  headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 409
        after = scrape(c)
    assert sample(after, "registry_pieces_verified_total", result="failed") - \
        sample(before, "registry_pieces_verified_total", result="failed") == 1
    assert sample(after, "registry_refusals_total", reason="integrity") - \
        sample(before, "registry_refusals_total", reason="integrity") == 1

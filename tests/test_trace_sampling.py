"""The light server span of ``registry serve`` (issue 48, item 8) keeps the
SDK's sampling and propagation: spans received by a real OTLP/HTTP receiver
(PyPI ``oteltap``) for the standard ``OTEL_TRACES_SAMPLER`` settings and
incoming ``traceparent`` headers; the export queue drops and counts when full."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.hub_util import publish, tiny_bert
from tests.support.obs_servers import OtlpReceiver
from tests.web_util import serve

pytest.importorskip("opentelemetry.sdk")

PATH = "/registry/tiny/resolve/1/config.json"
CALLER = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("sampling")
    url = str(root / "store")
    publish(url, tiny_bert(root, 1), "tiny", "1")
    return url


def _get(base: str, trace_id: str | None = None, flags: str = "01") -> None:
    headers = {"traceparent": f"00-{trace_id}-{CALLER}-{flags}"} if trace_id else {}
    r = urllib.request.urlopen(urllib.request.Request(base + PATH, headers=headers), timeout=30)
    assert r.status == 200 and r.read()


def _until(receiver: OtlpReceiver, done: Any, timeout: float = 60) -> list[dict[str, Any]]:
    """The spans received, once ``done(spans)`` holds (the export is batched)."""
    deadline = time.monotonic() + timeout
    while True:
        spans = receiver.wait_for("GET hub_file", timeout)
        if done(spans):
            return spans
        assert time.monotonic() < deadline, [(s["name"], s["traceId"]) for s in spans]
        time.sleep(0.2)


def _ids(n: int) -> list[str]:
    return [f"{i:032x}" for i in range(0xA1, 0xA1 + n)]


def test_parent_based_sampling_follows_the_callers_flags(store_url: str, tmp_path: Path) -> None:
    receiver = OtlpReceiver()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    dropped, sampled, marker = _ids(3)
    try:
        with serve(store_url, f"sqlite:///{tmp_path / 'i.db'}", env=env) as base:
            _get(base, dropped, flags="00")  # the caller did not sample: neither do we
            _get(base, sampled, flags="01")
            _get(base)  # no traceparent: a root, sampled (parentbased_always_on)
            _get(base, marker)
            spans = _until(receiver, lambda ss: any(s["traceId"] == marker for s in ss) and
                           any(s["name"] == "GET hub_file" and not s["parentSpanId"]
                               for s in ss))
            metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        assert "registry_trace_spans_dropped_total 0.0" in metrics
        by_trace: dict[str, list[dict[str, str]]] = {}
        for s in spans:
            by_trace.setdefault(s["traceId"], []).append(s)
        assert dropped not in by_trace
        server = [s for s in by_trace[sampled] if s["name"] == "GET hub_file"]
        assert len(server) == 1 and server[0]["parentSpanId"] == CALLER
        assert server[0]["kind"] == 2  # SERVER
        attrs = {a["key"]: a["value"] for a in server[0]["attributes"]}
        assert attrs["http.response.status_code"] == {"intValue": "200"}
        assert attrs["url.path"] == {"stringValue": PATH}
        below = [s for s in by_trace[sampled] if s["name"] != "GET hub_file"]
        assert below and all(s["name"].startswith("store.") for s in below)
        assert {s["parentSpanId"] for s in below} == {server[0]["spanId"]}
        roots = [t for t, ss in by_trace.items() if t not in (sampled, marker)
                 and any(s["name"] == "GET hub_file" and not s["parentSpanId"] for s in ss)]
        assert len(roots) == 1, {t: [(s["name"], s["parentSpanId"]) for s in ss] for t, ss in by_trace.items()}
    finally:
        receiver.stop()


def test_a_zero_ratio_samples_nothing_but_a_sampled_callers_trace(store_url: str,
                                                                   tmp_path: Path) -> None:
    receiver = OtlpReceiver()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
           "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}
    (sampled,) = _ids(1)
    try:
        with serve(store_url, f"sqlite:///{tmp_path / 'i.db'}", env=env) as base:
            for _ in range(3):
                _get(base)  # roots: the ratio (0) decides
            _get(base, sampled)  # the caller's sampled flag decides
            spans = receiver.wait_for("GET hub_file")
        assert {s["traceId"] for s in spans} == {sampled}
    finally:
        receiver.stop()


def test_a_full_queue_drops_and_counts_instead_of_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from registry.obs.spans import Batcher

    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
    exporter = InMemorySpanExporter()
    batcher = Batcher(exporter)
    provider = TracerProvider()
    provider.add_span_processor(batcher)
    tracer = provider.get_tracer("t")
    with batcher._lock:  # an export in progress: nothing leaves the queue meanwhile
        for i in range(10):
            tracer.start_span(f"s{i}").end()
    assert batcher.dropped == 6
    batcher.force_flush()
    assert [s.name for s in exporter.get_finished_spans()] == ["s0", "s1", "s2", "s3"]
    provider.shutdown()

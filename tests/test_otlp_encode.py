"""registry.obs.otlp's encoder writes the bytes the OpenTelemetry SDK's own
encoder writes, for every kind of span the SDK can hand an exporter (issue 48,
item 8: the faster encoder must not change what a collector receives)."""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.common")

from opentelemetry import trace  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode  # noqa: E402
from opentelemetry.trace.span import TraceFlags, TraceState  # noqa: E402

from registry.obs.otlp import encode  # noqa: E402


def _spans() -> list:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "t", "n": 3,
                                                        "tags": ("a", "b")}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("registry", "1.2", schema_url="https://s/1")
    other = provider.get_tracer("other")  # a second scope, no version
    remote = SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=True,
                         trace_flags=TraceFlags(1), trace_state=TraceState([("k", "v"), ("x", "1")]))
    ctx = trace.set_span_in_context(trace.NonRecordingSpan(remote))
    with tracer.start_as_current_span("GET hub_file", context=ctx, kind=SpanKind.SERVER,
                                      attributes={"http.request.method": "GET", "code": 200,
                                                  "neg": -5, "big": 2**62, "ratio": 0.25,
                                                  "ok": True, "no": False, "empty": "",
                                                  "ints": [1, 2], "strs": ["é", "b"],
                                                  "flags": [True], "floats": [1.5],
                                                  "zero": 0}) as server:
        server.add_event("retry", {"attempt": 2})
        server.add_event("bare")
        with tracer.start_as_current_span("store.read_bytes", links=[
                Link(remote, {"why": "caller"}), Link(server.get_span_context())]):
            pass
        with other.start_as_current_span("x", kind=SpanKind.CLIENT) as x:
            x.set_status(Status(StatusCode.ERROR, "broken: pipe"))
        for kind in (SpanKind.PRODUCER, SpanKind.CONSUMER):
            with tracer.start_as_current_span("k", kind=kind) as k:
                k.set_status(Status(StatusCode.OK))
        with pytest.raises(ValueError):
            with tracer.start_as_current_span("fails"):
                raise ValueError("bad value")
    root = tracer.start_span("root of its own")  # no parent
    root.end()
    return list(exporter.get_finished_spans())


def test_the_same_bytes_as_the_sdks_encoder() -> None:
    spans = _spans()
    assert len(spans) == 7
    for one in spans:
        assert encode([one]) == encode_spans([one]).SerializePartialToString(), one.name
    assert encode(spans) == encode_spans(spans).SerializePartialToString()


def test_leaf_spans_of_the_tracing_module_encode_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished leaf span (registry.obs.tracing's store calls) through both encoders."""
    from registry.obs import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("registry", "9")
    emit = tracing._leaf_maker(tracer)
    with tracer.start_as_current_span("GET hub_file") as parent:
        ctx = parent.get_span_context()
        emit("store.exists", ctx, 1, None)
        emit("store.read_bytes", ctx, 2, FileNotFoundError("gone"))
        emit("store.open_read", ctx, 3, PermissionError("denied"))
    from registry.obs.spans import readable

    spans = list(exporter.get_finished_spans())
    assert [s.name for s in spans[:3]] == ["store.exists", "store.read_bytes", "store.open_read"]
    assert all(s.parent.span_id == ctx.span_id for s in spans[:3])
    assert spans[1].attributes == {"registry.outcome": "not_found"}
    assert spans[2].status.status_code is StatusCode.ERROR
    assert spans[2].attributes == {"error.type": "PermissionError"}
    assert encode(spans) == encode_spans([readable(s) for s in spans]).SerializePartialToString()


def test_light_server_spans_encode_alike() -> None:
    """The light server span (registry.obs.spans.ServerSpan), sampled by the
    tracer's own sampler, with a remote parent and trace state, events, a
    link, an error status and leaves below it, through both encoders."""
    from registry.obs import tracing
    from registry.obs.spans import Source, readable, server_span

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "t"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("registry", "9")
    src = Source(tracer)
    remote = SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=True,
                         trace_flags=TraceFlags(1), trace_state=TraceState([("k", "v")]))
    sp = server_span(src, "GET hub_file", trace.set_span_in_context(trace.NonRecordingSpan(remote)),
                     {"http.request.method": "GET", "url.path": "/a/b"})
    sp.set_attribute("http.response.status_code", 503)
    sp.set_attribute("tags", ["a", "b"])
    sp.add_event("retry", {"attempt": 2})
    sp.add_link(remote, {"why": "caller"})
    sp.set_status(StatusCode.ERROR, "unavailable")
    tracing._leaf_maker(tracer)("store.exists", sp.get_span_context(), 5, None)
    root = server_span(src, "GET api", None, {"url.path": "/x"})
    root.end()
    sp.end()
    spans = list(exporter.get_finished_spans())
    assert [s.name for s in spans] == ["store.exists", "GET api", "GET hub_file"]
    assert spans[2].parent == remote and spans[2].context.trace_id == remote.trace_id
    assert spans[1].parent is None
    assert encode(spans) == encode_spans([readable(s) for s in spans]).SerializePartialToString()
    for one in spans:
        assert encode([one]) == encode_spans([readable(one)]).SerializePartialToString()


def test_cached_attribute_fields_keep_int_and_bool_apart() -> None:
    """Encoded attribute fields are cached by value (registry.obs.otlp):
    ``1`` and ``True`` are equal in Python but not on the wire."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("registry")
    for value in (1, True, 1, "1", 1.0, True):
        tracer.start_span("s", attributes={"x": value}).end()
    spans = list(exporter.get_finished_spans())
    for one in spans:
        assert encode([one]) == encode_spans([one]).SerializePartialToString()

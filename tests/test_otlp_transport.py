"""The OTLP exporter's transport (registry.obs.transport, issue 48 item 8): one
kept ``http.client`` connection under the SDK's exporter, which keeps reading
the ``OTEL_EXPORTER_OTLP_*`` variables; the proxy variables honoured.

Real sockets: a local HTTP server stands for the collector (and for a
proxy), and every check is on what it received.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from registry.obs.otlp import encode, span_exporter  # noqa: E402
from registry.obs.transport import Transport  # noqa: E402


class _Seen:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.peers: set[tuple[str, int]] = set()


@contextmanager
def collector() -> Iterator[tuple[str, _Seen]]:
    """A local HTTP/1.1 server answering 200 to every POST; what it saw."""
    seen = _Seen()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.lines.append(self.requestline)
            seen.bodies.append(body)
            seen.headers.append({k.lower(): v for k, v in self.headers.items()})
            seen.peers.add(self.client_address)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_CONNECT(self) -> None:  # noqa: N802
            seen.lines.append(self.requestline)
            seen.headers.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(502)
            self.send_header("Content-Length", "0")
            self.end_headers()
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _spans(n: int) -> list:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    for i in range(n):
        with tracer.start_as_current_span(f"s{i}"):
            pass
    return list(memory.get_finished_spans())


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_exports_go_over_one_kept_connection_with_the_otel_headers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with collector() as (url, seen):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-team=ml,authorization=Bearer%20t")
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)
        exporter = span_exporter()
        assert isinstance(exporter._client._transport, Transport)
        batches = [_spans(2), _spans(3), _spans(1)]
        for batch in batches:
            assert exporter.export(batch).name == "SUCCESS"
        exporter.shutdown()
    assert seen.lines == ["POST /v1/traces HTTP/1.1"] * 3
    assert seen.bodies == [encode(b) for b in batches]
    assert len(seen.peers) == 1  # one connection for the three exports
    for h in seen.headers:
        assert h["x-team"] == "ml" and h["authorization"] == "Bearer t"
        assert h["content-type"] == "application/x-protobuf"


def test_http_proxy_gets_the_absolute_url(monkeypatch: pytest.MonkeyPatch) -> None:
    target = f"http://collector.invalid:{_closed_port()}"
    with collector() as (proxy, seen):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", target)
        monkeypatch.setenv("HTTP_PROXY", proxy.replace("http://", "http://u:p%40ss@"))
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        exporter = span_exporter()
        assert isinstance(exporter._client._transport, Transport)
        assert exporter.export(_spans(1)).name == "SUCCESS"
        exporter.shutdown()
    assert seen.lines == [f"POST {target}/v1/traces HTTP/1.1"]
    assert seen.headers[0]["proxy-authorization"] == "Basic dTpwQHNz"  # u:p@ss


def test_https_proxy_is_asked_for_a_tunnel(monkeypatch: pytest.MonkeyPatch) -> None:
    with collector() as (proxy, seen):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector.invalid:4318")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # few retries
        monkeypatch.setenv("HTTPS_PROXY", proxy)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        exporter = span_exporter()
        assert isinstance(exporter._client._transport, Transport)
        assert exporter.export(_spans(1)).name == "FAILURE"  # the proxy refused the tunnel
        exporter.shutdown()
    assert seen.lines and set(seen.lines) == {"CONNECT collector.invalid:4318 HTTP/1.0"}

"""What an operator watches of ``registry serve``: ``/metrics``, ``/healthz``, ``/readyz``,
per-request metrics, spans and log lines.

:class:`Observe` is a plain ASGI middleware around the whole application
(outside its Host and token guard):

- ``GET /healthz``: 200 ``{"status": "ok"}`` while the process answers.
- ``GET /readyz``: 200 when the store answers a listing, the index answers
  ``SELECT 1`` and, when trusted keys or CAs were given, at least one is
  loaded; else 503 naming the failing check (no URL, no error text: the
  probes are open to anyone who can reach the port). Each check is bounded
  (:data:`READY_TIMEOUT`) and the verdict kept :data:`READY_TTL` seconds, so
  probes cannot pile load onto the store.

  Both answer without the token and whatever the ``Host`` header says: a
  kubelet probe sends neither, and the answers reveal nothing.
- every other request goes through the application (``/metrics`` too, so it
  needs the token when one is set) and is counted by route class, status
  code, time to first byte, duration and body bytes
  (registry.obs.metrics); refusals of the Hub routes (403 ``GatedRepo``, 409
  for bytes that differ from the manifest) are counted by reason from the
  response's own error headers; with tracing on it is a span, child of the
  caller's ``traceparent``; with ``REGISTRY_LOG_FORMAT=json`` it is one JSON
  log line, with ``registry serve --request-log`` one text line
  (registry.obs.logs).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

from registry.obs import logs, metrics, tracing

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: the ASGI message of a body sent from a file (registry.web.sending; counted by its ``count``)
ZERO_COPY = "http.response.zerocopysend"
#: seconds each readiness check may take before it counts as failed
READY_TIMEOUT = 5.0
#: seconds a readiness verdict is kept
READY_TTL = 2.0
_HUB_API = ("/api/models/",)


def route_class(path: str) -> str:
    """The bounded ``route`` label of a request path (metrics.ROUTE_CLASSES)."""
    if path.startswith("/api/v1/"):
        return "api"
    if path.startswith(_HUB_API):
        return "hub_api"
    if "/resolve/" in path:
        return "hub_file"
    if path.startswith("/static/"):
        return "static"
    if path == "/metrics":
        return "metrics"
    if path in ("/healthz", "/readyz"):
        return "health"
    if path == "/" or path.startswith(("/models", "/runs", "/sources", "/revocations",
                                       "/search", "/releases")):
        return "page"
    return "other"


def refusal_reason(status: int, headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why the Hub routes refused a release, read from the response's error
    headers: gate, yank or signature (403 GatedRepo), integrity (409)."""
    if status == 409:
        return "integrity"
    if status != 403:
        return None
    h = {k.lower(): v for k, v in headers}
    if h.get(b"x-error-code") != b"GatedRepo":
        return None
    message = h.get(b"x-error-message", b"").lower()
    if b"signature" in message or b"signed" in message:
        return "signature"
    if b"yank" in message:
        return "yank"
    return "gate"


class Readiness:
    """The ``/readyz`` checks of one server (the module docstring).

    Args:
        registry: the served ``registry.api.Registry`` (its store and index).
        trust: the server's trust (registry.trust.Trust) or None when no keys
            or CAs were asked for.
    """

    def __init__(self, registry: Any, trust: Any = None) -> None:
        self.registry = registry
        self.trust = trust
        self._lock = threading.Lock()
        self._verdict: tuple[float, dict[str, str]] | None = None

    def _store(self) -> None:
        self.registry.store.list_dir("models")

    def _index(self) -> None:
        from sqlalchemy import text

        self.registry.index.read(lambda s: s.execute(text("SELECT 1")).scalar())

    def _keys(self) -> None:
        if self.trust is not None and not (self.trust.keys or self.trust.cas):
            raise ValueError("no trusted key or CA loaded")

    async def checks(self) -> dict[str, str]:
        """check name -> ``ok`` / ``failed`` / ``timeout`` (kept READY_TTL seconds)."""
        now = time.monotonic()
        with self._lock:
            if self._verdict is not None and now - self._verdict[0] < READY_TTL:
                return self._verdict[1]
        out = {}
        for name, fn in (("store", self._store), ("index", self._index),
                         ("keys", self._keys)):
            try:
                await asyncio.wait_for(asyncio.to_thread(fn), READY_TIMEOUT)
                out[name] = "ok"
            except asyncio.TimeoutError:
                out[name] = "timeout"
            except Exception:  # noqa: BLE001 - a failed check is the answer, not an error
                out[name] = "failed"
        with self._lock:
            self._verdict = (time.monotonic(), out)
        return out


class Observe:
    """ASGI middleware: health probes, metrics, spans and request logs (module docstring).

    Args:
        app: the application to wrap.
        families: the metric families to count into (registry.obs.metrics.enable).
        readiness: the ``/readyz`` checks.
        request_log: ``"json"`` (or True): one JSON line per request on
            stderr; ``"text"``: one text line; None (or False): none.
    """

    def __init__(self, app: ASGIApp, *, families: metrics.Families | None,
                 readiness: Readiness, request_log: str | bool | None = None) -> None:
        self.app = app
        self.families = families
        self.readiness = readiness
        self.request_log = "json" if request_log is True else request_log or None
        #: nothing to count, trace or log: requests go straight through
        self.bare = families is None and not request_log and not tracing.enabled()
        #: route -> its (ttfb, duration, bytes sent) series; (route, method,
        #: status) -> its requests series: prometheus_client's ``labels()``
        #: locks and builds a key each call, a dict read does not (label
        #: values are bounded, so are these)
        self._by_route: dict[str, tuple[Any, Any, Any]] = {}
        self._by_answer: dict[tuple[str, str, int], Any] = {}

    def _route_series(self, route: str) -> tuple[Any, Any, Any]:
        series = self._by_route.get(route)
        if series is None:
            f = self.families or _NO_FAMILIES
            series = self._by_route[route] = (f.ttfb.labels(route), f.duration.labels(route),
                                              f.sent.labels(route))
        return series

    def _requests(self, route: str, method: str, status: int) -> Any:
        key = (route, method, status)
        series = self._by_answer.get(key)
        if series is None:
            f = self.families or _NO_FAMILIES
            series = self._by_answer[key] = f.requests.labels(route, method, str(status))
        return series

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path in ("/healthz", "/readyz") and scope["method"] in ("GET", "HEAD"):
            await self._probe(path, scope, send)
            return
        if self.bare:
            await self.app(scope, receive, send)
            return
        f = self.families or _NO_FAMILIES
        route, method = route_class(path), scope["method"]
        if method not in ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"):
            method = "other"
        t0 = time.perf_counter()
        status, sent = 500, 0
        ttfb, duration, sent_bytes = self._route_series(route)
        f.in_flight.inc()
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                   if k in (b"traceparent", b"tracestate")}
        with tracing.server_span(method, route, path, headers) as sp:
            async def counting_send(message: Message) -> None:
                nonlocal status, sent
                if message["type"] == "http.response.start":
                    status = message["status"]
                    ttfb.observe(time.perf_counter() - t0)
                    reason = refusal_reason(status, message.get("headers", []))
                    if reason is not None:
                        metrics.refused_for(reason)
                elif message["type"] == "http.response.body":
                    sent += len(message.get("body", b""))
                elif message["type"] == ZERO_COPY:  # a file's bytes (registry.web.sending)
                    sent += message.get("count") or 0
                await send(message)

            try:
                await self.app(scope, receive, counting_send)
            finally:
                seconds = time.perf_counter() - t0
                f.in_flight.dec()
                self._requests(route, method, status).inc()
                duration.observe(seconds)
                sent_bytes.inc(sent)
                if sp is not None:  # the router put the matched route in the scope
                    tracing.set_status(sp, status, getattr(scope.get("route"), "path", None))
                if self.request_log:
                    trace_id = (f"{sp.get_span_context().trace_id:032x}"
                                if sp is not None else None)
                    write = logs.request_line if self.request_log == "json" else \
                        logs.request_text
                    sys.stderr.write(write(method, path, route, status, sent, seconds,
                                           trace_id) + "\n")

    async def _probe(self, path: str, scope: Scope, send: Send) -> None:
        if path == "/healthz":
            code, doc = 200, {"status": "ok"}
        else:
            checks = await self.readiness.checks()
            ready = all(v == "ok" for v in checks.values())
            code, doc = (200 if ready else 503), {"status": "ok" if ready else "unavailable",
                                                  "checks": checks}
        body = json.dumps(doc, sort_keys=True).encode()
        if self.families is not None:
            self.families.requests.labels("health", scope["method"], str(code)).inc()
        await send({"type": "http.response.start", "status": code,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body",
                    "body": b"" if scope["method"] == "HEAD" else body})


class _Nothing:
    """Metric families that count nothing (REGISTRY_METRICS=0 with tracing or logs on)."""

    def labels(self, *args: Any) -> _Nothing:
        return self

    def inc(self, n: float = 1) -> None:
        pass

    dec = inc
    observe = inc


class _NoFamilies:
    def __getattr__(self, name: str) -> _Nothing:
        return _Nothing()


_NO_FAMILIES: Any = _NoFamilies()


def metrics_endpoint(families: metrics.Families) -> Callable[[Any], Any]:
    """The ``/metrics`` route: the families in Prometheus's text format (or
    OpenMetrics when the scraper asks for it)."""
    from prometheus_client.exposition import choose_encoder
    from starlette.responses import Response

    def endpoint(request: Any) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(families.registry), media_type=None,
                        headers={"Content-Type": content_type, "Cache-Control": "no-store"})
    return endpoint


class HubCollector:
    """``registry_store_read_bytes_total`` is counted by the hooks; this adds
    the mirror cache's use, read when scraped (registry.pull.cache_use, the
    same reading as ``registry cache ls``): the verified blobs' bytes and
    count, the unfinished fills in ``tmp/`` and their bytes, and the free
    space of the cache's filesystem."""

    def __init__(self, cache_root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(cache_root)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from registry.pull.cache_use import cache_use

        use = cache_use(self.root)
        yield GaugeMetricFamily("registry_mirror_cache_size_bytes",
                                "Bytes of verified blobs in the mirror's cache.",
                                value=use.blob_bytes)
        yield GaugeMetricFamily("registry_mirror_cache_files",
                                "Verified blobs in the mirror's cache.", value=use.blobs)
        yield GaugeMetricFamily("registry_mirror_cache_partial_fills",
                                "Unfinished fills in the mirror's cache (running, or "
                                "kept to be resumed).", value=use.partial_fills)
        yield GaugeMetricFamily("registry_mirror_cache_partial_bytes",
                                "Bytes of the unfinished fills (tmp/) of the mirror's cache.",
                                value=use.partial_bytes)
        if use.free_bytes is not None:
            yield GaugeMetricFamily("registry_mirror_cache_free_bytes",
                                    "Bytes free for the server on the mirror cache's "
                                    "filesystem.", value=use.free_bytes)


class TraceCollector:
    """``registry_trace_spans_dropped_total``: spans the tracing's export
    queue had no room for (registry.obs.spans.Batcher), read when scraped;
    registered while tracing is on."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        yield CounterMetricFamily("registry_trace_spans_dropped",
                                  "Spans dropped because the export queue was full.",
                                  value=tracing.dropped())


def instrument(app: Any, registry: Any, *, trust: Any = None, mirror_cache: str | None = None,
               request_log: str | bool | None = None) -> metrics.Families | None:
    """Add ``/metrics`` and :class:`Observe` to the FastAPI ``app`` serving
    ``registry``; returns the metric families (enabled here if they were not),
    or None when ``REGISTRY_METRICS=0`` (no ``/metrics``, nothing counted;
    the probes still answer).

    Raises:
        UsageError: prometheus-client is not installed.
    """
    if os.environ.get("REGISTRY_METRICS", "").strip() in ("0", "false", "off"):
        app.add_middleware(Observe, families=None, readiness=Readiness(registry, trust),
                           request_log=request_log)
        return None
    families = metrics.enable()
    if mirror_cache is not None:
        old = getattr(families, "cache_collector", None)
        if old is not None:  # one server a process; a test may build several apps
            families.registry.unregister(old)
        families.cache_collector = HubCollector(mirror_cache)  # type: ignore[attr-defined]
        families.registry.register(families.cache_collector)  # type: ignore[attr-defined]
    if tracing.enabled() and getattr(families, "trace_collector", None) is None:
        families.trace_collector = TraceCollector()  # type: ignore[attr-defined]
        families.registry.register(families.trace_collector)  # type: ignore[attr-defined]
    app.add_route("/metrics", metrics_endpoint(families), methods=["GET"],
                  include_in_schema=False)
    app.add_middleware(Observe, families=families, readiness=Readiness(registry, trust),
                       request_log=request_log)
    return families

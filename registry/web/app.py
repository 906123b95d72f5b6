"""The ASGI application of ``registry serve``: HTML pages and ``/api/v1``.

Read-only by construction: every route is a GET over a
:class:`registry.api.Registry` (lists from the index, documents from the
store); nothing here calls a write of the store or the index, and any other
method gets 405. Errors keep the CLI's meaning: a ``RegistryError`` becomes
an HTTP status from its exit code (:data:`HTTP_STATUS`; a store that cannot
be read: registry.web.failure, the same answer as on the Hub routes) and, under
``/api/``, the CLI's JSON error document; pages get an HTML page naming what
was asked. URL parts that try to leave their segment (``..``, encoded ``/``
or ``\\``, NUL) are refused with 400 before any route runs.
"""

from __future__ import annotations

import base64
import hmac
import time
from functools import cache
from typing import Any
from urllib.parse import unquote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException

from registry.api import Registry
from registry.cli.errors import exit_code_for
from registry.errors import RegistryError
from registry.host.redact import redact
from registry.host.resources import resource_dir
from registry.web import api, hub, hubrecords, oci, pages
from registry.web.cache import ReleaseFiles
from registry.web.failure import failure_of
from registry.web.hub import HubStats
from registry.web.hubfiles import Source, StoreSource
from registry.web.hub import error_response as hub_error_response
from registry.web.hubpaths import hub_refusal
from registry.web.hubrefs import HubPolicy
from registry.web.modelpath import route_path
from registry.web.render import render
from registry.web.security import SECURITY_HEADERS, allowed_hosts, refuse_host

#: exit code of the CLI -> HTTP status of the same error
#: (a bad document can only come from the store here: 502, the upstream is bad)
HTTP_STATUS = {1: 500, 2: 400, 3: 404, 4: 409, 5: 502, 6: 502, 7: 502, 8: 503, 9: 503}
#: what each exit code means (docs/errors.md)
EXIT_MEANING = {1: "a check said no", 2: "bad arguments or names", 3: "not found",
                4: "conflict", 5: "invalid document", 6: "storage", 7: "checkpoint",
                8: "index", 9: "index schema behind"}


def error_document(cls: str, code: int, message: str, path: str | None = None) -> dict[str, Any]:
    """The JSON error body: the CLI's ``--json`` error document (class, exit
    code, one-line message, path) plus the exit code's meaning."""
    return {"error": {"class": cls, "exit_code": code, "message": message, "path": path,
                      "meaning": EXIT_MEANING.get(code, "error")}}


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _bad_path(raw_path: bytes) -> str | None:
    """Why a request path tries to escape its segments, or None.

    Checked on the undecoded path so ``%2e%2e``, ``%2f`` and ``%5c`` are seen
    for what they decode to."""
    lowered = raw_path.lower()
    for enc, what in ((b"%252f", "an encoded '%2F'"), (b"%2f", "an encoded '/'"), (b"%5c", "an encoded '\\'"),
                      (b"%00", "a NUL byte")):
        if enc in lowered:
            return f"{what} in the URL path"
    path = unquote(raw_path.decode("latin-1"))
    if "\\" in path or "\x00" in path:
        return "a backslash or NUL in the URL path"
    if any(seg in (".", "..") for seg in path.split("/")):
        return "a '.' or '..' segment in the URL path"
    return None


def _authorized(header: str, token: str) -> bool:
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        return hmac.compare_digest(value.strip().encode(), token.encode())
    if scheme.lower() == "basic":  # a browser's login prompt: any user, the token as password
        try:
            _, _, password = base64.b64decode(value.strip()).decode().partition(":")
        except ValueError:
            return False
        return hmac.compare_digest(password.encode(), token.encode())
    return False


class RedactedJSONResponse(JSONResponse):
    """JSON whose every URL credential is redacted (:mod:`registry.host.redact`)."""

    def render(self, content: Any) -> bytes:
        return redact(super().render(content).decode("utf-8")).encode("utf-8")


def create_app(registry: Registry, *, token: str | None = None,
               hub_policy: HubPolicy | None = None, hub_source: Source | None = None,
               hub_stats: HubStats | None = None,
               hosts: frozenset[str] | None = None, request_log: bool = False) -> FastAPI:
    """The web application over ``registry``.

    Args:
        registry: the store and index to read. The index is opened here, once,
            so request threads share one connection pool.
        token: when set, every request must carry ``Authorization: Bearer
            <token>`` (or HTTP Basic with the token as password); else 401.
            Hub clients send it as ``Authorization: Bearer`` (``HF_TOKEN``).
        hub_policy: how the Hub API (registry.web.hub) names and refuses
            releases (default: namespace ``registry``, passing releases only,
            no signature required).
        hub_source: where the Hub API's verified bytes come from (default:
            straight from the store, registry.web.hubfiles.StoreSource).
        hub_stats: the counters ``hub_source`` reports store reads to.
        hosts: the ``Host`` names answered (:func:`registry.web.security.allowed_hosts`);
            None: those of a loopback server (``localhost``, 127.0.0.1, ::1).
            Any other Host gets 421 (DNS rebinding), no Host 400.
        request_log: write one text line per request to stderr
            (registry.obs.logs.request_text); with ``REGISTRY_LOG_FORMAT=json``
            every request is a JSON line whatever this says.

    Raises:
        IndexDatabaseError, IndexOutOfDateError: the index cannot be opened.
    """
    registry.index  # noqa: B018  (open it now, not in two request threads at once)
    app = FastAPI(title="model-registry", version="1",
                  description="Read-only view of a model registry: the documents of the "
                              "CLI's `--json` output.",
                  docs_url=None, redoc_url=None, openapi_url="/api/v1/openapi.json",
                  default_response_class=RedactedJSONResponse, **_no_fastapi_telemetry())
    allowed = hosts if hosts is not None else allowed_hosts("127.0.0.1")
    app.state.registry = registry
    app.state.release_files = ReleaseFiles(registry.store)
    app.state.hub = hub_policy or HubPolicy(registry.store)
    app.state.hub_stats = stats = hub_stats or HubStats()
    app.state.hub_source = hub_source or StoreSource(registry.store,
                                                     on_store_bytes=stats.from_store)

    app.add_middleware(_Guard, allowed=allowed, token=token)

    @app.exception_handler(RegistryError)
    async def registry_error(request: Request, exc: RegistryError) -> Response:
        code = exit_code_for(exc)
        path = getattr(exc, "path", None) or getattr(exc, "key", None)
        failed = failure_of(exc)  # a store outage: the one mapping of every route
        if failed is not None:
            response = _error(request, failed.status, type(exc).__name__, code,
                              failed.message, path)
            response.headers.update(failed.headers())
            return response
        return _error(request, HTTP_STATUS.get(code, 500), type(exc).__name__, code,
                      _one_line(exc), path)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _error(request, 400, "UsageError", 2,
                      f"{where}: {first.get('msg', 'invalid request')}", None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        raw = request.scope.get("raw_path") or request.url.path.encode()
        hub = hub_refusal(raw.decode("latin-1")) if exc.status_code == 404 else None
        if hub is not None:
            return hub_error_response(hub, request.method)
        if exc.status_code == 404:
            return _error(request, 404, "NotFound", 3,
                          f"{request.url.path}: no such page", None)
        if exc.status_code == 405:
            return _error(request, 405, "MethodNotAllowed", 2,
                          f"{request.method} {request.url.path}: this server is read-only "
                          "(writes go through the CLI or the Python API)", None)
        return _error(request, exc.status_code, "HTTPError", 1, str(exc.detail), None)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        # a bug, not a user error: one line, the security headers, no traceback shown
        return _secured(_error(request, 500, "InternalError", 1,
                               f"{type(exc).__name__}: the server could not answer this "
                               "request (its log has the details)", None))

    @app.get("/api/v1/docs", include_in_schema=False, response_class=HTMLResponse)
    def docs(request: Request) -> HTMLResponse:
        return HTMLResponse(render("api.html", title="API", endpoints=_endpoints(app.openapi())))

    @app.get("/static/registry.css", include_in_schema=False)
    def css() -> Response:
        return Response(_stylesheet(), media_type="text/css",
                        headers={"Cache-Control": "max-age=3600"})

    app.include_router(oci.router)  # the OCI read API (/v2/), before the Hub's catch-alls
    app.include_router(hubrecords.router)  # trust records relayed to pull --from
    app.include_router(hub.router)
    app.include_router(api.router)
    app.include_router(pages.router)
    _observe(app, registry, request_log)
    return app


class _Guard:
    """Host, token and path checks before any route, and the security headers
    and ``Server-Timing`` on every answer. A plain ASGI middleware (not
    starlette's ``BaseHTTPMiddleware``, which re-streamed every body message
    through a queue and passes no other message on): a file's zero-copy body
    (registry.web.sending) reaches the server as it was sent."""

    def __init__(self, app: Any, *, allowed: frozenset[str], token: str | None) -> None:
        self.app, self.allowed, self.token = app, allowed, token

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()

        async def secured(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["Server-Timing"] = f"app;dur={(time.perf_counter() - t0) * 1e3:.2f}"
                headers.update(SECURITY_HEADERS)
            await send(message)

        request = Request(scope)
        response = self._refusal(request)
        if response is not None:
            await response(scope, receive, secured)
        else:
            await self.app(scope, receive, secured)

    def _refusal(self, request: Request) -> Response | None:
        """The answer to a request refused before routing (None: route it;
        a namespaced model id's path is rewritten here: registry.web.modelpath)."""
        refused = refuse_host(request.headers.get("host"), self.allowed)
        if refused is not None:
            return _error(request, refused[0], "MisdirectedRequest", 2, refused[1], None)
        if self.token is not None and \
                not _authorized(request.headers.get("authorization", ""), self.token):
            denied = _error(request, 401, "Unauthorized", 2,
                            "this registry needs a token: Authorization: Bearer <token>", None)
            denied.headers["X-Error-Message"] = "Invalid credentials in Authorization header"
            denied.headers["WWW-Authenticate"] = 'Basic realm="model-registry", charset="UTF-8"'
            return denied
        raw = request.scope.get("raw_path") or request.url.path.encode()
        routed = route_path(raw)  # a namespaced model id as one segment (registry.web.modelpath)
        why = _bad_path(routed[0] if routed else raw)
        hub = hub_refusal(raw.decode("latin-1"), why) if why else None
        if hub is not None:  # in the Hub's terms: X-Error-Code (registry.web.hubpaths)
            return hub_error_response(hub, request.method)
        if why:
            return _error(request, 400, "InvalidNameError", 2,
                          f"{request.url.path}: {why}", None)
        if routed:
            request.scope["path"] = routed[1]
        return None


def _no_fastapi_telemetry() -> dict[str, Any]:
    """FastAPI's own OpenTelemetry spans off (FastAPI >= 0.16x has them, on
    whenever a tracer provider is set): registry.web.observe makes the one
    server span of a request, with its route template; FastAPI's would be a
    second server span per request (a sibling of ours under the caller's
    ``traceparent``, a trace of its own without one), and with its
    ``fastapi.dependencies`` / ``fastapi.endpoint`` spans it added three
    spans to each request (issue 48, item 8)."""
    import inspect

    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False,
                          "auto_configure": False}}


def _observe(app: FastAPI, registry: Registry, request_log: bool) -> None:
    """``/metrics``, ``/healthz``, ``/readyz``, request metrics, spans and
    request logs (registry.web.observe): JSON lines under ``--log-format
    json``, else text lines when ``request_log``."""
    from registry.obs.logs import json_logs
    from registry.web.observe import instrument

    cache = getattr(getattr(app.state.hub_source, "cache", None), "root", None)
    instrument(app, registry, trust=getattr(app.state.hub, "trust", None), mirror_cache=cache,
               request_log="json" if json_logs() else "text" if request_log else None)


@cache
def _stylesheet() -> bytes:
    return (resource_dir("templates") / "web" / "registry.css").read_bytes()


def _endpoints(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The API reference page's rows, from the app's own OpenAPI document
    (rendered here, from the installed package: no script, nothing fetched
    from elsewhere)."""
    rows = []
    for path, methods in spec.get("paths", {}).items():
        for method, op in methods.items():
            params = [{"name": p["name"], "in": p["in"], "required": p.get("required", False),
                       "description": p.get("description", "")}
                      for p in op.get("parameters", [])]
            rows.append({"method": method.upper(), "path": path,
                         "summary": op.get("summary", ""), "params": params})
    return rows


def _secured(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def _error(request: Request, status: int, cls: str, code: int, message: str,
           path: str | None) -> Response:
    message, path = redact(message), redact(path) if path else path
    if request.url.path.startswith("/api/"):
        return RedactedJSONResponse(error_document(cls, code, message, path),
                                    status_code=status)
    return HTMLResponse(render("error.html", status=status, title=cls, message=message,
                               asked=request.url.path), status_code=status)

"""OpenTelemetry traces: spans for publish, pull and every served request (the ``otel`` extra).

Off, it costs one global read per traced call: :func:`traced` calls the
function straight through and :func:`span` is a shared ``nullcontext``. It is
on when the OpenTelemetry SDK and its OTLP/HTTP exporter are installed
(``pip install 'modeldir-registry[otel]'``) and the standard variables ask for
traces: ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
set, or ``OTEL_TRACES_EXPORTER=otlp``; ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` keep it off. Everything else (service name,
resource attributes, sampler, headers, timeouts, batch sizes) is the SDK's own
reading of the ``OTEL_*`` variables. The provider is set up once per process,
on first use, and flushed at exit (the SDK's own ``atexit`` shutdown), so a
batch command's spans are exported before it ends.

Incoming ``traceparent`` / ``tracestate`` headers (W3C Trace Context) make a
served request's span a child of the caller's (:func:`server_span`).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_OFF: AbstractContextManager[None] = nullcontext()
_lock = threading.Lock()
#: None: not decided yet; False: off; else the tracer
_tracer: Any = None
#: opentelemetry.trace.get_current_span, once the SDK is set up
_current: Any = None


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the ``OTEL_*`` variables in ``env`` ask for traces (module docstring)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return exporter == "otlp" or bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or
                                      env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _setup() -> Any:
    """The tracer, setting up the SDK's provider and exporter once; False when off."""
    global _tracer
    with _lock:
        if _tracer is not None:
            return _tracer
        if not wanted():
            _tracer = False
            return _tracer
        try:
            from opentelemetry import trace
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            _tracer = False  # asked for, but the otel extra is not installed: stay off
            return _tracer
        __version__ = _version()
        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME")
                                    or "modeldir-registry",
                                    "service.version": __version__})
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        global _current
        _current = trace.get_current_span
        _tracer = trace.get_tracer("registry", __version__)
        return _tracer


def _unsampled() -> bool:
    """The current span exists and is not recorded (its trace was not sampled):
    a child would not be either (every standard sampler decides per trace or
    follows the parent), so none is made: an unsampled request costs one span."""
    sp = _current()
    return not sp.is_recording() and sp.get_span_context().is_valid


def _version() -> str:
    """The installed package's version (read from its metadata: importing the
    package's root from here would be an import cycle)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("modeldir-registry")
    except PackageNotFoundError:
        return "unknown"


def enabled() -> bool:
    """Whether spans are being recorded in this process (sets the SDK up on first call)."""
    t = _tracer if _tracer is not None else _setup()
    return t is not False


def span(name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """A child span of the current one named ``name`` (a no-op context while off).

    ``attributes`` whose value is None are left out."""
    t = _tracer if _tracer is not None else _setup()
    if t is False or _unsampled():
        return _OFF
    return t.start_as_current_span(name, attributes={k: v for k, v in attributes.items()
                                                     if v is not None})


def _no_parent() -> bool:
    """No recorded span is current: a child-only span is not made."""
    return not _current().is_recording()


def in_context(fn: F) -> F:
    """``fn`` bound to the current trace context, for a worker thread to run
    (a download submitted to a pool stays under its pull's span); ``fn``
    itself while tracing is off."""
    if _tracer is None or _tracer is False or _no_parent():
        return fn
    import contextvars

    ctx = contextvars.copy_context()
    return functools.wraps(fn)(lambda *a, **k: ctx.run(fn, *a, **k))  # type: ignore[return-value]


def traced(name: str, *, child_only: bool = False) -> Callable[[F], F]:
    """Decorate a function so each call is a span ``name`` (the error, if one
    is raised, recorded on it); while off the call goes straight through.
    ``child_only``: only under a recorded span (a store call or a piece check
    on its own is no trace)."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            t = _tracer if _tracer is not None else _setup()
            if t is False or (_no_parent() if child_only else _unsampled()):
                return fn(*args, **kwargs)
            with t.start_as_current_span(name):
                return fn(*args, **kwargs)
        return inner  # type: ignore[return-value]
    return wrap


def traced_iter(name: str, *, child_only: bool = False) -> Callable[[F], F]:
    """:func:`traced` for a function returning an iterator: the span lasts
    until the iterator is exhausted or closed, not just until it is made."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            t = _tracer if _tracer is not None else _setup()
            if t is False or (_no_parent() if child_only else _unsampled()):
                return fn(*args, **kwargs)
            return _spanning(t, name, fn(*args, **kwargs))
        return inner  # type: ignore[return-value]
    return wrap


def _spanning(tracer: Any, name: str, it: Any) -> Iterator[Any]:
    with tracer.start_as_current_span(name):
        yield from it


#: Store methods that are a span each while tracing is on (the store calls of a trace)
STORE_CALLS = ("open_read", "read_bytes", "read_range", "create", "write_bytes", "swap",
               "info", "list_dir", "exists", "delete", "read_versioned")
STORE_ITERATORS = ("iter_read", "iter_range")


def trace_store_methods(cls: type) -> None:
    """Make each of :data:`STORE_CALLS` / :data:`STORE_ITERATORS` that ``cls``
    defines itself a span ``store.<method>`` (called for every Store class)."""
    for name in STORE_CALLS + STORE_ITERATORS:
        fn = cls.__dict__.get(name)
        if fn is None or getattr(fn, "__isabstractmethod__", False) or \
                getattr(fn, "_traced", False):
            continue
        deco = traced_iter if name in STORE_ITERATORS else traced
        wrapped = deco(f"store.{name}", child_only=True)(fn)
        wrapped._traced = True  # type: ignore[attr-defined]
        setattr(cls, name, wrapped)


@contextmanager
def _server(tracer: Any, method: str, route: str, path: str,
            headers: Mapping[str, str]) -> Iterator[Any]:
    from opentelemetry.propagate import extract
    from opentelemetry.trace import SpanKind

    ctx = extract(dict(headers))
    with tracer.start_as_current_span(f"{method} {route}", context=ctx, kind=SpanKind.SERVER,
                                      attributes={"http.request.method": method,
                                                  "url.path": path,
                                                  "registry.route": route}) as s:
        yield s


def server_span(method: str, route: str, path: str,
                headers: Mapping[str, str]) -> AbstractContextManager[Any]:
    """The span of one served request, a child of the ``traceparent`` in
    ``headers`` when there is one; yields the span (None while off)."""
    t = _tracer if _tracer is not None else _setup()
    if t is False:
        return _OFF
    return _server(t, method, route, path, headers)


def set_status(sp: Any, code: int) -> None:
    """Record the HTTP status ``code`` on a server span (an error for 5xx)."""
    if sp is None:
        return
    sp.set_attribute("http.response.status_code", code)
    if code >= 500:
        from opentelemetry.trace import Status, StatusCode

        sp.set_status(Status(StatusCode.ERROR))


def reset() -> None:
    """Decide again on next use (tests that change the ``OTEL_*`` variables)."""
    global _tracer
    with _lock:
        _tracer = None

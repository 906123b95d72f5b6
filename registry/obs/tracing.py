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

Cost with every request sampled (issue 48, item 8): a served request makes
one span of its own plus one per store call and piece check, so those are
*leaf spans* (:func:`leaf`): timed with two clock reads and handed to the
batch processor as one finished span when the call returns, instead of the
SDK's live span (its lock, limits, context attach and detach: about five
times the CPU), and an exception on them is a type name, never a formatted
traceback (a ``not found`` answered by the store is an outcome, not an
error: most of a served request's store calls are such probes). A store
call made inside another (``exists`` calling ``info``, ``read_bytes``
calling ``open_read``) is no span of its own: the outer one is the call.
"""

from __future__ import annotations

import functools
import os
import threading
import time
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
#: makes a finished leaf span (:func:`_leaf_maker`), once the SDK is set up
_emit: Any = None
#: the span processor (registry.obs.spans.Batcher), once the SDK is set up
_batcher: Any = None
#: what light spans take from the SDK's tracer (registry.obs.spans.Source), or None
_src: Any = None
#: registry.obs.spans.Serving, once the SDK is set up
_serving: Any = None


class _Depth(threading.local):
    """How many store calls this thread is inside (a nested one is no span)."""

    n = 0


_depth = _Depth()


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
            from opentelemetry.exporter.otlp.proto.http import trace_exporter  # noqa: F401
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
        except ImportError:
            _tracer = False  # asked for, but the otel extra is not installed: stay off
            return _tracer
        __version__ = _version()
        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME")
                                    or "modeldir-registry",
                                    "service.version": __version__})
        provider = TracerProvider(resource=resource)
        from registry.obs.otlp import span_exporter
        from registry.obs.spans import Batcher, Serving, Source

        global _current, _emit, _batcher, _src, _serving
        _batcher = Batcher(span_exporter())
        provider.add_span_processor(_batcher)
        trace.set_tracer_provider(provider)
        _current, _serving = trace.get_current_span, Serving
        _tracer = trace.get_tracer("registry", __version__)
        _src = Source(_tracer, _batcher) if hasattr(_tracer, "span_processor") else None
        _emit = _leaf_maker(_tracer)
        return _tracer


def _unsampled() -> bool:
    """The current span exists and is not recorded (its trace was not sampled):
    a child would not be either (every standard sampler decides per trace or
    follows the parent), so none is made: an unsampled request costs one span."""
    sp = _current()
    return not sp.is_recording() and sp.get_span_context().is_valid


def _leaf_maker(tracer: Any) -> Any:
    """``emit(name, parent, start_ns, error)``: hand one finished span to the
    span processor. ``parent``: the current span's context when the call
    began (it is recorded, so its trace is sampled: every standard sampler
    decides per trace or follows the parent, and the child shares its trace
    id, flags and trace state).

    The SDK's own ``Span`` (``start_span`` ... ``end``) costs about 40 us of
    CPU here (a lock, attribute limits, the sampler, a context attach and
    detach); a leaf has no children, no events and no attributes set while it
    runs, so it is made finished: a slotted record
    (registry.obs.spans.Leaf, about 1 us) that the exporter encodes
    directly."""
    from opentelemetry.trace import Status, StatusCode

    from registry.obs.spans import Leaf

    if not hasattr(tracer, "span_processor"):  # not the SDK's: its own spans, finished at once
        def emit_slow(name: str, parent: Any, start: int, error: BaseException | None) -> None:
            sp = tracer.start_span(name, start_time=start, record_exception=False)
            if error is not None:
                sp.set_attribute("error.type", type(error).__qualname__)
            sp.end()
        return emit_slow
    from registry.obs.spans import Source

    src = _src if _src is not None and _src.tracer is tracer else Source(tracer)
    add, new_id = src.add, src.new_span_id
    from registry.obs.spans import UNSET as unset
    not_found_attrs = {"registry.outcome": "not_found"}

    def emit(name: str, parent: Any, start: int, error: BaseException | None) -> None:
        if not parent.trace_flags.sampled:  # recorded, not exported (RECORD_ONLY)
            return
        attributes, status = None, unset
        if error is not None:
            if isinstance(error, FileNotFoundError):  # a probe's answer: absent
                attributes = not_found_attrs
            else:  # the type only: a message may name a URL; no traceback (ms of CPU)
                kind = type(error).__qualname__
                attributes, status = {"error.type": kind}, Status(StatusCode.ERROR, kind)
        add(Leaf(src, name, parent, new_id(), start, time.time_ns(), attributes, status))
    return emit


def _leaf_wrap(name: str, store: bool,
               finish: Callable[[Any, int, Any], Any]) -> Callable[[F], F]:
    """The decorator behind :func:`leaf` and :func:`leaf_iter`: call ``fn``
    under the span's bookkeeping; a raise ends the span with the error, a
    return goes to ``finish(ctx, start, out)``, whose result the call returns."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            t = _tracer if _tracer is not None else _setup()
            if t is False or (store and _depth.n):
                return fn(*args, **kwargs)
            parent = _current()
            if not parent.is_recording():
                return fn(*args, **kwargs)
            ctx, start = parent.get_span_context(), time.time_ns()
            if store:
                _depth.n += 1
            try:
                out = fn(*args, **kwargs)
            except BaseException as e:
                _emit(name, ctx, start, e)
                raise
            finally:
                if store:
                    _depth.n -= 1
            return finish(ctx, start, out)
        return inner  # type: ignore[return-value]
    return wrap


def leaf(name: str, *, store: bool = False) -> Callable[[F], F]:
    """Decorate a function so each call under a recorded span is a leaf span
    ``name`` (module docstring): a store call or a piece check. Never a trace
    of its own; with ``store``, not made inside another store call. The
    function's own calls are not children of it (it is never the current
    span): use :func:`traced` for a span with children."""
    def finish(ctx: Any, start: int, out: Any) -> Any:
        _emit(name, ctx, start, None)
        return out
    return _leaf_wrap(name, store, finish)


def leaf_iter(name: str, *, store: bool = False) -> Callable[[F], F]:
    """:func:`leaf` for a function returning an iterator: the span runs from
    the call until the iterator is exhausted, closed or fails (closed early is
    no error: a reader that stops at a range's end)."""
    return _leaf_wrap(name, store,
                      lambda ctx, start, it: _leaf_items(name, ctx, start, it, store))


def _leaf_items(name: str, ctx: Any, start: int, it: Any, store: bool) -> Iterator[Any]:
    error: BaseException | None = None
    it = iter(it)
    try:
        while True:
            if store:  # the store's own calls inside next() are this call's
                _depth.n += 1
            try:
                item = next(it)
            except StopIteration:
                return
            finally:
                if store:
                    _depth.n -= 1
            yield item
    except GeneratorExit:
        raise
    except BaseException as e:
        error = e
        raise
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
        _emit(name, ctx, start, error)


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
    defines itself a leaf span ``store.<method>`` (called for every Store
    class; a store call inside another is not one)."""
    for name in STORE_CALLS + STORE_ITERATORS:
        fn = cls.__dict__.get(name)
        if fn is None or getattr(fn, "__isabstractmethod__", False) or \
                getattr(fn, "_traced", False):
            continue
        deco = leaf_iter if name in STORE_ITERATORS else leaf
        wrapped = deco(f"store.{name}", store=True)(fn)
        wrapped._traced = True  # type: ignore[attr-defined]
        setattr(cls, name, wrapped)


@contextmanager
def _server(tracer: Any, method: str, route: str, path: str,
            headers: Mapping[str, str]) -> Iterator[Any]:
    """The SDK's own server span (a tracer that is not the SDK's, or span
    limits below the defaults)."""
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
    if _src is not None and _src.plain:  # the light span (registry.obs.spans.Serving)
        return _serving(_src, f"{method} {route}", headers,
                        {"http.request.method": method, "url.path": path, "registry.route": route})
    return _server(t, method, route, path, headers)


def set_status(sp: Any, code: int, route: str | None = None) -> None:
    """Record the HTTP status ``code`` (an error for 5xx) and the matched
    route's template (``http.route``, e.g. ``/{namespace}/{name}/resolve/...``)
    on a server span."""
    if sp is None:
        return
    sp.set_attribute("http.response.status_code", code)
    if route is not None:
        sp.set_attribute("http.route", route)
    if code >= 500:
        from opentelemetry.trace import Status, StatusCode

        sp.set_status(Status(StatusCode.ERROR))


def dropped() -> int:
    """Spans dropped because the export queue was full (0 while off)."""
    return _batcher.dropped if _batcher is not None else 0


def reset() -> None:
    """Decide again on next use (tests that change the ``OTEL_*`` variables)."""
    global _tracer
    with _lock:
        _tracer = None

"""Light spans and the span batcher of :mod:`registry.obs.tracing` (issue 48, item 8).

Loaded only once tracing is on (it imports the OpenTelemetry API and SDK).

- :class:`ServerSpan`: the span of one served request. An API ``Span`` (it is
  the current span while the request runs, so ``get_current_span()``, the
  leaf spans and the SDK's own child spans find it), but none of the SDK
  ``Span``'s machinery on the hot path: no lock, no ``BoundedAttributes``, no
  span processor ``on_start``; the sampler, the id generator, the resource and
  the instrumentation scope are the SDK tracer's, so every ``OTEL_*``
  variable (``OTEL_TRACES_SAMPLER`` ``parentbased_traceidratio`` included)
  decides as it would for an SDK span. Ended, it goes to the batcher as it is.
- :class:`Leaf`: a finished store call or piece check (``tracing.leaf``): a
  slotted record of its name, parent, id, times and outcome; the exporter
  encodes it straight to bytes (registry.obs.otlp).
- :class:`Batcher`: the span processor: a bounded queue that the request
  threads only append to; a worker thread exports batches. When the queue is
  full a span is dropped and counted (:attr:`Batcher.dropped`), never waited
  for. ``OTEL_BSP_SCHEDULE_DELAY``, ``OTEL_BSP_MAX_QUEUE_SIZE`` and
  ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` apply (read by the SDK's own parser).

Both span kinds convert to the SDK's ``ReadableSpan`` (:func:`readable`) for
an exporter that is not ours.

May import: nothing of the package (a leaf of registry.obs).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import attach as _attach
from opentelemetry.context import detach as _detach
from opentelemetry.propagate import extract as _extract
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

_log = logging.getLogger(__name__)
_in_context = trace.set_span_in_context
#: the status of every span that ended without an error (the encoder knows it by identity)
UNSET = Status(StatusCode.UNSET)
_SAMPLED = trace.TraceFlags(trace.TraceFlags.SAMPLED)
_NOT_SAMPLED = trace.TraceFlags(trace.TraceFlags.DEFAULT)
_SAMPLED_RANDOM = trace.TraceFlags(trace.TraceFlags.SAMPLED | trace.TraceFlags.RANDOM_TRACE_ID)


class _FromSource:
    """What an exporter reads of a span that its :class:`Source` holds."""

    __slots__ = ()
    src: Any

    @property
    def resource(self) -> Any:
        return self.src.resource

    @property
    def instrumentation_scope(self) -> Any:
        return self.src.scope


class Leaf(_FromSource):
    """A finished leaf span: ``parent`` is the recorded span's ``SpanContext``
    (the leaf shares its trace id, flags and trace state)."""

    __slots__ = ("name", "parent", "span_id", "start_time", "end_time", "attributes", "status",
                 "src")
    kind = SpanKind.INTERNAL
    events = links = ()
    dropped_attributes = dropped_events = dropped_links = 0

    def __init__(self, src: Any, name: str, parent: SpanContext, span_id: int, start: int,
                 end: int, attributes: Mapping[str, Any] | None, status: Status) -> None:
        self.src, self.name, self.parent, self.span_id = src, name, parent, span_id
        self.start_time, self.end_time = start, end
        self.attributes, self.status = attributes, status

    @property
    def context(self) -> SpanContext:
        p = self.parent
        return SpanContext(p.trace_id, self.span_id, False, p.trace_flags, p.trace_state)


class Source:
    """What the light spans take from the SDK tracer: its sampler, id
    generator, resource, instrumentation scope and span processor."""

    def __init__(self, tracer: Any, processor: Any = None) -> None:
        self.tracer = tracer
        self.sampler = tracer.sampler
        self.new_span_id = tracer.id_generator.generate_span_id
        self.new_trace_id = tracer.id_generator.generate_trace_id
        self.random_ids = tracer.id_generator.is_trace_id_random()
        self.resource = tracer.resource
        self.scope = getattr(tracer, "_instrumentation_scope", None)
        #: ``processor``: the provider's one processor, called without the
        #: SDK's multi-processor loop; else the tracer's own
        self.processor = processor or tracer.span_processor
        #: hand a finished span on, its trace known to be sampled
        self.add = getattr(self.processor, "add", self.processor.on_end)
        from opentelemetry.sdk.trace import sampling

        #: the sampler samples every trace that has no parent (the default,
        #: parentbased_always_on, or always_on): a request without a
        #: ``traceparent`` needs no sampler call (its answer is known)
        self.roots_sampled = self.sampler is sampling.DEFAULT_ON or \
            self.sampler is sampling.ALWAYS_ON
        limits = getattr(tracer, "_span_limits", None)
        #: the SDK's attribute limits are the defaults (128, no value length
        #: limit): a light span, which has at most a handful, never reaches them
        self.plain = limits is not None and limits.max_span_attributes >= 16 and \
            limits.max_attributes >= 16 and limits.max_span_attribute_length is None and \
            limits.max_attribute_length is None and \
            getattr(tracer, "_is_enabled", lambda: True)()


def _clean(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)):
        return value
    try:  # lists to tuples, other types to their str, as the SDK's span does
        from opentelemetry.attributes import _clean_attribute_value
    except ImportError:  # another API release
        return value
    return _clean_attribute_value(value, None)


class ServerSpan(_FromSource, trace.Span):
    """The span of one served request (module docstring)."""

    __slots__ = ("src", "name", "context", "parent", "attributes", "events", "links", "status",
                 "start_time", "end_time")
    kind = SpanKind.SERVER
    dropped_attributes = dropped_events = dropped_links = 0

    def __init__(self, src: Source, name: str, context: SpanContext, parent: SpanContext | None,
                 attributes: dict[str, Any]) -> None:
        self.src, self.name, self.context, self.parent = src, name, context, parent
        self.attributes = attributes
        self.events: list[Any] = []
        self.links: list[Any] = []
        self.status = UNSET
        self.start_time, self.end_time = time.time_ns(), None

    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return self.end_time is None

    def set_attribute(self, key: str, value: Any) -> None:
        if self.end_time is None:
            value = _clean(value)
            if value is not None:
                self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        for k, v in attributes.items():
            self.set_attribute(k, v)

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None,
                  timestamp: int | None = None) -> None:
        if self.end_time is None:
            self.events.append(Event(name, attributes, timestamp or time.time_ns()))

    def add_link(self, context: SpanContext, attributes: Mapping[str, Any] | None = None) -> None:
        if self.end_time is None and context.is_valid:
            self.links.append(trace.Link(context, attributes))

    def update_name(self, name: str) -> None:
        if self.end_time is None:
            self.name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self.end_time is not None or self.status.status_code is StatusCode.OK:
            return
        if isinstance(status, StatusCode):
            status = Status(status, description)
        if status.status_code is not StatusCode.UNSET:
            self.status = status

    def record_exception(self, exception: BaseException,
                         attributes: Mapping[str, Any] | None = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        """The exception's type only (a message may name a URL; a formatted
        traceback costs milliseconds), as the leaf spans record errors."""
        self.set_attribute("error.type", type(exception).__qualname__)
        self.add_event("exception", {"exception.type": type(exception).__qualname__,
                                     **(attributes or {})}, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self.end_time is not None:
            return
        self.end_time = end_time or time.time_ns()
        self.src.processor.on_end(self)


def server_span(src: Source, name: str, parent_ctx: Any,
                attributes: dict[str, Any]) -> trace.Span:
    """Start a server span: a child of the span in ``parent_ctx`` (a context
    extracted from the request's headers, or None), sampled as the SDK's
    ``Tracer.start_span`` samples (the same sampler call, trace flags and
    trace state); a ``NonRecordingSpan`` when the sampler drops it."""
    if parent_ctx is None and src.roots_sampled:  # what the sampler would answer
        flags = _SAMPLED_RANDOM if src.random_ids else _SAMPLED
        return ServerSpan(src, name, SpanContext(src.new_trace_id(), src.new_span_id(), False,
                                                 flags), None, attributes)
    parent = trace.get_current_span(parent_ctx).get_span_context() if parent_ctx else None
    if parent is None or not parent.is_valid:
        parent, trace_id, random = None, src.new_trace_id(), src.random_ids
    else:
        trace_id, random = parent.trace_id, parent.trace_flags.random_trace_id
    result = src.sampler.should_sample(parent_ctx, trace_id, name, SpanKind.SERVER,
                                       attributes, ())
    flags = _SAMPLED if result.decision.is_sampled() else _NOT_SAMPLED
    if random:
        flags = trace.TraceFlags(flags | trace.TraceFlags.RANDOM_TRACE_ID)
    context = SpanContext(trace_id, src.new_span_id(), False, flags, result.trace_state)
    if not result.decision.is_recording():
        return trace.NonRecordingSpan(context)
    attrs = result.attributes
    return ServerSpan(src, name, context, parent,
                      dict(attrs) if attrs is not attributes else attributes)


def readable(s: Any) -> Any:
    """The SDK's ``ReadableSpan`` of a light span (``s`` itself for any other)."""
    if not isinstance(s, (Leaf, ServerSpan)):
        return s
    return ReadableSpan(s.name, s.context, s.parent, s.resource, s.attributes,
                        list(s.events), list(s.links), s.kind, status=s.status,
                        start_time=s.start_time, end_time=s.end_time,
                        instrumentation_scope=s.instrumentation_scope)


class Batcher(SpanProcessor):
    """The span processor (module docstring): the request threads append to a
    bounded deque; a worker exports batches of at most ``batch`` spans every
    ``delay`` seconds, or as soon as a batch is full. A span that finds the
    queue full is dropped and counted."""

    def __init__(self, exporter: Any) -> None:
        self.exporter = exporter
        self.max_queue = BatchSpanProcessor._default_max_queue_size()
        self.delay = BatchSpanProcessor._default_schedule_delay_millis() / 1e3
        self.batch = min(BatchSpanProcessor._default_max_export_batch_size(), self.max_queue)
        self.dropped = 0
        self._queue: collections.deque[Any] = collections.deque()
        self._shutdown = False
        self._start()
        ref = weakref.ref(self)
        if hasattr(os, "register_at_fork"):  # a forked child starts its own worker
            os.register_at_fork(after_in_child=lambda: (b := ref()) and b._start())

    def _start(self) -> None:
        self._queue.clear()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._worker = threading.Thread(target=self._run, name="registry-span-batcher",
                                        daemon=True)
        self._worker.start()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: Any) -> None:
        if span.context.trace_flags.sampled:
            self.add(span)

    def add(self, span: Any) -> None:
        """Queue a span of a sampled trace (:meth:`on_end` without the check)."""
        if self._shutdown:
            return
        q = self._queue
        if len(q) >= self.max_queue:
            self.dropped += 1  # a lost increment under a race undercounts by one: no lock here
            if self.dropped == 1:
                _log.warning("span queue full (%d): spans are dropped", self.max_queue)
            return
        q.append(span)
        if len(q) >= self.batch and not self._wake.is_set():
            self._wake.set()

    def _run(self) -> None:
        while not self._shutdown:
            self._wake.wait(self.delay)
            self._wake.clear()
            self._export(everything=False)

    def _export(self, everything: bool) -> None:
        with self._lock:
            q = self._queue
            first = True
            while q and (everything or first or len(q) >= self.batch):
                first = False
                n = min(self.batch, len(q))
                spans = [q.popleft() for _ in range(n)]
                try:
                    self.exporter.export(spans)
                except Exception:  # noqa: BLE001 - an export failure loses the batch, as the SDK's
                    _log.exception("exporting %d spans failed", n)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        if not self._shutdown:
            self._export(everything=True)
        return True

    def shutdown(self) -> None:
        if self._shutdown:
            return
        self._export(everything=True)
        self._shutdown = True
        self._wake.set()
        self._worker.join(5)
        self.exporter.shutdown()


class Serving:
    """The context of one served request's span (``with``): the span is the
    current span inside; an exception that escapes is recorded as its type
    (``error.type``, error status), never a formatted traceback."""

    __slots__ = ("src", "name", "headers", "attributes", "span", "token")

    def __init__(self, src: Source, name: str, headers: Mapping[str, str],
                 attributes: dict[str, Any]) -> None:
        self.src, self.name, self.headers, self.attributes = src, name, headers, attributes

    def __enter__(self) -> trace.Span:
        ctx = _extract(self.headers) if self.headers else None
        sp = self.span = server_span(self.src, self.name, ctx, self.attributes)
        self.token = _attach(_in_context(sp, ctx))
        return sp

    def __exit__(self, kind: Any, error: Any, tb: Any) -> None:
        sp = self.span
        _detach(self.token)
        if error is not None and isinstance(error, Exception) and sp.is_recording():
            name = type(error).__qualname__
            sp.set_attribute("error.type", name)
            sp.set_status(StatusCode.ERROR, name)
        sp.end()

"""The OTLP/HTTP span exporter of :mod:`registry.obs.tracing`: the SDK's own
(``OTLPSpanExporter``: endpoint, headers, timeout, compression, TLS and retries
from the standard ``OTEL_EXPORTER_OTLP_*`` variables), with a faster encoder
of the export request.

Why: with every request sampled, the SDK's encoder was the largest part of the
cost of tracing ``registry serve`` (issue 48, item 8): it builds a protobuf
object per span, attribute and status and hashes the resource (a JSON dump of
its attributes) once per span, about 30-50 us of CPU a span on the shared
benchmark machine; a served request makes about a dozen spans. :func:`encode`
writes the same ``ExportTraceServiceRequest`` bytes directly (the protobuf wire
format of opentelemetry-proto's ``trace.proto``, fields in number order, as
the SDK's serializer writes them: tests/test_otlp_encode.py checks it byte for
byte against the SDK's encoder), about 5x less CPU.

Only :meth:`export` is replaced, and only while the SDK exporter has the parts
it uses (its HTTP client and export metrics, opentelemetry-exporter-otlp-proto-
http 1.4x); otherwise the SDK's own ``export`` runs unchanged.

The transport under it is registry.obs.transport's kept ``http.client``
connection instead of the SDK's ``requests`` session, where it applies.

May import: registry.obs.spans (the light spans it encodes), registry.obs.transport.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

_log = logging.getLogger(__name__)

_fixed64 = struct.Struct("<Q").pack
_fixed32 = struct.Struct("<I").pack
_double = struct.Struct("<d").pack
_times = struct.Struct("<BQBQ").pack
#: span flags: the context says whether it is remote / and it is (trace.proto SpanFlags)
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200
#: registry.obs.spans.UNSET once a batch was encoded (the leaves' shared status)
UNSET: Any = None


def _varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return bytes((n,))
    n &= 0xFFFFFFFFFFFFFFFF  # a negative int64 is ten bytes, two's complement
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: ``tag`` (one byte for fields 1-15), length, payload."""
    return tag + _varint(len(payload)) + payload


def _value(v: Any) -> bytes:
    """An ``AnyValue`` message (common.proto), as the SDK's ``_encode_value`` maps types."""
    if v is None:
        return b""
    if isinstance(v, bool):
        return b"\x10\x01" if v else b"\x10\x00"
    if isinstance(v, str):
        return _field(b"\x0a", v.encode())
    if isinstance(v, int):
        return b"\x18" + _varint(v)
    if isinstance(v, float):
        return b"\x21" + _double(v)
    if isinstance(v, bytes):
        return _field(b"\x3a", v)
    if isinstance(v, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _value(x)) for x in v))
    if isinstance(v, Mapping):
        return _field(b"\x32", b"".join(_field(b"\x0a", _key_value(str(k), x))
                                        for k, x in v.items()))
    raise TypeError(f"invalid attribute type {type(v).__name__}")


def _key_value(key: str, v: Any) -> bytes:
    return _field(b"\x0a", key.encode()) + _field(b"\x12", _value(v))


def _attributes(tag: bytes, attributes: Any) -> bytes:
    """Repeated ``KeyValue`` field ``tag``; a value of an unknown type is left
    out and logged, as the SDK's encoder does."""
    if not attributes:
        return b""
    out = []
    for k, v in attributes.items():
        kind = type(v)
        if kind is str or kind is int:  # the values that repeat: method, route, status...
            cache = _kv_str if kind is str else _kv_int
            field = cache.get((tag, k, v))
            if field is None:
                field = _field(tag, _key_value(k, v))
                if len(cache) < _KV_CACHED:
                    cache[(tag, k, v)] = field
            out.append(field)
            continue
        try:
            out.append(_field(tag, _key_value(k, v)))
        except TypeError as e:
            _log.error("Failed to encode key %s: %s", k, e)
    return b"".join(out)


#: encoded ``KeyValue`` fields by (tag, key, value), for str and int values
#: apart (True == 1 would share a key); at most _KV_CACHED each
_kv_str: dict[tuple[bytes, str, Any], bytes] = {}
_kv_int: dict[tuple[bytes, str, Any], bytes] = {}
_KV_CACHED = 4096


def _flags(ctx: Any) -> bytes:
    return _fixed32(_HAS_IS_REMOTE | (_IS_REMOTE if ctx is not None and ctx.is_remote else 0))


_LOCAL_PARENT, _REMOTE_PARENT = b"\x85\x01" + _flags(None), b"\x85\x01" + _fixed32(
    _HAS_IS_REMOTE | _IS_REMOTE)
#: span name -> its encoded field (names repeat: store.exists, GET hub_file...)
_names: dict[str, bytes] = {}
#: SDK SpanKind / StatusCode -> encoded field (filled on first use)
_kinds: dict[Any, bytes] = {}
_codes: dict[Any, bytes] = {}


def _name(name: str) -> bytes:
    field = _names.get(name)
    if field is None:
        field = _field(b"\x2a", name.encode())
        if len(_names) < 4096:
            _names[name] = field
    return field


def _span(s: Any) -> bytes:
    """One ``Span`` message (trace.proto), fields in number order."""
    ctx, parent = s.context, s.parent
    out = [b"\x0a\x10", ctx.trace_id.to_bytes(16, "big"), b"\x12\x08",
           ctx.span_id.to_bytes(8, "big")]
    if ctx.trace_state:
        out.append(_field(b"\x1a", ",".join(f"{k}={v}" for k, v in
                                            ctx.trace_state.items()).encode()))
    if parent is not None:
        out += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
    out.append(_name(s.name))
    kind = _kinds.get(s.kind)
    if kind is None:  # SpanKind: the SDK's value + 1 (0 is UNSPECIFIED)
        kind = _kinds[s.kind] = b"\x30" + _varint(s.kind.value + 1)
    out.append(kind)
    if s.start_time:
        out += (b"\x39", _fixed64(s.start_time))
    if s.end_time:
        out += (b"\x41", _fixed64(s.end_time))
    if s.attributes:
        out.append(_attributes(b"\x4a", s.attributes))
    if s.dropped_attributes:  # also when a limit of 0 kept none
        out += (b"\x50", _varint(s.dropped_attributes))
    events = s.events
    if events:
        for e in events:
            body = (b"\x09" + _fixed64(e.timestamp) if e.timestamp else b"") + \
                _field(b"\x12", e.name.encode()) + _attributes(b"\x1a", e.attributes) + \
                (b"\x20" + _varint(e.dropped_attributes) if e.dropped_attributes else b"")
            out.append(_field(b"\x5a", body))
    if s.dropped_events:
        out += (b"\x60", _varint(s.dropped_events))
    links = s.links
    if links:
        for link in links:
            body = b"\x0a\x10" + link.context.trace_id.to_bytes(16, "big") + b"\x12\x08" + \
                link.context.span_id.to_bytes(8, "big") + \
                _attributes(b"\x22", link.attributes) + \
                (b"\x28" + _varint(link.dropped_attributes) if link.dropped_attributes
                 else b"") + b"\x35" + _flags(link.context)
            out.append(_field(b"\x6a", body))
    if s.dropped_links:
        out += (b"\x70", _varint(s.dropped_links))
    status = s.status
    if status is not None:
        code = _codes.get(status.status_code)
        if code is None:
            value = status.status_code.value
            code = _codes[status.status_code] = b"\x18" + _varint(value) if value else b""
        if status.description:
            out.append(_field(b"\x7a", _field(b"\x12", status.description.encode()) + code))
        else:
            out += (b"\x7a", _varint(len(code)), code)
    out.append(_REMOTE_PARENT if parent is not None and parent.is_remote else _LOCAL_PARENT)
    return b"".join(out)


def _leaf(s: Any) -> bytes:
    """:func:`_span` for a leaf span (registry.obs.spans.Leaf): no events, no
    links, a local parent whose trace id, flags and state it shares."""
    p = s.parent
    out = [b"\x0a\x10", p.trace_id.to_bytes(16, "big"), b"\x12\x08",
           s.span_id.to_bytes(8, "big")]
    if p.trace_state:
        out.append(_field(b"\x1a", ",".join(f"{k}={v}" for k, v in
                                            p.trace_state.items()).encode()))
    out += (b"\x22\x08", p.span_id.to_bytes(8, "big"), _name(s.name), b"\x30\x01",
            _times(0x39, s.start_time, 0x41, s.end_time))
    if s.attributes:
        out.append(_attributes(b"\x4a", s.attributes))
    status = s.status
    if status is UNSET:
        out.append(b"\x7a\x00")
    elif status.status_code.value:
        body = b"\x18" + _varint(status.status_code.value)
        if status.description:
            body = _field(b"\x12", status.description.encode()) + body
        out.append(_field(b"\x7a", body))
    else:
        out.append(b"\x7a\x00")
    out.append(_LOCAL_PARENT)
    return b"".join(out)


def _scope(scope: Any) -> bytes:
    """An ``InstrumentationScope`` message (common.proto)."""
    if scope is None:
        return b""
    return (_field(b"\x0a", scope.name.encode()) if scope.name else b"") + \
        (_field(b"\x12", scope.version.encode()) if scope.version else b"") + \
        _attributes(b"\x1a", scope.attributes)


def encode(spans: Sequence[Any]) -> bytes:
    """The serialized ``ExportTraceServiceRequest`` of ``spans`` (SDK
    ``ReadableSpan``s): grouped by resource, then instrumentation scope, in
    order of first appearance, as the SDK's ``encode_spans`` groups them
    (by identity here, which is what one process's spans share)."""
    global UNSET
    from registry.obs.spans import UNSET, Leaf

    groups: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
    for s in spans:
        resource, scope = s.resource, s.instrumentation_scope or None
        scopes = groups.setdefault(id(resource), (resource, {}))[1]
        scopes.setdefault(id(scope), (scope, []))[1].append(
            _field(b"\x12", _leaf(s) if type(s) is Leaf else _span(s)))
    out = []
    for resource, scopes in groups.values():
        body = [_field(b"\x0a", _attributes(b"\x0a", resource.attributes))]
        for scope, encoded in scopes.values():
            schema = scope.schema_url if scope is not None else None
            body.append(_field(b"\x12", _field(b"\x0a", _scope(scope)) + b"".join(encoded) +
                               (_field(b"\x1a", schema.encode()) if schema else b"")))
        if resource.schema_url:
            body.append(_field(b"\x1a", resource.schema_url.encode()))
        out.append(_field(b"\x0a", b"".join(body)))
    return b"".join(out)


def span_exporter() -> Any:
    """The SDK's ``OTLPSpanExporter`` (configured by the ``OTEL_*`` variables)
    whose ``export`` sends :func:`encode`'s bytes."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    class Exporter(OTLPSpanExporter):  # type: ignore[misc]
        def export(self, spans: Sequence[Any]) -> Any:
            client, meter = getattr(self, "_client", None), getattr(self, "_metrics", None)
            if getattr(self, "_shutdown", True) or not hasattr(client, "export") or \
                    not hasattr(meter, "export_operation"):
                from registry.obs.spans import readable

                # another SDK release: its own encoder, of the SDK's span class
                return super().export([readable(s) for s in spans])
            assert client is not None and meter is not None
            with meter.export_operation(len(spans)) as result:
                try:
                    data = encode(spans)
                except Exception as error:  # noqa: BLE001 - the SDK drops the batch alike
                    _log.error("Failed to encode span batch: %s", error)
                    result.error = error
                    return SpanExportResult.FAILURE
                limit = getattr(self, "_max_request_size", 0) or 0
                if 0 < limit < len(data):
                    _log.warning("Dropping span batch: serialized size %d bytes exceeds "
                                 "max_request_size %d bytes.", len(data), limit)
                    result.error = ValueError(f"span batch of {len(data)} bytes")
                    return SpanExportResult.FAILURE
                sent = client.export(data)
                if not sent.success:
                    result.error = sent.error
                    return SpanExportResult.FAILURE
            return SpanExportResult.SUCCESS

    exporter = Exporter()
    client = getattr(exporter, "_client", None)
    endpoint = getattr(exporter, "_endpoint", None)
    if isinstance(endpoint, str) and hasattr(getattr(client, "_transport", None), "request"):
        from registry.obs.transport import transport_for

        kept = transport_for(endpoint)  # one kept http.client connection, not requests
        if kept is not None:
            client._transport.close()  # type: ignore[union-attr]
            client._transport = kept  # type: ignore[union-attr]
    return exporter

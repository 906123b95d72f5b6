"""Prometheus metric families of the registry, and the hooks that feed them.

Off by default: until :func:`enable` is called the hooks (:func:`piece_checked`,
:func:`refused`, :func:`mirror_cache`, :func:`store_bytes`, ...) return at once
and ``prometheus_client`` is not imported, so a plain CLI call or a library
user pays nothing. ``registry serve`` enables them and answers ``/metrics``
(registry.web.observe); a batch command enables them with ``registry
--metrics-file PATH`` (a node-exporter textfile, written atomically at exit) or
``--metrics-push URL`` (a Pushgateway, job ``registry``, grouped by command).

Names follow the Prometheus conventions (base units: ``_seconds``, ``_bytes``;
counters end ``_total``) and every label takes a bounded set of values: a
route class, an HTTP status, a reason, a result, a command name. No model id
or version is ever a label value.

| family | type | labels |
|---|---|---|
| ``registry_http_requests_total`` | counter | route, method, code |
| ``registry_http_time_to_first_byte_seconds`` | histogram | route |
| ``registry_http_request_duration_seconds`` | histogram | route |
| ``registry_http_response_bytes_total`` | counter | route |
| ``registry_http_requests_in_flight`` | gauge | |
| ``registry_pieces_verified_total`` | counter | result (ok, failed) |
| ``registry_refusals_total`` | counter | reason (gate, yank, signature, integrity, deleted) |
| ``registry_mirror_cache_requests_total`` | counter | result (hit, miss) |
| ``registry_store_read_bytes_total`` | counter | |
| ``registry_mirror_cache_size_bytes`` | gauge | (serve with --mirror-cache) |
| ``registry_mirror_cache_files``, ``registry_mirror_cache_partial_fills``, ``registry_mirror_cache_partial_bytes``, ``registry_mirror_cache_free_bytes`` | gauges | (serve with --mirror-cache) |
| ``registry_trace_spans_dropped_total`` | counter | (serve with tracing on) |
| ``registry_command_*`` | gauges | command (batch commands only) |
| ``process_*``, ``python_*`` | | the client library's process collectors |
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

#: route classes of ``registry serve`` (the label ``route``): bounded, whatever the URL
ROUTE_CLASSES = ("hub_file", "hub_api", "api", "page", "static", "metrics", "health", "other")
#: ``registry_refusals_total`` reasons, and the error classes that count as each
#: (a subclass of registry.errors counts as its nearest listed base)
REFUSAL_OF_CLASS = {"GateFailedError": "gate", "ReleaseYankedError": "yank",
                    "SignatureError": "signature", "IntegrityError": "integrity",
                    "BlobChangedError": "integrity", "ReleaseDeletedError": "deleted"}
#: seconds: buckets of the latency histograms (1 ms .. 60 s)
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
           30.0, 60.0)


class Families:
    """Every metric family of the registry, on one ``CollectorRegistry``.

    Args:
        registry: where the families are registered (tests own one; the
            process default is made by :func:`enable`).
        process: also register the client's process and platform collectors
            (``process_cpu_seconds_total``, ``process_resident_memory_bytes``...).

    Raises:
        ImportError: ``prometheus_client`` is not installed (the ``web`` extra).
    """

    def __init__(self, registry: CollectorRegistry, *, process: bool = True) -> None:
        from prometheus_client import Counter, Gauge, Histogram
        from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

        self.registry = registry
        r = registry
        self.requests = Counter("registry_http_requests", "HTTP requests answered, by route "
                                "class, method and status code.",
                                ["route", "method", "code"], registry=r)
        self.ttfb = Histogram("registry_http_time_to_first_byte_seconds",
                              "Seconds from a request's arrival to its response's status "
                              "line, by route class.", ["route"], buckets=BUCKETS, registry=r)
        self.duration = Histogram("registry_http_request_duration_seconds",
                                  "Seconds from a request's arrival to the last byte of its "
                                  "response, by route class.", ["route"], buckets=BUCKETS,
                                  registry=r)
        self.sent = Counter("registry_http_response_bytes", "Response body bytes sent, by "
                            "route class.", ["route"], registry=r)
        self.in_flight = Gauge("registry_http_requests_in_flight",
                               "Requests being answered now.", registry=r)
        self.pieces = Counter("registry_pieces_verified", "Pieces of released files checked "
                              "against their manifest digests, by result (ok, failed).",
                              ["result"], registry=r)
        self.refusals = Counter("registry_refusals", "Releases refused, by reason (gate, "
                                "yank, signature, integrity, deleted).", ["reason"],
                                registry=r)
        self.mirror = Counter("registry_mirror_cache_requests", "Files asked of the "
                              "mirror's cache, by result (hit: served from a verified "
                              "blob; miss: fetched from the store first).", ["result"],
                              registry=r)
        self.store_read = Counter("registry_store_read_bytes", "Bytes read from the store "
                                  "(the Hub routes, the mirror's fetches, pulls).", registry=r)
        self.command_seconds = Gauge("registry_command_duration_seconds", "Seconds the "
                                     "last run of a batch command took.", ["command"],
                                     registry=r)
        self.command_exit = Gauge("registry_command_exit_code", "Exit code of the last run "
                                  "of a batch command (0: success).", ["command"], registry=r)
        self.command_last = Gauge("registry_command_last_run_timestamp_seconds", "Unix time "
                                  "the last run of a batch command ended.", ["command"],
                                  registry=r)
        self.command_success = Gauge("registry_command_last_success_timestamp_seconds",
                                     "Unix time the last successful run of a batch command "
                                     "ended.", ["command"], registry=r)
        for reason in sorted(set(REFUSAL_OF_CLASS.values())):
            self.refusals.labels(reason)  # present at 0 from the start: rate() needs them
        for result in ("ok", "failed"):
            self.pieces.labels(result)
        if process:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)


_FAMILIES: Families | None = None


def enable(registry: CollectorRegistry | None = None) -> Families:
    """Switch the hooks on, counting into ``registry`` (default: a new one);
    returns the families. Calling it again returns the families already enabled.

    Raises:
        UsageError: ``prometheus_client`` is not installed.
    """
    global _FAMILIES
    if _FAMILIES is not None:
        return _FAMILIES
    try:
        from prometheus_client import CollectorRegistry
    except ImportError:
        from registry.errors import UsageError

        raise UsageError("metrics need prometheus-client: pip install "
                         "'modeldir-registry[web]'") from None
    _FAMILIES = Families(registry if registry is not None else CollectorRegistry())
    return _FAMILIES


def families() -> Families | None:
    """The enabled families, or None while metrics are off."""
    return _FAMILIES


def disable() -> None:
    """Switch the hooks off again (tests)."""
    global _FAMILIES
    _FAMILIES = None


# -- hooks: called from the code being measured; each returns at once while off --------

def piece_checked(ok: bool) -> None:
    """A piece was checked against its digest (registry.protocol.pieces.check_piece)."""
    f = _FAMILIES
    if f is not None:
        f.pieces.labels("ok" if ok else "failed").inc()


def refused(error_class: str) -> None:
    """An error of class ``error_class`` (a name) ended a command or a request:
    counted as a refusal when :data:`REFUSAL_OF_CLASS` names it."""
    f = _FAMILIES
    if f is None:
        return
    reason = REFUSAL_OF_CLASS.get(error_class)
    if reason is None:
        from registry import errors

        cls = getattr(errors, error_class, None)
        for base in cls.__mro__ if isinstance(cls, type) else ():
            reason = REFUSAL_OF_CLASS.get(base.__name__)
            if reason is not None:
                break
    if reason is not None:
        f.refusals.labels(reason).inc()


def refused_for(reason: str) -> None:
    """A refusal whose reason is already known (one of REFUSAL_OF_CLASS's values)."""
    f = _FAMILIES
    if f is not None:
        f.refusals.labels(reason).inc()


def mirror_cache(hit: bool) -> None:
    """The mirror was asked for a file it held (hit) or had to fetch (miss)."""
    f = _FAMILIES
    if f is not None:
        f.mirror.labels("hit" if hit else "miss").inc()


def store_bytes(n: int) -> None:
    """``n`` bytes were read from the store."""
    f = _FAMILIES
    if f is not None:
        f.store_read.inc(n)


def counting_store_bytes(progress: Callable[[int], None] | None) -> Callable[[int], None]:
    """``progress`` (or a no-op) that also counts its bytes as read from the
    store while metrics are on; ``progress`` itself (or the no-op) while off."""
    plain = progress or (lambda n: None)
    if _FAMILIES is None:
        return plain

    def both(n: int) -> None:
        store_bytes(n)
        plain(n)
    return both


# -- batch commands --------------------------------------------------------------------

class BatchRun:
    """One batch command's metrics, written where ``--metrics-file`` /
    ``--metrics-push`` say when the command ends (:meth:`finish`).

    Args:
        command: the command's name (``pull``, ``publish``, ``gc``...; a label value).
        path: the node-exporter textfile (``*.prom``) to write, or None.
        push: the Pushgateway URL, or None.

    Raises:
        UsageError: ``path``'s folder does not exist or its name does not end
            ``.prom`` (node-exporter reads only those); ``push`` is not an
            http(s) URL; prometheus-client is missing.
    """

    def __init__(self, command: str, *, path: str | None, push: str | None) -> None:
        from registry.errors import UsageError

        if path is not None:
            folder = os.path.dirname(os.path.abspath(path))
            if not path.endswith(".prom"):
                raise UsageError(f"--metrics-file {path}: node-exporter's textfile collector "
                                 "reads only files named *.prom")
            if not os.path.isdir(folder):
                raise UsageError(f"--metrics-file {path}: no such folder {folder}")
        if push is not None and not push.startswith(("http://", "https://")):
            raise UsageError(f"--metrics-push {push}: give the Pushgateway's http(s):// URL")
        self.command, self.path, self.push = command or "registry", path, push
        self.families = enable()
        self.exit_code = 0
        self._t0 = time.monotonic()

    def failed(self, code: int) -> None:
        """The command is ending with exit code ``code``."""
        self.exit_code = code

    def finish(self) -> list[str]:
        """Set the command gauges, then write the textfile (temp + rename: the
        collector never reads half a file) and push; returns a warning line for
        each destination that failed (the command's own outcome stands)."""
        from prometheus_client import push_to_gateway, write_to_textfile

        f, cmd, now = self.families, self.command, time.time()
        f.command_seconds.labels(cmd).set(time.monotonic() - self._t0)
        f.command_exit.labels(cmd).set(self.exit_code)
        f.command_last.labels(cmd).set(now)
        if self.exit_code == 0:
            f.command_success.labels(cmd).set(now)
        warnings = []
        if self.path is not None:
            try:
                write_to_textfile(self.path, f.registry)
            except OSError as e:
                warnings.append(f"--metrics-file {self.path}: not written ({e.strerror or e})")
        if self.push is not None:
            try:
                push_to_gateway(self.push, job="registry", registry=f.registry,
                                grouping_key={"command": cmd}, timeout=10)
            except Exception as e:  # noqa: BLE001 - any failure of the push is one warning
                warnings.append(f"--metrics-push {self.push}: not pushed ({_one_line(e)})")
        return warnings


def _one_line(exc: Any) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

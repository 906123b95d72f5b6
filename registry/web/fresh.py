"""Mutable facts of the store, read at most once per freshness interval by all requests.

What can change in a store (a model's versions, an alias, a gate verdict
that follows the live ledger of revocations and the policy, a signature
verdict that follows the trusted keys) is asked of the store by
``registry serve`` through one :class:`Facts`: a fact read less than
``fresh_for`` seconds ago is answered from memory, whoever asks; the first
request after that reads it again while every other request for the same
fact waits for that one read (one store read per fact per interval, however
many clients ask).

When that read fails because the store cannot be reached
(registry.web.failure: a 503), the last value read is answered instead, as
long as it was read less than ``fresh_for + stale_for`` seconds ago, and the
request is marked stale (:func:`stale_age`, the ``X-Registry-Stale`` header):
a mirror keeps serving what it has verified through an outage, for as long
as its operator allows. Only a successful read replaces a fact, so a refusal
the server has seen (a revoked source, a yank, a refused signature) is never
forgotten because the store went away: what is served stale is at most as
permissive as the last answer the store gave.

Answers that are refusals (a ``HubError`` such as RevisionNotFound, an
absent object) are facts too and kept the same way; store failures are
never kept.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from registry.web.failure import failure_of

T = TypeVar("T")

#: seconds a fact read from the store is answered without asking it again
#: (``registry serve --fresh-for``; a plain server reads every time, a
#: mirror, whose point is to spare the store, :data:`MIRROR_FRESH_FOR`)
FRESH_FOR = 0.0
MIRROR_FRESH_FOR = 5.0
#: seconds past that a fact may still be answered while the store cannot be reached
STALE_FOR = 300.0
#: facts kept at most (the oldest read are dropped first)
MAX_FACTS = 100_000

_stale: contextvars.ContextVar[float | None] = contextvars.ContextVar("stale", default=None)


def stale_age() -> float | None:
    """Seconds since the oldest stale fact the current request was answered
    with was read (None: every fact was fresh)."""
    return _stale.get()


def reset_stale() -> None:
    """Start a request: no stale fact used yet."""
    _stale.set(None)


def _mark_stale(age: float) -> None:
    old = _stale.get()
    _stale.set(age if old is None else max(old, age))


class _Entry:
    __slots__ = ("ok", "value", "read_at")

    def __init__(self, ok: bool, value: Any, read_at: float) -> None:
        self.ok, self.value, self.read_at = ok, value, read_at


class Facts:
    """A thread-safe, single-flight cache of store reads (the module docstring).

    Args:
        fresh_for: seconds a fact is answered from memory (0: read every time,
            still one read shared by the requests waiting for it).
        stale_for: seconds past ``fresh_for`` a fact may be answered while
            the store cannot be reached (0: never stale).
        clock: monotonic seconds (tests).
    """

    def __init__(self, fresh_for: float = FRESH_FOR, stale_for: float = STALE_FOR, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if fresh_for < 0 or stale_for < 0:
            raise ValueError("fresh_for and stale_for must be >= 0")
        self.fresh_for, self.stale_for, self._clock = fresh_for, stale_for, clock
        self._entries: dict[Hashable, _Entry] = {}
        self._flights: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()
        self.reads = 0  # store reads made (each fact read counts once)

    def get(self, key: Hashable, read: Callable[[], T], *, at_least: float = 0.0) -> T:
        """The fact ``key``: ``read()``'s value (or the exception it raised,
        re-raised), as described in the module docstring; ``at_least``: this
        fact is kept at least that many seconds even with a shorter
        ``fresh_for`` (a costly verdict, such as a signature check).

        Raises:
            whatever ``read`` raises: a store failure when no value read
            within ``fresh_for + stale_for`` seconds is known.
        """
        fresh = max(self.fresh_for, at_least)
        while True:
            now = self._clock()
            with self._lock:
                hit = self._entries.get(key)
                if hit is not None and now - hit.read_at < fresh:
                    return self._answer(hit)
                flight = self._flights.get(key)
                if flight is None:
                    flight = self._flights[key] = threading.Event()
                    break
            asked = self._clock()
            flight.wait()  # another request is reading it: take its answer
            with self._lock:
                hit = self._entries.get(key)
            if hit is not None and (hit.read_at >= asked
                                    or self._clock() - hit.read_at < fresh):
                return self._answer(hit)
            # that read failed (or took longer than the interval): read it ourselves
        try:
            try:
                value = read()
            except Exception as e:  # noqa: BLE001 - kept or re-raised below
                failed = failure_of(e)
                if failed is not None and failed.retry_after is not None:
                    stale = self._stale(hit, fresh)
                    if stale is not None:
                        return self._answer(stale)
                    raise
                entry = _Entry(False, e, self._clock())
            else:
                entry = _Entry(True, value, self._clock())
            with self._lock:
                self.reads += 1
                self._entries[key] = entry
                if len(self._entries) > MAX_FACTS:
                    for old in list(self._entries)[:MAX_FACTS // 10]:
                        del self._entries[old]
            return self._answer(entry)
        finally:
            with self._lock:
                self._flights.pop(key, None)
            flight.set()

    def _stale(self, hit: _Entry | None, fresh: float) -> _Entry | None:
        if hit is None:
            return None
        age = self._clock() - hit.read_at
        if age >= fresh + self.stale_for:
            return None
        _mark_stale(age)
        return hit

    @staticmethod
    def _answer(entry: _Entry) -> Any:
        if entry.ok:
            return entry.value
        raise entry.value.with_traceback(None)

    def forget(self) -> None:
        """Drop every fact (the next request reads each again)."""
        with self._lock:
            self._entries.clear()

"""Claims: which writer owns a directory being written, for how long (issue 13 item 8).

A claim is a small JSON object beside the directory (``models/m/1.claim`` on
object stores; ``<staging>.claim`` beside a local staging directory)::

    {"owner": "<random token>", "host": "...", "pid": 123,
     "started_at": "2026-...Z", "lease_seconds": 600.0, "renewals": 4}

Its writer renews it (a compare-and-swap that rewrites it) every third of
the lease while it works (timed by its own monotonic clock), so the object's
modification time, set by the store, says when the writer was last seen
alive; a reader compares it with the store's own time (a probe object,
:mod:`registry.protocol.storeclock`), never with its local clock. A claim is *live* while
that is within the lease and, on the writer's own host, its process exists.
A claim that is not live is taken over with a compare-and-swap on the
claim's own version token: of two recoverers only one wins. A writer whose
renewal finds the claim changed has lost it; it then stops writing and never
deletes what is under the claim.

``REGISTRY_CLAIM_LEASE`` (seconds) overrides the lease (tests, or stores
whose writers stall longer than the default).
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from registry.rules import numbers
from registry.host.processes import pid_alive
from registry.errors import (
    ObjectExistsError,
    ObjectNotFoundError,
    PointerConflictError,
    UsageError,
)
from registry.protocol.manifest import utc_now
from registry.store import Store
from registry.protocol.storeclock import store_time

#: seconds a claim stays live without a renewal.
DEFAULT_LEASE = 600.0


def lease_seconds() -> float:
    """``REGISTRY_CLAIM_LEASE`` (seconds), else 600.

    Raises:
        UsageError: not a number above 0 and at most 10**7 (NaN would make
            every claim look lapsed, infinity none).
    """
    text = os.environ.get("REGISTRY_CLAIM_LEASE") or ""
    if not text:
        return DEFAULT_LEASE
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1e7:
        raise UsageError(f"REGISTRY_CLAIM_LEASE={text!r}: must be a number of seconds above 0 "
                         "and at most 10000000")
    return value


def _alive(pid: int) -> bool:
    try:
        return pid_alive(pid)
    except OverflowError:  # a pid no process here can have: another host's
        return True


@dataclass(frozen=True, slots=True)
class ClaimState:
    """A claim as read: its writer, how long ago it was last renewed (seconds),
    its lease, and whether it is still live."""

    host: str
    pid: int
    started_at: str
    lease: float
    age: float
    writer_gone: bool
    #: the claim's ``owner`` token ("" when it has none): its writer's own
    owner: str = ""

    @property
    def live(self) -> bool:
        return not self.writer_gone and self.age <= self.lease

    def describe(self) -> str:
        state = ("its process is gone" if self.writer_gone else
                 f"lease {self.lease:.0f}s, expires in {max(0.0, self.lease - self.age):.0f}s"
                 if self.live else f"lease {self.lease:.0f}s, expired")
        return (f"writer {self.host} pid {self.pid}, started {self.started_at}, last seen "
                f"{self.age:.0f}s ago ({state})")


def read_state(store: Store, key: str, *, now: float | None = None,
               ) -> tuple[ClaimState, str] | None:
    """The claim at ``key`` and its version token, or None when there is none.
    A claim that is not valid JSON (an older format, a torn write) is judged
    by its age alone against the default lease.

    Its age is the store's time minus the store's stamp of the claim's last
    renewal: one clock, the store's (:mod:`registry.protocol.storeclock`). ``now``: the
    store's time when the caller has read it (:func:`store_time`), else it
    is read here (a probe object).

    Raises:
        StorageError: the store failed.
    """
    try:
        data, token = store.read_versioned(key)
        mtime = store.info(key).mtime
    except ObjectNotFoundError:
        return None
    if now is None:
        now = store_time(store).now
    try:
        doc: dict[str, Any] = json.loads(data)
    except ValueError:
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    host = str(doc.get("host", "?"))
    raw_pid = doc.get("pid", 0)
    pid = raw_pid if isinstance(raw_pid, int) and 0 <= raw_pid <= 2**31 else 0
    gone = host == socket.gethostname() and pid > 0 and not _alive(pid)
    age = max(0.0, now - (mtime if mtime is not None else now))
    owner = doc.get("owner")
    return ClaimState(host, pid, str(doc.get("started_at", doc.get("created_at", "?"))),
                      _lease_of(doc), age, gone,
                      owner if isinstance(owner, str) else ""), token


def _lease_of(doc: dict[str, Any]) -> float:
    """The claim's lease; one that is not a finite positive number (a torn or
    foreign document) is the default."""
    value = doc.get("lease_seconds", DEFAULT_LEASE)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return DEFAULT_LEASE
    value = float(value)
    return value if math.isfinite(value) and value > 0 else DEFAULT_LEASE


class ClaimLost(PointerConflictError):
    """Another writer took this writer's claim over (its lease had lapsed)."""


class Claim:
    """One writer's claim on ``key``; see the module docstring.

    Args:
        store: where the claim lives.
        key: the claim's key (``models/m/1.claim``).
        lease: seconds (default ``REGISTRY_CLAIM_LEASE`` or 600).
    """

    def __init__(self, store: Store, key: str, *, lease: float | None = None) -> None:
        self.store = store
        self.key = key
        self.lease = lease_seconds() if lease is None else lease
        self.owner = uuid.uuid4().hex
        self.started_at = utc_now()
        self._renewals = 0
        self._token: str | None = None
        self._renewed_at = time.monotonic()
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _body(self) -> bytes:
        return numbers.dumps({"owner": self.owner, "host": socket.gethostname(),
                           "pid": os.getpid(), "started_at": self.started_at,
                           "lease_seconds": self.lease, "renewals": self._renewals}).encode()

    def _learn_token(self, body: bytes) -> None:
        data, token = self.store.read_versioned(self.key)
        if data != body:
            self.lost = True
            raise ClaimLost(self.store.url_of(self.key), expected="our claim",
                            actual="another writer's")
        self._token = token
        self._renewed_at = time.monotonic()

    def check(self) -> None:
        """Before each write: renew now if the last renewal is older than half
        the lease (the process may have been stopped meanwhile).

        Raises:
            ClaimLost: another writer took the claim over.
        """
        if self.lost or time.monotonic() - self._renewed_at > self.lease / 2:
            self.renew()

    def take(self, *, force: bool = False) -> ClaimState | None:
        """Create the claim, or take over one that is not live (or any, with
        ``force``: the sole writer of a run's checkpoints).

        Returns:
            The state of the claim taken over, or None when there was none.

        Raises:
            ObjectExistsError: a live claim holds ``key`` (``.state`` tells
                whose), or another recoverer took it over first.
        """
        for _ in range(8):
            body = self._body()
            try:
                self.store.create(self.key, body)
                self._learn_token(body)
                self._start()
                return None
            except ObjectExistsError:
                pass
            except BaseException:
                self._drop_if_ours(body)
                raise
            seen = read_state(self.store, self.key)
            if seen is None:
                continue  # released meanwhile: create again
            state, token = seen
            if state.owner == self.owner:
                # our own create landed and its answer was lost, under a retry
                # the store could not recognise (issue 47): the owner token says so
                self._adopt(body)
                return None
            if state.live and not force:
                err = ObjectExistsError(f"{self.key}: claimed", key=self.key)
                err.state = state  # type: ignore[attr-defined]
                raise err
            try:
                self.store.swap(self.key, body, token)  # one recoverer wins
            except PointerConflictError:
                if self._holds(body):  # our swap landed, its answer lost: ours
                    self._adopt(body)
                    return state
                continue  # renewed or taken over meanwhile: look again
            except BaseException:
                self._drop_if_ours(body)
                raise
            self._adopt(body)
            return state
        err = ObjectExistsError(f"{self.key}: claim keeps changing", key=self.key)
        err.state = None  # type: ignore[attr-defined]
        raise err

    def _holds(self, body: bytes) -> bool:
        """The claim now holds exactly ``body`` (our owner token, our count of
        renewals): a write of ours landed whatever its answer said."""
        try:
            return self.store.read_versioned(self.key)[0] == body
        except ObjectNotFoundError:
            return False

    def _adopt(self, body: bytes) -> None:
        """Take the claim holding ``body`` as ours (see :meth:`take`)."""
        try:
            self._learn_token(body)
            self._start()
        except BaseException:
            self._drop_if_ours(body)
            raise

    def _drop_if_ours(self, body: bytes) -> None:
        """After ``take`` was interrupted (SIGINT, or SIGTERM raised as an
        interrupt: registry.host.interrupt) or failed around its write: delete the
        claim if it holds ``body``, so no claim outlives a writer that never
        got to use it. Best effort: a failure here leaves the claim to lapse
        and ``registry gc`` (the interrupt propagates either way)."""
        try:
            data, token = self.store.read_versioned(self.key)
            if data == body:
                self._token = token
                self.release()
        except Exception:  # noqa: BLE001 - the original error is what the caller sees
            pass

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._beat, daemon=True,
                                        name=f"claim-{self.key}")
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.lease / 3):
            try:
                self.renew()
            except ClaimLost:
                return
            except Exception:  # noqa: BLE001 - a failed renewal is retried next beat
                continue

    def renew(self) -> None:
        """Rewrite the claim if it is still ours (compare-and-swap).

        Raises:
            ClaimLost: another writer holds it now.
        """
        with self._lock:
            if self.lost:
                raise ClaimLost(self.store.url_of(self.key), expected="our claim",
                                actual="another writer's")
            self._renewals += 1
            body = self._body()
            try:
                self.store.swap(self.key, body, self._token)
            except PointerConflictError:
                if self._holds(body):  # our renewal landed; its answer was lost
                    self._learn_token(body)
                    return
                self.lost = True
                raise ClaimLost(self.store.url_of(self.key), expected="our claim",
                                actual="another writer's") from None
            self._learn_token(body)

    def release(self) -> None:
        """Stop renewing and delete the claim if it is still ours."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            if self.lost or self._token is None:
                return
            try:
                _, token = self.store.read_versioned(self.key)
            except ObjectNotFoundError:
                return
            if token == self._token:
                self.store.delete(self.key)
            self._token = None

"""The per-run writer lease: one process at a time saves into a checkpoint tree.

A training run has one writer. A preempted job's zombie and its restart, or a
launcher started twice, would otherwise save the same steps at once and move
the pointer to each other's half-written directories. The lease is one small
JSON object beside the pointer::

    runs/<run_id>/ckpt/WRITER.lease            (tinyllm)
    <checkpoint_path>/WRITER.lease             (LoongSage)

    {"kind": "checkpoint-writer-lease", "owner": "<32 hex>", "host": "...",
     "pid": 1234, "started_at": "<RFC 3339>", "renewed_at": "...",
     "expires_at": "...", "expires": <unix seconds>, "lease_seconds": 120.0,
     "released": false}

It is built only on the store's primitives: taken with a conditional create
(``O_EXCL`` locally, ``If-None-Match: *`` on S3), renewed, taken over and
released with compare-and-swap (:meth:`Store.swap`), so two processes can
never both believe they hold it. The object is never deleted: a released or
expired lease is replaced by the next writer's.

A lease is *live* while it is not released, the store's stamp of its last
renewal is less than ``lease_seconds`` old on the store's own clock (a probe
object, :mod:`registry.protocol.storeclock`: no host's clock is compared with
another's; ``expires`` is informative), and -- when it was taken on this
host -- its process still exists. A holder SIGKILLed on this host is
therefore taken over at once; one on another host after its expiry.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from registry.rules import numbers
from registry.host.processes import pid_alive
from registry.errors import (
    ObjectExistsError,
    ObjectNotFoundError,
    PointerConflictError,
    RegistryError,
    RunLeasedError,
)
from registry.protocol.manifest import utc_now
from registry.store import Store, join
from registry.protocol.storeclock import store_time

LEASE_NAME = "WRITER.lease"
KIND = "checkpoint-writer-lease"
#: seconds a lease stays live after its last renewal. Saves renew it every
#: third of that while they write, so only a stopped or idle writer lapses.
DEFAULT_SECONDS = 120.0


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def describe(holder: dict[str, Any]) -> str:
    """One line naming a lease holder: owner, host, pid, start and expiry."""
    return (f"owner {str(holder.get('owner', '?'))[:12]} on host {holder.get('host', '?')} "
            f"pid {holder.get('pid', '?')}, started {holder.get('started_at', '?')}, "
            f"expires {holder.get('expires_at', '?')}")


def is_live(holder: dict[str, Any], *, age: float) -> bool:
    """Whether the lease document ``holder`` still excludes other writers.

    Args:
        age: seconds since its last renewal, on the store's clock (the
            store's time minus the lease object's stamp).
    """
    if holder.get("released"):
        return False
    seconds = holder.get("lease_seconds")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        seconds = DEFAULT_SECONDS  # a lease written before lease_seconds
    if not age < seconds:
        return False
    pid = holder.get("pid")
    if holder.get("host") == socket.gethostname() and isinstance(pid, int) and pid > 0:
        return pid_alive(pid)
    return True


def live_holder(store: Store, root: str) -> dict[str, Any] | None:
    """The lease document of the tree at ``root`` while it is live (see
    :func:`is_live`), else None (no lease, released, lapsed, garbled)."""
    try:
        raw = store.read_bytes(join(root, LEASE_NAME))
    except ObjectNotFoundError:
        return None
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("released"):
        return None
    return doc if is_live(doc, age=lease_age(store, join(root, LEASE_NAME))) else None


def lease_age(store: Store, key: str) -> float:
    """Seconds since the object at ``key`` was last written, on the store's
    clock (0 when it is gone meanwhile: the caller reads it again)."""
    try:
        stamp = store.info(key).mtime
    except ObjectNotFoundError:
        return 0.0
    now = store_time(store).now
    return max(0.0, now - (stamp if stamp is not None else now))


class WriterLease:
    """The writer lease of the checkpoint tree at ``root`` in ``store``.

    Args:
        store: the store holding the tree.
        root: key of the tree (``runs/<run_id>/ckpt`` or a LoongSage
            ``checkpoint_path``).
        seconds: how long the lease stays live after each renewal (seconds).

    Notes:
        Thread-safe. Expiry is judged on the store's clock (see the module
        docstring); the holder renews by its own monotonic time.
    """

    def __init__(self, store: Store, root: str, *, seconds: float = DEFAULT_SECONDS) -> None:
        if not seconds > 0:
            raise ValueError(f"lease seconds {seconds!r} must be positive")
        self.store = store
        self.key = join(root, LEASE_NAME)
        self.seconds = float(seconds)
        self.owner = uuid.uuid4().hex
        self.started_at: str | None = None
        self.held = False
        self._lost: RunLeasedError | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.store.url_of(self.key)

    def _doc(self, *, released: bool = False) -> bytes:
        now = time.time()
        expires = now if released else now + self.seconds
        return (numbers.dumps({"kind": KIND, "owner": self.owner, "host": socket.gethostname(),
                            "pid": os.getpid(), "started_at": self.started_at or utc_now(),
                            "renewed_at": _rfc3339(now), "expires_at": _rfc3339(expires),
                            "expires": expires, "lease_seconds": self.seconds,
                            "released": released}, indent=2)
                + "\n").encode()

    def _read(self) -> tuple[dict[str, Any], str]:
        raw, token = self.store.read_versioned(self.key)
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, ValueError):
            doc = None
        # A garbled lease (a torn write by something else) excludes nobody.
        return (doc if isinstance(doc, dict) else {"released": True}), token

    def _held_by(self, holder: dict[str, Any], *, lost: bool) -> RunLeasedError:
        what = ("lost the writer lease of this run to" if lost
                else "another process is writing this run:")
        return RunLeasedError(
            f"{self.url}: {what} {describe(holder)}; a run has one writer at a time "
            "(a holder that died on this host is taken over at once, elsewhere after "
            "its expiry)", path=self.key, holder=holder)

    def hold(self) -> None:
        """Take the lease, or renew it when this object already holds it.

        Raises:
            RunLeasedError: another live writer holds it (nothing was written),
                or this object held it and lost it to another writer since;
                a lost lease stays lost (the writer is fenced off for good).
            StorageError: the store failed.
        """
        with self._lock:
            if self._lost is not None:
                raise self._lost
            if self.held:
                self._renew()
            else:
                self._acquire()

    def _acquire(self) -> None:
        self.started_at = utc_now()
        for _ in range(8):
            try:
                self.store.create(self.key, self._doc())
                self.held = True
                return
            except ObjectExistsError:
                pass
            try:
                holder, token = self._read()
            except ObjectNotFoundError:
                continue  # deleted meanwhile: create again
            if (holder.get("owner") != self.owner and not holder.get("released")
                    and is_live(holder, age=lease_age(self.store, self.key))):
                raise self._held_by(holder, lost=False)
            try:
                self.store.swap(self.key, self._doc(), token)
                self.held = True
                return
            except PointerConflictError:
                continue  # another writer took it over first: look again
        holder, _ = self._read()
        raise self._held_by(holder, lost=False)

    def _renew(self) -> None:
        try:
            holder, token = self._read()
        except ObjectNotFoundError:
            holder, token = {}, None
        if token is not None and holder.get("owner") != self.owner:
            self._fence(holder)
        try:
            self.store.swap(self.key, self._doc(), token)
        except PointerConflictError:
            try:
                holder, _ = self._read()
            except ObjectNotFoundError:
                holder = {}
            if holder.get("owner") == self.owner and not holder.get("released"):
                return  # our renewal landed and its answer was lost (issue 47)
            self._fence(holder)

    def _fence(self, holder: dict[str, Any]) -> None:
        self.held = False
        self._lost = self._held_by(holder, lost=True)
        raise self._lost

    def release(self) -> None:
        """Mark the lease released (compare-and-swap), so the next writer takes
        it at once. A no-op when not held; a store error becomes a warning
        (the lease then lapses at its expiry)."""
        with self._lock:
            if not self.held:
                return
            self.held = False
            try:
                holder, token = self._read()
                if holder.get("owner") == self.owner:
                    self.store.swap(self.key, self._doc(released=True), token)
            except (RegistryError, OSError) as e:
                warnings.warn(f"{self.url}: could not release the writer lease ({e}); "
                              f"it lapses after {self.seconds:g} s", RuntimeWarning,
                              stacklevel=2)

    @contextmanager
    def renewing(self) -> Iterator[None]:
        """Renew the lease every third of its duration while the block runs
        (a save that outlasts the lease keeps it). A failed renewal is
        raised by the next :meth:`hold`."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.seconds / 3):
                try:
                    self.hold()
                except RunLeasedError:
                    return
                except (RegistryError, OSError):
                    continue  # a passing store fault: try again next beat

        thread = threading.Thread(target=beat, name="ckpt-lease", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

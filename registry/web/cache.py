"""Documents of committed releases, kept in memory by their sha256.

A release never changes once committed, and the index lists the sha256 of
every file of it (``release_files``), so a file's bytes read once can be
served again under that digest without asking the store: the key names the
content, so nothing cached can go stale. What can change (aliases, the live
ledger of revocations, policies, ``LATEST``) is never cached here; pages read
it from the index or the store on every request.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from registry.store import Store

T = TypeVar("T")
#: bytes kept at most (the least recently used documents are dropped first)
MAX_BYTES = 64 << 20


class DigestCache(Generic[T]):
    """A thread-safe LRU of values derived from content named by its sha256,
    bounded by the summed ``weight`` of its values."""

    def __init__(self, max_weight: int = MAX_BYTES) -> None:
        self._items: OrderedDict[str, tuple[T, int]] = OrderedDict()
        self._weight = 0
        self._max = max_weight
        self._lock = threading.Lock()

    def get_or_make(self, digest: str, make: Callable[[], tuple[T, int] | None]) -> T | None:
        """The value cached under ``digest``, else ``make()``'s ``(value,
        weight)`` (cached) or None (not cached: the content did not match)."""
        with self._lock:
            hit = self._items.get(digest)
            if hit is not None:
                self._items.move_to_end(digest)
                return hit[0]
        made = make()
        if made is None:
            return None
        value, weight = made
        if weight > self._max:
            return value
        with self._lock:
            if digest not in self._items:
                self._items[digest] = made
                self._weight += weight
                while self._weight > self._max:
                    _, (_, w) = self._items.popitem(last=False)
                    self._weight -= w
        return value


class ReleaseFiles:
    """Small files of committed releases (model card, ledger.json, heads),
    read from the store once per content digest.

    A file whose bytes do not hash to the digest the index holds is returned
    as read but not cached (a store changed behind the index's back is shown
    as it is, every time).
    """

    def __init__(self, store: Store, *, max_bytes: int = MAX_BYTES) -> None:
        self.store = store
        self._texts: DigestCache[str] = DigestCache(max_bytes)
        self._derived: DigestCache[object] = DigestCache(max_bytes)

    def text(self, key: str, sha256: str, *, limit: int | None = None) -> tuple[str, bool]:
        """The UTF-8 text (undecodable bytes replaced) of store ``key``, whose
        content the index says hashes to ``sha256``, and whether it does (only
        then is it cached, and may :meth:`derived` be asked about it).

        Args:
            limit: read at most this many bytes (the size the manifest lists).

        Raises:
            ObjectNotFoundError, StorageError: the store read failed.
            DocumentError: the object is longer than ``limit``.
        """
        read: list[str] = []

        def make() -> tuple[str, int] | None:
            data = self.store.read_bytes(key, limit=limit)
            read.append(data.decode("utf-8", "replace"))
            if hashlib.sha256(data).hexdigest() != sha256:
                return None
            return read[0], len(data)
        hit = self._texts.get_or_make(sha256, make)
        return (hit, True) if hit is not None else (read[0], False)

    def derived(self, name: str, sha256: str, make: Callable[[], T], weight: int) -> T:
        """``make()`` (a pure function of the content ``sha256`` names, such
        as its rendered Markdown), computed once per ``(name, sha256)``."""
        value = self._derived.get_or_make(f"{name}:{sha256}", lambda: (make(), weight))
        return value  # type: ignore[return-value]

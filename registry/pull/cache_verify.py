"""``registry cache verify``: re-hash every blob of the pull cache, remove the bad ones.

A blob is bad when the sha256 of its bytes is not its name (bit rot, an edit
by a process with enough rights, a truncation), when its name is not a
sha256 at all, or when it is not a regular file this user alone could have
written (a folder, a link, a FIFO, another user's file: registry.pull.privacy;
reported with ``actual_sha256`` null, never read). A bad blob is removed (with its stamp), so the next pull of a
release that uses it downloads it again; the report names it, its size, the
digest its bytes have and the cached releases that use it. A good blob whose
stat stamp changed (touched, not changed) gets a fresh stamp, so the next
reflink of it is not re-hashed.

Blobs are hashed in parallel (``hashlib`` releases the GIL), without the cache
lock; a bad blob is removed under the lock, and only if it is still the file
that was hashed (same stamp) and no pull in progress counts on it: such a
pull checks every blob it places and replaces a bad one itself.
"""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from registry.errors import UsageError
from registry.protocol.manifest import hash_file
from registry.pull import privacy
from registry.pull.cache import Cache
from registry.pull.cache_scan import scan
from registry.pull.records import cache_lock, live_leases
from registry.pull.stamps import Stamp, stamp

_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class BadBlob:
    """A blob whose bytes are not its name.

    Attributes:
        sha256: its name; ``actual_sha256``: the digest of its bytes (None:
            unreadable); ``size``: its size in bytes.
        used_by: ``model_id@version`` of the cached releases that list it.
        removed: False when a pull in progress uses it, or it changed while
            being hashed (left for that pull, or the next verify).
    """

    sha256: str
    size: int
    actual_sha256: str | None
    used_by: tuple[str, ...]
    removed: bool

    def to_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size, "actual_sha256": self.actual_sha256,
                "used_by": list(self.used_by), "removed": self.removed}


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """``registry cache verify``: blobs checked, their bytes, the bad ones, seconds taken."""

    cache: str
    blobs: int
    bytes: int
    bad: tuple[BadBlob, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.bad

    def to_dict(self) -> dict[str, Any]:
        return {"cache": self.cache, "blobs": self.blobs, "bytes": self.bytes,
                "bad": [b.to_dict() for b in self.bad], "ok": self.ok,
                "seconds": self.seconds}


def _check(cache: Cache, name: str) -> tuple[str, Stamp | None, int, str | None]:
    """(name, stamp before hashing, size, digest); digest None when unreadable,
    stamp None when the blob was gone or changed while being hashed."""
    path = cache.blobs / name  # a name listed in blobs/: one component
    if not privacy.usable(path, cache.group):
        # a folder, a link, a FIFO, another user's file: bad, never read
        try:
            return name, stamp(path), 0, None
        except OSError:
            return name, None, 0, None
    try:
        before = stamp(path)
        size, digest = hash_file(path)
        after = stamp(path)
    except FileNotFoundError:
        return name, None, 0, None
    except OSError:
        return name, None, 0, None
    return name, before if before == after else None, size, digest


def verify_cache(cache: Cache, *, workers: int | None = None) -> VerifyReport:
    """Re-hash every blob of ``cache``; remove and report the bad ones.

    Args:
        workers: blobs hashed at once (default: the CPU count).

    Returns:
        A VerifyReport (``ok`` when no blob was bad).

    Raises:
        UsageError: ``workers`` < 1.
        OSError: ``blobs/`` cannot be listed.

    Notes:
        Reads every byte once. Safe beside concurrent pulls (module docstring).
    """
    if workers is not None and workers < 1:
        raise UsageError(f"--workers {workers}: must be at least 1")
    t0 = time.perf_counter()
    names = sorted(os.listdir(cache.blobs))
    with ThreadPoolExecutor(workers or os.cpu_count() or 1,
                            thread_name_prefix="cache-verify") as pool:
        results = list(pool.map(lambda n: _check(cache, n), names))
    total = sum(size for _n, _s, size, _d in results)
    suspects = [(n, st, size, d) for n, st, size, d in results
                if st is not None and (not _SHA256.fullmatch(n) or d != n)]
    good = [(n, st) for n, st, _size, d in results if st is not None and d == n]
    for n, st in good:
        if not cache.stamps.blob_unchanged(cache.blob(n)):
            try:
                if stamp(cache.blob(n)) == st:
                    cache.stamps.record_blob(cache.blob(n))
            except OSError:
                pass  # removed meanwhile
    bad = []
    if suspects:
        with cache_lock(cache):
            leases = live_leases(cache)
            report = scan(cache, leases=leases)
            leased = {sha for lease in leases for sha in lease.blobs}
            for n, st, size, digest in suspects:
                users = tuple(f"{v.model_id}@{v.version}" for v in report.versions
                              if n in v.record.blobs)
                try:
                    same = stamp(cache.blob(n)) == st
                except OSError:
                    same = False
                remove = same and n not in leased
                if remove:
                    privacy.evict(cache.blobs / n)
                    cache.stamps.forget_blob(n)
                bad.append(BadBlob(n, size, digest, users, remove))
    return VerifyReport(str(cache.root), len(names), total, tuple(bad),
                        time.perf_counter() - t0)


__all__ = ["BadBlob", "VerifyReport", "verify_cache"]

"""The pull cache as one object: list, prune, verify (``registry cache ...``).

Example::

    from registry.pull.cache_admin import PullCache

    cache = PullCache("/var/cache/models")      # or Registry(...).cache(...)
    for v in cache.ls().versions:
        print(v.model_id, v.version, v.size_on_disk, v.last_pulled)
    cache.prune(keep_last=2, max_size="50G")    # see registry.pull.cache_prune
    cache.verify()                              # see registry.pull.cache_verify
"""

from __future__ import annotations

import math
import os

from registry.errors import UsageError
from registry.pull.cache import cache_dir
from registry.pull.cache_prune import PruneReport, parse_size, prune
from registry.pull.cache_scan import CacheReport, empty_report, open_existing, scan
from registry.pull.cache_verify import VerifyReport, verify_cache
from registry.store import Store


class PullCache:
    """A serving host's pull cache (``$REGISTRY_CACHE`` by default).

    Works the same whatever store the releases were pulled from (local, S3):
    the cache keeps only blobs and records. A cache directory that does not
    exist yet lists as empty and is not created by ``ls``, ``prune`` or
    ``verify``.

    Raises:
        StorageError: (from every method) the path exists but is not a
            usable directory.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = cache_dir(path)

    def ls(self) -> CacheReport:
        """Per model and version: sizes, shared blobs, last pulled, materialized
        directories; totals (registry.pull.cache_scan)."""
        cache = open_existing(self.path)
        return empty_report(self.path) if cache is None else scan(cache)

    def prune(self, *, keep_last: int | None = None, older_than: float | str | None = None,
              max_size: int | str | None = None, dry_run: bool = False,
              now: float | None = None, store: Store | None = None) -> PruneReport:
        """Prune (registry.pull.cache_prune.prune). ``older_than`` may be
        seconds (a number) or a duration with its unit (``"30d"``; a bare
        ``"5"`` is refused), ``max_size`` bytes or a size (``"50G"``).
        ``store``: the store the releases came from; cached releases it
        deleted (a tombstone with their manifest digest) are pruned too.

        Raises:
            UsageError: a malformed, negative, NaN or infinite option, a duration
                string without a unit, or an option of the wrong type
                (``keep_last`` a whole number, ``max_size`` bytes).
        """
        from registry.lifecycle.gc import parse_duration

        seconds = parse_duration(older_than, what="older_than") \
            if isinstance(older_than, str) else older_than
        limit = parse_size(max_size) if isinstance(max_size, str) else max_size
        _check_option("keep_last", keep_last, int)
        _check_option("older_than", seconds, (int, float))
        _check_option("max_size", limit, int)
        cache = open_existing(self.path)
        if cache is None:
            return PruneReport(str(self.path), dry_run, (), (), 0, 0, 0, 0,
                               None if limit is None else True)
        deleted = frozenset() if store is None else deleted_in(store, scan(cache))
        return prune(cache, keep_last=keep_last, older_than=seconds, max_size=limit,
                     dry_run=dry_run, now=now, deleted=deleted)

    def verify(self, *, workers: int | None = None) -> VerifyReport:
        """Re-hash every blob, remove the bad ones (registry.pull.cache_verify)."""
        cache = open_existing(self.path)
        if cache is None:
            return VerifyReport(str(self.path), 0, 0, (), 0.0)
        return verify_cache(cache, workers=workers)


def deleted_in(store: Store, report: CacheReport) -> frozenset[str]:
    """Manifest digests of the cached releases ``store`` deleted: a tombstone
    of the same model and version naming the same digest (a tombstone of
    other bytes, or a garbled one, deletes nothing here).

    Raises:
        StorageError: the store cannot be read.
    """
    from registry.errors import DocumentError
    from registry.lifecycle.tombstone import read_tombstone

    out = set()
    for v in report.versions:
        try:
            doc = read_tombstone(store, v.model_id, v.version)
        except DocumentError:
            continue
        if doc is not None and doc.get("manifest_sha256") == v.manifest_sha256:
            out.add(v.manifest_sha256)
    return frozenset(out)


def _check_option(name: str, value: object, kinds: type | tuple[type, ...]) -> None:
    """A prune option is None or a finite, non-negative number of the right type
    (never a bool, NaN or infinity: NaN compares false and would select
    everything)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise UsageError(f"{name}={value!r}: expected a non-negative number")
    if not math.isfinite(value) or value < 0:  # type: ignore[arg-type]
        raise UsageError(f"{name}={value!r}: must be a finite, non-negative number")


__all__ = ["PullCache"]

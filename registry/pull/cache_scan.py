"""``registry cache ls``: what the pull cache holds, per model and version.

Reads the cache's records (registry.pull.records), its blobs and the stamp
records of materialized directories; never a byte of a blob, so it stays fast
with thousands of versions. A cache filled before records existed is read
too: a materialized directory whose stamp record names a manifest no record
has is adopted from its own MANIFEST.json.

Sizes are apparent sizes in bytes (``st_size``); on a filesystem with
reflinks a materialized directory shares its blobs' extents and costs less
than it says.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from registry.rules import limits
from registry.errors import StorageError
from registry.protocol.manifest import MANIFEST, parse_manifest
from registry.pull.cache import Cache, cache_dir
from registry.pull.cache_use import cache_use
from registry.pull.records import Lease, PullRecord, live_leases, read_records


@dataclass(frozen=True, slots=True)
class Materialized:
    """A directory a cached release was materialized into.

    Attributes:
        path: its absolute path.
        inside_cache: it is the cache's own ``models/<model_id>/<version>``
            (pruning removes it) rather than a ``--to`` target (pruning keeps
            it and forgets it).
        state: ``"placed"`` (it holds this release, by its stamp record),
            ``"replaced"`` (another release was placed there since) or
            ``"missing"`` (the directory is gone).
    """

    path: str
    inside_cache: bool
    state: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "inside_cache": self.inside_cache, "state": self.state}


@dataclass(frozen=True, slots=True)
class CachedVersion:
    """One release in the cache. Sizes in bytes.

    Attributes:
        bytes: the release's size (sum of its files).
        blobs, blob_bytes: its distinct blobs present in ``blobs/`` and their size.
        missing_blobs: distinct blobs of the release no longer in the cache
            (removed by ``cache verify``, or never downloaded: a pull into a
            target that already held the release).
        shared_blobs, shared_bytes: of its blobs, those another cached release
            uses too.
        unique_bytes: what pruning it alone would free in ``blobs/``.
        size_on_disk: ``blob_bytes`` plus its placed directories inside the cache.
        in_use: a pull of it is in progress (prune skips it).
    """

    model_id: str
    version: str
    manifest_sha256: str
    files: int
    bytes: int
    blobs: int
    blob_bytes: int
    missing_blobs: int
    shared_blobs: int
    shared_bytes: int
    unique_bytes: int
    size_on_disk: int
    first_pulled: str
    last_pulled: str
    in_use: bool
    materialized: tuple[Materialized, ...]
    record: PullRecord = field(repr=False, compare=False)

    @property
    def cache_dir_bytes(self) -> int:
        """Bytes of its placed directories inside the cache."""
        return self.size_on_disk - self.blob_bytes

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__slots__ if k not in ("record", "materialized")}
        out["materialized"] = [m.to_dict() for m in self.materialized]
        return out


@dataclass(frozen=True, slots=True)
class CacheReport:
    """The whole cache (``registry cache ls``). Sizes in bytes.

    Attributes:
        versions: newest pull first.
        blobs, blob_bytes: every blob in ``blobs/``.
        materialized_bytes: placed directories inside the cache.
        unreferenced_blobs, unreferenced_bytes: blobs no cached release and no
            pull in progress uses (the next prune removes them).
        partial_bytes: partial downloads in ``tmp/`` (of pulls in progress,
            or of killed ones, which the next prune removes).
        size_on_disk: ``blob_bytes + materialized_bytes + partial_bytes``.
        partial_fills: unfinished downloads in ``tmp/`` (a pull's or a
            mirror's fill running now, or a failed one kept to be resumed).
        free_bytes, disk_bytes: space left to this user on the cache's
            filesystem and its size (None: cannot be read).
    """

    cache: str
    versions: tuple[CachedVersion, ...]
    blobs: int
    blob_bytes: int
    materialized_bytes: int
    unreferenced_blobs: int
    unreferenced_bytes: int
    pulls_in_progress: int
    blob_sizes: dict[str, int] = field(repr=False, compare=False)
    leases: tuple[Lease, ...] = field(repr=False, compare=False)
    partial_bytes: int = 0
    partial_fills: int = 0
    free_bytes: int | None = None
    disk_bytes: int | None = None

    @property
    def size_on_disk(self) -> int:
        return self.blob_bytes + self.materialized_bytes + self.partial_bytes

    def to_dict(self) -> dict[str, Any]:
        models = {v.model_id for v in self.versions}
        return {"cache": self.cache, "versions": [v.to_dict() for v in self.versions],
                "totals": {"models": len(models), "versions": len(self.versions),
                           "blobs": self.blobs, "blob_bytes": self.blob_bytes,
                           "materialized_bytes": self.materialized_bytes,
                           "unreferenced_blobs": self.unreferenced_blobs,
                           "unreferenced_bytes": self.unreferenced_bytes,
                           "pulls_in_progress": self.pulls_in_progress,
                           "partial_bytes": self.partial_bytes,
                           "partial_fills": self.partial_fills,
                           "size_on_disk": self.size_on_disk},
                "disk": {"free_bytes": self.free_bytes, "disk_bytes": self.disk_bytes}}


def _blob_sizes(cache: Cache) -> dict[str, int]:
    out = {}
    with os.scandir(cache.blobs) as it:
        for entry in it:
            try:
                out[entry.name] = entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                continue  # removed meanwhile
    return out


def _adopt(records: dict[str, PullRecord], placed: dict[str, str]) -> None:
    """Records for directories placed before records existed (from their MANIFEST.json)."""
    for target, digest in placed.items():
        if digest in records:
            continue
        path = Path(target) / MANIFEST
        try:
            data = limits.read_local(path, limits.MAX_MANIFEST_BYTES)
            m = parse_manifest(data, source=str(path))
            mtime = path.stat().st_mtime
        except (OSError, ValueError):
            continue
        if m.digest != digest or m.kind != "release":
            continue
        when = datetime.fromtimestamp(mtime, UTC).isoformat(
            timespec="microseconds").replace("+00:00", "Z")
        records[digest] = PullRecord.of_manifest(m, when=when, targets=(target,))


def _materialized(rec: PullRecord, placed: dict[str, str], models: str) -> list[Materialized]:
    out = []
    for t in rec.targets:
        if not os.path.isdir(t):
            state = "missing"
        else:
            state = "placed" if placed.get(t) == rec.manifest_sha256 else "replaced"
        out.append(Materialized(t, in_cache_dir(t, models), state))
    return out


def in_cache_dir(target: str, models: str) -> bool:
    """``target`` is a folder below ``models`` (the cache's ``models/``) reached
    without a link, ``..`` or an empty segment: the only kind of directory
    ``cache prune`` deletes (a record is untrusted input: a forged
    ``models/../../home`` or a link ``models/evil -> /home`` is not one)."""
    if not target.startswith(models.rstrip(os.sep) + os.sep):
        return False
    here = models.rstrip(os.sep)
    for seg in target[len(here) + 1:].split(os.sep):
        if seg in ("", ".", ".."):
            return False
        here = os.path.join(here, seg)
        try:
            if not stat.S_ISDIR(os.lstat(here).st_mode):
                return False
        except OSError:
            return False
    return True


def open_existing(path: str | os.PathLike[str] | None) -> Cache | None:
    """The cache at ``path`` (default ``$REGISTRY_CACHE``...), or None when there
    is none yet (nothing is created).

    Raises:
        StorageError: the path exists but cannot be used as a cache (a file).
    """
    root = cache_dir(path)
    if not root.exists():
        return None
    if not root.is_dir():
        raise StorageError(f"{root}: not a directory (cannot use it as the cache directory)",
                           key=str(root))
    return Cache(root)


def scan(cache: Cache, *, leases: list[Lease] | None = None) -> CacheReport:
    """Inventory of ``cache`` (see :class:`CacheReport`).

    Args:
        leases: the live leases, when the caller already read them (under
            the cache lock); else they are read here.

    Notes:
        Reads records, stat()s blobs and reads small JSON records only; takes
        no lock, so a concurrent pull may make it one pull behind.
    """
    records = read_records(cache)
    placed = cache.stamps.placed_digests()
    _adopt(records, placed)
    sizes = _blob_sizes(cache)
    leases = live_leases(cache) if leases is None else leases
    blobs_of = {digest: rec.blobs for digest, rec in records.items()}
    users: dict[str, int] = {}
    for blobs in blobs_of.values():
        for sha in blobs:
            users[sha] = users.get(sha, 0) + 1
    leased = {sha for lease in leases for sha in lease.blobs}
    in_use = {lease.manifest_sha256 for lease in leases}
    models = str(cache.models.resolve()) + os.sep
    versions = []
    materialized_bytes = 0
    for digest, rec in records.items():
        blobs = blobs_of[digest]
        present = {sha: sizes[sha] for sha in blobs if sha in sizes}
        shared = {sha: n for sha, n in present.items() if users.get(sha, 0) > 1}
        dirs = _materialized(rec, placed, models)
        in_cache = sum(rec.total_size for d in dirs if d.inside_cache and d.state == "placed")
        materialized_bytes += in_cache
        blob_bytes = sum(present.values())
        versions.append(CachedVersion(
            rec.model_id, rec.version, rec.manifest_sha256, len(rec.files), rec.total_size,
            len(present), blob_bytes, len(blobs) - len(present), len(shared),
            sum(shared.values()), blob_bytes - sum(shared.values()), blob_bytes + in_cache,
            rec.first_pulled, rec.last_pulled, rec.manifest_sha256 in in_use, tuple(dirs), rec))
    versions.sort(key=lambda v: (v.last_pulled, v.model_id, v.version), reverse=True)
    unref = {sha: n for sha, n in sizes.items() if sha not in users and sha not in leased}
    use = cache_use(cache.root)
    return CacheReport(str(cache.root), tuple(versions), len(sizes), sum(sizes.values()),
                       materialized_bytes, len(unref), sum(unref.values()), len(leases),
                       sizes, tuple(leases), use.partial_bytes, use.partial_fills,
                       use.free_bytes, use.disk_bytes)


def empty_report(path: str | os.PathLike[str] | None) -> CacheReport:
    root = cache_dir(path)
    use = cache_use(root)
    return CacheReport(str(root), (), 0, 0, 0, 0, 0, 0, {}, (),
                       free_bytes=use.free_bytes, disk_bytes=use.disk_bytes)


__all__ = ["CacheReport", "CachedVersion", "Materialized", "empty_report", "open_existing",
           "scan"]

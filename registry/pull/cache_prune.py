"""``registry cache prune``: give a serving host's disk back, oldest pulls first.

What is pruned (docs/decisions.md, "Pull cache: ls, prune, verify"):

* ``keep_last=N``: every version of a model but the N most recently pulled;
  ``older_than=S``: versions last pulled more than S seconds ago. Given both,
  a version goes when it is older than S *and* not among its model's last N.
* ``max_size=B``: then, while the cache is over B bytes, the least recently
  pulled version left goes (never one of the last N kept by ``keep_last``).
* ``deleted``: versions the store deleted (``registry release delete``: a
  tombstone with the same manifest digest), whatever the other options say
  (issue 32 item 2); :meth:`registry.pull.cache_admin.PullCache.prune` finds
  them when given the store.
* Always: blobs no cached release and no pull in progress uses (left by a
  failed pull, or by releases pruned before), dead pulls' temp files and leases.

Pruning a version removes its record, its blobs that no other cached version
uses, and its materialized directories: one inside the cache
(``models/<model_id>/<version>``) is deleted; a ``--to`` directory is the
user's and is kept, only forgotten (its stamp record goes, so a later pull
into it re-hashes it before trusting it). A blob a kept version uses is never
deleted. A version a pull is placing right now is never pruned, and no blob a
pull in progress counts on is deleted (registry.pull.records: leases, read
under the cache lock).
"""

from __future__ import annotations

import math

import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.errors import UsageError
from registry.host.processes import pid_alive
from registry.pull.cache import Cache, owner_pid, temp_tag
from registry.pull.cache_scan import CachedVersion, CacheReport, scan
from registry.pull.records import (
    cache_lock,
    forget_record,
    live_leases,
    parse_time,
    record_path,
    write_record,
)

_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}


def parse_size(text: str) -> int:
    """``"50G"``, ``"512M"``, ``"1.5T"``, ``"10GiB"`` or plain bytes -> bytes
    (K, M, G, T are powers of 1024, as ``du`` and ``df -h`` mean them).

    Raises:
        UsageError: not a size.
    """
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1:] if t[-1:] in _UNITS else ""
    try:
        value = float(t[:-1] if unit else t) * _UNITS[unit]
    except ValueError:
        raise UsageError(f"size {text!r}: expected e.g. 50G, 512M, 1.5T or bytes") from None
    if not math.isfinite(value):
        raise UsageError(f"size {text!r}: expected a finite size, e.g. 50G, 512M, 1.5T or bytes")
    if value < 0:
        raise UsageError(f"size {text!r}: negative")
    return int(value)


@dataclass(frozen=True, slots=True)
class PrunedVersion:
    """A version pruned (or, with ``dry_run``, that would be).

    Attributes:
        reasons: which options selected it (``keep-last``, ``older-than``, ``max-size``).
        removed_dirs: its directories inside the cache, deleted.
        forgotten_dirs: its ``--to`` directories, kept on disk and forgotten.
    """

    model_id: str
    version: str
    manifest_sha256: str
    last_pulled: str
    reasons: tuple[str, ...]
    removed_dirs: tuple[str, ...]
    forgotten_dirs: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v
                for k in self.__slots__ for v in [getattr(self, k)]}


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What ``prune`` did. Sizes in bytes (``size_*`` as ``cache ls`` counts them).

    Attributes:
        skipped_in_use: ``model_id@version`` selected but being pulled right now.
        blobs_removed, bytes_freed: blobs deleted (or that would be) and their
            bytes plus those of the removed directories.
        max_size_met: with ``max_size``: whether the cache now fits (False
            when only kept or in-use versions are left); else None.
    """

    cache: str
    dry_run: bool
    pruned: tuple[PrunedVersion, ...]
    skipped_in_use: tuple[str, ...]
    blobs_removed: int
    bytes_freed: int
    size_before: int
    size_after: int
    max_size_met: bool | None

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__slots__}
        out["pruned"] = [p.to_dict() for p in self.pruned]
        out["skipped_in_use"] = list(self.skipped_in_use)
        return out


def _protected(versions: tuple[CachedVersion, ...], keep_last: int | None) -> set[str]:
    """Manifest digests of each model's ``keep_last`` most recently pulled versions."""
    if keep_last is None:
        return set()
    by_model: dict[str, list[CachedVersion]] = {}
    for v in versions:
        by_model.setdefault(v.model_id, []).append(v)
    keep = set()
    for vs in by_model.values():
        vs.sort(key=lambda v: parse_time(v.last_pulled), reverse=True)
        keep |= {v.manifest_sha256 for v in vs[:keep_last]}
    return keep


def plan(report: CacheReport, *, keep_last: int | None, older_than: float | None,
         max_size: int | None, now: float,
         deleted: frozenset[str] = frozenset()) -> tuple[dict[str, list[str]], list[str], int]:
    """Choose what to prune: ({manifest sha256: reasons}, in-use skipped, size after).
    ``deleted``: manifest digests of releases the store deleted."""
    keep = _protected(report.versions, keep_last) - deleted
    chosen: dict[str, list[str]] = {v.manifest_sha256: ["deleted"] for v in report.versions
                                    if v.manifest_sha256 in deleted}
    skipped: list[str] = []
    if keep_last is not None or older_than is not None:
        for v in report.versions:
            if v.manifest_sha256 in keep or v.manifest_sha256 in chosen:
                continue
            if older_than is not None and now - parse_time(v.last_pulled) <= older_than:
                continue
            reasons = ([] if keep_last is None else ["keep-last"]) + (
                [] if older_than is None else ["older-than"])
            chosen[v.manifest_sha256] = reasons
    # sizes as they would be: blobs in use by what is left (and by pulls in progress)
    users: dict[str, int] = {}
    for v in report.versions:
        for sha in v.record.blobs:
            users[sha] = users.get(sha, 0) + 1
    for lease in report.leases:
        for sha in lease.blobs:
            users[sha] = users.get(sha, 0) + 1
    size = sum(report.blob_sizes[s] for s in users if s in report.blob_sizes) + sum(
        v.cache_dir_bytes for v in report.versions)

    def drop(v: CachedVersion) -> int:
        freed = v.cache_dir_bytes
        for sha in v.record.blobs:
            users[sha] -= 1
            if users[sha] == 0:
                freed += report.blob_sizes.get(sha, 0)
        return freed

    for v in report.versions:
        if v.manifest_sha256 in chosen:
            if v.in_use:
                del chosen[v.manifest_sha256]
                skipped.append(f"{v.model_id}@{v.version}")
            else:
                size -= drop(v)
    if max_size is not None:
        for v in sorted(report.versions, key=lambda v: parse_time(v.last_pulled)):
            if size <= max_size:
                break
            if v.manifest_sha256 in chosen or v.manifest_sha256 in keep:
                continue
            if v.in_use:
                if f"{v.model_id}@{v.version}" not in skipped:
                    skipped.append(f"{v.model_id}@{v.version}")
                continue
            chosen[v.manifest_sha256] = ["max-size"]
            size -= drop(v)
    return chosen, skipped, size


def _clean_trash(trash: Path, mine: list[Path]) -> None:
    for p in mine:
        shutil.rmtree(p, ignore_errors=True)
    if trash.is_dir():
        for p in trash.iterdir():  # left by a prune that was killed
            pid = owner_pid(p.name)
            if pid is not None and not pid_alive(pid):
                shutil.rmtree(p, ignore_errors=True)


def prune(cache: Cache, *, keep_last: int | None = None, older_than: float | None = None,
          max_size: int | None = None, dry_run: bool = False,
          now: float | None = None, deleted: frozenset[str] = frozenset()) -> PruneReport:
    """Prune ``cache`` (what goes: the module's docstring).

    Args:
        keep_last: versions kept per model, most recently pulled first (>= 0).
        older_than: seconds since a version's last pull for it to go.
        max_size: bytes the cache may hold afterwards.
        dry_run: decide and report, delete nothing.
        now: the current time, seconds since the epoch (default: the clock).
        deleted: manifest digests of releases the store deleted: pruned
            (reason ``deleted``) whatever the other options say.

    Returns:
        A PruneReport.

    Raises:
        UsageError: a negative ``keep_last``, ``older_than`` or ``max_size``.
        OSError: a record, blob or directory cannot be removed (permissions).

    Notes:
        Decides and deletes under the cache lock, which a pull takes only to
        start (its lease) and to finish (its record): a pull that started
        before is protected by its lease; one that starts after sees the
        blobs gone and downloads them. In-cache directories are renamed into
        ``<cache>/trash`` under the lock and deleted after it is released.
        A prune killed half-way leaves only what a later prune removes: a
        record is deleted before the blobs and directories it kept.
    """
    for name, value in (("--keep-last", keep_last), ("--older-than", older_than),
                        ("--max-size", max_size)):
        if value is not None and value < 0:
            raise UsageError(f"{name} {value}: must not be negative")
    now = time.time() if now is None else now
    trash = cache.root / "trash"
    doomed: list[Path] = []
    stale = 0  # bytes of killed pulls' partial downloads removed
    with cache_lock(cache):
        report = scan(cache, leases=live_leases(cache, remove_dead=not dry_run))
        chosen, skipped, size_after = plan(report, keep_last=keep_last, older_than=older_than,
                                           max_size=max_size, now=now, deleted=deleted)
        kept_blobs = {sha for v in report.versions if v.manifest_sha256 not in chosen
                      for sha in v.record.blobs} | {sha for lease in report.leases
                                                    for sha in lease.blobs}
        gone_blobs = sorted(set(report.blob_sizes) - kept_blobs)
        pruned = []
        for v in report.versions:
            if v.manifest_sha256 not in chosen:
                if not dry_run and not record_path(cache, v.manifest_sha256).exists():
                    write_record(cache, v.record)  # adopted: remembered from now on
                continue
            removed = tuple(m.path for m in v.materialized
                            if m.inside_cache and m.state == "placed")
            forgotten = tuple(m.path for m in v.materialized
                              if not m.inside_cache and m.state == "placed")
            pruned.append(PrunedVersion(v.model_id, v.version, v.manifest_sha256, v.last_pulled,
                                        tuple(chosen[v.manifest_sha256]), removed, forgotten))
            if dry_run:
                continue
            forget_record(cache, v.manifest_sha256)
            for d in forgotten:
                cache.stamps.forget_dir(Path(d))
            for d in removed:
                trash.mkdir(exist_ok=True)
                aside = trash / f"{temp_tag()}.{uuid.uuid4().hex[:6]}"
                try:
                    os.rename(d, aside)
                    doomed.append(aside)
                except FileNotFoundError:
                    pass  # removed by hand meanwhile
                cache.stamps.forget_dir(Path(d))
        if not dry_run:
            for sha in gone_blobs:
                cache.drop(sha)
            stale = sum(size for _, size in cache.clean_stale())
    if not dry_run:
        _clean_trash(trash, doomed)
    freed = sum(report.blob_sizes[s] for s in gone_blobs) + sum(
        v.cache_dir_bytes for v in report.versions if v.manifest_sha256 in chosen) + stale
    return PruneReport(str(cache.root), dry_run, tuple(pruned), tuple(skipped), len(gone_blobs),
                       freed, report.size_on_disk, report.size_on_disk - freed,
                       None if max_size is None else size_after <= max_size)


__all__ = ["PruneReport", "PrunedVersion", "parse_size", "plan", "prune"]

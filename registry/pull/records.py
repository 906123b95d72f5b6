"""What the cache remembers of each pulled release, and the lock pull shares with prune.

Layout (beside ``blobs/``, ``stamps/``, ``tmp/`` and ``models/`` of registry.pull.cache)::

    <cache>/
    ├── cache.lock                      filelock: held for milliseconds by a pull (to
    │                                   take its lease, to record its result) and by
    │                                   prune / verify while they delete
    ├── records/<manifest_sha256>.json  one per release pulled into this cache:
    │                                   {model_id, version, manifest_sha256, files:
    │                                   [{path, size, sha256}], first_pulled,
    │                                   last_pulled, targets: [absolute paths]}
    ├── leases/pid<pid>.<rand>.json     one per pull in progress: {pid, model_id,
    │                                   version, manifest_sha256, blobs: [hex...]}
    └── trash/                          in-cache model directories prune is removing

A pull takes its lease (under the lock) before it looks at which blobs the
cache has, and gives it up only after its record is written (under the lock):
prune and verify, which read the leases under the same lock before deleting
anything, never delete a blob a pull in progress counts on, nor a release it
is placing. A lease whose pid is gone (a killed pull) protects nothing and is
removed by the next prune. ``targets`` are the directories the release was
materialized into (``--to``, or ``models/<model_id>/<version>`` inside the
cache); a target later replaced by another release is recognised by its stamp
record (registry.pull.stamps), which names the manifest placed there last.
"""

from __future__ import annotations

import functools
import os
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ParamSpec, TypeVar


from registry.rules import numbers, schemas
from registry.protocol.manifest import Manifest
from registry.pull import privacy
from registry.host.processes import pid_alive
from registry.pull.cache import Cache, owner_pid, temp_tag

P = ParamSpec("P")
R = TypeVar("R")


def now_rfc3339() -> str:
    """The current UTC time, RFC 3339 with microseconds (``...T12:00:00.123456Z``)."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_time(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 UTC time (0.0 when unreadable)."""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return 0.0


def cache_lock(cache: Cache) -> Any:
    """The cache's lock (``<cache>/cache.lock``, a ``filelock.FileLock``);
    hold it only briefly."""
    from filelock import FileLock  # ~60 ms to import: only where a lock is taken

    return FileLock(str(cache.root / "cache.lock"), mode=privacy.file_mode(cache.group))


def _write_json(path: Path, doc: dict[str, Any], group: int | None = None) -> None:
    """Write ``doc`` privately (registry.pull.privacy) under a temp name, then
    rename it onto ``path``."""
    privacy.make_private_dir(path.parent, group)
    tmp = path.with_name(f".{path.name}.{temp_tag()}.tmp")
    privacy.write_private(tmp, numbers.dumps(doc, sort_keys=True).encode(), group)
    os.replace(tmp, path)


def _read_json(path: str | Path, group: int | None = None) -> dict[str, Any] | None:
    """The JSON object at ``path``; None when it is absent, malformed, or a
    file another user could have written (untrusted input: ignored)."""
    if not privacy.usable(Path(path), group):
        return None
    try:
        doc = schemas.load_local_json(path)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _digest(value: Any) -> str:
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise ValueError(f"{value!r}: not a sha256 digest")
    return value


def _target(value: Any) -> str:
    """A record's target: an absolute, normalized path (no ``..``, no ``//``)."""
    if not isinstance(value, str) or not os.path.isabs(value) or \
            os.path.normpath(value) != value or "\0" in value:
        raise ValueError(f"{value!r}: not an absolute, normalized path")
    return value


@dataclass(frozen=True, slots=True)
class PullRecord:
    """One release as the cache remembers it.

    Attributes:
        files: ``(path, size, sha256)`` of every file of the release (sizes in bytes).
        first_pulled, last_pulled: RFC 3339 UTC times of the first and latest pull.
        targets: absolute paths of the directories it was materialized into.
    """

    model_id: str
    version: str
    manifest_sha256: str
    files: tuple[tuple[str, int, str], ...]
    first_pulled: str
    last_pulled: str
    targets: tuple[str, ...]

    @property
    def blobs(self) -> dict[str, int]:
        """Its distinct blobs: sha256 -> size in bytes."""
        return {sha: size for _path, size, sha in self.files}

    @property
    def total_size(self) -> int:
        return sum(size for _path, size, _sha in self.files)

    def to_doc(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "version": self.version,
                "manifest_sha256": self.manifest_sha256,
                "files": [{"path": p, "size": s, "sha256": h} for p, s, h in self.files],
                "first_pulled": self.first_pulled, "last_pulled": self.last_pulled,
                "targets": list(self.targets)}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> PullRecord:
        """Raises KeyError, TypeError or ValueError on a malformed document (a
        record is untrusted input: digests must be sha256 hex, sizes
        non-negative, targets absolute normalized paths)."""
        files = tuple((str(f["path"]), int(f["size"]), _digest(f["sha256"]))
                      for f in doc["files"])
        if any(size < 0 for _p, size, _h in files):
            raise ValueError("a negative size")
        return cls(str(doc["model_id"]), str(doc["version"]), _digest(doc["manifest_sha256"]),
                   files, str(doc["first_pulled"]), str(doc["last_pulled"]),
                   tuple(_target(t) for t in doc.get("targets", ())))

    @classmethod
    def of_manifest(cls, manifest: Manifest, *, when: str,
                    targets: tuple[str, ...] = ()) -> PullRecord:
        return cls(str(manifest.meta.get("model_id", "")), str(manifest.meta.get("version", "")),
                   manifest.digest, tuple((e.path, e.size, e.sha256) for e in manifest.files),
                   when, when, targets)


def records_dir(cache: Cache) -> Path:
    return cache.root / "records"


def record_path(cache: Cache, manifest_sha256: str) -> Path:
    return records_dir(cache) / f"{manifest_sha256}.json"


def read_records(cache: Cache) -> dict[str, PullRecord]:
    """Every readable record, by manifest sha256 (unreadable ones are skipped)."""
    out: dict[str, PullRecord] = {}
    try:
        entries = list(os.scandir(records_dir(cache)))
    except FileNotFoundError:
        return out
    for entry in entries:
        if not entry.name.endswith(".json") or entry.name.startswith("."):
            continue
        doc = _read_json(entry.path, cache.group)
        try:
            rec = PullRecord.from_doc(doc or {})
        except (KeyError, TypeError, ValueError):
            continue
        if entry.name != f"{rec.manifest_sha256}.json":
            continue  # a record is named by its manifest's digest
        out[rec.manifest_sha256] = rec
    return out


def write_record(cache: Cache, rec: PullRecord) -> None:
    _write_json(record_path(cache, rec.manifest_sha256), rec.to_doc(), cache.group)


def forget_record(cache: Cache, manifest_sha256: str) -> None:
    record_path(cache, manifest_sha256).unlink(missing_ok=True)


# -- leases -----------------------------------------------------------------------


def leases_dir(cache: Cache) -> Path:
    return cache.root / "leases"


@dataclass(frozen=True, slots=True)
class Lease:
    """A pull in progress: the release and the blobs it counts on."""

    path: Path
    model_id: str
    version: str
    manifest_sha256: str
    blobs: frozenset[str]


def live_leases(cache: Cache, *, remove_dead: bool = False) -> list[Lease]:
    """The leases of pulls whose process lives (call under the cache lock to
    act on the answer); ``remove_dead`` deletes the others."""
    out = []
    try:
        entries = list(os.scandir(leases_dir(cache)))
    except FileNotFoundError:
        return out
    for entry in entries:
        pid = owner_pid(entry.name)
        if pid is None:
            continue
        if not pid_alive(pid):
            if remove_dead:
                Path(entry.path).unlink(missing_ok=True)
            continue
        doc = _read_json(Path(entry.path), cache.group) or {}
        out.append(Lease(Path(entry.path), str(doc.get("model_id", "")),
                         str(doc.get("version", "")), str(doc.get("manifest_sha256", "")),
                         frozenset(str(b) for b in doc.get("blobs", ()))))
    return out


_TAKEN: ContextVar[list[Path] | None] = ContextVar("registry_pull_leases", default=None)


def take_lease(cache: Cache, manifest: Manifest) -> Lease:
    """Take a lease on ``manifest``'s release and blobs, given up when the
    enclosing :func:`gives_up_leases` function returns or raises.

    Raises:
        RuntimeError: called outside a :func:`gives_up_leases` function.

    Notes:
        The lease file is written under the cache lock, so a prune either ran
        before (and the pull sees what it deleted) or sees the lease.
    """
    taken = _TAKEN.get()
    if taken is None:
        raise RuntimeError("take_lease outside a function decorated with gives_up_leases")
    blobs = frozenset(e.sha256 for e in manifest.files)
    path = leases_dir(cache) / f"{temp_tag()}.{uuid.uuid4().hex[:6]}.json"
    lease = Lease(path, str(manifest.meta.get("model_id", "")),
                  str(manifest.meta.get("version", "")), manifest.digest, blobs)
    with cache_lock(cache):
        _write_json(path, {"pid": os.getpid(), "model_id": lease.model_id,
                           "version": lease.version, "manifest_sha256": lease.manifest_sha256,
                           "blobs": sorted(blobs)}, cache.group)
    taken.append(path)
    return lease


def _give_up(token: Token[list[Path] | None]) -> None:
    for path in _TAKEN.get() or ():
        path.unlink(missing_ok=True)
    _TAKEN.reset(token)


def gives_up_leases(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate a function that takes leases (:func:`take_lease`): every lease
    it took is given up when it returns or raises (a pull: after its record
    is written)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        token = _TAKEN.set([])
        try:
            return fn(*args, **kwargs)
        finally:
            _give_up(token)

    return wrapper


@contextmanager
def pulling(cache: Cache, manifest: Manifest) -> Iterator[Lease]:
    """Hold a lease on ``manifest``'s release and blobs for the body's duration
    (what a pull does; for tools and tests)."""
    token = _TAKEN.set([])
    try:
        yield take_lease(cache, manifest)
    finally:
        _give_up(token)


def record_pull(cache: Cache, manifest: Manifest, target: Path) -> PullRecord:
    """Record (under the cache lock) that ``manifest``'s release was pulled
    now and is materialized at ``target``; returns the new record."""
    when = now_rfc3339()
    with cache_lock(cache):
        old = _read_json(record_path(cache, manifest.digest), cache.group)
        try:
            prev = PullRecord.from_doc(old) if old else None
        except (KeyError, TypeError, ValueError):
            prev = None
        targets = tuple(dict.fromkeys([*(prev.targets if prev else ()), str(target)]))
        rec = PullRecord.of_manifest(manifest, when=when, targets=targets)
        if prev is not None:
            rec = PullRecord(rec.model_id, rec.version, rec.manifest_sha256, rec.files,
                             prev.first_pulled, when, targets)
        write_record(cache, rec)
    return rec


__all__ = ["Lease", "PullRecord", "cache_lock", "forget_record", "gives_up_leases",
           "live_leases", "now_rfc3339", "parse_time", "pulling", "read_records", "record_pull",
           "take_lease", "write_record"]

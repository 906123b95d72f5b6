"""Readers' side of the commit protocol: is a directory committed, and does it verify.

The rule (DESIGN section 3): a directory is committed if and only if its
``MANIFEST.json`` exists, parses, validates against ``manifest.schema.json``,
and every file it lists exists with the listed size -- and, when verifying
fully, the listed sha256. Files outside the manifest are ignored by readers
and reported by a full verification.

A full verification checks a file with piece states (registry.protocol.pieces) piece
by piece, every piece of every file on its own thread (one per core at
least): all pieces verified is the whole-file sha256 verified. Files without
them (manifests written before issue 19, adopted trees) hash whole.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from registry.rules import limits
from registry.protocol import pieces as pc
from registry.errors import (
    DocumentError,
    IntegrityError,
    ManifestError,
    NotCommittedError,
    PieceMismatchError,
    RegistryError,
)
from registry.protocol.manifest import MANIFEST, FileEntry, Manifest, parse_manifest
from registry.store import Store, join
from registry.store.base import CHUNK


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """The outcome of verifying one directory.

    Attributes:
        prefix: the directory's key in the store.
        full: whether sha256 digests were compared (else sizes only).
        manifest: the parsed manifest, or None when it is missing or invalid.
        error: why the manifest is missing or invalid, else None.
        problems: one IntegrityError per listed file that is missing or differs.
        extras: files present but not listed (never read; reported only).
    """

    prefix: str
    full: bool
    manifest: Manifest | None
    error: RegistryError | None
    problems: tuple[IntegrityError, ...]
    extras: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True iff the directory is committed and every listed file verifies."""
        return self.manifest is not None and not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix, "ok": self.ok, "full": self.full,
            "committed": self.manifest is not None,
            "error": str(self.error) if self.error else None,
            "manifest_sha256": self.manifest.digest if self.manifest else None,
            "files": len(self.manifest.files) if self.manifest else 0,
            "bytes": self.manifest.total_size if self.manifest else 0,
            "problems": [{"path": p.path, "reason": p.reason,
                          "expected_size": p.expected_size, "actual_size": p.actual_size,
                          "expected_sha256": p.expected_sha256,
                          "actual_sha256": p.actual_sha256} for p in self.problems],
            "extras": list(self.extras),
        }


def read_manifest(store: Store, prefix: str) -> Manifest:
    """Read and validate ``<prefix>/MANIFEST.json``.

    Raises:
        NotCommittedError: no manifest (the directory is not committed).
        ManifestError, UnsafePathError: the manifest is invalid.
    """
    key = join(prefix, MANIFEST)
    try:
        data = store.read_bytes(key, limit=limits.MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        parts = prefix.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "models":  # a release: in the user's words
            from registry.rules.suggest import incomplete_version

            raise NotCommittedError(incomplete_version(store.url, parts[1], parts[2]),
                                    path=prefix) from None
        raise NotCommittedError(f"{store.url_of(prefix)}: not committed (no {MANIFEST})",
                                path=prefix) from None
    except DocumentError:
        raise ManifestError(store.url_of(key), f"larger than the {limits.MAX_MANIFEST_BYTES}"
                                               "-byte limit (REGISTRY_MAX_MANIFEST_BYTES)"
                            ) from None
    return parse_manifest(data, source=store.url_of(key))


def _hash_object(store: Store, key: str) -> str:
    h = hashlib.sha256()
    for block in store.iter_read(key, CHUNK):
        h.update(block)
    return h.hexdigest()


def _check_size(entry: FileEntry, sizes: dict[str, int]) -> IntegrityError | None:
    actual = sizes.get(entry.path)
    if actual is None:
        return IntegrityError(entry.path, expected_size=entry.size, actual_size=None,
                              expected_sha256=entry.sha256)
    if actual != entry.size:
        return IntegrityError(entry.path, expected_size=entry.size, actual_size=actual)
    return None


def _skipped(store: Store, key: str, entry: FileEntry) -> IntegrityError | None:
    """The error of a listed file the store's listing skipped (a link or a
    special file at ``key`` or above it: registry.store.confine), naming it."""
    segs = key.split("/")
    for i in range(len(segs), 0, -1):
        mark = f"/{'/'.join(segs[:i])}: "
        for why in store.skipped:
            if mark in why:
                return IntegrityError(entry.path, expected_size=entry.size, actual_size=None,
                                      reason=why.split(": ", 1)[1])
    return None


def _check_whole(store: Store, key: str, entry: FileEntry) -> IntegrityError | None:
    digest = _hash_object(store, key)
    if digest != entry.sha256:
        return IntegrityError(entry.path, expected_size=entry.size, actual_size=entry.size,
                              expected_sha256=entry.sha256, actual_sha256=digest)
    return None


def piece_error(entry: FileEntry, k: int, actual: str) -> PieceMismatchError:
    """The error for piece ``k`` of ``entry`` whose bytes end at ``actual``."""
    assert entry.pieces is not None
    start, end = entry.pieces.bounds(entry.size)[k]
    return PieceMismatchError(entry.path, size=entry.size, piece=k, start=start, end=end,
                              expected_state=pc.expected_state(entry.pieces, entry.sha256, k),
                              actual_state=actual, last=k == entry.pieces.count() - 1)


def _check_piece(store: Store, key: str, entry: FileEntry, k: int) -> IntegrityError | None:
    assert entry.pieces is not None
    start, end = entry.pieces.bounds(entry.size)[k]
    local = store.local_path(key)
    if local is not None:
        fd = os.open(local, os.O_RDONLY | os.O_CLOEXEC)
        try:
            actual = pc.check_fd(fd, entry.pieces, entry.sha256, entry.size, k)
        finally:
            os.close(fd)
    else:
        actual = pc.check_piece(entry.pieces, entry.sha256, entry.size, k,
                                store.iter_range(key, start, end, CHUNK))
    return None if actual is None else piece_error(entry, k, actual)


def hash_tasks(store: Store, key: str, entry: FileEntry,
               ) -> list[Callable[[], IntegrityError | None]]:
    """The independent checks that together verify every byte of ``entry``
    at ``key``: one per piece when the entry has piece states (and
    libcrypto is here), else one whole-file sha256. Each returns None or
    the error (a PieceMismatchError names the piece and both states)."""
    if entry.pieces is not None and pc.AVAILABLE:
        return [lambda k=k: _check_piece(store, key, entry, k)  # type: ignore[misc]
                for k in range(entry.pieces.count())]
    return [lambda: _check_whole(store, key, entry)]


#: threads hashing at once when not told: enough requests in flight for an
#: object store, and one per core at least (hashing releases the GIL).
WORKERS = 4


def default_workers(workers: int | None = None) -> int:
    """``workers`` if given, else max(WORKERS, CPU count)."""
    return max(1, workers) if workers is not None else max(WORKERS, os.cpu_count() or 1)


def run_checks(pool: ThreadPoolExecutor, checks: Iterable[tuple[int, Callable[[], Any]]],
               ) -> dict[int, IntegrityError]:
    """Run ``(index, check)`` pairs on ``pool``; the first error per index,
    lowest piece first."""
    futures: list[tuple[int, Future[IntegrityError | None]]] = [
        (i, pool.submit(fn)) for i, fn in checks]
    errors: dict[int, IntegrityError] = {}
    for i, fut in futures:
        err = fut.result()
        if err is not None and i not in errors:
            errors[i] = err
    return errors


def verify_directory(store: Store, prefix: str, *, full: bool = False,
                     workers: int | None = None) -> VerifyReport:
    """Verify the directory at ``prefix`` against its manifest; never raises for
    a bad directory (the report says what is wrong).

    Args:
        full: compare sha256 digests (reads every byte), else sizes only.
        workers: threads hashing files and pieces in parallel (hashing
            releases the GIL); default max(WORKERS, CPU count).

    Raises:
        StorageError: the store itself failed (network, permissions).
    """
    try:
        manifest = read_manifest(store, prefix)
    except (NotCommittedError, ManifestError) as e:
        return VerifyReport(prefix, full, None, e, (), ())
    sizes = store.walk_files(prefix)
    problems = verify_entries(store, prefix, manifest.files, full=full, workers=workers,
                              sizes=sizes)
    listed = {e.path for e in manifest.files} | {MANIFEST}
    extras = tuple(p for p in sizes if p not in listed)
    return VerifyReport(prefix, full, manifest, None, tuple(problems), extras)


def verify_entries(store: Store, prefix: str, entries: Any, *, full: bool = True,
                   workers: int | None = None, sizes: dict[str, int] | None = None,
                   ) -> list[IntegrityError]:
    """Check some manifest entries of the directory at ``prefix`` (sizes, and
    sha256 when ``full``); returns one IntegrityError per file that differs,
    in manifest order. Raises StorageError when the store fails.

    A file with piece states is checked piece by piece, every piece of every
    file on a pool of ``workers`` threads (default: see default_workers), so one large file
    verifies on every core; its error is a PieceMismatchError naming the
    first bad piece. Other files hash whole, in parallel with the rest."""
    if sizes is None:
        sizes = store.walk_files(prefix)
    entries = list(entries)
    errors: dict[int, IntegrityError] = {}
    checks: list[tuple[int, Callable[[], Any]]] = []
    for i, e in enumerate(entries):
        bad = _check_size(e, sizes)
        if bad is not None and e.path not in sizes:
            bad = _skipped(store, join(prefix, e.path), e) or bad
        if bad is not None:
            errors[i] = bad
        elif full:
            checks.extend((i, fn) for fn in hash_tasks(store, join(prefix, e.path), e))
    if checks:
        with ThreadPoolExecutor(default_workers(workers), thread_name_prefix="verify") as pool:
            for i, err in run_checks(pool, checks).items():
                errors.setdefault(i, err)
    return [errors[i] for i in sorted(errors)]


def is_committed(store: Store, prefix: str) -> bool:
    """True iff the directory is committed (manifest valid, sizes match)."""
    return verify_directory(store, prefix, full=False).ok


def require_verified(store: Store, prefix: str, *, full: bool = True) -> Manifest:
    """Return the manifest of a directory that verifies, else raise.

    Raises:
        NotCommittedError, ManifestError: the manifest is missing or invalid.
        IntegrityError: the first listed file that is missing or differs.
    """
    report = verify_directory(store, prefix, full=full)
    if report.error is not None:
        raise report.error
    if report.problems:
        raise report.problems[0]
    assert report.manifest is not None
    return report.manifest

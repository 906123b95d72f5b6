"""Placing a model directory where the engine reads it: whole or not at all.

The directory is assembled in a sibling staging directory (same filesystem)
from hardlinks to cache blobs (copies across filesystems), with the release's
MANIFEST.json, then renamed into place. If the target already holds the same
release (same manifest digest), the pull is a no-op; other content is refused
unless ``force``, which swaps the directories (atomically with
``renameat2(RENAME_EXCHANGE)`` where the kernel has it).
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from pathlib import Path

from registry.errors import (
    CommitConflictError,
    InsufficientSpaceError,
    IntegrityError,
    ObjectExistsError,
    StorageError,
)
from registry.manifest import MANIFEST, Manifest, hash_file, parse_manifest
from registry.pull.cache import Cache, owner_pid, pid_alive, temp_tag
from registry.store.local import _AT_FDCWD, _renameat2, fsync_path, rename_noreplace

_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    if _renameat2 is None:
        return False
    return _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b),
                      _RENAME_EXCHANGE) == 0


def _inside(root: Path, relpath: str) -> Path:
    p = (root / relpath).resolve()
    if root.resolve() not in p.parents:
        raise IntegrityError(relpath, reason="would be placed outside the target directory")
    return p


def current_digest(target: Path) -> str | None:
    """Manifest digest of a materialized directory holding exactly its listed
    files (and MANIFEST.json) at their listed sizes; None when ``target`` is
    absent, foreign, incomplete or holds files the manifest does not list."""
    try:
        m = parse_manifest((target / MANIFEST).read_bytes(), source=str(target / MANIFEST))
    except (OSError, ValueError):
        return None
    for e in m.files:
        try:
            if (target / e.path).stat().st_size != e.size:
                return None
        except OSError:
            return None
    listed = {e.path for e in m.files} | {MANIFEST}
    for dirpath, _dirs, names in os.walk(target):
        rel = os.path.relpath(dirpath, target)
        for n in names:
            if (n if rel == "." else f"{rel}/{n}".replace(os.sep, "/")) not in listed:
                return None
    return m.digest


def is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def clean_stale_staging(target: Path) -> None:
    """Remove staging directories next to ``target`` left by dead pulls."""
    parent = target.parent
    if not parent.is_dir():
        return
    for p in parent.iterdir():
        if p.name.startswith(f".{target.name}.") and ".pull-" in p.name:
            pid = owner_pid(p.name)
            if pid is not None and not pid_alive(pid):
                shutil.rmtree(p, ignore_errors=True)


def _refuse_foreign(target: Path, manifest: Manifest) -> None:
    # Re-read: a concurrent pull of this very release may have placed it meanwhile.
    if current_digest(target) != manifest.digest:
        raise CommitConflictError(f"{target}: holds other content (not this release); "
                                  "refusing to replace it without --force", path=str(target))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def materialize(manifest: Manifest, cache: Cache, target: Path, *, force: bool,
                verify: bool = False) -> bool:
    """Place the release at ``target``; returns False when it was already there.

    Args:
        verify: re-hash every file in the staging directory before it is
            placed, so a corrupt cache blob never reaches the final name.

    Raises:
        CommitConflictError: ``target`` holds other content and not ``force``.
        IntegrityError: a manifest path would escape ``target``, or (with
            ``verify``) a file differs from the manifest.
        InsufficientSpaceError: the disk filled up while copying.
    """
    if current_digest(target) == manifest.digest:
        if verify:
            problems = verify_materialized(target, manifest)
            if problems:
                raise problems[0]
        return False
    if target.exists() and not is_empty_dir(target) and not force:
        _refuse_foreign(target, manifest)
        return False
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StorageError(f"{target.parent}: cannot create the target's parent directory "
                           f"({e.strerror or e})", key=str(target.parent)) from None
    clean_stale_staging(target)
    staging = target.parent / f".{target.name}.{temp_tag()}.pull-{uuid.uuid4().hex[:6]}"
    staging.mkdir()
    try:
        for e in manifest.files:
            dest = _inside(staging, e.path)
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(cache.blob(e.sha256), dest)
            except OSError as err:
                if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
                shutil.copyfile(cache.blob(e.sha256), dest)
        (staging / MANIFEST).write_bytes(manifest.to_bytes())
        if verify:
            problems = verify_materialized(staging, manifest)
            if problems:
                raise problems[0]
        return _place(staging, target, manifest, force=force)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise InsufficientSpaceError(f"{target}: no space left on device while placing "
                                         "the model directory", key=str(target)) from None
        raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _place(staging: Path, target: Path, manifest: Manifest, *, force: bool) -> bool:
    if is_empty_dir(target):
        try:
            target.rmdir()
        except OSError:
            pass
    try:
        rename_noreplace(str(staging), str(target))
        fsync_path(str(target.parent))
        return True
    except OSError as e:
        if e.errno not in (errno.EEXIST, errno.ENOTEMPTY) and not isinstance(e, FileExistsError):
            raise
    # Someone placed a directory first: a concurrent pull of the same release wins too.
    if current_digest(target) == manifest.digest:
        return False
    if not force:
        _refuse_foreign(target, manifest)
        return False
    if _exchange(staging, target):
        _remove(staging)  # staging now holds the old content
    else:
        old = target.parent / f".{target.name}.{temp_tag()}.old"
        os.rename(target, old)
        os.rename(staging, target)
        _remove(old)
    return True


def verify_materialized(target: Path, manifest: Manifest) -> list[IntegrityError]:
    """Re-hash every materialized file against the manifest (``--verify``)."""
    problems = []
    for e in manifest.files:
        try:
            size, digest = hash_file(target / e.path)
        except FileNotFoundError:
            problems.append(IntegrityError(e.path, expected_size=e.size))
            continue
        if size != e.size or digest != e.sha256:
            problems.append(IntegrityError(e.path, expected_size=e.size, actual_size=size,
                                           expected_sha256=e.sha256, actual_sha256=digest))
    return problems


__all__ = ["ObjectExistsError", "current_digest", "materialize", "verify_materialized"]

"""Placing a model directory where the engine reads it: whole or not at all.

The directory is assembled in a sibling staging directory (same filesystem)
with the release's MANIFEST.json, then renamed into place. Each file is a
reflink (copy-on-write clone, ``FICLONE``) of its cache blob where the
filesystem has them, else a copy; never a hardlink, so nothing written to a
materialized file (by a user, an engine, root) reaches a blob or another
materialized directory (DESIGN section 7).

A blob is checked every time it is placed: hashed while it is copied, or
from the clone, and refused when its sha256 differs (issue 47: a stat stamp
misses bytes changed under an unchanged inode, size, mtime and ctime). A blob
this pull downloaded and verified, or, with ``REGISTRY_CACHE_TRUST_STAMPS=1``,
any blob whose stamp equals the one recorded when its bytes were verified
(registry.pull.stamps), is placed without reading it (the kernel's
``copy_file_range``). A changed
blob raises :class:`BlobChangedError` and is never placed. (Until issue 19 a
copy hashed every byte it copied: a second sha256 pass of every pull, on one
core, which alone cost more than ``cp -r``; the stamp says the same thing for
the reasons listed in registry.pull.stamps.)

A target that already holds the release is re-hashed, so a re-pull notices
a changed target (with ``REGISTRY_CACHE_TRUST_STAMPS=1``, only the files whose
stamp differs from the one recorded when they were placed). If the target holds the
same release unchanged, the pull is a no-op; other or changed content is
refused unless ``force``, which swaps the directories (atomically with
``renameat2(RENAME_EXCHANGE)`` where the kernel has it).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import uuid
from pathlib import Path
from collections.abc import Callable
from typing import IO, Any

from registry.rules import limits
from registry.errors import (
    CommitConflictError,
    InsufficientSpaceError,
    IntegrityError,
    ObjectExistsError,
    StorageError,
)
from registry.protocol.hashing import HashingWriter
from registry.protocol.manifest import MANIFEST, FileEntry, Manifest, hash_file, parse_manifest
from registry.host.processes import pid_alive
from registry.pull.cache import Cache, owner_pid, temp_tag
from registry.pull.stamps import stamp
from registry.store import open_store
from registry.store.durable import (
    _AT_FDCWD,
    _DurableFile,
    _renameat2,
    fsync_path,
    rename_noreplace,
)
from registry.protocol.verify import verify_entries

_RENAME_EXCHANGE = 2
#: ioctl(dest_fd, FICLONE, src_fd): share the source's extents (btrfs, XFS, bcachefs...).
_FICLONE = 0x40049409
#: errors meaning "this filesystem (pair) cannot clone": copy instead.
_NO_CLONE = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.EPERM,
             errno.ENOSYS, errno.EBADF}


class BlobChangedError(IntegrityError):
    """A cache blob no longer holds the bytes its name says (edited, truncated,
    rotted after it was verified). It is never placed; ``pull`` drops it and
    downloads it again.

    Attributes:
        sha256: the blob's name (the expected digest).
    """

    def __init__(self, entry: FileEntry, *, actual_size: int, actual_sha256: str) -> None:
        self.sha256 = entry.sha256
        super().__init__(entry.path, expected_size=entry.size, actual_size=actual_size,
                         expected_sha256=entry.sha256, actual_sha256=actual_sha256,
                         reason=f"cache blob {entry.sha256[:12]}... changed since it was "
                                f"verified (size {actual_size}, sha256 {actual_sha256}); "
                                "not placed")


def reflink(src_fd: int, dst_fd: int) -> bool:
    """Clone ``src_fd``'s bytes into the empty file ``dst_fd``; False where the
    filesystem cannot (the caller copies). Raises OSError on any other error."""
    try:
        fcntl.ioctl(dst_fd, _FICLONE, src_fd)
    except OSError as e:
        if e.errno in _NO_CLONE:
            return False
        raise
    return True


def _nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)


def place_file(cache: Cache, entry: FileEntry, dest: Path, *, fsync: bool = True) -> str:
    """Create ``dest`` with the bytes of ``entry``'s blob, checked; read-only.

    Returns:
        ``"reflink"`` or ``"copy"``: how the file was placed.

    Raises:
        BlobChangedError: the blob's bytes differ from its name (``dest`` is
            removed).
        FileNotFoundError: the blob is gone (dropped by a concurrent pull).
        OSError: reading or writing failed (ENOSPC...); ``dest`` is removed.
    """
    blob = cache.blob(entry.sha256)
    if not cache.usable(entry.sha256):  # not a regular file of this user's: never read
        raise FileNotFoundError(errno.ENOENT, "not a usable cache blob", str(blob))
    with open(blob, "rb", buffering=0, opener=_nofollow) as src:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            cloned = reflink(src.fileno(), fd)
            if cloned and fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if cloned:
            how = "reflink"
            if not cache.unread_ok(entry.sha256):
                size, digest = hash_file(dest)  # the clone's bytes are the blob's
                if (size, digest) != (entry.size, entry.sha256):
                    dest.unlink(missing_ok=True)
                    raise BlobChangedError(entry, actual_size=size, actual_sha256=digest)
                cache.stamps.record_blob(blob)  # touched, not changed
        else:
            how = "copy"
            _copy(cache, entry, src, dest, fsync=fsync)
    os.chmod(dest, 0o444)
    return how


def _copy(cache: Cache, entry: FileEntry, src: IO[bytes], dest: Path, *, fsync: bool) -> None:
    """Copy the blob ``src`` to ``dest``. A blob whose stat stamp is the one
    recorded when it was verified is copied by the kernel, unread (as a
    reflink is placed unread); any other is hashed as it is copied and
    refused (BlobChangedError, ``dest`` removed) when its bytes differ."""
    raw = _DurableFile(str(dest), "wb") if fsync else open(dest, "wb")  # noqa: SIM115
    try:
        if cache.unread_ok(entry.sha256):
            size, digest = _copy_unread(src, raw), entry.sha256
        else:
            w = HashingWriter(raw)
            w.copy_from(src)
            size, digest = w.size, w.sha256
        raw.close()
    except BaseException:
        if isinstance(raw, _DurableFile):
            raw.discard()
        else:
            raw.close()
        dest.unlink(missing_ok=True)
        raise
    if (size, digest) != (entry.size, entry.sha256):
        dest.unlink(missing_ok=True)
        raise BlobChangedError(entry, actual_size=size, actual_sha256=digest)


def _copy_unread(src: IO[bytes], raw: Any) -> int:
    """All of ``src`` into the empty file ``raw`` by ``copy_file_range``
    (user space where the kernel cannot); returns the bytes copied."""
    fd = src.fileno()
    if isinstance(raw, _DurableFile):
        copied = raw.copy_from_fd(fd, lambda offset, length: None)
        if copied is not None:
            return copied
    else:
        out, pos = raw.fileno(), 0
        try:
            while n := os.copy_file_range(fd, out, 64 * 1024 * 1024, pos, pos):
                pos += n
            return pos
        except OSError as e:
            if pos or e.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS,
                                      errno.EOPNOTSUPP, errno.EBADF):
                raise
    src.seek(0)
    shutil.copyfileobj(src, raw, 8 * 1024 * 1024)
    return src.tell()


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
        m = parse_manifest(limits.read_local(target / MANIFEST, limits.MAX_MANIFEST_BYTES),
                           source=str(target / MANIFEST))
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


def check_target(target: Path, manifest: Manifest, cache: Cache, *,
                 need_sha256: bool = False) -> tuple[bool, list[str]]:
    """Whether ``target`` holds this release, and which of its files changed.

    Returns:
        ``(False, [])`` when ``target`` is absent, foreign or incomplete
        (:func:`current_digest` differs); else ``(True, changed)``, where
        ``changed`` lists the files (MANIFEST.json included) whose bytes
        differ from the release. Every file is re-hashed, except (with
        ``REGISTRY_CACHE_TRUST_STAMPS=1``, registry.pull.cache.trust_stamps)
        one whose stat stamp equals the one recorded when it was placed
        (when the bytes are right, the new stamps are recorded). With
        ``need_sha256`` (a signed pull), files placed after a BLAKE3 check
        only are re-hashed with sha256 too, once.
    """
    if current_digest(target) != manifest.digest:
        return False, []
    # stamps are the private cache's own (registry.pull.privacy: one another
    # user could have written is ignored); a signed pull trusts only those
    # recorded after a sha256 check (need_sha256 below)
    recorded = cache.stamps.dir_stamps(target, manifest.digest)
    if need_sha256:
        for path in cache.stamps.blake3_only(target, manifest.digest):
            recorded.pop(path, None)
    expected = {e.path: (e.size, e.sha256) for e in manifest.files}
    changed, rehashed = [], False
    for path, want in expected.items():
        try:
            if cache.trust_stamps and recorded.get(path) == stamp(target / path):
                continue
            rehashed = True
            if hash_file(target / path) != want:
                changed.append(path)
        except OSError:
            changed.append(path)
    if not changed and rehashed:
        left = () if need_sha256 else tuple(cache.stamps.blake3_only(target, manifest.digest))
        try:
            cache.stamps.record_dir(target, manifest.digest, [*expected, MANIFEST],
                                    blake3_only=left)
        except OSError:
            pass  # a read-only cache: the next re-pull re-hashes again
    return True, changed


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


def _refuse_foreign(target: Path, manifest: Manifest, cache: Cache, *,
                    need_sha256: bool = False) -> None:
    # Re-read: a concurrent pull of this very release may have placed it meanwhile.
    holds, changed = check_target(target, manifest, cache, need_sha256=need_sha256)
    if changed:
        raise CommitConflictError(
            f"{target / changed[0]}: changed since it was pulled (its bytes differ from "
            f"{manifest.meta.get('model_id')}@{manifest.meta.get('version')}'s manifest); refusing to replace "
            "it without --force, which puts the release back", path=str(target))
    if not holds:
        raise CommitConflictError(f"{target}: holds other content (not this release); "
                                  "refusing to replace it without --force", path=str(target))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def materialize(manifest: Manifest, cache: Cache, target: Path, *, force: bool,
                verify: bool = False, fsync: bool = True,
                download: Callable[[list[tuple[FileEntry, Path]]], None] | None = None,
                direct: frozenset[str] = frozenset(),
                blake3_only: tuple[str, ...] = (), need_sha256: bool = False) -> bool:
    """Place the release at ``target``; returns False when it was already there.
    ``blake3_only``: paths whose download is checked by BLAKE3 only (recorded,
    so a later signed pull re-hashes them with sha256: check_target).

    Args:
        download: with ``direct``, called once with ``(entry, path)`` pairs
            in the staging directory, one per digest in ``direct``: it must
            create each path with the entry's verified bytes (pull's
            ``blobs=False``: one write per byte, no blob). Other files with
            such a digest are then copied from the first, unread.
        direct: sha256 digests that are not in the cache and go to ``download``.
        verify: re-hash every file in the staging directory before it is
            placed (and every file of a target that already holds the release).
        fsync: fsync every placed file and the staging directory before the
            rename (False: ``--no-fsync``).
        need_sha256: a target file checked by BLAKE3 only is re-hashed with
            sha256 before the target counts as holding the release (a signed
            pull: :func:`check_target`).

    Raises:
        CommitConflictError: ``target`` holds other content, or this release
            with a file changed since it was pulled, and not ``force``.
        BlobChangedError: a cache blob's bytes changed after it was verified;
            nothing is placed (the caller drops the blob).
        IntegrityError: a manifest path would escape ``target``, or (with
            ``verify``) a file differs from the manifest.
        InsufficientSpaceError: the disk filled up while copying.

    Notes:
        Never a hardlink: each file is a reflink or a copy of its blob, so
        writing to a materialized file changes neither the cache nor any
        other materialized directory. The stamps of the placed files are
        recorded in the cache (registry.pull.stamps) for the next re-pull.
    """
    holds, changed = check_target(target, manifest, cache, need_sha256=need_sha256)
    if holds and not changed:
        if verify:
            problems = verify_materialized(target, manifest)
            if problems:
                raise problems[0]
        return False
    if target.exists() and not is_empty_dir(target) and not force:
        _refuse_foreign(target, manifest, cache, need_sha256=need_sha256)
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
        firsts: dict[str, Path] = {}
        for e in manifest.files:
            dest = _inside(staging, e.path)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if e.sha256 in direct:
                firsts.setdefault(e.sha256, dest)
        if firsts and download is not None:
            download([(e, firsts[e.sha256]) for e in manifest.files
                      if firsts.get(e.sha256) == _inside(staging, e.path)])
        for e in manifest.files:
            dest = _inside(staging, e.path)
            first = firsts.get(e.sha256)
            if first == dest:
                continue
            if first is not None and not cache.has(e.sha256, e.size):
                # the same bytes twice in the release, no blob: copy the first, unread
                with open(first, "rb", buffering=0) as src:
                    raw = _DurableFile(str(dest), "wb") if fsync else open(dest, "wb")  # noqa: SIM115
                    with raw:
                        _copy_unread(src, raw)
                os.chmod(dest, 0o444)
                continue
            place_file(cache, e, dest, fsync=fsync)
        (staging / MANIFEST).write_bytes(manifest.to_bytes())
        if verify:
            problems = verify_materialized(staging, manifest)
            if problems:
                raise problems[0]
        if fsync:
            for dirpath, _dirs, _names in os.walk(staging):
                fsync_path(dirpath)
        placed = _place(staging, target, manifest, cache, force=force)
        if placed:
            try:
                cache.stamps.record_dir(target, manifest.digest,
                                        [*(e.path for e in manifest.files), MANIFEST],
                                        blake3_only=blake3_only)
            except OSError:
                pass  # no record: the next re-pull re-hashes the target
        return placed
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise InsufficientSpaceError(f"{target}: no space left on device while placing "
                                         "the model directory", key=str(target)) from None
        raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _place(staging: Path, target: Path, manifest: Manifest, cache: Cache, *,
           force: bool) -> bool:
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
    holds, changed = check_target(target, manifest, cache)
    if holds and not changed:
        return False
    if not force:
        _refuse_foreign(target, manifest, cache)
        return False
    if _exchange(staging, target):
        _remove(staging)  # staging now holds the old content
    else:
        old = target.parent / f".{target.name}.{temp_tag()}.old"
        os.rename(target, old)
        os.rename(staging, target)
        _remove(old)
    fsync_path(str(target.parent))
    return True


def verify_materialized(target: Path, manifest: Manifest) -> list[IntegrityError]:
    """Re-hash every materialized file against the manifest (``--verify``):
    files with piece states piece by piece on every core (registry.protocol.verify)."""
    return verify_entries(open_store(str(target)), "", manifest.files, full=True)


__all__ = ["BlobChangedError", "ObjectExistsError", "check_target", "current_digest",
           "materialize", "place_file", "reflink", "verify_materialized"]

"""The commit protocol: write a directory so that readers see all of it or none.

Chosen by the store's capability, never by URL scheme (DESIGN section 3):

With atomic rename (local disk), the seed's "Writing atomically" steps::

    <name>.tmp[-<id>]/   every file written and fsynced      (step 1)
                         MANIFEST.json last, fsync it + dir   (step 2)
    rename -> <name>/    fails if <name> exists               (step 3)
    fsync the parent

Without it (S3, memory)::

    <name>.claim         conditional create: one writer owns <name>/
    <name>/...           files written in place under the final prefix
    <name>/MANIFEST.json conditional create: the commit marker
    delete <name>.claim

Pointers (step 4) live in :mod:`registry.pointer`; deletion in :func:`delete_directory`.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from registry.errors import (
    CommitConflictError,
    ObjectExistsError,
    RegistryError,
    StorageError,
)
from registry.hashing import HashingWriter
from registry.manifest import (
    MANIFEST,
    FileEntry,
    Manifest,
    check_path,
    list_local_files,
    utc_now,
)
from registry.store import Store, join
from registry.store.translate import translate, translated

CLAIM_SUFFIX = ".claim"
TMP_MARK = ".tmp"


class DirectoryWriter:
    """Stage the files of one directory, then commit it atomically.

    Args:
        store: where to write.
        prefix: the final key of the directory (``runs/r1/ckpt/step-000500``).
        kind: manifest kind, ``"checkpoint"`` or ``"release"``.
        meta: the manifest's kind-specific fields.
        staging: fixed staging key on rename stores (the seed's
            ``step-<n>.tmp``); default ``<prefix>.tmp-<random>``.
        sole_writer: the caller is the only writer of ``prefix`` (a training
            run's own checkpoints): a stale staging directory or claim left by a
            crashed predecessor is removed instead of being a conflict.
        conflict_error: the CommitConflictError subclass to raise.

    Raises:
        CommitConflictError: ``prefix`` is already committed, or (object stores)
            claimed by another live writer.

    Notes:
        Use as a context manager: leaving the block with an exception aborts
        (removes the staging directory or the claimed files); leaving it
        normally without :meth:`commit` aborts too.
    """

    def __init__(self, store: Store, prefix: str, *, kind: str, meta: dict[str, Any],
                 staging: str | None = None, sole_writer: bool = False,
                 conflict_error: type[CommitConflictError] = CommitConflictError) -> None:
        self.store = store
        self.prefix = prefix.strip("/")
        self.kind = kind
        self.meta = meta
        self.entries: dict[str, FileEntry] = {}
        self.manifest: Manifest | None = None
        self._error = conflict_error
        self._sole = sole_writer
        self._claim = self.prefix + CLAIM_SUFFIX
        self._claim_data = b""
        if store.exists(join(self.prefix, MANIFEST)):
            raise self._conflict("already committed")
        if store.atomic_rename:
            self.staging = staging or f"{self.prefix}{TMP_MARK}-{uuid.uuid4().hex[:12]}"
            if sole_writer:
                store.delete_prefix(self.staging)
        else:
            self.staging = self.prefix
            self._take_claim()

    def _conflict(self, why: str) -> CommitConflictError:
        return self._error(f"{self.store.url_of(self.prefix)}: {why}", path=self.prefix)

    def _take_claim(self) -> None:
        self._claim_data = claim = json.dumps(
            {"owner": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(),
             "created_at": utc_now()}).encode()
        try:
            self.store.create(self._claim, claim)
        except ObjectExistsError:
            if not self._sole:
                raise self._conflict("claimed by another writer "
                                     f"({self.store.url_of(self._claim)})") from None
            self.store.write_bytes(self._claim, claim)
        # Re-check under the claim: a writer may have committed and released
        # its claim between our first check and our create.
        if self.store.exists(join(self.prefix, MANIFEST)):
            self.store.delete(self._claim)
            raise self._conflict("already committed")
        self.store.delete_prefix(self.prefix)  # leftovers of a crashed writer

    # -- writing ---------------------------------------------------------------

    @contextmanager
    def open(self, relpath: str) -> Iterator[HashingWriter]:
        """Open ``relpath`` for a streaming write, hashed while written.

        Raises:
            UnsafePathError: ``relpath`` breaks the path rules.
            ValueError: ``relpath`` was already written.
        """
        check_path(relpath, source=self.store.url_of(self.prefix))
        if relpath in self.entries:
            raise ValueError(f"{relpath}: written twice")
        key = join(self.staging, relpath)
        try:
            with self.store.open_write(key) as raw:
                w = HashingWriter(raw)
                yield w
        except RegistryError:
            raise
        except OSError as e:  # disk full, I/O error: one clear error naming the file
            raise translate(e, self.store.url_of(key)) from e
        self.entries[relpath] = FileEntry(relpath, w.size, w.sha256)

    def write_bytes(self, relpath: str, data: bytes) -> FileEntry:
        """Write a small file whole; returns its manifest entry."""
        with self.open(relpath) as w:
            w.write(data)
        return self.entries[relpath]

    def write_json(self, relpath: str, doc: Any) -> FileEntry:
        """Write a JSON document (UTF-8, 2-space indent, trailing newline)."""
        return self.write_bytes(relpath, (json.dumps(doc, indent=2, ensure_ascii=False)
                                          + "\n").encode())

    def put_file(self, relpath: str, local_path: str | os.PathLike[str]) -> FileEntry:
        """Copy a local file in, streaming, hashing each chunk as it passes
        (see :meth:`HashingWriter.copy_from`)."""
        with translated(os.fspath(local_path)):
            src = open(local_path, "rb", buffering=0)  # noqa: SIM115 - closed below
        with src, self.open(relpath) as w:
            w.copy_from(src)
        return self.entries[relpath]

    # -- committing ------------------------------------------------------------

    def commit(self) -> Manifest:
        """Write MANIFEST.json last and make the directory visible at once.

        Returns:
            The committed Manifest (``.digest`` is its sha256).

        Raises:
            CommitConflictError: another writer committed ``prefix`` first;
                nothing of ours is left behind.
        """
        manifest = Manifest.build(self.kind, self.entries.values(), **self.meta)
        data = manifest.to_bytes()
        store = self.store
        try:
            self._check_staged()
            if store.atomic_rename:
                store.write_bytes(join(self.staging, MANIFEST), data)
                store.fsync_dir(self.staging)
                try:
                    store.rename_dir(self.staging, self.prefix)
                except ObjectExistsError:
                    raise self._conflict("already committed by another writer") from None
                store.fsync_dir(store.parent(self.prefix))
            else:
                try:
                    store.create(join(self.prefix, MANIFEST), data)
                except ObjectExistsError:
                    raise self._conflict("already committed by another writer") from None
                store.delete(self._claim)
        except BaseException as exc:
            self._abort_after(exc)
            raise
        self.manifest = manifest
        return manifest

    def _check_staged(self) -> None:
        """The staged files must be exactly those written, with their sizes:
        a directory another process emptied meanwhile (``registry gc`` with
        a short ``--older-than``, say) fails the commit instead of being
        committed with files missing. One listing; no file is read."""
        where = self.staging if self.store.atomic_rename else self.prefix
        staged = self.store.walk_files(where)
        expected = {e.path: e.size for e in self.entries.values()}
        if staged == expected:
            return
        missing = sorted(set(expected) - set(staged))
        extra = sorted(set(staged) - set(expected))
        resized = sorted(p for p in set(staged) & set(expected) if staged[p] != expected[p])
        detail = "; ".join(f"{what}: {', '.join(paths[:3])}" for what, paths in
                           (("missing", missing), ("unexpected", extra), ("resized", resized))
                           if paths)
        raise StorageError(f"{self.store.url_of(where)}: the staged files changed while "
                           f"committing ({detail}), removed by another process such as "
                           f"`registry gc`? Nothing was committed.", key=where)

    def abort(self) -> None:
        """Remove what this writer staged, and only that; never touches a
        committed directory. Locally that is its own staging directory; on an
        object store the files under the prefix, only while the claim is
        still this writer's (a writer whose claim was taken over leaves the
        files to the new owner).

        Raises:
            StorageError: the store failed while removing.
        """
        if self.manifest is not None:
            return
        if self.store.atomic_rename:
            self.store.delete_prefix(self.staging)
            return
        try:
            ours = self.store.read_bytes(self._claim) == self._claim_data
        except FileNotFoundError:
            ours = False
        if ours and not self.store.exists(join(self.prefix, MANIFEST)):
            self.store.delete_prefix(self.prefix)
            self.store.delete(self._claim)

    def _abort_after(self, exc: BaseException) -> None:
        """Abort because of ``exc``; a failing cleanup is noted on ``exc``
        (which is what the caller sees), never raised in its place."""
        try:
            self.abort()
        except Exception as e:  # noqa: BLE001 - the original error matters more
            exc.add_note(f"cleanup of {self.store.url_of(self.staging)} failed too: {e}")

    def __enter__(self) -> DirectoryWriter:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if self.manifest is None:
            if exc is None:
                self.abort()
            else:
                self._abort_after(exc)


def commit_local_directory(store: Store, local_dir: str | os.PathLike[str], prefix: str, *,
                           kind: str, **meta: Any) -> Manifest:
    """Commit a copy of the local directory ``local_dir`` at ``prefix``.

    Every file is read once: hashed while it is copied. Files are copied
    largest first, up to ``store.files_in_flight`` at once: on local disk one
    per core, because a file's sha256 runs on one core and the largest file
    sets the pace; on S3 one, whose parts already fill the connections. A
    ``MANIFEST.json`` at the top of ``local_dir`` is not copied (a new one is
    written). All or nothing: on any error every staged file is removed.

    Raises:
        CommitConflictError: ``prefix`` is already committed or claimed.
        UnsafePathError: a file name breaks the manifest path rules.
        UsageError: an entry is a FIFO, socket or device (nothing is written).
        ObjectNotFoundError: a symlink points nowhere (nothing is written).
        InsufficientSpaceError: the store's disk filled up (nothing committed).
        StorageError: reading the source or writing the store failed, or the
            staged files changed before the commit.
    """
    files = list_local_files(local_dir)
    for rel in files:
        check_path(rel, source=str(local_dir))
    paths = {rel: os.path.join(local_dir, *rel.split("/")) for rel in files}
    largest_first = sorted(files, key=lambda rel: -os.path.getsize(paths[rel]))
    with DirectoryWriter(store, prefix, kind=kind, meta=meta) as w:
        workers = min(store.files_in_flight, len(files))
        if workers <= 1:
            for rel in largest_first:
                w.put_file(rel, paths[rel])
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="commit-file") as pool:
                copies = [pool.submit(w.put_file, rel, paths[rel]) for rel in largest_first]
                try:
                    for copy in copies:
                        copy.result()
                except BaseException:
                    for copy in copies:
                        copy.cancel()
                    raise  # the pool waits for the copies still running first
        return w.commit()


def delete_directory(store: Store, prefix: str) -> None:
    """Delete a directory, ``MANIFEST.json`` first, so that a half-deleted
    directory is never read as committed."""
    store.delete(join(prefix, MANIFEST))
    store.delete_prefix(prefix)

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

Pointers (step 4) live in :mod:`registry.protocol.pointer`; deletion in :func:`delete_directory`.
"""

from __future__ import annotations

import errno
import os
import stat
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from registry.rules import limits
from registry.host import interrupt
from registry.rules import numbers
from registry.protocol.claim import Claim, ClaimLost
from registry.errors import (
    CommitConflictError,
    ObjectExistsError,
    RegistryError,
    StorageError,
    UnsafeEntryError,
)
from registry.protocol.hashing import HashingWriter
from registry.protocol.layout import CLAIM_SUFFIX, TMP_MARK, claim_key, staging_prefix  # noqa: F401 (re-exported)
from registry.protocol.manifest import (
    MANIFEST,
    FileEntry,
    Manifest,
    check_path,
    list_local_files,
)
from registry.obs.progress import NULL, Progress
from registry.host.sourcecheck import LocalState, check_local
from registry.host.sourcedir import SourceRule
from registry.store import Store, join
from registry.store.translate import translate, translated



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
        progress: told the bytes of every write as they are written and each
            file as it is complete (registry.obs.progress).

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
                 conflict_error: type[CommitConflictError] = CommitConflictError,
                 progress: Progress = NULL) -> None:
        self.store = store
        self.progress = progress
        self.prefix = prefix.strip("/")
        self.kind = kind
        self.meta = meta
        self.entries: dict[str, FileEntry] = {}
        #: relpath -> the version token (ETag) the store gave our write, where it gives one.
        self._tokens: dict[str, str] = {}
        self.manifest: Manifest | None = None
        self._error = conflict_error
        self._sole = sole_writer
        self._claim = claim_key(self.prefix)
        store.ensure_root()  # the first writer of a new local store creates it
        if store.exists(join(self.prefix, MANIFEST)):
            raise self._conflict("already committed")
        self._lease: Claim | None = None
        if store.atomic_rename:
            self.staging = staging or staging_prefix(self.prefix, uuid.uuid4().hex[:12])
            # The staging directory's owner, for gc: never removed while live.
            # An interrupt while the claim is taken waits until it is recorded
            # here (interrupt.deferred), so that it can be released.
            try:
                with interrupt.deferred():
                    self._lease = self._take_claim(claim_key(self.staging))
                if sole_writer:
                    store.delete_prefix(self.staging)
            except BaseException:  # interrupted before `with` could clean up
                if self._lease is not None:
                    self._lease.release()
                raise
        else:
            self.staging = self.prefix
            self._claim_object_store()

    def _conflict(self, why: str) -> CommitConflictError:
        return self._error(f"{self.store.url_of(self.prefix)}: {why}", path=self.prefix)

    def _take_claim(self, key: str) -> Claim:
        """Claim ``key`` for this writer (see :mod:`registry.protocol.claim`)."""
        claim = Claim(self.store, key)
        try:
            claim.take(force=self._sole)
        except ObjectExistsError as e:
            state = getattr(e, "state", None)
            who = state.describe() if state is not None else "it keeps changing"
            raise self._conflict(
                f"claimed by another writer ({who}); if that writer is gone, "
                f"`registry gc --store {self.store.url} --break-claims` removes its claim"
            ) from None
        return claim

    def _claim_object_store(self) -> None:
        try:
            with interrupt.deferred():  # an interrupt waits until the claim is recorded
                self._lease = self._take_claim(self._claim)
            # Re-check under the claim: a writer may have committed and released
            # its claim between our first check and our create.
            if self.store.exists(join(self.prefix, MANIFEST)):
                raise self._conflict("already committed")
            self.store.delete_prefix(self.prefix)  # leftovers of a crashed writer
        except BaseException:  # the conflict, or interrupted before `with` could clean up
            if self._lease is not None:
                self._lease.release()
            raise

    # -- writing ---------------------------------------------------------------

    @contextmanager
    def open(self, relpath: str, *, size: int | None = None) -> Iterator[HashingWriter]:
        """Open ``relpath`` for a streaming write, hashed while written.

        Raises:
            UnsafePathError: ``relpath`` breaks the path rules.
            ValueError: ``relpath`` was already written.
        """
        check_path(relpath, source=self.store.url_of(self.prefix))
        if relpath in self.entries:
            raise ValueError(f"{relpath}: written twice")
        key = join(self.staging, relpath)
        if self._lease is not None and not self.store.atomic_rename:
            try:
                self._lease.check()
            except ClaimLost:
                raise self._conflict("this writer lost its claim to another writer (its "
                                     "lease lapsed); it writes nothing more") from None
        try:
            # A conditional create: a writer that lost its claim can never
            # replace a file of the directory another writer now owns.
            with self.store.open_write(key, exclusive=True, size=size) as raw:
                w = HashingWriter(raw, blake3=self.kind == "release",
                                  on_bytes=self.progress.advance)
                yield w
        except RegistryError:
            raise
        except OSError as e:  # disk full, I/O error: one clear error naming the file
            raise translate(e, self.store.url_of(key)) from e
        token = getattr(raw, "etag", None)
        if token:
            self._tokens[relpath] = token
        self.entries[relpath] = FileEntry(relpath, w.size, w.sha256, w.pieces, w.blake3)
        self.progress.file_done(relpath, w.size)

    def write_bytes(self, relpath: str, data: bytes) -> FileEntry:
        """Write a small file whole; returns its manifest entry."""
        with self.open(relpath) as w:
            w.write(data)
        return self.entries[relpath]

    def write_json(self, relpath: str, doc: Any) -> FileEntry:
        """Write a JSON document (UTF-8, 2-space indent, trailing newline)."""
        return self.write_bytes(relpath, (numbers.dumps(doc, indent=2, ensure_ascii=False)
                                          + "\n").encode())

    def put_file(self, relpath: str, local_path: str | os.PathLike[str]) -> FileEntry:
        """Copy a local file in, streaming, hashing each chunk as it passes
        (see :meth:`HashingWriter.copy_from`). ``local_path``'s last component
        is opened without following a link (callers resolve a source
        directory's links first, registry.host.sourcedir).

        Raises:
            SourceChangedError: the file's size, mtime, ctime or inode changed
                while it was copied (registry.host.sourcecheck); the partial copy
                is discarded with the rest of the directory.
            UnsafeEntryError: it is a link, FIFO, socket or device.
        """
        path = os.fspath(local_path)
        with translated(path):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
                raise UnsafeEntryError(f"{path}: a symbolic link; a source file is opened "
                                       "as the file it is", key=path) from None
            before = LocalState.of(os.fstat(fd))
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise UnsafeEntryError(f"{path}: not a regular file (a FIFO, socket or device "
                                       "cannot be part of a model directory)", key=path)
            os.set_blocking(fd, True)
            src = os.fdopen(fd, "rb", buffering=0)
        with src, self.open(relpath, size=before.size) as w:
            copied = w.copy_from(src)
            check_local(path, before, src.fileno(), copied)
        return self.entries[relpath]

    # -- committing ------------------------------------------------------------

    def check(self) -> None:
        """Raise what :meth:`commit` would raise for the manifest itself
        (UnsafePathError, ManifestError: a bound, the schema), writing nothing:
        checked before taking what cannot be given back (a release's sequence)."""
        Manifest.build(self.kind, self.entries.values(), **self.meta)

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
        # An interrupt (SIGINT, SIGTERM) waits until the commit marker is
        # written and noted, or the writer aborted: a commit is never left
        # unreported (interrupt.note_commit, issue 47 item 4).
        with interrupt.deferred():
            try:
                if self._lease is not None and not store.atomic_rename:
                    # Still ours? (a lapsed lease was taken over) On rename stores
                    # the staging directory is this writer's alone and the rename
                    # fails rather than replace a commit, so no write is spent
                    # there: on a nearly full disk it would fail before the manifest.
                    try:
                        self._lease.renew()
                    except ClaimLost:
                        raise self._conflict("this writer lost its claim to another writer "
                                             "(its lease lapsed); nothing was committed") from None
                self._check_staged()
                if store.atomic_rename:
                    # Every folder the files made (evals/, heads/, dist_ckpt/...),
                    # deepest first, before the manifest: its entries must not
                    # vanish in a power loss once the manifest says they exist.
                    for folder in _folders_of(self.entries):
                        store.fsync_dir(join(self.staging, folder))
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
                    if getattr(store, "single_writer", False):
                        self._read_back_unguarded(data)
            except BaseException as exc:
                self._abort_after(exc)
                raise
            self.manifest = manifest
            interrupt.note_commit(self.commit_record())
            if self._lease is not None:
                self._lease.release()
        return manifest

    def commit_record(self) -> dict[str, Any]:
        """What was committed, for a report after an interrupt: ``kind``,
        ``url``, ``manifest_sha256``, ``files``, ``bytes`` and the manifest's
        ids (``model_id``/``version`` or ``run_id``/``step``)."""
        assert self.manifest is not None
        m = self.manifest
        ids = {k: self.meta[k] for k in ("model_id", "version", "run_id", "step")
               if k in self.meta}
        return {"kind": self.kind, **ids, "url": self.store.url_of(self.prefix),
                "manifest_sha256": m.digest, "files": len(m.files), "bytes": m.total_size}

    def _check_staged(self) -> None:
        """The staged files must be exactly those written, with their sizes:
        a directory another process emptied meanwhile (``registry gc`` with
        a short ``--older-than``, say) fails the commit instead of being
        committed with files missing. One listing; no file is read.

        On object stores the listing's ETags are read back too: each must be
        the one the server gave this writer's own write. Nothing here rests on
        a conditional CompleteMultipartUpload being atomic (it is not on
        SeaweedFS, LocalStack or Ceph RGW: two racing completions can both
        succeed, issue 34): a writer whose lapsed claim was taken over and
        whose completion landed over the new owner's file is caught here,
        before the manifest points at anything.

        Raises:
            CommitConflictError: another writer's bytes are at a file.
            StorageError: files missing, unexpected or resized.
        """
        where = self.staging if self.store.atomic_rename else self.prefix
        listed = self.store.walk_versions(where)
        staged = {path: size for path, (size, _) in listed.items()}
        expected = {e.path: e.size for e in self.entries.values()}
        if staged == expected:
            replaced = sorted(p for p, token in self._tokens.items()
                              if listed[p][1] is not None and listed[p][1] != token)
            if replaced:
                raise self._conflict(
                    f"another writer's bytes are at {', '.join(replaced[:3])} (read back "
                    "before the commit: the object is not the one this writer completed; "
                    "the server let a second writer complete over it); nothing was committed")
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

    def _read_back_unguarded(self, data: bytes) -> None:
        """Under the single-writer opt-out (a server whose conditions are
        ignored) nothing stops a second writer of the same prefix: read back
        the manifest and the files' ETags after the commit, and fail loudly
        when another writer's bytes are there (docs/s3-servers.md says what
        can be lost).

        Raises:
            CommitConflictError: the committed manifest or a file is not ours.
        """
        try:
            there = self.store.read_bytes(join(self.prefix, MANIFEST),
                                          limit=limits.MAX_MANIFEST_BYTES)
        except FileNotFoundError:
            there = b""
        listed = self.store.walk_versions(self.prefix)
        replaced = sorted(p for p, token in self._tokens.items()
                          if p not in listed or (listed[p][1] not in (None, token)))
        if there != data or replaced:
            what = ("its MANIFEST.json is another writer's" if there != data else
                    f"another writer's bytes are at {', '.join(replaced[:3])}")
            raise self._conflict(
                f"another writer published here at the same time: {what} (read back after "
                "the commit; REGISTRY_S3_SINGLE_WRITER=1 turns off the guard that stops a "
                "second writer). What is committed there may not verify: check it with "
                "`registry verify`; this writer's release did not land as written")

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
        lease = self._lease
        if lease is not None and not self.store.atomic_rename:
            try:
                # Still ours? (compare-and-swap on the claim) A writer whose
                # lapsed claim was taken over touches nothing of the directory.
                lease.renew()
            except ClaimLost:
                return
        # (A staging directory is writer-unique: removing it needs no check,
        # and must not cost a write on a full disk.)
        if self.store.atomic_rename:
            self.store.delete_prefix(self.staging)
        elif not self.store.exists(join(self.prefix, MANIFEST)):
            self.store.delete_prefix(self.prefix)
        if lease is not None:
            lease.release()
            self._lease = None

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


def _folders_of(paths: Iterator[str] | Any) -> list[str]:
    """Every folder above the given relative file paths, deepest first."""
    folders = set()
    for path in paths:
        parts = path.split("/")[:-1]
        folders.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return sorted(folders, key=lambda f: (-f.count("/"), f))


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
        UnsafeEntryError: a symlink leads out of ``local_dir`` (registry.host.sourcedir).
        SourceChangedError: a file changed while it was copied (nothing committed).
        InsufficientSpaceError: the store's disk filled up (nothing committed).
        StorageError: reading the source or writing the store failed, or the
            staged files changed before the commit.
    """
    rule = SourceRule(os.fspath(local_dir))
    files = list_local_files(local_dir, rule=rule)
    for rel in files:
        check_path(rel, source=str(local_dir))
    # links inside the directory resolved once more (registry.host.sourcedir)
    paths = {rel: rule.check(os.path.join(local_dir, *rel.split("/"))) for rel in files}
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

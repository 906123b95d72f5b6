"""A verifying mirror: ``registry serve --mirror-cache PATH`` in front of a remote store.

The mirror's cache is a pull cache (registry.pull.cache): a file asked for
the first time is downloaded from the store once by the pull's own
``fetch`` (hashed while it streams, parallel ranges where they pay, checked
against the manifest, fsynced, then linked into ``blobs/sha256/<hex>``), and
every request for it, from any host of the rack, is served from that blob.
A file the cache's disk cannot hold is refused before anything is fetched
(:meth:`MirrorSource.check_space`: 507 through registry.web.failure); a fill
that failed leaves either nothing or a partial with its verified pieces,
which the next fill of that blob in this process takes over
(registry.pull.resume), and temp files of dead processes are removed at
start.
Concurrent requests for one blob share one download: a per-digest lock in
the process, and a file lock under ``<cache>/locks/`` between processes
sharing the cache. Each release served is recorded (``records/``), with a
lease held while its blob downloads, so ``registry cache ls / prune / verify
--cache PATH`` see and bound the mirror's cache like any pull cache.

A blob is sent only while its stat stamp is the one recorded when it was
verified (checked on the open descriptor, so what is checked is what is
sent); a changed blob is re-hashed before it is sent, and dropped and
fetched again when it no longer verifies.

Cost: a request for a file being filled gets each piece as soon as that
piece has verified (:meth:`MirrorSource.live`, registry.web.filling), so the
first byte of a cold large file waits for one piece, not the whole file (a
file without piece states waits for the whole file); every later request is
a read of the local disk. Requests waiting on a fill wait on a future, not
in a request thread, so a stampede on a cold file leaves the server's
threads to the other routes.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from filelock import FileLock

from registry.errors import InsufficientSpaceError, IntegrityError
from registry.protocol.manifest import FileEntry, Manifest
from registry.obs.metrics import mirror_cache
from registry.pull.cache import Cache
from registry.pull.download import fetch
from registry.pull.records import (
    PullRecord,
    cache_lock,
    now_rfc3339,
    pulling,
    read_records,
    write_record,
)
from registry.pull.stamps import stamp
from registry.store import Store
from registry.web.filling import LiveFill, streamable
from registry.web.hubfiles import CHUNK

#: parallel byte ranges one large file may be fetched in
RANGES = 4
#: files filled at once (each on a thread of the mirror's own, not a request's)
FILLS = 8
#: bytes kept free on the cache's disk beyond a file being fetched (records, locks)
RESERVE = 1 << 20


def _hash_fd(fd: int) -> str:
    h = hashlib.sha256()
    pos = 0
    while block := os.pread(fd, CHUNK, pos):
        h.update(block)
        pos += len(block)
    return h.hexdigest()


class MirrorSource:
    """Verified bytes from a local cache of the store's files (the module docstring).

    Args:
        store: the store fronted (any backend; S3 is the point).
        cache: the cache directory (created on first use).
        on_store_bytes: called with the byte count of each block fetched
            from the store.

    Raises:
        StorageError: the cache directory cannot be used.
    """

    def __init__(self, store: Store, cache: str | os.PathLike[str], *,
                 on_store_bytes: Callable[[int], None] | None = None) -> None:
        self.store = store
        self.cache = Cache(cache)
        (self.cache.root / "locks").mkdir(exist_ok=True)
        self._count = on_store_bytes or (lambda n: None)
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._ranges = ThreadPoolExecutor(RANGES * 4, thread_name_prefix="mirror-range")
        self._recorded: set[str] = set()
        self._fills: dict[str, Future[Path]] = {}
        self._live: dict[str, LiveFill] = {}
        self._fill_pool = ThreadPoolExecutor(FILLS, thread_name_prefix="mirror-fill")
        # temp files of fills whose process died (never a resumable partial)
        self.cache.clean_stale()

    def _lock(self, sha256: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(sha256, threading.Lock())

    def _record(self, manifest: Manifest) -> None:
        """Note (at most once a process per release) that the mirror holds this
        release, so cache ls/prune count it; ``last_pulled`` is when it was
        first served by this process."""
        if manifest.digest in self._recorded:
            return
        when = now_rfc3339()
        with cache_lock(self.cache):
            prev = read_records(self.cache).get(manifest.digest)
            rec = PullRecord.of_manifest(manifest, when=when)
            if prev is not None:
                rec = PullRecord(rec.model_id, rec.version, rec.manifest_sha256, rec.files,
                                 prev.first_pulled, when, prev.targets)
            write_record(self.cache, rec)
        self._recorded.add(manifest.digest)

    def blob(self, prefix: str, entry: FileEntry, manifest: Manifest, *,
             live: LiveFill | None = None) -> Path:
        """The verified blob of ``entry``, downloaded first if the cache lacks it
        (each piece reported to ``live`` as it verifies).

        Raises:
            IntegrityError: the store's bytes differ from the manifest (nothing kept).
            ObjectNotFoundError, StorageError, InsufficientSpaceError: as the pull's fetch.
        """
        self._record(manifest)
        path = self.cache.blob(entry.sha256)
        if self.cache.has(entry.sha256, entry.size):
            mirror_cache(hit=True)
            return path
        mirror_cache(hit=False)
        self.check_space(entry)
        with self._lock(entry.sha256), \
                FileLock(str(self.cache.root / "locks" / f"{entry.sha256}.lock")):
            if self.cache.has(entry.sha256, entry.size):
                return path
            self.check_space(entry)
            with pulling(self.cache, manifest):
                fetch(self.store, prefix, entry, self.cache, ranged_pool=self._ranges,
                      inflight=RANGES, progress=self._count, resume_own=True,
                      on_piece=None if live is None else live.verified)
        return path

    def fill(self, prefix: str, entry: FileEntry, manifest: Manifest) -> Future[Path]:
        """The verified blob of ``entry`` as a future: done at once when the
        cache holds it, else one fill per blob on the mirror's own fill
        threads, shared by every request that asks meanwhile (a request
        waits on it without holding a request thread: registry.web.hub).

        The future raises what :meth:`blob` raises; a file the disk cannot
        hold fails at once (:meth:`check_space`), nothing fetched.
        """
        done: Future[Path] = Future()
        if self.cache.has(entry.sha256, entry.size):
            self._record(manifest)
            done.set_result(self.cache.blob(entry.sha256))
            return done
        try:
            self.check_space(entry)
        except InsufficientSpaceError as e:
            done.set_exception(e)
            return done
        with self._guard:
            running = self._fills.get(entry.sha256)
            if running is None:
                live = LiveFill(entry) if streamable(entry) else None
                if live is not None:
                    self._live[entry.sha256] = live
                running = self._fills[entry.sha256] = self._fill_pool.submit(
                    self._fill_one, prefix, entry, manifest, live)
                running.add_done_callback(lambda _f: self._filled(entry.sha256, _f))
        return running

    def live(self, sha256: str) -> LiveFill | None:
        """The running fill of blob ``sha256`` whose verified pieces may be
        sent before it ends (registry.web.filling), or None: none runs, or
        its file is not streamable (no piece states)."""
        with self._guard:
            return self._live.get(sha256)

    def _fill_one(self, prefix: str, entry: FileEntry, manifest: Manifest,
                  live: LiveFill | None) -> Path:
        try:
            path = self.blob(prefix, entry, manifest, live=live)
        except BaseException as e:
            if live is not None:
                live.end(e)
            raise
        if live is not None:
            live.end(None)
        return path

    def _filled(self, sha256: str, fut: Future[Path]) -> None:
        with self._guard:
            if self._fills.get(sha256) is fut:
                del self._fills[sha256]
                self._live.pop(sha256, None)

    def check_space(self, entry: FileEntry) -> None:
        """Refuse, before anything is fetched, a file the cache's disk cannot hold.

        Raises:
            InsufficientSpaceError: fewer than ``entry.size`` bytes plus
                :data:`RESERVE` are free for this user on the cache's disk
                (the message names the cache, the file and both sizes;
                ``needed`` and ``available`` carry them).
        """
        try:
            st = os.statvfs(self.cache.root)
        except OSError:
            return  # cannot tell: the fill itself reports a full disk
        free = st.f_bavail * st.f_frsize
        needed = entry.size + RESERVE
        if free < needed:
            raise InsufficientSpaceError(
                f"mirror cache {self.cache.root}: {entry.path} needs {needed} bytes "
                f"({entry.size} and {RESERVE} spare), {free} are free; free space there or "
                f"bound the cache (registry cache prune --cache {self.cache.root} "
                "--max-size ...)", key=str(self.cache.root), needed=needed, available=free)

    def verified(self, prefix: str, entry: FileEntry, manifest: Manifest) -> int:
        """An open descriptor (the caller's to close) of the blob of
        ``entry`` whose bytes are verified now: fetched first if the cache
        lacks it, re-hashed if its stat stamp changed since it was verified
        (registry.web.hub sends it with registry.web.sending, zero-copy).

        Raises:
            IntegrityError: the store's bytes, or the cached copy twice over,
                differ from the manifest.
            ObjectNotFoundError, StorageError, InsufficientSpaceError: as :meth:`blob`.
        """
        for _attempt in (1, 2):
            path = self.blob(prefix, entry, manifest)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                now = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                if st.st_size == entry.size and self.cache.stamps.blob_unchanged(path) and \
                        stamp(path) == now:
                    return fd
                if st.st_size == entry.size and _hash_fd(fd) == entry.sha256:
                    self.cache.stamps.record_blob(path)
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
            self.cache.drop(entry.sha256)  # changed since verified: fetch it again
        raise IntegrityError(entry.path, reason="the mirror's cached copy changed twice "
                                                "while it was being served")

    def open(self, prefix: str, entry: FileEntry, start: int, end: int, *,
             manifest: Manifest) -> Iterator[bytes]:
        fd = self.verified(prefix, entry, manifest)
        return self._stream(fd, start, end)

    @staticmethod
    def _stream(fd: int, start: int, end: int) -> Iterator[bytes]:
        try:
            pos = start
            while pos < end:
                block = os.pread(fd, min(CHUNK, end - pos), pos)
                if not block:
                    return
                yield block
                pos += len(block)
        finally:
            os.close(fd)

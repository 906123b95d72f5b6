"""Fetching one manifest entry into the cache: hashed while downloading, verified,
then linked into ``blobs/sha256/<hex>``.

Every file starts as one streaming GET; each block is written at its offset
and hashed on a helper thread (hashlib releases the GIL) while the next block
arrives. A file over ``RANGE_THRESHOLD`` bytes is split when that pays, which
is measured, not assumed: after ``PROBE_SECONDS`` of streaming, the stream's
rate says how long the rest would take, and its time to first byte what one
more request costs. When the rest would take over ``MIN_SPLIT_SECONDS`` and
over ``SPLIT_FACTOR`` request set-up times per range, the tail is cut into up
to ``workers`` byte ranges fetched in parallel, each written at its offset
(``os.pwrite``) as it streams, while the first stream finishes its own piece.
The sha256 is still computed in file order: after its piece, the file's thread
hashes the next ranges back from the temp file (page cache) as they land.

On a real object store one stream is limited to tens of MB/s and a request
costs tens of milliseconds, so large files are split. A server that reads the
whole object for every range request (moto: about 0.5 s per range of a
768 MiB object) answers its first byte late, and local disk streams fast:
nothing is split there, so ranges never make a pull slower.

Memory: at most ``HASH_DEPTH + 1`` blocks of ``STREAM_CHUNK`` bytes per file
and one block per range.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

from registry.protocol import fastdigest
from registry.protocol import pieces as pc
from registry.errors import InsufficientSpaceError, IntegrityError
from registry.protocol.manifest import FileEntry
from registry.obs.tracing import in_context, traced
from registry.pull import resume
from registry.pull.cache import Cache
# HASH_DEPTH: named in this module's docstring, so importable here too
from registry.pull.piecechecks import HASH_DEPTH, Hasher, PieceChecks  # noqa: F401
# bound to this module's names so tests can patch them here (test_fastdigest)
from registry.pull.localcopy import copy_local as _copy_local
from registry.pull.localcopy import copy_local_b3 as _copy_local_b3
from registry.pull import s3fetch
from registry.store import Store, join
from registry.protocol.verify import default_workers

#: files larger than this (bytes) may be split into parallel byte ranges.
RANGE_THRESHOLD = 64 * 1024 * 1024
#: the smallest range a file is cut into, bytes.
MIN_SEGMENT = 16 * 1024 * 1024
#: block size of every stream, bytes.
STREAM_CHUNK = 4 * 1024 * 1024
#: seconds a stream runs before the split is decided.
PROBE_SECONDS = 0.5
#: a stream with less left than this (seconds at its rate) is never split.
MIN_SPLIT_SECONDS = 1.0
#: each range must take at least this many times one request's set-up time.
SPLIT_FACTOR = 10.0
Progress = Callable[[int], None]
_ALIGN = 1024 * 1024


def plan_split(remaining: int, rate: float, ttfb: float, workers: int) -> int:
    """How many pieces to cut the rest of a stream into (1: do not split).

    Args:
        remaining: bytes still to fetch.
        rate: the stream's rate so far, bytes per second.
        ttfb: seconds from the stream's request to its first byte: what one
            more request costs.
        workers: the most pieces (parallel requests) allowed.
    """
    if workers < 2 or rate <= 0 or remaining < 2 * MIN_SEGMENT:
        return 1
    left = remaining / rate
    if left < MIN_SPLIT_SECONDS:
        return 1
    by_cost = workers if SPLIT_FACTOR <= 0 else int(left / (SPLIT_FACTOR * max(ttfb, 1e-4)))
    return max(1, min(workers, remaining // MIN_SEGMENT, by_cost))


def cut(start: int, end: int, pieces: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut into at most ``pieces`` contiguous ranges whose
    lengths are multiples of 1 MiB (of MIN_SEGMENT if that is smaller)."""
    align = min(_ALIGN, MIN_SEGMENT)
    step = -(-(end - start) // pieces)
    step = max(align, -(-step // align) * align)
    return [(s, min(end, s + step)) for s in range(start, end, step)]


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


class _Pieces:
    """The byte ranges of one file fetched by other threads, and how far each got."""

    def __init__(self, bounds: list[tuple[int, int]]) -> None:
        self.bounds = bounds
        self.landed = [0] * len(bounds)
        self.finished = [False] * len(bounds)
        self.longer = False  # the object has bytes past the manifest's size
        self.error: BaseException | None = None
        self.stop = False
        self.cond = threading.Condition()
        self.futures: list[Future[None]] = []

    def fetch(self, i: int, store: Store, key: str, fd: int, size: int,
              progress: Progress) -> None:
        start, end = self.bounds[i]
        pos = start
        try:
            # The last range asks for one byte more: is the object longer?
            for block in store.iter_range(key, start, end + (end == size), STREAM_CHUNK):
                if self.stop:
                    return
                view = memoryview(block)
                if len(view) > end - pos:
                    view = view[:end - pos]
                    self.longer = True
                _pwrite_all(fd, view, pos)
                pos += len(view)
                progress(len(view))
                with self.cond:
                    self.landed[i] = pos - start
                    self.cond.notify_all()
                if self.longer:
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the file's thread
            with self.cond:
                self.error = self.error or e
        finally:
            with self.cond:
                self.finished[i] = True
                self.cond.notify_all()

    def hash_in_order(self, fd: int, hasher: Hasher) -> int:
        """Hash every range in file order as it lands; returns the bytes landed."""
        got = 0
        for i, (start, end) in enumerate(self.bounds):
            pos = start
            while True:
                with self.cond:
                    while (start + self.landed[i] <= pos and not self.finished[i]
                           and self.error is None):
                        self.cond.wait()
                    if self.error is not None:
                        raise self.error
                    upto, finished = start + self.landed[i], self.finished[i]
                while pos < upto:
                    block = os.pread(fd, min(STREAM_CHUNK, upto - pos), pos)
                    hasher.update(block)
                    pos += len(block)
                if finished and pos >= start + self.landed[i]:
                    break
            got += pos - start
            if pos < end:  # the object is shorter: stop here, the size check fails
                break
        return got

    def check_as_landed(self, stream_end: int, checks: PieceChecks) -> int:
        """Start each piece's check as its ranges land, until every range is
        done; returns the bytes landed in file order from ``stream_end``."""
        while True:
            with self.cond:
                if self.error is not None:
                    raise self.error
                spans = [(0, stream_end)] + [(s, s + n) for (s, _e), n in
                                              zip(self.bounds, self.landed, strict=True)]
                done = all(self.finished)
                if not done:
                    self.cond.wait()
            checks.landed(spans)
            if done:
                break
        got = 0
        for (start, end), n in zip(self.bounds, self.landed, strict=True):
            got += n
            if start + n < end:
                break
        return got

    def close(self) -> None:
        """Stop the ranges and wait for them: nothing writes to the file after."""
        self.stop = True
        wait(self.futures)  # fetch() records its errors; none escape


def _download(store: Store, key: str, entry: FileEntry, fd: int, hasher: Hasher, *,
              ranged_pool: ThreadPoolExecutor, workers: int, threshold: int,
              progress: Progress, checks: PieceChecks | None = None) -> int:
    """Stream ``key`` into ``fd``, splitting its tail when that pays; returns
    the bytes received (more than ``entry.size`` when the object is longer).
    Each block goes to ``hasher`` in order, or, with ``checks``, each piece
    is checked once it has landed."""
    size = entry.size
    end = size  # where this stream stops (lowered by a split)
    pos = 0
    decided = size <= threshold or workers < 2
    pieces: _Pieces | None = None
    t0 = time.perf_counter()
    first: float | None = None
    ttfb = 0.0
    stream = store.iter_read(key, STREAM_CHUNK)
    try:
        try:
            for block in stream:
                now = time.perf_counter()
                if first is None:
                    first, ttfb = now, now - t0
                view = memoryview(block)
                if pieces is not None and len(view) > end - pos:
                    view = view[:end - pos]  # the rest is the ranges'
                _pwrite_all(fd, view, pos)
                if checks is None:
                    hasher.update(view)
                pos += len(view)
                progress(len(view))
                if pos > size or (pieces is not None and pos >= end):
                    break
                if checks is not None:
                    checks.landed([(0, pos)])
                if not decided and now - first >= PROBE_SECONDS:
                    decided = True
                    k = plan_split(size - pos, pos / max(now - t0, 1e-6), ttfb, workers)
                    if k >= 2:
                        bounds = cut(pos, size, k)
                        end = bounds[0][1]
                        pieces = _Pieces(bounds[1:])
                        pieces.futures = [
                            ranged_pool.submit(in_context(pieces.fetch), i, store, key, fd,
                                               size, progress)
                            for i in range(len(pieces.bounds))]
        finally:
            stream.close()  # drops the connection of a stream cut short
        if pieces is None or pos < end:
            if checks is not None and pos == size:
                checks.landed([(0, pos)])
            return pos
        if checks is not None:
            got = pos + pieces.check_as_landed(pos, checks)
        else:
            got = pos + pieces.hash_in_order(fd, hasher)
        return got + pieces.longer
    finally:
        if pieces is not None:
            pieces.close()


@traced("registry.fetch", child_only=True)
def fetch(store: Store, prefix: str, entry: FileEntry, cache: Cache, *,
          ranged_pool: ThreadPoolExecutor, inflight: int, progress: Progress,
          fsync: bool = True, range_threshold: int | None = None,
          verify_pool: ThreadPoolExecutor | None = None, dest: Path | None = None,
          fast_digest: bool = False, resume_own: bool = False,
          on_piece: Callable[[Path, int], None] | None = None) -> int:
    """Download ``entry`` into the cache; returns the bytes transferred.

    With ``dest`` (``pull(blobs=False)``), the file is downloaded straight
    to that new path instead (created exclusively, read-only once verified,
    removed if anything fails) and no blob enters the cache: one write per
    byte.

    An entry with piece states (registry.protocol.pieces) is verified piece by piece
    on ``verify_pool`` (one thread per core) as its pieces land; all pieces
    verified is its sha256 verified. Other entries hash in file order on a
    helper thread while they download. With ``fast_digest`` and ``dest``, an
    entry with a ``blake3`` digest in a local store is copied by the kernel
    and checked by its BLAKE3 on another core instead (registry.protocol.fastdigest:
    only where the manifest itself is trusted, not a signature over the
    sha256; never for a blob, which is named by its sha256).

    Args:
        ranged_pool: threads that fetch byte ranges of large files.
        verify_pool: threads that check pieces (default: one per core, for
            this file only).
        inflight: the most ranges one file is cut into.
        progress: called with each block's byte count as it lands.
        fsync: make the blob durable before it is linked into ``blobs/``.
        range_threshold: files larger than this (bytes) may be split
            (default ``RANGE_THRESHOLD``).
        dest: download here (a path that must not exist) and keep no blob.
        fast_digest: check the entry's ``blake3`` where it has one and the
            store is local.
        resume_own: also resume a partial this process left (the caller
            holds the blob's lock: registry.pull.resume.claim).
        on_piece: called as ``on_piece(temp_path, k)`` on a checking
            thread once piece ``k`` (an entry with piece states, into the
            cache) has landed in ``temp_path`` and verified against the
            manifest; the temp file is unlinked when the fetch ends, so a
            reader opens it at the first call (registry.web.filling).

    Raises:
        IntegrityError: size, sha256 (or blake3) differs from the manifest (nothing is
            placed; the error names the file and both values).
        ObjectNotFoundError: the file is missing from the store.
        InsufficientSpaceError: the disk filled up (the temp file is removed).
    """
    key = join(prefix, entry.path)
    by_pieces = entry.pieces is not None and pc.AVAILABLE
    resumed = (resume.claim(cache, entry, own=resume_own) if dest is None and by_pieces
               else None)
    tmp = resumed[0] if resumed else cache.new_temp(entry.sha256) if dest is None else dest
    log = (resume.PieceLog(tmp, on_add=None if on_piece is None else
                           (lambda k: on_piece(tmp, k)))  # type: ignore[misc]
           if dest is None and by_pieces else None)
    kept = created = keep_partial = False
    threshold = RANGE_THRESHOLD if range_threshold is None else range_threshold
    hasher = Hasher(pipelined=entry.size > STREAM_CHUNK and not by_pieces)
    own_pool = None
    if by_pieces and verify_pool is None:
        verify_pool = own_pool = ThreadPoolExecutor(default_workers(os.cpu_count() or 1),
                                                    thread_name_prefix="pull-pieces")
    try:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        fd = os.open(tmp, flags | (0 if resumed else os.O_TRUNC if dest is None
                                   else os.O_EXCL), 0o644)
        created = True
        checks = (PieceChecks(entry, fd, verify_pool, log)  # type: ignore[arg-type]
                  if by_pieces else None)
        # BLAKE3 only for a file placed straight into a target: a blob is named
        # by its sha256, so a blob is only ever kept after its sha256 was checked
        # (else a forged manifest could plant bytes under another release's digest).
        b3_local = (store.local_path(key) if fast_digest and dest is not None
                    and entry.blake3 is not None and fastdigest.AVAILABLE and entry.size > 0
                    else None)
        local = store.local_path(key) if checks is not None else None
        b3_actual: str | None = None
        fetched = 0
        try:
            got = -1
            if resumed is not None and log is not None:
                got, fetched, bad = resume.fetch_missing(store, key, entry, fd, resumed[1],
                                                pool=verify_pool,  # type: ignore[arg-type]
                                                log=log, progress=progress)
                b3_local = local = None
                actual = entry.sha256
            elif b3_local is not None:
                try:
                    got, b3_actual = _copy_local_b3(b3_local, fd, entry, progress, fsync=fsync)
                except FileNotFoundError:
                    got = -1
                except OSError as e:
                    if e.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS,
                                       errno.EOPNOTSUPP) or os.fstat(fd).st_size:
                        raise
                    got = -1
                if got < 0:
                    b3_local = None  # streamed below, checked by sha256
            elif local is not None and checks is not None:
                try:
                    got = _copy_local(local, fd, entry, checks, progress, fsync=fsync)
                except FileNotFoundError:
                    pass  # the stream below raises the store's own error
                except OSError as e:
                    if e.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS,
                                       errno.EOPNOTSUPP) or os.fstat(fd).st_size:
                        raise
            # the mirror's streaming fill (on_piece) hands out each piece of the
            # temp file in order as it verifies: it keeps the in-order stream
            direct = (s3fetch.reader_for(store)
                      if got < 0 and s3fetch.usable(entry) and on_piece is None else None)
            if direct is not None:
                got, bad, actual = s3fetch.download(direct, store, key, entry, fd,
                                                    pool=ranged_pool, progress=progress,
                                                    log=log, writeback=fsync)
            elif got < 0:
                got = _download(store, key, entry, fd, hasher, ranged_pool=ranged_pool,
                                workers=inflight, threshold=threshold, progress=progress,
                                checks=checks)
            if direct is not None:
                pass  # checked as it landed, each piece from memory (s3fetch)
            elif resumed is not None:
                pass  # checked piece by piece by resume.fetch_missing
            elif b3_local is not None:
                bad = None
                actual = entry.sha256
                if got == entry.size and b3_actual != entry.blake3:
                    bad = IntegrityError(entry.path, expected_size=entry.size, actual_size=got,
                                         reason=f"blake3 {b3_actual}, expected "
                                                f"{entry.blake3} (MANIFEST.json)")
            elif checks is not None:
                bad = checks.first_error() if got == entry.size else None
                actual = entry.sha256
            else:
                bad = None
                actual = hasher.hexdigest()
            if got == entry.size and fsync and bad is None:
                os.fsync(fd)
        finally:
            if checks is not None:
                checks.close()
            os.close(fd)
        if got != entry.size:
            raise IntegrityError(entry.path, expected_size=entry.size, actual_size=got,
                                 reason=f"size {got}{'+' if got > entry.size else ''} bytes, "
                                        f"expected {entry.size}")
        if bad is not None:
            raise bad
        if actual != entry.sha256:
            raise IntegrityError(entry.path, expected_size=entry.size, actual_size=got,
                                 expected_sha256=entry.sha256, actual_sha256=actual)
        os.chmod(tmp, 0o444)
        if log is not None:
            log.remove()
        if resumed is not None:
            got = fetched  # bytes transferred: only what the partial lacked
        if dest is not None:
            kept = True
            return got
        blob = cache.blob(entry.sha256)
        try:
            # link, not replace: a blob another pull placed meanwhile has the same
            # content, and a pull copying from it keeps a stable stamp.
            os.link(tmp, blob)
        except FileExistsError:
            if cache.usable(entry.sha256):
                cache.fresh.add(entry.sha256)  # verified by a pull as it entered
                return got
            # not a regular file of this user's (a folder, a link, another
            # user's file: registry.pull.privacy): repaired by this download
            cache.drop(entry.sha256)
            os.replace(tmp, blob)
        except OSError:  # a filesystem without hardlinks
            os.replace(tmp, blob)
        Path(tmp).unlink(missing_ok=True)  # changes the inode's ctime: stamp after
        cache.stamps.record_blob(blob)
        cache.fresh.add(entry.sha256)
        return got
    except OSError as e:
        if e.errno == 28:
            raise InsufficientSpaceError(f"{tmp}: no space left on device while pulling "
                                         f"{entry.path}", key=str(tmp)) from None
        keep_partial = log is not None and bool(log.have)  # the store failed: resumable
        raise
    except IntegrityError:
        raise
    except BaseException:
        keep_partial = log is not None and bool(log.have)  # interrupted: resumable
        raise
    finally:
        hasher.close()
        if own_pool is not None:
            own_pool.shutdown(wait=True)
        if keep_partial:
            pass  # registry.pull.resume: the next pull of this blob takes it over
        elif dest is None or (created and not kept):
            Path(tmp).unlink(missing_ok=True)
            if log is not None:
                log.remove()

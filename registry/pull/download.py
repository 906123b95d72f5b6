"""Fetching one manifest entry into the cache: hashed while downloading, verified,
then renamed into ``blobs/sha256/<hex>``.

Small files stream in one GET. Files over ``RANGE_THRESHOLD`` bytes are fetched
as parallel byte ranges; the ranges are consumed in order, so the sha256 is
still computed on the fly while the other ranges are in flight. Memory is
bounded by ``RANGE_SIZE * (in-flight ranges)``.
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from registry.errors import IntegrityError, InsufficientSpaceError
from registry.manifest import FileEntry
from registry.pull.cache import Cache
from registry.store import Store, join

RANGE_THRESHOLD = 64 * 1024 * 1024
RANGE_SIZE = 16 * 1024 * 1024
STREAM_CHUNK = 4 * 1024 * 1024

Progress = Callable[[int], None]


def _ranges(size: int) -> list[tuple[int, int]]:
    return [(start, min(size, start + RANGE_SIZE)) for start in range(0, size, RANGE_SIZE)]


def _write_ranged(store: Store, key: str, size: int, f: object, h: object,
                  pool: ThreadPoolExecutor, inflight: int, progress: Progress) -> int:
    got = 0
    pending: deque[Future[bytes]] = deque()
    todo = deque(_ranges(size))
    while todo or pending:
        while todo and len(pending) < inflight:
            start, end = todo.popleft()
            pending.append(pool.submit(store.read_range, key, start, end))
        block = pending.popleft().result()
        h.update(block)  # type: ignore[attr-defined]
        f.write(block)  # type: ignore[attr-defined]
        got += len(block)
        progress(len(block))
        if len(block) == 0:
            break
    return got


def fetch(store: Store, prefix: str, entry: FileEntry, cache: Cache, *,
          ranged_pool: ThreadPoolExecutor, inflight: int, progress: Progress,
          fsync: bool = True, range_threshold: int | None = None) -> int:
    """Download ``entry`` into the cache; returns the bytes transferred.

    Raises:
        IntegrityError: size or sha256 differs from the manifest (nothing is
            placed; the error names the file and both values).
        ObjectNotFoundError: the file is missing from the store.
        InsufficientSpaceError: the disk filled up (the temp file is removed).
    """
    key = join(prefix, entry.path)
    tmp = cache.new_temp(entry.sha256)
    h = hashlib.sha256()
    got = 0
    try:
        with open(tmp, "wb") as f:
            threshold = RANGE_THRESHOLD if range_threshold is None else range_threshold
            if entry.size > threshold:
                got = _write_ranged(store, key, entry.size, f, h, ranged_pool, inflight, progress)
                if got == entry.size:  # the object may be longer than the manifest says
                    got += len(store.read_range(key, entry.size, entry.size + 1))
            else:
                for block in store.iter_read(key, STREAM_CHUNK):
                    h.update(block)
                    f.write(block)
                    got += len(block)
                    progress(len(block))
                    if got > entry.size:
                        break
            if got == entry.size and fsync:
                f.flush()
                os.fsync(f.fileno())
        actual = h.hexdigest()
        if got != entry.size:
            raise IntegrityError(entry.path, expected_size=entry.size, actual_size=got,
                                 reason=f"size {got}{'+' if got > entry.size else ''} bytes, "
                                        f"expected {entry.size}")
        if actual != entry.sha256:
            raise IntegrityError(entry.path, expected_size=entry.size, actual_size=got,
                                 expected_sha256=entry.sha256, actual_sha256=actual)
        os.chmod(tmp, 0o444)
        try:
            # link, not replace: a blob another pull placed meanwhile has the same
            # content, and directories already hardlinked to it stay linked.
            os.link(tmp, cache.blob(entry.sha256))
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hardlinks
            os.replace(tmp, cache.blob(entry.sha256))
        return got
    except OSError as e:
        if e.errno == 28:
            raise InsufficientSpaceError(f"{tmp}: no space left on device while pulling "
                                         f"{entry.path}", key=str(tmp)) from None
        raise
    finally:
        Path(tmp).unlink(missing_ok=True)

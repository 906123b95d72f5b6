"""Copies from a local store into the pull cache by ``copy_file_range``: the kernel
copies page cache to page cache, and the file's pieces or its BLAKE3 are checked as
the bytes land (split from :mod:`registry.pull.download`, whose ``fetch`` picks
these for a ``file://`` store and streams when the kernel cannot).

Errors: OSError before any byte when the kernel cannot copy between the two files
(EXDEV, ENOSYS...): the caller then streams."""

from __future__ import annotations

import errno
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from registry.protocol import fastdigest
from registry.protocol.manifest import FileEntry
from registry.pull.piecechecks import PieceChecks
from registry.store.durable import _SYNC_FILE_RANGE_WRITE, _sync_file_range

Progress = Callable[[int], None]

#: :func:`copy_local`'s bytes per copy_file_range call (four of
#: registry.pull.download's STREAM_CHUNK).
LOCAL_CHUNK = 16 * 1024 * 1024


def copy_local(src: str, fd: int, entry: FileEntry, checks: PieceChecks,
                progress: Progress, *, fsync: bool, chunk: int = LOCAL_CHUNK) -> int:
    """A local store's file into ``fd`` by ``copy_file_range`` (the kernel
    copies page cache to page cache, nothing passes through Python), each
    piece checked once it has landed; returns the bytes copied (one more
    than ``entry.size`` when the file is longer). With ``fsync``, the
    writeback of each chunk is started as it lands (the fsync then has
    less to wait for). Kernels that cannot copy between these files
    (EXDEV...) raise OSError before any byte: the caller streams instead."""
    with open(src, "rb", buffering=0) as f:
        pos = 0
        want = entry.size + 1  # one byte more: is the file longer?
        while pos < want:
            n = os.copy_file_range(f.fileno(), fd, min(chunk, want - pos), pos, pos)
            if not n:
                break
            pos += n
            progress(min(n, max(0, entry.size - (pos - n))))
            checks.landed([(0, min(pos, entry.size))])
            if fsync and _sync_file_range is not None:
                _sync_file_range(fd, pos - n, n, _SYNC_FILE_RANGE_WRITE)
    return pos


#: :func:`copy_local_b3`: bytes per copy_file_range call, and chunks a
#: file's BLAKE3 may lag behind its copy.
B3_CHUNK = 16 * 1024 * 1024
B3_DEPTH = 4


def copy_local_b3(src: str, fd: int, entry: FileEntry, progress: Progress, *,
                   fsync: bool, chunk: int = B3_CHUNK) -> tuple[int, str | None]:
    """A local store's file into the empty file ``fd`` by ``copy_file_range``
    on this thread, while a helper thread computes the BLAKE3
    (registry.protocol.fastdigest) of each chunk as it lands, read back from ``fd``
    (the page cache the kernel just filled) into one reused buffer. The two
    run on two cores. Nothing is mapped: a mapping of the whole file cost a
    page fault per page and address space per byte (issue 43), and a
    buffer of ``chunk`` bytes is all the hash needs.

    Returns:
        ``(bytes copied, blake3 hex)``: one byte more than ``entry.size``
        when the file is longer; the digest is None unless exactly
        ``entry.size`` bytes landed.

    Raises:
        OSError: as ``copy_file_range``; EXDEV/EINVAL/ENOSYS/EOPNOTSUPP
            before any byte (the caller streams instead; ``fd`` is left
            empty).
    """
    size = entry.size
    h = fastdigest.hasher()
    buf = memoryview(bytearray(min(chunk, max(size, 1))))
    pending: deque[Future[None]] = deque()
    pos = 0

    def hash_back(a: int, b: int) -> None:
        """BLAKE3 of ``fd``'s bytes ``[a, b)``, in order (one helper thread)."""
        while a < b:
            n = os.preadv(fd, [buf[:min(len(buf), b - a)]], a)
            if n <= 0:  # cannot happen to a file only this pull writes: fail the digest
                raise OSError(errno.EIO, f"{entry.path}: short read at {a}")
            h.update(buf[:n])
            a += n

    try:
        with open(src, "rb", buffering=0) as f, \
                ThreadPoolExecutor(1, thread_name_prefix="pull-blake3") as hashing:
            try:
                want = size + 1  # one byte more: is the file longer?
                while pos < want:
                    try:
                        n = os.copy_file_range(f.fileno(), fd, min(chunk, want - pos), pos, pos)
                    except OSError:
                        if pos == 0:
                            os.ftruncate(fd, 0)
                        raise
                    if not n:
                        break
                    a, b = pos, min(pos + n, size)
                    pos += n
                    if b > a:
                        pending.append(hashing.submit(hash_back, a, b))
                        progress(b - a)
                    if fsync and _sync_file_range is not None:
                        _sync_file_range(fd, a, n, _SYNC_FILE_RANGE_WRITE)
                    while len(pending) > B3_DEPTH:
                        pending.popleft().result()
            finally:
                wait(list(pending))  # nothing reads the buffer after this
            for done in pending:
                done.result()
    finally:
        pending.clear()
    return pos, (str(h.hexdigest()) if pos == size else None)

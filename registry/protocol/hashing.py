"""Hash while writing: every byte that reaches a store file is hashed once, in order.

:class:`HashingWriter` wraps a file from :meth:`Store.open_write
<registry.store.Store.open_write>`; its ``size`` and ``sha256`` become the
file's manifest entry (DESIGN section 4). :meth:`HashingWriter.copy_from`
copies a local file in by the fastest way the destination allows:

1. direct I/O (local disk, large files): read into aligned buffers, hash each
   on one helper thread while another writes the same buffer with
   ``O_DIRECT``, bypassing the page cache;
2. ``copy_file_range`` (local disk without direct I/O): the kernel copies
   page cache to page cache, each landed chunk hashed back from the
   destination;
3. otherwise (S3, memory, small files): read, hash on a helper thread, write.

In every case the digest is of the bytes handed to the destination, in order.

A local store file also goes direct by itself when written piece by piece
(``_DurableFile.write``, past its first 8 MiB). The copy path keeps its own
direct pipeline because it reads the source straight into the aligned
buffers, one memory copy fewer: a 1 GiB commit took 0.52-0.54 s that way
against 0.58-0.60 s through ``write``.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO

from registry.protocol.manifest import HASH_CHUNK
from registry.protocol.pieces import ChainHasher, Pieces
from registry.host.pools import HelperPool

#: :meth:`HashingWriter.copy_from`: bytes per read, and buffers in rotation
#: (one being read, one being hashed, one being written).
COPY_CHUNK = 1024 * 1024
COPY_DEPTH = 4
#: direct I/O (see HashingWriter.copy_from): files from this size up, bytes per
#: buffer, buffers in rotation (memory: DIRECT_DEPTH * DIRECT_CHUNK per file).
DIRECT_MIN = 8 * 1024 * 1024
DIRECT_CHUNK = 8 * 1024 * 1024
DIRECT_DEPTH = 4

#: writes larger than this overlap hashing and writing (see HashingWriter.write).
PIPELINE_CHUNK = 8 * 1024 * 1024
_WRITERS = HelperPool(4, "hash-write")


def _nothing(n: int) -> None:
    pass


class HashingWriter:
    """Wraps a binary writer; hashes and counts every byte written through it.

    Used to hash files while they are written (one pass over the bytes).
    """

    def __init__(self, raw: IO[bytes], *, blake3: bool = False,
                 on_bytes: Callable[[int], None] | None = None) -> None:
        self.raw = raw
        self.size = 0
        self._h = ChainHasher(blake3=blake3)
        #: told each block's byte count as it is written (registry.obs.progress)
        self._told = on_bytes or _nothing

    def write(self, data: bytes | memoryview) -> int:
        """Hash and write ``data``. A write over PIPELINE_CHUNK bytes (a whole
        tensor, say) is cut into chunks, each written on a helper thread while
        this one hashes it; it returns once every chunk is written."""
        view = memoryview(data).cast("B")
        n = len(view)
        if n <= PIPELINE_CHUNK:
            self._h.update(view)
            self.raw.write(view)
        else:
            for start in range(0, n, PIPELINE_CHUNK):
                piece = view[start:start + PIPELINE_CHUNK]
                written = _WRITERS.submit(self.raw.write, piece)
                self._h.update(piece)
                written.result()
        self.size += n
        self._told(n)
        return n

    def copy_from(self, src: IO[bytes], *, chunk: int = COPY_CHUNK,
                  depth: int = COPY_DEPTH) -> int:
        """Copy the readable binary stream ``src`` to its end through this writer.

        The same bytes reach ``raw`` and the digest as with :meth:`write`, in
        order. A local file into a local store goes by direct I/O
        (:meth:`_copy_direct`, files of ``DIRECT_MIN`` bytes or more) or
        else by ``copy_file_range`` (:meth:`_copy_in_kernel`); anything else
        through user space, where the sha256 of each chunk runs on a helper
        thread while the caller's thread reads the next chunk and writes this
        one (hashlib releases the GIL, so hashing and copying overlap on two
        cores). Memory: ``depth`` buffers of ``chunk`` bytes in user space,
        ``DIRECT_DEPTH`` of ``DIRECT_CHUNK`` bytes by direct I/O.

        Returns:
            The number of bytes copied.

        Raises:
            OSError: reading ``src`` or writing failed (ENOSPC, EIO); the
                caller discards the partial file.
            StorageError: the store's writer failed (S3).

        Notes:
            A buffer is reused only once its hash is done and its write has
            returned (file objects do not keep the buffers they are given).
        """
        copied = self._copy_direct(src)
        if copied is None:
            copied = self._copy_in_kernel(src)
        if copied is not None:
            return copied
        bufs = [bytearray(chunk) for _ in range(depth)]
        readinto = src.readinto  # type: ignore[attr-defined]
        first = readinto(bufs[0])
        if not first:
            return 0
        if first < chunk:  # a small file: a helper thread is not worth starting
            self.write(memoryview(bufs[0])[:first])
            while n := readinto(bufs[0]):
                self.write(memoryview(bufs[0])[:n])
            return self.size
        pending: deque[Future[None]] = deque()
        with ThreadPoolExecutor(1, thread_name_prefix="sha256") as hasher:
            n, i = first, 0
            try:
                while n:
                    view = memoryview(bufs[i % depth])[:n]
                    pending.append(hasher.submit(self._h.update, view))
                    self.raw.write(view)
                    self.size += n
                    self._told(n)
                    i += 1
                    if len(pending) == depth:  # the next buffer is free again
                        pending.popleft().result()
                    n = readinto(bufs[i % depth])
            finally:
                for fut in pending:
                    fut.result()
        return self.size

    def _copy_direct(self, src: IO[bytes], *, chunk: int = DIRECT_CHUNK,
                     depth: int = DIRECT_DEPTH) -> int | None:
        """Local file to a local store file, DIRECT_MIN bytes or more: the
        source is read into page-aligned buffers; one helper thread hashes
        each buffer while another writes the same buffer with ``O_DIRECT``
        (no copy into the page cache, no writeback left for the fsync). A
        buffer is reused only once both are done with it, so the digest is
        of the bytes written. The last chunk is padded to the alignment and
        the file truncated to its size.

        Returns:
            The bytes copied, or None when ``raw`` has no direct I/O, the
            source is not a local file at offset 0, it is small, or the
            filesystem refuses the first direct write (nothing was copied
            and ``src`` is back at offset 0).
        """
        start = getattr(self.raw, "open_direct", None)
        if start is None or self.size:
            return None
        try:
            if src.tell() != 0 or os.fstat(src.fileno()).st_size < DIRECT_MIN:  # type: ignore[attr-defined]
                return None
        except (AttributeError, OSError, ValueError):
            return None
        align = start()
        if align is None:
            return None
        chunk = getattr(self.raw, "direct_chunk", chunk)  # the store's measured choice
        raw = self.raw
        views = [memoryview(mmap.mmap(-1, chunk)) for _ in range(depth)]
        pending: deque[tuple[Future[None], Future[None] | None]] = deque()
        offset = i = 0
        with ThreadPoolExecutor(1, thread_name_prefix="sha256") as hasher, \
                ThreadPoolExecutor(1, thread_name_prefix="direct-write") as writer:
            try:
                while n := _fill(src, views[i % depth]):
                    view = views[i % depth]
                    padded = -(-n // align) * align
                    view[n:padded] = bytes(padded - n)
                    written: Future[None] | None = None
                    if offset == 0:  # synchronously: a refusal must leave nothing behind
                        try:
                            raw.pwrite_direct(view[:padded], 0)  # type: ignore[attr-defined]
                        except OSError as e:
                            if e.errno != errno.EINVAL:
                                raise
                            raw.end_direct(0)  # type: ignore[attr-defined]
                            src.seek(0)
                            return None
                    else:
                        written = writer.submit(raw.pwrite_direct,  # type: ignore[attr-defined]
                                                view[:padded], offset)
                    pending.append((hasher.submit(self._h.update, view[:n]), written))
                    offset += n
                    self._told(n)
                    i += 1
                    if n < chunk:
                        break
                    if len(pending) == depth:  # the next buffer is free again
                        _wait(pending.popleft())
            finally:
                while pending:
                    _wait(pending.popleft())
        raw.end_direct(offset)  # type: ignore[attr-defined]
        self.size += offset
        return offset

    def _copy_in_kernel(self, src: IO[bytes]) -> int | None:
        """Local file to local file: the kernel copies (``copy_file_range``,
        no user-space buffer) while a helper thread hashes each landed chunk
        back from the destination's page cache, so the digest is of the bytes
        written. None when ``raw`` or ``src`` is not such a file (or the
        kernel refuses): nothing was copied."""
        copy = getattr(self.raw, "copy_from_fd", None)
        name = getattr(self.raw, "name", None)
        try:
            src_fd = src.fileno()
        except (AttributeError, OSError, ValueError):
            return None
        if copy is None or name is None or self.size or src.tell() != 0:  # type: ignore[attr-defined]
            return None
        h = self._h
        pending: deque[Future[None]] = deque()
        back = os.open(name, os.O_RDONLY | os.O_CLOEXEC)  # the writer's fd is write-only

        def hash_back(offset: int, length: int) -> None:
            end = offset + length
            while offset < end:
                block = os.pread(back, min(HASH_CHUNK, end - offset), offset)
                if not block:
                    raise OSError(errno.EIO, f"{name}: short read hashing back a copy")
                h.update(block)
                offset += len(block)

        try:
            with ThreadPoolExecutor(1, thread_name_prefix="sha256") as hasher:
                def on_chunk(offset: int, length: int) -> None:
                    pending.append(hasher.submit(hash_back, offset, length))
                    self._told(length)
                    if len(pending) > 2:
                        pending.popleft().result()
                try:
                    copied = copy(src_fd, on_chunk)
                finally:
                    for fut in pending:
                        fut.result()
        finally:
            os.close(back)
        if copied is not None:
            self.size += copied
        return copied

    @property
    def sha256(self) -> str:
        return self._h.hexdigest()

    @property
    def blake3(self) -> str | None:
        """The BLAKE3 digest of what was written (registry.protocol.fastdigest), or
        None for a file under its minimum size. Call after the last write."""
        return self._h.blake3

    @property
    def pieces(self) -> Pieces | None:
        """The piece states of what was written (registry.protocol.pieces), or None
        for at most one piece. The states come from the same pass as the
        sha256: the digest pauses at each boundary, nothing is read twice."""
        return self._h.pieces


def _fill(src: IO[bytes], view: memoryview) -> int:
    """Read from ``src`` until ``view`` is full or the end; bytes read."""
    got = 0
    while got < len(view):
        n = src.readinto(view[got:])  # type: ignore[attr-defined]
        if not n:
            break
        got += n
    return got


def _wait(futures: tuple[Future[None], Future[None] | None]) -> None:
    for fut in futures:
        if fut is not None:
            fut.result()

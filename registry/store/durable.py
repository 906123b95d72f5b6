"""Durable local files: writes that reach the disk before a commit relies on them.

:class:`_DurableFile` streams a file with periodic writeback and, past
``DIRECT_AFTER`` bytes, direct I/O in ``DIRECT_BUFFER`` blocks, and fsyncs it on
close; :func:`rename_noreplace` is ``renameat2(RENAME_NOREPLACE)``;
:func:`fsync_path` fsyncs a file or folder. :class:`registry.store.local.LocalStore`
and the pull's placement build on them (``registry.store.local`` re-exports them).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import stat
from collections.abc import Callable
from concurrent.futures import Future

from registry.host.pools import HelperPool
from registry.store.writepath import WritePath

_RENAME_NOREPLACE = 1
# the process's own symbols, libc's among them: find_library("c") ran ldconfig
# (a subprocess) on every import, a start-up cost of every command line call
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)
_AT_FDCWD = -100


def rename_noreplace(src: str, dst: str, *, src_dir_fd: int | None = None,
                     dst_dir_fd: int | None = None) -> None:
    """rename(2) that fails with FileExistsError if ``dst`` exists; ``src`` and
    ``dst`` relative to the directory descriptors when given (renameat).

    Uses Linux ``renameat2(RENAME_NOREPLACE)``; where that is unavailable, a
    plain rename, which still fails onto a non-empty directory (a committed
    directory is never empty: it holds MANIFEST.json).
    """
    sfd = _AT_FDCWD if src_dir_fd is None else src_dir_fd
    dfd = _AT_FDCWD if dst_dir_fd is None else dst_dir_fd
    if _renameat2 is not None:
        if _renameat2(sfd, os.fsencode(src), dfd, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS):  # unsupported by the filesystem
            raise OSError(err, os.strerror(err), dst)
    try:
        st = os.lstat(dst, dir_fd=dst_dir_fd)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise FileExistsError(errno.EEXIST, "exists", dst)
    os.rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range = getattr(_libc, "sync_file_range", None)
if _sync_file_range is not None:
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
#: start the writeback of every this many bytes written (see _DurableFile).
WRITEBACK_EVERY = 16 * 1024 * 1024


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Start (without waiting for) the writeback of bytes ``[offset,
    offset + nbytes)`` of ``fd`` (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``),
    so that the fsync that makes the file durable finds little left to write.
    Promises nothing; a no-op where the call is missing or refused."""
    if _sync_file_range is not None and nbytes > 0:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


#: a streamed file continues with direct I/O past this offset, in buffers of
#: this many bytes (both multiples of every filesystem block size).
DIRECT_AFTER = 8 * 1024 * 1024
DIRECT_BUFFER = 8 * 1024 * 1024
#: writes the direct buffers of streamed files, one in flight per file.
_DIRECT_WRITERS = HelperPool(4, "direct-write")


def _close_fd(f: _DurableFile) -> None:
    """Close ``f``'s direct descriptor once. The attribute is cleared before
    the descriptor is closed: a signal (SIGTERM raising in the main thread)
    between the two then leaks one descriptor of a dying process, where the
    other order let the discard that follows close it again (EBADF, which
    replaced the interrupt's exit 143 with a storage error, exit 6), or close
    a descriptor another thread had just been given."""
    fd, f._direct = f._direct, None
    if fd is not None:
        os.close(fd)


class _DurableFile:
    """A file opened for writing that is flushed and fsynced at close.

    A large file is written past its first ``DIRECT_AFTER`` bytes with
    ``O_DIRECT``: writes are gathered into page-aligned buffers of
    ``DIRECT_BUFFER`` bytes, and each full buffer goes straight to the disk
    on a helper thread while the next one fills, bypassing the page cache;
    the tail (less than a buffer) is written through the page cache at close.
    The fsync at close then finds no writeback to wait for. Where the
    filesystem has no direct I/O, or refuses the first direct write, writes
    stay buffered, and every ``WRITEBACK_EVERY`` bytes Linux
    ``sync_file_range(SYNC_FILE_RANGE_WRITE)`` starts (without waiting for)
    the writeback of what was just written. Neither promises durability; the
    fsync at close does. Memory: two buffers of ``DIRECT_BUFFER`` bytes per
    large file being written.
    """

    def __init__(self, path: str, mode: str, *,
                 write_path: Callable[[], WritePath] | None = None,
                 opener: Callable[[str, int], int] | None = None,
                 unlink: Callable[[], None] | None = None) -> None:
        self._f = open(path, mode, opener=opener)  # noqa: SIM115 - closed in close()
        self.name = path
        #: removes the file when it is discarded (a store's confined unlink).
        self._unlink = unlink or (lambda: os.unlink(path))
        self._choose = write_path  # asked once, by the first large write
        self._written = 0
        self._flushed = 0
        self._direct: int | None = None
        self._buffer: memoryview | None = None  # gathers direct writes
        self._spare: memoryview | None = None  # the buffer being written meanwhile
        self._in_flight: Future[None] | None = None
        self._filled = 0
        self._buffered_only = "x" in mode  # create(): small documents
        #: bytes per direct write buffer (the store's measured choice).
        self.direct_chunk = DIRECT_BUFFER

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data)
        if not view.nbytes:
            return 0
        view = view.cast("B")
        n = len(view)
        if self._buffer is None:
            head = n if self._buffered_only else min(n, max(0, DIRECT_AFTER - self._written))
            if head:
                self._write_buffered(view[:head])
            if head == n:
                return n
            view = view[head:]
            if not self._start_direct_stream():
                self._write_buffered(view)
                return n
        while view:
            buf = self._buffer
            if buf is None:  # the first direct write was refused: buffered from here
                self._write_buffered(view)
                break
            take = min(len(buf) - self._filled, len(view))
            buf[self._filled:self._filled + take] = view[:take]
            self._filled += take
            view = view[take:]
            if self._filled == len(buf):
                self._flush_direct()
        return n

    def _write_buffered(self, view: memoryview) -> None:
        self._f.write(view)
        self._written += len(view)
        if _sync_file_range is not None and self._written - self._flushed >= WRITEBACK_EVERY:
            self._f.flush()
            # Best effort: an error here (EINVAL on some filesystems) is
            # ignored; fsync at close reports real write errors.
            _sync_file_range(self._f.fileno(), self._flushed, self._written - self._flushed,
                             _SYNC_FILE_RANGE_WRITE)
            self._flushed = self._written

    def _start_direct_stream(self) -> bool:
        """Switch to direct writes at offset ``DIRECT_AFTER``; False where
        the filesystem has no direct I/O (writes stay buffered)."""
        self._buffered_only = True  # decided once, whatever the outcome
        if self._written != DIRECT_AFTER or not self._direct_chosen() \
                or self._open_direct_fd() is None:
            return False
        self._buffer = memoryview(mmap.mmap(-1, self.direct_chunk))
        return True

    def _direct_chosen(self) -> bool:
        """The store's measured write path (registry.store.writepath) says
        direct; True when the file was opened without one."""
        if self._choose is None:
            return True
        choice = self._choose()
        self.direct_chunk = choice.chunk
        return choice.direct

    def _flush_direct(self) -> None:
        """Hand the full buffer to the disk with O_DIRECT at the end of the
        file. The first one is written here: a refusal (EINVAL: the
        alignment) turns the file back to buffered writes. Later ones are
        written on a helper thread while the next buffer fills (two buffers
        in rotation, one write in flight per file); an error is raised by
        the next flush or by close."""
        assert self._buffer is not None and self._direct is not None
        data = self._buffer[:self._filled]
        if self._written == DIRECT_AFTER:
            try:
                self.pwrite_direct(data, self._written)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                _close_fd(self)
                self._buffer = None
                self._f.seek(self._written)
                self._write_buffered(data)
                data.release()
                self._filled = 0
                return
        else:
            self._wait_direct()
            self._in_flight = _DIRECT_WRITERS.submit(self.pwrite_direct, data, self._written)
            spare = self._spare or memoryview(mmap.mmap(-1, self.direct_chunk))
            self._spare, self._buffer = self._buffer, spare
        self._written += self._filled
        self._filled = 0

    def _wait_direct(self) -> None:
        """Wait for the direct write in flight; raises its error."""
        fut, self._in_flight = self._in_flight, None
        if fut is not None:
            fut.result()

    def _close_direct_stream(self) -> None:
        """Write the tail gathered since the last full buffer through the page
        cache (it need not be aligned), after the direct-written part."""
        if self._buffer is None:
            return
        self._wait_direct()
        self._f.seek(self._written)
        if self._filled:
            self._f.write(self._buffer[:self._filled])
            self._written += self._filled
        self._buffer = self._spare = None
        self._filled = 0

    def copy_from_fd(self, src_fd: int, on_chunk: Callable[[int, int], None], *,
                     chunk: int = WRITEBACK_EVERY) -> int | None:
        """Append all of ``src_fd`` (from its offset 0) with ``copy_file_range``:
        the kernel copies page cache to page cache, no user-space buffer. After
        each chunk lands, ``on_chunk(offset, length)`` is called (to hash it
        back from the page cache, reading ``self.name``) and its writeback is
        started.

        Returns:
            The bytes copied, or None when the kernel cannot copy between these
            files (nothing was copied; the caller copies through user space).
        """
        if self._buffer is not None:  # a direct stream is open: append through write()
            return None
        self._f.flush()
        out = self._f.fileno()
        base = self._written
        pos = 0
        while True:
            try:
                n = os.copy_file_range(src_fd, out, chunk, pos, base + pos)
            except OSError as e:
                if pos == 0 and e.errno in (errno.EXDEV, errno.EINVAL, errno.ENOSYS,
                                            errno.EOPNOTSUPP, errno.EBADF):
                    return None
                raise
            if n == 0:
                break
            on_chunk(base + pos, n)
            pos += n
            self._written += n
            if _sync_file_range is not None:
                _sync_file_range(out, self._flushed, self._written - self._flushed,
                                 _SYNC_FILE_RANGE_WRITE)
                self._flushed = self._written
        self._f.seek(self._written)
        return pos

    def open_direct(self) -> int | None:
        """Prepare direct writes (``O_DIRECT``) to this still-empty file: a
        second descriptor that bypasses the page cache, for large sequential
        copies (see :meth:`registry.protocol.hashing.HashingWriter.copy_from`).

        Returns:
            The alignment in bytes that every direct write's offset, length
            and buffer address must keep (the filesystem block size, at least
            4096), or None where the OS or the filesystem has no direct I/O
            (tmpfs, for one) or the file is not empty.
        """
        if self._written or self._direct is not None or self._buffer is not None:
            return None
        self._buffered_only = True  # this file is copied whole, not streamed
        if not self._direct_chosen():
            return None
        return self._open_direct_fd()

    def _open_direct_fd(self) -> int | None:
        if not hasattr(os, "O_DIRECT"):
            return None
        self._f.flush()
        try:
            # the file this object has open, not whatever its name now resolves to
            fd = os.open(f"/proc/self/fd/{self._f.fileno()}" if os.path.isdir("/proc/self/fd")
                         else self.name, os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
        except OSError as e:
            if e.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
                return None
            raise
        self._direct = fd
        return max(4096, os.fstatvfs(fd).f_bsize)

    def pwrite_direct(self, view: memoryview, offset: int) -> None:
        """Write all of ``view`` at ``offset`` through the direct descriptor.
        Offset, length and buffer keep the alignment :meth:`open_direct`
        returned. Raises OSError (EINVAL where the filesystem refuses the
        alignment; ENOSPC, EIO)."""
        assert self._direct is not None, "open_direct first"
        while view:
            n = os.pwrite(self._direct, view, offset)
            view, offset = view[n:], offset + n

    def end_direct(self, size: int) -> None:
        """Close the direct descriptor; the file is truncated to ``size``
        bytes (dropping the last write's padding) and later writes append."""
        _close_fd(self)
        os.ftruncate(self._f.fileno(), size)
        self._f.seek(size)
        self._written = self._flushed = size

    def close(self) -> None:
        """Write what is left, fsync and close. If any of it fails, the file
        is discarded (removed) before the error is raised: a file whose close
        failed never stays behind, and a later close has nothing to do."""
        if self._f.closed:
            return
        try:
            self._close_direct_stream()
            _close_fd(self)
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        try:
            self._wait_direct()
        except Exception:  # noqa: BLE001 - the file is being thrown away
            pass
        self._buffer = self._spare = None
        try:
            _close_fd(self)
        except OSError:
            pass
        try:
            self._f.close()  # may flush buffered bytes, and fail as the writes did
        except OSError:
            pass
        try:
            self._unlink()
        except FileNotFoundError:
            pass

    def __enter__(self) -> _DurableFile:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()  # discards the file itself if it fails
        else:
            self.discard()

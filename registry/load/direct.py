"""Local reads that land where the tensors live: the page cache when it holds the
bytes, else the disk's DMA straight into the process's own memory (issue 43).

A local file's piece is read in chunks of :data:`CHUNK` bytes. Each chunk is
one vectored read whose buffers are, page by page, either the memory of the
tensor that wholly holds that page (allocated by :func:`aligned` so that its
pages sit at the file's page boundaries) or a per-thread bounce buffer (pages
shared by two tensors, the header, bytes no tensor asked for), copied out
after. The read is tried three ways, in order:

1. ``preadv2(..., RWF_NOWAIT)`` on the ordinary descriptor: answered from the
   page cache only, it never waits on the disk (a warm file: one copy);
2. ``O_DIRECT`` on the same open file, reopened through ``/proc/self/fd``
   (never through the path: a file renamed over after the first open is not
   the one read): the disk writes the process's pages, no copy, no CPU per
   byte;
3. plain ``preadv`` where the file system refuses direct I/O (tmpfs) or the
   piece is not block-aligned.

Whichever way, the bytes land in memory only this process maps, so no write
to the file afterwards, in place or by rename, reaches a tensor; they are
hashed where they landed, in file order, and the piece reader hands nothing
out before its piece verified (registry.load.pieces).

May import: the standard library only.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from collections.abc import Iterator
from typing import Any

#: alignment of direct reads (offset, length, address): the page, which is a
#: multiple of every logical block size in use
ALIGN = mmap.PAGESIZE
#: bytes of one vectored read (and of each thread's bounce buffer)
CHUNK = 8 * 1024 * 1024
#: tensors smaller than this get ordinary memory (their bytes come through
#: the bounce buffer): an mmap per tiny tensor costs more than the copy
MIN_ALIGNED = 64 * 1024
_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
_DIRECT = getattr(os, "O_DIRECT", 0)
_local = threading.local()


def down(n: int) -> int:
    return n - n % ALIGN


def up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def aligned(start: int, end: int) -> tuple[mmap.mmap, int]:
    """Private anonymous memory for file bytes ``[start, end)`` laid out at
    their page offsets: ``(memory, offset of start in it)``. Freed with the
    last object built over it."""
    return mmap.mmap(-1, max(ALIGN, up(end) - down(start)), flags=mmap.MAP_PRIVATE), start % ALIGN


class Descriptors:
    """One file's descriptors: ``fd`` (from the store's confined opener) and,
    where the file system allows, ``direct``: the same open file reopened
    with ``O_DIRECT`` (-1 where refused)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.direct = -1
        if _DIRECT:
            try:
                self.direct = os.open(f"/proc/self/fd/{fd}",
                                      os.O_RDONLY | _DIRECT | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                return  # tmpfs and others: EINVAL; no /proc: ENOENT
            if os.fstat(self.direct).st_ino != os.fstat(fd).st_ino:
                os.close(self.direct)  # not the same file: never read it
                self.direct = -1

    def close(self) -> None:
        for fd in (self.fd, self.direct):
            if fd >= 0:
                os.close(fd)
        self.fd = self.direct = -1


def usable(start: int, end: int, size: int) -> bool:
    """Whether piece ``[start, end)`` of a ``size``-byte file can be read
    here: block-aligned at both ends (its end may be the file's)."""
    return start % ALIGN == 0 and (end % ALIGN == 0 or end == size)


def chunks(d: Descriptors, start: int, end: int, size: int,
           dests: list[Any]) -> Iterator[memoryview]:
    """The bytes ``[start, end)`` of the file (a :func:`usable` span), read
    chunk by chunk into ``dests`` (sorted, non-overlapping; each has ``start``,
    ``end``, ``view`` holding exactly those bytes, and ``whole``, None or the
    page-aligned memory around them whose first byte is file byte ``base``:
    registry.load.pieces.Target) and the thread's
    bounce buffer, yielded in file order as they lie in memory (to hash); a
    dest's bytes from the bounce buffer are copied into it before they are
    yielded. Stops early at the file's end (fewer bytes than asked).

    Raises:
        OSError: a read failed.
    """
    bounce = _bounce()
    for lo in range(start, end, CHUNK):
        want = min(end, lo + CHUNK)
        hi = up(want) if want == size else want
        runs = _plan(lo, hi, dests, bounce)
        n = _read(d, lo, want, runs)
        got = min(want, lo + n)
        for r in runs:
            if not r[2]:
                _copy_out(r, dests, got)
        for a, b, _own, view in runs:
            if a < got:
                yield view[:min(b, got) - a]
        if got < want:
            return


def _bounce() -> memoryview:
    buf = getattr(_local, "bounce", None)
    if buf is None:
        buf = _local.bounce = memoryview(mmap.mmap(-1, CHUNK + ALIGN, flags=mmap.MAP_PRIVATE))
    return buf


Run = tuple[int, int, bool, memoryview]  # file [a, b), owned by a dest, where it lands


def _plan(lo: int, hi: int, dests: list[Any], bounce: memoryview) -> list[Run]:
    """Runs covering ``[lo, hi)`` (page aligned): whole pages inside a dest
    with aligned memory land there; every other page in the bounce buffer."""
    runs: list[Run] = []
    pos = lo
    for t in dests:
        if t.whole is None:
            continue
        a, b = max(pos, up(t.start)), min(hi, down(t.end))
        if a >= b:
            continue
        if a > pos:
            runs.append((pos, a, False, bounce[pos - lo:a - lo]))
        runs.append((a, b, True, t.whole[a - t.base:b - t.base]))
        pos = b
    if pos < hi:
        runs.append((pos, hi, False, bounce[pos - lo:hi - lo]))
    return runs


def _copy_out(run: Run, dests: list[Any], got: int) -> None:
    a, b, _own, view = run
    b = min(b, got)
    for t in dests:
        s, e = max(a, t.start), min(b, t.end)
        if s < e:
            t.view[s - t.start:e - t.start] = view[s - a:e - a]


def _read(d: Descriptors, lo: int, want: int, runs: list[Run]) -> int:
    """Fill ``runs`` from the file at ``lo``; returns the bytes read (at least
    ``want - lo`` unless the file ends first)."""
    if _NOWAIT:
        try:
            n = _readv(d.fd, runs, lo, _NOWAIT, want)
        except BlockingIOError:
            n = 0
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            n = 0
        if n >= want - lo:
            return n
    if d.direct >= 0:
        try:
            n = _readv(d.direct, runs, lo, 0, want)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            os.close(d.direct)
            d.direct = -1  # this file system takes no direct reads after all
        else:
            if n >= want - lo or n % ALIGN:
                return n  # complete, or the file ends here
            return n + _readv(d.fd, _skip(runs, n), lo + n, 0, want)
    return _readv(d.fd, runs, lo, 0, want)


def _readv(fd: int, runs: list[Run], at: int, flags: int, want: int) -> int:
    """``preadv2`` into ``runs`` from ``at`` until ``want`` or the file's end;
    with RWF_NOWAIT it stops at the first page not cached."""
    done = 0
    views = [r[3] for r in runs]
    while at + done < want:
        try:
            n = os.preadv(fd, views, at + done, flags)
        except BlockingIOError:
            if not done:
                raise
            break
        if n <= 0:
            break
        done += n
        views = _advance(views, n)
    return done


def _advance(views: list[memoryview], n: int) -> list[memoryview]:
    out = []
    for v in views:
        if n >= len(v):
            n -= len(v)
            continue
        out.append(v[n:])
        n = 0
    return out


def _skip(runs: list[Run], n: int) -> list[Run]:
    out = []
    for a, b, own, v in runs:
        if b - a <= n:
            n -= b - a
            continue
        out.append((a + n, b, own, v[n:]))
        n = 0
    return out


__all__ = ["ALIGN", "CHUNK", "MIN_ALIGNED", "Descriptors", "aligned", "chunks",
           "down", "up", "usable"]

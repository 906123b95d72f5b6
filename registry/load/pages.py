"""Private pages of a mapped store file (issue 43): ``MADV_POPULATE_WRITE``
makes each page of a ``MAP_PRIVATE`` mapping the process's own copy before it
is hashed, so what was verified is what a tensor reads and no later write to
the file (in place, by a store writer) reaches it.

May import: the standard library only.
"""

from __future__ import annotations

import mmap

#: madvise(2) advice that faults a range in as if written (Linux >= 5.14): on a
#: private file mapping each page becomes the process's own copy, which later
#: writes to the file no longer reach
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
_populate_ok: bool | None = None


def can_populate() -> bool:
    """Whether this kernel takes ``MADV_POPULATE_WRITE`` (probed once on one
    private page). Without it a local source is read by copying instead."""
    global _populate_ok
    if _populate_ok is None:
        try:
            m = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE)
            try:
                m.madvise(MADV_POPULATE_WRITE, 0, mmap.PAGESIZE)
            finally:
                m.close()
            _populate_ok = True
        except (OSError, AttributeError, ValueError):
            _populate_ok = False
    return _populate_ok


def populate(m: mmap.mmap, start: int, end: int) -> None:
    """Make bytes ``[start, end)`` of private mapping ``m`` (offsets in it) the
    process's own pages (``MADV_POPULATE_WRITE``): from then on no write to the
    file, in place or otherwise, changes them.

    Raises:
        OSError: the kernel refused (EINVAL: no support; EFAULT: the file is
            shorter than the mapping now).
    """
    if end <= start:
        return
    base = start - start % mmap.PAGESIZE
    m.madvise(MADV_POPULATE_WRITE, base, end - base)

"""How much of its disk a pull cache (or a mirror's cache) uses: one reading for
``registry cache ls`` and the mirror's ``/metrics`` gauges.

Reads directory entries and ``statvfs`` only, never a byte of a file, so it
is cheap enough for every scrape. Sizes are apparent sizes in bytes
(``st_size``); a file removed while it is read is skipped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.pull.cache import INCOMPLETE


@dataclass(frozen=True, slots=True)
class CacheUse:
    """One reading of a cache's disk use (bytes).

    Attributes:
        blobs, blob_bytes: verified files in ``blobs/sha256/`` and their sizes.
        partial_fills: downloads not finished (``tmp/*.incomplete``): fills
            running now, or failed ones kept to be resumed.
        partial_bytes: every file in ``tmp/`` (partials, their piece logs,
            other temp files).
        free_bytes, disk_bytes: space this user may still write on the
            cache's filesystem, and its size (None: cannot be read).
    """

    blobs: int
    blob_bytes: int
    partial_fills: int
    partial_bytes: int
    free_bytes: int | None
    disk_bytes: int | None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def _files(folder: Path) -> list[tuple[str, int]]:
    out = []
    try:
        with os.scandir(folder) as it:
            for e in it:
                try:
                    if e.is_file(follow_symlinks=False):
                        out.append((e.name, e.stat(follow_symlinks=False).st_size))
                except FileNotFoundError:
                    continue  # removed meanwhile
    except (FileNotFoundError, NotADirectoryError):
        return []
    return out


def cache_use(root: str | os.PathLike[str]) -> CacheUse:
    """The disk use of the cache at ``root`` (a folder that may not exist yet:
    all zero, the free space of the nearest existing parent)."""
    root = Path(root)
    blobs = _files(root / "blobs" / "sha256")
    tmp = _files(root / "tmp")
    free = disk = None
    probe = root
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
        free, disk = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    except OSError:
        pass
    return CacheUse(len(blobs), sum(n for _, n in blobs),
                    sum(1 for name, _ in tmp if name.endswith(INCOMPLETE)),
                    sum(n for _, n in tmp), free, disk)


__all__ = ["CacheUse", "cache_use"]

"""Write-through of verified weights into the pull cache (``open_weights(place=True)``).

Each piece the reader verified is written to a temporary file in the cache
(``tmp/<sha256>.<tag>.incomplete``) before any tensor of it is handed out, so
nothing the caller does to a tensor reaches the blob. Once every piece of the
file was written, the file is fsynced, made read-only and linked in as
``blobs/sha256/<sha256>`` with its stat stamp, exactly as a pull places a blob:
the next ``open_weights`` (or ``registry pull``) of a release holding it reads
the cache, not the store, and still checks every piece as it reads. A file
not read whole (a ``get_tensor`` of one tensor) is not placed; its temporary
file is removed on close.
"""

from __future__ import annotations

import os

from registry.load.pieces import Target, geometry, piece_bounds
from registry.protocol.manifest import FileEntry
from registry.pull.cache import Cache


class BlobWriter:
    """The cache blob of one file, written piece by piece."""

    def __init__(self, cache: Cache, entry: FileEntry) -> None:
        self.cache, self.entry = cache, entry
        self.tmp = cache.new_temp(entry.sha256)
        self.fd: int | None = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                                      | os.O_CLOEXEC, 0o644)
        self.done: set[int] = set()
        self.whole = True

    def written(self, k: int, targets: list[Target]) -> None:
        """Piece ``k`` verified with its bytes in ``targets``: write what they hold."""
        if self.fd is None or not self.whole:
            return
        start, end = piece_bounds(self.entry, k)
        covered = 0
        for t in targets:
            s, e = max(start, t.start), min(end, t.end)
            if s < e:
                view = t.view[s - t.start:e - t.start]
                while len(view):
                    n = os.pwrite(self.fd, view, s)
                    view, s = view[n:], s + n
                covered += e - max(start, t.start)
        if covered != end - start:
            self.whole = False  # not read whole: nothing to place
        self.done.add(k)

    def close(self) -> None:
        """Place the blob when every piece was written, else drop the temporary file."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        complete = self.whole and len(self.done) == geometry(self.entry).count()
        try:
            if complete:
                os.fsync(fd)
                os.fchmod(fd, 0o444)
        finally:
            os.close(fd)
        if not complete:
            self.tmp.unlink(missing_ok=True)
            return
        blob = self.cache.blob(self.entry.sha256)
        try:
            os.link(self.tmp, blob)
        except FileExistsError:
            if not self.cache.usable(self.entry.sha256):
                self.cache.drop(self.entry.sha256)
                os.replace(self.tmp, blob)
        except OSError:
            os.replace(self.tmp, blob)
        self.tmp.unlink(missing_ok=True)
        self.cache.stamps.record_blob(blob)


__all__ = ["BlobWriter"]

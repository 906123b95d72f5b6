"""Resumable downloads: an interrupted pull's partial file and the pieces it verified.

A file with piece states (registry.protocol.pieces) downloads into its writer-unique
temp file ``tmp/<sha256>.pid<pid>.<rand>.incomplete`` (registry.pull.cache)
beside a piece log ``<same name>.pieces``: the indexes of the pieces whose
bytes have landed and verified, rewritten (temp + rename) as each one does.
When the pull is killed or the store fails mid-file, both stay; an integrity
failure or a full disk removes them.

The next pull of that blob (any process, once the writer is gone) claims the
partial by renaming it to its own writer-unique name (an atomic rename: of
two pulls racing for one partial, one gets it, the other starts afresh),
re-checks every logged piece against the manifest from the bytes on disk
(nothing is trusted because a log says so: a piece that no longer verifies is
fetched again), and fetches only the missing pieces with ranged reads, each
checked once it has landed. The blob then enters the cache as any other.

Partials whose writer died more than ``KEEP_SECONDS`` ago are removed by
``Cache.clean_stale`` like other temp files.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from registry.rules import limits
from registry.protocol import pieces as pc
from registry.errors import IntegrityError
from registry.protocol.manifest import FileEntry
from registry.pull.cache import (  # noqa: F401 - LOG, KEEP_SECONDS, is_kept: re-exported
    INCOMPLETE,
    KEEP_SECONDS,
    LOG,
    Cache,
    is_kept,
    owner_pid,
    temp_tag,
)
from registry.host.processes import pid_alive
from registry.store import Store
from registry.protocol.verify import piece_error

_CHUNK = 4 * 1024 * 1024


class PieceLog:
    """The verified pieces of one partial file, persisted beside it."""

    def __init__(self, partial: Path, have: set[int] | None = None, *,
                 on_add: Callable[[int], None] | None = None) -> None:
        self.path = partial.with_name(partial.name + LOG)
        self.have: set[int] = set(have or ())
        self._lock = threading.Lock()
        #: told of each piece index once it verified and is logged (a mirror
        #: streams that piece to its waiting clients: registry.web.filling)
        self.on_add = on_add
        if have:
            self._write()

    def _write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{temp_tag()}.tmp")
        tmp.write_text(json.dumps(sorted(self.have)))
        os.replace(tmp, self.path)

    def add(self, k: int) -> None:
        with self._lock:
            self.have.add(k)
            self._write()
        if self.on_add is not None:
            self.on_add(k)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _read_log(path: Path) -> set[int]:
    try:
        doc = json.loads(limits.read_local(path, limits.MAX_RECORD_BYTES))
        return {int(k) for k in doc} if isinstance(doc, list) else set()
    except (OSError, ValueError, TypeError):
        return set()


def claim(cache: Cache, entry: FileEntry, *, own: bool = False) -> tuple[Path, set[int]] | None:
    """Take over a dead writer's partial of ``entry``'s blob, if any: its new
    (writer-unique) path and the pieces its log lists (still to be re-checked).

    With ``own``, a partial this process left (a long-running server whose
    earlier fill of the blob failed) is taken over too: the caller holds the
    blob's lock, so no other fill of this process writes it."""
    prefix = f"{entry.sha256}."
    try:
        names = os.listdir(cache.tmp)
    except FileNotFoundError:
        return None
    for name in names:
        if not (name.startswith(prefix) and name.endswith(INCOMPLETE)):
            continue
        pid = owner_pid(name)
        old = cache.tmp / name
        log = old.with_name(name + LOG)
        mine = own and pid == os.getpid()
        if pid is None or (pid_alive(pid) and not mine) or not log.exists():
            continue
        new = cache.new_temp(entry.sha256)
        try:
            os.rename(old, new)
        except FileNotFoundError:
            continue  # another pull claimed it first
        have = _read_log(log)
        log.unlink(missing_ok=True)
        return new, have
    return None


def _runs(ks: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for k in ks:
        if out and out[-1][-1] == k - 1:
            out[-1].append(k)
        else:
            out.append([k])
    return out


def fetch_missing(store: Store, key: str, entry: FileEntry, fd: int, have: set[int], *,
                  pool: ThreadPoolExecutor, log: PieceLog,
                  progress: object = None) -> tuple[int, int, IntegrityError | None]:
    """Complete a claimed partial in ``fd``: re-check the ``have`` pieces from
    disk, fetch every other piece by ranged reads and check it once landed.

    Returns:
        ``(bytes in the file when done, bytes fetched from the store, the
        lowest bad piece's error or None)``: the first is ``entry.size`` when
        every piece landed, one more when the object is longer than the
        manifest says. ``progress`` is told of the re-checked bytes too.

    Raises:
        ObjectNotFoundError, StorageError: the store read failed (the partial
            and the log of what verified stay for the next resume).
    """
    assert entry.pieces is not None
    count = progress if callable(progress) else (lambda n: None)
    bounds = entry.pieces.bounds(entry.size)
    on_disk = os.fstat(fd).st_size

    def check(k: int) -> str | None:
        bad = pc.check_fd(fd, entry.pieces, entry.sha256, entry.size, k)  # type: ignore[arg-type]
        if bad is None:
            log.add(k)
        return bad

    rechecks = {k: pool.submit(check, k) for k in sorted(have)
                if 0 <= k < len(bounds) and bounds[k][1] <= on_disk}
    good = {k for k, f in rechecks.items() if f.result() is None}
    for k in good:
        count(bounds[k][1] - bounds[k][0])
    missing = [k for k in range(len(bounds)) if k not in good]
    checks: dict[int, Future[str | None]] = {}
    longer = False
    fetched = 0
    for run in _runs(missing):
        a, b = bounds[run[0]][0], bounds[run[-1]][1]
        pos, nxt = a, 0
        for block in store.iter_range(key, a, b + (b == entry.size), _CHUNK):
            if pos + len(block) > b:
                block, longer = block[:b - pos], True
            view = memoryview(block)
            while view:
                n = os.pwrite(fd, view, pos)
                view, pos = view[n:], pos + n
            count(len(block))
            fetched += len(block)
            while nxt < len(run) and bounds[run[nxt]][1] <= pos:
                checks[run[nxt]] = pool.submit(check, run[nxt])
                nxt += 1
            if longer:
                break
        if pos < b:
            return pos, fetched, None  # the object is shorter: the size check fails
    bad = None
    for k in sorted(checks):
        actual = checks[k].result()
        if actual is not None and bad is None:
            bad = piece_error(entry, k, actual)
    return entry.size + longer, fetched + longer, bad


__all__ = ["KEEP_SECONDS", "LOG", "PieceLog", "claim", "fetch_missing", "is_kept"]

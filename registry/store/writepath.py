"""Direct or buffered: a local store's write path, measured on its own filesystem.

Large files reach a local store either through the page cache (buffered
writes, the fsync then waits for the writeback) or with ``O_DIRECT`` from
aligned buffers (no writeback left for the fsync, no page cache filled).
Which is faster depends on the disk, the filesystem and what else the host
is doing: O_DIRECT won on the disk this project was first measured on, but
that was one disk at one moment (issue 19, item 4). So the first large write
into a store measures, on the store's own filesystem: ``PROBE_BYTES`` written
and fsynced buffered, and with O_DIRECT in buffers of each of ``CHUNKS``,
twice each in alternating order (the faster of the two counts), and keeps
the fastest. The choice is recorded in ``<store root>/.registry/write-path.json``
(with the filesystem's device number: a store copied to another disk
measures again) and used by every later writer of that store, in every
process. ``REGISTRY_WRITE_PATH`` (``direct``, ``buffered``) overrides it
without measuring; ``registry.store.writepath.measure`` re-measures.

Whatever is chosen, every file is fsynced before it is listed as written:
this only decides how the bytes get there.
"""

from __future__ import annotations

from registry.rules import numbers

import json
import mmap
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: bytes each variant writes and fsyncs while measuring.
PROBE_BYTES = 16 * 1024 * 1024
#: direct-write buffer sizes tried, bytes (multiples of every block size).
CHUNKS = (2 * 1024 * 1024, 8 * 1024 * 1024)
#: buffer size when nothing was measured (the project's first choice).
DEFAULT_CHUNK = 8 * 1024 * 1024
RECORD = ".registry/write-path.json"


@dataclass(frozen=True, slots=True)
class WritePath:
    """How large files are written to one local store.

    Attributes:
        direct: O_DIRECT writes (else buffered + fsync).
        chunk: bytes per direct write buffer.
        source: ``"measured"``, ``"recorded"`` (read from the record),
            ``"env"`` (REGISTRY_WRITE_PATH) or ``"default"`` (no record and
            the measurement could not run).
        seconds: per variant (``buffered``, ``direct-<MiB>``), the faster of
            two runs writing PROBE_BYTES and fsyncing, when measured.
    """

    direct: bool
    chunk: int = DEFAULT_CHUNK
    source: str = "default"
    seconds: dict[str, float] = field(default_factory=dict)
    st_dev: int = -1
    measured_at: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_memo: dict[str, WritePath] = {}
_lock = threading.Lock()


def _write_buffered(path: Path, block: memoryview, total: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        for off in range(0, total, len(block)):
            os.pwrite(fd, block, off)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_direct(path: Path, block: memoryview, total: int, chunk: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_DIRECT,
                 0o644)
    try:
        view = block[:chunk]
        for off in range(0, total, chunk):
            os.pwrite(fd, view, off)
        os.fsync(fd)
    finally:
        os.close(fd)


def measure(root: str | os.PathLike[str]) -> WritePath:
    """Measure the variants in ``<root>/.registry/`` and record the fastest.

    Raises:
        OSError: the folder cannot be written (the caller keeps the default).
    """
    folder = Path(root) / Path(RECORD).parent
    folder.mkdir(parents=True, exist_ok=True)
    import uuid  # loads platform: only when a folder is probed

    probe = folder / f"probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    buf = mmap.mmap(-1, max(CHUNKS))  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(len(buf)))
    block = memoryview(buf)
    variants: dict[str, Any] = {"buffered": lambda: _write_buffered(probe, block, PROBE_BYTES)}
    if hasattr(os, "O_DIRECT"):
        for c in CHUNKS:
            variants[f"direct-{c // (1024 * 1024)}"] = (
                lambda c=c: _write_direct(probe, block, PROBE_BYTES, c))
    seconds: dict[str, float] = {}
    try:
        for order in (list(variants), list(variants)[::-1]):
            for name in order:
                if name in seconds and seconds[name] == float("inf"):
                    continue
                t = time.perf_counter()
                try:
                    variants[name]()
                except OSError:
                    if name == "buffered":
                        raise
                    seconds[name] = float("inf")  # no direct I/O here (tmpfs...)
                    continue
                took = time.perf_counter() - t
                seconds[name] = min(seconds.get(name, took), took)
    finally:
        probe.unlink(missing_ok=True)
        block.release()
        buf.close()
    best = min(seconds, key=lambda k: seconds[k])
    chunk = int(best.split("-")[1]) * 1024 * 1024 if best != "buffered" else DEFAULT_CHUNK
    choice = WritePath(best != "buffered", chunk, "measured",
                       {k: v for k, v in seconds.items() if v != float("inf")},
                       os.stat(root).st_dev, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    import uuid

    tmp = folder / f".write-path.{uuid.uuid4().hex[:6]}.tmp"
    tmp.write_text(numbers.dumps(choice.to_dict(), indent=2) + "\n")
    os.replace(tmp, Path(root) / RECORD)
    with _lock:
        _memo[os.fspath(root)] = choice
    return choice


def _recorded(root: str) -> WritePath | None:
    try:
        doc = json.loads((Path(root) / RECORD).read_text())
        wp = WritePath(bool(doc["direct"]), int(doc["chunk"]), "recorded",
                       dict(doc.get("seconds", {})), int(doc["st_dev"]),
                       str(doc.get("measured_at", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if wp.st_dev != os.stat(root).st_dev or wp.chunk <= 0 or wp.chunk % 4096:
        return None  # another disk (a copied store), or a record made by hand wrong
    return wp


def write_path(root: str | os.PathLike[str]) -> WritePath:
    """The write path of the local store at ``root``: REGISTRY_WRITE_PATH,
    else this process's memo, else the record, else a measurement (recorded).
    Never raises: where nothing can be measured, O_DIRECT in DEFAULT_CHUNK
    buffers (each writer still falls back to buffered writes where the
    filesystem refuses direct I/O)."""
    env = os.environ.get("REGISTRY_WRITE_PATH", "").strip().lower()
    if env in ("direct", "buffered"):
        return WritePath(env == "direct", DEFAULT_CHUNK, "env")
    key = os.fspath(root)
    with _lock:
        if key in _memo:
            return _memo[key]
    choice = _recorded(key)
    if choice is None:
        try:
            choice = measure(key)
        except OSError:
            choice = WritePath(True)
    with _lock:
        _memo[key] = choice
    return choice


__all__ = ["CHUNKS", "PROBE_BYTES", "RECORD", "WritePath", "measure", "write_path"]

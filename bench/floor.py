"""The disk floor a benchmark prints beside its figures (issue 19, item 4):
the same number of bytes written raw from memory and fsynced, in the same
directory, in the same run, so a ratio can be read against what this disk
did at that moment, and the store's measured write path."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

MIB = 1024 * 1024


def disk_floor(folder: str | os.PathLike[str], nbytes: int) -> float:
    """Seconds to write ``nbytes`` (8 MiB writes of incompressible bytes) to a
    new file in ``folder`` and fsync it; the file is removed."""
    block = os.urandom(8 * MIB)
    path = Path(folder) / f".disk-floor-{uuid.uuid4().hex[:6]}"
    t = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        left = nbytes
        while left > 0:
            left -= f.write(block[:min(left, len(block))])
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - t
    path.unlink()
    return elapsed


def floor_line(seconds: float, nbytes: int, ours: float | None = None) -> str:
    """One printed line: the floor, its rate, the load, and ours / floor."""
    rel = f"; ours / floor {ours / seconds:.2f}" if ours else ""
    return (f"disk floor this run: {nbytes / MIB:.0f} MiB written + fsynced in {seconds:.2f} s "
            f"({nbytes / 1e6 / seconds:.0f} MB/s), {os.cpu_count()} CPUs, load average "
            f"{os.getloadavg()[0]:.1f}{rel}")


def write_path_of(store_root: str | os.PathLike[str]) -> dict[str, Any]:
    """The write path the local store at ``store_root`` uses (measured at its
    first large write, registry.store.writepath)."""
    from registry.store.writepath import write_path

    return write_path(os.fspath(store_root)).to_dict()

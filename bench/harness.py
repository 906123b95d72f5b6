"""What the benchmarks share: the command line's ``--repeat`` and ``--out``,
the release directory the pull and signing benchmarks time (``--size-mib`` MiB:
a weights file of 3/4 of the size and three smaller files), the clock, and the
alternating order of paired runs.

Imported by scripts run as ``python bench/<name>.py`` (they put the repository
root on ``sys.path`` first).
"""

from __future__ import annotations

import argparse
import json
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

MIB = 1024 * 1024


def bench_args(doc: str | None, name: str, *, repeat: int) -> argparse.ArgumentParser:
    """A benchmark's command line: described by the first line of ``doc``, with
    ``--repeat`` (default ``repeat``) and ``--out`` (default
    ``bench/results-NAME.json``); the caller adds its own options."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    ap.add_argument("--repeat", type=int, default=repeat)
    ap.add_argument("--out", default=str(Path(__file__).with_name(f"results-{name}.json")))
    return ap


def prefault(nbytes: int) -> None:
    """Touch ``nbytes`` of fresh memory and free it at once (untimed, right
    before a timed arm).

    These machines are virtual: a guest page freed for a few seconds is
    handed back to the host (free page reporting) and the next allocation of
    it faults through the host, which made the same ``cp -r`` of 1 GiB take
    0.4 s or 4 s, even into tmpfs. Touching the memory an arm is about to
    allocate (page cache for the bytes it writes) and freeing it just before
    the arm puts warm pages on the guest's free lists, so each arm allocates
    at the guest's own speed and no arm pays for the host."""
    block = np.ones(nbytes, dtype=np.uint8)  # written: every page backed
    del block


def timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of one call."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def alternating(repeat: int) -> Iterator[tuple[bool, bool]]:
    """``repeat`` pairs (True, False), (False, True), ...: the side timed first
    alternates, so drift (page cache, disk, load) hits both sides alike."""
    for i in range(repeat):
        yield (True, False) if i % 2 == 0 else (False, True)


def make_release_dir(path: Path, size_mib: int, *, safetensors: bool = False) -> None:
    """Write ``model.safetensors`` (3/4 of ``size_mib``), ``extra/{a,b,c}.bin``
    (the rest) and ``config.json`` into a new folder ``path``, from a fixed
    seed. ``safetensors``: make the weights a valid safetensors file (one U8
    tensor; a publish reads its header), else raw random bytes."""
    path.mkdir(parents=True)
    rng = np.random.default_rng(0)
    weights = size_mib * 3 // 4
    sizes = {"model.safetensors": weights, "extra/a.bin": size_mib // 8,
             "extra/b.bin": size_mib // 16,
             "extra/c.bin": size_mib - weights - size_mib // 8 - size_mib // 16}
    for name, mib in sizes.items():
        dest = path / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as f:
            if name == "model.safetensors" and safetensors:
                n = mib * MIB
                header = json.dumps({"__metadata__": {"format": "pt"},
                                     "w": {"dtype": "U8", "shape": [n],
                                           "data_offsets": [0, n]}}).encode()
                header += b" " * (-len(header) % 8)
                f.write(struct.pack("<Q", len(header)) + header)
            for _ in range(mib):
                f.write(rng.bytes(MIB))
    (path / "config.json").write_text('{"hidden_size": 4096}\n')

"""A child process for the LoongSage async-save kill test (tests/test_loongsage.py).

``python tests/support/loongsage_child.py URL CHECKPOINT_PATH --kill EVENT:N``

Trains three steps with ``save_freq=1`` and async save. Step 1 is saved and
flushed (the tracker names it; prints ``LANDED 1``). Then the Store and
checkpoint methods of *this process only* are wrapped (no hook in library
code) and step 2 is saved asynchronously while the main thread keeps training
(calling ``on_step_start`` as a train loop does); the process SIGKILLs itself
at the N-th occurrence of EVENT counted from there:

``write``
    after each ``write`` to a file opened with ``Store.open_write`` (on the
    background writer thread: the save is half written);
``before:commit``
    before ``DirectoryWriter.commit`` (every file written, no manifest yet);
``before:set_latest``
    before the tracker moves (the write landed and is committed; the main
    thread's finalize is about to update the tracker).

Exits 0 printing ``FINALIZED`` if the event never happens. The S3 endpoint and
credentials come from the inherited ``AWS_*`` variables.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections import Counter
from typing import Any

import numpy as np

from tests.ckpt_util import adamw


def params(step: int) -> dict[str, np.ndarray]:
    """The model of step ``step``: deterministic, distinct per step."""
    rng = np.random.default_rng(step)
    return {"layer.weight": rng.standard_normal((64, 64), dtype=np.float32),
            "layer.bias": rng.standard_normal(64, dtype=np.float32)}


def save_kwargs(step: int) -> dict[str, Any]:
    p = params(step)
    return {"model": p, "optimizer_state": adamw(p), "optimizer": "adamw",
            "scheduler_state": {"lr": 0.001, "last_step": step},
            "rng_state": {"seed": 1234, "step": step},
            "data_sources": [{"prompt_data_path": "data/a.jsonl", "state": {"offset": step}}]}


class _Killer:
    def __init__(self, spec: str) -> None:
        event, _, nth = spec.rpartition(":")
        self.event, self.nth = event, int(nth)
        self.seen: Counter[str] = Counter()

    def __call__(self, event: str) -> None:
        self.seen[event] += 1
        if event == self.event and self.seen[event] == self.nth:
            print(f"KILL at {event} #{self.nth}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


class _WatchedFile:
    def __init__(self, raw: Any, emit: _Killer) -> None:
        self._raw, self._emit = raw, emit

    def write(self, data: bytes | memoryview) -> int:
        n = self._raw.write(data)
        self._emit("write")
        return n if n is not None else len(data)

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> _WatchedFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._raw.__exit__(*exc)


def arm(ckpt: Any, killer: _Killer) -> None:
    from registry.checkpoint.tree import CheckpointTree
    from registry.protocol.commit import DirectoryWriter

    real_open = ckpt.store.open_write
    ckpt.store.open_write = lambda key, **kw: _WatchedFile(real_open(key, **kw), killer)
    for cls, name in ((DirectoryWriter, "commit"), (CheckpointTree, "set_latest")):
        orig = getattr(cls, name)

        def wrapped(*a: Any, _orig: Any = orig, _name: str = name, **k: Any) -> Any:
            killer(f"before:{_name}")
            return _orig(*a, **k)

        setattr(cls, name, wrapped)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("checkpoint_path")
    ap.add_argument("--kill", required=True)
    args = ap.parse_args()
    from registry.checkpoint.loongsage import LoongSageCheckpointer

    ckpt = LoongSageCheckpointer(args.url, args.checkpoint_path, save_freq=1, total_steps=3,
                                 async_save=True)
    ckpt.on_step_start()
    ckpt.maybe_save(1, **save_kwargs(1))
    ckpt.wait()
    print("LANDED 1", flush=True)
    arm(ckpt, _Killer(args.kill))
    ckpt.on_step_start()
    ckpt.maybe_save(2, **save_kwargs(2))
    print("SCHEDULED 2", flush=True)
    deadline = time.monotonic() + 60
    while not ckpt.on_step_start():  # step 3 of the train loop keeps going meanwhile
        np.linalg.norm(np.ones((256, 256)) @ np.ones((256, 256)))
        if time.monotonic() > deadline:
            return 2
    ckpt.finish()
    print("FINALIZED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

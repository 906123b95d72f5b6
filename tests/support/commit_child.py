"""A child process for the crash and race tests (tests/test_crash.py, tests/test_race.py).

Run as ``python tests/support/commit_child.py MODE ...``; every mode works on a
store URL that other processes can reach (a local folder or ``s3://``; the S3
endpoint and credentials come from the inherited ``AWS_*`` variables).

Modes:

``commit URL PREFIX SRC_DIR --via local|writer``
    Commit a copy of the local directory SRC_DIR at PREFIX, either with
    :func:`commit_local_directory` or file by file with :class:`DirectoryWriter`.
    Exit 0 when committed; on a registry error print ``ERROR <ClassName>: <message>``
    and exit 3.

``counter URL KEY N``
    N read-modify-write increments of the integer pointer KEY with
    ``move_pointer(..., expected=<read value>, check_expected=True)``, re-reading
    and retrying after each PointerConflictError. Prints one JSON line:
    ``{"wrote": [values this process moved the pointer to], "conflicts": n}``.

``forward URL KEY --parity odd|even --last M``
    Move the forward-only pointer KEY to ``step-%06d`` for every step of the
    given parity up to M, in order, ignoring PointerRegressionError. Prints
    ``{"moved": [...], "regressions": n}``.

``crash URL --kill EVENT:N``
    Commit ``runs/r/ckpt/step-000002`` (three data files, each written in two
    chunks, then MANIFEST.json) with DirectoryWriter and move ``LATEST`` to it,
    SIGKILLing itself at the N-th occurrence of EVENT. Events come from wrapping
    the Store methods of this process only (no hook in library code):
    ``before:<method>`` / ``after:<method>`` for open_write, create, rename_dir,
    fsync_dir, swap, delete; ``write`` after each chunk written to a file opened
    with open_write; ``closed`` after such a file is closed (its bytes durable).
    Exits 0 (printing ``DONE``) if the event never happens.

Race modes take ``--ready FILE --go FILE``: the child imports everything and
opens its store, creates FILE ``--ready``, then waits until ``--go`` exists, so
that all children start the contested operation at the same instant.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from registry.protocol.commit import DirectoryWriter, commit_local_directory
from registry.errors import PointerConflictError, PointerRegressionError, RegistryError
from registry.protocol.manifest import list_local_files
from registry.protocol.pointer import move_pointer, read_pointer
from registry.store import Store, open_store

CKPT = "runs/r/ckpt"
STEP2 = f"{CKPT}/step-000002"
LATEST = f"{CKPT}/LATEST"

#: the data files of the crashing commit: name -> bytes (small, distinct).
CRASH_FILES: dict[str, bytes] = {
    "model.safetensors": b"M" * 3000 + b"model-step-2",
    "optimizer.bin": b"O" * 2000 + b"optim-step-2",
    "trainer_state.json": b'{"step": 2, "loss": 1.25}\n',
}


def step_order(value: str) -> int:
    return int(value.split("-")[1])


def barrier(ready: str | None, go: str | None, timeout: float = 120.0) -> None:
    if ready:
        Path(ready).touch()
    if go:
        deadline = time.monotonic() + timeout
        while not os.path.exists(go):
            if time.monotonic() > deadline:
                sys.exit("barrier: no go signal")
            time.sleep(0.0005)


# -- commit race ------------------------------------------------------------------


def cmd_commit(args: argparse.Namespace) -> int:
    store = open_store(args.url)
    files = list_local_files(args.src)
    barrier(args.ready, args.go)
    try:
        if args.via == "local":
            commit_local_directory(store, args.src, args.prefix, kind="checkpoint",
                                   run_id="r", step=1)
        else:
            with DirectoryWriter(store, args.prefix, kind="checkpoint",
                                 meta={"run_id": "r", "step": 1}) as w:
                for rel in files:
                    with w.open(rel) as f:
                        data = Path(args.src, *rel.split("/")).read_bytes()
                        half = len(data) // 2  # two chunks: more interleaving
                        f.write(data[:half])
                        f.write(data[half:])
                w.commit()
    except RegistryError as e:
        print(f"ERROR {type(e).__name__}: {e}", flush=True)
        return 3
    print("COMMITTED", flush=True)
    return 0


# -- pointer races ------------------------------------------------------------------


def cmd_counter(args: argparse.Namespace) -> int:
    store = open_store(args.url)
    barrier(args.ready, args.go)
    wrote: list[int] = []
    conflicts = 0
    while len(wrote) < args.n:
        current = read_pointer(store, args.key)
        assert current is not None, "the counter must exist before the race"
        n = int(current)
        try:
            move_pointer(store, args.key, str(n + 1), expected=current, check_expected=True)
        except PointerConflictError:
            conflicts += 1
            continue
        wrote.append(n + 1)
    print(json.dumps({"wrote": wrote, "conflicts": conflicts}), flush=True)
    return 0


def cmd_forward(args: argparse.Namespace) -> int:
    store = open_store(args.url)
    barrier(args.ready, args.go)
    first = 1 if args.parity == "odd" else 2
    moved: list[str] = []
    regressions = 0
    for step in range(first, args.last + 1, 2):
        value = f"step-{step:06d}"
        try:
            move_pointer(store, args.key, value, order=step_order)
        except PointerRegressionError:
            regressions += 1
            continue
        moved.append(value)
    print(json.dumps({"moved": moved, "regressions": regressions}), flush=True)
    return 0


# -- crash ------------------------------------------------------------------------------


class _Killer:
    """Counts events and SIGKILLs this process at the chosen occurrence."""

    def __init__(self, spec: str) -> None:
        event, _, nth = spec.rpartition(":")
        self.event = event
        self.nth = int(nth)
        self.seen: Counter[str] = Counter()

    def __call__(self, event: str) -> None:
        self.seen[event] += 1
        print(f"event {event} #{self.seen[event]}", file=sys.stderr, flush=True)
        if event == self.event and self.seen[event] == self.nth:
            print(f"KILL at {event} #{self.nth}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


class _WatchedFile:
    """Wraps a file from Store.open_write: an event after each write and close."""

    def __init__(self, raw: Any, emit: _Killer) -> None:
        self._raw = raw
        self._emit = emit

    def write(self, data: bytes | memoryview) -> int:
        n = self._raw.write(data)
        self._emit("write")
        return n if n is not None else len(data)

    def close(self) -> None:
        self._raw.close()
        self._emit("closed")

    def discard(self) -> None:
        self._raw.discard()

    def __enter__(self) -> _WatchedFile:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._raw.__exit__(exc_type, *rest)
        if exc_type is None:
            self._emit("closed")


def install_killer(store: Store, killer: _Killer) -> None:
    """Wrap this process's Store class so each primitive reports its boundaries."""
    cls = type(store)

    def wrap(name: str) -> None:
        original = getattr(cls, name)

        @functools.wraps(original)
        def wrapper(self: Store, *a: Any, **kw: Any) -> Any:
            killer(f"before:{name}")
            result = original(self, *a, **kw)
            if name == "open_write":
                result = _WatchedFile(result, killer)
            killer(f"after:{name}")
            return result

        setattr(cls, name, wrapper)

    for name in ("open_write", "create", "rename_dir", "fsync_dir", "swap", "delete"):
        wrap(name)


def cmd_crash(args: argparse.Namespace) -> int:
    store = open_store(args.url)
    install_killer(store, _Killer(args.kill))
    with DirectoryWriter(store, STEP2, kind="checkpoint",
                         meta={"run_id": "r", "step": 2}) as w:
        for name, data in CRASH_FILES.items():
            with w.open(name) as f:
                half = len(data) // 2
                f.write(data[:half])
                f.write(data[half:])
        w.commit()
    move_pointer(store, LATEST, "step-000002", order=step_order)
    print("DONE", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="commit_child")
    sub = p.add_subparsers(dest="mode", required=True)

    def race(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--ready")
        sp.add_argument("--go")

    c = sub.add_parser("commit")
    c.add_argument("url")
    c.add_argument("prefix")
    c.add_argument("src")
    c.add_argument("--via", choices=["local", "writer"], default="local")
    race(c)
    c.set_defaults(func=cmd_commit)

    k = sub.add_parser("counter")
    k.add_argument("url")
    k.add_argument("key")
    k.add_argument("n", type=int)
    race(k)
    k.set_defaults(func=cmd_counter)

    f = sub.add_parser("forward")
    f.add_argument("url")
    f.add_argument("key")
    f.add_argument("--parity", choices=["odd", "even"], required=True)
    f.add_argument("--last", type=int, required=True)
    race(f)
    f.set_defaults(func=cmd_forward)

    x = sub.add_parser("crash")
    x.add_argument("url")
    x.add_argument("--kill", required=True)
    x.set_defaults(func=cmd_crash)

    args = p.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

"""A child process for the pull race and kill tests (tests/test_pull.py).

Run as ``python tests/support/pull_child.py MODE ...``; the store URL is a
local folder or ``s3://`` (the S3 endpoint and credentials come from the
inherited ``AWS_*`` variables).

Modes:

``race URL MODEL_ID VERSION BASE REPS``
    For each repetition ``r`` in ``range(REPS)``: create
    ``BASE/ready-<r>-<pid>``, wait until ``BASE/go-<r>`` exists, then pull the
    release into cache ``BASE/<r>/cache`` and target ``BASE/<r>/model`` (the same
    for every child of the race) and re-hash what was materialized. Prints one
    JSON line per repetition: ``{"rep", "ok", "placed", "error"}``. Exits 0
    when every repetition succeeded and verified, else 1.

``stall URL MODEL_ID VERSION CACHE TARGET PHASE``
    Pull the release, but stall forever at one point so that the parent can
    SIGKILL this process there. It prints ``STALL`` (flushed) when it stalls.
    ``stream``: after the first chunk of a streamed (small) file was received
    (``STREAM_CHUNK`` is 1 KiB here); ``ranged``: after the first byte range of
    a large file was received (``RANGE_THRESHOLD`` 1 MiB, ``RANGE_SIZE``
    256 KiB here); ``place``: after the first file was copied (or reflinked)
    into the staging directory; ``pieces``: after 160 KiB of a file streamed
    in 16 KiB blocks (the resume tests publish 64 KiB pieces). The stall comes from patching this process's
    Store class and ``registry.pull.materialize.place_file`` only (no hook in
    library code). Exits 0 (printing
    ``DONE``) if it never stalled.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from registry.errors import RegistryError
from registry.pull import download, pull
from registry.pull.materialize import verify_materialized
from registry.store import open_store
from registry.protocol.verify import read_manifest


def race(url: str, model_id: str, version: str, base: str, reps: int) -> int:
    store = open_store(url)
    manifest = read_manifest(store, f"models/{model_id}/{version}")  # warm up connections
    failures = 0
    for rep in range(reps):
        open(os.path.join(base, f"ready-{rep}-{os.getpid()}"), "w").close()
        go = os.path.join(base, f"go-{rep}")
        deadline = time.monotonic() + 120
        while not os.path.exists(go):
            if time.monotonic() > deadline:
                sys.exit("barrier: no go signal")
            time.sleep(0.0005)
        line: dict[str, object] = {"rep": rep, "ok": False, "placed": None, "error": None}
        try:
            r = pull(store, model_id, version, cache=os.path.join(base, str(rep), "cache"),
                     to=os.path.join(base, str(rep), "model"), workers=4)
            problems = verify_materialized(Path(r.path), manifest)
            line["placed"] = r.placed
            line["ok"] = not problems
            if problems:
                line["error"] = "; ".join(str(p) for p in problems)
        except Exception as e:  # report every failure, registry error or not
            line["error"] = f"{type(e).__name__}: {e}"
        if not line["ok"]:
            failures += 1
        print(json.dumps(line), flush=True)
    return 1 if failures else 0


_STALLED = threading.Lock()


def stall_forever() -> None:
    """Announce the stall once (several download threads may get here), then hang."""
    if _STALLED.acquire(blocking=False):
        print("STALL", flush=True)
    time.sleep(600)


def _stall_direct(phase: str) -> None:
    """The same stall in an S3 pull's direct ranged GETs (registry.pull.s3fetch):
    segments of 1 KiB (``stream``, ``ranged``: stall at the second received) or
    16 KiB (``pieces``: stall in the GET of any piece from the third on)."""
    from registry.pull import s3fetch
    from registry.store.s3direct import DirectReader

    s3fetch.SEGMENT = 16 * 1024 if phase == "pieces" else 1024
    # pieces: the GETs of pieces 0 and 1 complete (verified, logged), every later
    # one stalls at its first segment, whichever thread runs first
    from_offset = 2 * int(os.environ.get("REGISTRY_PIECE_SIZE", "0")) if phase == "pieces" \
        else None
    original = DirectReader.read_into
    seen = [0]
    lock = threading.Lock()

    def read_into(self, key, start, segments):  # type: ignore[no-untyped-def]
        for view in original(self, key, start, segments):
            with lock:
                n = seen[0]
                seen[0] += 1
            if (start >= from_offset) if from_offset else n >= 1:
                time.sleep(0.2)  # let the landed segments reach the temp file
                stall_forever()
            yield view

    DirectReader.read_into = read_into  # type: ignore[method-assign]


def stall(url: str, model_id: str, version: str, cache: str, target: str, phase: str) -> int:
    store = open_store(url)
    cls = type(store)
    if phase == "stream":
        download.STREAM_CHUNK = 1024
        original_iter = cls.iter_read

        def iter_read(self, key, chunk=1024):  # type: ignore[no-untyped-def]
            # (the manifest is read through iter_read too, bounded: not a file of the release)
            for i, block in enumerate(original_iter(self, key, chunk)):
                if i == 1 and not key.endswith("MANIFEST.json"):
                    stall_forever()
                yield block

        cls.iter_read = iter_read  # type: ignore[method-assign]
    elif phase == "ranged":
        download.RANGE_THRESHOLD = 1024 * 1024
        download.MIN_SEGMENT = 256 * 1024
        download.STREAM_CHUNK = 1024
        download.PROBE_SECONDS = download.MIN_SPLIT_SECONDS = download.SPLIT_FACTOR = 0.0
        original_range = cls.iter_range

        def iter_range(self, key, start, end, chunk=1024):  # type: ignore[no-untyped-def]
            for i, block in enumerate(original_range(self, key, start, end, chunk)):
                if i == 1:
                    time.sleep(0.2)  # let the first blocks land in the temp file
                    stall_forever()
                yield block

        cls.iter_range = iter_range  # type: ignore[method-assign]
    elif phase == "pieces":
        download.STREAM_CHUNK = 16 * 1024
        cls.local_path = lambda self, key: None  # type: ignore[method-assign] # stream it
        original_iter = cls.iter_read

        def iter_read(self, key, chunk=1024):  # type: ignore[no-untyped-def]
            for i, block in enumerate(original_iter(self, key, chunk)):
                if i == 10:  # 160 KiB landed: the pieces before are checked and logged
                    stall_forever()
                yield block

        cls.iter_read = iter_read  # type: ignore[method-assign]
    elif phase == "place":
        import importlib
        materialize = importlib.import_module("registry.pull.materialize")
        original_place = materialize.place_file

        def place_file(*a, **kw):  # type: ignore[no-untyped-def]
            how = original_place(*a, **kw)
            stall_forever()
            return how

        materialize.place_file = place_file
    else:
        sys.exit(f"unknown phase {phase!r}")
    if phase != "place":
        _stall_direct(phase)
    try:
        pull(store, model_id, version, cache=cache, to=target, workers=2)
    except RegistryError as e:
        print(f"ERROR {type(e).__name__}: {e}", flush=True)
        return 3
    print("DONE", flush=True)
    return 0


def main(argv: list[str]) -> int:
    mode, *args = argv
    if mode == "race":
        url, model_id, version, base, reps = args
        return race(url, model_id, version, base, int(reps))
    if mode == "stall":
        return stall(*args)
    sys.exit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

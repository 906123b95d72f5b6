"""Child processes for the prune-beside-pull race (tests/test_cache_admin.py).

``pull STORE CACHE BASE ROUNDS VERSION...``
    For each round, pull every version of ``tiny``: in even rounds into a new
    ``--to`` directory under BASE (then re-hashed against the manifest), in
    odd rounds into the cache's own directory (``verify=True``: re-hashed
    before it is placed). Prints one JSON line per pull ``{"round",
    "version", "ok", "error"}``; exits 0.

``prune CACHE STOP``
    Prune everything it may (``keep_last=0``) in a loop until the file STOP
    exists; prints ``{"prunes", "pruned_versions", "blobs_removed"}``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from registry.pull import pull
from registry.pull.cache_admin import PullCache
from registry.pull.materialize import verify_materialized
from registry.store import open_store
from registry.protocol.verify import read_manifest


def pulls(url: str, cache: str, base: str, rounds: int, versions: list[str]) -> int:
    store = open_store(url)
    for r in range(rounds):
        for v in versions:
            line: dict[str, object] = {"round": r, "version": v, "ok": False, "error": None}
            try:
                if r % 2 == 0:
                    to = Path(base) / f"{r}-{v}"
                    res = pull(store, "tiny", v, cache=cache, to=to, workers=2)
                    problems = verify_materialized(Path(res.path),
                                                   read_manifest(store, f"models/tiny/{v}"))
                    line["ok"] = not problems
                    line["error"] = "; ".join(map(str, problems)) or None
                else:
                    pull(store, "tiny", v, cache=cache, workers=2, verify=True)
                    line["ok"] = True
            except Exception as e:  # report every failure
                line["error"] = f"{type(e).__name__}: {e}"
            print(json.dumps(line), flush=True)
    return 0


def prunes(cache: str, stop: str) -> int:
    n = versions = blobs = 0
    while not os.path.exists(stop):
        r = PullCache(cache).prune(keep_last=0)
        n += 1
        versions += len(r.pruned)
        blobs += r.blobs_removed
    print(json.dumps({"prunes": n, "pruned_versions": versions, "blobs_removed": blobs}))
    return 0


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "pull":
        sys.exit(pulls(args[0], args[1], args[2], int(args[3]), args[4:]))
    sys.exit(prunes(args[0], args[1]))

"""Issue 13 item 10: pointer swaps on filesystems whose ``flock`` locks nothing.

Writers run as real processes with ``fcntl.flock`` stubbed to a no-op: a
compare-and-swap that relied on it (and on a fixed ``<name>.tmp``) lost
updates. Here every increment of a shared counter pointer must survive, and
of two concurrent ``alias set`` the pointer ends at a value whose command
reported success. On S3 the same races run against ``If-Match``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from registry.refs.alias_history import read_head
from registry.protocol.commit import commit_local_directory
from registry.protocol.pointer import read_pointer
from registry.store import open_store
from tests.conftest import REPO
from tests.support.forkclient import python_popen, python_run

WRITERS, INCREMENTS = 3, 25


def _spawn(*args: str) -> subprocess.Popen[str]:
    return python_popen([sys.executable, "-m", "tests.support.cas_child", *args],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_no_update_is_lost_without_flock(durable_store_url: str) -> None:
    procs = [_spawn(durable_store_url, "runs/r/ckpt/LATEST", str(INCREMENTS))
             for _ in range(WRITERS)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    store = open_store(durable_store_url)
    assert read_pointer(store, "runs/r/ckpt/LATEST") == f"n{WRITERS * INCREMENTS:06d}"
    leftovers = [n for n, _ in store.list_dir("runs/r/ckpt") if n != "LATEST"]
    assert leftovers == [], leftovers  # no temp or lock file stays behind


def test_two_alias_sets_without_flock(durable_store_url: str, tmp_path: Path) -> None:
    store = open_store(durable_store_url)
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"w")
    for v in ("1", "2"):
        commit_local_directory(store, src, f"models/m/{v}", kind="checkpoint", run_id="r",
                               step=int(v))
    for _ in range(3):
        procs = {v: _spawn(durable_store_url, "alias", "m", "prod", v) for v in ("1", "2")}
        said = {v: p.communicate(timeout=300)[0].strip() for v, p in procs.items()}
        assert all(p.returncode == 0 for p in procs.values()), said
        final = read_head(store, "m", "prod").version
        assert said[final] == "ok", (final, said)  # never the value of a failed command
    assert sorted(store.list_dir("models/m/refs")) == [("prod", False)]


def test_a_dead_writers_lock_is_broken(tmp_path: Path) -> None:
    import json
    import os
    import socket

    from registry.protocol.pointer import move_pointer
    store = open_store(str(tmp_path / "store"))
    move_pointer(store, "p", "a")
    dead = python_run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    lock = tmp_path / "store" / "p.lock"
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead), "token": "x"}))
    move_pointer(store, "p", "b")  # not blocked by a dead process's lock
    # A live owner on another host, past its lease: broken too.
    lock.write_text(json.dumps({"host": "elsewhere", "pid": 1, "token": "y"}))
    os.utime(lock, (1, 1))
    move_pointer(store, "p", "c")
    assert read_pointer(store, "p") == "c" and not lock.exists()

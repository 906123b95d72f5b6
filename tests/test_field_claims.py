"""Issue 13 item 8: a crashed writer's claim never blocks a directory forever.

A claim records its writer (host, pid, start) and a lease it renews while it
works. Before the lease lapses another writer is refused with a message that
names the claim's writer, its age and the command that clears it; a claim
whose writer is gone (a dead process on this host, or a lapsed lease) is
taken over by exactly one recoverer; ``registry gc`` removes it at once and
never removes a live one. On local disk the same holds for a staging
directory and its claim."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from registry.protocol.claim import Claim
from registry.protocol.commit import DirectoryWriter
from registry.errors import CommitConflictError, ObjectExistsError
from registry.store import open_store
from registry.protocol.verify import verify_directory
from tests.conftest import REPO, run_cli
from tests.support.forkclient import python_popen


def _claimer(url: str, prefix: str) -> tuple[subprocess.Popen[str], str]:
    p = python_popen([sys.executable, "-m", "tests.support.claim_child", url, prefix],
                         cwd=REPO, stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, REGISTRY_CLAIM_LEASE="600"))
    assert p.stdout is not None
    staging = p.stdout.readline().strip()
    p.stdout.close()
    assert staging, "the child did not claim"
    return p, staging


def _commit(store, prefix: str) -> None:  # type: ignore[no-untyped-def]
    with DirectoryWriter(store, prefix, kind="checkpoint", meta={"run_id": "r", "step": 1}) as w:
        w.write_bytes("model.bin", b"m" * 100)
        w.commit()


def test_a_killed_writers_claim_is_taken_over(durable_store_url: str) -> None:
    store = open_store(durable_store_url)
    prefix = "models/big/1"
    child, staging = _claimer(durable_store_url, prefix)
    try:
        if not store.atomic_rename:  # S3: the second writer is refused, told whom and how
            try:
                _commit(store, prefix)
                raise AssertionError("a live claim was overridden")
            except CommitConflictError as e:
                msg = str(e)
            assert f"pid {child.pid}" in msg and "last seen" in msg and "expires in" in msg
            assert f"registry gc --store {durable_store_url} --break-claims" in msg
        # A live writer's claim (and staging directory) survive gc, whatever their age.
        r = run_cli("gc", "--older-than", "0s", "--store", durable_store_url, "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["removed"] == [], r.stdout
        assert store.exists(f"{staging}/partial.bin")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    # Its process is gone: the claim can be taken over now, without waiting.
    _commit(store, prefix)
    assert verify_directory(store, prefix, full=True).ok
    assert store.walk_files(prefix) == {"MANIFEST.json": 1, "model.bin": 100} or \
        "partial.bin" not in store.walk_files(prefix)


def test_gc_removes_a_dead_writers_claim_at_once(durable_store_url: str) -> None:
    store = open_store(durable_store_url)
    child, staging = _claimer(durable_store_url, "models/big/1")
    child.send_signal(signal.SIGKILL)
    child.wait()
    r = run_cli("gc", "--store", durable_store_url, "--json")  # the default --older-than 1h
    assert r.returncode == 0, r.stderr
    removed = json.loads(r.stdout)["removed"]
    assert any(k.endswith(".claim") for k in removed), removed
    assert store.walk_files("models/big") == {}
    assert not store.exists(f"{staging}/partial.bin")


def test_a_lapsed_lease_on_another_host(durable_store_url: str) -> None:
    """A claim from another host: live until its lease lapses, then taken
    over by exactly one of two recoverers racing for it."""
    store = open_store(durable_store_url)
    store.ensure_root()
    key = "models/big/1.claim"
    store.create(key, json.dumps({"owner": "x", "host": "elsewhere", "pid": 1,
                                  "started_at": "2026-01-01T00:00:00Z",
                                  "lease_seconds": 2.0}).encode())
    try:
        Claim(store, key).take()
        raise AssertionError("a live claim was taken")
    except ObjectExistsError as e:
        assert e.state.host == "elsewhere" and e.state.live  # type: ignore[attr-defined]
    time.sleep(3.5)  # the lease (2 s) on the store's stamps (one-second resolution on S3)
    wins, barrier = [], threading.Barrier(2)

    def recover() -> None:
        claim = Claim(store, key, lease=60)
        barrier.wait()
        try:
            claim.take()
            wins.append(claim)
        except ObjectExistsError:
            pass

    threads = [threading.Thread(target=recover) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    wins[0].release()
    assert not store.exists(key)


def test_a_writer_that_lost_its_claim_cannot_touch_the_release(durable_store_url: str) -> None:
    """Issue 13 item 9: writer A is stopped mid-upload until its lease lapses;
    B takes over and commits; A resumes and finishes its PUT: it fails (a
    conditional create, or the lost claim), and B's release still verifies
    with B's bytes only."""
    store = open_store(durable_store_url)
    prefix = "models/big/1"
    a = python_popen([sys.executable, "-m", "tests.support.claim_child", durable_store_url,
                          prefix, "late"], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, REGISTRY_CLAIM_LEASE="1.5"))
    assert a.stdout is not None and a.stdout.readline().strip()
    a.send_signal(signal.SIGSTOP)
    try:
        # A's lease (1.5 s on S3's one-second stamps) lapses; A is alive, only stalled
        time.sleep(3.0)
        _commit(store, prefix)
    finally:
        a.send_signal(signal.SIGCONT)
    _, err = a.communicate(timeout=120)
    assert a.returncode != 0, err
    if not store.atomic_rename:
        assert "another object is already there" in err or "lost its claim" in err, err
    else:
        assert "already committed" in err, err
    assert verify_directory(store, prefix, full=True).ok
    assert store.read_bytes(f"{prefix}/model.bin") == b"m" * 100
    assert sorted(store.walk_files(prefix)) == ["MANIFEST.json", "model.bin"]

"""No decision depends on two hosts' clocks agreeing (issue 31 items 1 and 7):
claims and writer leases are judged by the store's stamps against the store's
own time (a probe object), so a gc host 15 minutes ahead or behind, or an S3
server whose clock is off (a proxy shifting LastModified and Date), never
takes a live claim; a difference beyond the tolerance is reported and gc
leaves every claim alone while it holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from registry.checkpoint.lease import WriterLease
from registry.protocol.claim import Claim
from registry.errors import RunLeasedError
from registry.lifecycle.gc import collect
from registry.store import Store, open_store
from registry.protocol.storeclock import store_time
from tests.conftest import REPO, proxied
from tests.support.faultproxy import FaultProxy
from tests.support.skewproxy import ServerClock
from tests.support.forkclient import python_run

SKEW = 900.0  # 15 minutes, beyond the 600 s claim lease


def _skewed_gc(offset: float, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return python_run([sys.executable, "-m", "tests.support.skewed_cli", str(offset),
                           "gc", "--store", url, "--older-than", "1h", "--json", *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


def _live_publisher(store: Store, version: str) -> None:
    """A publisher on another host, mid-publish: its claim was renewed just
    now (600 s lease) and its files are in place (object stores) or staged."""
    store.ensure_root()
    store.create(f"models/m/{version}.claim", json.dumps({
        "owner": "o", "host": "another-host", "pid": 7, "started_at": "2026-12-01T00:00:00Z",
        "lease_seconds": 600.0}).encode())
    store.write_bytes(f"models/m/{version}/model.safetensors", b"x" * 64)


@pytest.mark.parametrize("offset", [SKEW, -SKEW])
def test_gc_on_a_host_whose_clock_is_off(durable_store_url: str, offset: float) -> None:
    store = open_store(durable_store_url)
    _live_publisher(store, "1")
    r = _skewed_gc(offset, durable_store_url, "--break-claims")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    held = " ".join(doc["warnings"])
    assert doc["removed"] == [] and "claims are left alone" in held
    assert ("ahead of" if offset < 0 else "behind") in held
    assert store.exists("models/m/1.claim") and store.exists("models/m/1/model.safetensors")
    r = _skewed_gc(offset, durable_store_url)  # without --break-claims: the same
    assert json.loads(r.stdout)["removed"] == []
    assert store.exists("models/m/1/model.safetensors")


def test_an_expired_claim_waits_while_the_clocks_disagree(tmp_path: Path) -> None:
    """Local disk: a claim last renewed two hours ago (its mtime) is taken
    over by a gc whose clock agrees with the store, never by one 15 minutes
    off (the refusal is the rule while it holds)."""
    url = str(tmp_path / "store")
    store = open_store(url)
    _live_publisher(store, "1")
    old = time.time() - 7200
    for key in ("models/m/1.claim", "models/m/1/model.safetensors"):
        os.utime(store.local_path(key), (old, old))
    r = _skewed_gc(SKEW, url)
    assert json.loads(r.stdout)["removed"] == [] and store.exists("models/m/1.claim")
    r = _skewed_gc(0, url)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["warnings"] == []
    assert not store.exists("models/m/1.claim") and store.walk_files("models") == {}


@pytest.mark.parametrize("offset", [SKEW, -SKEW])
def test_an_s3_server_whose_clock_is_off(proxy: FaultProxy, s3_bucket: str,
                                         offset: float) -> None:
    url = f"s3://{s3_bucket}/root"
    proxy.rules.append(ServerClock(offset))
    store = proxied(url, proxy)
    _live_publisher(store, "1")
    clock = store_time(store)
    assert abs(clock.skew - offset) < 5 and clock.skewed()
    held: list[str] = []
    assert collect(store, older_than=0, warn=held.append, break_claims=True) == []
    assert held and store.exists("models/m/1/model.safetensors")
    # The claim's own age is right whatever the server's clock says: live.
    claim = Claim(store, "models/m/1.claim")
    with pytest.raises(Exception, match="claimed"):
        claim.take()


def test_a_writer_lease_is_not_taken_by_a_host_ahead(store: Store,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Writer A holds a run's lease (120 s); B's host is 15 minutes ahead: its
    clock says A's ``expires`` passed long ago, the store's stamps say A
    renewed just now. B is refused."""
    a = WriterLease(store, "runs/r/ckpt", seconds=120)
    store.ensure_root()
    a.hold()
    real = time.time
    with monkeypatch.context() as mp:
        mp.setattr(time, "time", lambda: real() + SKEW)
        b = WriterLease(store, "runs/r/ckpt", seconds=120)
        with pytest.raises(RunLeasedError, match="another process is writing"):
            b.hold()
    a.hold()  # still A's

"""Resumable pulls (issue 28, item 5): a killed pull's partial file and its log of verified
pieces; the next pull re-checks them and fetches only the rest (registry.pull.resume).

The pull is a real process stalled mid-file (tests/support/pull_child.py ``pieces``) and
SIGKILLed; local disk and S3 (blobs kept on both: ``REGISTRY_PULL_BLOBS=always``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from registry.pull import pull
from registry.release import ModelRelease
from registry.store import open_store
from registry.protocol.verify import read_manifest
from tests.release_util import ledger_row, summary
from tests.test_pull import CHILD, _safetensors, read_line
from tests.support.forkclient import python_popen

PIECE = 64 * 1024
SIZE = 20 * PIECE + 999


@pytest.fixture
def released(durable_store_url: str, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> tuple[str, bytes]:
    monkeypatch.setenv("REGISTRY_PIECE_SIZE", str(PIECE))
    monkeypatch.setenv("REGISTRY_PULL_BLOBS", "always")
    src = tmp_path / "src"
    src.mkdir()
    data = random.Random(5).randbytes(SIZE)
    (src / "weights.bin").write_bytes(data)
    (src / "model.safetensors").write_bytes(_safetensors())
    (src / "config.json").write_text('{"hidden_size": 8}\n')
    ModelRelease(durable_store_url).publish(src, "tiny", "1", ledger=[ledger_row()],
                                            eval_summary=summary())
    return durable_store_url, data


def _kill_mid_file(url: str, cache: Path, target: Path) -> tuple[Path, list[int]]:
    proc = python_popen([sys.executable, str(CHILD), "stall", url, "tiny", "1", str(cache),
                             str(target), "pieces"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "REGISTRY_PULL_DIGEST": "sha256"})
    try:
        assert read_line(proc, 120) == "STALL"
        deadline = time.monotonic() + 30
        while True:  # the piece checks run on other threads: wait for their log
            logs = list((cache / "tmp").glob("*.incomplete.pieces"))
            have = json.loads(logs[0].read_text()) if logs else []
            if len(have) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
    partials = [p for p in (cache / "tmp").glob(f"*.pid{proc.pid}.*.incomplete")
                if p.with_name(p.name + ".pieces").exists()]
    assert len(partials) == 1 and len(have) >= 2, (partials, have)
    return partials[0], have


def test_a_killed_pull_resumes_from_its_verified_pieces(released: tuple[str, bytes],
                                                        tmp_path: Path) -> None:
    url, data = released
    cache, target = tmp_path / "cache", tmp_path / "model"
    partial, have = _kill_mid_file(url, cache, target)
    assert partial.read_bytes()[:len(have) * PIECE] == data[:len(have) * PIECE]
    store = open_store(url)
    r = pull(store, "tiny", "1", to=target, cache=cache, workers=2)
    assert (target / "weights.bin").read_bytes() == data
    small = sum(e.size for e in read_manifest(store, "models/tiny/1").files
                if e.path != "weights.bin")
    assert r.transferred <= SIZE - len(have) * PIECE + small  # only what the partial lacked
    assert os.listdir(cache / "tmp") == []  # claimed, completed, nothing left


def test_a_resumed_pull_rechecks_the_pieces_it_kept(released: tuple[str, bytes],
                                                    tmp_path: Path) -> None:
    url, data = released
    cache, target = tmp_path / "cache", tmp_path / "model"
    partial, have = _kill_mid_file(url, cache, target)
    raw = bytearray(partial.read_bytes())
    raw[PIECE + 5] ^= 1  # a logged piece changed on disk since it was checked
    partial.write_bytes(bytes(raw))
    store = open_store(url)
    r = pull(store, "tiny", "1", to=target, cache=cache, workers=2)
    assert (target / "weights.bin").read_bytes() == data
    blob = cache / "blobs" / "sha256" / hashlib.sha256(data).hexdigest()
    assert blob.read_bytes() == data
    assert r.transferred >= SIZE - (len(have) - 1) * PIECE  # piece 1 fetched again

"""Issue 18 item 4: LoongSage rollout data, ``<rollout_data_path>/step_<step>.pt``
committed with a manifest and verified on read; API on memory, local disk and
S3, and ``registry ckpt rollout``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from registry.checkpoint.loongsage_rollout import RolloutData
from registry.errors import (
    CheckpointError,
    CommitConflictError,
    IntegrityError,
    ManifestError,
    NotCommittedError,
    RunLeasedError,
)
from registry.protocol.manifest import parse_manifest
from registry.store import Store, open_store
from tests.conftest import run_cli
from tests.support.forkclient import python_run

PATH = "exp/rollout_data"


def trajectories(step: int) -> list[dict[str, object]]:
    return [{"prompt": i, "tokens": torch.arange(step + i), "reward": 0.5 * i}
            for i in range(3)]


def same(a: list[dict[str, object]], b: list[dict[str, object]]) -> bool:
    return len(a) == len(b) and all(
        x["prompt"] == y["prompt"] and x["reward"] == y["reward"]
        and torch.equal(x["tokens"], y["tokens"]) for x, y in zip(a, b))  # type: ignore[arg-type]


def test_write_commit_read(store: Store) -> None:
    with RolloutData(PATH, store=store, run_id="roll") as rd:
        for step in (3, 1, 2):
            got = rd.write(step, trajectories(step))
            assert got.path == store.url_of(f"{PATH}/step_{step}.pt")
    assert sorted(store.walk_files(PATH)) == [
        "WRITER.lease", "step_1.MANIFEST.json", "step_1.pt", "step_2.MANIFEST.json",
        "step_2.pt", "step_3.MANIFEST.json", "step_3.pt"]
    m = parse_manifest(store.read_bytes(f"{PATH}/step_2.MANIFEST.json"), source="m")
    assert (m.kind, m.meta["run_id"], m.meta["step"], m.meta["layout"]) == (
        "checkpoint", "roll", 2, "loongsage-rollout")
    assert [(e.path, e.size) for e in m.files] == [
        ("step_2.pt", len(store.read_bytes(f"{PATH}/step_2.pt")))]
    reader = RolloutData(PATH, store=store)  # a train-only run: no lease taken
    assert reader.steps() == [1, 2, 3]
    for step in (1, 2, 3):
        assert same(reader.read(step), trajectories(step))
    assert reader.verify(2).manifest.digest == m.digest


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "no-marker", "other-step"])
def test_read_verifies_against_the_manifest(store: Store, damage: str) -> None:
    with RolloutData(PATH, store=store) as rd:
        rd.write(1, trajectories(1))
        rd.write(2, trajectories(2))
    key = f"{PATH}/step_2.pt"
    data = store.read_bytes(key)
    expected: type[Exception]
    if damage == "flip":
        store.write_bytes(key, data[:-1] + bytes([data[-1] ^ 1]))
        expected, needle = IntegrityError, "step_2.pt: sha256"
    elif damage == "truncate":
        store.write_bytes(key, data[:-5])
        expected, needle = IntegrityError, f"step_2.pt: size {len(data) - 5} bytes"
    elif damage == "delete":
        store.delete(key)
        expected, needle = IntegrityError, "step_2.pt: missing"
    elif damage == "no-marker":  # a writer killed before its commit
        store.delete(f"{PATH}/step_2.MANIFEST.json")
        expected, needle = NotCommittedError, "a write that did not finish"
    else:
        store.delete(f"{PATH}/step_2.MANIFEST.json")
        store.write_bytes(f"{PATH}/step_2.MANIFEST.json",
                          store.read_bytes(f"{PATH}/step_1.MANIFEST.json"))
        expected, needle = ManifestError, "must list exactly step_2.pt"
    rd = RolloutData(PATH, store=store)
    with pytest.raises(expected, match=needle):
        rd.read(2)
    assert same(rd.read(1), trajectories(1))


def test_committed_steps_are_never_overwritten_and_half_writes_are_replaced() -> None:
    store = open_store("memory://rollout-over")
    with RolloutData(PATH, store=store) as rd:
        rd.write(1, trajectories(1))
        before = store.read_bytes(f"{PATH}/step_1.pt")
        with pytest.raises(CommitConflictError, match="already committed"):
            rd.write(1, trajectories(9))
        assert store.read_bytes(f"{PATH}/step_1.pt") == before
        store.write_bytes(f"{PATH}/step_2.pt", b"half written by a killed writer")
        assert rd.steps() == [1]
        rd.write(2, trajectories(2))
        assert same(rd.read(2), trajectories(2))


def test_one_writer_at_a_time_and_bad_input_writes_nothing() -> None:
    store = open_store("memory://rollout-lease")
    with RolloutData(PATH, store=store) as first:
        first.write(1, [1])
        with pytest.raises(RunLeasedError):
            RolloutData(PATH, store=store).write(2, [2])
        with pytest.raises(CheckpointError, match="step_5.pt: cannot be saved"):
            first.write(5, [object()])
    assert not store.exists(f"{PATH}/step_2.pt") and not store.exists(f"{PATH}/step_5.pt")


def test_default_path_is_dot_rollout_data(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with RolloutData() as rd:
        rd.write(7, {"x": torch.ones(3)})
    assert (tmp_path / "rollout_data" / "step_7.pt").is_file()
    assert RolloutData("./rollout_data").steps() == [7]


def test_cli_rollout(durable_store_url: str) -> None:
    store = open_store(durable_store_url)
    with RolloutData(PATH, store=store) as rd:
        rd.write(1, trajectories(1))
        rd.write(2, trajectories(2))
    r = run_cli("ckpt", "rollout", PATH, "--store", durable_store_url, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [s["step"] for s in doc["steps"]] == [1, 2]
    assert doc["steps"][1]["bytes"] == len(store.read_bytes(f"{PATH}/step_2.pt"))
    r = run_cli("ckpt", "rollout", f"{durable_store_url}/{PATH}", "--step", "2")
    assert r.returncode == 0 and "2" in r.stdout, r.stderr
    data = store.read_bytes(f"{PATH}/step_2.pt")
    store.write_bytes(f"{PATH}/step_2.pt", data[:-1] + bytes([data[-1] ^ 1]))
    r = run_cli("ckpt", "rollout", PATH, "--store", durable_store_url)
    assert r.returncode == 1 and "step_2.pt: sha256" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run_cli("ckpt", "rollout", PATH, "--store", durable_store_url, "--step", "9")
    assert r.returncode == 3 and "step 9 is not committed" in r.stderr, r.stderr
    r = run_cli("ckpt", "rollout", "exp/typo", "--store", durable_store_url)
    assert r.returncode == 3 and "no such rollout_data_path" in r.stderr, r.stderr


KILLED_WRITER = r'''
import os, signal, sys, torch
from registry.checkpoint.loongsage_rollout import RolloutData
from registry.store import open_store
rd = RolloutData(sys.argv[2], store=open_store(sys.argv[1]))
for step in range(1, 4):
    rd.write(step, {"tokens": torch.arange(100_000) + step})
store = rd.store
real = store.open_write
class Dying:
    def __init__(self, raw): self.raw = raw
    def __enter__(self): return self
    def write(self, data):
        self.raw.write(bytes(data)[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    def __exit__(self, *exc): self.raw.__exit__(*exc)
store.open_write = lambda key, **kw: Dying(real(key, **kw).__enter__())
rd.write(4, {"tokens": torch.arange(100_000) + 4})
'''


def test_a_writer_killed_mid_step_leaves_it_uncommitted(durable_store_url: str) -> None:
    """A real rollout-only process SIGKILLed while writing step 4: steps 1-3
    read back verified, step 4 is not committed, and the next writer (the
    dead one's lease is taken over) writes it."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    p = python_run([sys.executable, "-c", KILLED_WRITER, durable_store_url, PATH],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    rd = RolloutData(PATH, store=open_store(durable_store_url))
    assert rd.steps() == [1, 2, 3]
    for step in (1, 2, 3):
        assert torch.equal(rd.read(step)["tokens"], torch.arange(100_000) + step)
    with pytest.raises(NotCommittedError, match="step 4 is not committed"):
        rd.read(4)
    with rd:
        rd.write(4, {"tokens": torch.arange(3)})
    assert rd.steps() == [1, 2, 3, 4] and torch.equal(rd.read(4)["tokens"], torch.arange(3))

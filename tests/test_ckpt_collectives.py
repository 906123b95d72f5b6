"""No save collective on a group training uses (issue 46, item 1; seed 003 4.2:
under async save "the next step can start training immediately"; 4.3:
``save_checkpoint`` and ``save_hf`` "can be combined freely").

The jobs are tests/support/dcp_child.py on 2 and 3 real CPU ranks (gloo):
every step runs all-reduces on the default group (training's data-parallel
sync) before and after scheduling its save, and a ``full_tensor`` of every
parameter on the training mesh, while the previous step's async save (with
the HF export, which assembles sharded parameters) is in flight. Before the
fix the HF export gathered on the training mesh from the save thread and the
job hung until gloo's timeout; tests/support/collectives.py records every
collective's group and thread, so a save path that calls one on another
group than the save's own fails here whatever the timing.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest

from registry.formats.safetensors_io import read_safetensors
from registry.store import Store, join, open_store
from tests.test_loongsage_dcp import committed, job, lines, tracker

torch = pytest.importorskip("torch") if os.environ.get("REGISTRY_REQUIRE_ENGINES") != "1" \
    else __import__("torch")

STEPS = 6


def hf_export(store: Store, step: int) -> dict[str, np.ndarray]:
    """Every tensor of ``train_step_<step>/hf_model/``'s shards."""
    out: dict[str, np.ndarray] = {}
    under = join("exp", f"train_step_{step}", "hf_model")
    for name in store.walk_files(under):
        if name.endswith(".safetensors"):
            data = store.read_bytes(join(under, name))
            tensors, _ = read_safetensors(io.BytesIO(data), path=name, file_size=len(data))
            assert not set(tensors) & set(out), name
            out.update(tensors)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world,mode", [
    (2, "async"), (3, "async"), (2, "sync"), (3, "sync"), (3, "async-dp"), (2, "async-hf-only"),
    (3, "async-no-hf")])
def test_saves_with_save_hf_commit_every_step_under_training_collectives(
        world: int, mode: str, tmp_path: Path) -> None:
    """Async and sync saves with save_hf (and save_checkpoint, or without it;
    and one without save_hf), tensor-parallel and data-parallel, 2 and 3
    ranks: every scheduled step
    commits on every rank, each step's hf_model/ equals the model the job
    held after that step, no rank hangs (gloo timeout 60 s, the job 240 s),
    and no collective issued inside a save (maybe_save, wait, finish, or the
    writer thread) ran on a group other than the save's own."""
    url = str(tmp_path / "store")
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    args = ["--steps", str(STEPS), "--allreduce", "6", "--dump-steps", str(dumps),
            "--record-collectives", "--pg-timeout", "60"]
    if mode != "async-no-hf":
        args.append("--save-hf")
    if mode == "sync":
        args.append("--sync")
    if mode == "async-dp":
        args += ["--dp", "--sharding", "dp_reshardable"]
    if mode == "async-hf-only":
        args.append("--no-checkpoint")
    p = job(url, tmp_path / "hf", world, *args, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    assert [line for line in p.stdout.splitlines() if " FOREIGN " in line] == []
    calls = lines(p, "SAVECALLS")
    assert len(calls) == world and all(int(c.rsplit(" ", 1)[1]) > 0 for c in calls), calls
    untracked = " untracked" if mode == "async-hf-only" else ""
    assert lines(p, "COMMITTED") == sorted(f"RANK {r} COMMITTED {s}{untracked}"
                                           for r in range(world) for s in range(1, STEPS + 1))
    store = open_store(url)
    for step in range(1, STEPS + 1):
        assert committed(store, step)
        if mode == "async-no-hf":
            continue
        held = torch.load(dumps / f"step-{step}.pt")
        export = hf_export(store, step)
        assert set(export) == set(held)
        for name, value in held.items():
            np.testing.assert_array_equal(export[name], value.numpy(), err_msg=f"{step} {name}")
    if mode != "async-hf-only":
        assert tracker(store) == STEPS

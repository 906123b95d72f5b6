"""The seed's kill test (seed 000, "Resuming"), automated with examples/tinytrainer.py.

A run trained without interruption and the same spec SIGKILLed several times
(at random moments, and at chosen instants of a checkpoint save) and resumed
with ``--resume`` each time must end with bitwise identical final loss, weights
and optimizer state; after every kill, LATEST names a committed step that
verifies in full. Children are real processes started with ``sys.executable``;
on S3 they reach the session's moto server through the inherited ``AWS_*``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from registry.examples.tinytrainer import (
    PCG32,
    TrainerError,
    learning_rate,
    make_spec,
    tensors_sha256,
    train,
)
from registry.checkpoint import CheckpointManager, CheckpointTree, run_root
from registry.store import open_store
from registry.protocol.verify import read_manifest, verify_directory
from tests.support.forkclient import python_popen

TRAINER = Path(__file__).resolve().parent.parent / "examples" / "tinytrainer.py"
STEPS, CKPT_EVERY, KEEP = 300, 20, 3

# Runs the trainer after wrapping one library method so that the process
# SIGKILLs itself on the N-th call: a kill at a chosen instant of a save.
# Nothing in library code is hooked; only this child process is patched.
BOOT = r"""
import os, runpy, signal, sys
point, nth = sys.argv.pop(1).split(":")
nth = int(nth)
import registry.checkpoint.tree as tree_mod
import registry.protocol.commit as commit_mod
cls, name = {
    "before-latest": (tree_mod.CheckpointTree, "set_latest"),   # committed, LATEST not moved
    "before-manifest": (commit_mod.DirectoryWriter, "commit"),  # files written, no manifest
    "mid-save": (commit_mod.DirectoryWriter, "write_bytes"),    # tensors written, not the rest
}[point]
orig = getattr(cls, name)
calls = [0]
def wrapped(*a, **k):
    calls[0] += 1
    if calls[0] == nth:
        os.kill(os.getpid(), signal.SIGKILL)
    return orig(*a, **k)
setattr(cls, name, wrapped)
sys.argv[0] = TRAINER
runpy.run_path(TRAINER, run_name="__main__")
""".replace("TRAINER", repr(str(TRAINER)))


def trainer_argv(url: str, run_id: str, out: Path, progress: Path, *, resume: bool) -> list[str]:
    return ["--store", url, "--run-id", run_id, "--steps", str(STEPS),
            "--ckpt-every", str(CKPT_EVERY), "--keep-ckpts", str(KEEP),
            "--progress", str(progress), "--out", str(out)] + (["--resume"] if resume else [])


def child_env() -> dict[str, str]:
    return {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(p for p in (str(TRAINER.parent.parent),
                                                       os.environ.get("PYTHONPATH")) if p)}


def ckpt_events(progress: Path) -> list[dict]:
    if not progress.exists():
        return []
    lines = progress.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def assert_latest_verifies(url: str, run_id: str) -> int | None:
    """LATEST is absent, or names a committed step directory that verifies in full."""
    store = open_store(url)
    try:
        tree = CheckpointTree(store, run_root(run_id))
        latest = tree.latest()
        if latest is None:
            return None
        report = verify_directory(store, tree.prefix(latest), full=True)
        assert report.ok, f"LATEST names step {latest}, which does not verify: {report.to_dict()}"
        state = json.loads(store.read_bytes(tree.prefix(latest) + "/trainer_state.json"))
        assert state["step"] == latest
        return latest
    finally:
        store.close()


def final_tree(url: str, run_id: str) -> dict[str, dict[str, str]]:
    """After a finished run: the committed steps and, per step, file -> sha256."""
    store = open_store(url)
    try:
        tree = CheckpointTree(store, run_root(run_id))
        assert tree.latest() == STEPS
        names = [name for name, _ in store.list_dir(tree.root)]
        assert not [n for n in names if ".tmp" in n or n.endswith(".claim")], names
        steps = tree.steps()
        assert steps == list(range(STEPS - (KEEP - 1) * CKPT_EVERY, STEPS + 1, CKPT_EVERY))
        files = {}
        for step in steps:
            assert verify_directory(store, tree.prefix(step), full=True).ok
            manifest = read_manifest(store, tree.prefix(step))
            files[f"step-{step:06d}"] = {e.path: e.sha256 for e in manifest.files}
        return files
    finally:
        store.close()


def test_kill_and_resume_is_bitwise(durable_store_url: str, tmp_path: Path) -> None:
    url, env = durable_store_url, child_env()
    a_out, a_progress = tmp_path / "a.json", tmp_path / "a.jsonl"
    uninterrupted = python_popen([sys.executable, str(TRAINER), *trainer_argv(url, "run-a", a_out, a_progress,
                                                     resume=False)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        b_out, b_progress = tmp_path / "b.json", tmp_path / "b.jsonl"
        rng = random.Random(20240611)
        # Two kills at random moments (a random delay after the child's first
        # new checkpoint event: in training, in the next save or in the
        # retention after the last), and two at chosen instants of a save: after
        # the commit but before LATEST moved (the next run meets a committed
        # step above LATEST), and inside the save before the commit.
        plan: list[tuple[str, str | float]] = [
            ("external", rng.uniform(0.0, 0.04)), ("external", rng.uniform(0.0, 0.04)),
            ("inject", f"before-latest:{rng.randint(1, 2)}"),
            ("inject", f"{rng.choice(['before-manifest', 'mid-save'])}:{rng.randint(1, 3)}"),
        ]
        rng.shuffle(plan)
        kills: list[str] = []
        for kind, arg in [*plan, ("finish", 0.0)]:
            argv = trainer_argv(url, "run-b", b_out, b_progress, resume=True)
            cmd = ([sys.executable, "-c", BOOT, str(arg), *argv] if kind == "inject"
                   else [sys.executable, str(TRAINER), *argv])
            seen = len(ckpt_events(b_progress))
            child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
            if kind == "external":
                deadline = time.monotonic() + 60
                while (child.poll() is None and len(ckpt_events(b_progress)) == seen
                       and time.monotonic() < deadline):
                    time.sleep(0.002)
                time.sleep(float(arg))
                child.kill()
            _out, err = child.communicate(timeout=120)
            if kind == "finish" or child.returncode == 0:
                assert child.returncode == 0, err
                break
            assert child.returncode == -9, f"{kind} {arg}: exit {child.returncode}\n{err}"
            kills.append(f"{kind} {arg}")
            assert not b_out.exists()
            assert_latest_verifies(url, "run-b")
        assert len(kills) == len(plan), kills  # the run outlasted every kill
        _out, err = uninterrupted.communicate(timeout=120)
        assert uninterrupted.returncode == 0, err
    finally:
        if uninterrupted.poll() is None:
            uninterrupted.kill()
            uninterrupted.communicate()

    a, b = json.loads(a_out.read_text()), json.loads(b_out.read_text())
    assert a["resumed_from"] is None and b["resumed_from"] is not None, kills
    for key in ("final_loss", "weights_sha256", "optimizer_sha256", "trainer_state",
                "spec_sha256"):
        assert a[key] == b[key], (key, kills)
    assert assert_latest_verifies(url, "run-a") == assert_latest_verifies(url, "run-b") == STEPS
    tree_a, tree_b = final_tree(url, "run-a"), final_tree(url, "run-b")
    assert tree_a == tree_b  # the kept checkpoints are byte for byte the same
    assert [e["step"] for e in ckpt_events(a_progress)] == list(range(CKPT_EVERY, STEPS + 1,
                                                                    CKPT_EVERY))
    rs = CheckpointManager(url, "run-b", keep_ckpts=KEEP).resume()
    assert rs.step == STEPS and tensors_sha256(rs.model) == a["weights_sha256"]
    assert tensors_sha256(rs.optimizer_state) == a["optimizer_sha256"]


# -- in-process checks of the trainer's parts -----------------------------------------


def test_pcg32_reference_stream() -> None:
    """pcg32-demo's first outputs for pcg32_srandom_r(42, 54)."""
    g = PCG32.seeded(42, 54)
    assert [g.next_u32() for _ in range(6)] == [0xa15c02b7, 0x7b47f409, 0xba1d3330,
                                                0x83d2f293, 0xbfa4784b, 0xcbed606e]
    doc = g.to_dict()
    assert doc["inc"] == f"{(54 << 1) | 1:016x}" and len(doc["state"]) == 16
    h = PCG32.from_dict(doc)
    assert [h.bounded(7) for _ in range(50)] == [g.bounded(7) for _ in range(50)]


def test_schedule_warms_up_then_decays() -> None:
    spec = make_spec(200)
    lrs = [learning_rate(spec, s) for s in range(1, 201)]
    peak = spec["schedule"]["warmup_steps"] - 1
    assert lrs[peak] == max(lrs) == spec["optimizer"]["lr"]
    assert lrs[-1] == pytest.approx(spec["optimizer"]["min_lr"])
    assert all(x >= y for x, y in zip(lrs[peak:], lrs[peak + 1:], strict=False))


def test_resume_from_older_step_adopts_and_matches(tmp_path: Path) -> None:
    """Resuming from an older step re-trains the later steps bitwise: their
    already committed directories are adopted, not a conflict."""
    url = f"memory://tt-{tmp_path.name}"
    kw = {"ckpt_every": 10, "keep_ckpts": 0}
    first = train(url, "r", 50, **kw)
    assert first["saved"] == [10, 20, 30, 40, 50] and first["adopted"] == []
    again = train(url, "r", 50, resume="step-000030", **kw)
    assert again["resumed_from"] == 30 and again["adopted"] == [40, 50] and again["saved"] == []
    done = train(url, "r", 50, resume=True, **kw)
    assert done["resumed_from"] == 50 and done["last_train_loss"] is None
    for r in (again, done):
        for key in ("final_loss", "weights_sha256", "optimizer_sha256", "trainer_state"):
            assert r[key] == first[key]
    loss = float.fromhex(first["final_loss"])
    assert np.isfinite(loss) and loss < np.log(make_spec(50)["model"]["vocab_size"])
    with pytest.raises(TrainerError, match="already has checkpoints"):
        train(url, "r", 50, **kw)
    # a resume with other arguments names the field that differs, not two digests
    with pytest.raises(TrainerError) as e:
        train(url, "r", 50, resume=True, seed=1, **kw)
    assert "seed: 0 in the checkpoint, 1 now (--seed)" in str(e.value)
    assert first["spec_sha256"] not in str(e.value)
    with pytest.raises(TrainerError, match=r"steps: 50 in the checkpoint, 60 now \(--steps\); "
                                           r"schedule.warmup_steps: 5 in the checkpoint, 6 now"):
        train(url, "r", 60, resume=True, **kw)
    with pytest.raises(TrainerError, match=r"model.d_hidden: \d+ in the checkpoint, 7 now"):
        train(url, "r", 50, resume=True, model={"d_hidden": 7}, **kw)


def test_spec_difference_of_a_checkpoint_without_its_spec() -> None:
    """A checkpoint written before trainer_state recorded the spec: the model
    config is compared; otherwise the message says which options to check."""
    from registry.examples.tinytrainer import spec_difference

    spec = make_spec(50)
    assert "model.d_embed: 4 in the checkpoint" in spec_difference(
        None, spec, {**spec["model"], "d_embed": 4})
    assert "give the --steps and --seed" in spec_difference(None, spec, spec["model"])


def test_importing_the_trainer_changes_no_environment() -> None:
    """The BLAS pinning happens when the trainer runs as a program, not when a
    process imports it: an import that set OMP_NUM_THREADS passed it to every
    later child of the importer (the suite's workers: none forked after)."""
    code = ("import os; before = dict(os.environ); import registry.examples.tinytrainer; "
            "print(sorted(k for k in os.environ if os.environ[k] != before.get(k)))")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"

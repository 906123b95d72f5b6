"""Checkpoints when the trainer is not alone (issue 15): duplicate writers of
one run, damaged pointers and retention, a full disk at the manifest.

Replayed from public reports of training frameworks: a preempted job's zombie
and its restart (or a launcher started twice) saving the same step of one run;
a tracker emptied by a full disk that made retention delete the only resumable
checkpoint; ``OSError [Errno 28]`` naming no file.

Races use real processes (``tests/support/ckpt_race_child.py``), on local disk
and on the session's S3 server (moto, every request serialized so that each
conditional PUT is atomic as on AWS), for both layouts: tinyllm
(``runs/<run>/ckpt/step-NNNNNN`` + ``LATEST``) and LoongSage
(``train_step_N`` + ``latest_checkpointed_iteration.txt``).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from registry import errors as E
from registry.checkpoint import CheckpointManager, CheckpointTree, run_root
from registry.checkpoint.layout import LOONGSAGE, TINYLLM, Layout
from registry.checkpoint.lease import LEASE_NAME, WriterLease
from registry.checkpoint.loongsage import LoongSageCheckpointer, load_dist_ckpt
from registry.protocol.commit import DirectoryWriter
from registry.errors import CommitConflictError, NotCommittedError, RunLeasedError
from registry.protocol.manifest import MANIFEST
from registry.formats.safetensors_io import read_safetensors
from registry.store import Store, open_store
from registry.protocol.verify import verify_directory
from tests.support.ckpt_race_child import STEP, save_loongsage, save_tinyllm, tensors
from tests.support.forkclient import python_popen, python_popens, python_run
from tests.support.tmpfs import small_tmpfs

CHILD = Path(__file__).resolve().parent / "support" / "ckpt_race_child.py"
ROUNDS = 12


def tree_of(store: Store, layout: Layout, round_: int) -> CheckpointTree:
    if layout is TINYLLM:
        return CheckpointTree(store, run_root(f"race-{round_}"), TINYLLM)
    return CheckpointTree(store, f"lg/race-{round_}", LOONGSAGE)


def read_model(store: Store, prefix: str, layout: Layout) -> dict[str, np.ndarray]:
    """The step's parameters: tinyllm's model.safetensors, LoongSage's DCP dist_ckpt."""
    if layout is LOONGSAGE:
        from registry.checkpoint.loongsage_dcp import read_full

        return {k[len("model."):]: v for k, v in read_full(store, f"{prefix}/dist_ckpt").items()
                if k.startswith("model.")}
    rel = "model.safetensors"
    size = store.info(f"{prefix}/{rel}").size
    with store.open_read(f"{prefix}/{rel}") as f:
        return read_safetensors(f, path=rel, file_size=size)[0]


def run_rounds(url: str, layout: str, tmp: Path, writers: int = 2,
               rounds: int = ROUNDS) -> list[list[dict[str, Any]]]:
    """Start ``writers`` long-lived children and release them together for each
    round; returns, per round, each writer's report."""
    barrier = tmp / "barrier"
    barrier.mkdir()
    with python_popens([[sys.executable, str(CHILD), url, layout, str(w), str(rounds),
                         str(barrier)] for w in range(writers)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as procs:
        deadline = time.monotonic() + 120
        while not all((barrier / f"ready-{w}").exists() for w in range(writers)):
            dead = [p for p in procs if p.poll() is not None]
            assert not dead, dead[0].communicate()
            assert time.monotonic() < deadline, "children never got ready"
            time.sleep(0.01)
        for r in range(rounds):
            (barrier / f"go-{r}").touch()
            while not all((barrier / f"done-{r}-{w}").exists() for w in range(writers)):
                # a writer whose last round is done may exit before the other's
                dead = [p for w, p in enumerate(procs) if p.poll() is not None
                        and not (barrier / f"done-{r}-{w}").exists()]
                assert not dead, dead[0].communicate()
                assert time.monotonic() < deadline + 60 * (r + 1), f"round {r} hangs"
                time.sleep(0.005)
        outs = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert "Traceback" not in err, err
    reports = [json.loads(line) for out, _ in outs for line in out.splitlines()]
    by_round: list[list[dict[str, Any]]] = [[] for _ in range(rounds)]
    for rep in reports:
        by_round[rep["round"]].append(rep)
    return by_round


# -- 1. two processes save the same step of one run ------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("layout", [TINYLLM, LOONGSAGE], ids=lambda lay: lay.name)
def test_two_writers_of_one_run_exactly_one_saves_the_step(
        durable_store_url: str, tmp_path: Path, layout: Layout) -> None:
    """Step 100 is saved; then two processes save step 200 of the same run at
    the same moment, each with its own tensors, 12 rounds. Every round: one
    wins, the other gets a CommitConflictError (the writer lease naming its
    holder, or the step already committed) and no traceback; the pointer names
    step 200, which verifies fully and holds exactly the winner's bytes, and
    the run resumes from it; no staging directory or claim is left."""
    store = open_store(durable_store_url)
    save = save_tinyllm if layout is TINYLLM else save_loongsage
    for r in range(ROUNDS):
        save(store, r, 100, 9)
    rounds = run_rounds(durable_store_url, layout.name, tmp_path)
    by_lease = 0
    for r, reports in enumerate(rounds):
        detail = f"round {r}: {reports}"
        assert len(reports) == 2, detail
        winners = [rep for rep in reports if rep["ok"]]
        assert len(winners) == 1, detail
        (winner,) = winners
        (loser,) = [rep for rep in reports if not rep["ok"]]
        err = getattr(E, loser["error"], None)
        assert err is not None and issubclass(err, CommitConflictError), detail
        if err is RunLeasedError:
            by_lease += 1
            assert f"host {socket.gethostname()}" in loser["message"], detail
            assert "pid" in loser["message"] and LEASE_NAME in loser["message"], detail
        tree = tree_of(store, layout, r)
        assert tree.latest() == STEP, detail
        prefix = tree.prefix(STEP)
        report = verify_directory(store, prefix, full=True)
        assert report.ok and report.extras == (), (report.to_dict(), detail)
        assert report.manifest is not None
        assert report.manifest.digest == winner["manifest_sha256"], detail
        got = read_model(store, prefix, layout)
        want = tensors(winner["writer"], r)
        assert set(got) == set(want), detail
        for name, arr in want.items():
            np.testing.assert_array_equal(got[name], arr, err_msg=detail)
        names = {name for name, _ in store.list_dir(tree.root)}
        steps = {layout.step_dir(100), layout.step_dir(STEP)}
        assert names - steps - {layout.pointer, LEASE_NAME} <= {
            f"{layout.pointer}.lock", f"{LEASE_NAME}.lock"}, (names, detail)
        if layout is TINYLLM:
            with CheckpointManager(store, f"race-{r}", keep_ckpts=0) as mgr:
                state = mgr.resume()
        else:
            state = load_dist_ckpt(store, f"{prefix}/dist_ckpt")
        assert state.step == STEP
        np.testing.assert_array_equal(state.model["head.bias"], want["head.bias"])
    # Figures for docs/decisions.md: how many rounds the lease decided.
    print(f"{layout.name} {store.url.split(':')[0]}: {by_lease}/{ROUNDS} rounds decided by "
          "the writer lease, the rest by the committed step")


# -- the lease on its own -----------------------------------------------------------------


def test_lease_second_writer_is_refused_before_writing_anything(store: Store) -> None:
    a = WriterLease(store, "runs/r/ckpt")
    b = WriterLease(store, "runs/r/ckpt")
    a.hold()
    before = store.walk_files("runs/r/ckpt")
    with pytest.raises(RunLeasedError) as e:
        b.hold()
    assert e.value.holder["owner"] == a.owner and e.value.holder["pid"] == os.getpid()
    assert isinstance(e.value, CommitConflictError)
    assert store.walk_files("runs/r/ckpt") == before
    a.release()
    b.hold()  # a released lease is taken at once
    assert json.loads(store.read_bytes(f"runs/r/ckpt/{LEASE_NAME}"))["owner"] == b.owner


def test_lease_expired_is_taken_over_and_the_old_holder_is_fenced(store: Store) -> None:
    a = WriterLease(store, "runs/r/ckpt", seconds=3)
    a.hold()
    b = WriterLease(store, "runs/r/ckpt", seconds=30)
    with pytest.raises(RunLeasedError) as e:
        b.hold()
    # expiry is judged on the store's stamps (one-second resolution on S3, set
    # when the renewal landed), not the holder's "expires": allow for both
    time.sleep(max(0.0, e.value.holder["expires"] - time.time()) + 1.5)
    b.hold()
    with pytest.raises(RunLeasedError, match="lost the writer lease"):
        a.hold()
    with pytest.raises(RunLeasedError, match="lost the writer lease"):
        a.hold()  # stays fenced
    a.release()  # must not release b's lease
    assert json.loads(store.read_bytes(f"runs/r/ckpt/{LEASE_NAME}"))["owner"] == b.owner


def test_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(
        durable_store_url: str) -> None:
    store = open_store(durable_store_url)
    code = ("import sys, os; from registry.store import open_store; "
            "from registry.checkpoint.lease import WriterLease; "
            "WriterLease(open_store(sys.argv[1]), 'runs/r/ckpt', seconds=3600).hold(); "
            "os._exit(0)")  # dies holding it, as a SIGKILLed trainer would
    python_run([sys.executable, "-c", code, durable_store_url], check=True, timeout=60)
    holder = json.loads(store.read_bytes(f"runs/r/ckpt/{LEASE_NAME}"))
    assert holder["pid"] != os.getpid() and not holder["released"]
    mine = WriterLease(store, "runs/r/ckpt")
    mine.hold()
    assert json.loads(store.read_bytes(f"runs/r/ckpt/{LEASE_NAME}"))["owner"] == mine.owner


def test_garbled_lease_excludes_nobody(store: Store) -> None:
    store.write_bytes(f"runs/r/ckpt/{LEASE_NAME}", b"\x00garbage")
    WriterLease(store, "runs/r/ckpt").hold()


def test_second_manager_of_a_run_gets_the_holder_and_writes_nothing(store: Store) -> None:
    first = CheckpointManager(store, "r", keep_ckpts=0, async_save=False)
    p = tensors(0, 0)
    kw: dict[str, Any] = {"optimizer": "adamw", "config": {"hidden_size": 4}}
    from tests.support.ckpt_race_child import adamw, trainer_state
    first.save(100, p, adamw(p), trainer_state=trainer_state(100, 0), **kw)
    before = store.walk_files("runs/r/ckpt")
    second = CheckpointManager(store, "r", keep_ckpts=0, async_save=True)
    with pytest.raises(RunLeasedError, match=f"{LEASE_NAME}: another process is writing"):
        second.save(200, p, adamw(p), trainer_state=trainer_state(200, 1), **kw)
    second.close()
    after = store.walk_files("runs/r/ckpt")
    assert {k: v for k, v in after.items() if not k.startswith(LEASE_NAME)} == \
        {k: v for k, v in before.items() if not k.startswith(LEASE_NAME)}
    first.close()
    with CheckpointManager(store, "r", keep_ckpts=0, async_save=False) as third:
        third.save(200, p, adamw(p), trainer_state=trainer_state(200, 2), **kw)
    assert store.read_bytes("runs/r/ckpt/LATEST") == b"step-000200\n"


def test_a_writer_whose_lease_lapsed_and_was_taken_over_is_fenced(store: Store) -> None:
    """The preempted job's zombie wakes up after its restart took the run over:
    its next save fails with RunLeasedError before writing, LATEST keeps the
    restart's step."""
    from tests.support.ckpt_race_child import adamw, trainer_state
    p = tensors(0, 0)
    kw: dict[str, Any] = {"optimizer": "adamw", "config": {"hidden_size": 4}}
    zombie = CheckpointManager(store, "r", keep_ckpts=0, async_save=False, lease_seconds=3)
    zombie.save(100, p, adamw(p), trainer_state=trainer_state(100, 0), **kw)
    holder = json.loads(store.read_bytes(f"runs/r/ckpt/{LEASE_NAME}"))
    time.sleep(max(0.0, holder["expires"] - time.time()) + 1.5)  # store stamps: see above
    with CheckpointManager(store, "r", keep_ckpts=0, async_save=False) as restart:
        restart.resume()
        restart.save(200, p, adamw(p), trainer_state=trainer_state(200, 1), **kw)
        with pytest.raises(RunLeasedError, match="lost the writer lease"):
            zombie.save(300, p, adamw(p), trainer_state=trainer_state(300, 0), **kw)
    zombie.close()
    assert store.read_bytes("runs/r/ckpt/LATEST") == b"step-000200\n"
    assert not store.exists("runs/r/ckpt/step-000300/MANIFEST.json")


def test_second_loongsage_checkpointer_gets_the_holder(store: Store) -> None:
    from tests.support.ckpt_race_child import adamw
    p = tensors(0, 0)
    kw: dict[str, Any] = {"model": p, "optimizer_state": adamw(p)}
    first = LoongSageCheckpointer(store, "exp", save_freq=10, total_steps=100, async_save=False)
    first.maybe_save(10, **kw)
    second = LoongSageCheckpointer(store, "exp", save_freq=10, total_steps=100)
    with pytest.raises(RunLeasedError, match="another process is writing"):
        second.maybe_save(20, **kw)
    second.finish()
    assert not store.exists("exp/train_step_20/dist_ckpt/model.safetensors")
    first.finish()
    assert store.read_bytes("exp/latest_checkpointed_iteration.txt") == b"10\n"


# -- the pointer moves only to a committed step of this writer ----------------------------


@pytest.mark.parametrize("layout", [TINYLLM, LOONGSAGE], ids=lambda lay: lay.name)
def test_pointer_moves_only_to_a_verified_step(store: Store, layout: Layout) -> None:
    """Whatever else writes into the tree, the pointer does not move to a step
    without its manifest, with a file missing or resized, or committed by
    another writer (its manifest is not the one the mover committed)."""
    for damage in ("no-manifest", "file-missing", "file-resized", "other-writer"):
        tree = CheckpointTree(store, damage, layout)
        for step in (1, 2):
            with DirectoryWriter(store, tree.prefix(step), kind="checkpoint",
                                 meta={"run_id": "t", "step": step}) as w:
                w.write_bytes("dist_ckpt/model.safetensors", b"x" * (10 + step))
                ours = w.commit().digest
        tree.set_latest(1)
        prefix = tree.prefix(2)
        if damage == "no-manifest":
            store.delete(f"{prefix}/{MANIFEST}")
        elif damage == "file-missing":
            store.delete(f"{prefix}/dist_ckpt/model.safetensors")
        elif damage == "file-resized":
            store.write_bytes(f"{prefix}/dist_ckpt/model.safetensors", b"x")
        expected: type[Exception] = NotCommittedError
        digest = ours
        if damage == "other-writer":
            digest, expected = "0" * 64, CommitConflictError
        with pytest.raises(expected, match=f"not moving {layout.pointer}"):
            tree.set_latest(2, manifest_sha256=digest)
        assert tree.latest() == 1, damage


# -- cleanup removes only its own staging ------------------------------------------------------


def test_abort_leaves_another_writers_staging_and_claim(store: Store) -> None:
    prefix = "runs/r/ckpt/step-000200"
    if store.atomic_rename:
        other = f"{prefix}.tmp-0123456789ab/model.safetensors"
        store.write_bytes(other, b"other writer")
        with DirectoryWriter(store, prefix, kind="checkpoint", meta={"run_id": "r", "step": 200},
                             staging=f"{prefix}.tmp-aaaaaaaaaaaa", sole_writer=True) as w:
            w.write_bytes("model.safetensors", b"mine")
        assert store.read_bytes(other) == b"other writer"
        assert not store.exists(f"{prefix}.tmp-aaaaaaaaaaaa/model.safetensors")
    else:
        w = DirectoryWriter(store, prefix, kind="checkpoint", meta={"run_id": "r", "step": 200},
                            sole_writer=True)
        w.write_bytes("model.safetensors", b"mine")
        # another writer took the claim over and wrote in place meanwhile
        store.write_bytes(f"{prefix}.claim", b'{"owner": "other"}')
        store.write_bytes(f"{prefix}/optimizer.safetensors", b"other writer")
        w.abort()
        assert store.read_bytes(f"{prefix}/optimizer.safetensors") == b"other writer"
        assert store.read_bytes(f"{prefix}.claim") == b'{"owner": "other"}'


def test_cleanup_of_a_vanished_staging_dir_is_no_error(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The raw ``FileNotFoundError`` from ``rmtree`` of the issue: part of the
    staging directory removed by another process while it is being removed."""
    import shutil

    store = open_store(str(tmp_path / "s"))
    for i in range(50):
        store.write_bytes(f"a.tmp/d{i % 5}/f{i}", b"x")
    victim = tmp_path / "s" / "a.tmp" / "d3"
    real_unlink = os.unlink
    fired = []

    def unlink(path: Any, *a: Any, **k: Any) -> None:
        if not fired:  # the other process strikes after our first unlink
            fired.append(True)
            shutil.rmtree(victim)
        real_unlink(path, *a, **k)

    monkeypatch.setattr(os, "unlink", unlink)
    store.delete_prefix("a.tmp")
    monkeypatch.undo()
    assert fired and not (tmp_path / "s" / "a.tmp").exists()


# -- 2. a damaged pointer never makes retention delete the resumable checkpoint ----------


def export_only_step(store: Store, tree: CheckpointTree, step: int) -> None:
    """A committed step holding weights only (a HF export): not resumable."""
    from tests.support.ckpt_race_child import tensors as weights

    if tree.layout is LOONGSAGE:
        c = LoongSageCheckpointer(store, tree.root, save_freq=10, total_steps=1000,
                                  save_checkpoint=False, save_hf=True, async_save=False,
                                  hf_config={"hidden_size": 4})
        c.maybe_save(step, model=weights(0, step))
        c.finish()
        return
    import io

    from registry.formats.safetensors_io import write_safetensors
    buf = io.BytesIO()
    write_safetensors(buf, weights(0, step), metadata={"format": "pt"}, path="model.safetensors")
    with DirectoryWriter(store, tree.prefix(step), kind="checkpoint",
                         meta={"run_id": "exp", "step": step}) as w:
        w.write_bytes("model.safetensors", buf.getvalue())
        w.write_bytes("config.json", b'{"hidden_size": 4}\n')
        w.commit()


def resumable_step(store: Store, tree: CheckpointTree, step: int) -> None:
    from tests.support.ckpt_race_child import adamw, trainer_state
    from tests.support.ckpt_race_child import tensors as weights

    p = weights(0, step)
    if tree.layout is LOONGSAGE:
        c = LoongSageCheckpointer(store, tree.root, save_freq=10, total_steps=1000,
                                  async_save=False)
        c.maybe_save(step, model=p, optimizer_state=adamw(p))
        c.finish()
        return
    with CheckpointManager(store, "exp", keep_ckpts=0, async_save=False) as m:
        m.save(step, p, adamw(p), optimizer="adamw", config={"hidden_size": 4},
               trainer_state=trainer_state(step, 0))


def gc_tree(layout: Layout, url: str) -> tuple[Store, CheckpointTree, list[str]]:
    """The tree of the issue: step 10 resumable (the pointer's), step 20 export-only;
    returns the store, the tree and the ``registry ckpt gc`` argv naming it."""
    store = open_store(url)
    if layout is TINYLLM:
        tree = CheckpointTree(store, run_root("exp"), TINYLLM)
        argv = ["ckpt", "gc", "exp", "--store", url, "--layout", "tinyllm"]
    else:
        tree = CheckpointTree(store, "exp", LOONGSAGE)
        argv = ["ckpt", "gc", "exp", "--store", url, "--layout", "loongsage"]
    resumable_step(store, tree, 10)
    export_only_step(store, tree, 20)
    assert tree.latest() == 10
    return store, tree, argv


#: pointer contents a full disk or a torn write leaves: empty (the issue's),
#: NUL-filled (a file extended but never written), not UTF-8, one naming a
#: place outside the tree.
DAMAGED = {"empty": b"", "nul-filled": b"\x00" * 12, "not-utf8": b"\xff\xfe1\n",
           "outside": b"../other/step-000010\n"}


@pytest.mark.slow
@pytest.mark.parametrize("layout", [TINYLLM, LOONGSAGE], ids=lambda lay: lay.name)
def test_gc_refuses_on_a_damaged_pointer_and_deletes_nothing(
        durable_store_url: str, layout: Layout) -> None:
    """The issue's tree (step 10 resumable and tracked, step 20 an export), its
    pointer damaged four ways: ``registry ckpt gc --keep 1`` exits 5 with one
    line naming the pointer, and not one file is deleted; the API refuses too."""
    from tests.conftest import run_cli

    store, tree, argv = gc_tree(layout, durable_store_url)
    for damage, raw in DAMAGED.items():
        store.write_bytes(tree.pointer_key, raw)
        before = store.walk_files(tree.root)
        r = run_cli(*argv, "--keep", "1")
        detail = (damage, r.returncode, r.stdout, r.stderr)
        assert r.returncode == 5, detail
        assert "Traceback" not in r.stderr, detail
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), detail
        assert store.url_of(tree.pointer_key) in lines[0], detail
        assert "retention deletes nothing" in lines[0], detail
        assert store.walk_files(tree.root) == before, detail
        with pytest.raises(E.PointerError, match="retention deletes nothing"):
            tree.retain(1)
        assert store.walk_files(tree.root) == before, detail


@pytest.mark.parametrize("layout", [TINYLLM, LOONGSAGE], ids=lambda lay: lay.name)
def test_gc_keeps_the_resumable_step_before_newer_exports(durable_store_url: str,
                                                          layout: Layout) -> None:
    """keep 1 with a readable pointer: the pointer's step and the newest step
    stay; with resumable steps 10 and 20 (the pointer's) and exports 30, 40:
    10 and 30 go. Without a pointer every resumable step stays."""
    from tests.conftest import run_cli

    store, tree, argv = gc_tree(layout, durable_store_url)
    r = run_cli(*argv, "--keep", "1")
    assert r.returncode == 0, r.stderr
    assert tree.steps() == [10, 20]
    resumable_step(store, tree, 30)
    export_only_step(store, tree, 40)
    export_only_step(store, tree, 50)
    assert tree.latest() == 30
    deleted = tree.retain(1)
    assert sorted(deleted) == [tree.prefix(10), tree.prefix(20), tree.prefix(40)]
    assert tree.steps() == [30, 50]  # 10: an older resumable; 20, 40: older exports
    resumable_step(store, tree, 60)
    export_only_step(store, tree, 70)
    store.delete(tree.pointer_key)  # no pointer: which step is vouched for is unknown
    assert tree.retain(1) == [tree.prefix(50)]
    assert tree.steps() == [30, 60, 70]


@pytest.mark.parametrize("layout", [TINYLLM, LOONGSAGE], ids=lambda lay: lay.name)
def test_save_with_a_damaged_pointer_skips_retention_and_repairs_it(
        store: Store, layout: Layout) -> None:
    from registry.checkpoint import RetentionSkippedWarning
    from tests.support.ckpt_race_child import adamw, trainer_state
    from tests.support.ckpt_race_child import tensors as weights

    tree = CheckpointTree(store, run_root("exp") if layout is TINYLLM else "exp", layout)
    resumable_step(store, tree, 10)
    export_only_step(store, tree, 20)
    store.write_bytes(tree.pointer_key, b"")
    p = weights(0, 30)
    if layout is TINYLLM:  # retention runs after LATEST moved: the pointer is repaired
        with CheckpointManager(store, "exp", keep_ckpts=1, async_save=False) as m:
            m.save(30, p, adamw(p), optimizer="adamw", config={"hidden_size": 4},
                   trainer_state=trainer_state(30, 0))
        assert tree.steps() == [30]
    else:  # retention runs before the save: skipped, with a warning
        with pytest.warns(RetentionSkippedWarning, match="retention deletes nothing"):
            c = LoongSageCheckpointer(store, "exp", save_freq=10, total_steps=1000,
                                      async_save=False, keep=1)
            c.maybe_save(30, model=p, optimizer_state=adamw(p))
            c.finish()
        assert tree.steps() == [10, 20, 30]
    assert tree.latest() == 30


# -- 3. a full disk at the manifest: one line naming the file, nothing committed, exit 6 ----


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real small filesystem (a 2 MiB tmpfs) to fill up."""
    with small_tmpfs(tmp_path / "small", "2m") as mnt:
        yield mnt


def pages(root: Path, *, skip: tuple[str, ...] = ()) -> int:
    """Blocks (4 KiB) the files under ``root`` take on tmpfs, but ``skip`` names."""
    return sum(-(-p.stat().st_size // 4096) for p in root.rglob("*")
               if p.is_file() and p.name not in skip)


#: the staging directory's claim (``<staging>.claim``, a small JSON document),
#: written beside it for the commit's duration and gone after it
STAGING_CLAIM_PAGES = 1


def fill_leaving(mnt: Path, free: int) -> None:
    """Fill ``mnt`` so that exactly ``free`` blocks are left."""
    st = os.statvfs(mnt)
    with open(mnt / "filler", "wb") as f:
        f.write(b"\0" * ((st.f_bavail - free) * st.f_frsize))
    assert os.statvfs(mnt).f_bavail == free


@contextmanager
def full_s3_server(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A second real S3 server whose drives are full for MANIFEST.json: every PUT
    of one answers 507 XMinioStorageFull, as MinIO does past its free-drive
    threshold. Yields the environment that points a process at it."""
    import boto3

    from tests.support.s3server import S3Server

    server = S3Server(serialize=True)
    app = server._server.app

    def full(environ: dict[str, Any], start_response: Any) -> Any:
        if environ["REQUEST_METHOD"] == "PUT" and environ["PATH_INFO"].endswith("/" + MANIFEST):
            environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            start_response("507 Insufficient Storage", [("Content-Type", "application/xml")])
            return [b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>XMinioStorageFull'
                    b"</Code><Message>Storage backend has reached its minimum free drive "
                    b"threshold. Please delete a few objects to proceed.</Message></Error>"]
        return app(environ, start_response)

    server._server.app = full
    server.start()
    env = server.env()
    try:
        boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id="testing",
                     aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket="full")
        yield env
    finally:
        server.stop()


def publish_argv(tmp_path: Path, store_url: str) -> list[str]:
    from safetensors.numpy import save_file

    from tests.release_util import ledger_row, summary
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text('{"hidden_size": 4}\n')
    save_file(tensors(0, 0), str(model / "model.safetensors"))
    (tmp_path / "ledger.json").write_text(json.dumps([ledger_row("wiki")]))
    (tmp_path / "summary.json").write_text(json.dumps(summary(0.9, 0.5)))
    return ["publish", str(model), "--model-id", "m", "--version", "1", "--ledger",
            str(tmp_path / "ledger.json"), "--evals", str(tmp_path / "summary.json"),
            "--store", store_url, "--db", f"sqlite:///{tmp_path / 'index.db'}"]


def assert_one_line_exit_6(r: subprocess.CompletedProcess[str], names: str) -> None:
    assert r.returncode == 6, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert names in lines[0] and "no space left" in lines[0], r.stderr


@pytest.mark.slow
def test_publish_onto_a_disk_full_at_the_manifest(tmp_path: Path, small_disk: Path) -> None:
    """Every file of the release fits, MANIFEST.json does not: ENOSPC at its
    write. One line naming MANIFEST.json, exit 6, no version and no staging
    directory left, the space back."""
    from tests.conftest import run_cli

    probe = run_cli(*publish_argv(tmp_path, str(tmp_path / "probe")))
    assert probe.returncode == 0, probe.stderr
    fill_leaving(small_disk, pages(tmp_path / "probe" / "models", skip=(MANIFEST,))
                 + STAGING_CLAIM_PAGES)
    r = run_cli(*publish_argv(tmp_path, str(small_disk / "store")))
    # The commit's last writes: the release counter (models/m/.sequence, moved
    # right before the manifest: issue 31), or MANIFEST.json itself.
    assert_one_line_exit_6(r, "m/.sequence" if "m/.sequence:" in r.stderr else f"/{MANIFEST}")
    models = small_disk / "store" / "models" / "m"
    left = [p for p in models.iterdir() if not p.name.startswith(".sequence")] \
        if models.exists() else []
    assert left == [], list(models.rglob("*"))
    assert os.statvfs(small_disk).f_bavail >= pages(tmp_path / "probe" / "models",
                                                    skip=(MANIFEST,))


def test_publish_to_an_s3_server_full_at_the_manifest(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    with full_s3_server(tmp_path) as env:
        r = run_cli(*publish_argv(tmp_path, "s3://full/root"), env=env)
        assert_one_line_exit_6(r, f"models/m/1/{MANIFEST}")
        store = open_store("s3://full/root", client_kwargs={"endpoint_url": env[
            "AWS_ENDPOINT_URL"]}, key="testing", secret="testing")
        # Only the release counter moved (a number without a release: issue 31).
        assert store.walk_files("models") == {"m/.sequence": 2}


SAVE_CHILD = """
import sys
import numpy as np
from registry.checkpoint import CheckpointManager
from registry.checkpoint.loongsage import LoongSageCheckpointer
from registry.cli.errors import exit_code_for
from registry.errors import RegistryError
from tests.support.ckpt_race_child import adamw, tensors, trainer_state
url, layout, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = tensors(0, step)
try:
    if layout == "tinyllm":
        with CheckpointManager(url, "r", keep_ckpts=0, async_save=False) as m:
            m.save(step, p, adamw(p), optimizer="adamw", config={"hidden_size": 4},
                   trainer_state=trainer_state(step, 0))
    else:
        c = LoongSageCheckpointer(url, "exp", save_freq=10, total_steps=1000)
        try:
            c.maybe_save(step, model=p, optimizer_state=adamw(p))
        finally:
            c.finish()
except RegistryError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(exit_code_for(e))
"""


def save_in_child(url: str, layout: Layout, step: int,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return python_run([sys.executable, "-c", SAVE_CHILD, url, layout.name, str(step)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})},
                          cwd=Path(__file__).resolve().parent.parent)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [TINYLLM, LOONGSAGE], ids=lambda lay: lay.name)
def test_checkpoint_save_onto_a_disk_full_at_the_manifest(
        tmp_path: Path, small_disk: Path, layout: Layout) -> None:
    """A process saves step 20 after step 10; its files fit, MANIFEST.json does
    not. InsufficientSpaceError naming MANIFEST.json (exit 6), the pointer still
    names step 10, which still resumes; no staging directory left."""
    url = str(small_disk / "store")
    root = small_disk / "store" / (run_root("r") if layout is TINYLLM else "exp")
    assert save_in_child(url, layout, 10).returncode == 0
    probe = tmp_path / "probe"
    assert save_in_child(str(probe), layout, 20).returncode == 0
    step20 = probe / (run_root("r") if layout is TINYLLM else "exp") / layout.step_dir(20)
    fill_leaving(small_disk, pages(step20, skip=(MANIFEST,)) + STAGING_CLAIM_PAGES)
    r = save_in_child(url, layout, 20)
    assert_one_line_exit_6(r, f"{layout.step_dir(20)}.tmp-")
    assert f"/{MANIFEST}" in r.stderr
    store = open_store(url)
    tree = CheckpointTree(store, str(root.relative_to(small_disk / "store")), layout)
    assert tree.latest() == 10 and tree.steps() == [10]
    assert not [n for n, _ in store.list_dir(tree.root) if ".tmp" in n]
    assert verify_directory(store, tree.prefix(10), full=True).ok


@pytest.mark.parametrize("layout", [TINYLLM, LOONGSAGE], ids=lambda lay: lay.name)
def test_checkpoint_save_to_an_s3_server_full_at_the_manifest(
        tmp_path: Path, layout: Layout) -> None:
    with full_s3_server(tmp_path) as env:
        r = save_in_child("s3://full/root", layout, 10, env)
        where = run_root("r") if layout is TINYLLM else "exp"
        assert_one_line_exit_6(r, f"{where}/{layout.step_dir(10)}/{MANIFEST}")
        store = open_store("s3://full/root", client_kwargs={"endpoint_url": env[
            "AWS_ENDPOINT_URL"]}, key="testing", secret="testing")
        tree = CheckpointTree(store, where, layout)
        assert tree.latest() is None and tree.steps() == []
        assert not [n for n, _ in store.list_dir(where) if n.endswith(".claim")]


@pytest.mark.parametrize(("err", "says"), [(errno.ENOSPC, "no space left on device"),
                                           (errno.EDQUOT, "disk quota exceeded")])
def test_full_disk_errnos_at_a_small_write_name_the_object(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int, says: str) -> None:
    """ENOSPC or EDQUOT raised by the fsync of a small document (delayed
    allocation reports it there): an InsufficientSpaceError naming its URL."""
    store = open_store(str(tmp_path / "s"))

    def full(fd: int) -> None:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(E.InsufficientSpaceError, match=says) as e:
        store.write_bytes("runs/r/ckpt/step-000001.tmp/MANIFEST.json", b"{}")
    monkeypatch.undo()
    assert "runs/r/ckpt/step-000001.tmp/MANIFEST.json" in str(e.value)  # names the object
    assert not (tmp_path / "s" / "runs" / "r" / "ckpt" / "step-000001.tmp" / MANIFEST).exists()

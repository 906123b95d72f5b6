"""CheckpointManager on memory, local disk and S3: the seed's files, LATEST,
progress events, retention, async save, resume with fallback."""

from __future__ import annotations

import concurrent.futures
import io
import json
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

from registry.checkpoint import CheckpointManager, CheckpointSkippedWarning
from registry.errors import (
    CheckpointError,
    RegistryError,
    NoValidCheckpointError,
    SafetensorsError,
    SchemaValidationError,
    StorageError,
)
from registry.protocol.manifest import MANIFEST
from registry.store import Store
from registry.protocol.verify import read_manifest, verify_directory
from tests.ckpt_util import adamw, model, save, trainer_state

ROOT = "runs/r1/ckpt"


def mgr(store: Store, tmp_path: Path, **kw: object) -> CheckpointManager:
    kw.setdefault("keep_ckpts", 3)
    return CheckpointManager(store, "r1", progress_file=tmp_path / "progress.jsonl", **kw)  # type: ignore[arg-type]


def test_save_writes_the_seed_files(store: Store, tmp_path: Path) -> None:
    with mgr(store, tmp_path, async_save=False) as m:
        params = model(1)
        m.save(500, params, adamw(params), optimizer="adamw",
               config='{"tl_tokenizer": "file",  "hidden_size": 8}',
               trainer_state=trainer_state(500), tokenizer={"model": {"type": "BPE"}},
               generation_config={"max_new_tokens": 16, "temperature": 0.7})
    prefix = f"{ROOT}/step-000500"
    assert sorted(store.walk_files(prefix)) == [
        MANIFEST, "config.json", "generation_config.json", "model.safetensors",
        "optimizer.safetensors", "tokenizer.json", "trainer_state.json"]
    assert store.read_bytes(f"{ROOT}/LATEST") == b"step-000500\n"
    assert store.read_bytes(f"{prefix}/config.json") == b'{"tl_tokenizer": "file",  "hidden_size": 8}'
    weights = safetensors.numpy.load(store.read_bytes(f"{prefix}/model.safetensors"))
    assert {k: v.dtype for k, v in weights.items()} == {k: np.float32 for k in params}
    np.testing.assert_array_equal(weights["embed.weight"], params["embed.weight"])
    opt_bytes = store.read_bytes(f"{prefix}/optimizer.safetensors")
    n = int.from_bytes(opt_bytes[:8], "little")
    assert json.loads(opt_bytes[8:8 + n])["__metadata__"] == {
        "format": "tinyllm", "optimizer": "adamw", "step": "500"}
    m_doc = read_manifest(store, prefix)
    assert m_doc.kind == "checkpoint" and m_doc.meta["run_id"] == "r1" and m_doc.meta["step"] == 500
    assert verify_directory(store, prefix, full=True).ok
    event = json.loads((tmp_path / "progress.jsonl").read_text())
    assert event["kind"] == "ckpt" and event["step"] == 500
    assert event["manifest_sha256"] == m_doc.digest and event["bytes"] == m_doc.total_size


def test_tokenizer_required_when_config_says_file(store: Store, tmp_path: Path) -> None:
    with mgr(store, tmp_path) as m, pytest.raises(CheckpointError, match="tokenizer.json is required"):
        save(m, 1, config={"tl_tokenizer": "file"})
    assert store.walk_files(ROOT) == {}


@pytest.mark.parametrize(("change", "error", "rule"), [
    ({"optimizer": "lion"}, CheckpointError, "not one of"),
    ({"trainer_state": {"step": 1}}, SchemaValidationError, "trainer_state.json"),
    ({"opt_extra": {"ghost.exp_avg": np.zeros(3, np.float32)}}, SafetensorsError, "ghost"),
    ({"opt_extra": {"head.bias.exp_avg": np.zeros(3, np.float32)}}, SafetensorsError, "shape"),
    ({"generation_config": {"top_p": 2}}, SchemaValidationError, "top_p"),
])
def test_bad_save_input_writes_nothing(store: Store, tmp_path: Path, change: dict[str, object],
                                       error: type[Exception], rule: str) -> None:
    params = model(0)
    opt = adamw(params)
    change = dict(change)  # parametrized values are shared between backends
    opt.update(change.pop("opt_extra", {}))  # type: ignore[arg-type]
    kw: dict[str, object] = {"optimizer": "adamw", "config": {}, "trainer_state": trainer_state(1)}
    kw.update(change)
    with mgr(store, tmp_path) as m, pytest.raises(error, match=rule):
        m.save(1, params, opt, **kw)  # type: ignore[arg-type]
    assert store.walk_files(ROOT) == {}


def test_retention_keeps_newest_and_cleans_leftovers(store: Store, tmp_path: Path) -> None:
    with mgr(store, tmp_path, keep_ckpts=2) as m:
        save(m, 1)
        store.write_bytes(f"{ROOT}/step-000002/model.safetensors", b"orphan")  # uncommitted
        store.write_bytes(f"{ROOT}/step-000009.tmp/x", b"stale staging")
        for s in (3, 4, 5):
            save(m, s)
    assert [n for n, d in store.list_dir(ROOT) if d] == ["step-000004", "step-000005"]


@pytest.mark.parametrize("async_save", [False, True])
def test_background_delete_never_races_the_next_save(store: Store, tmp_path: Path,
                                                     async_save: bool) -> None:
    """Retention off the save path (Orbax's enable_background_delete): every
    save lands, each deletion finishes before the next save stages its files,
    and after close() exactly the keep_ckpts newest steps are left."""
    with mgr(store, tmp_path, keep_ckpts=2, async_save=async_save,
             background_delete=True) as m:
        for s in range(1, 7):
            save(m, s)
    assert [n for n, d in store.list_dir(ROOT) if d] == ["step-000005", "step-000006"]
    assert store.read_bytes(f"{ROOT}/LATEST") == b"step-000006\n"
    assert all(verify_directory(store, f"{ROOT}/step-{s:06d}", full=True).ok for s in (5, 6))


def test_sync_save_returns_before_background_delete(store: Store, tmp_path: Path) -> None:
    """A sync save returns once LATEST names the step, before the old step is
    deleted; close() finishes the deletion."""
    import threading
    gate = threading.Event()
    m = mgr(store, tmp_path, keep_ckpts=1, async_save=False, background_delete=True)
    real_retain = m.tree.retain
    calls = []

    def slow_retain(keep: int, **kw: object) -> list[str]:
        calls.append(keep)
        if len(calls) == 2:  # the retention after step 2: hold it
            assert gate.wait(30)
        return real_retain(keep, **kw)  # type: ignore[arg-type]
    m.tree.retain = slow_retain  # type: ignore[method-assign]
    save(m, 1)
    save(m, 2)
    assert store.read_bytes(f"{ROOT}/LATEST") == b"step-000002\n"
    assert [n for n, d in store.list_dir(ROOT) if d] == ["step-000001", "step-000002"]
    assert m.poll() is True  # nothing in flight; poll does not wait for the deletion
    gate.set()
    m.close()
    assert [n for n, d in store.list_dir(ROOT) if d] == ["step-000002"]


def test_background_delete_error_is_raised_next_and_cleared(store: Store,
                                                            tmp_path: Path) -> None:
    m = mgr(store, tmp_path, keep_ckpts=1, async_save=False, background_delete=True)
    failures = iter([StorageError("runs/r1/ckpt/step-000001: injected delete failure")])

    def fail_once(steps: list[int]) -> None:
        err = next(failures, None)
        if err is not None:
            raise err
    m.on_retain.append(fail_once)
    save(m, 1)
    with pytest.raises(StorageError, match="injected delete failure"):
        save(m, 2)
    assert store.read_bytes(f"{ROOT}/LATEST") == b"step-000001\n"  # step 2 not written
    save(m, 2)
    save(m, 3)
    m.close()
    assert [n for n, d in store.list_dir(ROOT) if d] == ["step-000003"]


def test_async_save_snapshots_the_arrays(store: Store, tmp_path: Path) -> None:
    params = model(3)
    expected = params["embed.weight"].copy()
    with mgr(store, tmp_path) as m:
        fut = save(m, 7, params=params)
        params["embed.weight"][:] = 42.0  # training goes on
        assert fut.result().step == 7
    state = mgr(store, tmp_path).resume()
    np.testing.assert_array_equal(state.model["embed.weight"], expected)


def test_failed_async_save_does_not_move_latest(store: Store, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    m = mgr(store, tmp_path)
    save(m, 1).result()
    real = store.open_write
    calls = {"n": 0}

    def flaky(key: str, **kw):  # type: ignore[no-untyped-def]
        if "step-000002" in key and "optimizer" in key:
            raise StorageError(f"{key}: injected network failure", key=key)
        calls["n"] += 1
        return real(key, **kw)

    monkeypatch.setattr(store, "open_write", flaky)
    save(m, 2)
    with pytest.raises(StorageError, match="injected"):
        m.wait()
    assert store.read_bytes(f"{ROOT}/LATEST") == b"step-000001\n"
    assert [n for n, d in store.list_dir(ROOT) if d] == ["step-000001"]
    monkeypatch.setattr(store, "open_write", real)
    save(m, 3)
    assert m.poll() in (True, False)
    m.close()
    assert store.read_bytes(f"{ROOT}/LATEST") == b"step-000003\n"


def test_failure_is_raised_by_next_save(store: Store, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    m = mgr(store, tmp_path)
    real = store.open_write
    monkeypatch.setattr(store, "open_write", lambda key, **kw: (_ for _ in ()).throw(
        StorageError(f"{key}: injected", key=key)))
    fut = save(m, 1)
    concurrent.futures.wait([fut])
    monkeypatch.setattr(store, "open_write", real)
    with pytest.raises(StorageError, match="injected"):
        save(m, 2)
    save(m, 2)
    m.close()
    assert store.read_bytes(f"{ROOT}/LATEST") == b"step-000002\n"


def test_resume_falls_back_over_missing_manifest_and_truncation(store: Store,
                                                                tmp_path: Path) -> None:
    with mgr(store, tmp_path, keep_ckpts=0) as m:
        for s in (1, 2, 3):
            save(m, s)
    store.delete(f"{ROOT}/step-000003/{MANIFEST}")
    weights = store.read_bytes(f"{ROOT}/step-000002/model.safetensors")
    store.write_bytes(f"{ROOT}/step-000002/model.safetensors", weights[:-7])
    with pytest.warns(CheckpointSkippedWarning) as record:
        state = mgr(store, tmp_path).resume()
    assert state.step == 1
    messages = [str(w.message) for w in record]
    assert any("step-000003" in s and "not committed" in s for s in messages)
    assert any("step-000002" in s and "model.safetensors" in s for s in messages)
    np.testing.assert_array_equal(state.model["embed.weight"], model(1)["embed.weight"])
    assert state.trainer_state == trainer_state(1) and state.optimizer == "adamw"


def test_resume_flipped_byte_and_nothing_verifies(store: Store, tmp_path: Path) -> None:
    with mgr(store, tmp_path) as m:
        save(m, 1)
    key = f"{ROOT}/step-000001/optimizer.safetensors"
    data = store.read_bytes(key)
    store.write_bytes(key, data[:-1] + bytes([data[-1] ^ 0xFF]))
    with pytest.warns(CheckpointSkippedWarning, match="sha256"), \
            pytest.raises(NoValidCheckpointError, match="no checkpoint verifies"):
        mgr(store, tmp_path).resume()


def test_resume_explicit_step_and_numeric_order(store: Store, tmp_path: Path) -> None:
    with mgr(store, tmp_path, keep_ckpts=0) as m:
        for s in (999_999, 1_000_000, 2):
            save(m, s) if s != 2 else None
    assert [n for n, d in store.list_dir(ROOT) if d] == ["step-1000000", "step-999999"]
    assert mgr(store, tmp_path).resume().step == 1_000_000
    assert mgr(store, tmp_path).resume("step-999999").step == 999_999
    assert mgr(store, tmp_path).resume(f"{ROOT}/step-999999").step == 999_999
    with pytest.raises(CheckpointError, match="not a step directory"):
        mgr(store, tmp_path).resume("nonsense")


def test_lfs_pointer_in_place_of_weights_is_refused(store: Store, tmp_path: Path) -> None:
    """A manifest that vouches for Git LFS pointer text: verification passes, the
    safetensors header check refuses it before any tensor is read; the step is
    skipped like one that does not verify, and with no older step nothing
    resumes (the reason is kept)."""
    from registry.protocol.commit import DirectoryWriter
    lfs = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 9\n"
    with DirectoryWriter(store, f"{ROOT}/step-000004", kind="checkpoint",
                         meta={"run_id": "r1", "step": 4}) as w:
        w.write_bytes("model.safetensors", lfs)
        w.write_bytes("optimizer.safetensors", lfs)
        w.write_json("config.json", {})
        w.write_json("trainer_state.json", trainer_state(4))
        w.commit()
    with pytest.warns(CheckpointSkippedWarning, match="Git LFS pointer"), \
            pytest.raises(NoValidCheckpointError, match="Git LFS pointer"):
        mgr(store, tmp_path).resume("step-000004")


def test_resume_with_garbled_latest_scans(store: Store, tmp_path: Path) -> None:
    with mgr(store, tmp_path) as m:
        save(m, 5)
    store.write_bytes(f"{ROOT}/LATEST", b"garbage\x00")
    with pytest.warns(CheckpointSkippedWarning, match="LATEST"):
        assert mgr(store, tmp_path).resume().step == 5


def test_progress_event_only_after_latest(store: Store, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    m = mgr(store, tmp_path, async_save=False)
    seen: list[bytes] = []
    real = m._emit

    def check(result):  # type: ignore[no-untyped-def]
        seen.append(store.read_bytes(f"{ROOT}/LATEST"))
        real(result)

    monkeypatch.setattr(m, "_emit", check)
    save(m, 8)
    assert seen == [b"step-000008\n"]
    lines = io.StringIO((tmp_path / "progress.jsonl").read_text()).readlines()
    assert len(lines) == 1


def test_resave_after_crash_between_commit_and_latest(store: Store, tmp_path: Path) -> None:
    """The crash came after step 20 was committed but before LATEST moved: resume
    goes back to 10, and saving 20 again replaces the never-vouched-for directory."""
    with mgr(store, tmp_path, keep_ckpts=0, async_save=False) as m:
        save(m, 10)
        save(m, 20)
    store.write_bytes(f"{ROOT}/LATEST", b"step-000010\n")  # as if killed before step 4
    m = mgr(store, tmp_path, keep_ckpts=0, async_save=False)
    assert m.resume().step == 10
    save(m, 20, params=model(99))
    m.close()
    assert store.read_bytes(f"{ROOT}/LATEST") == b"step-000020\n"
    np.testing.assert_array_equal(mgr(store, tmp_path).resume().model["embed.weight"],
                                  model(99)["embed.weight"])


def test_fallback_moves_latest_back_and_resave_works(store: Store, tmp_path: Path) -> None:
    with mgr(store, tmp_path, keep_ckpts=0, async_save=False) as m:
        save(m, 10)
        save(m, 20)
    store.delete(f"{ROOT}/step-000020/trainer_state.json")
    m = mgr(store, tmp_path, keep_ckpts=0, async_save=False)
    with pytest.warns(CheckpointSkippedWarning, match="step-000020"):
        assert m.resume().step == 10
    assert store.read_bytes(f"{ROOT}/LATEST") == b"step-000010\n"
    save(m, 20)
    assert verify_directory(store, f"{ROOT}/step-000020", full=True).ok
    assert store.read_bytes(f"{ROOT}/LATEST") == b"step-000020\n"


def test_saving_over_a_vouched_checkpoint_is_refused(store: Store, tmp_path: Path) -> None:
    with mgr(store, tmp_path, keep_ckpts=0, async_save=False) as m:
        save(m, 10)
        save(m, 20)
        before = store.read_bytes(f"{ROOT}/step-000010/model.safetensors")
        with pytest.raises(CheckpointError, match="already a committed checkpoint"):
            save(m, 10, params=model(5))
    assert store.read_bytes(f"{ROOT}/step-000010/model.safetensors") == before


def test_half_deleted_step_can_be_saved_again(store: Store, tmp_path: Path) -> None:
    """Retention killed after removing MANIFEST.json leaves files under the final name."""
    with mgr(store, tmp_path, keep_ckpts=0, async_save=False) as m:
        save(m, 10)
    store.write_bytes(f"{ROOT}/step-000030/model.safetensors", b"half deleted")
    with mgr(store, tmp_path, keep_ckpts=0, async_save=False) as m:
        save(m, 30)
    assert verify_directory(store, f"{ROOT}/step-000030", full=True).ok


# -- incomplete optimizer state (issue 14, item 5) ----------------------------------------


@pytest.mark.parametrize("keep", ["exp_avg only", "nothing"])
def test_incomplete_adamw_state_is_refused_at_save(store: Store, tmp_path: Path,
                                                   keep: str) -> None:
    """An AdamW state with only exp_avg for a parameter, or no tensors at
    all, is not saved: nothing committed, LATEST does not move."""
    with mgr(store, tmp_path) as m:
        save(m, 1)
        params = model(2)
        state = {k: v for k, v in adamw(params).items()
                 if keep == "exp_avg only" and not k.endswith("head.bias.exp_avg_sq")}
        with pytest.raises(RegistryError, match="optimizer state incomplete"):
            fut = m.save(2, params, state, optimizer="adamw", config={"hidden_size": 8},
                         trainer_state=trainer_state(2))
            fut.result()
    assert store.read_bytes(f"{ROOT}/LATEST") == b"step-000001\n"
    assert not store.exists(f"{ROOT}/step-000002/{MANIFEST}")


def test_incomplete_state_is_not_resumed(store: Store, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A committed step whose optimizer state is incomplete (written by a tool
    that did not check) verifies byte for byte but is skipped at resume, with
    a warning naming the missing tensor, for the newest older one."""
    import registry.checkpoint.state as state_mod
    with mgr(store, tmp_path, keep_ckpts=0) as m:
        save(m, 1)
        monkeypatch.setattr(state_mod, "check_optimizer_state", lambda *a, **kw: None)
        params = model(2)
        partial = {k: v for k, v in adamw(params).items() if k.endswith(".exp_avg")}
        m.save(2, params, partial, optimizer="adamw", config={"hidden_size": 8},
               trainer_state=trainer_state(2)).result()
    monkeypatch.undo()
    assert store.read_bytes(f"{ROOT}/LATEST") == b"step-000002\n"
    with pytest.warns(CheckpointSkippedWarning, match="step-000002.*exp_avg_sq"):
        resumed = mgr(store, tmp_path).resume()
    assert resumed.step == 1
    assert store.read_bytes(f"{ROOT}/LATEST") == b"step-000001\n"  # moved back
    with pytest.warns(CheckpointSkippedWarning, match="incomplete"):
        assert mgr(store, tmp_path).resume("step-000002").step == 1


# -- resume <step dir> loads that directory (issue 14, item 6) ------------------------------


def test_resume_loads_the_directory_given(tmp_path: Path) -> None:
    """``resume(path)`` with a path into another run (key, URL, local path)
    loads that directory, never this run's step of the same name; a path to a
    directory that does not exist is a clear error."""
    url = str(tmp_path / "store")
    with CheckpointManager(url, "a", keep_ckpts=0) as a:
        save(a, 2, params=model(20))
    with CheckpointManager(url, "b", keep_ckpts=0) as b:
        save(b, 2, params=model(99))
    m = CheckpointManager(url, "a", keep_ckpts=0)
    for path in ("runs/b/ckpt/step-000002", f"{url}/runs/b/ckpt/step-000002",
                 f"file://{url}/runs/b/ckpt/step-000002/"):
        state = m.resume(path)
        assert state.path.endswith("runs/b/ckpt/step-000002"), (path, state.path)
        np.testing.assert_array_equal(state.model["embed.weight"], model(99)["embed.weight"])
    assert m.resume("step-000002").path.endswith("runs/a/ckpt/step-000002")
    np.testing.assert_array_equal(m.resume(f"{url}/runs/a/ckpt/step-000002")
                                  .model["embed.weight"], model(20)["embed.weight"])
    with pytest.raises(CheckpointError, match="no such step directory"):
        m.resume(str(tmp_path / "elsewhere/runs/other-run/ckpt/step-000002"))
    assert m.store.read_bytes("runs/a/ckpt/LATEST") == b"step-000002\n"

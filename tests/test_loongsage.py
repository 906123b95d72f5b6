"""LoongSage checkpoint trees (seed 003): saving, loading, the tracker, adopt,
the ckpt CLI and releases of the HF export, on memory, local disk and S3."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
import torch

from registry.checkpoint import CheckpointTree
from registry.checkpoint.layout import LOONGSAGE
from registry.checkpoint.loongsage import (
    DataSourceFreshWarning,
    LoongSageCheckpointer,
    NoTrackerWarning,
    RngSkippedWarning,
    load_dist_ckpt,
    load_training_state,
)
from registry.errors import (
    CheckpointError,
    DocumentError,
    NoValidCheckpointError,
    PointerError,
    StorageError,
    UsageError,
)
from registry.checkpoint.loongsage_dcp import read_full
from registry.protocol.manifest import MANIFEST
from registry.release import ModelRelease
from registry.store import Store, open_store
from registry.protocol.verify import read_manifest, verify_directory
from tests.conftest import run_cli
from tests.release_util import ledger_row, summary
from tests.support.loongsage_child import adamw, params, save_kwargs
from tests.support.forkclient import python_run

CHILD = Path(__file__).resolve().parent / "support" / "loongsage_child.py"
ROOT = "exp/loong"
TRACKER = f"{ROOT}/latest_checkpointed_iteration.txt"
HF_CONFIG = '{"hidden_size": 64,  "tl_tokenizer": "file"}'
TOKENIZER = {"version": "1.0", "model": {"type": "BPE"}}
SOURCES = ["data/a.jsonl", "data/b.jsonl", "data/c.jsonl"]


def ckpt(store: Store | str, **kw: Any) -> LoongSageCheckpointer:
    kw.setdefault("save_freq", 2)
    kw.setdefault("total_steps", 4)
    return LoongSageCheckpointer(store, ROOT, **kw)


def sources(step: int, order: list[str] = SOURCES) -> list[dict[str, Any]]:
    return [{"prompt_data_path": p, "state": {"cursor": step * 10 + SOURCES.index(p)}}
            for p in order]


def run(c: LoongSageCheckpointer, steps: range, **kw: Any) -> list[int]:
    """A train loop: finalize at each step start, maybe save, flush at the end."""
    saved = []
    for step in steps:
        c.on_step_start()
        args = save_kwargs(step)
        args["data_sources"] = kw.get("data_sources", sources(step))
        if c.maybe_save(step, **args):
            saved.append(step)
    c.finish()
    return saved


def hf_dir(tmp_path: Path, seed: int = 7, *, config: bool = True) -> Path:
    d = tmp_path / "hf_base"
    d.mkdir(exist_ok=True)
    safetensors.numpy.save_file(params(seed), str(d / "model.safetensors"),
                                metadata={"format": "pt"})
    if config:
        (d / "config.json").write_text('{"hidden_size": 64}')
    return d


def gate_files(tmp_path: Path) -> tuple[Path, Path]:
    """A passing ledger.json and eval summary, as files for the CLI."""
    ledger = tmp_path / "ledger.json"
    ledger.write_text(json.dumps([ledger_row()]))
    evals = tmp_path / "summary.json"
    evals.write_text(json.dumps(summary()))
    return ledger, evals


def safetensors_metadata(data: bytes) -> dict[str, str]:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n])["__metadata__"]


def mem() -> Store:
    """A fresh memory store (memory:// stores are process-global by name)."""
    return open_store(f"memory://ls-{uuid.uuid4().hex[:12]}")


def steps_on_disk(store: Store) -> list[str]:
    return [n for n, d in store.list_dir(ROOT) if d]


# -- saving ----------------------------------------------------------------------------


def test_save_every_freq_and_final_step(store: Store) -> None:
    c = ckpt(store, save_freq=3, total_steps=10, save_hf=True, hf_config=HF_CONFIG,
             tokenizer=TOKENIZER, topology={"tp": 2, "pp": 1, "ep": 1, "dp": 4})
    assert run(c, range(1, 11)) == [3, 6, 9, 10]
    assert steps_on_disk(store) == ["train_step_10", "train_step_3", "train_step_6",
                                    "train_step_9"]
    assert store.read_bytes(TRACKER) == b"10\n"
    prefix = f"{ROOT}/train_step_9"
    assert sorted(store.walk_files(prefix)) == [
        MANIFEST, "data_source/global_dataset_state_dict_ds0.pt",
        "data_source/global_dataset_state_dict_ds1.pt",
        "data_source/global_dataset_state_dict_ds2.pt",
        "dist_ckpt/.metadata", "dist_ckpt/__0_0.distcp", "hf_model/config.json",
        "hf_model/model.safetensors", "hf_model/tokenizer.json"]
    m = read_manifest(store, prefix)
    assert (m.kind, m.meta["step"], m.meta["layout"], m.meta["run_id"]) == (
        "checkpoint", 9, "loongsage", "exp-loong")
    assert verify_directory(store, prefix, full=True).ok
    # one dist_ckpt format for 1 rank and N (DESIGN section 1): torch DCP
    dcp_entries = read_full(store, f"{prefix}/dist_ckpt")
    hf_weights = safetensors.numpy.load(store.read_bytes(f"{prefix}/hf_model/model.safetensors"))
    for weights in ({k[6:]: v for k, v in dcp_entries.items() if k.startswith("model.")},
                    hf_weights):
        assert weights.keys() == params(9).keys()
        np.testing.assert_array_equal(weights["layer.weight"], params(9)["layer.weight"])
    assert store.read_bytes(f"{prefix}/hf_model/config.json") == HF_CONFIG.encode()
    assert json.loads(store.read_bytes(f"{prefix}/hf_model/tokenizer.json")) == TOKENIZER
    common = json.loads(dcp_entries["common"])
    assert common["topology"] == {"tp": 2, "pp": 1, "ep": 1, "dp": 4}
    assert common["optimizer_sharding_type"] == "fully_reshardable"
    assert json.loads(dcp_entries["rng.rank0"]) == {"seed": 1234, "step": 9}
    assert {k for k in dcp_entries if k.startswith("optimizer.state.")} == {
        f"optimizer.state.{k}" for k in adamw(params(9))}
    ds1 = torch.load(io.BytesIO(store.read_bytes(
        f"{prefix}/data_source/global_dataset_state_dict_ds1.pt")), weights_only=True)
    assert ds1["prompt_data_path"] == "data/b.jsonl" and ds1["state"] == {"cursor": 91}
    # HF weights carry the tag engines read (DESIGN 4).
    meta = safetensors_metadata(store.read_bytes(f"{prefix}/hf_model/model.safetensors"))
    assert meta["format"] == "pt"


@pytest.mark.parametrize("freq", [0, -1])
def test_non_positive_save_freq_saves_nothing_not_even_the_final_step(freq: int) -> None:
    """Seed 003's table: ``save_freq <= 0`` "means no saving" (issue 46): the
    final-step rule applies only when saving is on."""
    store = mem()
    assert run(ckpt(store, save_freq=freq, total_steps=5), range(1, 6)) == []
    assert steps_on_disk(store) == []
    assert run(ckpt(store, save_freq=4, total_steps=5), range(1, 6)) == [4, 5]


@pytest.mark.parametrize(("dist", "hf"), [(True, False), (False, True), (True, True),
                                          (False, False)])
def test_switches(dist: bool, hf: bool) -> None:
    store = mem()
    c = ckpt(store, save_checkpoint=dist, save_hf=hf, hf_config=HF_CONFIG, tokenizer=TOKENIZER)
    saved = run(c, range(1, 5))
    if not (dist or hf):
        assert saved == [] and store.walk_files("") == {}
        return
    assert saved == [2, 4]
    tops = {rel.split("/")[0] for rel in store.walk_files(f"{ROOT}/train_step_4")}
    expected = {MANIFEST} | ({"dist_ckpt", "data_source"} if dist else set()) | \
        ({"hf_model"} if hf else set())
    assert tops == expected
    assert verify_directory(store, f"{ROOT}/train_step_4", full=True).ok
    # An HF export cannot resume training: only dist_ckpt saves move the tracker.
    assert store.exists(TRACKER) is dist


def test_save_hf_needs_a_config() -> None:
    with pytest.raises(UsageError, match="hf_config"):
        ckpt("memory://ls-nocfg", save_hf=True)
    with pytest.raises(UsageError, match="tokenizer"):
        ckpt("memory://ls-nocfg", save_hf=True, hf_config=HF_CONFIG)


def test_bad_input_writes_nothing() -> None:
    store = mem()
    c = ckpt(store)
    kw = save_kwargs(2)
    with pytest.raises(CheckpointError, match="given twice"):
        c.maybe_save(2, **{**kw, "data_sources": sources(2, ["data/a.jsonl", "data/a.jsonl"])})
    with pytest.raises(CheckpointError, match="not JSON-serializable"):
        c.maybe_save(2, **{**kw, "rng_state": object()})
    with pytest.raises(CheckpointError, match="optimizer_state"):
        c.maybe_save(2, **{**kw, "optimizer_state": None})
    c.finish()
    assert store.walk_files("") == {}


def test_sync_save_is_written_when_it_returns() -> None:
    store = mem()
    c = ckpt(store, async_save=False)
    assert c.maybe_save(2, **save_kwargs(2))
    assert store.read_bytes(TRACKER) == b"2\n"
    assert verify_directory(store, f"{ROOT}/train_step_2", full=True).ok
    c.finish()


def test_async_tracker_moves_only_at_finalize_and_arrays_are_snapshotted() -> None:
    store = mem()
    c = ckpt(store)
    kw = save_kwargs(2)
    expected = kw["model"]["layer.weight"].copy()
    assert c.maybe_save(2, **kw)
    kw["model"]["layer.weight"][:] = 42.0  # training goes on at once
    deadline = time.monotonic() + 30
    while not store.exists(f"{ROOT}/train_step_2/{MANIFEST}"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not store.exists(TRACKER)  # landed, but not finalized yet
    while not c.on_step_start():
        time.sleep(0.01)
    assert store.read_bytes(TRACKER) == b"2\n"
    c.finish()
    got = read_full(store, f"{ROOT}/train_step_2/dist_ckpt")
    np.testing.assert_array_equal(got["model.layer.weight"], expected)


def test_at_most_one_save_in_flight() -> None:
    store = mem()
    c = ckpt(store, save_freq=1)
    gate = threading.Event()
    real = c._write
    active, peak = [0], [0]

    def slow(job: Any) -> Any:
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        if job.step == 1:
            gate.wait(30)
        try:
            return real(job)
        finally:
            active[0] -= 1

    c._write = slow  # type: ignore[method-assign]
    assert c.maybe_save(1, **save_kwargs(1))
    second = threading.Thread(target=lambda: c.maybe_save(2, **save_kwargs(2)))
    second.start()
    time.sleep(0.3)
    assert second.is_alive()  # the new save waits for the one in flight
    assert not store.exists(f"{ROOT}/train_step_2/{MANIFEST}")
    gate.set()
    second.join(30)
    assert store.read_bytes(TRACKER) == b"1\n"  # finalized before step 2 was scheduled
    c.finish()
    assert store.read_bytes(TRACKER) == b"2\n" and peak[0] == 1
    assert [r.step for r in c.saved] == [1, 2]


def test_failed_async_save_leaves_the_tracker(monkeypatch: pytest.MonkeyPatch) -> None:
    store = mem()
    c = ckpt(store, save_freq=1)
    c.maybe_save(1, **save_kwargs(1))
    c.wait()
    real = store.open_write

    def flaky(key: str, **kw: Any) -> Any:
        if "train_step_2" in key and ".distcp" in key:
            raise StorageError(f"{key}: injected network failure", key=key)
        return real(key, **kw)

    monkeypatch.setattr(store, "open_write", flaky)
    c.maybe_save(2, **save_kwargs(2))
    with pytest.raises(StorageError, match="injected"):
        c.wait()
    assert store.read_bytes(TRACKER) == b"1\n"
    assert steps_on_disk(store) == ["train_step_1"]
    monkeypatch.setattr(store, "open_write", real)
    c.maybe_save(3, **save_kwargs(3))
    c.finish()
    assert store.read_bytes(TRACKER) == b"3\n"


# -- loading ---------------------------------------------------------------------------


def test_resume_matches_data_sources_by_path(store: Store, tmp_path: Path) -> None:
    run(ckpt(store), range(1, 5))
    order = ["data/c.jsonl", "data/new.jsonl", "data/a.jsonl"]  # reordered, b dropped, one new
    with pytest.warns(DataSourceFreshWarning, match="data/new.jsonl"):
        st = load_training_state(store, ROOT, hf_model_path=hf_dir(tmp_path), data_sources=order,
                                 topology={"tp": 1})
    assert (st.source, st.step, st.rng_restored) == ("checkpoint", 4, True)
    assert [d.prompt_data_path for d in st.data_sources] == order
    assert st.data_state("data/c.jsonl") == {"cursor": 42}
    assert st.data_state("data/a.jsonl") == {"cursor": 40}
    assert st.data_sources[1].fresh and st.data_state("data/new.jsonl") is None
    np.testing.assert_array_equal(st.model["layer.weight"], params(4)["layer.weight"])
    assert st.optimizer == "adamw"
    np.testing.assert_array_equal(st.optimizer_state["layer.bias.exp_avg"],
                                  adamw(params(4))["layer.bias.exp_avg"])
    assert st.scheduler_state == {"lr": 0.001, "last_step": 4}
    assert st.rng_state == {"seed": 1234, "step": 4}
    assert st.hf_config == {"hidden_size": 64}


def test_topology_change_skips_rng_only(tmp_path: Path) -> None:
    store = mem()
    run(ckpt(store, topology={"tp": 2, "pp": 2, "dp": 2}), range(1, 5))
    hf = hf_dir(tmp_path)
    with pytest.warns(RngSkippedWarning, match="TP 2 -> 4"):
        st = load_training_state(store, ROOT, hf_model_path=hf, data_sources=SOURCES,
                                 topology={"tp": 4, "pp": 2, "dp": 1})
    assert st.rng_state is None and not st.rng_restored
    assert st.saved_topology == {"tp": 2, "pp": 2, "ep": 1, "dp": 2}
    np.testing.assert_array_equal(st.model["layer.weight"], params(4)["layer.weight"])
    assert st.scheduler_state["last_step"] == 4 and st.data_state("data/b.jsonl") == {"cursor": 41}
    # Only a TP/PP change skips RNG (seed 003); a DP change alone does not.
    st = load_training_state(store, ROOT, hf_model_path=hf, data_sources=SOURCES,
                             topology={"tp": 2, "pp": 2, "dp": 8})
    assert st.rng_restored and st.rng_state == {"seed": 1234, "step": 4}


def test_hf_model_path_is_required_on_both_paths(tmp_path: Path) -> None:
    store = mem()
    with pytest.raises(UsageError, match="hf_model_path is required"):
        load_training_state(store, ROOT)  # no checkpoint
    run(ckpt(store), range(1, 3))
    with pytest.raises(UsageError, match="hf_model_path is required"):
        load_training_state(store, ROOT, data_sources=SOURCES)
    with pytest.raises(DocumentError, match="config.json"):
        load_training_state(store, ROOT, hf_model_path=hf_dir(tmp_path, config=False))


def test_no_tracker_initializes_from_hf(tmp_path: Path) -> None:
    store = mem()
    hf = hf_dir(tmp_path, seed=7)
    st = load_training_state(store, ROOT, hf_model_path=str(hf), data_sources=SOURCES)
    assert (st.source, st.step, st.optimizer_state, st.rng_state) == ("hf", 0, None, None)
    np.testing.assert_array_equal(st.model["layer.weight"], params(7)["layer.weight"])
    assert all(d.fresh for d in st.data_sources)
    # Step directories without a tracker are not resumable: said, then HF init.
    run(ckpt(store), range(1, 3))
    store.delete(TRACKER)
    with pytest.warns(NoTrackerWarning, match="no tracker file"):
        assert load_training_state(store, ROOT, hf_model_path=hf).source == "hf"


def test_hf_init_from_sharded_weights(tmp_path: Path) -> None:
    d = tmp_path / "sharded"
    d.mkdir()
    p = params(3)
    safetensors.numpy.save_file({"layer.weight": p["layer.weight"]}, str(d / "s1.safetensors"))
    safetensors.numpy.save_file({"layer.bias": p["layer.bias"]}, str(d / "s2.safetensors"))
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"layer.weight": "s1.safetensors", "layer.bias": "s2.safetensors"}}))
    (d / "config.json").write_text("{}")
    st = load_training_state("memory://ls-shard", ROOT, hf_model_path=d)
    np.testing.assert_array_equal(st.model["layer.bias"], p["layer.bias"])
    # the weights rule (registry.formats.weights) holds here too: a stale shard of an
    # older export would otherwise be trained from beside the newer ones
    safetensors.numpy.save_file({"layer.bias": p["layer.bias"]}, str(d / "s3.safetensors"))
    with pytest.raises(DocumentError, match=r"sharded/s3\.safetensors: a shard .* does not name"):
        load_training_state("memory://ls-shard2", ROOT, hf_model_path=d)


@pytest.fixture
def two_steps() -> Store:
    """Steps 2 and 4 saved, tracker on 4."""
    store = mem()
    run(ckpt(store), range(1, 5))
    return store


@pytest.mark.parametrize("raw", [b"4", b" 4\n", b"\n4\n\n", b"4\r\n", b"\t4  "])
def test_tracker_whitespace_is_accepted(two_steps: Store, raw: bytes, tmp_path: Path) -> None:
    two_steps.write_bytes(TRACKER, raw)
    assert load_training_state(two_steps, ROOT, hf_model_path=hf_dir(tmp_path),
                               data_sources=SOURCES).step == 4


@pytest.mark.parametrize(("raw", "rule"), [
    (b"", "empty"), (b"\n", "empty"), (b"  \n ", "empty"), (b"four", "garbled"),
    (b"4a", "garbled"), (b"-4", "garbled"), (b"4.0", "garbled"), (b"train_step_4", "garbled"),
    (b"2\n4\n", "garbled"), (b"\xff4", "UTF-8"), (b"../4", "outside"),
])
def test_bad_tracker_is_a_clear_error(two_steps: Store, raw: bytes, rule: str,
                                      tmp_path: Path) -> None:
    two_steps.write_bytes(TRACKER, raw)
    with pytest.raises(PointerError, match=rule) as e:
        load_training_state(two_steps, ROOT, hf_model_path=hf_dir(tmp_path))
    assert "latest_checkpointed_iteration.txt" in str(e.value)
    assert "no other step is tried" in str(e.value)


def test_tracker_naming_a_missing_step(two_steps: Store, tmp_path: Path) -> None:
    two_steps.write_bytes(TRACKER, b"6\n")
    with pytest.raises(NoValidCheckpointError, match="records step 6.*train_step_6 does not "
                                                     "exist"):
        load_training_state(two_steps, ROOT, hf_model_path=hf_dir(tmp_path))


@pytest.mark.parametrize("damage", ["flip", "truncate", "manifest", "no-dist"])
def test_tracker_naming_an_unverifiable_step(two_steps: Store, damage: str,
                                             tmp_path: Path) -> None:
    step4 = f"{ROOT}/train_step_4"
    key = f"{step4}/dist_ckpt/__0_0.distcp"
    data = two_steps.read_bytes(key)
    if damage == "flip":
        two_steps.write_bytes(key, data[:-1] + bytes([data[-1] ^ 1]))
        match = "sha256"
    elif damage == "truncate":
        two_steps.write_bytes(key, data[:-5])
        match = "size"
    elif damage == "manifest":
        two_steps.delete(f"{step4}/{MANIFEST}")
        match = "not committed.*registry ckpt adopt"
    else:  # an HF-only step the tracker was pointed at by hand
        run(ckpt(two_steps, save_checkpoint=False, save_hf=True, hf_config="{}", save_freq=6,
                 total_steps=6), range(6, 7))
        two_steps.write_bytes(TRACKER, b"6\n")
        with pytest.raises(CheckpointError, match="dist_ckpt/.metadata: not in"):
            load_training_state(two_steps, ROOT, hf_model_path=hf_dir(tmp_path))
        return
    with pytest.raises(NoValidCheckpointError, match=match) as e:
        load_training_state(two_steps, ROOT, hf_model_path=hf_dir(tmp_path))
    assert "records step 4" in str(e.value)  # never silently step 2


def test_non_numeric_step_dirs_are_ignored(two_steps: Store) -> None:
    for name in ("train_step_x", "train_step_", "train_step_3abc", "train_step_007",
                 "train_step_4.tmp", "train_step_5.claim.d", "train_step_-1"):
        two_steps.write_bytes(f"{ROOT}/{name}/junk", b"x")
    two_steps.write_bytes(f"{ROOT}/train_step_9", b"a file, not a directory")
    assert CheckpointTree(two_steps, ROOT, LOONGSAGE).steps() == [2, 4]


def test_load_dist_ckpt_reads_the_named_step(two_steps: Store, tmp_path: Path) -> None:
    two_steps.write_bytes(TRACKER, b"garbage")  # never read: the path names the step
    ref = load_dist_ckpt(two_steps, f"{ROOT}/train_step_2/dist_ckpt")
    assert ref.step == 2 and ref.optimizer_state is None
    np.testing.assert_array_equal(ref.model["layer.weight"], params(2)["layer.weight"])
    assert ref.topology == {"tp": 1, "pp": 1, "ep": 1, "dp": 1}
    assert load_dist_ckpt(two_steps, f"{ROOT}/train_step_4/dist_ckpt/", optimizer=True
                          ).optimizer == "adamw"
    for bad in (ROOT, f"{ROOT}/train_step_2", f"{ROOT}/train_step_2/hf_model",
                f"{ROOT}/train_step_x/dist_ckpt"):
        with pytest.raises(UsageError, match="one concrete train_step_<N>/dist_ckpt"):
            load_dist_ckpt(two_steps, bad)
    two_steps.write_bytes(TRACKER, b"4\n")
    with pytest.raises(UsageError, match="it is a checkpoint_path"):
        load_dist_ckpt(two_steps, ROOT)
    key = f"{ROOT}/train_step_2/dist_ckpt/__0_0.distcp"
    data = two_steps.read_bytes(key)
    two_steps.write_bytes(key, data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(NoValidCheckpointError, match="sha256"):
        load_dist_ckpt(two_steps, f"{ROOT}/train_step_2/dist_ckpt")
    with pytest.raises(NoValidCheckpointError, match="not committed"):
        load_dist_ckpt(two_steps, f"{ROOT}/train_step_8/dist_ckpt")


def test_load_dist_ckpt_by_folder_path(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    run(ckpt(url), range(1, 3))
    ref = load_dist_ckpt(f"{url}/{ROOT}/train_step_2/dist_ckpt")
    np.testing.assert_array_equal(ref.model["layer.bias"], params(2)["layer.bias"])


# -- the kill test -----------------------------------------------------------------------


@pytest.mark.parametrize(("event", "committed"), [
    ("write:2", False),                 # killed on the writer thread, mid dist_ckpt
    ("before:commit:1", False),         # every file written, no manifest
    ("before:set_latest:1", True),      # landed and committed, tracker not yet moved
])
def test_async_save_killed_before_it_landed(durable_store_url: str, event: str,
                                            committed: bool, tmp_path: Path) -> None:
    r = python_run([sys.executable, str(CHILD), durable_store_url, ROOT, "--kill", event],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stdout, r.stderr)
    assert "LANDED 1" in r.stdout and f"KILL at {event.rsplit(':', 1)[0]}" in r.stderr
    store = open_store(durable_store_url)
    assert store.read_bytes(TRACKER) == b"1\n"
    step2 = f"{ROOT}/train_step_2"
    assert verify_directory(store, step2, full=True).ok is committed
    hf = hf_dir(tmp_path)
    st = load_training_state(store, ROOT, hf_model_path=hf, data_sources=["data/a.jsonl"])
    assert st.step == 1 and st.data_state("data/a.jsonl") == {"offset": 1}
    np.testing.assert_array_equal(st.model["layer.weight"], params(1)["layer.weight"])
    # The resumed run saves step 2 again over whatever the killed save left.
    c = LoongSageCheckpointer(store, ROOT, save_freq=1, total_steps=3, async_save=False)
    kw = save_kwargs(2)
    kw["model"] = params(22)
    kw["optimizer_state"] = adamw(params(22))
    assert c.maybe_save(2, **kw)
    c.finish()
    assert store.read_bytes(TRACKER) == b"2\n"
    assert verify_directory(store, step2, full=True).ok
    st = load_training_state(store, ROOT, hf_model_path=hf, data_sources=["data/a.jsonl"])
    np.testing.assert_array_equal(st.model["layer.weight"], params(22)["layer.weight"])


# -- the CLI -----------------------------------------------------------------------------


def test_cli_ls_latest_verify(durable_store_url: str) -> None:
    store = open_store(durable_store_url)
    run(ckpt(store, save_hf=True, hf_config="{}"), range(1, 5))
    store.write_bytes(f"{ROOT}/train_step_6/dist_ckpt/model.safetensors", b"half written")
    store.write_bytes(f"{ROOT}/train_step_x/junk", b"ignored")
    tree = f"{durable_store_url}/{ROOT}"
    r = run_cli("ckpt", "ls", tree, "--json")  # layout detected from the tracker
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["layout"] == "loongsage" and doc["latest"] == 4
    assert [(s["step"], s["committed"], s["verified"]) for s in doc["steps"]] == [
        (2, True, True), (4, True, True), (6, False, False)]
    r = run_cli("ckpt", "latest", ROOT, "--store", durable_store_url, "--layout", "loongsage")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("train_step_4\t") and r.stdout.rstrip().endswith("verified")
    key = f"{ROOT}/train_step_2/hf_model/model.safetensors"
    data = store.read_bytes(key)
    store.write_bytes(key, data[:-1] + bytes([data[-1] ^ 1]))
    r = run_cli("ckpt", "verify", tree, "--json")
    assert r.returncode == 1
    by_step = {s["step"]: s for s in json.loads(r.stdout)}
    assert not by_step[2]["verified"] and "sha256" in by_step[2]["problems"][0]
    assert by_step[4]["verified"] and not by_step[6]["committed"]
    store.write_bytes(TRACKER, b"4x\n")
    r = run_cli("ckpt", "latest", tree)
    assert r.returncode == 5 and "garbled" in r.stderr and "Traceback" not in r.stderr


FOREIGN = {  # what real LoongSage writes: Megatron torch_dist shards, .pt pickles
    "dist_ckpt/__0_0.distcp": b"\x80\x04megatron shard" * 50,
    "dist_ckpt/.metadata": b"\x80\x04metadata",
    "dist_ckpt/common.pt": b"\x80\x04common",
    "data_source/global_dataset_state_dict_ds0.pt": b"\x80\x04cursor",
}


def write_foreign(store: Store, steps: tuple[int, ...], tracker: bytes | None) -> None:
    for step in steps:
        for rel, data in FOREIGN.items():
            store.write_bytes(f"{ROOT}/train_step_{step}/{rel}", data + str(step).encode())
        store.write_bytes(f"{ROOT}/train_step_{step}/hf_model/config.json",
                          b'{"hidden_size": 64, "step": %d}' % step)
        store.write_bytes(f"{ROOT}/train_step_{step}/hf_model/model.safetensors",
                          safetensors.numpy.save(params(step), metadata={"format": "pt"}))
    if tracker is not None:
        store.write_bytes(TRACKER, tracker)


def test_cli_adopt_foreign_tree(durable_store_url: str, tmp_path: Path) -> None:
    store = open_store(durable_store_url)
    write_foreign(store, (5, 10), b"10\n")
    tree = f"{durable_store_url}/{ROOT}"
    assert verify_directory(store, f"{ROOT}/train_step_10").error is not None
    r = run_cli("ckpt", "adopt", tree, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["step"] == 10 and doc["already_adopted"] is False and doc["files"] == 6
    m = read_manifest(store, f"{ROOT}/train_step_10")
    assert m.meta["layout"] == "loongsage" and m.meta["step"] == 10
    assert {e.path for e in m.files} == set(FOREIGN) | {"hf_model/config.json",
                                                        "hf_model/model.safetensors"}
    assert not store.exists(f"{ROOT}/train_step_5/{MANIFEST}")  # only the tracked step
    r = run_cli("ckpt", "verify", ROOT, "--store", durable_store_url, "--step", "10")
    assert r.returncode == 0 and "OK   train_step_10" in r.stdout, r.stdout + r.stderr
    r = run_cli("ckpt", "gc", tree, "--keep", "1")  # would delete LoongSage's train_step_5
    assert r.returncode == 2 and "train_step_5 has no MANIFEST.json" in r.stderr, r.stderr
    assert store.exists(f"{ROOT}/train_step_5/dist_ckpt/common.pt")
    # Adopted, it verifies, but its torch_dist dist_ckpt is not ours to load.
    with pytest.raises(CheckpointError, match="torch_dist"):
        load_training_state(store, ROOT, hf_model_path=hf_dir(tmp_path))


def test_adopt_refusals() -> None:
    from registry.checkpoint.loongsage import adopt
    store = mem()
    write_foreign(store, (5,), None)
    with pytest.raises(NoValidCheckpointError, match="no tracker file"):
        adopt(store, ROOT)
    store.write_bytes(TRACKER, b"7\n")
    with pytest.raises(NoValidCheckpointError, match="does not exist"):
        adopt(store, ROOT)
    store.write_bytes(TRACKER, b"5\n")
    assert adopt(store, ROOT).step == 5 and adopt(store, ROOT).already
    # The adopted step's HF export can be released.
    rel = ModelRelease(store).create(None, 5, "m", "1", ledger=[ledger_row()],
                                     eval_summary=summary(), layout=LOONGSAGE,
                                     checkpoint_root=ROOT, subdir="hf_model")
    assert rel.manifest.meta["source"]["step"] == 5
    assert rel.manifest.meta["source"]["run_id"] == "exp-loong"  # adopt's derived run_id
    assert store.read_bytes("models/m/1/config.json") == b'{"hidden_size": 64, "step": 5}'
    store.write_bytes(f"{ROOT}/train_step_5/dist_ckpt/common.pt", b"changed")
    with pytest.raises(NoValidCheckpointError, match="does not verify"):
        adopt(store, ROOT)


def test_release_and_publish_of_hf_export(durable_store_url: str, tmp_path: Path) -> None:
    store = open_store(durable_store_url)
    run(ckpt(store, save_hf=True, hf_config=HF_CONFIG, tokenizer=TOKENIZER), range(1, 5))
    ledger, evals = gate_files(tmp_path)
    common = ["--ledger", str(ledger), "--evals", str(evals), "--store", durable_store_url,
              "--db", f"sqlite:///{tmp_path / 'index.db'}", "--json"]
    args = ["release", "create", "--layout", "loongsage", "--checkpoint-path", ROOT,
            "--step", "4", "--model-id", "m", "--version", "1", *common]
    # The release names the run the step's manifest records (exp-loong), no other.
    r = run_cli(*args, "--run", "loong")
    assert r.returncode == 2 and "records run_id 'exp-loong', not 'loong'" in r.stderr, r.stderr
    assert not store.exists("models/m/1/MANIFEST.json")
    r = run_cli(*args, "--run", "exp-loong")
    assert r.returncode == 0, r.stderr
    step4 = f"{ROOT}/train_step_4"
    assert json.loads(r.stdout)["source"] == {
        "run_id": "exp-loong", "step": 4, "manifest_sha256": read_manifest(store, step4).digest}
    assert read_manifest(store, "models/m/1").meta["source"]["run_id"] == \
        read_manifest(store, step4).meta["run_id"]
    assert verify_directory(store, "models/m/1", full=True).ok
    for name in ("config.json", "tokenizer.json"):
        assert store.read_bytes(f"models/m/1/{name}") == \
            store.read_bytes(f"{step4}/hf_model/{name}")
    got = safetensors.numpy.load(store.read_bytes("models/m/1/model.safetensors"))
    np.testing.assert_array_equal(got["layer.weight"], params(4)["layer.weight"])
    hf_url = f"{durable_store_url}/{step4}/hf_model"
    r = run_cli("publish", hf_url, "--model-id", "m", "--version", "2", *common)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["source"]["uri"].endswith(f"{step4}/hf_model")
    assert verify_directory(store, "models/m/2", full=True).ok
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert store.read_bytes(f"models/m/2/{name}") == \
            store.read_bytes(f"{step4}/hf_model/{name}")
    # A step saved without the HF export has nothing to release.
    run(ckpt(store, save_freq=6, total_steps=6), range(6, 7))
    with pytest.raises(DocumentError, match="hf_model/model.safetensors: missing"):
        ModelRelease(store).create(None, 6, "m", "3", ledger=[ledger_row()],
                                   eval_summary=summary(), layout=LOONGSAGE,
                                   checkpoint_root=ROOT, subdir="hf_model")
    assert not store.exists("models/m/3/MANIFEST.json")


@pytest.mark.parametrize("damage", ["uncommitted", "flipped", "unlisted"])
def test_publish_of_hf_export_needs_its_committed_step(durable_store_url: str, tmp_path: Path,
                                                       damage: str) -> None:
    """``registry publish <tree>/train_step_N/hf_model`` is verified in full
    against the step's MANIFEST.json first; a step that is not committed, a
    changed byte or a file added after the commit is refused, nothing released."""
    store = open_store(durable_store_url)
    run(ckpt(store, save_hf=True, hf_config=HF_CONFIG, tokenizer=TOKENIZER), range(1, 5))
    ledger, evals = gate_files(tmp_path)
    step4 = f"{ROOT}/train_step_4"
    if damage == "uncommitted":
        store.delete(f"{step4}/{MANIFEST}")
        needle = "not committed"
    elif damage == "flipped":
        key = f"{step4}/hf_model/model.safetensors"
        data = bytearray(store.read_bytes(key))
        data[-1] ^= 0xFF
        store.write_bytes(key, bytes(data))
        needle = "hf_model/model.safetensors: sha256"
    else:
        store.write_bytes(f"{step4}/hf_model/extra.bin", b"added later")
        needle = "hf_model/extra.bin: not listed in the step's MANIFEST.json"
    r = run_cli("publish", f"{durable_store_url}/{step4}/hf_model", "--model-id", "m",
                "--version", "1", "--ledger", str(ledger), "--evals", str(evals),
                "--store", durable_store_url, "--db", f"sqlite:///{tmp_path / 'index.db'}")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert not store.exists("models/m/1/MANIFEST.json")
    assert store.walk_files("models") == {}  # nothing of a release was written


def test_release_create_loongsage_run_defaults_to_the_tree_name(durable_store_url: str,
                                                                tmp_path: Path) -> None:
    store = open_store(durable_store_url)
    run(ckpt(store, save_hf=True, hf_config=HF_CONFIG, tokenizer=TOKENIZER), range(1, 5))
    ledger, evals = gate_files(tmp_path)
    common = ["--step", "4", "--model-id", "m", "--version", "1", "--ledger", str(ledger),
              "--evals", str(evals), "--store", durable_store_url,
              "--db", f"sqlite:///{tmp_path / 'index.db'}", "--json"]
    r = run_cli("release", "create", *common)  # tinyllm (the default) needs --run
    assert r.returncode == 2 and "--run is required" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run_cli("release", "create", "--layout", "loongsage", "--checkpoint-path", ROOT,
                *common)
    assert r.returncode == 0, r.stderr
    # The run_id of the step's manifest (derived from ROOT exp/loong), as the
    # checkpoint's index row says: not "loong" (issue 18).
    assert json.loads(r.stdout)["source"]["run_id"] == "exp-loong"
    assert read_manifest(store, "models/m/1").meta["source"]["run_id"] == \
        read_manifest(store, f"{ROOT}/train_step_4").meta["run_id"]
    assert verify_directory(store, "models/m/1", full=True).ok


def test_gc_scans_a_named_loongsage_tree_and_only_step_shaped_names(durable_store_url: str,
                                                                     ) -> None:
    store = open_store(durable_store_url)
    run(ckpt(store), range(1, 5))  # commits train_step_2 and train_step_4
    store.write_bytes(f"{ROOT}/train_step_9/dist_ckpt/common.pt", b"crashed save")
    store.write_bytes(f"{ROOT}/train_step_7.tmp/dist_ckpt/common.pt", b"stale staging")
    store.write_bytes(f"{ROOT}/notes/todo.txt", b"the user's own file")
    before = dict(store.walk_files(ROOT))
    r = run_cli("gc", "--older-than", "0s", "--store", durable_store_url, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["removed"] == [] and store.walk_files(ROOT) == before
    r = run_cli("gc", "--older-than", "0s", "--checkpoint-path", ROOT,
                "--store", durable_store_url, "--json")
    assert r.returncode == 0, r.stderr
    removed = sorted(k.rsplit("/", 1)[-1] for k in json.loads(r.stdout)["removed"])
    assert removed == ["train_step_7.tmp", "train_step_9"]
    assert steps_on_disk(store) == ["notes", "train_step_2", "train_step_4"]
    assert store.read_bytes(f"{ROOT}/notes/todo.txt") == b"the user's own file"
    assert store.read_bytes(TRACKER).strip() == b"4"
    for step in (2, 4):
        assert verify_directory(store, f"{ROOT}/train_step_{step}", full=True).ok
    r = run_cli("gc", "--checkpoint-path", "exp/typo", "--store", durable_store_url)
    assert r.returncode == 3 and "no such checkpoint tree" in r.stderr, r.stderr


def test_registry_indexes_loongsage_saves_and_their_retention(store: Store,
                                                             db_url: str) -> None:
    from registry.api import Registry
    with Registry(store, db=db_url) as reg:
        c = reg.loongsage_checkpointer(ROOT, save_freq=2, total_steps=8, keep=2,
                                       run_id="loong-run")
        # Saves steps 2, 4, 6, 8; retention runs before each save and keeps 2,
        # so step 2 is deleted before step 8 is written.
        run(c, range(1, 9))
        rows = reg.checkpoints("loong-run")
        assert not reg.index_errors
    assert steps_on_disk(store) == ["train_step_4", "train_step_6", "train_step_8"]
    assert [r["step"] for r in rows] == [4, 6, 8]
    for r in rows:
        m = read_manifest(store, f"{ROOT}/train_step_{r['step']}")
        assert r["manifest_sha256"] == m.digest and r["bytes"] == m.total_size
        assert r["uri"] == store.url_of(f"{ROOT}/train_step_{r['step']}")

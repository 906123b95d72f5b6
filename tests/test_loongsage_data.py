"""Issue 18 items 4 and 6: LoongSage ``data_source/global_dataset_state_dict_ds<i>.pt``
(torch.save, with the unconsumed prompt buffer), the fully_async pipeline
buffer, torch as an optional import, the seed's defaults (``save_freq`` -1,
``checkpoint_path`` required) and the fsync of every sub-folder before the
commit marker."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from registry.checkpoint.loongsage import (
    PIPELINE,
    DataSourceFreshWarning,
    LoongSageCheckpointer,
    data_file,
    load_training_state,
)
from registry.checkpoint.loongsage_rollout import RolloutData
from registry.errors import CheckpointError, DocumentError, TorchUnavailableError, UsageError
from registry.protocol.manifest import MANIFEST, FileEntry, Manifest, parse_manifest
from registry.store import Store, open_store
from registry.protocol.verify import verify_directory
from tests.support.fsync_spy import record_fsyncs
from tests.support.loongsage_child import save_kwargs
from tests.test_loongsage import hf_dir

ROOT = "exp/data"
REPO = Path(__file__).resolve().parent.parent


def mem() -> Store:
    return open_store(f"memory://lsd-{uuid.uuid4().hex[:12]}")


def save(store: Store, step: int = 2, *, pipeline: list[Any] | None = None,
         **kw: Any) -> LoongSageCheckpointer:
    c = LoongSageCheckpointer(store, ROOT, save_freq=step, total_steps=step, async_save=False,
                              snapshot_pipeline_buf=(lambda: pipeline)
                              if pipeline is not None else None)
    args = save_kwargs(step)
    args.update(kw)
    c.maybe_save(step, **args)
    c.finish()
    return c


def pt(store: Store, key: str) -> Any:
    return torch.load(io.BytesIO(store.read_bytes(key)), weights_only=True)


def test_data_source_files_are_pt_with_the_prompt_buffer_matched_by_path(
        store: Store, tmp_path: Path) -> None:
    sources = [{"prompt_data_path": "a.jsonl", "state": {"cursor": 7, "epoch": 1},
                "prompt_buffer": [{"id": 5, "text": "five"}, {"id": 6, "text": "six"}]},
               {"prompt_data_path": "b.jsonl", "state": {"cursor": torch.tensor([1, 2])}}]
    save(store, data_sources=sources, pipeline=[{"prompt": 3, "tokens": torch.arange(4)}])
    step = f"{ROOT}/train_step_2"
    names = sorted(store.walk_files(f"{step}/data_source"))
    assert names == ["global_dataset_state_dict_ds0.pt", "global_dataset_state_dict_ds1.pt",
                     "pipeline_buf.pt"]
    assert data_file(1) == "data_source/global_dataset_state_dict_ds1.pt"
    doc = pt(store, f"{step}/{data_file(0)}")
    assert doc == {"ds_idx": 0, "prompt_data_path": "a.jsonl",
                   "state": {"cursor": 7, "epoch": 1},
                   "prompt_buffer": [{"id": 5, "text": "five"}, {"id": 6, "text": "six"}]}
    assert verify_directory(store, step, full=True).ok  # listed in the manifest
    # Resume with the sources reordered and one new: matched by prompt_data_path.
    with pytest.warns(DataSourceFreshWarning, match="new.jsonl"):
        st = load_training_state(store, ROOT, hf_model_path=hf_dir(tmp_path),
                                 data_sources=["new.jsonl", "b.jsonl", "a.jsonl"])
    new, b, a = st.data_sources
    assert new.fresh and new.prompt_buffer == ()
    assert (a.saved_index, a.state, a.prompt_buffer) == (
        0, {"cursor": 7, "epoch": 1}, ({"id": 5, "text": "five"}, {"id": 6, "text": "six"}))
    assert b.saved_index == 1 and torch.equal(b.state["cursor"], torch.tensor([1, 2]))
    assert b.prompt_buffer == ()
    assert st.pipeline_buf is not None and len(st.pipeline_buf) == 1
    assert st.pipeline_buf[0]["prompt"] == 3
    assert torch.equal(st.pipeline_buf[0]["tokens"], torch.arange(4))


def test_pipeline_snapshot_is_taken_when_the_save_is_called() -> None:
    """An async save serializes the pipeline buffer at maybe_save, not when the
    background write runs: items the loop adds afterwards are not in it."""
    store = mem()
    buf = [1, 2]
    c = LoongSageCheckpointer(store, ROOT, save_freq=2, total_steps=2, async_save=True,
                              snapshot_pipeline_buf=lambda: buf)
    c.maybe_save(2, **save_kwargs(2))
    buf.append(3)
    c.finish()
    assert pt(store, f"{ROOT}/train_step_2/{PIPELINE}") == {"items": [1, 2]}


def test_no_snapshot_callback_no_pipeline_file(tmp_path: Path) -> None:
    store = mem()
    save(store)
    assert not store.exists(f"{ROOT}/train_step_2/{PIPELINE}")
    st = load_training_state(store, ROOT, hf_model_path=hf_dir(tmp_path),
                             data_sources=["data/a.jsonl"])
    assert st.pipeline_buf is None and st.data_state("data/a.jsonl") == {"offset": 2}


@pytest.mark.parametrize(("kw", "needle"), [
    ({"data_sources": [{"prompt_data_path": "a", "state": np.arange(3)}]},
     "global_dataset_state_dict_ds0.pt: cannot be saved"),
    ({"data_sources": [{"prompt_data_path": "a", "prompt_buffer": "not a list"}]},
     "prompt_buffer must be a list"),
    ({"data_sources": [{"prompt_data_path": "a"}, {"prompt_data_path": "a"}]}, "given twice"),
    ({"pipeline": {"not": "a list"}}, "snapshot_pipeline_buf() must return a list"),
    ({"pipeline": [object()]}, "pipeline_buf.pt: cannot be saved"),
])
def test_unsaveable_data_state_writes_nothing(kw: dict[str, Any], needle: str) -> None:
    store = mem()
    with pytest.raises(CheckpointError) as e:
        save(store, **kw)
    assert needle in str(e.value)
    assert not store.walk_files(f"{ROOT}/train_step_2")


def test_a_damaged_pt_file_is_a_clear_error(tmp_path: Path) -> None:
    store = mem()
    save(store)
    # Rewrite the state file and its manifest entry consistently: what is
    # left to catch is the content itself (not loadable with weights_only).
    step = f"{ROOT}/train_step_2"
    key = f"{step}/{data_file(0)}"
    store.write_bytes(key, b"not a pickle")
    m = parse_manifest(store.read_bytes(f"{step}/{MANIFEST}"), source="m")
    files = [e if e.path != data_file(0) else
             FileEntry(e.path, 12, hashlib.sha256(b"not a pickle").hexdigest()) for e in m.files]
    store.delete(f"{step}/{MANIFEST}")
    store.write_bytes(f"{step}/{MANIFEST}", Manifest.build("checkpoint", files,
                                                           **m.meta).to_bytes())
    with pytest.raises(DocumentError, match="global_dataset_state_dict_ds0.pt: not a .pt file"):
        load_training_state(store, ROOT, hf_model_path=hf_dir(tmp_path),
                            data_sources=["data/a.jsonl"])


# -- torch stays optional -------------------------------------------------------------


def test_importing_the_registry_does_not_import_torch() -> None:
    code = ("import sys, registry, registry.api, registry.cli, registry.checkpoint.loongsage, "
            "registry.checkpoint.loongsage_rollout, registry.checkpoint.loongsage_refs; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, check=True).stdout
    assert out.strip() == "[]"


def test_without_torch_pt_files_are_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    store = mem()
    save(store)  # with torch: data_source/*.pt
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.raises(TorchUnavailableError, match=r"pip install 'modeldir-registry\[torch\]'"):
        load_training_state(store, ROOT, hf_model_path=hf_dir(tmp_path),
                            data_sources=["data/a.jsonl"])
    other = mem()
    with pytest.raises(TorchUnavailableError, match="global_dataset_state_dict_ds0.pt"):
        save(other)
    # dist_ckpt is torch DCP (one format for 1 rank and N): refused up front too
    with pytest.raises(TorchUnavailableError, match=r"dist_ckpt.*modeldir-registry\[torch\]"):
        save(other, data_sources=[])
    assert other.walk_files(ROOT) == {}  # refused before anything was written
    # An HF export needs no torch: the core keeps working.
    c = LoongSageCheckpointer(other, ROOT, save_freq=2, total_steps=2, async_save=False,
                              save_checkpoint=False, save_hf=True, hf_config="{}")
    c.maybe_save(2, model=save_kwargs(2)["model"])
    c.finish()
    assert verify_directory(other, f"{ROOT}/train_step_2", full=True).ok
    with pytest.raises(TorchUnavailableError, match=r"modeldir-registry\[torch\]"):
        RolloutData("r", store=other).write(1, [1])


# -- the seed's table (issue 18 item 6) -------------------------------------------------


def test_save_freq_defaults_to_minus_one_and_checkpoint_path_is_required() -> None:
    store = mem()
    c = LoongSageCheckpointer(store, ROOT, total_steps=5, async_save=False)
    assert c.save_freq == -1
    assert [s for s in range(1, 6) if c.should_save(s)] == []  # "<= 0 means no saving"
    c.finish()
    with pytest.raises(TypeError, match="checkpoint_path"):
        LoongSageCheckpointer(store, total_steps=5)  # type: ignore[call-arg]
    with pytest.raises(UsageError, match="checkpoint_path is required"):
        LoongSageCheckpointer(store, None, total_steps=5)


# -- durability (issue 18 item 6) -------------------------------------------------------


def test_every_sub_folder_is_fsynced_before_the_commit_marker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(str(tmp_path / "store"))
    events = record_fsyncs(monkeypatch)
    c = LoongSageCheckpointer(store, ROOT, save_freq=2, total_steps=2, async_save=False,
                              save_hf=True,
                              hf_config={"hidden_size": 64},
                              snapshot_pipeline_buf=lambda: [1])
    c.maybe_save(2, **save_kwargs(2))
    c.finish()
    at = next(i for i, (what, p) in enumerate(events)
              if what == "open" and p.endswith("/MANIFEST.json"))
    staging = os.path.dirname(events[at][1])
    synced = {os.path.relpath(p, staging) for what, p in events[:at] if what == "fsync-dir"}
    assert {"dist_ckpt", "hf_model", "data_source"} <= synced
    # Rollout data: the .pt file's folder entry is durable before its marker.
    events.clear()
    RolloutData("rollout_data", store=store).write(3, {"x": torch.ones(2)})
    at = next(i for i, (what, p) in enumerate(events)
              if what == "open" and p.endswith("step_3.MANIFEST.json"))
    assert ("fsync-dir", os.path.realpath(tmp_path / "store/rollout_data")) in events[:at]
    assert any(p.endswith("step_3.pt") for what, p in events[:at] if what == "open")

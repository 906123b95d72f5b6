"""A store writer (bucket rights, no key) plants code-running pickles in a
distributed checkpoint and rewrites its MANIFEST.json to match: no reader of
the step may run them (issue 30, item 1)."""

from __future__ import annotations

import io
import json
import os
import pickle
import warnings
from pathlib import Path

import pytest

from registry.store import Store
from tests.ckpt_util import plant

torch = pytest.importorskip("torch") if os.environ.get("REGISTRY_REQUIRE_ENGINES") != "1" \
    else __import__("torch")

STEP = "exp/train_step_1"


class Payload:
    """Unpickling this runs code: it writes ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def _save(store: Store) -> dict[str, object]:
    from registry.checkpoint.loongsage_dcp import DistLoongSageCheckpointer

    g = torch.Generator().manual_seed(0)
    model = {"w": torch.randn(8, 4, generator=g)}
    opt = {"w.exp_avg": torch.zeros(8, 4), "w.exp_avg_sq": torch.zeros(8, 4)}
    with DistLoongSageCheckpointer(store, "exp", save_freq=1, total_steps=1,
                                   async_save=False) as ckpt:
        ckpt.maybe_save(1, model=model, optimizer_state=opt)
    return model


def _hf(tmp_path: Path, model: dict[str, object]) -> Path:
    from registry.formats.safetensors_io import write_safetensors

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "toy"}))
    with (hf / "model.safetensors").open("wb") as f:
        write_safetensors(f, {k: v.numpy() for k, v in model.items()},  # type: ignore[attr-defined]
                          metadata={"format": "pt"})
    return hf


def _readers(store: Store, hf: Path, model: dict[str, object]) -> dict[str, object]:
    from registry.checkpoint.loongsage import load_dist_ckpt
    from registry.checkpoint.loongsage_dcp import resume_dist

    into = {k: torch.zeros_like(v) for k, v in model.items()}  # type: ignore[arg-type]
    return {
        "resume_dist": lambda: resume_dist(store, "exp", model=into, hf_model_path=hf),
        "load_dist_ckpt": lambda: load_dist_ckpt(store, f"{STEP}/dist_ckpt"),
    }


@pytest.mark.parametrize("reader", ["resume_dist", "load_dist_ckpt"])
def test_a_code_running_metadata_pickle_is_refused_unrun(store: Store, tmp_path: Path,
                                                         reader: str) -> None:
    from registry.checkpoint.dcp_safe import UnsafeCheckpointError

    model = _save(store)
    hf = _hf(tmp_path, model)
    marker = tmp_path / "payload-ran"
    plant(store, STEP, {"dist_ckpt/.metadata": pickle.dumps(Payload(marker))})
    with pytest.raises(UnsafeCheckpointError) as e:
        _readers(store, hf, model)[reader]()  # type: ignore[operator]
    assert not marker.exists()
    assert "dist_ckpt/.metadata" in str(e.value) and "builtins.exec" in str(e.value)
    assert e.value.found == "builtins.exec"


@pytest.mark.parametrize("reader", ["resume_dist", "load_dist_ckpt"])
def test_a_code_running_byte_entry_is_refused_unrun(store: Store, tmp_path: Path,
                                                    reader: str) -> None:
    """Valid metadata, but the ``common`` entry of the shard is a torch.save of
    a code-running object (DCP's own planner loads it with weights_only=False)."""
    import torch.distributed.checkpoint as dcp

    from registry.checkpoint.dcp_safe import UnsafeCheckpointError

    model = _save(store)
    hf = _hf(tmp_path, model)
    marker = tmp_path / "payload-ran"
    forged = tmp_path / "forged"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model.w": model["w"], "common": Payload(marker), "rng.rank0": b"[]"},
                 checkpoint_id=str(forged), no_dist=True)
    plant(store, STEP, {f"dist_ckpt/{p.name}": p.read_bytes() for p in forged.iterdir()})
    with pytest.raises(UnsafeCheckpointError, match="builtins.exec"):
        _readers(store, hf, model)[reader]()  # type: ignore[operator]
    assert not marker.exists()


def test_metadata_over_the_cap_is_refused_before_unpickling(tmp_path: Path) -> None:
    from registry.checkpoint.dcp_safe import UnsafeCheckpointError, load_metadata

    with pytest.raises(UnsafeCheckpointError, match="cap"):
        load_metadata(io.BytesIO(b"x" * 101), path="m/.metadata", limit=100)


def test_genuine_checkpoints_still_load(store: Store, tmp_path: Path) -> None:
    model = _save(store)
    hf = _hf(tmp_path, model)
    readers = _readers(store, hf, model)
    st = readers["resume_dist"]()  # type: ignore[operator]
    assert st.step == 1  # type: ignore[attr-defined]
    dc = readers["load_dist_ckpt"]()  # type: ignore[operator]
    assert (dc.model["w"] == model["w"].numpy()).all()  # type: ignore[attr-defined,union-attr]

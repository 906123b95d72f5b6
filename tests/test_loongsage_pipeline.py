"""Issue 18 item 4: a fully_async LoongSage job SIGKILLed mid-run and resumed
loses and repeats no item (seed 003 4.3: ``snapshot_pipeline_buf()``), on
local disk and S3. The job is tests/support/loongsage_pipeline_child.py: its
model counts how often each prompt id was trained on, so after the resumed
run finishes every count must be exactly 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

from registry.checkpoint.loongsage import load_training_state
from registry.store import open_store
from tests.support.loongsage_pipeline_child import N, SOURCE, TOTAL_STEPS
from tests.support.forkclient import python_popen

CHILD = Path(__file__).resolve().parent / "support" / "loongsage_pipeline_child.py"
REPO = Path(__file__).resolve().parent.parent
ROOT = "exp/async"


def _hf(tmp_path: Path) -> Path:
    d = tmp_path / "hf"
    d.mkdir(exist_ok=True)
    safetensors.numpy.save_file({"counts": np.zeros(N, np.float32)}, str(d / "model.safetensors"),
                                metadata={"format": "pt"})
    (d / "config.json").write_text('{"hidden_size": 1}')
    return d


def _child(url: str, hf: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return python_popen([sys.executable, str(CHILD), url, ROOT, str(hf), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _kill_after(url: str, hf: Path, step: int, *extra: str) -> None:
    """Run the job and SIGKILL it right after it printed ``STEP <step>``
    (the async save of that step may be in flight)."""
    p = _child(url, hf, *extra)
    assert p.stdout is not None
    for line in p.stdout:
        if line.strip() == f"STEP {step}":
            os.kill(p.pid, signal.SIGKILL)
            break
    else:
        err = p.stderr.read() if p.stderr else ""
        pytest.fail(f"job ended before step {step}: exit {p.wait()} {err[-2000:]}")
    p.communicate(timeout=120)
    assert p.returncode == -signal.SIGKILL


def _resume(url: str, hf: Path, *extra: str) -> int:
    p = _child(url, hf, *extra)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0 and "DONE" in out, err[-3000:]
    return int(out.split("RESUMED ", 1)[1].split()[0])


@pytest.mark.parametrize("kill_after", [4, 7])
def test_fully_async_kill_loses_and_repeats_no_item(durable_store_url: str, tmp_path: Path,
                                                     kill_after: int) -> None:
    hf = _hf(tmp_path)
    _kill_after(durable_store_url, hf, kill_after)
    resumed_from = _resume(durable_store_url, hf)
    assert 2 <= resumed_from <= kill_after  # step 2's save had landed before the kill
    st = load_training_state(durable_store_url, ROOT, hf_model_path=hf, data_sources=[SOURCE])
    assert st.step == TOTAL_STEPS
    counts = st.model["counts"]
    assert not np.flatnonzero(counts == 0).size, f"lost: {np.flatnonzero(counts == 0)}"
    assert not np.flatnonzero(counts > 1).size, f"repeated: {np.flatnonzero(counts > 1)}"
    assert st.data_state(SOURCE) == {"cursor": N}
    assert st.data_sources[0].prompt_buffer == () and st.pipeline_buf == ()
    store = open_store(durable_store_url)
    assert store.exists(f"{ROOT}/train_step_{TOTAL_STEPS}/data_source/pipeline_buf.pt")


def test_without_the_pipeline_snapshot_the_kill_loses_items(tmp_path: Path) -> None:
    """The control: the same job saving no pipeline snapshot loses the items
    that were in flight at the resumed step, so the test above can fail."""
    url = str(tmp_path / "store")
    hf = _hf(tmp_path)
    _kill_after(url, hf, 5, "--no-pipeline")
    _resume(url, hf, "--no-pipeline")
    st = load_training_state(url, ROOT, hf_model_path=hf, data_sources=[SOURCE])
    assert st.step == TOTAL_STEPS and st.pipeline_buf is None
    assert (st.model["counts"] == 0).any()

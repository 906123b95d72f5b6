"""The example trainer and the model it ships (issue 14, items 6, 8, 10).

* ``--resume <step dir>`` loads the directory given: a step of another run
  (of another spec here) is refused naming *that* directory, not silently
  replaced by this run's step of the same name; a step directory that does
  not exist is a clear error (exit 2 from the CLI, no traceback).
* A linear head can be attached to a release of the example model: its
  config says ``d_embed``, which the hidden-size lookup knows (as it knows
  the Hugging Face keys, one test per key, nested ``text_config`` too).
* ``git_sha`` in trainer_state.json is the commit of the git work tree the
  trainer runs in, null outside one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from registry.errors import CheckpointError, DocumentError
from registry.examples.tinytrainer import TrainerError, train
from registry.formats.modeldir import HIDDEN_KEYS, hidden_size
from registry.release import ModelRelease
from registry.store import open_store
from tests.release_util import head, ledger_row, summary
from tests.support.forkclient import python_run


def run_trainer(url: str, run_id: str, steps: int, **kw: object) -> dict:
    return train(url, run_id, steps, ckpt_every=10, keep_ckpts=0, batch_size=8, **kw)


def test_resume_from_a_step_of_another_run_loads_that_directory(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    run_trainer(url, "a", 20)
    run_trainer(url, "b", 20, seed=1)  # another spec (seed): its checkpoints differ
    other = f"{url}/runs/b/ckpt/step-000010"
    with pytest.raises(TrainerError) as e:  # before: run a's own step-000010 was loaded
        run_trainer(url, "a", 20, resume=other)
    assert "runs/b/ckpt/step-000010" in str(e.value) and "spec" in str(e.value)

    with pytest.raises(CheckpointError, match="no such step directory"):
        run_trainer(url, "a", 20, resume=str(tmp_path / "elsewhere/runs/x/ckpt/step-000010"))
    p = python_run([sys.executable, "-m", "registry.examples.tinytrainer", "--store", url,
                        "--run-id", "a", "--steps", "20", "--ckpt-every", "10", "--resume",
                        str(tmp_path / "elsewhere/runs/x/ckpt/step-000010")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and "no such step directory" in p.stderr

    r = run_trainer(url, "a", 20, resume=f"{url}/runs/a/ckpt/step-000010")
    assert r["resumed_from"] == 10


def test_git_sha_is_recorded_inside_a_work_tree(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "train.py").write_text("# the training code\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "code"], check=True)
    sha = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=True).stdout.strip()
    url = str(tmp_path / "store")
    monkeypatch.chdir(repo)
    r = run_trainer(url, "in-git", 10)
    assert r["trainer_state"]["git_sha"] == sha
    store = open_store(url)
    saved = json.loads(store.read_bytes("runs/in-git/ckpt/step-000010/trainer_state.json"))
    assert saved["git_sha"] == sha
    outside = tmp_path / "plain"
    outside.mkdir()
    monkeypatch.chdir(outside)
    assert run_trainer(url, "no-git", 10)["trainer_state"]["git_sha"] is None


def test_a_head_attaches_to_the_example_model(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    run_trainer(url, "r", 10)
    config = json.loads(open_store(url).read_bytes("runs/r/ckpt/step-000010/config.json"))
    assert "hidden_size" not in config and hidden_size(config) == config["d_embed"]
    r = ModelRelease(url).create("r", 10, "tiny", "1", ledger=[ledger_row()],
                                 eval_summary=summary(), heads=[head(input_dim=config["d_embed"])])
    assert r.manifest.entry("heads/sentiment.json") is not None
    with pytest.raises(DocumentError, match="input_dim"):
        ModelRelease(url).create("r", 10, "tiny", "2", ledger=[ledger_row()],
                                 eval_summary=summary(),
                                 heads=[head(input_dim=config["d_hidden"])])


@pytest.mark.parametrize("key", HIDDEN_KEYS)
def test_hidden_size_key(key: str) -> None:
    assert hidden_size({key: 384, "vocab_size": 30522}) == 384


@pytest.mark.parametrize(("config", "size"), [
    ({"dim": 768, "hidden_dim": 3072}, 768),           # DistilBERT: dim, not the FFN width
    ({"d_embed": 24, "d_hidden": 192}, 24),            # the example trainer
    ({"text_config": {"hidden_size": 4096}, "vision_config": {"hidden_size": 1024}}, 4096),
    ({"hidden_size": True}, None), ({"hidden_size": 0}, None), ({}, None),
])
def test_hidden_size_edge_cases(config: dict, size: int | None) -> None:
    assert hidden_size(config) == size

"""LoongSage on N ranks (issue 27; seed 003 sections 3, 4.3, 4.4): dp_reshardable
resumed at other DP sizes, RNG restored where the topology allows, key
mismatches on a DCP resume, a brand-new run on a store folder that does not
exist yet. Real CPU ranks (gloo) through tests/support/dcp_child.py.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from registry.store import Store, join, open_store
from tests.test_loongsage_dcp import committed, job, lines, step_state, tracker

torch = pytest.importorskip("torch")

SHAPES = {"col.weight": (10, 6), "col.bias": (10,), "row.weight": (6, 10), "norm.weight": (6,)}
MP = "optimizer.dp_bucket.tp0_pp0_ep0"


def saved_full(store: Store, step: int, dp: int) -> dict[str, np.ndarray]:
    """The step's model and AdamW state in full shapes, assembled from the
    DP ranks' saved pieces (what a dump of the job that saved it holds)."""
    saved = step_state(store, step)
    out = {f"model.{k}": saved[f"model.{k}"] for k in SHAPES}
    for k, shape in SHAPES.items():
        for f in ("exp_avg", "exp_avg_sq"):
            pieces = [saved[f"{MP}.dp{d}.{k}.{f}"] for d in range(dp)]
            out[f"optimizer.state.{k}.{f}"] = np.concatenate(pieces).reshape(shape)
    out["optimizer.state.step"] = saved[f"{MP}.scalar.step"]
    assert not any(f"{MP}.dp{dp}." in key for key in saved)  # exactly dp pieces
    return out


def same(saved: dict[str, np.ndarray], dumped: dict[str, object]) -> None:
    assert set(dumped) == set(saved), sorted(set(dumped) ^ set(saved))
    for key, value in saved.items():
        np.testing.assert_array_equal(dumped[key].numpy(), value, err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("url_kind", ["local", "s3"])
def test_dp_reshardable_resumes_at_other_dp_sizes_exactly(
        url_kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """2 -> 3 -> 1 -> 2 data parallel ranks, on local disk and S3: each resume
    holds every element of the saved model and AdamW state (the DP pieces
    re-cut at the new DP size); RNG is restored by the ranks whose DP position
    was saved and skipped, with the seed's warning, on the new ones."""
    from tests.conftest import make_store_url

    url = make_store_url(url_kind, request, tmp_path)
    hf = tmp_path / "hf"
    store = open_store(url)
    args = ["--dp", "--sharding", "dp_reshardable", "--sync"]
    p = job(url, hf, 2, "--steps", "2", *args)
    assert p.returncode == 0, p.stdout + p.stderr
    for world, prev_dp, step in ((3, 2, 2), (1, 3, 3), (2, 1, 4)):
        want = saved_full(store, step, prev_dp)
        dump = tmp_path / f"resumed{world}.pt"
        p = job(url, hf, world, "--steps", str(step + 1), "--dump-resumed", str(dump), *args)
        assert p.returncode == 0, p.stdout + p.stderr
        restored = [r < prev_dp for r in range(world)]
        assert lines(p, "RESUMED") == [f"RANK {r} RESUMED checkpoint {step} {restored[r]}"
                                       for r in range(world)]
        skipped = world - min(world, prev_dp)
        assert p.stderr.count("RngSkippedWarning") == skipped, p.stderr
        if skipped:
            assert f"no RNG state was saved for DP rank {prev_dp}" in p.stderr
        same(want, torch.load(dump))
        assert tracker(store) == step + 1
    saved = step_state(store, 5)
    assert f"{MP}.dp1.col.weight.exp_avg" in saved and f"{MP}.dp2.col.weight.exp_avg" not in saved
    rng = [json.loads(saved[f"rng.rank{r}"]) for r in range(2)]
    assert rng[0] != rng[1]  # one RNG state per rank


@pytest.mark.slow
@pytest.mark.parametrize("url_kind", ["local", "s3"])
def test_dp_reshardable_refuses_a_tp_change_and_key_mismatches(
        url_kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """On local disk and S3: a TP change of dp_reshardable state is refused
    naming the seed's rule and fully_reshardable; a template entry the
    checkpoint lacks, a shape that differs (DCP's BaseException under a
    process group) and a checkpoint entry the templates lack are
    CheckpointErrors on every rank, never a traceback; partial=True loads
    without the lacking entry."""
    from tests.conftest import make_store_url

    url = make_store_url(url_kind, request, tmp_path)
    hf = tmp_path / "hf"
    p = job(url, hf, 2, "--steps", "1", "--sharding", "dp_reshardable", "--sync")
    assert p.returncode == 0, p.stdout + p.stderr
    p = job(url, hf, 3, "--steps", "2", "--sharding", "dp_reshardable", "--sync")
    assert p.returncode == 1
    refused = [line for line in p.stdout.splitlines() if "ERROR CheckpointError" in line]
    assert len(refused) == 3, p.stdout + p.stderr
    assert "Traceback" not in p.stdout
    for needle in ("reshardable along the DP dimension only", "seed 003 section 4.4",
                   "TP 2 -> 3", "fully_reshardable"):
        assert needle in refused[0], refused[0]
    assert tracker(open_store(url)) == 1 and not committed(open_store(url), 2)
    for tweak, needle in (("extra", "'model.extra.weight' is not in the checkpoint"),
                          ("shape", "DCP could not load it"),
                          ("lack", "model parameter 'norm.weight'")):
        p = job(url, hf, 2, "--steps", "2", "--sharding", "dp_reshardable", "--template", tweak)
        assert p.returncode == 1, p.stdout + p.stderr
        errors = [line for line in p.stdout.splitlines() if " ERROR " in line]
        assert len(errors) == 2 and all("ERROR CheckpointError" in e for e in errors), p.stdout
        assert needle in errors[0], errors[0]
        assert "Traceback" not in p.stdout + p.stderr and "CheckpointException" not in p.stdout
    p = job(url, hf, 2, "--steps", "2", "--sharding", "dp_reshardable",
            "--template", "lack-partial")
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines(p, "LOADED") == ["RANK 0 LOADED 1", "RANK 1 LOADED 1"]


# -- in one process ------------------------------------------------------------------


def _hf(tmp_path: Path) -> Path:
    from tests.support.dcp_child import write_hf

    hf = tmp_path / "hf"
    write_hf(str(hf))
    return hf


def test_a_fresh_run_on_a_store_folder_that_does_not_exist_takes_the_hf_path(
        tmp_path: Path) -> None:
    from registry.checkpoint.loongsage import load_training_state
    from registry.checkpoint.loongsage_dcp import resume_dist
    from tests.support.dcp_child import initial

    hf = _hf(tmp_path)
    url = str(tmp_path / "not" / "yet")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st = load_training_state(url, "exp", hf_model_path=str(hf))
        w = torch.zeros(10, 6)
        dst = resume_dist(url, "exp", model={"col.weight": w}, hf_model_path=str(hf))
    assert (st.source, st.step, dst.source, dst.step) == ("hf", 0, "hf", 0)
    np.testing.assert_array_equal(st.model["col.weight"], initial()["col.weight"])
    np.testing.assert_array_equal(w.numpy(), initial()["col.weight"])
    assert not (tmp_path / "not").exists()  # a reader creates nothing


def test_one_process_resume_of_a_dcp_step_restores_rank0_rng(tmp_path: Path) -> None:
    """A DCP step read by one process: rng_restored is True only with the
    saved rank 0's RNG state in hand; a TP change skips it with the warning."""
    from registry.checkpoint.loongsage import RngSkippedWarning, load_training_state
    from registry.checkpoint.loongsage_dcp import DistLoongSageCheckpointer, resume_dist

    hf = _hf(tmp_path)
    url = str(tmp_path / "store")
    model = {"col.weight": torch.ones(10, 6)}
    opt = {"col.weight.exp_avg": torch.full((10, 6), 2.0), "step": torch.tensor(3.0)}
    ck = DistLoongSageCheckpointer(url, "exp", save_freq=1, total_steps=1, async_save=False)
    ck.maybe_save(1, model=model, optimizer_state=opt, rng_state={"seed": 7})
    ck.finish()
    st = load_training_state(url, "exp", hf_model_path=str(hf))
    assert (st.source, st.step, st.rng_restored, st.rng_state) == \
        ("checkpoint", 1, True, {"seed": 7})
    with pytest.warns(RngSkippedWarning, match="TP 1 -> 2"):
        st = load_training_state(url, "exp", hf_model_path=str(hf), topology={"tp": 2})
    assert (st.rng_restored, st.rng_state) == (False, None)
    w = torch.zeros(10, 6)
    o = {"col.weight.exp_avg": torch.zeros(10, 6), "step": torch.tensor(0.0)}
    dst = resume_dist(url, "exp", model={"col.weight": w}, optimizer_state=o,
                      hf_model_path=str(hf))
    assert (dst.rng_restored, dst.rng_state) == (True, {"seed": 7})
    assert torch.equal(w, model["col.weight"]) and torch.equal(o["col.weight.exp_avg"],
                                                             opt["col.weight.exp_avg"])
    assert float(o["step"]) == 3.0
    from registry.errors import CheckpointError
    with pytest.raises(CheckpointError, match="optimizer state 'step'"):
        resume_dist(url, "exp", model={"col.weight": torch.zeros(10, 6)},
                    optimizer_state={"col.weight.exp_avg": torch.zeros(10, 6)},
                    hf_model_path=str(hf))
    dst = resume_dist(url, "exp", model={"col.weight": torch.zeros(10, 6)},
                      optimizer_state={"col.weight.exp_avg": torch.zeros(10, 6)},
                      hf_model_path=str(hf), partial=True)
    assert dst.step == 1


# -- the HF export of N ranks (seed 003 section 4.3) ----------------------------------


def tiny_hf(path: Path) -> None:
    """A tiny GPT-2 saved by transformers (config.json, model.safetensors) and
    a tokenizers tokenizer.json."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=8, n_layer=1, n_head=2, vocab_size=16, n_positions=8)
    GPT2LMHeadModel(cfg).save_pretrained(path, safe_serialization=True)
    Tokenizer(WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]")).save(str(path / "tokenizer.json"))


@pytest.mark.slow
@pytest.mark.parametrize("url_kind", ["local", "s3"])
def test_save_hf_on_two_ranks_is_a_sharded_hf_model_equal_to_the_trained_params(
        url_kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """2 tensor-parallel ranks, save_checkpoint + save_hf, async: every step's
    hf_model/ is the index and one shard per rank, config and tokenizer from
    hf_model_path, loads in transformers and equals the trained parameters;
    the tracker moved as without save_hf. A rank SIGKILLed in its HF shard
    write leaves the step uncommitted and the tracker where it was."""
    from transformers import GPT2LMHeadModel

    from registry.protocol.manifest import MANIFEST
    from tests.conftest import make_store_url

    url = make_store_url(url_kind, request, tmp_path)
    hf = tmp_path / "hf"
    tiny_hf(hf)
    store = open_store(url)
    out = tmp_path / "out.pt"
    args = ["--shapes-from-hf", "--save-hf"]
    p = job(url, hf, 2, "--steps", "2", "--out", str(out), *args)
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines(p, "COMMITTED") == [f"RANK {r} COMMITTED {s}" for r in range(2) for s in (1, 2)]
    assert tracker(store) == 2
    step = join("exp", "train_step_2")
    names = sorted(store.walk_files(join(step, "hf_model")))
    assert names == ["config.json", "generation_config.json",
                     "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                     "model.safetensors.index.json", "tokenizer.json"]
    for name in ("config.json", "generation_config.json", "tokenizer.json"):
        assert store.read_bytes(join(step, "hf_model", name)) == (hf / name).read_bytes()
    doc = json.loads(store.read_bytes(join(step, "hf_model", "model.safetensors.index.json")))
    trained = {k[len("model."):]: v for k, v in torch.load(out).items() if k.startswith("model.")}
    assert set(doc["weight_map"]) == set(trained)
    assert doc["metadata"]["total_size"] == sum(v.numel() * 4 for v in trained.values())
    assert set(doc["weight_map"].values()) == {names[2], names[3]}
    local = tmp_path / "pulled"
    for name in names:
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(store.read_bytes(join(step, "hf_model", name)))
    loaded = GPT2LMHeadModel.from_pretrained(local).state_dict()
    for name, value in trained.items():
        assert torch.equal(loaded[name], value), name
    manifest = parse(store.read_bytes(join(step, MANIFEST)))
    assert {f"hf_model/{n}" for n in names} <= {e.path for e in manifest.files}

    p = job(url, hf, 2, "--steps", "3", "--sync", "--kill", "1:hfwrite:3", *args)
    assert p.returncode == 1 and "RANK 1 EXIT -9" in p.stdout, p.stdout + p.stderr
    assert "KILL rank 1 at hfwrite of step 3" in p.stderr
    assert tracker(store) == 2 and not committed(store, 3)
    assert not store.exists(join("exp", "train_step_3", MANIFEST))


def parse(data: bytes) -> object:
    from registry.protocol.manifest import parse_manifest

    return parse_manifest(data, source="t")


# -- one dist_ckpt format (DESIGN section 1) --------------------------------------------


def test_a_tree_of_an_earlier_version_still_loads_and_a_broken_one_is_refused(
        tmp_path: Path) -> None:
    """The single-process saver writes torch DCP now; a step an earlier version
    wrote (model/optimizer safetensors, scheduler.json, rng.json) still loads,
    and one missing a file is refused naming it."""
    from registry.checkpoint.layout import LOONGSAGE
    from registry.checkpoint.loongsage import load_training_state
    from registry.checkpoint.manager import write_safetensors_file
    from registry.checkpoint.tree import CheckpointTree
    from registry.protocol.commit import DirectoryWriter
    from registry.errors import CheckpointError

    hf = _hf(tmp_path)
    store = open_store(str(tmp_path / "store"))
    store.ensure_root()
    w_ = np.arange(6, dtype=np.float32).reshape(2, 3)
    opt = {"w.exp_avg": w_ + 1, "w.exp_avg_sq": w_ + 2}

    def legacy(step: int, skip: str = "") -> None:
        with DirectoryWriter(store, f"exp/train_step_{step}", kind="checkpoint",
                             meta={"run_id": "exp", "step": step, "layout": "loongsage"},
                             staging=f"exp/train_step_{step}.tmp-x") as w:
            files = {"scheduler.json": {"scheduler_state": {"lr": 0.5}},
                     "rng.json": {"step": step, "topology": {"tp": 1}, "rng_state": [1, 2]}}
            if skip != "model.safetensors":
                write_safetensors_file(w, "dist_ckpt/model.safetensors", {"w": w_},
                                       {"format": "pt"})
            write_safetensors_file(w, "dist_ckpt/optimizer.safetensors", opt,
                                   {"format": "tinyllm", "optimizer": "adamw",
                                    "step": str(step)})
            for name, doc in files.items():
                w.write_bytes(f"dist_ckpt/{name}", json.dumps(doc).encode())
            w.commit()
        CheckpointTree(store, "exp", LOONGSAGE).set_latest(step)

    legacy(1)
    st = load_training_state(store, "exp", hf_model_path=str(hf))
    assert (st.source, st.step, st.optimizer, st.scheduler_state) == \
        ("checkpoint", 1, "adamw", {"lr": 0.5})
    assert (st.rng_restored, st.rng_state) == (True, [1, 2])
    np.testing.assert_array_equal(st.model["w"], w_)
    np.testing.assert_array_equal(st.optimizer_state["w.exp_avg_sq"], w_ + 2)
    legacy(2, skip="model.safetensors")
    with pytest.raises(CheckpointError, match=r"dist_ckpt/model.safetensors: not in the "
                                              r"step's MANIFEST.json; an earlier version"):
        load_training_state(store, "exp", hf_model_path=str(hf))

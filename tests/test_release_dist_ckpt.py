"""`registry release create` from a LoongSage step (issue 27 items 2 and 7; seed 003
sections 2 and 4.3): from the HF export of a multi-rank save_hf, and from the
torch DCP shards of ``dist_ckpt/`` directly (consolidated, streaming, into
sharded HF safetensors), on local disk and S3, from the CLI and the API. The
releases load in transformers and equal the trained parameters. What cannot
be mapped to Hugging Face tensors is refused with one line and nothing
committed; the shards' bytes are checked against the step's manifest; the
peak resident memory of a release stays a fraction of the model's size.
"""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from registry.checkpoint.layout import LOONGSAGE
from registry.protocol.manifest import MANIFEST
from registry.store import Store, join, open_store
from tests.ckpt_util import plant
from tests.conftest import REPO, make_store_url, run_cli
from tests.release_util import ledger_row, summary
from tests.test_loongsage_dcp import job, lines

torch = pytest.importorskip("torch")

STEP = "exp/train_step_1"


def _docs(tmp_path: Path) -> list[str]:
    (tmp_path / "ledger.json").write_text(json.dumps([ledger_row()]))
    (tmp_path / "evals.json").write_text(json.dumps(summary()))
    return ["--ledger", str(tmp_path / "ledger.json"), "--evals", str(tmp_path / "evals.json")]


def _pull(store: Store, prefix: str, into: Path) -> list[str]:
    names = sorted(store.walk_files(prefix))
    for name in names:
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        (into / name).write_bytes(store.read_bytes(join(prefix, name), limit=1 << 30))
    return names


@pytest.mark.slow
@pytest.mark.parametrize("url_kind", ["local", "s3"])
def test_release_create_from_a_three_rank_step(url_kind: str, request: pytest.FixtureRequest,
                                               tmp_path: Path) -> None:
    """3 tensor-parallel ranks (uneven row chunks) save dist_ckpt + save_hf.
    Released from hf_model/ (the multi-rank export: --from auto), from
    dist_ckpt/ with the step's own config (CLI, --max-shard-size: several
    shards) and from dist_ckpt/ with hf_model_path (API, bf16): each loads in
    transformers and equals the trained parameters (bf16: their cast)."""
    from transformers import GPT2LMHeadModel

    from registry.api import Registry
    from tests.test_loongsage_ranks import tiny_hf

    url = make_store_url(url_kind, request, tmp_path)
    hf = tmp_path / "hf"
    tiny_hf(hf)
    out = tmp_path / "out.pt"
    p = job(url, hf, 3, "--steps", "1", "--sync", "--shapes-from-hf", "--save-hf",
            "--out", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines(p, "COMMITTED") == [f"RANK {r} COMMITTED 1" for r in range(3)]
    trained = {k[len("model."):]: v for k, v in torch.load(out).items()
               if k.startswith("model.")}
    store = open_store(url)
    docs = _docs(tmp_path)
    base = ["release", "create", "--layout", "loongsage", "--checkpoint-path", "exp",
            "--step", "1", "--model-id", "gpt", *docs, "--store", url]

    p = run_cli(*base, "--version", "hf", "--dtype", "f32")
    assert p.returncode == 0, p.stderr
    p = run_cli(*base, "--version", "dcp", "--from", "dist_ckpt", "--max-shard-size", "1KB")
    assert p.returncode == 0, p.stderr
    Registry(url).create_release(None, 1, "gpt", "bf16", ledger=[ledger_row()],
                                 eval_summary=summary(), layout=LOONGSAGE,
                                 checkpoint_root="exp", subdir="dist_ckpt",
                                 hf_model_path=str(hf), dtype="bf16")
    for version in ("hf", "dcp", "bf16"):
        local = tmp_path / "pulled" / version
        names = _pull(store, f"models/gpt/{version}", local)
        assert "config.json" in names and "tokenizer.json" in names, names
        assert (local / "config.json").read_bytes() != b""
        model = GPT2LMHeadModel.from_pretrained(local, torch_dtype="auto")
        loaded = model.state_dict()
        for name, value in trained.items():
            want = value.to(torch.bfloat16) if version == "bf16" else value
            assert loaded[name].dtype == want.dtype, (version, name)
            assert torch.equal(loaded[name], want), (version, name)
        if version == "dcp":
            index = json.loads((local / "model.safetensors.index.json").read_text())
            assert set(index["weight_map"]) == set(trained)
            assert len(set(index["weight_map"].values())) > 3
            assert index["metadata"]["total_size"] == sum(v.numel() * 4
                                                          for v in trained.values())
        manifest = json.loads(store.read_bytes(f"models/gpt/{version}/{MANIFEST}"))
        assert manifest["source"]["step"] == 1 and manifest["source"]["run_id"] == "exp"
    assert (store.read_bytes("models/gpt/bf16/tokenizer.json")
            == (hf / "tokenizer.json").read_bytes())


# -- one process: refusals and memory ---------------------------------------------


def _save(url: str, model: dict[str, torch.Tensor], *, save_hf: Path | None = None,
          root: str = "exp") -> None:
    from registry.checkpoint.loongsage import LoongSageCheckpointer

    cfg = json.loads((save_hf / "config.json").read_text()) if save_hf else None
    ck = LoongSageCheckpointer(url, root, save_freq=1, total_steps=1, async_save=False,
                               save_hf=save_hf is not None, hf_config=cfg)
    ck.maybe_save(1, model=model, optimizer="sgd",
                  optimizer_state={f"{k}.momentum_buffer": v for k, v in model.items()})
    ck.finish()


def _model(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(8, 4, generator=g), "b": torch.randn(8, generator=g)}


def _hf_dir(tmp_path: Path) -> Path:
    hf = tmp_path / "hfcfg"
    hf.mkdir(exist_ok=True)
    (hf / "config.json").write_text(json.dumps({"model_type": "toy", "hidden_size": 4}))
    return hf


def _release(url: str, tmp_path: Path, *extra: str, root: str = "exp",
             version: str = "1", part: str = "dist_ckpt") -> subprocess.CompletedProcess[str]:
    return run_cli("release", "create", "--layout", "loongsage", "--checkpoint-path", root,
                   "--step", "1", "--model-id", "toy", "--version", version, *_docs(tmp_path),
                   "--from", part, "--store", url, *extra)


def _one_line_nothing_committed(p: subprocess.CompletedProcess[str], code: int,
                                *needles: str, url: str) -> None:
    assert p.returncode == code, p.stdout + p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    for needle in needles:
        assert needle in p.stderr, p.stderr
    assert not open_store(url).exists("models/toy/1/MANIFEST.json")


@pytest.mark.parametrize("url_kind", ["local", "s3"])
def test_a_dist_ckpt_release_takes_config_from_hf_model_path_or_the_step(
        url_kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """One rank: without --hf-model-path and no hf_model/ in the step, one
    line (exit 2); with it, the release holds config.json from there and the
    model equal to the saved one; a step saved with save_hf too releases its
    dist_ckpt with the step's own config.json."""
    from registry.formats.weights import iter_tensors, load_weights

    url = make_store_url(url_kind, request, tmp_path)
    model = _model()
    _save(url, model)
    p = _release(url, tmp_path)
    _one_line_nothing_committed(p, 2, "--hf-model-path", "hf_model/config.json", url=url)
    hf = _hf_dir(tmp_path)
    p = _release(url, tmp_path, "--hf-model-path", str(hf), "--json", part="auto")
    assert p.returncode == 0, p.stderr  # auto: no hf_model/ in the step, so dist_ckpt
    store = open_store(url)
    assert _config(store, "models/toy/1") == json.loads((hf / "config.json").read_text())
    got = {n: a for _, n, a in iter_tensors(store, "models/toy/1",
                                            load_weights(store, "models/toy/1"))}
    assert got.keys() == model.keys()
    for name, value in model.items():
        np.testing.assert_array_equal(got[name], value.numpy())

    _save(url, model, save_hf=hf, root="exp2")
    p = _release(url, tmp_path, root="exp2", version="2")
    assert p.returncode == 0, p.stderr
    assert _config(store, "models/toy/2") == json.loads(
        store.read_bytes("exp2/train_step_1/hf_model/config.json"))


def test_from_and_hf_model_path_are_loongsage_options_and_need_torch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--from / --hf-model-path with --layout tinyllm, and an unknown --from,
    are one line, exit 2; without torch a dist_ckpt release is a
    TorchUnavailableError naming dist_ckpt and the extra, nothing committed."""
    from registry.errors import TorchUnavailableError
    from registry.release.model_release import ModelRelease

    url = str(tmp_path / "store")
    _save(url, _model())
    p = run_cli("release", "create", "--run", "r1", "--step", "1", "--model-id", "toy",
                "--version", "1", *_docs(tmp_path), "--from", "dist_ckpt", "--store", url)
    _one_line_nothing_committed(p, 2, "--from and --hf-model-path are for --layout loongsage",
                                url=url)
    p = _release(url, tmp_path, part="optimizer")
    _one_line_nothing_committed(p, 2, "--from 'optimizer'", "auto, hf_model, dist_ckpt", url=url)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.raises(TorchUnavailableError, match=r"dist_ckpt.*modeldir-registry\[torch\]"):
        ModelRelease(url).create(None, 1, "toy", "1", ledger=[ledger_row()],
                                 eval_summary=summary(), layout=LOONGSAGE,
                                 checkpoint_root="exp", hf_model_path=str(_hf_dir(tmp_path)))
    assert not open_store(url).exists("models/toy/1/MANIFEST.json")


def _config(store: Store, prefix: str) -> dict[str, object]:
    """The release's config.json less the dtype the release states (issue 26)."""
    doc = json.loads(store.read_bytes(f"{prefix}/config.json"))
    assert doc.pop("dtype") == "float32"
    doc.pop("torch_dtype", None)
    return doc


def _metadata(store: Store) -> object:
    return pickle.loads(store.read_bytes(f"{STEP}/dist_ckpt/.metadata"))  # the test's own file


def _tamper_metadata(store: Store, change: str) -> None:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    meta = _metadata(store)
    md = meta.state_dict_metadata["model.w"]
    if change == "gap":
        md.chunks[0] = ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([4, 4]))
    elif change == "overlap":
        md.chunks[:] = [ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([6, 4])),
                        ChunkStorageMetadata(torch.Size([4, 0]), torch.Size([4, 4]))]
    elif change == "outside":
        for key, info in meta.storage_data.items():
            if key.fqn == "model.w":
                info.relative_path = "../../elsewhere.distcp"
    elif change == "records":
        meta.storage_data = list(meta.storage_data.values())
    elif change == "malformed":
        md.size = [8, "4"]
    elif change == "norecord":
        meta.storage_data = {k: v for k, v in meta.storage_data.items() if k.fqn != "model.w"}
    elif change == "huge":
        info = meta.storage_data[MetadataIndex("model.w", [0, 0])]
        info.length = 10 << 20
    elif change == "vast":  # 4 TiB of float32 claimed over the step's few hundred bytes
        record = next(v for k, v in meta.storage_data.items() if k.fqn == "model.w")
        half = 1 << 19
        md.size = torch.Size([2 * half, 2 * half])
        md.chunks[:] = [ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([half, 2 * half])),
                        ChunkStorageMetadata(torch.Size([half, 0]), torch.Size([half, 2 * half]))]
        meta.storage_data = {k: v for k, v in meta.storage_data.items() if k.fqn != "model.w"}
        for c in md.chunks:
            meta.storage_data[MetadataIndex("model.w", c.offsets)] = record
    plant(store, STEP, {"dist_ckpt/.metadata": pickle.dumps(meta)})


@pytest.mark.parametrize("case,needle", [
    ("gap", "cover 16 of 32 elements"),
    ("overlap", "overlap"),
    ("outside", "not a dist_ckpt file of the step's MANIFEST.json"),
    ("huge", "bytes of tensor data"),
    ("vast", "more tensor data than"),
    ("records", "storage records are not mappings"),
    ("malformed", "not those of a DCP tensor record"),
    ("norecord", "no storage record"),
    ("foreign", "no model.<name> tensor"),
    ("bytes", "is not a tensor"),
    ("complex", "which safetensors cannot store"),
])
def test_what_cannot_be_mapped_is_one_line_and_nothing_is_committed(
        case: str, needle: str, tmp_path: Path) -> None:
    """A store writer's .metadata (re-manifested) whose chunks leave a gap,
    overlap, point outside the step or claim a huge record, whose records are
    not DCP's types or missing; a tree of another
    DCP program (adopted); a model. entry that is bytes; a dtype safetensors
    lacks: each one line naming .metadata and the rule, exit 7, no release."""
    import torch.distributed.checkpoint as dcp

    url = str(tmp_path / "store")
    store = open_store(url)
    if case in ("foreign", "bytes", "complex"):
        state: dict[str, object] = {"decoder.w": torch.zeros(2, 2)}
        if case == "bytes":
            state = {"model.w": torch.zeros(2, 2), "model.note": io.BytesIO(b"x")}
        if case == "complex":
            state = {"model.w": torch.zeros(2, 2, dtype=torch.complex64)}
        local = tmp_path / "plain"
        with pytest.warns(UserWarning, match="single process"):
            dcp.save(state, checkpoint_id=str(local / "train_step_1" / "dist_ckpt"),
                     no_dist=True)
        (local / "latest_checkpointed_iteration.txt").write_text("1\n")
        store.ensure_root()
        for path in local.rglob("*"):
            if path.is_file():
                store.write_bytes(join("exp", path.relative_to(local).as_posix()),
                                  path.read_bytes())
        assert run_cli("ckpt", "adopt", "exp", "--store", url).returncode == 0
    else:
        _save(url, _model())
        _tamper_metadata(store, case)
    p = _release(url, tmp_path, "--hf-model-path", str(_hf_dir(tmp_path)))
    _one_line_nothing_committed(p, 7, "dist_ckpt/.metadata", needle, url=url)


def test_shard_bytes_changed_after_the_verification_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A *.distcp file rewritten between the step's verification and the
    consolidation's reads (a store writer racing the release) is caught by
    the hash of the bytes read: IntegrityError naming the file, nothing
    committed."""
    from registry.errors import IntegrityError
    from registry.release import model_release
    from registry.release.model_release import ModelRelease

    url = str(tmp_path / "store")
    _save(url, _model())
    store = open_store(url)
    shard = next(n for n in store.walk_files(f"{STEP}/dist_ckpt") if n.endswith(".distcp"))
    key = f"{STEP}/dist_ckpt/{shard}"
    verified = model_release.require_verified

    def verify_then_race(*a: object, **k: object) -> object:
        m = verified(*a, **k)
        data = bytearray(store.read_bytes(key))
        data[-1] ^= 0xFF  # past every model tensor: only the file's hash can tell
        store.write_bytes(key, bytes(data))
        return m

    monkeypatch.setattr(model_release, "require_verified", verify_then_race)
    with pytest.raises(IntegrityError, match=shard):
        ModelRelease(url).create(None, 1, "toy", "1", ledger=[ledger_row()],
                                 eval_summary=summary(), layout=LOONGSAGE,
                                 checkpoint_root="exp", subdir="dist_ckpt",
                                 hf_model_path=str(_hf_dir(tmp_path)))
    assert not store.exists("models/toy/1/MANIFEST.json")


@pytest.mark.slow
def test_peak_memory_of_a_dist_ckpt_release_is_a_fraction_of_the_model(tmp_path: Path) -> None:
    """128 MiB of parameters (32 tensors of 4 MiB) released from dist_ckpt in
    a child process: its resident memory grows by less than a third of the
    model (one tensor assembled at a time, shards written as they fill; the
    figure is about 35 MiB here, whatever the number of tensors)."""
    url = str(tmp_path / "store")
    g = torch.Generator().manual_seed(1)
    model = {f"layer{i}.weight": torch.randn(1024, 1024, generator=g) for i in range(32)}
    _save(url, model)
    del model
    p = subprocess.run([sys.executable, str(REPO / "tests" / "support" / "release_rss_child.py"),
                        url, "exp", "1", str(_hf_dir(tmp_path))], capture_output=True,
                       text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    grown_mib = (got["peak"] - got["base"]) / 1024
    print(f"peak RSS growth {grown_mib:.1f} MiB for a 128 MiB model")
    assert grown_mib < 128 / 3, got
    assert got["files"] > 8  # 16 MB shards: several

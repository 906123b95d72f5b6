"""Releasing a checkpoint into shards, and what conversion checks (issue 26, item 2).

A checkpoint's single ``model.safetensors`` is released with ``release create
--dtype bf16 --max-shard-size`` (CLI) and ``--dtype int4`` (API), on local
disk and S3: the release holds transformers-named shards of at most the
limit and an index the weights rule accepts, every tensor equal to the
source's after the cast (int4: within half a quantization step), an int4
tensor's ``.qweight`` and ``.scales`` in one shard. A conversion of a sharded
directory whose shard bytes come back altered from S3 commits nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from registry.checkpoint import CheckpointManager
from registry.release import ModelRelease, dequantize_int4
from registry.store import open_store
from registry.formats.weights import INDEX, SINGLE, iter_tensors, load_weights
from tests.ckpt_util import save
from tests.conftest import run_cli
from tests.release_util import ledger_row, summary
from tests.support.faultproxy import Action, FaultProxy, Request
from tests.shard_util import tiny_llama, upload_dir

RNG = np.random.default_rng(26)
PARAMS = {f"layer{i}.weight": RNG.standard_normal((64, 64), dtype=np.float32)
          for i in range(6)} | {"norm.bias": RNG.standard_normal(64, dtype=np.float32)}


def _checkpoint(url: str) -> None:
    with CheckpointManager(open_store(url), "r1", keep_ckpts=0) as m:
        save(m, 10, params=PARAMS)


def _tensors(url: str, prefix: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    store = open_store(url)
    weights = load_weights(store, prefix)  # the release obeys the rule it enforces
    return ({n: a for _, n, a in iter_tensors(store, prefix, weights)},
            {n: s.path for n, (s, _) in weights.tensors.items()})


def test_release_create_into_shards(durable_store_url: str, tmp_path: Path) -> None:
    _checkpoint(durable_store_url)
    (tmp_path / "ledger.json").write_text(json.dumps([ledger_row()]))
    (tmp_path / "evals.json").write_text(json.dumps(summary()))
    p = run_cli("release", "create", "--run", "r1", "--step", "10", "--model-id", "tiny",
                "--version", "1", "--dtype", "bf16", "--max-shard-size", "20KB", "--ledger",
                str(tmp_path / "ledger.json"), "--evals", str(tmp_path / "evals.json"),
                "--store", durable_store_url)
    assert p.returncode == 0, p.stderr
    store = open_store(durable_store_url)
    files = store.walk_files("models/tiny/1")
    # 8 KiB per bf16 matrix: two fit in 20 KB, the bias joins the last shard
    shards = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert SINGLE not in files and INDEX in files and all(s in files for s in shards)
    tensors, where = _tensors(durable_store_url, "models/tiny/1")
    assert tensors.keys() == PARAMS.keys()
    for name, value in PARAMS.items():
        assert tensors[name].dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(tensors[name], value.astype(ml_dtypes.bfloat16))
    index = json.loads(store.read_bytes(f"models/tiny/1/{INDEX}"))
    assert index["weight_map"] == where
    assert index["metadata"]["total_size"] == sum(v.size * 2 for v in PARAMS.values())
    # a tinyllm config (the train spec) is carried verbatim: no engine reads a dtype there
    assert store.read_bytes("models/tiny/1/config.json") == store.read_bytes(
        "runs/r1/ckpt/step-000010/config.json")

    ModelRelease(durable_store_url).create(
        "r1", 10, "tiny", "2", dtype="int4", group_size=32, max_shard_size=3000,
        ledger=[ledger_row()], eval_summary=summary())
    tensors, where = _tensors(durable_store_url, "models/tiny/2")
    for name, value in PARAMS.items():
        if value.ndim == 1:
            np.testing.assert_array_equal(tensors[name], value)
            continue
        assert where[f"{name}.qweight"] == where[f"{name}.scales"]  # one shard
        back = dequantize_int4(tensors[f"{name}.qweight"], tensors[f"{name}.scales"], 32)
        step = tensors[f"{name}.scales"].repeat(32, axis=1)
        assert (np.abs(back - value) <= step / 2 + 1e-7).all()
    assert len(set(where.values())) == 6  # each pair (2560 B) alone; the bias joins the last


@pytest.mark.parametrize("size", ["5XB", "0", "-1GB", "GB"])
def test_bad_max_shard_size_is_one_line_exit_2(size: str, tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    _checkpoint(url)
    (tmp_path / "ledger.json").write_text(json.dumps([ledger_row()]))
    (tmp_path / "evals.json").write_text(json.dumps(summary()))
    p = run_cli("release", "create", "--run", "r1", "--step", "10", "--model-id", "tiny",
                "--version", "1", f"--max-shard-size={size}", "--ledger",
                str(tmp_path / "ledger.json"), "--evals", str(tmp_path / "evals.json"),
                "--store", url)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "shard size" in p.stderr, p.stderr
    assert open_store(url).walk_files("models") == {}


def _flip_shard_ranges(req: Request) -> Action | None:
    if (req.op == "GetObject" and "Range" in req.headers
            and req.key.endswith("model-00003-of-00005.safetensors")):
        return Action("corrupt")
    return None


def test_sharded_conversion_checks_every_shard(s3_bucket: str, proxy: FaultProxy,
                                               tmp_path: Path) -> None:
    """One shard's ranged reads come back altered: the conversion's hash of that
    shard differs from a streamed read of it; exit 1, nothing is committed."""
    pytest.importorskip("transformers")
    src = upload_dir(tiny_llama(tmp_path / "llama"), s3_bucket, "incoming")
    proxy.rules.append(_flip_shard_ranges)
    (tmp_path / "ledger.json").write_text(json.dumps([ledger_row()]))
    (tmp_path / "evals.json").write_text(json.dumps(summary()))
    url = f"s3://{s3_bucket}/reg"
    p = run_cli("publish", src, "--model-id", "llama", "--version", "1", "--dtype", "bf16",
                "--max-shard-size", "60KB", "--ledger", str(tmp_path / "ledger.json"),
                "--evals", str(tmp_path / "evals.json"), "--store", url,
                env={"AWS_ENDPOINT_URL": proxy.endpoint})
    # the server keeps a CRC32 of each shard (boto3's default): the altered
    # bytes disagree with it before any second read (issue 47), exit 6
    assert p.returncode == 6, p.stderr  # SourceChangedError (docs/errors.md)
    assert p.stderr.count("\n") == 1 and "model-00003-of-00005.safetensors" in p.stderr
    assert "not the object the server holds" in p.stderr, p.stderr
    assert open_store(url).walk_files("models") == {}

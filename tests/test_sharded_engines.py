"""Sharded directories go publish -> pull -> engine load (issue 26, items 2-4 and 6).

A tiny random Llama saved by transformers' ``save_pretrained(max_shard_size=
"100KB")`` (5 shards and an index) is published as is, as bf16 (re-packed at
60 KB a shard) and as int4, on local disk and S3, through the CLI and the
API; each release is pulled by ``registry pull`` (a real process) and loaded
with ``torch_dtype="auto"``:

* as is: every tensor equal to the source's, float32, the source's shards and
  index byte for byte;
* bf16: every tensor equal to the source's cast to bfloat16, the model
  bfloat16 (config.json's ``torch_dtype`` and ``dtype`` say ``bfloat16``),
  the index rewritten (``weight_map`` covers the shards, ``total_size`` is
  their tensor bytes, ``total_parameters`` kept), no shard over the limit;
* int4: transformers and sentence-transformers refuse it (ValueError naming
  the missing ``quant_method``), never load re-initialized weights.

The same for MiniLM (a real model) is in test_engines.py.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

from registry.api import Registry
from registry.store import open_store
from registry.formats.weights import INDEX, SINGLE, load_weights
from tests.conftest import require_engines, run_cli
from tests.release_util import ledger_row, summary
from tests.shard_util import index_of, shards_of, tiny_llama

VERSIONS = {"1": (None, None), "1-bf16": ("bf16", "60KB"), "1-int4": ("int4", None)}


@pytest.fixture(scope="module")
def engines() -> tuple[Any, Any, Any]:
    return tuple(require_engines("torch", "transformers", "sentence_transformers"))  # type: ignore[return-value]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, engines: Any) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("llama") / "src")


@pytest.fixture(scope="module", params=["local", "s3"])
def pulled(request: pytest.FixtureRequest, saved: Path,
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every version published (as is and int4 by the CLI, bf16 by the API) and
    pulled by the CLI, once per store for the module's tests."""
    tmp_path = tmp_path_factory.mktemp(f"pulled-{request.param}")
    if request.param == "local":
        url = str(tmp_path / "store")
    else:
        request.getfixturevalue("s3_server")
        bucket = f"t-{uuid.uuid4().hex[:16]}"
        boto3.client("s3").create_bucket(Bucket=bucket)
        url = f"s3://{bucket}/reg"
    db = f"sqlite:///{tmp_path / 'index.db'}"
    (tmp_path / "ledger.json").write_text(json.dumps([ledger_row()]))
    (tmp_path / "evals.json").write_text(json.dumps(summary()))
    out = {}
    for version, (dtype, shard) in VERSIONS.items():
        if version == "1-bf16":
            Registry(url, db=db).publish(saved, "llama", version, ledger=[ledger_row()],
                                         eval_summary=summary(), dtype=dtype,
                                         max_shard_size=shard)
        else:
            args = ["--dtype", dtype, "--group-size", "32"] if dtype else []
            p = run_cli("publish", str(saved), "--model-id", "llama", "--version", version,
                        "--ledger", str(tmp_path / "ledger.json"), "--evals",
                        str(tmp_path / "evals.json"), *args, "--store", url, "--db", db,
                        cwd=tmp_path)
            assert p.returncode == 0, p.stderr
        target = tmp_path / "serve" / version
        p = run_cli("pull", f"llama@{version}", "--to", str(target), "--cache",
                    str(tmp_path / "cache"), "--store", url, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        out[version] = target
    out["db"], out["url"] = db, url  # type: ignore[assignment]
    return out


def _state(transformers: Any, path: Path) -> tuple[Any, dict[str, Any]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), torch_dtype="auto",
                                                              local_files_only=True)
    return model.dtype, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_as_is_and_bf16_load_equal_to_the_source(engines: Any, saved: Path,
                                                 pulled: dict[str, Path]) -> None:
    torch, transformers, _ = engines
    dtype, source = _state(transformers, saved)
    assert dtype == torch.float32

    got_dtype, as_is = _state(transformers, pulled["1"])
    assert got_dtype == torch.float32
    assert as_is.keys() == source.keys()
    assert all(torch.equal(as_is[k], source[k]) for k in source)
    for name in (INDEX, *shards_of(saved)):  # byte for byte
        assert (pulled["1"] / name).read_bytes() == (saved / name).read_bytes()

    got_dtype, bf16 = _state(transformers, pulled["1-bf16"])
    assert got_dtype == torch.bfloat16
    assert all(bf16[k].dtype == torch.bfloat16 and torch.equal(bf16[k], source[k].bfloat16())
               for k in source)
    config = json.loads((pulled["1-bf16"] / "config.json").read_text())
    assert config["torch_dtype"] == config["dtype"] == "bfloat16"
    assert config["architectures"] == ["LlamaForCausalLM"]  # every other key kept
    assert not (pulled["1-bf16"] / SINGLE).exists()


def test_bf16_index_is_rewritten(saved: Path, pulled: dict[str, Path]) -> None:
    d = pulled["1-bf16"]
    doc, src = index_of(d), index_of(saved)
    weights = load_weights(open_store(str(d)))  # the rule holds for what we wrote
    shards = shards_of(d)
    assert len(shards) >= 4 and shards == sorted(p.name for p in d.glob("model-*"))
    assert doc["metadata"]["total_size"] == weights.total_size == src["metadata"][
        "total_size"] // 2
    assert doc["metadata"]["total_parameters"] == src["metadata"]["total_parameters"]
    assert set(doc["weight_map"]) == set(src["weight_map"])
    for shard in weights.shards:
        data = sum(i.nbytes for i in shard.header.tensors.values())
        assert data <= 60_000 or len(shard.header.tensors) == 1, (shard.path, data)
        assert shard.header.metadata["format"] == "pt"
        assert shard.header.metadata["tinyllm.dtype"] == "bf16"


def test_int4_is_refused_by_both_engines(engines: Any, pulled: dict[str, Path]) -> None:
    _, transformers, st = engines
    d = pulled["1-int4"]
    config = json.loads((d / "config.json").read_text())
    assert config["quantization_config"]["format"] == "tinyllm-int4"
    assert "quant_method" not in config["quantization_config"]
    assert config["torch_dtype"] == config["dtype"] == "float32"  # unquantized tensors
    with pytest.raises(ValueError, match="quant_method"):
        transformers.AutoModelForCausalLM.from_pretrained(str(d), local_files_only=True)
    with pytest.raises(ValueError, match="quant_method"):
        st.SentenceTransformer(str(d), device="cpu", local_files_only=True)


def test_show_and_card_list_the_shards(pulled: dict[str, Path]) -> None:
    url, db = str(pulled["url"]), str(pulled["db"])
    p = run_cli("show", "llama@1-bf16", "--json", "--store", url, "--db", db)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["dtype"] == "bf16" and doc["config_dtype"] == "bfloat16"  # card and show agree
    assert [g["stored"] for g in doc["weights"]] == ["BF16"]
    shards = shards_of(pulled["1-bf16"])
    assert [f["path"] for f in doc["weight_files"]] == [INDEX, *shards]
    assert doc["parameters"] == index_of(pulled["1-bf16"])["metadata"]["total_parameters"]
    p = run_cli("show", "llama@1-bf16", "--store", url, "--db", db)
    assert f"weights in {len(shards)} shards, {doc['parameters']} parameters" in p.stdout
    assert "config.json dtype bfloat16" in p.stdout
    card = (pulled["1-bf16"] / "MODEL_CARD.md").read_text()
    assert "config.json dtype | `bfloat16`" in card
    for shard in shards:
        assert f"`{shard}`" in card
    from fastapi.testclient import TestClient

    from registry.web import create_app
    with Registry(url, db=db) as reg, \
            TestClient(create_app(reg), base_url="http://localhost") as client:
        page = client.get("/models/llama/1-bf16").text
    table = re.search(r'<table id="weights">.*?</table>', page, re.S)
    assert table is not None
    for f in doc["weight_files"]:
        assert f"<code>{f['path']}</code></td><td>{f['tensors']}</td>" in table.group(0)
    assert f"{doc['parameters']:,} parameters in {len(shards)} shards" in page


def test_signed_sharded_release_pull_verify_and_diff(saved: Path, tmp_path: Path) -> None:
    """Signing covers every shard and the index; a rewritten shard is refused
    on pull; ``verify`` and ``diff`` name shards like any file."""
    pytest.importorskip("model_signing")
    from registry.trust.keys import generate
    from registry.trust import load_trust
    from registry.pull import pull

    priv, pub, _ = generate(tmp_path / "release.pem")
    url = str(tmp_path / "store")
    reg = Registry(url, db=f"sqlite:///{tmp_path / 'i.db'}")
    reg.publish(saved, "llama", "1", ledger=[ledger_row()], eval_summary=summary(),
                sign_key=priv)
    reg.publish(saved, "llama", "2", ledger=[ledger_row()], eval_summary=summary(),
                dtype="bf16", max_shard_size="60KB")
    store = open_store(url)
    bundle = json.loads(store.read_bytes("models/llama/1/model.sig"))
    import base64
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    signed = {r["name"] for r in statement["predicate"]["resources"]}
    assert {INDEX, *shards_of(saved)} <= signed
    out = pull(store, "llama", "1", to=tmp_path / "out", cache=tmp_path / "cache",
               trust=load_trust([pub]))
    assert out.signer is not None
    p = run_cli("verify", f"{url}/models/llama/1", "--full")
    assert p.returncode == 0, p.stderr
    p = run_cli("diff", "llama@1", "llama@2", "--store", url, "--db",
                f"sqlite:///{tmp_path / 'i.db'}", "--json")
    assert p.returncode == 0, p.stderr
    diff = json.loads(p.stdout)
    assert set(shards_of(saved)) <= set(diff["removed"])  # 5 shards of 100 KB -> 4 of 60 KB
    # a store writer rewrites one shard in place (no key): the signed pull refuses it
    shard = shards_of(saved)[1]
    key = f"models/llama/1/{shard}"
    data = bytearray(store.read_bytes(key))
    data[-1] ^= 0xFF
    (Path(url) / key).write_bytes(bytes(data))
    with pytest.raises(Exception, match=shard):
        pull(store, "llama", "1", to=tmp_path / "out2", cache=tmp_path / "cache2",
             trust=load_trust([pub]))
    assert not (tmp_path / "out2").exists()
    p = run_cli("verify", f"{url}/models/llama/1", "--full")
    assert p.returncode == 1 and f"FAIL {shard}" in p.stdout, p.stdout + p.stderr

"""Releases for the Hub API tests, and real Hugging Face clients run as processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from registry.protocol.layout import release_prefix
from registry.release import ModelRelease
from registry.store import open_store
from registry.protocol.verify import read_manifest
from tests.release_util import ledger_row, summary
from tests.support.forkclient import python_run

REPO = Path(__file__).resolve().parent.parent
#: piece size of the test releases: a tiny model's weights span several pieces
PIECE = 16384


#: a BertModel(hidden 32, 1 layer, 2 heads, intermediate 37, vocab 100): tensor -> shape
_BERT = {"embeddings.word_embeddings.weight": (100, 32),
         "embeddings.position_embeddings.weight": (512, 32),
         "embeddings.token_type_embeddings.weight": (2, 32),
         "embeddings.LayerNorm.weight": (32,), "embeddings.LayerNorm.bias": (32,),
         "pooler.dense.weight": (32, 32), "pooler.dense.bias": (32,)}
for _m in ("attention.self.query", "attention.self.key", "attention.self.value",
           "attention.output.dense"):
    _BERT |= {f"encoder.layer.0.{_m}.weight": (32, 32), f"encoder.layer.0.{_m}.bias": (32,)}
_BERT |= {"encoder.layer.0.attention.output.LayerNorm.weight": (32,),
          "encoder.layer.0.attention.output.LayerNorm.bias": (32,),
          "encoder.layer.0.intermediate.dense.weight": (37, 32),
          "encoder.layer.0.intermediate.dense.bias": (37,),
          "encoder.layer.0.output.dense.weight": (32, 37),
          "encoder.layer.0.output.dense.bias": (32,),
          "encoder.layer.0.output.LayerNorm.weight": (32,),
          "encoder.layer.0.output.LayerNorm.bias": (32,)}
BERT_CONFIG = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 32,
               "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 37,
               "vocab_size": 100, "max_position_embeddings": 512, "type_vocab_size": 2,
               "hidden_act": "gelu", "layer_norm_eps": 1e-12, "pad_token_id": 0}


@pytest.fixture(scope="module")
def srcs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A module's fixture (import it by name): :func:`tiny_bert` seeds 1 and 2
    in a new temp folder, {"1": dir, "2": dir}."""
    root = tmp_path_factory.mktemp("bert")
    return {"1": tiny_bert(root, 1), "2": tiny_bert(root, 2)}


def index_db(tmp_path: Path) -> str:
    """The SQLite index URL of ``tmp_path/index.db``."""
    return f"sqlite:///{tmp_path / 'index.db'}"


def tiny_bert(root: Path, seed: int) -> Path:
    """A tiny BertModel directory transformers loads (config.json and a
    model.safetensors of about 110 KB, random weights from ``seed``), written
    with numpy: no torch needed to make it."""
    import numpy as np
    from safetensors.numpy import save_file

    d = root / f"bert{seed}"
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    save_file({k: rng.standard_normal(shape).astype(np.float32) * 0.02
               for k, shape in _BERT.items()}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(BERT_CONFIG, indent=2) + "\n")
    return d


def publish(store_url: str, src: Path, model_id: str, version: str, *,
            sources: tuple[str, ...] = ("wiki",), **kw: Any) -> str:
    """Publish ``src`` as ``model_id@version`` with small pieces; returns its
    commit id (40 hex digits of the manifest digest)."""
    old = os.environ.get("REGISTRY_PIECE_SIZE")
    os.environ["REGISTRY_PIECE_SIZE"] = str(PIECE)
    try:
        ModelRelease(store_url).publish(src, model_id, version,
                                        ledger=[ledger_row(s) for s in sources],
                                        eval_summary=summary(0.9, 0.5), **kw)
    finally:
        if old is None:
            os.environ.pop("REGISTRY_PIECE_SIZE", None)
        else:
            os.environ["REGISTRY_PIECE_SIZE"] = old
    return commit_of(store_url, model_id, version)


def commit_of(store_url: str, model_id: str, version: str) -> str:
    with open_store(store_url) as s:
        return read_manifest(s, release_prefix(model_id, version)).digest[:40]


def release_files(store_url: str, model_id: str, version: str) -> dict[str, str]:
    """path -> sha256 of every file the release lists, plus MANIFEST.json."""
    with open_store(store_url) as s:
        m = read_manifest(s, release_prefix(model_id, version))
    return {**{e.path: e.sha256 for e in m.files}, "MANIFEST.json": m.digest}


def tiny_on_s3(bucket: str, tmp_path: Path, seed: int) -> tuple[str, Path, str]:
    """:func:`tiny_bert` ``seed`` published as tiny@1 under ``s3://bucket/root``:
    (store URL, source folder, sha256 of its model.safetensors)."""
    src = tiny_bert(tmp_path, seed)
    url = f"s3://{bucket}/root"
    publish(url, src, "tiny", "1")
    return url, src, release_files(url, "tiny", "1")["model.safetensors"]


def client_env(base: str, hf_home: Path, **extra: str) -> dict[str, str]:
    """A serving host's environment: HF_ENDPOINT at the test server on
    127.0.0.1, offline mode (which CI sets globally) lifted for this process
    only, its own HF cache."""
    assert base.startswith("http://127.0.0.1:"), base
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN")}
    env.update({"HF_ENDPOINT": base, "HF_HOME": str(hf_home), "HF_HUB_DISABLE_TELEMETRY": "1",
                "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_ETAG_TIMEOUT": "120",
                "HF_HUB_DOWNLOAD_TIMEOUT": "120",
                "PYTHONPATH": str(REPO), **extra})
    return env


def hub_client(base: str, hf_home: Path, kind: str, repo: str, revision: str,
               filename: str | None = None, **env: str) -> dict[str, Any]:
    """Run tests/support/hub_child.py in its own process; its JSON answer."""
    p = python_run([sys.executable, "-m", "tests.support.hub_child", kind, repo, revision,
                        *([filename] if filename else [])], capture_output=True, text=True,
                       env=client_env(base, hf_home, **env), cwd=REPO, timeout=300)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"client crashed: {p.returncode} {p.stderr[-3000:]}"
    return json.loads(lines[-1])  # type: ignore[no-any-return]

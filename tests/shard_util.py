"""A real sharded Hugging Face model directory for tests: a tiny random Llama
saved by transformers' own ``save_pretrained(max_shard_size=...)``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import boto3

from registry.formats.safetensors_io import read_safetensors, write_safetensors
from registry.formats.weights import INDEX

#: ~420 KB of F32 weights, saved at 100 KB a shard: 6 shards.
SHARD_SIZE = "100KB"


def tiny_llama(path: Path, *, max_shard_size: str = SHARD_SIZE, seed: int = 0) -> Path:
    """Save a random-init tiny Llama (and nothing else) at ``path``; returns it."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=256,
                                      max_position_embeddings=64, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(path, max_shard_size=max_shard_size, safe_serialization=True)
    return path


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def index_of(path: Path) -> dict[str, Any]:
    return json.loads((path / INDEX).read_text())


def write_index(path: Path, doc: dict[str, Any]) -> None:
    (path / INDEX).write_text(json.dumps(doc, indent=2))


def shards_of(path: Path) -> list[str]:
    return sorted(set(index_of(path)["weight_map"].values()))


def read_shard(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    with open(path, "rb") as f:
        return read_safetensors(f, path=str(path), file_size=path.stat().st_size)


def write_shard(path: Path, tensors: dict[str, Any], metadata: dict[str, str]) -> None:
    with open(path, "wb") as f:
        write_safetensors(f, tensors, metadata=metadata)


def upload_dir(local: Path, bucket: str, prefix: str) -> str:
    """Copy a local directory to ``s3://bucket/prefix``; returns that URL."""
    s3 = boto3.client("s3")
    for p in sorted(local.rglob("*")):
        if p.is_file():
            s3.upload_file(str(p), bucket, f"{prefix}/{p.relative_to(local).as_posix()}")
    return f"s3://{bucket}/{prefix}"

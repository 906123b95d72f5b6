"""A Llama-shaped bf16 model directory for the load and copy benchmarks (issue 43).

``make_llama_dir(path, size_mib, shards)`` writes transformers' layout: shards
``model-0000N-of-0000M.safetensors`` (BF16 tensors named and shaped as Llama's:
embeddings, per layer q/k/v/o (grouped-query: k and v a quarter of q), the
gate/up/down MLP and two norms, the final norm, the LM head), the index
``model.safetensors.index.json`` and a ``config.json``. Hidden size 2048,
MLP 5632, vocabulary 32000 (TinyLlama's); the number of layers is what makes
about ``size_mib`` MiB. Layers are split over the shards in order, the
embeddings in the first and the head in the last, as transformers'
``save_pretrained`` does. Content: pseudo-random bytes from a fixed seed
(incompressible; every bf16 bit pattern, NaNs included, which no arm
interprets).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

HIDDEN, MLP, VOCAB, KV = 2048, 5632, 32000, 512
MIB = 1024 * 1024


def _layer(i: int) -> list[tuple[str, tuple[int, ...]]]:
    p = f"model.layers.{i}."
    return [(p + "self_attn.q_proj.weight", (HIDDEN, HIDDEN)),
            (p + "self_attn.k_proj.weight", (KV, HIDDEN)),
            (p + "self_attn.v_proj.weight", (KV, HIDDEN)),
            (p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
            (p + "mlp.gate_proj.weight", (MLP, HIDDEN)),
            (p + "mlp.up_proj.weight", (MLP, HIDDEN)),
            (p + "mlp.down_proj.weight", (HIDDEN, MLP)),
            (p + "input_layernorm.weight", (HIDDEN,)),
            (p + "post_attention_layernorm.weight", (HIDDEN,))]


def _nbytes(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape)) * 2


def layout(size_mib: int, shards: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    """The tensors of each shard, in file order."""
    head = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    tail = [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]
    fixed = sum(_nbytes(s) for _n, s in head + tail)
    per_layer = sum(_nbytes(s) for _n, s in _layer(0))
    layers = max(1, round((size_mib * MIB - fixed) / per_layer))
    tensors = head + [t for i in range(layers) for t in _layer(i)] + tail
    total = sum(_nbytes(s) for _n, s in tensors)
    out: list[list[tuple[str, tuple[int, ...]]]] = [[] for _ in range(shards)]
    acc, k = 0, 0
    for i, (name, shape) in enumerate(tensors):
        # the next shard starts once this one holds its share of the bytes
        # (or when every shard left needs one of the tensors left: none is empty)
        if out[k] and k < shards - 1 and (acc >= (k + 1) * total / shards
                                          or len(tensors) - i <= shards - 1 - k):
            k += 1
        out[k].append((name, shape))
        acc += _nbytes(shape)
    return out


def make_llama_dir(path: Path, size_mib: int, shards: int = 8, seed: int = 0) -> dict[str, int]:
    """Write the directory; returns ``{"tensors": n, "bytes": tensor bytes, "layers": n}``."""
    path.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    weight_map: dict[str, str] = {}
    total = count = 0
    plan = layout(size_mib, shards)
    for k, tensors in enumerate(plan):
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        off = 0
        for tname, shape in tensors:
            n = _nbytes(shape)
            header[tname] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
            weight_map[tname] = name
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with open(path / name, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            left = off
            while left:
                n = min(left, 16 * MIB)
                f.write(rng.bytes(n))
                left -= n
        total += off
        count += len(tensors)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    layers = sum(1 for n in weight_map if n.endswith("q_proj.weight"))
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": MLP, "num_attention_heads": 32, "num_key_value_heads": 8,
        "num_hidden_layers": layers, "vocab_size": VOCAB, "torch_dtype": "bfloat16",
        "rms_norm_eps": 1e-5}, indent=2) + "\n")
    return {"tensors": count, "bytes": total, "layers": layers}

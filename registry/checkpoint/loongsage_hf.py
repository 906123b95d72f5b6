"""The HF export of a multi-rank LoongSage run (seed 003 section 4.3): ``hf_model/``
"aggregated across ranks into complete safetensors weights + config + tokenizer".

::

    train_step_<N>/hf_model/
        model.safetensors.index.json        {"metadata": {"total_size": <tensor bytes>},
                                             "weight_map": {<name>: <shard>}}
        model-0000i-of-0000K.safetensors     complete tensors (metadata format "pt")
        config.json, tokenizer.json, ...     copied from hf_model_path

Every parameter has one owner rank (the parameters spread over the ranks by
bytes, largest first); each owner writes one shard holding its parameters,
so no rank holds more than its shard's worth of full tensors plus one tensor
being assembled. A sharded parameter (DTensor) is assembled with one
collective per parameter (``full_tensor``, in name order on every rank); a
replicated one (a plain tensor, the same on every rank) is written from its
owner's copy, without communication. The shards land in the step's staging
directory (or, on object stores, under the claimed step prefix, each a
conditional create), hashed as written; rank 0 writes the index, the config
and tokenizer files, and the step's one MANIFEST.json lists them all, so an
export killed at any moment is never visible as committed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from registry.checkpoint.dist import _HashingStream
from registry.checkpoint.loongsage_format import HF
from registry.errors import DocumentError, ObjectNotFoundError
from registry.manifest import FileEntry
from registry.safetensors_io import write_safetensors
from registry.store import Store, join, open_store

INDEX = "model.safetensors.index.json"
#: copied from hf_model_path when present (config.json is required).
HF_FILES = ("config.json", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json")


def shard_name(i: int, n: int) -> str:
    """Hugging Face's shard file name: ``model-00001-of-00004.safetensors`` (i from 0)."""
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def read_hf_files(hf_model_path: Any) -> dict[str, bytes]:
    """The config and tokenizer files of ``hf_model_path`` (folder, URL or Store).

    Raises:
        DocumentError: no config.json there.
    """
    hf = hf_model_path if isinstance(hf_model_path, Store) else open_store(str(hf_model_path))
    out = {}
    for name in HF_FILES:
        try:
            out[name] = hf.read_bytes(name)
        except ObjectNotFoundError:
            if name == "config.json":
                raise DocumentError(hf.url_of(name), "missing: hf_model_path must hold the "
                                                     "HF config.json of the export") from None
    return out


def owners(model: Mapping[str, torch.Tensor], world: int) -> dict[str, int]:
    """Parameter name -> owner rank: largest first, each to the rank owning
    the fewest bytes so far (ties: the lower rank). The same on every rank."""
    load = [0] * world
    out = {}
    for name in sorted(model, key=lambda n: (-_nbytes(model[n]), n)):
        r = min(range(world), key=lambda i: (load[i], i))
        out[name] = r
        load[r] += _nbytes(model[name])
    return out


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()  # a DTensor's numel is the global one


def plan(model: Mapping[str, torch.Tensor], world: int) -> tuple[dict[str, int], dict[int, str],
                                                                  bytes]:
    """(owners, owner rank -> shard file name, the index document)."""
    own = owners(model, world)
    ranks = sorted(set(own.values()))
    files = {r: shard_name(i, len(ranks)) for i, r in enumerate(ranks)}
    doc = {"metadata": {"total_size": sum(_nbytes(t) for t in model.values())},
           "weight_map": {name: files[own[name]] for name in sorted(model)}}
    return own, files, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def gather_owned(model: Mapping[str, torch.Tensor], own: Mapping[str, int],
                 rank: int) -> dict[str, torch.Tensor]:
    """This rank's parameters as full tensors (collective: every rank calls
    it with the same parameter names)."""
    out = {}
    for name in sorted(model):
        t = model[name]
        full = t.full_tensor() if isinstance(t, DTensor) else t
        if own[name] == rank:
            out[name] = full.detach()
        del full
    return out


def write_shard(store: Store, target: str, name: str,
                tensors: Mapping[str, torch.Tensor]) -> FileEntry:
    """Write one shard to ``<target>/hf_model/<name>`` (a conditional create,
    streamed one tensor at a time, hashed on a helper thread while the next
    bytes are written), returning its manifest entry."""
    rel = f"{HF}/{name}"
    with store.open_write(join(target, rel), exclusive=True) as f:
        out = _HashingStream(f)
        write_safetensors(out, tensors, metadata={"format": "pt"}, path=store.url_of(
            join(target, rel)))
        digest = out.digest()
    return FileEntry(rel, out.size, digest)

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
collective per parameter, in name order on every rank, on the save's own
process group (never the DTensor's mesh, which is training's: an async save
runs this on its writer thread while training's own collectives run on the
mesh, and two threads issuing collectives on one group in different orders
hang, issue 46): each rank sends its local piece and the piece's offset
(computed from the mesh and placements, no communication) to the owner,
which places the pieces into the full tensor. A piece duplicated along a
``Replicate`` mesh dimension is sent once. A replicated parameter (a plain
tensor, or a DTensor replicated on every mesh dimension) is written from its
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
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from registry.checkpoint.dist import _HashingStream
from registry.checkpoint.loongsage_format import HF
from registry.errors import CheckpointError, DocumentError, ObjectNotFoundError
from registry.protocol.manifest import FileEntry
from registry.formats.safetensors_io import write_safetensors
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


def check_placements(model: Mapping[str, torch.Tensor], *, where: str) -> None:
    """Every DTensor of ``model`` is placed ``Shard(dim)`` or ``Replicate`` on
    each mesh dimension (what :func:`gather_owned` assembles by offsets).

    Raises:
        CheckpointError: a ``Partial`` (a pending reduction) or another
            placement (e.g. a strided shard), naming the parameter.
    """
    for name, t in model.items():
        if not isinstance(t, DTensor):
            continue
        for p in t.placements:
            if type(p) not in (Shard, Replicate):
                raise CheckpointError(f"{where}: parameter {name!r} is placed {p}; the HF "
                                      "export assembles Shard(dim) and Replicate placements only")


def gather_owned(model: Mapping[str, torch.Tensor], own: Mapping[str, int],
                 rank: int, group: Any = None) -> dict[str, torch.Tensor]:
    """This rank's parameters as full tensors (collective on ``group``, the
    save's own process group: every rank calls it with the same parameter
    names; ``rank`` is this process's rank in ``group`` and ``own`` names
    owners by ``group`` rank). Communicates only on ``group``, never on a
    DTensor's mesh (see the module notes); DTensors must pass
    :func:`check_placements`."""
    out = {}
    for name in sorted(model):
        t = model[name]
        if isinstance(t, DTensor) and not all(p.is_replicate() for p in t.placements):
            full = _assemble(t, own[name], rank, group)
        else:
            full = t.to_local() if isinstance(t, DTensor) else t
        if own[name] == rank:
            assert full is not None
            out[name] = full.detach()
        del full
    return out


def _assemble(t: DTensor, owner: int, rank: int, group: Any) -> torch.Tensor | None:
    """The full tensor of ``t`` on ``owner`` (None elsewhere): one
    ``gather_object`` of (offset, local piece) on ``group``."""
    mesh, placements = t.device_mesh, t.placements
    coord = mesh.get_coordinate()
    piece = None
    # a piece is the same on every rank along a Replicate mesh dimension: sent once
    if coord is not None and all(c == 0 for c, p in zip(coord, placements, strict=True)
                                 if p.is_replicate()):
        _, offset = compute_local_shape_and_global_offset(t.shape, mesh, placements)
        piece = (tuple(offset), t.to_local().detach().cpu())
    if not dist.is_initialized():
        parts: list[Any] | None = [piece]
    else:
        parts = [None] * dist.get_world_size(group) if rank == owner else None
        dist.gather_object(piece, parts, dst=dist.get_global_rank(group, owner)
                           if group is not None else owner, group=group)
    if parts is None:
        return None
    full = torch.empty(tuple(t.shape), dtype=t.dtype)
    for part in parts:
        if part is not None:
            offset, local = part
            full[tuple(slice(o, o + n) for o, n in zip(offset, local.shape, strict=True))] = local
    return full


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

"""LoongSage ``dist_ckpt/`` in torch_dist form: the state-dict keys this registry
writes, and reading a committed one in a single process (seed 003 sections 3
and 4.4; DESIGN section 1: Megatron's "torch_dist").

The keys of the state dict (what :mod:`registry.checkpoint.loongsage_dcp` saves,
:mod:`registry.checkpoint.loongsage_dcp_resume` resumes and :func:`read_dist`
reads for :func:`registry.checkpoint.loongsage.load_training_state`)::

    model.<name>                                parameters
    optimizer.state.<name>.<field>              fully_reshardable optimizer state
    optimizer.dp_shard.rank<r>.<name>.<field>   dp_reshardable, rank r's shard
    common                                      JSON bytes (format, step, topology, ...)
    rng.rank<r>                                 JSON bytes: rank r's RNG state

Also the collective helpers saving and resuming share (``_agree``: rank 0
decides, every rank hears; ``_single_process``). Needs PyTorch (the
``[torch]`` extra); nothing here imports the loaders above it.
"""

from __future__ import annotations

import json
import pickle
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
from torch.distributed.tensor import DTensor

from registry.checkpoint.dcp_safe import UnsafeCheckpointError, safe_load
from registry.checkpoint.dist import broadcast, rank_of, storage_reader
from registry.checkpoint.loongsage_format import DIST, DIST_FORMAT, DistCheckpoint, check_topology
from registry.errors import CheckpointError, DocumentError, UsageError
from registry.protocol.manifest import Manifest
from registry.store import Store, join

MODEL_KEY = "model."
OPT_FULL = "optimizer.state."
OPT_DP = "optimizer.dp_shard.rank{rank}."
COMMON = "common"
RNG_KEY = "rng.rank{rank}"
FORMAT = DIST_FORMAT


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


@contextmanager
def _single_process() -> Iterator[None]:
    """Without a process group DCP warns that it assumes one process: that is
    the intent here (a one-process job, a reader), so the warning is dropped."""
    if dist.is_initialized():
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled",
                                category=UserWarning)
        yield


def _agree(group: Any, fn: Any) -> Any:
    """Run ``fn`` on rank 0 and share its result; a failure raises on every
    rank (rank 0: the error itself; the others: the same error when it
    pickles, else a CheckpointError with its message)."""
    result = err = None
    if rank_of(group) == 0:
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - every rank must hear of it
            err = e
    shared_err: Any = err
    if err is not None:
        try:
            pickle.loads(pickle.dumps(err))
        except Exception:  # noqa: BLE001
            shared_err = CheckpointError(f"{type(err).__name__}: {err}")
    result, shared_err = broadcast((result, shared_err), group)
    if rank_of(group) == 0 and err is not None:
        raise err
    if shared_err is not None:
        raise shared_err
    return result


def read_full(store: Store, key: str) -> dict[str, Any]:
    """Every entry of the DCP directory ``key`` in one process, tensors in
    their full shapes (numpy), objects as saved. No verification here: the
    caller verified the files against the manifest.

    Raises:
        CheckpointError: DCP could not read it.
    """
    reader = storage_reader(store, key)
    try:
        meta = reader.read_metadata()
    except UnsafeCheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - a broken .metadata is a bad checkpoint
        raise CheckpointError(f"{store.url_of(key)}/.metadata: not a readable torch_dist "
                              f"(torch.distributed.checkpoint) metadata file: {e}") from None
    sd: dict[str, Any] = {}
    for name, md in meta.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            sd[name] = torch.empty(md.size, dtype=md.properties.dtype)
        elif isinstance(md, BytesStorageMetadata):
            sd[name] = b""
    try:
        with _single_process():
            safe_load(sd, reader, no_dist=True)
    except UnsafeCheckpointError:
        raise
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{store.url_of(key)}: DCP could not load it: {e}") from None
    return {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in sd.items()}


def read_dist(store: Store, prefix: str, manifest: Manifest, step: int, *,
              optimizer: bool) -> Any:
    """A verified step's DCP ``dist_ckpt/`` as a
    :class:`~registry.checkpoint.loongsage_format.DistCheckpoint` (numpy, full
    shapes), for single-process readers (:func:`load_dist_ckpt`,
    :func:`load_training_state`).

    ``model``: the ``model.<name>`` tensors, or every tensor when no key has
    that prefix (a tree written by another DCP program); ``optimizer_state``:
    the ``fully_reshardable`` state (None for ``dp_reshardable``, whose shards
    only a job of the saved topology can use, and for foreign trees).

    Raises:
        CheckpointError: DCP could not read it, or it holds no tensors.
    """
    key = join(prefix, DIST)
    url = store.url_of(key)
    entries = read_full(store, key)
    tensors = {k: v for k, v in entries.items() if isinstance(v, np.ndarray)}
    model = {k[len(MODEL_KEY):]: v for k, v in tensors.items() if k.startswith(MODEL_KEY)}
    common: dict[str, Any] = {}
    if isinstance(entries.get(COMMON), bytes):
        common = json.loads(entries[COMMON])
    if not model and not common:
        model = dict(tensors)
    if not model:
        raise CheckpointError(f"{url}: the DCP checkpoint holds no model tensors")
    opt = None
    if optimizer and common.get("optimizer_sharding_type") == "fully_reshardable":
        opt = {k[len(OPT_FULL):]: v for k, v in tensors.items() if k.startswith(OPT_FULL)}
    try:
        topology = check_topology(common.get("topology"), what=f"{url}:{COMMON}")
    except UsageError as e:
        raise DocumentError(f"{url}:{COMMON}", str(e)) from None
    rng = entries.get(RNG_KEY.format(rank=0))
    return DistCheckpoint(step, url, manifest, model, opt, common.get("optimizer"),
                          common.get("scheduler_state"),
                          json.loads(rng) if isinstance(rng, bytes) else None, topology,
                          rng_saved=isinstance(rng, bytes))

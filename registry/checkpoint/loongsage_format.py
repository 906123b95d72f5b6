"""What a LoongSage step directory holds (seed 003), shared by saving, loading and adopting.

::

    <checkpoint_path>/latest_checkpointed_iteration.txt   "<N>\\n": the last resumable step
    <checkpoint_path>/train_step_<N>/
        dist_ckpt/__<rank>_<i>.distcp      torch.distributed.checkpoint (Megatron's
        dist_ckpt/.metadata                "torch_dist"), from 1 rank or N: model,
                                           optimizer, scheduler (in ``common``) and
                                           per-rank RNG; the keys are listed in
                                           :mod:`registry.checkpoint.loongsage_dcp`
        hf_model/model.safetensors         HF export of one process: weights (metadata "pt"),
        hf_model/model.safetensors.index.json + model-0000i-of-0000K.safetensors
                                           or, from N ranks, the sharded form
                                           (:mod:`registry.checkpoint.loongsage_hf`)
        hf_model/config.json               + tokenizer files
        data_source/global_dataset_state_dict_ds<i>.pt
                                           torch.save: prompt_data_path, state, prompt_buffer
        data_source/pipeline_buf.pt        fully_async: snapshot_pipeline_buf()'s items
        MANIFEST.json                      kind checkpoint, layout "loongsage": every file above

The ``data_source/`` files are :mod:`registry.checkpoint.loongsage_data`'s.
Trees written by earlier versions of the single-process saver hold
``dist_ckpt/{model,optimizer}.safetensors``, ``scheduler.json`` and ``rng.json``
(:data:`LEGACY_DIST_FILES`); they still load. Trees Megatron wrote can be
verified and released after ``registry ckpt adopt``, and read with
``load_dist_ckpt`` / ``load_dcp``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from registry.errors import UsageError
from registry.protocol.manifest import Manifest
from registry.rules.names import NAME_RE
from registry.store import Store

DIST = "dist_ckpt"
#: the ``common`` entry's ``format`` of a dist_ckpt this registry writes.
DIST_FORMAT = "loongsage-torch-dist"
HF = "hf_model"
DATA = "data_source"
MODEL = "model.safetensors"
OPTIMIZER = "optimizer.safetensors"
SCHEDULER = "scheduler.json"
RNG = "rng.json"
CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
#: ``dist_ckpt/`` of trees written by earlier versions (still loaded, never written).
LEGACY_DIST_FILES = (MODEL, OPTIMIZER, SCHEDULER, RNG)
DATA_RE = re.compile(r"data_source/global_dataset_state_dict_ds(\d+)\.(json|pt)")

TOPOLOGY_KEYS = ("tp", "pp", "ep", "dp")
#: seed 003 section 3: "If the PP/TP size changed when resuming, RNG restoration
#: is skipped with a warning". EP and DP are recorded too, but do not gate RNG.
RNG_TOPOLOGY_KEYS = ("tp", "pp")


class DataSourceFreshWarning(UserWarning):
    """A data source has no saved state in the checkpoint: it starts from scratch."""


class RngSkippedWarning(UserWarning):
    """The parallel topology changed since the save: RNG state is not restored."""


class NoTrackerWarning(UserWarning):
    """Step directories exist but no tracker file vouches for any: none is resumable."""


def check_topology(topology: Mapping[str, Any] | None, *, what: str) -> dict[str, int]:
    """``{"tp", "pp", "ep", "dp"}`` sizes, missing ones 1.

    Raises:
        UsageError: an unknown key, or a size that is not a positive integer.
    """
    out = dict.fromkeys(TOPOLOGY_KEYS, 1)
    for key, value in (topology or {}).items():
        if key not in out:
            raise UsageError(f"{what}: unknown topology key {key!r} "
                             f"(known: {', '.join(TOPOLOGY_KEYS)})")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"{what}: topology {key}={value!r} must be a positive integer")
        out[key] = value
    return out


def derive_run_id(store: Store, root: str) -> str:
    """A manifest ``run_id`` for the tree at ``root``: its key's segments joined
    with ``-`` (the store URL's last segment for the store root), reduced to
    the naming rule (``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``)."""
    parts = [p for p in root.strip("/").split("/") if p]
    if not parts:
        tail = store.url.rstrip("/").rsplit("/", 1)[-1]
        parts = [tail.split("://")[-1]]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", "-".join(parts))
    name = re.sub(r"\.{2,}", ".", name).lstrip("._-")[-128:].lstrip("._-")
    if not name or name == "refs" or not NAME_RE.fullmatch(name):
        return "loongsage"
    return name


@dataclass(frozen=True, slots=True)
class DistCheckpoint:
    """One verified ``train_step_<N>/dist_ckpt`` directory, read.

    ``rng_state`` is rank 0's (a multi-rank save keeps one per rank);
    ``rng_saved`` is False when the directory holds none (a tree written by
    another DCP program).
    """

    step: int
    path: str
    manifest: Manifest
    model: dict[str, np.ndarray]
    optimizer_state: dict[str, np.ndarray] | None
    optimizer: str | None
    scheduler_state: Any
    rng_state: Any
    topology: dict[str, int]
    rng_saved: bool = True

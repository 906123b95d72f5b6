"""The one ``dist_ckpt/`` format (DESIGN section 1, "one format for one rank and
for N ranks"): torch.distributed.checkpoint's ``*.distcp`` shards and
``.metadata`` of one state dict, written the same way by the single-process
:class:`~registry.checkpoint.loongsage_save.LoongSageCheckpointer` (1 rank)
and by :class:`~registry.checkpoint.loongsage_dcp.DistLoongSageCheckpointer`.
The state dict's keys are listed in :mod:`registry.checkpoint.loongsage_dcp`.

Needs torch; imported lazily by the single-process saver.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from registry.checkpoint.dist import (
    hash_object,
    local_staging,
    metadata_key,
    storage_writer,
    upload_staged,
    written_entries,
)
from registry.checkpoint.loongsage_dcp_read import COMMON, MODEL_KEY, OPT_FULL, RNG_KEY
from registry.checkpoint.loongsage_dcp_read import _single_process as single_process
from registry.checkpoint.loongsage_format import DIST
from registry.protocol.manifest import FileEntry
from registry.store import Store, join


def one_rank_state(model: Mapping[str, np.ndarray], optimizer: Mapping[str, np.ndarray] | None,
                   common: bytes, rng: bytes) -> dict[str, Any]:
    """The state dict of a one-process save: full tensors (the arrays' memory,
    not copied), the optimizer state as ``fully_reshardable``, ``common`` and
    rank 0's RNG state as JSON bytes."""
    sd: dict[str, Any] = {MODEL_KEY + k: torch.from_numpy(v) for k, v in model.items()}
    sd.update({OPT_FULL + k: torch.from_numpy(v) for k, v in (optimizer or {}).items()})
    sd[COMMON] = common
    sd[RNG_KEY.format(rank=0)] = rng
    return sd


def write_dcp(store: Store, target: str, state: dict[str, Any], *, group: Any = None,
              rank: int = 0, thread_count: int = 1) -> tuple[list[FileEntry] | str,
                                                             FileEntry | None]:
    """Write ``state`` with DCP into ``<target>/dist_ckpt/`` (collective under a
    process group): local disk straight into the staging directory ``target``
    through the store's durable files; object stores on local disk first,
    then each rank uploads the files it wrote (conditional creates).

    Returns:
        This rank's shard entries, or (under a process group) the error
        message of a failed upload, so that rank 0 can fail the save on every
        rank; and on rank 0 the ``.metadata`` entry.

    Raises:
        Without a process group, the error of a failed write or upload.
    """
    direct = store.atomic_rename and store.local_path(target) is not None
    where = nullcontext((store, target)) if direct else local_staging()
    with where as (wstore, wkey):
        writer = storage_writer(wstore, join(wkey, DIST), thread_count=thread_count)
        with single_process():
            dcp.save(state, storage_writer=writer, process_group=group,
                     no_dist=not dist.is_initialized())
        mine: list[FileEntry] | str = written_entries(writer, DIST)
        meta = None
        try:
            if rank == 0:
                meta = hash_object(wstore, metadata_key(wkey, DIST), f"{DIST}/.metadata")
            if not direct:
                names = [e.path.rsplit("/", 1)[1] for e in mine]  # type: ignore[union-attr]
                upload_staged(store, str(wstore.local_path(join(wkey, DIST))),
                              join(target, DIST), names + ([".metadata"] if meta else []))
        except Exception as e:  # noqa: BLE001 - passed to rank 0, which fails the save
            if not dist.is_initialized():
                raise  # one process: no peer to tell
            mine = f"{type(e).__name__}: {e}"
    return mine, meta

"""Resuming a multi-rank LoongSage run from ``dist_ckpt/`` through
torch.distributed.checkpoint (seed 003 sections 3 and 4.4), and loading one
DCP directory in place (:func:`load_dcp`).

Every rank calls :func:`resume_dist` (it is collective)::

    state = resume_dist(store, "exp", model=templates, optimizer_state=opt_templates,
                        hf_model_path="/models/base", topology={"tp": 3})

Saving is :mod:`registry.checkpoint.loongsage_dcp` (which re-exports
:func:`resume_dist` and :func:`load_dcp`); the state-dict keys are
:mod:`registry.checkpoint.loongsage_dcp_read`'s. Needs PyTorch.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.tensor import DTensor, distribute_tensor

from registry.checkpoint.dcp_safe import UnsafeCheckpointError, safe_load
from registry.checkpoint.dist import rank_of, storage_reader, world_of
from registry.checkpoint.layout import LOONGSAGE
from registry.checkpoint.loongsage_data import DataSourceState, DataStateLookup, read_data_state
from registry.checkpoint.loongsage_dcp_read import (
    COMMON,
    FORMAT,
    MODEL_KEY,
    OPT_DP,
    OPT_FULL,
    RNG_KEY,
    _agree,
    _local,
    _single_process,
)
from registry.checkpoint.loongsage_dp import (
    check_dp_only,
    describe,
    effective,
    plan_bucket_load,
    rng_rank,
)
from registry.checkpoint.loongsage_format import DIST, RngSkippedWarning, check_topology
from registry.checkpoint.loongsage_load import (
    _hf_config,
    _hf_weights,
    _source_paths,
    _store_is_new,
    _verified_step,
    _verify_entries,
)
from registry.checkpoint.tree import CheckpointTree
from registry.errors import CheckpointError, DocumentError, UsageError
from registry.protocol.manifest import Manifest, parse_manifest
from registry.store import Store, join, open_store
from registry.protocol.verify import read_manifest

@dataclass(frozen=True, slots=True)
class DistTrainingState(DataStateLookup):
    """What a multi-rank run resumed from (the tensors were loaded in place
    into the templates given to :func:`resume_dist`).

    Attributes:
        source: ``"checkpoint"`` or ``"hf"`` (templates filled from hf_model_path).
        step: the resumed step (0 from HF).
        rng_state: this rank's saved RNG state, or None (from HF, or skipped
            because the topology changed: ``rng_restored``).
        saved_topology, saved_world_size, optimizer_sharding_type: as saved.
        pipeline_buf: rank 0's fully_async pipeline snapshot, when one was saved
            (the checkpointer's ``snapshot_pipeline_buf``), else None.
    """

    source: str
    step: int
    path: str
    hf_config: dict[str, Any]
    optimizer: str | None
    optimizer_sharding_type: str | None
    scheduler_state: Any
    rng_state: Any
    rng_restored: bool
    saved_topology: dict[str, int] | None
    saved_world_size: int | None
    data_sources: tuple[Any, ...]
    manifest: Manifest | None
    pipeline_buf: tuple[Any, ...] | None = None


def _open(store: Any) -> Store:
    return store if isinstance(store, Store) else open_store(str(store))


def _saved_keys(meta: Any) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Key -> (size, dtype) of the tensors in DCP metadata."""
    return {k: (md.size, md.properties.dtype) for k, md in meta.state_dict_metadata.items()
            if isinstance(md, TensorStorageMetadata)}


def _common(store: Store, key: str, group: Any) -> tuple[dict[str, Any], Any]:
    reader = storage_reader(store, key)
    meta = reader.read_metadata()
    if COMMON not in meta.state_dict_metadata:
        raise CheckpointError(f"{store.url_of(key)}: a DCP checkpoint without the "
                              f"{COMMON!r} entry this saver writes (written by another "
                              "program?): read it with load_dcp")
    sd: dict[str, Any] = {COMMON: b""}
    with _single_process():
        safe_load(sd, reader, process_group=group, no_dist=not dist.is_initialized())
    doc = json.loads(sd[COMMON])
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise DocumentError(f"{store.url_of(key)}:{COMMON}", f"must be a {FORMAT} object")
    return doc, meta


def load_dcp(store: str | Store, path: str, state_dict: dict[str, Any], *,
             process_group: Any = None, verify: bool = True) -> dict[str, Any]:
    """Load the DCP directory ``path`` (a committed step's ``dist_ckpt``,
    written by this registry or by any DCP program and adopted) into
    ``state_dict`` in place, resharding to the templates' shardings.

    Collective when a process group is initialized. Rank 0 first verifies
    every file under ``path`` (size and sha256) against the step's MANIFEST.json.

    Returns:
        ``state_dict`` (non-tensor values replaced by the loaded objects).

    Raises:
        NoValidCheckpointError: the step has no manifest or a file does not verify.
        CheckpointError: a key of ``state_dict`` is not in the checkpoint (named);
            DCP failed (shapes that do not match), on every rank: never DCP's
            own CheckpointException (a BaseException under a process group).
    """
    store = _open(store)
    key = path.strip("/")
    prefix, _, under = key.rpartition("/")
    group = process_group
    if verify:
        def check() -> None:
            manifest = read_manifest(store, prefix)
            _verify_entries(store, prefix, manifest, f"{under}/")
        _agree(group, check)
    reader = storage_reader(store, key)
    try:
        saved = reader.read_metadata().state_dict_metadata
    except UnsafeCheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - a broken .metadata is a bad checkpoint
        raise CheckpointError(f"{store.url_of(key)}/.metadata: not a readable torch_dist "
                              f"(torch.distributed.checkpoint) metadata file: {e}") from None
    extra = sorted(set(state_dict) - set(saved))
    if extra:
        raise CheckpointError(f"{store.url_of(key)}: {extra[0]!r} is not in the checkpoint "
                              f"(it holds {len(saved)} entries; {len(extra)} asked for are "
                              "missing)")
    try:
        with _single_process():
            safe_load(state_dict, reader, process_group=group,
                      no_dist=not dist.is_initialized())
    except (RuntimeError, ValueError, KeyError, CheckpointException) as e:
        raise CheckpointError(f"{store.url_of(key)}: DCP could not load it: "
                              f"{_first_line(e)}") from None
    return state_dict


def _first_line(e: BaseException) -> str:
    """The gist of a DCP error (a CheckpointException holds each rank's
    failure with its traceback: the first one's message)."""
    if isinstance(e, CheckpointException) and e.failures:
        inner = next(iter(e.failures.values()))
        e = inner[0] if isinstance(inner, tuple) else e
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def resume_dist(store: str | Store, checkpoint_path: str = "", *,
                model: Mapping[str, torch.Tensor],
                optimizer_state: Mapping[str, torch.Tensor] | None = None,
                hf_model_path: Any = None, data_sources: Iterable[Any] = (),
                topology: Mapping[str, int] | None = None,
                process_group: Any = None, partial: bool = False) -> DistTrainingState:
    """Resume a multi-rank run (seed 003 section 3), collective on every rank.

    Only the tracked step is resumable; rank 0 verifies it in full. The
    templates (``model``: name -> DTensor/tensor in this run's sharding;
    ``optimizer_state``: ``<name>.<field>`` likewise; None: no optimizer
    state is read) are filled in place by DCP, resharding ``fully_reshardable``
    state to this topology and ``dp_reshardable`` state to this DP size
    (:mod:`registry.checkpoint.loongsage_dp`). Without a tracker (a brand-new
    run, also one whose store folder does not exist yet) they are filled from
    ``hf_model_path``'s weights.

    Args:
        topology: this run's sizes; ``dp`` may be left out (world / (tp*pp*ep)).
        partial: resume although the checkpoint holds model or optimizer
            entries the templates lack (they are not read).

    Raises:
        UsageError: no hf_model_path; a bad topology, or one that does not fit
            the world size.
        PointerError, NoValidCheckpointError: as :func:`load_training_state`.
        CheckpointError, on every rank: ``dp_reshardable`` state and a changed
            TP/PP/EP size (naming the seed's rule and ``fully_reshardable``);
            a template entry the checkpoint lacks; a checkpoint entry the
            templates lack (unless ``partial``); DCP failures.

    Warns:
        RngSkippedWarning: the TP or PP size changed, or no RNG state was
            saved at this rank's position (a new DP or EP rank): this rank's
            RNG state is not restored (``rng_restored`` False).
    """
    store = _open(store)
    if hf_model_path is None or hf_model_path == "":
        raise UsageError("hf_model_path is required: both loading paths (checkpoint "
                         "and HF) read its config.json for the model structure")
    hf_store = _open(hf_model_path)
    hf_config = _hf_config(hf_store)
    group = process_group
    rank, world = rank_of(group), world_of(group)
    topo = effective(check_topology(topology, what="topology"), world, what="topology")
    paths = _source_paths(data_sources)
    tree = CheckpointTree(store, checkpoint_path, LOONGSAGE)
    tracker = store.url_of(tree.pointer_key)

    def pick() -> tuple[int, bytes] | None:
        step = None if _store_is_new(store) else tree.latest()
        if step is None:
            return None
        return step, _verified_step(tree, step, tracker).to_bytes()

    picked = _agree(group, pick)
    if picked is None:
        weights = _hf_weights(hf_store)
        for name, t in model.items():
            if name not in weights:
                raise CheckpointError(f"{hf_store.url}: no weight {name!r}")
            full = torch.from_numpy(np.ascontiguousarray(weights[name])).to(t.dtype)
            if isinstance(t, DTensor):
                full = distribute_tensor(full, t.device_mesh, t.placements).to_local()
                t.to_local().copy_(full)
            else:
                t.copy_(full)
        return DistTrainingState("hf", 0, hf_store.url, hf_config, None, None, None, None,
                                 False, None, None,
                                 tuple(_data_sources_fresh(paths)), None)
    step, mdata = picked
    prefix = tree.prefix(step)
    manifest = parse_manifest(mdata, source=store.url_of(prefix))
    key = join(prefix, DIST)
    url = store.url_of(key)
    common, meta = _common(store, key, group)
    saved_world = int(common.get("world_size", 0))
    try:
        saved_topo = effective(check_topology(common.get("topology"), what=f"{url}:{COMMON}"),
                               saved_world, what=f"{url}:{COMMON}")
    except UsageError as e:
        raise DocumentError(f"{url}:{COMMON}", str(e)) from None
    sharding = common.get("optimizer_sharding_type")
    saved_keys = _saved_keys(meta)
    sd: dict[str, Any] = {MODEL_KEY + k: v for k, v in model.items()}
    _check_lacking(saved_keys, MODEL_KEY, model, url, partial, what="model parameter")
    fill = None
    if optimizer_state is not None:
        if sharding == "fully_reshardable":
            sd.update({OPT_FULL + k: v for k, v in optimizer_state.items()})
            _check_lacking(saved_keys, OPT_FULL, optimizer_state, url, partial,
                           what="optimizer state")
        elif any(k.startswith("optimizer.dp_shard.rank") for k in saved_keys):
            _check_same(saved_topo, saved_world, topo, world, url)  # an earlier version's
            prefix_dp = OPT_DP.format(rank=rank)
            sd.update({prefix_dp + k: _local(v) for k, v in optimizer_state.items()})
        else:
            check_dp_only(saved_topo, topo, url=url)
            reads, fill = plan_bucket_load(saved_keys, optimizer_state, topo, rank, group,
                                           url=url, partial=partial)
            sd.update(reads)
    src, why = rng_rank(saved_topo, topo, rank)
    rng_key = RNG_KEY.format(rank=src)
    if src is not None and rng_key not in meta.state_dict_metadata:
        src, why = None, f"no RNG state was saved for rank {src}"
    if src is None:
        warnings.warn(f"{store.url_of(prefix)}: {why}: RNG state is not restored; model, "
                      "optimizer, scheduler and data source state are", RngSkippedWarning,
                      stacklevel=2)
    else:
        sd[rng_key] = b""
    load_dcp(store, key, sd, process_group=group, verify=False)
    if fill is not None:
        fill()
    rng = json.loads(sd[rng_key]) if src is not None else None
    data, pipeline = read_data_state(store, prefix, manifest, paths)
    return DistTrainingState("checkpoint", step, store.url_of(prefix), hf_config,
                             common.get("optimizer"), sharding, common.get("scheduler_state"),
                             rng, src is not None, saved_topo, saved_world, data, manifest,
                             pipeline)


def _check_lacking(saved: Mapping[str, Any], prefix: str, templates: Mapping[str, Any],
                   url: str, partial: bool, *, what: str) -> None:
    """A saved ``prefix`` entry the templates lack is an error unless ``partial``."""
    lacking = sorted(k[len(prefix):] for k in saved
                     if k.startswith(prefix) and k[len(prefix):] not in templates)
    if lacking and not partial:
        raise CheckpointError(f"{url}: the checkpoint holds {what} {lacking[0]!r} that this "
                              f"run's templates lack ({len(lacking)} in all; pass "
                              "partial=True to resume without them)")


def _check_same(saved: Mapping[str, int], saved_world: int, topo: Mapping[str, int],
                world: int, url: str) -> None:
    if dict(saved) != dict(topo) or saved_world != world:
        raise CheckpointError(
            f"{url}: saved by an earlier version with "
            f"megatron.optimizer_sharding_type=dp_reshardable at {describe(saved)}; its "
            f"per-rank shards cannot be resumed at {describe(topo)}: resume at the saved "
            "topology, or save with megatron.optimizer_sharding_type=fully_reshardable")


def _data_sources_fresh(paths: list[str]) -> list[Any]:
    return [DataSourceState(p, None, None) for p in paths]

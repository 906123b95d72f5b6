"""LoongSage ``dist_ckpt/`` written and read through torch.distributed.checkpoint
(seed 003 sections 3, 4.3, 4.4; DESIGN section 1: Megatron's "torch_dist").

Every rank of the job calls the same methods (they are collective)::

    ckpt = DistLoongSageCheckpointer(store, "exp", save_freq=10, total_steps=100,
                                     topology={"tp": 2},
                                     optimizer_sharding_type="fully_reshardable")
    ckpt.maybe_save(step, model={"w": w_dtensor, ...},
                    optimizer_state={"w.exp_avg": ..., "w.exp_avg_sq": ...},
                    scheduler_state={...}, rng_state=[...], data_sources=[...])
    ckpt.finish()

    state = resume_dist(store, "exp", model=templates, optimizer_state=opt_templates,
                        hf_model_path="/models/base", topology={"tp": 3})

What ``train_step_<N>/dist_ckpt/`` holds: DCP's ``__<rank>_<i>.distcp`` shards
and ``.metadata``, of one state dict with these keys:

``model.<name>``
    parameters: DTensors (any placements; DCP reshards them on load) or tensors
    (replicated: written once);
``optimizer.state.<name>.<field>``
    ``fully_reshardable``: the optimizer state in the parameters' full shapes
    and shardings, reshardable to any topology;
``optimizer.dp_bucket.tp<t>_pp<p>_ep<e>.dp<d>.<name>``
    ``dp_reshardable`` (the seed's default): each rank's local optimizer piece
    as it is, flattened, no communication; resumable at any DP size with the
    saved TP/PP/EP sizes (:mod:`registry.checkpoint.loongsage_dp`; saves of
    earlier versions, ``optimizer.dp_shard.rank<r>.*``, only at the saved
    topology and world size);
``common``
    JSON bytes: step, topology, world size, optimizer, sharding type, scheduler state;
``rng.rank<r>``
    JSON bytes: rank ``r``'s RNG state, restored by the rank at the same
    TP/PP/EP/DP position when the TP and PP sizes are the saved ones.

Atomicity: rank 0 claims the step (a staging directory locally, a claim on
object stores), every rank writes its shards with DCP (hashing them as it
writes), DCP's own gather makes rank 0 write ``.metadata``, the shard entries
are gathered, and rank 0 writes MANIFEST.json and commits; the tracker moves
after that (the seed's finalize). A rank killed at any moment leaves no
MANIFEST.json: the survivors' collectives fail and rank 0 removes the staged files.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor

from registry.checkpoint.dist import broadcast, gather_entries, rank_of, world_of
from registry.checkpoint.layout import LOONGSAGE
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
    read_dist,
    read_full,
)
from registry.checkpoint.loongsage_dcp_resume import DistTrainingState, load_dcp, resume_dist
from registry.checkpoint.loongsage_dp import bucket_entries, effective
from registry.checkpoint.loongsage_format import DIST, HF
from registry.checkpoint.loongsage_hf import (
    INDEX,
    check_placements,
    gather_owned,
    read_hf_files,
    write_shard,
)
from registry.checkpoint.loongsage_hf import plan as hf_plan
from registry.checkpoint.loongsage_save import LoongSageCheckpointer, LoongSaveResult, _Landed
from registry.checkpoint.loongsage_torchdist import write_dcp
from registry.checkpoint.state import OPTIMIZERS
from registry.protocol.commit import DirectoryWriter
from registry.errors import CheckpointError, UsageError
from registry.protocol.layout import staging_prefix
from registry.protocol.manifest import FileEntry, check_path, parse_manifest
from registry.store import Store, join

#: Resuming and reading live in loongsage_dcp_resume / loongsage_dcp_read; their
#: public names stay importable from here.
__all__ = ["COMMON", "FORMAT", "MODEL_KEY", "OPT_DP", "OPT_FULL", "RNG_KEY", "SHARDING_TYPES",
           "DistLoongSageCheckpointer", "DistTrainingState", "check_sharding", "load_dcp",
           "read_dist", "read_full", "resume_dist"]

SHARDING_TYPES = ("dp_reshardable", "fully_reshardable")


def check_sharding(value: str) -> str:
    """``megatron.optimizer_sharding_type``. Raises UsageError for another value."""
    if value not in SHARDING_TYPES:
        raise UsageError(f"megatron.optimizer_sharding_type {value!r} must be one of "
                         f"{', '.join(SHARDING_TYPES)}")
    return value


def _json_bytes(doc: Any, *, what: str) -> bytes:
    def default(v: Any) -> Any:
        if isinstance(v, torch.Tensor | np.ndarray):
            return v.tolist()
        if isinstance(v, np.generic):
            return v.item()
        raise TypeError(f"{type(v).__name__} is not JSON serializable")
    try:
        return json.dumps(doc, allow_nan=False, default=default).encode()
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{what}: not JSON-serializable: {e}") from None


def _tensor(value: Any, *, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    raise CheckpointError(f"{what}: {type(value).__name__} is not a tensor")


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A snapshot of ``t`` the caller may change at once (DTensors stay DTensors)."""
    return t.clone()


def _agree_gather(group: Any, mine: list[FileEntry] | str) -> list[FileEntry] | None:
    """Every rank's entries on rank 0 (None elsewhere); a rank that failed
    (``mine`` is its error message) fails the save on every rank."""
    err: CheckpointError | None = None
    entries = None
    try:
        entries = gather_entries(mine, group)
    except CheckpointError as e:  # rank 0: some rank failed
        err = e
    failed = broadcast(str(err) if err else None, group)
    if err is not None:
        raise err
    if failed:
        raise CheckpointError(failed)
    return entries


@dataclass(frozen=True, slots=True)
class _DistJob:
    step: int
    state: dict[str, Any]
    docs: dict[str, bytes]


class DistLoongSageCheckpointer(LoongSageCheckpointer):
    """Saves a multi-rank training run's ``dist_ckpt/`` with DCP (see the module).

    Construct it on every rank, in the same order (it creates the process
    group its saves use, so an async save's collectives never interleave with
    training's). Arguments as :class:`LoongSageCheckpointer`, plus:

    Args:
        optimizer_sharding_type: ``megatron.optimizer_sharding_type``:
            ``"dp_reshardable"`` (default, as the seed) or ``"fully_reshardable"``.
        process_group: the ranks saving together; default a new gloo group of
            the whole job.
        thread_count: DCP writer threads per rank.
        hf_model_path: with ``save_hf``: the HF model whose config.json and
            tokenizer files (``generation_config.json``, ``tokenizer.json``,
            ``tokenizer_config.json``, ``special_tokens_map.json``, those
            present) go into each ``hf_model/``; ``hf_config`` given too
            replaces its config.json.

    ``save_hf`` writes ``train_step_<N>/hf_model/`` as Hugging Face sharded
    safetensors, each rank writing the shard of the parameters it owns
    (:mod:`registry.checkpoint.loongsage_hf`), combined freely with
    ``save_checkpoint`` (sync or async) in one commit; only saves with
    ``dist_ckpt/`` move the tracker.

    Raises:
        UsageError: bad switches; ``save_hf`` with neither ``hf_config`` nor
            ``hf_model_path``; a topology that does not fit the world size.
        DocumentError: ``hf_model_path`` has no config.json.

    Notes:
        :meth:`maybe_save` takes, on every rank, ``model`` (name -> DTensor or
        tensor) and ``optimizer_state`` (``<name>.<field>`` -> DTensor or
        tensor, e.g. AdamW's ``exp_avg``/``exp_avg_sq``/``step``); with
        ``fully_reshardable`` a field shaped like its parameter should carry
        the parameter's placements. ``rng_state`` is per rank (JSON, tensors
        become lists); ``scheduler_state`` and ``data_sources`` are rank 0's.
        Only rank 0 holds the writer lease and moves the tracker. With
        ``save_on_preemption`` every ``maybe_save`` is collective even when no
        save is due (the ranks agree on a notice, on a process group of its own).
    """

    def __init__(self, store: str | Store, checkpoint_path: str | None, *,
                 optimizer_sharding_type: str = "dp_reshardable",
                 process_group: Any = None, thread_count: int = 1,
                 hf_model_path: Any = None, **kwargs: Any) -> None:
        self.sharding = check_sharding(optimizer_sharding_type)
        hf_files: dict[str, bytes] = {}
        if kwargs.get("save_hf") and hf_model_path is not None:
            hf_files = read_hf_files(hf_model_path)
            kwargs.setdefault("hf_config", hf_files["config.json"])
        super().__init__(store, checkpoint_path, **kwargs)
        if self.save_hf:
            assert self.hf_config is not None
            hf_files["config.json"] = self.hf_config
            if self.tokenizer is not None:
                hf_files["tokenizer.json"] = self.tokenizer
        self.hf_files = hf_files
        if process_group is None and dist.is_initialized():
            process_group = dist.new_group(backend="gloo")
        self.group = process_group
        if (self.preempt is not None or self.save_every_seconds) and dist.is_initialized():
            # the ranks agree on a notice on the main thread at every maybe_save,
            # while the save's group may be busy on the writer thread
            self._preempt_group = dist.new_group(backend="gloo")
        self.rank = rank_of(self.group)
        self.world = world_of(self.group)
        self.topology = effective(self.topology, self.world,
                                  what=self.store.url_of(self.tree.root))
        self.thread_count = thread_count
        self._snapshots: dict[str, torch.Tensor] = {}

    def finish(self) -> LoongSaveResult | None:
        """Blocking flush (collective when a save is in flight), then release
        the snapshot buffers and, on rank 0, the writer lease."""
        try:
            return super().finish()
        finally:
            self._snapshots.clear()

    close = finish

    def maybe_save(self, step: int, *, model: Mapping[str, Any] | None = None,  # type: ignore[override]
                   optimizer_state: Mapping[str, Any] | None = None,
                   optimizer: str = "adamw", scheduler_state: Any = None,
                   rng_state: Any = None,
                   data_sources: Iterable[Mapping[str, Any]] = (),
                   metrics: Mapping[str, float] | None = None) -> bool:
        """Save ``step`` if due (collective: call it on every rank; ``metrics``:
        rank 0's, as in :meth:`LoongSageCheckpointer.maybe_save`).

        Returns:
            False when no save is due; True once scheduled (async: the tensors
            are copied first) or committed with the tracker moved (sync).

        Raises:
            CheckpointError, UsageError: bad input, on every rank; nothing written.
            RunLeasedError: another process writes this tree (every rank).
            Any error of the previous async save.
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise UsageError(f"step {step!r} must be a non-negative integer")
        preempted, timed = self._decide()  # every rank agrees (module preempt)
        if not (preempted or timed) and not self.should_save(step):
            return False
        where = self.store.url_of(self.tree.prefix(step))
        if not model:
            raise CheckpointError(f"{where}: no model parameters given")
        if optimizer not in OPTIMIZERS:
            raise CheckpointError(f"{where}: optimizer {optimizer!r} is not one of "
                                  f"{', '.join(OPTIMIZERS)}")
        if optimizer_state is None and self.save_checkpoint:
            raise CheckpointError(f"{where}: save_checkpoint needs optimizer_state")
        docs = {rel: data for rel, data in
                self._documents(step, None, None, data_sources, where, metrics).items()
                if not rel.startswith(f"{DIST}/")}
        self.wait()  # at most one save in flight; raises a previous failure
        state = self._state_dict(step, model, optimizer_state if self.save_checkpoint else {},
                                 optimizer, scheduler_state, rng_state, where)
        if self.save_hf:
            tensors = {k[len(MODEL_KEY):]: v for k, v in state.items() if k.startswith(MODEL_KEY)}
            check_placements(tensors, where=f"{where}/{HF}")
            docs[f"{HF}/{INDEX}"] = hf_plan(tensors, self.world)[2]
            docs.update({f"{HF}/{name}": data for name, data in self.hf_files.items()})
        _agree(self.group, self.lease.hold)
        job = _DistJob(step, state, docs if self.rank == 0 else {})
        return self._dispatch(self._write_dist, job, step, preempted)

    def _state_dict(self, step: int, model: Mapping[str, Any], opt: Mapping[str, Any],
                    optimizer: str, scheduler_state: Any, rng_state: Any,
                    where: str) -> dict[str, Any]:
        sd: dict[str, Any] = {}
        for name, value in model.items():
            sd[MODEL_KEY + name] = _tensor(value, what=f"{where}: model {name!r}")
        opt_t = {name: _tensor(value, what=f"{where}: optimizer state {name!r}")
                 for name, value in opt.items()}
        if self.sharding == "fully_reshardable":
            sd.update({OPT_FULL + name: t for name, t in opt_t.items()})
        else:
            sd.update(bucket_entries(opt_t, self.topology, self.rank))
        if self.async_save:
            sd = {k: self._snapshot_tensor(k, t) for k, t in sd.items()}
        common = {"format": FORMAT, "step": step, "topology": self.topology,
                  "world_size": self.world, "optimizer": optimizer,
                  "optimizer_sharding_type": self.sharding, "rank_order": "tp-ep-dp-pp",
                  "scheduler_state": scheduler_state}
        sd[COMMON] = _json_bytes(common, what=f"{where}: scheduler_state")
        sd[RNG_KEY.format(rank=self.rank)] = _json_bytes(rng_state, what=f"{where}: rng_state")
        return sd

    def _snapshot_tensor(self, key: str, t: torch.Tensor) -> torch.Tensor:
        """A copy of ``t`` the caller may change at once, into the buffer of
        the previous save when it matches (that save has landed: at most one
        is in flight), so that a save does not fault in fresh memory."""
        bufs = self._snapshots
        buf = bufs.get(key)
        same = (buf is not None and type(buf) is type(t) and buf.shape == t.shape
                and buf.dtype == t.dtype and buf.stride() == t.stride())
        if same and isinstance(t, DTensor):
            assert isinstance(buf, DTensor)
            same = (buf.placements == t.placements and buf.device_mesh == t.device_mesh
                    and buf.to_local().shape == t.to_local().shape)
        if not same:
            bufs[key] = buf = _copy(t)
            return buf
        assert buf is not None
        _local(buf).copy_(_local(t))
        return buf

    def _write_dist(self, job: _DistJob) -> _Landed:
        if self.rank != 0:
            return self._write_collective(job)
        with self.lease.renewing():
            return self._write_collective(job)

    def _write_collective(self, job: _DistJob) -> _Landed:
        t0 = time.perf_counter()
        prefix = self.tree.prefix(job.step)
        with ExitStack() as stack:
            holder: list[DirectoryWriter] = []

            def begin() -> str:
                if self.keep > 0 and self.retention is None:
                    self.tree.retain_or_warn(self.keep, writer=self.lease.owner)
                self.tree.clear_for_save(job.step)
                staging = (staging_prefix(prefix, self.lease.owner[:12])
                           if self.store.atomic_rename else None)
                w = stack.enter_context(DirectoryWriter(
                    self.store, prefix, kind="checkpoint",
                    meta={"run_id": self.run_id, "step": job.step, "layout": LOONGSAGE.name},
                    staging=staging, sole_writer=True))
                holder.append(w)
                return w.staging

            target = _agree(self.group, begin)
            mine: list[FileEntry] | str = []
            meta = None
            if self.save_checkpoint:
                mine, meta = write_dcp(self.store, target, job.state, group=self.group,
                                       rank=self.rank, thread_count=self.thread_count)
            if self.save_hf:
                mine = self._write_hf(job, target, mine)
            entries = _agree_gather(self.group, mine)

            def commit() -> bytes:
                w = holder[0]
                assert entries is not None
                if meta is not None:
                    entries.append(meta)
                for e in entries:
                    check_path(e.path, source=self.store.url_of(prefix))
                    w.entries[e.path] = e
                for rel, data in job.docs.items():
                    w.write_bytes(rel, data)
                return w.commit().to_bytes()

            data = _agree(self.group, commit)
        manifest = parse_manifest(data, source=self.store.url_of(prefix))
        return _Landed(job.step, prefix, manifest, time.perf_counter() - t0)

    def _write_hf(self, job: _DistJob, target: str,
                  mine: list[FileEntry] | str) -> list[FileEntry] | str:
        """This rank's shard of ``hf_model/`` (:mod:`registry.checkpoint.loongsage_hf`;
        collective: one gather per sharded parameter, even after a failure here,
        so that no rank waits for a peer that skipped one)."""
        model = {k[len(MODEL_KEY):]: v for k, v in job.state.items() if k.startswith(MODEL_KEY)}
        own, files, _ = hf_plan(model, self.world)
        full = gather_owned(model, own, self.rank, self.group)
        if isinstance(mine, str) or not full:
            return mine
        try:
            return [*mine, write_shard(self.store, target, files[self.rank], full)]
        except Exception as e:  # noqa: BLE001 - passed to rank 0, which fails the save
            return f"{type(e).__name__}: {e}"
        finally:
            full.clear()

    def _finalize(self, landed: _Landed) -> None:
        if self.rank == 0:
            super()._finalize(landed)
            return
        parts = tuple(p for p, on in ((DIST, self.save_checkpoint), (HF, self.save_hf)) if on)
        result = LoongSaveResult(landed.step, self.store.url_of(landed.prefix),
                                 landed.manifest.digest, landed.manifest.total_size,
                                 landed.seconds, self.save_checkpoint, parts)
        self.saved.append(result)
        self._last_save = time.monotonic()  # save_every_seconds: every rank's timer
        for hook in self.on_commit:
            hook(result)


# -- loading ---------------------------------------------------------------------------


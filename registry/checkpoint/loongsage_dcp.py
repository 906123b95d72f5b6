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
import pickle
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
from torch.distributed.tensor import DTensor, distribute_tensor

from registry.checkpoint.dist import (
    broadcast,
    gather_entries,
    hash_object,
    local_staging,
    metadata_key,
    rank_of,
    storage_reader,
    storage_writer,
    upload_staged,
    world_of,
    written_entries,
)
from registry.checkpoint.layout import LOONGSAGE
from registry.checkpoint.loongsage_data import DataStateLookup, read_data_state
from registry.checkpoint.loongsage_dp import (
    bucket_entries,
    check_dp_only,
    describe,
    effective,
    plan_bucket_load,
    rng_rank,
)
from registry.checkpoint.loongsage_format import (
    DIST,
    HF,
    RngSkippedWarning,
    check_topology,
)
from registry.checkpoint.loongsage_hf import INDEX, gather_owned, read_hf_files, write_shard
from registry.checkpoint.loongsage_hf import plan as hf_plan
from registry.checkpoint.loongsage_save import LoongSageCheckpointer, LoongSaveResult, _Landed
from registry.checkpoint.state import OPTIMIZERS
from registry.checkpoint.tree import CheckpointTree
from registry.commit import DirectoryWriter
from registry.errors import CheckpointError, DocumentError, UsageError
from registry.manifest import FileEntry, Manifest, check_path, parse_manifest
from registry.store import Store, join, open_store

SHARDING_TYPES = ("dp_reshardable", "fully_reshardable")
MODEL_KEY = "model."
OPT_FULL = "optimizer.state."
OPT_DP = "optimizer.dp_shard.rank{rank}."
COMMON = "common"
RNG_KEY = "rng.rank{rank}"
FORMAT = "loongsage-torch-dist"


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
        Only rank 0 holds the writer lease and moves the tracker.
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
                   data_sources: Iterable[Mapping[str, Any]] = ()) -> bool:
        """Save ``step`` if due (collective: call it on every rank).

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
        if not self.should_save(step):
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
                self._documents(step, None, None, data_sources, where).items()
                if not rel.startswith(f"{DIST}/")}
        self.wait()  # at most one save in flight; raises a previous failure
        state = self._state_dict(step, model, optimizer_state if self.save_checkpoint else {},
                                 optimizer, scheduler_state, rng_state, where)
        if self.save_hf:
            tensors = {k[len(MODEL_KEY):]: v for k, v in state.items() if k.startswith(MODEL_KEY)}
            docs[f"{HF}/{INDEX}"] = hf_plan(tensors, self.world)[2]
            docs.update({f"{HF}/{name}": data for name, data in self.hf_files.items()})
        _agree(self.group, self.lease.hold)
        job = _DistJob(step, state, docs if self.rank == 0 else {})
        if self.async_save:
            self._pending = self._pool.submit(self._write_dist, job)
        else:
            self._finalize(self._write_dist(job))
        return True

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
                if self.keep > 0:
                    self.tree.retain_or_warn(self.keep, writer=self.lease.owner)
                self.tree.clear_for_save(job.step)
                staging = (f"{prefix}.tmp-{self.lease.owner[:12]}"
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
                mine, meta = self._write_dcp(job, target)
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

    def _write_dcp(self, job: _DistJob, target: str) -> tuple[list[FileEntry] | str,
                                                               FileEntry | None]:
        """This rank's DCP shards of ``dist_ckpt/`` (collective): their
        entries (or the error message), and on rank 0 the ``.metadata`` entry."""
        # local disk: DCP writes into the staging directory itself; object
        # stores: on local disk first, then each rank uploads its own files
        direct = self.store.atomic_rename and self.store.local_path(target) is not None
        where = nullcontext((self.store, target)) if direct else local_staging()
        with where as (wstore, wkey):
            writer = storage_writer(wstore, join(wkey, DIST), thread_count=self.thread_count)
            with _single_process():
                dcp.save(job.state, storage_writer=writer, process_group=self.group,
                         no_dist=not dist.is_initialized())
            mine: list[FileEntry] | str = written_entries(writer, DIST)
            meta = None
            try:
                if self.rank == 0:
                    meta = hash_object(wstore, metadata_key(wkey, DIST), f"{DIST}/.metadata")
                if not direct:
                    names = [e.path.rsplit("/", 1)[1] for e in mine]  # type: ignore[union-attr]
                    upload_staged(self.store, str(wstore.local_path(join(wkey, DIST))),
                                  join(target, DIST), names + ([".metadata"] if meta else []))
            except Exception as e:  # noqa: BLE001 - passed to rank 0, which fails the save
                mine = f"{type(e).__name__}: {e}"
        return mine, meta

    def _write_hf(self, job: _DistJob, target: str,
                  mine: list[FileEntry] | str) -> list[FileEntry] | str:
        """This rank's shard of ``hf_model/`` (:mod:`registry.checkpoint.loongsage_hf`;
        collective: one gather per sharded parameter, even after a failure here,
        so that no rank waits for a peer that skipped one)."""
        model = {k[len(MODEL_KEY):]: v for k, v in job.state.items() if k.startswith(MODEL_KEY)}
        own, files, _ = hf_plan(model, self.world)
        full = gather_owned(model, own, self.rank)
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
        for hook in self.on_commit:
            hook(result)


# -- loading ---------------------------------------------------------------------------


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
        dcp.load(sd, storage_reader=reader, process_group=group,
                 no_dist=not dist.is_initialized())
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
    from registry.checkpoint.loongsage_load import _verify_entries
    from registry.verify import read_manifest

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
            dcp.load(state_dict, storage_reader=reader,
                     process_group=group, no_dist=not dist.is_initialized())
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
    from registry.checkpoint.loongsage_load import (
        _hf_config,
        _hf_weights,
        _source_paths,
        _store_is_new,
        _verified_step,
    )

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
    from registry.checkpoint.loongsage_load import DataSourceState

    return [DataSourceState(p, None, None) for p in paths]


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
            dcp.load(sd, storage_reader=reader, no_dist=True)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{store.url_of(key)}: DCP could not load it: {e}") from None
    return {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in sd.items()}


def read_dist(store: Store, prefix: str, manifest: Manifest, step: int, *,
              optimizer: bool) -> Any:
    """A verified step's DCP ``dist_ckpt/`` as a
    :class:`~registry.checkpoint.loongsage_load.DistCheckpoint` (numpy, full
    shapes), for single-process readers (:func:`load_dist_ckpt`,
    :func:`load_training_state`).

    ``model``: the ``model.<name>`` tensors, or every tensor when no key has
    that prefix (a tree written by another DCP program); ``optimizer_state``:
    the ``fully_reshardable`` state (None for ``dp_reshardable``, whose shards
    only a job of the saved topology can use, and for foreign trees).

    Raises:
        CheckpointError: DCP could not read it, or it holds no tensors.
    """
    from registry.checkpoint.loongsage_load import DistCheckpoint

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

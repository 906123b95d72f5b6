"""A small tensor-parallel-like training job on CPU ranks (tests/test_loongsage_dcp.py).

``python tests/support/dcp_child.py URL CKPT_PATH HF_DIR --world W --steps N [options]``

Imports torch once, then forks W real rank processes (gloo on localhost, a
free port) and waits for them; exits 0 when every rank did, else prints each
rank's exit status (``RANK r EXIT c``; ``-9``: SIGKILL) and exits 1. The S3
endpoint comes from the inherited ``AWS_*`` variables.

The model: ``col.weight`` [10, 6] and ``col.bias`` [10] sharded along dim 0,
``row.weight`` [6, 10] sharded along dim 1 (a column/row parallel pair, DTensor
``Shard``), ``norm.weight`` [6] replicated (a plain tensor). Each step adds
per-rank RNG noise to the gradients (so an RNG restore matters) and takes an
AdamW step whose state is held in DTensors shaped like the parameters.

With ``--dp`` the ranks are data parallel instead (topology ``{"dp": W}``):
every parameter is replicated (a plain tensor), and each rank's AdamW state
is its contiguous piece of each parameter's flattened state (Megatron's
distributed optimizer: ``<name>.exp_avg`` is a 1-D tensor, the rank's range);
each rank updates its range of the parameters and an all-reduce assembles them.

Options:
  --save-hf                 also export hf_model/ (config and tokenizer from HF_DIR)
  --no-checkpoint           save_checkpoint off (with --save-hf: HF exports only)
  --shapes-from-hf          the model is HF_DIR's model.safetensors (names, shapes, initial
                            values); tensors of 2 or more dimensions sharded along dim 0
  --dp                      data parallel ranks (see above)
  --sharding dp_reshardable|fully_reshardable
  --sync                    sync saves (default async)
  --save-freq K
  --stop-after S            finish (flush) after step S and exit 0: a job that ends early
  --kill RANK:EVENT:STEP    SIGKILL rank RANK at EVENT of step STEP's save, EVENT one of
                            ``write`` (first shard write), ``gather`` (shards written, before
                            the entries are gathered), ``commit`` (rank 0, before MANIFEST.json),
                            ``hfwrite`` (in the rank's HF shard write)
  --template TWEAK          resume with a changed template: ``extra`` (a model entry the
                            checkpoint lacks), ``shape`` (norm.weight [7]), ``lack`` (no
                            norm.weight), ``lack-partial`` (the same, partial=True)
  --allreduce K             K all-reduces per step on the default group (training's
                            collectives: a data-parallel step's gradient sync), before and
                            after the step's save is scheduled
  --dump-steps DIR          rank 0 writes each step's full parameters to DIR/step-<N>.pt
                            (a full_tensor per parameter on the mesh: training's group)
  --record-collectives      record every collective's group and thread
                            (tests/support/collectives.py); each rank prints
                            ``FOREIGN <thread> <group> <function>`` for a collective issued
                            inside a save on a group other than the save's own, and
                            ``SAVECALLS <n>`` (collectives issued inside saves)
  --preempt                 save_on_preemption: a SIGTERM saves the step it arrived in
                            (every rank agrees), then the rank exits 143 printing
                            ``PREEMPTED <step>``
  --sigterm RANK:STEP       rank RANK sends itself SIGTERM in the middle of step STEP
                            (after its update, before the step's maybe_save)
  --save-every-seconds T    save_every_seconds (a save once T seconds passed since the last)
  --step-sleep S            each step sleeps S seconds (rank r: S * (r + 1)) before its save
  --pg-timeout S            the process groups' timeout in seconds (default 600)
  --out FILE                rank 0 writes the final full parameters and AdamW state (torch.save)
  --dump-resumed FILE       the same, right after resuming (before any step)

Prints ``RESUMED <source> <step> <rng_restored>`` and ``COMMITTED <step>``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
import warnings
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from registry.checkpoint import dist as regdist
from registry.checkpoint import loongsage_dcp
from registry.checkpoint.loongsage_dcp import DistLoongSageCheckpointer, resume_dist
from registry.checkpoint.preempt import Preempted
from registry.protocol.commit import DirectoryWriter
from registry.formats.safetensors_io import write_safetensors
from registry.store import open_store

SHAPES = {"col.weight": ((10, 6), 0), "col.bias": ((10,), 0), "row.weight": ((6, 10), 1),
          "norm.weight": ((6,), None)}
PROMPTS = "data/prompts.jsonl"


def initial() -> dict[str, np.ndarray]:
    g = np.random.default_rng(0)
    return {k: g.standard_normal(shape, dtype=np.float32) for k, (shape, _) in SHAPES.items()}


def write_hf(path: str) -> None:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"model_type": "toy", "hidden_size": 6}, f)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        write_safetensors(f, initial(), metadata={"format": "pt"})


def arm_kill(spec: str, rank: int, current: dict[str, int]) -> None:
    who, event, step = spec.split(":")
    if int(who) != rank:
        return

    def die(what: str) -> None:
        print(f"KILL rank {rank} at {what} of step {current['saving']}", file=sys.stderr,
              flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    def due() -> bool:
        return current["saving"] == int(step)

    write_collective = DistLoongSageCheckpointer._write_collective

    def saving(self: DistLoongSageCheckpointer, job: object) -> object:
        current["saving"] = job.step  # type: ignore[attr-defined]
        return write_collective(self, job)  # type: ignore[arg-type]
    DistLoongSageCheckpointer._write_collective = saving  # type: ignore[method-assign]

    if event == "write":
        write = regdist._HashingStream.write

        def dying_write(self: object, data: object) -> int:
            if due():
                die("write")
            return write(self, data)  # type: ignore[arg-type]
        regdist._HashingStream.write = dying_write  # type: ignore[method-assign]
    elif event == "gather":
        gather = loongsage_dcp.gather_entries

        def dying_gather(*a: object, **k: object) -> object:
            if due():
                die("gather")
            return gather(*a, **k)  # type: ignore[arg-type]
        loongsage_dcp.gather_entries = dying_gather  # type: ignore[assignment]
    elif event == "hfwrite":
        from registry.checkpoint import loongsage_hf

        hf_write = loongsage_hf.write_safetensors

        def dying_hf_write(fileobj: object, tensors: object, **kw: object) -> int:
            if due():  # some bytes out, the rest never
                fileobj.write(b"\0" * 4096)  # type: ignore[attr-defined]
                die("hfwrite")
            return hf_write(fileobj, tensors, **kw)  # type: ignore[arg-type]
        loongsage_hf.write_safetensors = dying_hf_write  # type: ignore[assignment]
    elif event == "commit":
        commit = DirectoryWriter.commit

        def dying_commit(self: DirectoryWriter) -> object:
            if due():
                die("commit")
            return commit(self)
        DirectoryWriter.commit = dying_commit  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown kill event {event}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("ckpt")
    ap.add_argument("hf")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--save-freq", type=int, default=1)
    ap.add_argument("--sharding", default="fully_reshardable")
    ap.add_argument("--sync", action="store_true")
    ap.add_argument("--stop-after", type=int)
    ap.add_argument("--kill")
    ap.add_argument("--out")
    ap.add_argument("--dump-resumed")
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--dp", action="store_true")
    ap.add_argument("--save-hf", action="store_true")
    ap.add_argument("--no-checkpoint", action="store_true")
    ap.add_argument("--shapes-from-hf", action="store_true")
    ap.add_argument("--template")
    ap.add_argument("--allreduce", type=int, default=0)
    ap.add_argument("--dump-steps")
    ap.add_argument("--record-collectives", action="store_true")
    ap.add_argument("--pg-timeout", type=float, default=600)
    ap.add_argument("--preempt", action="store_true")
    ap.add_argument("--sigterm")
    ap.add_argument("--save-every-seconds", type=float, default=0.0)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    a = ap.parse_args()
    port = free_port()
    pids = {}
    for rank in range(a.world):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.environ.update(RANK=str(rank), WORLD_SIZE=str(a.world),
                                  MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                run(a)
                code = 0
            except Preempted as e:
                say(f"RANK {rank} PREEMPTED {e.step}")
                code = int(e.code)  # type: ignore[arg-type]
            except BaseException as e:  # noqa: BLE001 - reported as the rank's exit
                say(f"RANK {rank} ERROR {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            finally:
                sys.stdout.flush()
                os._exit(code)
        pids[pid] = rank
    failed = False
    for _ in range(a.world):
        pid, status = os.wait()
        code = os.waitstatus_to_exitcode(status)
        say(f"RANK {pids[pid]} EXIT {code}")
        failed |= code != 0
    sys.exit(1 if failed else 0)


def dp_range(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous range of ``n`` elements (np.array_split's)."""
    bounds = np.array_split(np.arange(n), world)
    part = bounds[rank]
    start = int(part[0]) if len(part) else int(sum(len(b) for b in bounds[:rank]))
    return start, start + len(part)


def dp_full(piece: torch.Tensor, shape: tuple[int, ...], rank: int, world: int) -> torch.Tensor:
    """The full tensor of every rank's ``piece`` (an all-reduce of zero-filled
    buffers: exact, x + 0 == x)."""
    full = torch.zeros(int(np.prod(shape)))
    lo, hi = dp_range(full.numel(), rank, world)
    full[lo:hi] = piece
    dist.all_reduce(full)
    return full.view(shape)


def dump(model: dict[str, torch.Tensor], opt: dict[str, torch.Tensor], path: str,
         rank: int, dp: bool = False) -> None:
    """Full tensors (a collective), written by rank 0."""
    if dp:
        world = dist.get_world_size()
        opt = {k: (dp_full(v, SHAPES[k.rsplit(".", 1)[0]][0], rank, world) if v.dim() else v)
               for k, v in opt.items()}
    full = {k: (v.full_tensor() if isinstance(v, DTensor) else v.clone())
            for k, v in {**{f"model.{k}": v for k, v in model.items()},
                         **{f"optimizer.state.{k}": v for k, v in opt.items()}}.items()}
    if rank == 0:
        torch.save(full, path)


def say(line: str) -> None:
    """One line on stdout in one write (ranks share the pipe)."""
    os.write(1, (line + "\n").encode())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shapes_from_hf(path: str) -> None:
    """SHAPES (and so initial()) from an HF model.safetensors."""
    from registry.formats.safetensors_io import read_safetensors

    with open(os.path.join(path, "model.safetensors"), "rb") as f:
        tensors, _ = read_safetensors(f, path=path, file_size=os.fstat(f.fileno()).st_size)
    SHAPES.clear()
    SHAPES.update({k: (tuple(v.shape), 0 if v.ndim >= 2 else None)
                   for k, v in sorted(tensors.items())})


def run(a: argparse.Namespace) -> None:
    warnings.simplefilter("always")
    if a.shapes_from_hf:
        shapes_from_hf(a.hf)
    dist.init_process_group("gloo", timeout=timedelta(seconds=a.pg_timeout))
    if a.record_collectives:
        from tests.support import collectives

        collectives.install()
        for m in ("maybe_save", "wait", "finish", "on_step_start"):
            setattr(DistLoongSageCheckpointer, m,
                    collectives.saving(getattr(DistLoongSageCheckpointer, m)))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    current = {"saving": -1}
    if a.kill:
        arm_kill(a.kill, rank, current)
    if rank == 0 and not os.path.exists(os.path.join(a.hf, "config.json")):
        write_hf(a.hf)
    if rank == 0:
        open_store(a.url).ensure_root()
    dist.barrier()

    def place(full: torch.Tensor, dim: int | None) -> torch.Tensor:
        if dim is None or a.dp:
            return full.clone()
        return distribute_tensor(full, mesh, [Shard(dim)])

    def opt_place(full: torch.Tensor, dim: int | None) -> torch.Tensor:
        if not a.dp:
            return place(full, dim)
        lo, hi = dp_range(full.numel(), rank, world)
        return full.reshape(-1)[lo:hi].clone()

    zeros = {k: torch.zeros(shape) for k, (shape, _) in SHAPES.items()}
    model = {k: place(zeros[k], SHAPES[k][1]) for k in SHAPES}
    opt = {}
    for k, (_, dim) in SHAPES.items():
        opt[f"{k}.exp_avg"] = opt_place(zeros[k], dim)
        opt[f"{k}.exp_avg_sq"] = opt_place(zeros[k], dim)
    opt["step"] = torch.zeros((), dtype=torch.float32)
    topology = {"dp": world} if a.dp else {"tp": world}
    templates = dict(model)
    if a.template == "extra":
        templates["extra.weight"] = torch.zeros(3)
    elif a.template == "shape":
        templates["norm.weight"] = torch.zeros(7)
    elif a.template in ("lack", "lack-partial"):
        del templates["norm.weight"]
    st = resume_dist(a.url, a.ckpt, model=templates, optimizer_state=opt, hf_model_path=a.hf,
                     data_sources=[PROMPTS], topology=topology,
                     partial=a.template == "lack-partial")
    if a.template:
        say(f"RANK {rank} LOADED {st.step}")
        return
    if st.rng_restored:
        torch.set_rng_state(torch.tensor(st.rng_state, dtype=torch.uint8))
    else:
        torch.manual_seed(1000 + rank)
    say(f"RANK {rank} RESUMED {st.source} {st.step} {st.rng_restored}")
    if a.dump_resumed:
        dump(model, opt, a.dump_resumed, rank, a.dp)
    ckpt = DistLoongSageCheckpointer(a.url, a.ckpt, save_freq=a.save_freq,
                                     total_steps=a.steps, async_save=not a.sync,
                                     topology=topology, optimizer_sharding_type=a.sharding,
                                     save_hf=a.save_hf, hf_model_path=a.hf if a.save_hf else None,
                                     save_checkpoint=not a.no_checkpoint,
                                     save_on_preemption=a.preempt,
                                     save_every_seconds=a.save_every_seconds)
    ckpt.on_commit.append(lambda r: say(f"RANK {rank} COMMITTED {r.step}"
                                        f"{'' if r.tracked else ' untracked'}"))
    lr, b1, b2, eps, wd = 0.01, 0.9, 0.999, 1e-8, 0.01

    def training_collectives() -> None:
        for _ in range(a.allreduce):
            dist.all_reduce(torch.ones(257))

    for step in range(st.step + 1, a.steps + 1):
        ckpt.on_step_start()
        training_collectives()
        opt["step"] += 1
        t = float(opt["step"])
        for k, p in (model.items() if a.dp else ()):
            lo, hi = dp_range(p.numel(), rank, world)
            flat = p.view(-1)
            local = flat[lo:hi].clone()
            grad = 0.1 * local + 0.01 * step + 0.05 * torch.randn(local.shape)
            ml, vl = opt[f"{k}.exp_avg"], opt[f"{k}.exp_avg_sq"]
            ml.mul_(b1).add_(grad, alpha=1 - b1)
            vl.mul_(b2).addcmul_(grad, grad, value=1 - b2)
            local.mul_(1 - lr * wd)
            denom = (vl / (1 - b2 ** t)).sqrt_().add_(eps)
            local.addcdiv_(ml, denom, value=-lr / (1 - b1 ** t))
            p.copy_(dp_full(local, tuple(p.shape), rank, world))
        for k, p in (() if a.dp else model.items()):
            local = p.to_local() if isinstance(p, DTensor) else p
            noise = torch.randn(local.shape) if isinstance(p, DTensor) else 0.0
            grad = 0.1 * local + 0.01 * step + 0.05 * noise
            m = opt[f"{k}.exp_avg"]
            v = opt[f"{k}.exp_avg_sq"]
            ml = m.to_local() if isinstance(m, DTensor) else m
            vl = v.to_local() if isinstance(v, DTensor) else v
            ml.mul_(b1).add_(grad, alpha=1 - b1)
            vl.mul_(b2).addcmul_(grad, grad, value=1 - b2)
            local.mul_(1 - lr * wd)
            denom = (vl / (1 - b2 ** t)).sqrt_().add_(eps)
            local.addcdiv_(ml, denom, value=-lr / (1 - b1 ** t))
        if a.step_sleep:
            time.sleep(a.step_sleep * (rank + 1))  # the ranks' timers drift apart
        if a.sigterm and a.sigterm == f"{rank}:{step}":
            os.kill(os.getpid(), signal.SIGTERM)  # a preemption notice, mid-step
        ckpt.maybe_save(step, model=model, optimizer_state=opt,
                        scheduler_state={"lr": lr, "last_step": step},
                        rng_state=torch.get_rng_state(),
                        data_sources=[{"prompt_data_path": PROMPTS,
                                       "state": {"consumed": step * 4}}])
        training_collectives()
        if a.dump_steps:
            full = {k: (v.full_tensor() if isinstance(v, DTensor) else v.clone())
                    for k, v in model.items()}
            if rank == 0:
                torch.save(full, os.path.join(a.dump_steps, f"step-{step}.pt"))
        if a.stop_after == step:
            break
    ckpt.finish()
    if a.record_collectives:
        from tests.support import collectives

        own = {g.group_name for g in (ckpt.group, ckpt._preempt_group) if g is not None}
        for thread, group, fn, _ in collectives.foreign(own):
            say(f"RANK {rank} FOREIGN {thread} {group} {fn}")
        inside = sum(1 for c in collectives.CALLS if c[3] and c[1] in own)
        say(f"RANK {rank} SAVECALLS {inside}")
    if a.out:
        dump(model, opt, a.out, rank, a.dp)
    dist.barrier()
    dist.destroy_process_group()
    say(f"RANK {rank} DONE")


if __name__ == "__main__":
    main()

"""Benchmark: LoongSage dist_ckpt through torch.distributed.checkpoint, 2 ranks.

Run from the repository root::

    python bench/dcp_bench.py                    # 1 GiB model + 2 GiB AdamW, a few minutes
    python bench/dcp_bench.py --model-mib 128    # a quick run
    python bench/dcp_bench.py --model-mib 256 --ranks 2,1 --repeat 3
                                                 # both world sizes in one run

The targets (issue 18 item 7, revised by issue 27 item 8), measured side by
side in this one run, on a local-disk store:

ours / (plain DCP + sha256), 2 ranks
    a sync save by :class:`~registry.checkpoint.loongsage_dcp.DistLoongSageCheckpointer`
    (DCP shards hashed while written, entries gathered, MANIFEST.json, staging
    rename, tracker) against ``torch.distributed.checkpoint.save`` of the same
    state dict into a fresh folder (DCP's FileSystemWriter, files fsynced as
    DCP does by default) followed by the sha256 of the files each rank wrote,
    on the same cores (the manifest's promise; on 2 cores none is idle):
    ratio of medians <= 1.10;
ours / plain DCP, 1 rank (``--ranks 1``: a core to spare)
    ratio of medians <= 1.15;
save_hf (2 ranks)
    a sync save with ``save_checkpoint`` and ``save_hf``
    (:mod:`registry.checkpoint.loongsage_hf`: every rank writes the HF shard
    of the parameters it owns) against plain ``dcp.save`` followed by a
    hand-written HF export: every parameter gathered to rank 0
    (``full_tensor``) and written with ``safetensors.torch.save_file`` (and
    fsynced), and against plain ``dcp.save`` followed by
    torch.distributed.checkpoint's own HF export (``dcp.save`` of the model
    through ``HuggingFaceStorageWriter(save_distributed=True,
    enable_consolidation=True)``: each rank writes its shards, then they are
    consolidated into full-tensor files), each reported as a ratio;
async blocked / sync
    the time the training loop spends in ``maybe_save`` with ``async_save``
    (copying the shards into a snapshot, scheduling) plus ``on_step_start`` is
    at most 10% of a sync save.

The model: ``--model-mib`` of F32 parameters in 16 MiB tensors, each a DTensor
sharded along dim 0 over the 2 ranks (a tensor-parallel-like split), plus AdamW
``exp_avg``/``exp_avg_sq`` of the same shapes and shardings (fully_reshardable):
3x the model in bytes per save. The ranks are forked after one torch import
(gloo on localhost). Each timing is barrier-to-barrier (the slowest rank).
Each round runs plain and ours-sync (in alternating order: neither always
follows the other) then ours-async; old step folders are removed outside the
timed region. ``--s3-mib`` adds the S3 probe behind
docs/decisions.md: DCP's fsspec writer straight into the store against
staging on local disk then uploading each rank's files (moto server). The
result is a JSON document (``--out``) and a table on stdout; exit 0 either way.
``--ranks 2,1`` runs both world sizes one after the other in the same run
(results-dcp.json, results-dcp1.json, and both in results-dcp-ranks.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Shard  # noqa: E402

TENSOR_MIB = 16


def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def state(model_mib: int, rank: int, world: int) -> tuple[dict[str, Any], dict[str, Any]]:
    mesh = init_device_mesh("cpu", (world,))
    rows = TENSOR_MIB * 1024 * 1024 // 4 // 1024  # [rows, 1024] F32 = 16 MiB
    g = torch.Generator().manual_seed(rank)
    model, opt = {}, {}
    for i in range(max(1, model_mib // TENSOR_MIB)):
        def shard() -> DTensor:
            local = torch.rand(rows // world, 1024, generator=g)
            return DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                      shape=torch.Size((rows, 1024)),
                                      stride=(1024, 1))
        model[f"layers.{i}.weight"] = shard()
        opt[f"layers.{i}.weight.exp_avg"] = shard()
        opt[f"layers.{i}.weight.exp_avg_sq"] = shard()
    return model, opt


_SETTLE_BYTES = [0]


def settle() -> None:
    """Untimed, before every timed save: rank 0 writes back every dirty page
    (no save pays for the previous one's writeback), then every rank warms
    the memory its save will allocate (bench.harness.prefault: on these VMs
    a page freed for a few seconds goes back to the host and faulting it in
    again made the same save 2-4x slower at random)."""
    from bench.harness import prefault

    dist.barrier()
    if dist.get_rank() == 0:
        os.sync()
    dist.barrier()
    prefault(_SETTLE_BYTES[0])


def timed(fn: Any) -> float:
    settle()
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


def prune(root: Path, keep: str | None) -> None:
    """Remove step folders but ``keep`` (outside the timings; rank 0)."""
    if not root.exists():
        return
    for p in root.iterdir():
        if p.is_dir() and p.name != keep:
            shutil.rmtree(p, ignore_errors=True)


def rank_main(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    from registry.checkpoint.loongsage_dcp import DistLoongSageCheckpointer

    rank, world = dist.get_rank(), dist.get_world_size()
    model, opt = state(a.model_mib, rank, world)
    _SETTLE_BYTES[0] = a.model_mib * 3 * 1024 * 1024 // world * 5 // 4
    plain_sd = {**{f"model.{k}": v for k, v in model.items()},
                **{f"optimizer.state.{k}": v for k, v in opt.items()}}
    store = str(work / "store")
    sync = DistLoongSageCheckpointer(store, "exp", save_freq=1, total_steps=10**6,
                                     async_save=False, optimizer_sharding_type="fully_reshardable")
    asyn = DistLoongSageCheckpointer(store, "exp", save_freq=1, total_steps=10**6,
                                     async_save=True, optimizer_sharding_type="fully_reshardable")
    hf = DistLoongSageCheckpointer(store, "exp", save_freq=1, total_steps=10**6,
                                   async_save=False, save_hf=True, hf_config={"model_type": "x"},
                                   optimizer_sharding_type="fully_reshardable")
    res: dict[str, list[float]] = {"plain": [], "ours_sync": [], "async_blocked": [],
                                   "async_write": [], "plain_sha256": [], "ours_hf": [],
                                   "plain_hf": [], "plain_dcp_hf": []}
    step = 0
    tree = work / "store" / "exp"
    for rnd in range(a.warmup + a.repeat):
        plain_dir = work / "plain" / f"r{rnd}"

        def plain_arm(then: Callable[[], object] = lambda: None) -> Callable[[], float]:
            """An arm: the plain DCP save and ``then`` (hash or export), timed
            together; the plain folders pruned after."""
            def run() -> float:
                def save_and_then() -> None:
                    dcp.save(plain_sd, checkpoint_id=str(plain_dir))
                    then()
                t = timed(save_and_then)
                if rank == 0:
                    prune(work / "plain", None)
                return t
            return run

        run_plain = plain_arm()
        run_plain_hashed = plain_arm(lambda: sha256_files(plain_dir, rank))
        run_plain_hf = plain_arm(lambda: gather_save_file(model, plain_dir / "hf", rank))
        run_plain_dcp_hf = plain_arm(lambda: dcp_hf_export(model, plain_dir / "hf"))

        def run_with(ck: Any) -> Any:
            def run_ours() -> float:
                t = timed(lambda: ck.maybe_save(step, model=model, optimizer_state=opt))
                if rank == 0:
                    ck.lease.release()
                    prune(tree, f"train_step_{step}")
                return t
            return run_ours

        step += 1
        arms = [("plain", run_plain), ("ours_sync", run_with(sync)),
                ("plain_sha256", run_plain_hashed)]
        if a.hf:
            arms += [("ours_hf", run_with(hf)), ("plain_hf", run_plain_hf),
                     ("plain_dcp_hf", run_plain_dcp_hf)]
        k = rnd % len(arms)  # the order rotates: no arm always follows another
        got = {}
        for name, fn in arms[k:] + arms[:k]:
            got[name] = fn()
            step += 1
        step += 1
        settle()
        dist.barrier()
        t0 = time.perf_counter()
        asyn.on_step_start()
        asyn.maybe_save(step, model=model, optimizer_state=opt)
        blocked = time.perf_counter() - t0
        t1 = time.perf_counter()
        asyn.wait()
        write = time.perf_counter() - t1 + blocked
        asyn.lease.release() if rank == 0 else None
        dist.barrier()
        if rank == 0:
            prune(tree, f"train_step_{step}")
        if rnd >= a.warmup:
            for name, t in got.items():
                res[name].append(t)
            res["async_blocked"].append(blocked)
            res["async_write"].append(write)
    sync.finish()
    asyn.finish()
    hf.finish()
    return {k: v for k, v in res.items() if v}


def sha256_files(folder: Path, rank: int) -> None:
    """The sha256 of the files this rank wrote (rank 0: also .metadata)."""
    import hashlib

    names = [f"__{rank}_0.distcp"] + ([".metadata"] if rank == 0 else [])
    for name in names:
        h = hashlib.sha256()
        with open(folder / name, "rb") as f:
            while block := f.read(8 << 20):
                h.update(block)


def gather_save_file(model: dict[str, Any], folder: Path, rank: int) -> None:
    """The hand-written HF export: every parameter gathered to rank 0 and
    written there as one safetensors file, fsynced."""
    from safetensors.torch import save_file

    full = {k: v.full_tensor() for k, v in sorted(model.items())}
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        save_file(full, str(folder / "model.safetensors"), metadata={"format": "pt"})
        fd = os.open(folder / "model.safetensors", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    del full


def dcp_hf_export(model: dict[str, Any], folder: Path) -> None:
    """torch.distributed.checkpoint's own HF export: ``dcp.save`` through
    ``HuggingFaceStorageWriter`` (every rank writes its shards, then the
    shards are consolidated into full-tensor safetensors files)."""
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    writer = HuggingFaceStorageWriter(str(folder), save_distributed=True,
                                      enable_consolidation=True)
    dcp.save(dict(model), storage_writer=writer)


def s3_probe(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """DCP's fsspec writer into S3 vs local staging + upload (both hashed)."""
    from registry.checkpoint.dist import storage_writer
    from registry.store import open_store

    rank, world = dist.get_rank(), dist.get_world_size()
    model, opt = state(a.s3_mib, rank, world)
    sd = {**{f"model.{k}": v for k, v in model.items()},
          **{f"optimizer.state.{k}": v for k, v in opt.items()}}
    store = open_store(os.environ["BENCH_S3_URL"])
    out: dict[str, list[float]] = {"fsspec_direct": [], "stage_then_upload": []}
    for i in range(a.repeat):
        def direct() -> None:
            w = storage_writer(store, f"direct{i}/dist_ckpt")
            dcp.save(sd, storage_writer=w)

        def staged() -> None:
            local = work / f"stage{i}"
            w = storage_writer(open_store(str(local)), "dist_ckpt")
            dcp.save(sd, storage_writer=w)
            names = [n for n in w.fs.records if n.endswith(".distcp")]
            if rank == 0:
                names.append(".metadata")
            for n in names:
                with open(local / "dist_ckpt" / n, "rb") as f, \
                        store.open_write(f"staged{i}/dist_ckpt/{n}") as g:
                    shutil.copyfileobj(f, g, 8 << 20)
        out["fsspec_direct"].append(timed(direct))
        out["stage_then_upload"].append(timed(staged))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_world(a: argparse.Namespace, world: int) -> tuple[dict[str, Any], list[float],
                                                            list[float]] | None:
    """Fork ``world`` ranks, run the rounds; (rank 0's result, loadavg before, after)."""
    work = Path(tempfile.mkdtemp(prefix="dcp-bench-", dir=os.environ.get("BENCH_DIR")))
    port = free_port()
    before = loadavg()
    pids = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.environ.update(RANK=str(rank), WORLD_SIZE=str(world),
                                  MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                dist.init_process_group("gloo")
                res: dict[str, Any] = {"local": rank_main(a, work)}
                if a.s3_mib:
                    res["s3"] = s3_probe(a, work)
                if rank == 0:
                    (work / "result.json").write_text(json.dumps(res))
                dist.barrier()
                dist.destroy_process_group()
                code = 0
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                os._exit(code)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
    after = loadavg()
    if any(codes):
        print(f"{world} ranks failed: {codes}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
        return None
    raw = json.loads((work / "result.json").read_text())
    shutil.rmtree(work, ignore_errors=True)
    return raw, before, after


def report(a: argparse.Namespace, world: int, raw: dict[str, Any], before: list[float],
           after: list[float]) -> dict[str, Any]:
    """The result document of one world size (medians, ratios, targets)."""
    loc = raw["local"]
    med = {k: statistics.median(v) for k, v in loc.items()}
    ratio = med["ours_sync"] / med["plain"]
    floor = med["ours_sync"] / med["plain_sha256"]
    blocked = med["async_blocked"] / med["ours_sync"]

    def paired_of(a_: str, b_: str) -> float:
        return statistics.median(o / p for o, p in zip(loc[a_], loc[b_], strict=True))
    paired = paired_of("ours_sync", "plain")
    doc: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "cpus": os.cpu_count(),
                    "loadavg_before": before, "loadavg_after": after},
        "ranks": world, "model_mib": a.model_mib,
        "bytes_per_save": a.model_mib * 3 * 1024 * 1024, "repeat": a.repeat,
        "seconds": loc, "median_seconds": med,
        "targets": {
            f"{world}-rank sync save ({a.model_mib} MiB + {2 * a.model_mib} MiB AdamW), s": {
                "ours": med["ours_sync"], "peer": "torch.distributed.checkpoint.save",
                "ratio": ratio, "ratio_paired": paired,
                "target": "<= 1.15" if world == 1 else "(reported)",
                **({"pass": ratio <= 1.15} if world == 1 else {})},
            f"{world}-rank sync save vs dcp.save + sha256 of the same bytes, s": {
                "ours": med["ours_sync"], "peer": "dcp.save + sha256 (same cores)",
                "ratio": floor, "ratio_paired": paired_of("ours_sync", "plain_sha256"),
                "target": "<= 1.10" if world > 1 else "(reported)",
                **({"pass": floor <= 1.10} if world > 1 else {})},
            "async save: loop blocked per save, s": {
                "ours": med["async_blocked"], "peer": "sync save", "ratio": blocked,
                "target": "<= 0.1", "pass": blocked <= 0.10},
        },
    }
    if "ours_hf" in med:
        doc["targets"][f"{world}-rank save_checkpoint + save_hf, s"] = {
            "ours": med["ours_hf"], "peer": "dcp.save + gather to rank 0 + save_file",
            "ratio": med["ours_hf"] / med["plain_hf"],
            "ratio_paired": paired_of("ours_hf", "plain_hf"), "target": "(reported)"}
        if "plain_dcp_hf" in med:
            doc["targets"][f"{world}-rank save_checkpoint + save_hf vs DCP's HF export, s"] = {
                "ours": med["ours_hf"],
                "peer": "dcp.save + dcp.save(HuggingFaceStorageWriter, consolidated)",
                "ratio": med["ours_hf"] / med["plain_dcp_hf"],
                "ratio_paired": paired_of("ours_hf", "plain_dcp_hf"), "target": "(reported)"}
        export = med["plain_hf"] - med["plain"]
        doc["targets"][f"{world}-rank save_hf cost over a checkpoint save, s"] = {
            "ours": med["ours_hf"] - med["ours_sync"], "peer": "hand-written export cost",
            # None when the peer's export cost is lost in the noise (under 10 ms)
            "ratio": (med["ours_hf"] - med["ours_sync"]) / export if export > 0.01 else None,
            "target": "(reported)"}
    if "s3" in raw:
        s3 = {k: statistics.median(v) for k, v in raw["s3"].items()}
        doc["s3_probe"] = {"mib": a.s3_mib, "seconds": raw["s3"], "median_seconds": s3}
        doc["targets"]["s3 DCP write: fsspec direct, s"] = {
            "ours": s3["fsspec_direct"], "peer": "stage locally + upload",
            "ratio": s3["fsspec_direct"] / s3["stage_then_upload"], "target": "(decision)"}
    return doc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--s3-mib", type=int, default=0)
    ap.add_argument("--ranks", default="2",
                    help="world sizes, comma-separated, run one after the other in this "
                         "run (e.g. 2,1: the 2-rank and 1-rank targets side by side)")
    ap.add_argument("--no-hf", dest="hf", action="store_false",
                    help="skip the save_hf arms")
    ap.add_argument("--out", default=str(REPO / "bench" / "results-dcp.json"),
                    help="the result of the first world size; the others go beside it "
                         "(results-dcp<N>.json), all of them to results-dcp-ranks.json")
    a = ap.parse_args()
    worlds = [int(w) for w in str(a.ranks).split(",")]
    server = None
    if a.s3_mib:
        import logging

        import boto3

        from tests.support.s3server import S3Server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)

        server = S3Server(serialize=False).start()
        os.environ.update(server.env())
        boto3.client("s3").create_bucket(Bucket="dcpbench")
        os.environ["BENCH_S3_URL"] = "s3://dcpbench/root"
    docs = []
    try:
        for world in worlds:
            got = run_world(a, world)
            if got is None:
                return 1
            docs.append(report(a, world, *got))
    finally:
        if server is not None:
            server.stop()
    out = Path(a.out)
    for i, doc in enumerate(docs):
        path = out if i == 0 else out.with_name(f"{out.stem}{doc['ranks']}{out.suffix}")
        path.write_text(json.dumps(doc, indent=2) + "\n")
    if len(docs) > 1:
        (out.with_name(f"{out.stem}-ranks{out.suffix}")).write_text(json.dumps(
            {"model_mib": a.model_mib, "repeat": a.repeat,
             "runs": {str(d["ranks"]): d for d in docs}}, indent=2) + "\n")
    for doc in docs:
        for key, t in doc["targets"].items():
            extra = f" (paired {t['ratio_paired']:.3f})" if "ratio_paired" in t else ""
            r = "n/a" if t["ratio"] is None else f"{t['ratio']:.3f}"
            print(f"{key:58} {t['ours']:.3f}  vs {t['peer']}: ratio {r}{extra} "
                  f"({t['target']})")
        m = doc["machine"]
        print(f"{doc['ranks']} ranks: loadavg before {m['loadavg_before']} "
              f"after {m['loadavg_after']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

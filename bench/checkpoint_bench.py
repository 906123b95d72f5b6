"""Checkpoint save, async save and resume verification (issue 3, item 6).

A model of ``--model-mib`` MiB (default 1024) of F32 parameters and its AdamW
state (twice that), saved to a local store:

(a) sync ``CheckpointManager.save`` (stream + hash in one pass, fsync, commit,
    LATEST) against ``safetensors.numpy.save_file`` of the same tensors followed
    by a separate sha256 pass (the issue's peer; no fsync), and against the same
    peer plus ``os.sync`` (durable like ours). Target: ratio <= 0.8. Beside
    them, the disk's floor for a durable save: the same bytes written raw and
    fsynced. The model and optimizer files are written and hashed at once (one
    per core); retention runs in the background (``background_delete``).
(b) async save: the time ``save()`` blocks the caller, against a sync save.
    Target: <= 10 %.
(c) resume verification (``verify_directory(full=True)``: sha256 of every file)
    against ``sha256sum`` of the same files. Target: ratio <= 1.1.

    python bench/checkpoint_bench.py [--model-mib 1024] [--out FILE]
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import bench_args  # noqa: E402
from registry.checkpoint import CheckpointManager  # noqa: E402
from registry.protocol.verify import verify_directory  # noqa: E402

MIB = 1024 * 1024


def make_model(mib: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    n_layers = max(1, mib // 64)
    per = mib * MIB // 4 // n_layers
    cols = 4096
    rows = max(1, per // cols)
    params = {f"layer{i}.weight": rng.standard_normal((rows, cols), dtype=np.float32)
              for i in range(n_layers)}
    opt = {}
    for k, v in params.items():
        opt[f"{k}.exp_avg"] = v * np.float32(0.1)
        opt[f"{k}.exp_avg_sq"] = v * v
    return params, opt


def trainer_state(step: int) -> dict[str, Any]:
    return {"step": step, "tokens_seen": 0,
            "data_cursor": {"source": "bench", "shard": 0, "offset": 0},
            "generator": {"algorithm": "pcg32", "state": "0" * 16, "inc": "0" * 15 + "1"},
            "learning_rate": 1e-3, "spec_sha256": "0" * 64, "git_sha": None}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(8 * MIB)
        view = memoryview(buf)
        while n := f.readinto(view):
            h.update(view[:n])
    return h.hexdigest()


def ours_sync(root: Path, step: int, params: dict[str, np.ndarray],
              opt: dict[str, np.ndarray]) -> float:
    # a run of its own: the async manager below holds run "bench"'s writer lease
    with CheckpointManager(str(root), "bench-sync", keep_ckpts=1, async_save=False,
                           background_delete=True) as m:
        t = time.perf_counter()
        m.save(step, params, opt, optimizer="adamw", config={"bench": True},
               trainer_state=trainer_state(step))
        return time.perf_counter() - t


def ours_async_block(m: CheckpointManager, step: int, params: dict[str, np.ndarray],
                     opt: dict[str, np.ndarray]) -> tuple[float, float]:
    """One async save of a manager that has saved before (a training loop's
    steady state): the time save() blocks, and the time until it landed."""
    t = time.perf_counter()
    fut = m.save(step, params, opt, optimizer="adamw", config={"bench": True},
                 trainer_state=trainer_state(step))
    blocked = time.perf_counter() - t
    fut.result()
    return blocked, time.perf_counter() - t


def peer(root: Path, params: dict[str, np.ndarray], opt: dict[str, np.ndarray], *,
         sync: bool) -> float:
    d = root / f"peer-{time.monotonic_ns()}"
    d.mkdir()
    t = time.perf_counter()
    safetensors.numpy.save_file(params, str(d / "model.safetensors"), {"format": "tinyllm"})
    safetensors.numpy.save_file(opt, str(d / "optimizer.safetensors"), {"format": "tinyllm"})
    for f in sorted(d.iterdir()):
        sha256_file(f)
    if sync:
        os.sync()
    elapsed = time.perf_counter() - t
    shutil.rmtree(d)
    return elapsed


def disk_floor(root: Path, params: dict[str, np.ndarray], opt: dict[str, np.ndarray]) -> float:
    """The same bytes written raw and fsynced, no hashing, no format: what the
    disk allows a durable save (the seed's step 1 fsyncs every file)."""
    d = root / f"floor-{time.monotonic_ns()}"
    d.mkdir()
    t = time.perf_counter()
    for name, tensors in (("model", params), ("optimizer", opt)):
        with open(d / name, "wb", buffering=0) as f:
            for a in tensors.values():
                f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
            os.fsync(f.fileno())
    elapsed = time.perf_counter() - t
    shutil.rmtree(d)
    return elapsed


def main() -> int:
    ap = bench_args(__doc__, "checkpoint", repeat=3)
    ap.add_argument("--model-mib", type=int, default=1024)
    args = ap.parse_args()
    params, opt = make_model(args.model_mib)
    total = sum(a.nbytes for a in params.values()) + sum(a.nbytes for a in opt.values())
    samples: dict[str, list[float]] = {k: [] for k in (
        "ours_sync", "peer", "peer_sync", "disk_floor", "async_blocked", "async_total", "verify", "sha256sum")}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp)
        step = 1
        asynchronous = CheckpointManager(str(root / "store"), "bench", keep_ckpts=1)
        ours_async_block(asynchronous, step, params, opt)  # the run's first save
        for _ in range(args.repeat):
            step += 1
            samples["ours_sync"].append(ours_sync(root / "store", step, params, opt))
            samples["peer"].append(peer(root, params, opt, sync=False))
            samples["peer_sync"].append(peer(root, params, opt, sync=True))
            samples["disk_floor"].append(disk_floor(root, params, opt))
            step += 1
            blocked, whole = ours_async_block(asynchronous, step, params, opt)
            samples["async_blocked"].append(blocked)
            samples["async_total"].append(whole)
            prefix = f"runs/bench/ckpt/step-{step:06d}"
            from registry.store import open_store
            store = open_store(str(root / "store"))
            t = time.perf_counter()
            assert verify_directory(store, prefix, full=True).ok
            samples["verify"].append(time.perf_counter() - t)
            files = sorted(str(p) for p in (root / "store" / prefix).iterdir())
            t = time.perf_counter()
            subprocess.run(["sha256sum", *files], check=True, stdout=subprocess.DEVNULL)
            samples["sha256sum"].append(time.perf_counter() - t)
        asynchronous.close()
    med = {k: statistics.median(v) for k, v in samples.items()}
    result = {
        "bytes": total, "model_mib": args.model_mib, "samples": samples,
        "median_seconds": med,
        "save_ratio_vs_save_file_plus_sha256": med["ours_sync"] / med["peer"],
        "save_ratio_vs_save_file_plus_sha256_plus_sync": med["ours_sync"] / med["peer_sync"],
        "save_ratio_vs_disk_floor": med["ours_sync"] / med["disk_floor"],
        "async_blocked_fraction_of_sync": med["async_blocked"] / med["ours_sync"],
        "verify_ratio_vs_sha256sum": med["verify"] / med["sha256sum"],
        "save_mb_per_s": total / 1e6 / med["ours_sync"],
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"checkpoint of {total / MIB:.0f} MiB (model + AdamW), medians of {args.repeat}:")
    print("| measure | ours (s) | peer (s) | ratio | target |")
    print("|---|---|---|---|---|")
    print(f"| sync save vs save_file + sha256 | {med['ours_sync']:.2f} | {med['peer']:.2f} | "
          f"{result['save_ratio_vs_save_file_plus_sha256']:.2f} | <= 0.8 |")
    print(f"| sync save vs save_file + sha256 + sync | {med['ours_sync']:.2f} | "
          f"{med['peer_sync']:.2f} | {result['save_ratio_vs_save_file_plus_sha256_plus_sync']:.2f}"
          " | (durable peer) |")
    print(f"| sync save vs raw write + fsync (disk floor) | {med['ours_sync']:.2f} | "
          f"{med['disk_floor']:.2f} | {result['save_ratio_vs_disk_floor']:.2f} | (floor) |")
    print(f"| async save: caller blocked vs sync save | {med['async_blocked']:.3f} | "
          f"{med['ours_sync']:.2f} | {result['async_blocked_fraction_of_sync']:.3f} | <= 0.10 |")
    print(f"| resume verification vs sha256sum | {med['verify']:.2f} | {med['sha256sum']:.2f} | "
          f"{result['verify_ratio_vs_sha256sum']:.2f} | <= 1.1 |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

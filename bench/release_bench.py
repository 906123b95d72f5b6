"""Releasing a checkpoint as bf16 and int4 (issue 4, item 9).

A checkpoint with ``--model-mib`` MiB (default 1024) of F32 weights is released
with ``ModelRelease.create`` (streaming, tensor by tensor, hashed while
written, committed) and with the naive path in the same run:
``safetensors.numpy.load_file`` of the whole checkpoint, numpy conversion,
``save_file``, then a separate sha256 pass. Each path runs in its own child
process so its peak resident memory (ru_maxrss) is measured too.
Target: time ratio <= 0.8 for bf16; peak memory of ours <= largest tensor +
256 MiB (over the interpreter's baseline).

    python bench/release_bench.py [--model-mib 1024] [--out FILE]
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import bench_args  # noqa: E402
from bench.shards_bench import EVALS, LEDGER  # noqa: E402
MIB = 1024 * 1024


def make_checkpoint(store: str, mib: int) -> int:
    """A one-step checkpoint; returns the size of its largest tensor in bytes."""
    from bench.checkpoint_bench import trainer_state
    from registry.checkpoint import CheckpointManager
    rng = np.random.default_rng(0)
    n = max(1, mib // 64)
    rows = mib * MIB // 4 // n // 4096
    params = {f"layer{i}.weight": rng.standard_normal((rows, 4096), dtype=np.float32)
              for i in range(n)}
    params["norm.bias"] = np.zeros(4096, np.float32)
    opt: dict[str, np.ndarray] = {}
    with CheckpointManager(store, "bench", keep_ckpts=1, async_save=False) as m:
        m.save(1, params, opt, optimizer="sgd", config={"hidden_size": 4096},
               trainer_state=trainer_state(1))
    return max(a.nbytes for a in params.values())


def child_ours(store: str, dtype: str, version: str) -> None:
    from registry.release import ModelRelease
    ModelRelease(store).create("bench", 1, "bench-model", version, dtype=dtype, ledger=LEDGER,
                               eval_summary=EVALS)


def child_naive(store: str, dtype: str, out_dir: str) -> None:
    import ml_dtypes
    import safetensors.numpy

    from registry.release.convert import quantize_int4
    src = Path(store) / "runs/bench/ckpt/step-000001/model.safetensors"
    tensors = safetensors.numpy.load_file(str(src))
    if dtype == "bf16":
        out = {k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}
        meta = {"format": "tinyllm"}
    else:
        out = {}
        for k, v in tensors.items():
            if v.ndim == 2:
                out[f"{k}.qweight"], out[f"{k}.scales"] = quantize_int4(v, 128)
            else:
                out[k] = v
        meta = {"format": "tinyllm", "quant": "int4", "group_size": "128"}
    dest = Path(out_dir) / "model.safetensors"
    safetensors.numpy.save_file(out, str(dest), meta)
    h = hashlib.sha256()
    with open(dest, "rb") as f:
        while block := f.read(8 * MIB):
            h.update(block)


def vm_hwm() -> int:
    """This process's own peak RSS in bytes (VmHWM: reset by exec, unlike
    ru_maxrss, which a child inherits from the parent it was forked from)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def peak_of(*args: str) -> tuple[float, int]:
    """Wall time and peak RSS (bytes) of one child run."""
    t = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--child", *args], check=True,
                         capture_output=True, text=True).stdout
    elapsed = time.perf_counter() - t
    return elapsed, int(out.strip().splitlines()[-1])


def main() -> int:
    ap = bench_args(__doc__, "release", repeat=3)
    ap.add_argument("--model-mib", type=int, default=1024)
    ap.add_argument("--child", nargs="*")
    args = ap.parse_args()
    if args.child:
        kind, store, dtype, extra = args.child
        (child_ours if kind == "ours" else child_naive)(store, dtype, extra)
        print(vm_hwm())
        return 0
    result: dict[str, Any] = {"model_mib": args.model_mib}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        store = str(Path(tmp) / "store")
        largest = make_checkpoint(store, args.model_mib)
        result["largest_tensor_bytes"] = largest
        for dtype in ("bf16", "int4"):
            ours_t, naive_t, ours_m, naive_m = [], [], [], []
            for i in range(args.repeat):
                t, m = peak_of("ours", store, dtype, f"{dtype}-{i}")
                ours_t.append(t)
                ours_m.append(m)
                out_dir = Path(tmp) / f"naive-{dtype}-{i}"
                out_dir.mkdir()
                t, m = peak_of("naive", store, dtype, str(out_dir))
                naive_t.append(t)
                naive_m.append(m)
            result[dtype] = {
                "ours_seconds": statistics.median(ours_t), "naive_seconds": statistics.median(naive_t),
                "ratio": statistics.median(ours_t) / statistics.median(naive_t),
                "ours_peak_rss_mib": max(ours_m) / MIB, "naive_peak_rss_mib": max(naive_m) / MIB,
                "samples": {"ours": ours_t, "naive": naive_t}}
        from bench.floor import disk_floor
        result["disk_floor_seconds"] = disk_floor(tmp, largest)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"release of a {args.model_mib} MiB F32 checkpoint (largest tensor "
          f"{largest / MIB:.0f} MiB), medians of {args.repeat}, each in a fresh process:")
    print("| dtype | ours (s) | naive (s) | ratio | ours peak RSS MiB | naive peak RSS MiB |")
    print("|---|---|---|---|---|---|")
    for dtype in ("bf16", "int4"):
        r = result[dtype]
        print(f"| {dtype} | {r['ours_seconds']:.2f} | {r['naive_seconds']:.2f} | {r['ratio']:.2f} "
              f"| {r['ours_peak_rss_mib']:.0f} | {r['naive_peak_rss_mib']:.0f} |")
    from bench.floor import floor_line
    print(floor_line(result["disk_floor_seconds"], largest))
    return 0


if __name__ == "__main__":
    sys.exit(main())

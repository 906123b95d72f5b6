"""Piece digests (issue 19, items 2-4): what they cost at commit, what they buy at resume.

A checkpoint of ``--model-mib`` MiB of weights and twice that of AdamW state
(3 GiB by default: three files) is committed from a local directory, with
piece states and with today's path (whole-file ``hashlib`` sha256, no
pieces), alternating, ``--repeat`` times each. Then its resume verification
(``verify_directory(full=True)``, what ``CheckpointTree.resumable`` runs)
against ``sha256sum`` of the same files, alternating; the piece checks on one
thread and on one per core (the speedup); and the floors measured in the same
run: reading the files (``cat > /dev/null``) and writing + fsyncing the same
bytes. The CPU count and the load average are printed with the figures.

Targets: commit with pieces <= 1.03x today's; resume verification <= 0.6x
``sha256sum``.

    python bench/pieces_bench.py [--model-mib 1024] [--repeat 3] [--out FILE]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from registry.protocol import hashing  # noqa: E402
from bench.harness import bench_args, prefault  # noqa: E402
from registry.protocol.commit import commit_local_directory  # noqa: E402
from registry.protocol.pieces import ChainHasher  # noqa: E402
from registry.store import open_store  # noqa: E402
from registry.store.writepath import write_path  # noqa: E402
from registry.protocol.verify import verify_directory  # noqa: E402

MIB = 1024 * 1024


class _Today:
    """The whole-file hashlib sha256 the commit used before piece states."""

    def __init__(self, *, blake3: bool = False) -> None:
        self._h = hashlib.sha256()
        self.pieces = None
        self.blake3 = None

    def update(self, data: Any) -> None:
        self._h.update(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def make_checkpoint(path: Path, model_mib: int) -> int:
    path.mkdir(parents=True)
    rng = np.random.default_rng(0)
    sizes = {"model.safetensors": model_mib, "optimizer.safetensors": 2 * model_mib}
    for name, mib in sizes.items():
        with open(path / name, "wb") as f:
            for _ in range(mib):
                f.write(rng.bytes(MIB))
    (path / "trainer_state.json").write_text('{"step": 1}\n')
    return sum(p.stat().st_size for p in path.iterdir())


def timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def commit(store_root: Path, src: Path, step: int, *, pieces: bool,
           release: bool = False) -> tuple[float, float]:
    """Wall seconds and CPU seconds (this process, all threads) of one commit:
    a checkpoint, or with ``release`` a release (whose files also get their
    BLAKE3, registry.protocol.fastdigest, on a helper thread)."""
    store = open_store(str(store_root))
    hashing.ChainHasher = ChainHasher if pieces else _Today  # type: ignore[misc]
    if release:
        meta: dict[str, Any] = {"kind": "release", "model_id": "bench",
                                "version": str(step), "source": {"uri": "bench"}}
    else:
        meta = {"kind": "checkpoint", "run_id": "bench", "step": step}
    try:
        cpu = time.process_time()
        wall = timed(lambda: commit_local_directory(
            store, src, f"runs/bench/ckpt/step-{step:06d}", **meta))
        return wall, time.process_time() - cpu
    finally:
        hashing.ChainHasher = ChainHasher  # type: ignore[misc]


def disk_floor(tmp: Path, size: int) -> float:
    block = np.random.default_rng(1).bytes(8 * MIB)
    path = tmp / "floor.bin"
    t = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        for _ in range(size // len(block)):
            f.write(block)
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - t
    path.unlink()
    return elapsed


def main() -> int:
    ap = bench_args(__doc__, "pieces", repeat=3)
    ap.add_argument("--model-mib", type=int, default=1024)
    args = ap.parse_args()
    cpus = os.cpu_count() or 1
    out: dict[str, Any] = {"cpus": cpus, "load_before": os.getloadavg()}
    s: dict[str, list[float]] = {k: [] for k in (
        "commit_pieces", "commit_today", "commit_pieces_cpu", "commit_today_cpu",
        "commit_release", "commit_release_cpu", "verify",
        "sha256sum", "verify_1", "verify_n", "read_floor", "write_floor")}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as t:
        tmp = Path(t)
        src = tmp / "src"
        total = make_checkpoint(src, args.model_mib)
        store_root = tmp / "store"
        store_root.mkdir()
        out["write_path"] = write_path(str(store_root)).to_dict()  # measured once, first
        step = kept = 0
        arms = ["commit_pieces", "commit_today", "commit_release"]
        for i in range(args.repeat):
            for name in arms[i % 3:] + arms[:i % 3]:
                step += 1
                pieces = name != "commit_today"
                os.sync()
                prefault(total * 5 // 4)
                wall, cpu = commit(store_root, src, step, pieces=pieces,
                                   release=name == "commit_release")
                s[name].append(wall)
                s[f"{name}_cpu"].append(cpu)
                if name == "commit_pieces":
                    kept, old = step, kept
                else:
                    old = step
                if old:  # keep the disk from filling: only the last one with pieces stays
                    shutil.rmtree(store_root / f"runs/bench/ckpt/step-{old:06d}")
            s["write_floor"].append(disk_floor(tmp, total))
        store = open_store(str(store_root))
        prefix = f"runs/bench/ckpt/step-{kept:06d}"
        files = sorted(str(p) for p in (store_root / prefix).iterdir()
                       if p.name != "MANIFEST.json")
        for i in range(args.repeat):
            runs = [("verify", lambda: verify_directory(store, prefix, full=True)),
                    ("sha256sum", lambda: subprocess.run(["sha256sum", *files], check=True,
                                                         stdout=subprocess.DEVNULL))]
            for name, fn in (runs if i % 2 == 0 else runs[::-1]):
                s[name].append(timed(fn))
            s["verify_1"].append(timed(lambda: verify_directory(store, prefix, full=True,
                                                                workers=1)))
            s["verify_n"].append(timed(lambda: verify_directory(store, prefix, full=True,
                                                                workers=cpus)))
            s["read_floor"].append(timed(lambda: subprocess.run(
                f"cat {' '.join(files)} > /dev/null", shell=True, check=True)))
        report = verify_directory(store, prefix, full=True)
        assert report.ok
    med = {k: statistics.median(v) for k, v in s.items() if v}
    out.update({
        "bytes": total, "samples": s, "median_seconds": med,
        "commit_ratio_pieces_vs_today": med["commit_pieces"] / med["commit_today"],
        "commit_cpu_ratio_pieces_vs_today": med["commit_pieces_cpu"] / med["commit_today_cpu"],
        "commit_ratio_release_vs_today": med["commit_release"] / med["commit_today"],
        "commit_cpu_ratio_release_vs_today": med["commit_release_cpu"] / med["commit_today_cpu"],
        "resume_verify_ratio_vs_sha256sum": med["verify"] / med["sha256sum"],
        "piece_speedup_1_to_n": med["verify_1"] / med["verify_n"],
        "load_after": os.getloadavg()})
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"{total / MIB:.0f} MiB checkpoint (3 files), medians of {args.repeat}; {cpus} CPUs, "
          f"load average before {out['load_before'][0]:.1f}, after {out['load_after'][0]:.1f}:")
    print("| measure | ours (s) | peer | peer (s) | ratio | target |")
    print("|---|---|---|---|---|---|")
    print(f"| commit with piece states | {med['commit_pieces']:.2f} | commit without (today's) | "
          f"{med['commit_today']:.2f} | {out['commit_ratio_pieces_vs_today']:.3f} | <= 1.03 |")
    print(f"| release commit (piece states + BLAKE3) | {med['commit_release']:.2f} | commit "
          f"without (today's) | {med['commit_today']:.2f} | "
          f"{out['commit_ratio_release_vs_today']:.3f} | <= 1.03 |")
    print(f"| release commit CPU seconds (all threads) | {med['commit_release_cpu']:.2f} | "
          f"today's | {med['commit_today_cpu']:.2f} | "
          f"{out['commit_cpu_ratio_release_vs_today']:.3f} | (reported) |")
    print(f"| commit CPU seconds (all threads) | {med['commit_pieces_cpu']:.2f} | today's | "
          f"{med['commit_today_cpu']:.2f} | {out['commit_cpu_ratio_pieces_vs_today']:.3f} | "
          "(reported) |")
    print(f"| resume verification | {med['verify']:.2f} | sha256sum | {med['sha256sum']:.2f} | "
          f"{out['resume_verify_ratio_vs_sha256sum']:.2f} | <= 0.6 |")
    print(f"| piece checks, {cpus} threads | {med['verify_n']:.2f} | 1 thread | "
          f"{med['verify_1']:.2f} | speedup {out['piece_speedup_1_to_n']:.2f}x | (reported) |")
    wp = out["write_path"]
    print(f"write path measured on this store's filesystem: "
          f"{'direct, ' + str(wp['chunk'] // MIB) + ' MiB buffers' if wp['direct'] else 'buffered'}"
          f" ({', '.join(f'{k} {v:.3f} s' for k, v in wp['seconds'].items())})")
    print(f"floors this run: read the files (cat > /dev/null) {med['read_floor']:.2f} s; "
          f"write + fsync the same bytes {med['write_floor']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

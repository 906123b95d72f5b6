"""The pull cache's bookkeeping at scale (issue 19): ``cache ls`` and ``cache prune``.

A cache holding ``--versions`` releases (default 1,000: ``--models`` models of
equal numbers of versions) is filled by real pulls from a local store, with
``fsync=False`` to build it faster: each release has five files, three shared
by every version of its model (config, tokenizer, generation config) and two of
its own (weights of ``--weights-kib`` KiB, a card); every version is placed in
the cache's own ``models/<model_id>/<version>`` and every tenth also in a
``--to`` directory (one per model, so older ones show as replaced). Then:

* ``cache ls`` (``PullCache.ls()``, what ``registry cache ls --json`` prints,
  minus the JSON dump) over the whole cache, against ``du -s`` of the cache
  directory in the same run (the peer: the cheapest way to ask how big it is).
  Target: < 1 s.
* ``cache prune`` of ``--prune`` versions (``keep_last`` chosen to prune
  exactly that many: the oldest of every model): records, blobs only they use,
  their in-cache directories. Each trial restores the cache from a copy made
  after the build (``cp -a``, not timed). The peer: ``rm -rf`` of the same
  versions' in-cache directories, restored the same way. Target: < 5 s.

    python bench/cache_bench.py [--versions 1000] [--prune 100] [--repeat 5] [--out FILE]
"""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import bench_args  # noqa: E402
from registry.protocol.commit import commit_local_directory  # noqa: E402
from registry.pull import pull  # noqa: E402
from registry.pull.cache_admin import PullCache  # noqa: E402
from registry.release import release_prefix  # noqa: E402
from registry.store import open_store  # noqa: E402


def build(tmp: Path, models: int, per_model: int, weights_kib: int) -> tuple[Path, float]:
    """Commit and pull every release; returns (the cache, seconds it took)."""
    t0 = time.perf_counter()
    store = open_store(str(tmp / "store"))
    cache = tmp / "cache"
    for v in range(per_model):
        for m in range(models):
            model_id = f"model-{m:02d}"
            src = tmp / "src" / model_id / str(v)
            src.mkdir(parents=True)
            (src / "config.json").write_text(json.dumps({"model": model_id, "hidden": 64}))
            (src / "tokenizer.json").write_text(json.dumps({"vocab": [model_id] * 500}))
            (src / "generation_config.json").write_text('{"max_new_tokens": 16}')
            (src / "model.safetensors").write_bytes(os.urandom(weights_kib * 1024))
            (src / "MODEL_CARD.md").write_text(f"# {model_id} {v}\n")
            commit_local_directory(store, src, release_prefix(model_id, str(v)), kind="release",
                                   model_id=model_id, version=str(v), source={"uri": str(src)})
            shutil.rmtree(src)
            pull(store, model_id, str(v), cache=cache, fsync=False, workers=2)
            if v % 10 == 0:
                pull(store, model_id, str(v), cache=cache, fsync=False, workers=2,
                     to=tmp / "serve" / model_id, force=True)
    return cache, time.perf_counter() - t0


def timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def restore(snapshot: Path, cache: Path) -> None:
    shutil.rmtree(cache, ignore_errors=True)
    subprocess.run(["cp", "-a", str(snapshot), str(cache)], check=True)


def main() -> int:
    ap = bench_args(__doc__, "cache", repeat=5)
    ap.add_argument("--versions", type=int, default=1000)
    ap.add_argument("--models", type=int, default=10)
    ap.add_argument("--prune", type=int, default=100)
    ap.add_argument("--weights-kib", type=int, default=32)
    args = ap.parse_args()
    per_model = args.versions // args.models
    prune_per_model = args.prune // args.models
    results: dict[str, Any] = {"versions": per_model * args.models, "models": args.models,
                               "pruned_versions": prune_per_model * args.models,
                               "cpu_count": os.cpu_count(),
                               "loadavg_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as t:
        tmp = Path(t)
        cache, results["build_seconds"] = build(tmp, args.models, per_model, args.weights_kib)
        admin = PullCache(cache)
        report = admin.ls()
        assert len(report.versions) == results["versions"], len(report.versions)
        results["blobs"], results["size_on_disk"] = report.blobs, report.size_on_disk
        ls, du, ls_cpu = [], [], []
        for _ in range(args.repeat):
            cpu = time.process_time()
            ls.append(timed(lambda: admin.ls().to_dict()))
            ls_cpu.append(time.process_time() - cpu)
            du.append(timed(lambda: subprocess.run(["du", "-s", str(cache)], check=True,
                                                   stdout=subprocess.DEVNULL)))
        snapshot = tmp / "snapshot"
        subprocess.run(["cp", "-a", str(cache), str(snapshot)], check=True)
        oldest = [cache / "models" / f"model-{m:02d}" / str(v)
                  for m in range(args.models) for v in range(prune_per_model)]
        prune, rm, prune_cpu = [], [], []
        for _ in range(args.repeat):
            restore(snapshot, cache)
            r: list[Any] = []
            cpu = time.process_time()
            prune.append(timed(lambda: r.append(
                admin.prune(keep_last=per_model - prune_per_model))))
            prune_cpu.append(time.process_time() - cpu)
            assert len(r[0].pruned) == results["pruned_versions"], len(r[0].pruned)
            restore(snapshot, cache)
            rm.append(timed(lambda: subprocess.run(["rm", "-rf", *map(str, oldest)],
                                                   check=True)))
        results["loadavg_after"] = os.getloadavg()
    med = {k: statistics.median(v) for k, v in (("ls", ls), ("du", du), ("prune", prune),
                                                 ("rm", rm))}
    results.update({
        "ls_seconds": med["ls"], "du_seconds": med["du"], "ls_ratio_vs_du": med["ls"] / med["du"],
        "prune_seconds": med["prune"], "rm_seconds": med["rm"],
        "prune_ratio_vs_rm": med["prune"] / med["rm"],
        "ls_cpu_seconds": statistics.median(ls_cpu),
        "prune_cpu_seconds": statistics.median(prune_cpu),
        "targets": {
            f"cache ls, {results['versions']} versions (s; {os.cpu_count()} CPUs)": {
                "ours": med["ls"], "peer": "du -s", "ratio": med["ls"] / med["du"],
                "target": "< 1 s"},
            f"cache prune, {results['pruned_versions']} versions (s)": {
                "ours": med["prune"], "peer": "rm -rf of their directories",
                "ratio": med["prune"] / med["rm"], "target": "< 5 s"}},
        "samples": {"ls": ls, "du": du, "prune": prune, "rm": rm, "ls_cpu": ls_cpu,
                    "prune_cpu": prune_cpu}})
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"cache of {results['versions']} versions ({results['blobs']} blobs), "
          f"{os.cpu_count()} CPUs, load {results['loadavg_before'][0]:.1f}, medians of "
          f"{args.repeat}:")
    print("| measure | ours (s) | peer | peer (s) | ratio | target |")
    print("|---|---|---|---|---|---|")
    print(f"CPU seconds of ours (user + system): cache ls {results['ls_cpu_seconds']:.3f}, "
          f"cache prune {results['prune_cpu_seconds']:.3f}")
    print(f"| cache ls, {results['versions']} versions | {med['ls']:.3f} | du -s | "
          f"{med['du']:.3f} | {med['ls'] / med['du']:.2f} | < 1 s |")
    print(f"| cache prune, {results['pruned_versions']} versions | {med['prune']:.3f} | "
          f"rm -rf of their directories | {med['rm']:.3f} | {med['prune'] / med['rm']:.2f} "
          "| < 5 s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

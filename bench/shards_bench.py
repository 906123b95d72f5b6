"""Sharded model directories: publish, pull and --dtype bf16 (issue 26, item 7).

A Hugging Face style directory of ``--size-mib`` MiB (default 4096) of F32
weights in ``--shards`` shards (default 8) plus ``model.safetensors.index.json``
and ``config.json`` is, in one run:

* published as is (``ModelRelease.publish``: every shard's header checked,
  every byte hashed, committed) and pulled (``registry.pull.pull``, every
  byte verified, fsynced) on local disk, against ``cp -r && sync`` of the
  same directory;
* the same on the S3 test server (moto, threaded, in this process), against
  boto3 ``upload_file`` of every file (publish) and s3fs ``get(recursive=True)``
  (pull);
* published ``--dtype bf16`` (streamed shard by shard, one tensor at a time),
  against safetensors ``load_file`` + ``astype`` + ``save_file`` per shard plus a
  sha256 pass over the output (what the naive path needs for a manifest).
  Both bf16 arms run in a child process each, so their peak resident memory
  (ru_maxrss) is measured: target below 512 MiB for ours.

Every arm starts from a synced disk (``os.sync``, untimed) and warmed memory
(bench.harness.prefault); arms alternate order between rounds.

    python bench/shards_bench.py [--size-mib 4096] [--shards 8] [--repeat 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import MIB, prefault, timed  # noqa: E402

LEDGER = [{"source_id": "bench", "name": "bench", "uri": "x", "license": "CC0-1.0",
           "allowed_uses": ["train"], "revoked": False, "revoked_at": None,
           "revocation_reason": None}]
EVALS = {"suite": "b", "suite_version": "1", "created_at": "2026-01-01T00:00:00Z",
         "results": [{"task": "t", "metric": "m", "value": 1.0, "n": 1, "threshold": 0.0,
                      "higher_is_better": True, "passed": True}], "passed": True}
TENSOR_MIB = 64


def make_sharded_dir(path: Path, size_mib: int, shards: int) -> None:
    """``shards`` shards of F32 tensors (64 MiB each, ``[rows, 4096]``) totalling
    ``size_mib`` MiB, their index and a Llama-like config.json."""
    from registry.formats.safetensors_io import LazyTensor, write_safetensors
    from registry.formats.weights import index_bytes, shard_name

    path.mkdir(parents=True)
    per_shard = max(1, size_mib // TENSOR_MIB // shards)
    rows = TENSOR_MIB * MIB // 4 // 4096
    weight_map, total = {}, 0
    for s in range(shards):
        name = shard_name(s + 1, shards)
        tensors = {}
        for t in range(per_shard):
            tname = f"model.layers.{s}.w{t}.weight"
            seed = s * 1000 + t
            tensors[tname] = LazyTensor("F32", (rows, 4096), lambda seed=seed: np.random
                                        .default_rng(seed).standard_normal((rows, 4096),
                                                                           dtype=np.float32))
            weight_map[tname] = name
            total += rows * 4096 * 4
        with open(path / name, "wb") as f:
            write_safetensors(f, tensors, metadata={"format": "pt"})
    (path / "model.safetensors.index.json").write_bytes(index_bytes(weight_map,
                                                                    total_size=total))
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype":
                                                  "float32", "hidden_size": 4096}))


def _settle(nbytes: int) -> None:
    os.sync()
    prefault(nbytes * 5 // 4)


def _child(args: list[str]) -> dict[str, Any]:
    """Run this script as a child (``--child ...``): its seconds and peak RSS."""
    out = subprocess.run([sys.executable, __file__, "--child", *args], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM): ru_maxrss would report the
    parent's, since Linux keeps it across fork and execve."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_main(kind: str, src: str, dst: str) -> None:
    base = _peak_rss_mib()
    if kind == "ours":
        from registry.release import ModelRelease
        rel = ModelRelease(dst)
        seconds = timed(lambda: rel.publish(src, "bench", f"bf16-{uuid.uuid4().hex[:8]}",
                                            ledger=LEDGER, eval_summary=EVALS, dtype="bf16"))
    else:
        import ml_dtypes
        import safetensors.numpy

        def naive() -> None:
            out = Path(dst)
            out.mkdir(parents=True, exist_ok=True)
            for shard in sorted(Path(src).glob("model-*.safetensors")):
                tensors = safetensors.numpy.load_file(str(shard))
                converted = {k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}
                del tensors
                safetensors.numpy.save_file(converted, str(out / shard.name),
                                            metadata={"format": "pt"})
                del converted
                h = hashlib.sha256()
                with open(out / shard.name, "rb") as f:
                    while block := f.read(8 * MIB):
                        h.update(block)
                os.fsync(os.open(out / shard.name, os.O_RDONLY))
        seconds = timed(naive)
    peak = _peak_rss_mib()
    print(json.dumps({"seconds": seconds, "peak_rss_mib": peak,
                      "peak_over_start_mib": peak - base}))


def bench_store(name: str, url: str, src: Path, tmp: Path, repeat: int, peer_publish: Any,
                peer_pull: Any, total: int) -> dict[str, Any]:
    from registry.pull import pull
    from registry.release import ModelRelease
    from registry.store import open_store

    rel = ModelRelease(url)
    samples: dict[str, list[float]] = {}
    target, cache, dest = tmp / f"{name}-serve", tmp / f"{name}-cache", tmp / f"{name}-peer"
    counter = [0]

    def publish() -> float:
        counter[0] += 1
        version = f"{counter[0]}"
        _settle(total)
        seconds = timed(lambda: rel.publish(src, "bench", version, ledger=LEDGER,
                                            eval_summary=EVALS))
        _settle(total)
        seconds_pull = timed(lambda: pull(open_store(url), "bench", version, to=target,
                                          cache=cache))
        samples.setdefault("pull", []).append(seconds_pull)
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
        return seconds

    def peers() -> float:
        _settle(total)
        seconds = timed(lambda: peer_publish(counter[0]))
        _settle(total)
        samples.setdefault("peer_pull", []).append(timed(lambda: peer_pull(dest, counter[0])))
        shutil.rmtree(dest, ignore_errors=True)
        return seconds

    for i in range(repeat):
        for arm, fn in ((("publish", publish), ("peer_publish", peers)) if i % 2 == 0 else
                        (("peer_publish", peers), ("publish", publish))):
            samples.setdefault(arm, []).append(fn())
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {"publish_seconds": med["publish"], "peer_publish_seconds": med["peer_publish"],
            "publish_ratio": med["publish"] / med["peer_publish"],
            "pull_seconds": med["pull"], "peer_pull_seconds": med["peer_pull"],
            "pull_ratio": med["pull"] / med["peer_pull"], "samples": samples}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=4096)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--local-only", action="store_true", help="skip the S3 half")
    ap.add_argument("--bf16-only", action="store_true", help="only the --dtype bf16 arms")
    ap.add_argument("--out", default=str(Path(__file__).with_name("results-shards.json")))
    ap.add_argument("--child", nargs=3, metavar=("KIND", "SRC", "DST"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(*args.child)
        return 0
    results: dict[str, Any] = {"size_mib": args.size_mib, "shards": args.shards,
                               "cpus": os.cpu_count(), "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as t:
        tmp = Path(t)
        src = tmp / "src"
        make_sharded_dir(src, args.size_mib, args.shards)
        total = sum(p.stat().st_size for p in src.iterdir())
        results["bytes"] = total
        local = tmp / "store"

        def cp_publish(n: int) -> None:
            subprocess.run(f"cp -r '{src}' '{tmp}/cp-{n}' && sync", shell=True, check=True)
            shutil.rmtree(tmp / f"cp-{n}")

        def cp_pull(dest: Path, n: int) -> None:
            subprocess.run(f"cp -r '{local}/models/bench/{max(n, 1)}' '{dest}' && sync",
                           shell=True, check=True)

        if not args.bf16_only:
            results["local"] = bench_store("local", str(local), src, tmp, args.repeat,
                                           cp_publish, cp_pull, total)
        bf16: dict[str, list[dict[str, Any]]] = {"ours": [], "naive": []}
        for i in range(args.repeat):
            for kind in (("ours", "naive") if i % 2 == 0 else ("naive", "ours")):
                _settle(total)
                out = tmp / f"bf16-{kind}"
                bf16[kind].append(_child([kind, str(src), str(out)]))
                shutil.rmtree(out, ignore_errors=True)
        results["bf16"] = {
            "ours_seconds": statistics.median(r["seconds"] for r in bf16["ours"]),
            "naive_seconds": statistics.median(r["seconds"] for r in bf16["naive"]),
            "ours_peak_rss_mib": max(r["peak_rss_mib"] for r in bf16["ours"]),
            "naive_peak_rss_mib": max(r["peak_rss_mib"] for r in bf16["naive"]),
            "runs": bf16}
        results["bf16"]["ratio"] = (results["bf16"]["ours_seconds"]
                                    / results["bf16"]["naive_seconds"])
        shutil.rmtree(local, ignore_errors=True)
        if not (args.local_only or args.bf16_only):
            from tests.support.s3server import S3Server
            server = S3Server(serialize=False).start()
            os.environ.update(server.env())
            import boto3
            import s3fs
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            s3 = boto3.client("s3")
            s3.create_bucket(Bucket=bucket)
            fs = s3fs.S3FileSystem(skip_instance_cache=True)

            def boto_publish(n: int) -> None:
                for p in sorted(src.iterdir()):
                    s3.upload_file(str(p), bucket, f"peer/{n}/{p.name}")

            def s3fs_pull(dest: Path, n: int) -> None:
                fs.get(f"{bucket}/r/models/bench/{max(n, 1)}/", str(dest) + "/", recursive=True)

            results["s3"] = bench_store("s3", f"s3://{bucket}/r", src, tmp, args.repeat,
                                        boto_publish, s3fs_pull, total)
            server.stop()
    results["load_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    for key in ("local", "s3"):
        if key in results:
            r = results[key]
            print(f"{key}: publish {r['publish_seconds']:.2f}s vs {r['peer_publish_seconds']:.2f}s"
                  f" ({r['publish_ratio']:.2f}x), pull {r['pull_seconds']:.2f}s vs "
                  f"{r['peer_pull_seconds']:.2f}s ({r['pull_ratio']:.2f}x)")
    b = results["bf16"]
    print(f"bf16: {b['ours_seconds']:.2f}s vs {b['naive_seconds']:.2f}s ({b['ratio']:.2f}x), "
          f"peak RSS {b['ours_peak_rss_mib']:.0f} MiB vs {b['naive_peak_rss_mib']:.0f} MiB")
    print(f"load {results['load_before']} -> {results['load_after']}, cpus {results['cpus']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

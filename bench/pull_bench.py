"""Pulling a release to a serving host (issue 6, item 8).

A release of ``--size-mib`` MiB (default 1024: one 768 MiB weights file and a
few smaller ones) is pulled, every byte verified, from a local store and from
the S3 test server (moto, threaded, in this process), against the peers in the
same run: ``cp -r`` of the same bytes (local) and s3fs ``get(recursive=True)``
(S3). Then a warm re-pull of the unchanged release (no download, no re-hash). Each
pull runs with the default (every blob fsynced) and with ``fsync=False``
(``--no-fsync``); ``cp -r`` does not sync. The floor: the sha256 of the
largest file alone (a file's sha256 is sequential, so no pull that verifies
every byte can finish sooner).
Targets: ratio <= 1.15 locally, <= 1.0 on S3, warm re-pull <= 0.1 s per GiB.

    python bench/pull_bench.py [--size-mib 1024] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import MIB, make_release_dir, timed  # noqa: E402
from registry.commit import commit_local_directory  # noqa: E402
from registry.pull import pull  # noqa: E402
from registry.store import open_store  # noqa: E402

def bench_backend(name: str, store_url: str, src: Path, tmp: Path, repeat: int,
                  peer: Any) -> dict[str, Any]:
    store = open_store(store_url)
    commit_local_directory(store, src, "models/bench/1", kind="release", model_id="bench",
                           version="1", source={"uri": str(src)})
    ours, nofsync, peers, warm = [], [], [], []
    for i in range(repeat):
        cache, target = tmp / f"{name}-cache-{i}", tmp / f"{name}-serve-{i}"
        ours.append(timed(lambda: pull(store, "bench", "1", to=target, cache=cache)))
        warm.append(timed(lambda: pull(store, "bench", "1", to=target, cache=cache)))
        dest = tmp / f"{name}-peer-{i}"
        peers.append(timed(lambda: peer(dest)))
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(dest, ignore_errors=True)
        nofsync.append(timed(lambda: pull(store, "bench", "1", to=target, cache=cache,
                                          fsync=False)))
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    med = {k: statistics.median(v) for k, v in
           (("ours", ours), ("nofsync", nofsync), ("peer", peers), ("warm", warm))}
    return {"ours_seconds": med["ours"], "peer_seconds": med["peer"],
            "ratio": med["ours"] / med["peer"],
            "no_fsync_seconds": med["nofsync"], "no_fsync_ratio": med["nofsync"] / med["peer"],
            "warm_seconds": med["warm"],
            "warm_seconds_per_gib": med["warm"] / (total / 1024**3),
            "ours_mb_per_s": total / 1e6 / med["ours"],
            "samples": {"ours": ours, "no_fsync": nofsync, "peer": peers, "warm": warm}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).with_name("results-pull.json")))
    ap.add_argument("--range-threshold-mib", type=int, default=None,
                    help="files above this are fetched in parallel byte ranges "
                         "[default: registry.pull.download.RANGE_THRESHOLD]")
    args = ap.parse_args()
    if args.range_threshold_mib is not None:
        from registry.pull import download
        download.RANGE_THRESHOLD = args.range_threshold_mib * MIB
    from tests.support.s3server import S3Server
    from registry.pull import download
    results: dict[str, Any] = {"size_mib": args.size_mib,
                               "range_threshold_bytes": download.RANGE_THRESHOLD}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as t:
        tmp = Path(t)
        src = tmp / "release"
        make_release_dir(src, args.size_mib)
        from registry.manifest import hash_file
        results["sha256_largest_seconds"] = min(
            timed(lambda: hash_file(src / "model.safetensors")) for _ in range(3))
        local_store = tmp / "store"
        results["local"] = bench_backend(
            "local", str(local_store), src, tmp, args.repeat,
            lambda dest: subprocess.run(["cp", "-r", str(local_store / "models/bench/1"),
                                         str(dest)], check=True))
        server = S3Server(serialize=False).start()
        os.environ.update(server.env())
        import boto3
        import s3fs
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        boto3.client("s3").create_bucket(Bucket=bucket)
        fs = s3fs.S3FileSystem(skip_instance_cache=True)
        results["s3"] = bench_backend(
            "s3", f"s3://{bucket}/r", src, tmp, args.repeat,
            lambda dest: fs.get(f"{bucket}/r/models/bench/1/", str(dest) + "/", recursive=True))
        server.stop()
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"pull of a {args.size_mib} MiB release, every byte verified, medians of "
          f"{args.repeat}:")
    print("| backend | ours (s) | --no-fsync (s) | peer | peer (s) | ratio | ratio --no-fsync "
          "| target | warm re-pull s/GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for backend, peer, target in (("local", "cp -r", 1.15), ("s3", "s3fs get", 1.0)):
        r = results[backend]
        print(f"| {backend} | {r['ours_seconds']:.2f} | {r['no_fsync_seconds']:.2f} | {peer} | "
              f"{r['peer_seconds']:.2f} | {r['ratio']:.2f} | {r['no_fsync_ratio']:.2f} | "
              f"<= {target} | {r['warm_seconds_per_gib']:.3f} |")
    print(f"floor: sha256 of the largest file alone, {results['sha256_largest_seconds']:.2f} s "
          "(one file's sha256 cannot be split across cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Pulling a release to a serving host (issue 6, item 8).

A release of ``--size-mib`` MiB (default 1024: one 768 MiB weights file and a
few smaller ones) is pulled, every byte verified, from a local store and from
the S3 test server (moto, threaded, in this process), against the peers in the
same run: ``cp -r`` of the same bytes (local) and s3fs ``get(recursive=True)``
(S3). Then a warm re-pull of the unchanged release (no download, no re-hash). Each
pull runs with the default (every byte fsynced), against ``cp -r && sync``,
and with ``fsync=False`` (``--no-fsync``), against ``cp -r`` (issue 19, item 3).
Every byte is verified: large files by their piece states on every core
(registry.pieces), as they land. Floors measured in the same run: the disk's
(raw write + fsync of the same bytes), and the sha256 of the largest file
on one core (what a pull without piece states could not beat). The CPU
count and the load average are printed with the figures.
Targets: ratio <= 1.15 locally (both), <= 1.0 on S3, warm re-pull <= 0.1 s per GiB.

    python bench/pull_bench.py [--size-mib 1024] [--repeat 3] [--local-only] [--out FILE]
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

from bench.floor import disk_floor  # noqa: E402
from bench.harness import MIB, make_release_dir, timed  # noqa: E402
from registry.commit import commit_local_directory  # noqa: E402
from registry.pull import pull  # noqa: E402
from registry.store import open_store  # noqa: E402

def bench_backend(name: str, store_url: str, src: Path, tmp: Path, repeat: int,
                  peer: Any, peer_sync: Any | None = None) -> dict[str, Any]:
    store = open_store(store_url)
    commit_local_directory(store, src, "models/bench/1", kind="release", model_id="bench",
                           version="1", source={"uri": str(src)})
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    ours, nofsync, peers, peers_sync, warm, floor = [], [], [], [], [], []
    once, once_nofsync = [], []  # blobs=False (--no-blobs): one write per byte
    for i in range(repeat):
        cache, target = tmp / f"{name}-cache-{i}", tmp / f"{name}-serve-{i}"
        if peer_sync is not None:
            dest = tmp / f"{name}-peer-sync-{i}"
            peers_sync.append(timed(lambda: peer_sync(dest)))
            shutil.rmtree(dest, ignore_errors=True)
            floor.append(disk_floor(tmp, total))
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
        if peer_sync is not None:
            for fsync, out in ((True, once), (False, once_nofsync)):
                out.append(timed(lambda: pull(store, "bench", "1", to=target, cache=cache,
                                              fsync=fsync, blobs=False)))
                shutil.rmtree(cache, ignore_errors=True)
                shutil.rmtree(target, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in
           (("ours", ours), ("nofsync", nofsync), ("peer", peers), ("warm", warm))}
    # The durable pull's peer syncs too (cp -r && sync); without one (S3) cp-less peer.
    sync_peer = statistics.median(peers_sync) if peers_sync else med["peer"]
    extra: dict[str, Any] = {}
    if peers_sync:
        extra = {"peer_sync_seconds": sync_peer,
                 "no_blobs_seconds": statistics.median(once),
                 "no_blobs_ratio": statistics.median(once) / sync_peer,
                 "no_blobs_no_fsync_seconds": statistics.median(once_nofsync),
                 "no_blobs_no_fsync_ratio": statistics.median(once_nofsync) / med["peer"],
                 "disk_floor_seconds": statistics.median(floor),
                 "ratio_vs_disk_floor": med["ours"] / statistics.median(floor)}
    return {"ours_seconds": med["ours"], "peer_seconds": med["peer"],
            "ratio": med["ours"] / sync_peer, **extra,
            "no_fsync_seconds": med["nofsync"], "no_fsync_ratio": med["nofsync"] / med["peer"],
            "warm_seconds": med["warm"],
            "warm_seconds_per_gib": med["warm"] / (total / 1024**3),
            "ours_mb_per_s": total / 1e6 / med["ours"],
            "samples": {"ours": ours, "no_fsync": nofsync, "peer": peers,
                        "peer_sync": peers_sync, "disk_floor": floor, "warm": warm,
                        "no_blobs": once, "no_blobs_no_fsync": once_nofsync}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).with_name("results-pull.json")))
    ap.add_argument("--local-only", action="store_true", help="skip the S3 half")
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
                               "range_threshold_bytes": download.RANGE_THRESHOLD,
                               "cpus": os.cpu_count(), "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as t:
        tmp = Path(t)
        src = tmp / "release"
        make_release_dir(src, args.size_mib)
        from registry.manifest import hash_file
        results["sha256_largest_seconds"] = min(
            timed(lambda: hash_file(src / "model.safetensors")) for _ in range(3))
        local_store = tmp / "store"
        local_store.mkdir()
        from registry.store.writepath import write_path
        results["write_path"] = write_path(str(local_store)).to_dict()
        release = local_store / "models/bench/1"
        results["local"] = bench_backend(
            "local", str(local_store), src, tmp, args.repeat,
            lambda dest: subprocess.run(["cp", "-r", str(release), str(dest)], check=True),
            lambda dest: subprocess.run(f"cp -r '{release}' '{dest}' && sync", shell=True,
                                        check=True))
        from registry.verify import verify_directory
        lstore = open_store(str(local_store))
        verify_directory(lstore, "models/bench/1", full=True)  # into the page cache
        results["verify_all_cores_seconds"] = min(
            timed(lambda: verify_directory(lstore, "models/bench/1", full=True))
            for _ in range(3))
        results["load_after_local"] = os.getloadavg()
        if args.local_only:
            Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
            report(results, args, ("local",))
            return 0
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
    results["load_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    report(results, args, ("local", "s3"))
    return 0


def report(results: dict[str, Any], args: Any, backends: tuple[str, ...]) -> None:
    print(f"pull of a {args.size_mib} MiB release, every byte verified, medians of "
          f"{args.repeat}; {results['cpus']} CPUs, load average before "
          f"{results['load_before'][0]:.1f}, after {results['load_after_local'][0]:.1f}:")
    print("| backend | ours (s) | peer (s) | ratio | --no-fsync (s) | peer (s) | ratio "
          "| target | warm re-pull s/GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for backend in backends:
        r = results[backend]
        peer = "cp -r && sync" if backend == "local" else "s3fs get"
        peer_nf = "cp -r" if backend == "local" else "s3fs get"
        target = "1.15" if backend == "local" else "1.0"
        peer_s = r.get("peer_sync_seconds", r["peer_seconds"])
        print(f"| {backend} | {r['ours_seconds']:.2f} | {peer} {peer_s:.2f} "
              f"| {r['ratio']:.2f} | {r['no_fsync_seconds']:.2f} | {peer_nf} "
              f"{r['peer_seconds']:.2f} | {r['no_fsync_ratio']:.2f} | <= {target} "
              f"| {r['warm_seconds_per_gib']:.3f} |")
    local = results["local"]
    print(f"| local --no-blobs (one write) | {local['no_blobs_seconds']:.2f} | cp -r && sync "
          f"{local['peer_sync_seconds']:.2f} | {local['no_blobs_ratio']:.2f} | "
          f"{local['no_blobs_no_fsync_seconds']:.2f} | cp -r {local['peer_seconds']:.2f} | "
          f"{local['no_blobs_no_fsync_ratio']:.2f} | <= 1.15 | - |")
    print(f"disk floor (raw write + fsync of the same bytes, this run): "
          f"{local['disk_floor_seconds']:.2f} s; ours / floor {local['ratio_vs_disk_floor']:.2f}")
    print(f"sha256 of the largest file on one core: {results['sha256_largest_seconds']:.2f} s "
          "(what a pull without piece states could not beat)")
    print(f"every byte's piece checks on {results['cpus']} cores, from the page cache: "
          f"{results['verify_all_cores_seconds']:.2f} s (what no verifying pull can beat here; "
          f"cp -r took {local['peer_seconds']:.2f} s)")


if __name__ == "__main__":
    sys.exit(main())

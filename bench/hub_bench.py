"""The Hub API and the verifying mirror (issue 28, item 8).

1. ``snapshot_download`` from ``registry serve`` (every byte checked before it is sent) against
   ``registry pull`` straight from the same local store, same release of ``--size-mib`` MiB,
   cold caches, alternating order.
2. ``--hosts`` concurrent processes pulling one release from the S3 test server (moto, behind
   the tests' request-logging proxy): each straight from S3 (``registry pull --store s3://``)
   against all through one mirror (``registry serve --mirror-cache``; ``registry pull --from``).
   Reported: wall time until the last host is done, and bytes the bucket served (from the
   proxy's log of GetObject requests and their ranges).
3. The mirror's added latency per file: a small file (config.json) and the weights, first
   request (a miss: fetched, verified, kept) and second (a hit), against the same request to
   a server without a mirror (pieces verified on the fly).

    python bench/hub_bench.py [--size-mib 1024] [--hosts 8] [--out bench/results-hub.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import make_release_dir  # noqa: E402
from registry.release import ModelRelease  # noqa: E402
from registry.store import open_store  # noqa: E402
from registry.protocol.verify import read_manifest  # noqa: E402
from tests.release_util import ledger_row, summary  # noqa: E402
from tests.support.faultproxy import FaultProxy  # noqa: E402
from tests.support.s3server import S3Server  # noqa: E402
from tests.web_util import serve  # noqa: E402

PY = sys.executable


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE",
                                                             "TRANSFORMERS_OFFLINE")}
    env.update({"PYTHONPATH": str(ROOT), "HF_HUB_DISABLE_TELEMETRY": "1",
                "HF_HUB_DISABLE_PROGRESS_BARS": "1", **extra})
    return env


def _run(args: list[str], **env: str) -> float:
    t = time.perf_counter()
    p = subprocess.run(args, capture_output=True, text=True, env=_env(**env), cwd=ROOT)
    if p.returncode:
        raise SystemExit(f"{' '.join(args[:6])}...: exit {p.returncode}: {p.stderr[-2000:]}")
    return time.perf_counter() - t


def snapshot(base: str, hf_home: Path) -> float:
    code = ("import os; from huggingface_hub import snapshot_download; "
            "snapshot_download('registry/bench', revision='1', endpoint=os.environ['HF_ENDPOINT'])")
    return _run([PY, "-c", code], HF_ENDPOINT=base, HF_HOME=str(hf_home))


def pull(store: str, cache: Path, target: Path, *extra: str, **env: str) -> float:
    return _run([PY, "-m", "registry", "pull", "bench@1", "--store", store, "--cache", str(cache),
                 "--to", str(target), "--quiet", *extra], **env)


def store_bytes(proxy: FaultProxy, sizes: dict[str, int]) -> int:
    total = 0
    for r in list(proxy.log):
        if r.op != "GetObject":
            continue
        size = next((n for k, n in sizes.items() if r.key.endswith(k)), None)
        if size is None:
            continue
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", r.headers.get("Range") or
                         r.headers.get("range") or "")
        if m:
            end = int(m.group(2)) if m.group(2) else size - 1
            total += min(end, size - 1) - int(m.group(1)) + 1
        else:
            total += size
    return total


def get_seconds(url: str) -> tuple[float, float]:
    """(seconds to the first byte, seconds to the last) of one GET."""
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as r:
        r.read(1)
        first = time.perf_counter() - t
        while r.read(1 << 20):
            pass
    return first, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results-hub.json"))
    args = ap.parse_args()
    out: dict[str, Any] = {"size_mib": args.size_mib, "hosts": args.hosts,
                           "cpus": os.cpu_count(), "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="hub-bench-") as tmp_s:
        tmp = Path(tmp_s)
        src = tmp / "src"
        make_release_dir(src, args.size_mib, safetensors=True)
        local = str(tmp / "store")
        ModelRelease(local).publish(src, "bench", "1", ledger=[ledger_row()],
                                    eval_summary=summary())
        db = f"sqlite:///{tmp / 'i.db'}"
        # 1. snapshot_download from serve vs registry pull from the store
        times: dict[str, list[float]] = {"snapshot_download": [], "registry_pull": []}
        with serve(local, db) as base:
            for i in range(args.repeat):
                order = ["snapshot_download", "registry_pull"][::1 if i % 2 == 0 else -1]
                for arm in order:
                    if arm == "snapshot_download":
                        times[arm].append(snapshot(base, tmp / f"hf{i}"))
                    else:
                        times[arm].append(pull(local, tmp / f"c{i}", tmp / f"t{i}"))
        out["local"] = {k: min(v) for k, v in times.items()}
        out["local"]["ratio"] = out["local"]["snapshot_download"] / out["local"]["registry_pull"]
        print(json.dumps({"local": out["local"]}), flush=True)

        # 2. N hosts straight from S3 vs through one mirror
        s3 = S3Server(serialize=False).start()
        proxy = FaultProxy(s3.endpoint).start()
        os.environ.update(s3.env())
        import boto3

        boto3.client("s3").create_bucket(Bucket="bench")
        url = "s3://bench/root"
        ModelRelease(url).publish(src, "bench", "1", ledger=[ledger_row()],
                                  eval_summary=summary())
        with open_store(url) as st:
            sizes = {f"bench/1/{e.path}": e.size
                     for e in read_manifest(st, "models/bench/1").files}
        via = {"AWS_ENDPOINT_URL": proxy.endpoint}
        proxy.reset()
        t = time.perf_counter()
        with ThreadPoolExecutor(args.hosts) as pool:
            list(pool.map(lambda i: pull(url, tmp / f"d{i}", tmp / f"dt{i}", **via),
                          range(args.hosts)))
        direct = {"seconds": time.perf_counter() - t, "store_bytes": store_bytes(proxy, sizes)}
        proxy.reset()
        with serve(url, db, "--mirror-cache", str(tmp / "mirror"), env=via) as base:
            t = time.perf_counter()
            with ThreadPoolExecutor(args.hosts) as pool:
                list(pool.map(lambda i: pull(url, tmp / f"m{i}", tmp / f"mt{i}", "--from", base),
                              range(args.hosts)))
            mirrored = {"seconds": time.perf_counter() - t,
                        "store_bytes": store_bytes(proxy, sizes)}
            # 3. added latency per file: the mirror (miss, hit) ...
            lat: dict[str, Any] = {}
            proxy.reset()
            for name in ("config.json", "model.safetensors"):
                for f in (tmp / "mirror" / "blobs" / "sha256").iterdir():
                    f.unlink()  # a miss again
                u = f"{base}/registry/bench/resolve/1/{name}"
                lat[name] = {"mirror_miss": get_seconds(u), "mirror_hit": get_seconds(u)}
        # ... against a server without a mirror on the same S3 store
        with serve(url, db, env=via) as base:
            for name in ("config.json", "model.safetensors"):
                lat[name]["no_mirror"] = get_seconds(f"{base}/registry/bench/resolve/1/{name}")
        proxy.stop()
        s3.stop()
    out["fleet"] = {"direct_s3": direct, "mirror": mirrored,
                    "release_bytes": sum(sizes.values())}
    out["latency_s"] = {k: {a: {"first_byte": v[0], "last_byte": v[1]} for a, v in d.items()}
                        for k, d in lat.items()}
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()

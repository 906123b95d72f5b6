"""The CPU that metrics and tracing add to one served request, measured in
process (issue 48, item 8): the steadier companion of bench/obs_bench.py.

The same ASGI application ``registry serve`` runs (``create_app`` over a
local store) is called directly, without sockets, uvicorn or clients, so
that the process's CPU time (``time.process_time``: every thread, the span
export thread included) is the application's own. One child process per arm
(tracing is decided once per process), ``--rounds`` rounds with the arms'
order rotating, ``--requests`` cached Hub downloads of ``config.json`` each;
reported per arm: the minimum and the median over rounds of CPU per request
(the minimum is the least disturbed on a shared machine), and the cost of
``metrics`` and ``traced`` against ``off``. Spans go to oteltap's native
receiver (bench/oteltap_sink.py) at nice 19, not counted here. Without
uvicorn's and h11's share (the same in every arm) a request costs less here
than in bench/obs_bench.py, so the same extra CPU is a larger share of it.

    python bench/obs_inproc.py [--rounds 5] [--requests 1500] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATH = "/registry/tiny/resolve/1/config.json"
ARMS = ("off", "metrics", "traced")


async def _one(app: object) -> None:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": PATH, "raw_path": PATH.encode(),
             "query_string": b"", "root_path": "", "headers": [(b"host", b"127.0.0.1")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": {}}
    first, out = [True], []

    async def receive() -> dict:
        if first[0]:
            first[0] = False
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # no disconnect: the response ends first
        return {}

    async def send(message: dict) -> None:
        out.append(message)

    await app(scope, receive, send)  # type: ignore[operator]
    assert out[0]["status"] == 200, out[0]


def child(store: str, requests: int) -> None:
    """Print the CPU seconds per request of ``requests`` downloads (after a warm-up)."""
    sys.path.insert(0, str(ROOT))
    from registry.api import Registry
    from registry.obs import tracing
    from registry.web import create_app

    async def run() -> float:
        with tempfile.TemporaryDirectory() as tmp, \
                Registry(store, db=f"sqlite:///{tmp}/i.db") as reg:
            app = create_app(reg, hosts=frozenset({"127.0.0.1"}))
            for _ in range(100):
                await _one(app)
            if tracing.enabled():
                tracing._batcher.force_flush()
            t0 = time.process_time()
            for _ in range(requests):
                await _one(app)
            if tracing.enabled():
                tracing._batcher.force_flush()  # the export of these spans counted
            return (time.process_time() - t0) / requests

    print(asyncio.run(run()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results-obs-inproc.json"))
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    sys.path.insert(0, str(ROOT))
    from bench.obs_bench import receiver
    from tests.hub_util import publish, tiny_bert

    load_before = os.getloadavg()
    cpu: dict[str, list[float]] = {a: [] for a in ARMS}
    with tempfile.TemporaryDirectory() as tmp, receiver("sink") as (endpoint, _, received):
        store = str(Path(tmp) / "store")
        publish(store, tiny_bert(Path(tmp), 1), "tiny", "1")
        envs = {"off": {"REGISTRY_METRICS": "0", "OTEL_SDK_DISABLED": "true"},
                "metrics": {"OTEL_SDK_DISABLED": "true"},
                "traced": {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}}
        for r in range(args.rounds):
            k = r % len(ARMS)
            for arm in ARMS[k:] + ARMS[:k]:
                out = subprocess.run([sys.executable, __file__, "--child", store,
                                      str(args.requests)], env={**os.environ, **envs[arm]},
                                     capture_output=True, text=True, check=True)
                cpu[arm].append(float(out.stdout.split()[-1]))
    doc: dict = {"rounds": args.rounds, "requests": args.requests, "cpus": os.cpu_count(),
                 "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                 "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "spans_received": received[0] if received else None, "raw": cpu}
    for arm in ARMS:
        doc[arm] = {"cpu_s_per_request_min": min(cpu[arm]),
                    "cpu_s_per_request_median": statistics.median(cpu[arm])}
    doc["cost"] = {a: {k: doc[a][f"cpu_s_per_request_{k}"] /
                       doc["off"][f"cpu_s_per_request_{k}"] - 1 for k in ("min", "median")}
                   for a in ARMS[1:]}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{args.rounds} rounds x {args.requests} requests, load {load_before[0]:.1f} -> "
          f"{doc['loadavg_after'][0]:.1f}")
    for a in ARMS:
        line = (f"{a:8s} CPU/request min {doc[a]['cpu_s_per_request_min'] * 1e6:7.1f} us, "
                f"median {doc[a]['cpu_s_per_request_median'] * 1e6:7.1f} us")
        if a in doc["cost"]:
            line += (f"  cost: min {doc['cost'][a]['min'] * 100:+.1f}%, "
                     f"median {doc['cost'][a]['median'] * 100:+.1f}%")
        print(line)


if __name__ == "__main__":
    main()

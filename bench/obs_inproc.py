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

    python bench/obs_inproc.py [--rounds 5] [--requests 1500] [--compare CHECKOUT]
                               [--out FILE]

``--compare CHECKOUT`` adds the three arms with another checkout's
``registry`` package (``off@other``...), in the same rounds: its costs are
against its own ``off``.
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


def child(store: str, requests: int, code: str) -> None:
    """Print the CPU seconds per request of ``requests`` downloads (after a
    warm-up), with the ``registry`` package of the checkout ``code``."""
    sys.path.insert(0, code)
    from opentelemetry import trace

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
                trace.get_tracer_provider().force_flush()  # type: ignore[attr-defined]
            t0 = time.process_time()
            for _ in range(requests):
                await _one(app)
            if tracing.enabled():  # the export of these spans counted
                trace.get_tracer_provider().force_flush()  # type: ignore[attr-defined]
            return (time.process_time() - t0) / requests

    print(asyncio.run(run()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results-obs-inproc.json"))
    ap.add_argument("--compare", metavar="CHECKOUT",
                    help="Also run each arm with the registry package of CHECKOUT "
                         "(another checkout, e.g. main's), in the same rounds")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2])
        return
    codes = {"": str(ROOT)} | ({"@other": str(Path(args.compare).resolve())}
                               if args.compare else {})
    arms = [a + c for c in codes for a in ARMS]
    sys.path.insert(0, str(ROOT))
    from bench.obs_bench import receiver
    from tests.hub_util import publish, tiny_bert

    load_before = os.getloadavg()
    cpu: dict[str, list[float]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory() as tmp, receiver("sink") as (endpoint, _, received):
        store = str(Path(tmp) / "store")
        publish(store, tiny_bert(Path(tmp), 1), "tiny", "1")
        envs = {"off": {"REGISTRY_METRICS": "0", "OTEL_SDK_DISABLED": "true"},
                "metrics": {"OTEL_SDK_DISABLED": "true"},
                "traced": {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}}
        for r in range(args.rounds):
            k = r % len(arms)
            for arm in arms[k:] + arms[:k]:
                base, _, other = arm.partition("@")
                code = codes["@" + other if other else ""]
                out = subprocess.run([sys.executable, __file__, "--child", store,
                                      str(args.requests), code],
                                     env={**os.environ, **envs[base]}, cwd=code,
                                     capture_output=True, text=True, check=True)
                cpu[arm].append(float(out.stdout.split()[-1]))
    doc: dict = {"rounds": args.rounds, "requests": args.requests, "cpus": os.cpu_count(),
                 "code": str(ROOT), "compared_with": args.compare,
                 "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                 "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "spans_received": received[0] if received else None, "raw": cpu}
    for arm in arms:
        doc[arm] = {"cpu_s_per_request_min": min(cpu[arm]),
                    "cpu_s_per_request_median": statistics.median(cpu[arm])}
    doc["cost"] = {a: {k: doc[a][f"cpu_s_per_request_{k}"] /
                       doc["off" + a[len(a.partition("@")[0]):]][f"cpu_s_per_request_{k}"] - 1
                       for k in ("min", "median")}
                   for a in arms if not a.startswith("off")}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{args.rounds} rounds x {args.requests} requests, load {load_before[0]:.1f} -> "
          f"{doc['loadavg_after'][0]:.1f}")
    for a in arms:
        line = (f"{a:14s} CPU/request min {doc[a]['cpu_s_per_request_min'] * 1e6:7.1f} us, "
                f"median {doc[a]['cpu_s_per_request_median'] * 1e6:7.1f} us")
        if a in doc["cost"]:
            line += (f"  cost: min {doc['cost'][a]['min'] * 100:+.1f}%, "
                     f"median {doc['cost'][a]['median'] * 100:+.1f}%")
        print(line)


if __name__ == "__main__":
    main()

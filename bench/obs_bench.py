"""The cost of metrics and tracing in ``registry serve`` (issue 48, item 8).

Two ``registry serve`` processes over the same local store run side by side: one
with everything off (``REGISTRY_METRICS=0``, no ``OTEL_*``), one with metrics on
and every request traced (``OTEL_EXPORTER_OTLP_ENDPOINT`` at a real OTLP/HTTP
receiver, ``oteltap``, the SDK's batch exporter; sampling: all). Each trial sends
``--requests`` Hub downloads of a small file (``config.json``, verified before it is
sent: the case where per-request overhead shows most) on ``--clients`` keep-alive
connections, to one server then the other, alternating which goes first. Reported:
the median over trials of each server's throughput (requests/s) and p95 latency, and
the cost of "on" against "off" (the issue's bound: under 3%).

    python bench/obs_bench.py [--trials 7] [--requests 300] [--clients 4]
                              [--out bench/results-obs.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import alternating  # noqa: E402
from tests.hub_util import publish, tiny_bert  # noqa: E402
from tests.support.obs_servers import OtlpReceiver  # noqa: E402
from tests.web_util import serve  # noqa: E402

PATH = "/registry/tiny/resolve/1/config.json"


def burst(base: str, requests: int, clients: int) -> tuple[float, float]:
    """(requests per second, p95 latency in seconds) of ``requests`` GETs of
    PATH on ``clients`` keep-alive connections."""
    host, port = base.removeprefix("http://").split(":")
    latencies: list[float] = []
    lock = threading.Lock()
    per = requests // clients

    def client() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        mine = []
        for _ in range(per):
            t = time.perf_counter()
            conn.request("GET", PATH)
            r = conn.getresponse()
            r.read()
            assert r.status == 200, r.status
            mine.append(time.perf_counter() - t)
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    latencies.sort()
    return len(latencies) / wall, latencies[int(0.95 * (len(latencies) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--no-tracing", action="store_true",
                    help="'on' is metrics alone (the tracing's share of the cost)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results-obs.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = str(root / "store")
        publish(store, tiny_bert(root, 1), "tiny", "1")
        receiver = OtlpReceiver(collect=False)
        off_env = {"REGISTRY_METRICS": "0", "OTEL_SDK_DISABLED": "true"}
        on_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                  "OTEL_SERVICE_NAME": "registry-bench"}
        if args.no_tracing:
            on_env = {"OTEL_SDK_DISABLED": "true"}
        results: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
        try:
            with serve(store, f"sqlite:///{root / 'off.db'}", env=off_env) as off, \
                    serve(store, f"sqlite:///{root / 'on.db'}", env=on_env) as on:
                for base in (off, on):  # warm up: imports, gate verdicts, page cache
                    burst(base, 40, args.clients)
                for first_off, _ in alternating(args.trials):
                    order = [("off", off), ("on", on)] if first_off else [("on", on),
                                                                          ("off", off)]
                    for name, base in order:
                        results[name].append(burst(base, args.requests, args.clients))
        finally:
            receiver.stop()
    med: dict[str, Any] = {name: {"rps": statistics.median(r[0] for r in rs),
                                  "p95_s": statistics.median(r[1] for r in rs)}
                           for name, rs in results.items()}
    doc = {"trials": args.trials, "tracing": not args.no_tracing, "requests": args.requests, "clients": args.clients,
           "off": med["off"], "on": med["on"],
           "throughput_cost": 1 - med["on"]["rps"] / med["off"]["rps"],
           "p95_cost": med["on"]["p95_s"] / med["off"]["p95_s"] - 1,
           "sampler": "none (tracing off)" if args.no_tracing else
           os.environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on"),
           "sampler_arg": os.environ.get("OTEL_TRACES_SAMPLER_ARG"), "raw": results}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"off: {med['off']['rps']:.1f} req/s, p95 {med['off']['p95_s'] * 1e3:.2f} ms; "
          f"on: {med['on']['rps']:.1f} req/s, p95 {med['on']['p95_s'] * 1e3:.2f} ms; "
          f"throughput cost {doc['throughput_cost'] * 100:+.1f}%, "
          f"p95 cost {doc['p95_cost'] * 100:+.1f}% (sampler {doc['sampler']} "
          f"{doc['sampler_arg'] or ''})")


if __name__ == "__main__":
    main()

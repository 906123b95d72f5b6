"""The cost of metrics and tracing in ``registry serve`` (issue 48, item 8).

Three ``registry serve`` processes over the same local store run side by side,
in one interleaved run:

``off``
    everything off (``REGISTRY_METRICS=0``, ``OTEL_SDK_DISABLED=true``);
``metrics``
    the Prometheus metrics on, no traces;
``traced``
    metrics on and every request traced (``OTEL_EXPORTER_OTLP_ENDPOINT`` at a
    real OTLP/HTTP receiver, ``oteltap``, on this host; the registry's batch
    processor at its defaults; the sampler is the SDK's default, parent-based
    always-on, unless ``OTEL_TRACES_SAMPLER`` says otherwise).

The receiver and its CPU. A deployment exports to a collector on another
host; here the receiver shares the benchmark's cores, so it runs at the lowest
priority (``nice 19``) and its CPU is measured apart (user + system from
/proc, all its threads). ``--receiver sink`` (the default) is oteltap's native
receiver without its NDJSON printing (bench/oteltap_sink.py), which also
counts the spans it received (a check that none was dropped);
``--receiver cli`` is the ``oteltap --port`` command the tests run, whose
Python side costs more CPU per span than the traced server does. Reported
for ``traced``: throughput and p95 with the receiver on the same cores
(measured), the server's CPU per request (the receiver excluded: the figure
for a server exporting to another host) and the server's plus the
receiver's (the receiver counted against the server).

Each trial sends ``--requests`` Hub downloads of a small file (``config.json``,
verified before it is sent: the case where per-request overhead shows most) on
``--clients`` keep-alive connections to each server in turn, the order rotating
from trial to trial; the batch processor keeps its defaults (exports every 5 s
or 512 spans). Reported per arm: the median over trials of throughput
(requests/s) and p95 latency, the server's CPU seconds per request over the
whole run (user + system of the process from /proc, from before the first
trial to after the last export, its export thread included), the median and
the minimum over its bursts of the CPU per request of each burst (the minimum
is the least disturbed by other work on a shared machine: disturbance only
adds), and each arm's cost against ``off`` (the issue's bound: under 3%).

    python bench/obs_bench.py [--trials 9] [--requests 200] [--clients 4]
                              [--receiver sink|cli] [--out bench/results-obs.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.hub_util import publish, tiny_bert  # noqa: E402
from tests.support.obs_servers import require  # noqa: E402
from tests.support.servers import free_port  # noqa: E402

PATH = "/registry/tiny/resolve/1/config.json"
ARMS = ("off", "metrics", "traced")
#: seconds for the batch processor's schedule (5 s by default) and the receiver
EXPORT_DELAY = 6.5


@contextmanager
def serve(store: str, db: str, env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """A ``registry serve --port 0`` process: (base URL, its pid)."""
    proc = subprocess.Popen([sys.executable, "-m", "registry", "serve", "--port", "0",
                             "--store", store, "--db", db], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env={**os.environ, **env})
    try:
        assert proc.stdout is not None
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", proc.stdout.readline())
        assert m, "registry serve did not start"
        yield f"http://127.0.0.1:{m.group(1)}", proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def receiver(kind: str) -> Iterator[tuple[str, int, list[int]]]:
    """An OTLP/HTTP receiver at nice 19 (module docstring): (endpoint, pid,
    [spans received], filled in when it stops, sink only)."""
    port = free_port()
    if kind == "sink":
        cmd = [sys.executable, str(ROOT / "bench" / "oteltap_sink.py"), str(port)]
    else:
        cmd = [require("oteltap", "PyPI package oteltap"), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            preexec_fn=lambda: os.nice(19))
    received: list[int] = []
    try:
        assert proc.stdout is not None
        assert "Listening" in proc.stdout.readline(), "the receiver did not start"
        if kind == "cli":  # it prints every span: read them away, unparsed
            out = proc.stdout
            threading.Thread(target=lambda: out.read(), daemon=True).start()
        yield f"http://127.0.0.1:{port}", proc.pid, received
    finally:
        proc.terminate()
        if kind == "sink":
            assert proc.stdout is not None
            last = proc.stdout.read().split()
            received.extend(int(x) for x in last[-1:])
        proc.wait(timeout=30)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid``, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    ap.add_argument("--trials", type=int, default=9)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--pause", type=float, default=0.2, help="Seconds between bursts")
    ap.add_argument("--receiver", choices=("sink", "cli"), default="sink")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results-obs.json"))
    args = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = str(root / "store")
        publish(store, tiny_bert(root, 1), "tiny", "1")
        results: dict[str, list[tuple[float, float]]] = {a: [] for a in ARMS}
        loads: list[float] = []
        #: the server's CPU per request during each of its bursts (its export
        #: thread's share included as it falls: batches leave every 512 spans)
        burst_cpu: dict[str, list[float]] = {a: [] for a in ARMS}
        with ExitStack() as stack:
            endpoint, rpid, received = stack.enter_context(receiver(args.receiver))
            envs = {"off": {"REGISTRY_METRICS": "0", "OTEL_SDK_DISABLED": "true"},
                    "metrics": {"OTEL_SDK_DISABLED": "true"},
                    "traced": {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                               "OTEL_SERVICE_NAME": "registry-bench"}}
            with ExitStack() as servers_up:
                servers = {a: servers_up.enter_context(serve(store, f"sqlite:///{root / a}.db",
                                                             envs[a])) for a in ARMS}
                for base, _ in servers.values():  # warm up: imports, verdicts, page cache
                    burst(base, 40, args.clients)
                time.sleep(EXPORT_DELAY)  # the warm-up's spans exported
                cpu = {a: -cpu_seconds(pid) for a, (_, pid) in servers.items()}
                cpu["receiver"] = -cpu_seconds(rpid)
                for trial in range(args.trials):
                    k = trial % len(ARMS)
                    loads.append(os.getloadavg()[0])
                    for arm in ARMS[k:] + ARMS[:k]:
                        before = cpu_seconds(servers[arm][1])
                        results[arm].append(burst(servers[arm][0], args.requests,
                                                  args.clients))
                        per = args.requests // args.clients * args.clients
                        burst_cpu[arm].append((cpu_seconds(servers[arm][1]) - before) / per)
                        time.sleep(args.pause)
                time.sleep(EXPORT_DELAY)  # the last spans exported
                done = args.trials * (args.requests // args.clients * args.clients)
                cpu = {a: (cpu[a] + cpu_seconds(pid)) / done
                       for a, (_, pid) in servers.items()} | \
                    {"receiver": (cpu["receiver"] + cpu_seconds(rpid)) / done}
        spans = received[0] if received else None
    med: dict[str, Any] = {a: {"rps": statistics.median(r[0] for r in rs),
                               "p95_s": statistics.median(r[1] for r in rs),
                               "cpu_s_per_request": cpu[a],
                               "burst_cpu_s_per_request_median": statistics.median(burst_cpu[a]),
                               "burst_cpu_s_per_request_min": min(burst_cpu[a])}
                           for a, rs in results.items()}
    cost = {a: {"throughput": 1 - med[a]["rps"] / med["off"]["rps"],
                "p95": med[a]["p95_s"] / med["off"]["p95_s"] - 1,
                "cpu_per_request": med[a]["cpu_s_per_request"] /
                med["off"]["cpu_s_per_request"] - 1,
                "burst_cpu_per_request_median": med[a]["burst_cpu_s_per_request_median"] /
                med["off"]["burst_cpu_s_per_request_median"] - 1,
                "burst_cpu_per_request_min": med[a]["burst_cpu_s_per_request_min"] /
                med["off"]["burst_cpu_s_per_request_min"] - 1} for a in ARMS[1:]}
    cost["traced"]["cpu_per_request_with_receiver"] = \
        (med["traced"]["cpu_s_per_request"] + cpu["receiver"]) / \
        med["off"]["cpu_s_per_request"] - 1
    warm = 40 // args.clients * args.clients  # the warm-up's requests were traced too
    rec = {"kind": args.receiver, "nice": 19, "cpu_s_per_traced_request": cpu["receiver"],
           "spans_received": spans,
           "spans_per_traced_request": spans / (done + warm) if spans else None}
    doc = {"trials": args.trials, "requests": args.requests, "clients": args.clients,
           "sampler": os.environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on"),
           "sampler_arg": os.environ.get("OTEL_TRACES_SAMPLER_ARG"),
           "cpus": os.cpu_count(), "loadavg_before": load_before,
           "loadavg_after": os.getloadavg(), "loadavg_per_trial": loads,
           "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           **med, "receiver": rec, "cost": cost, "raw": results, "raw_burst_cpu": burst_cpu}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{args.trials} trials x {args.requests} requests, load {load_before[0]:.1f} -> "
          f"{doc['loadavg_after'][0]:.1f}, sampler {doc['sampler']} {doc['sampler_arg'] or ''}")
    for a in ARMS:
        line = (f"{a:8s} {med[a]['rps']:7.1f} req/s  p95 {med[a]['p95_s'] * 1e3:7.2f} ms  "
                f"CPU {med[a]['cpu_s_per_request'] * 1e3:6.2f} ms/request")
        if a in cost:
            line += (f"  cost: throughput {cost[a]['throughput'] * 100:+.1f}%, p95 "
                     f"{cost[a]['p95'] * 100:+.1f}%, CPU {cost[a]['cpu_per_request'] * 100:+.1f}% "
                     f"(bursts: median {cost[a]['burst_cpu_per_request_median'] * 100:+.1f}%, "
                     f"min {cost[a]['burst_cpu_per_request_min'] * 100:+.1f}%)")
        print(line)
    print(f"receiver ({args.receiver}, nice 19): CPU {cpu['receiver'] * 1e3:.2f} ms/traced request, "
          f"{spans} spans received; traced CPU with the receiver's: "
          f"{cost['traced']['cpu_per_request_with_receiver'] * 100:+.1f}%")


if __name__ == "__main__":
    main()

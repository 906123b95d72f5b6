"""The mirror under load, before and after issue 51.

``registry serve --mirror-cache`` in front of the S3 test server (moto,
behind the tests' request-logging proxy), run once from each code tree given
(``--before``: a checkout of the code before the change, default /work/main;
``--after``: this tree), same release, same machine:

1. Throughput at 1/8/32/64 clients (threads, one request at a time each) for
   the JSON API (``/api/v1/models``), a small file (config.json), 1 MiB
   ranges of the weights and full downloads of the weights (``--size-mib``),
   warm mirror: requests/s, p50/p95 latency, and store requests per client
   request (the proxy's log).
2. A cold stampede: ``--stampede`` clients ask for the weights at once from a
   cold mirror while the store answers each read ``--store-delay`` seconds
   late and then streams it at ``--store-rate-mib`` MiB/s (the proxy; 0: all
   at once) and one more client polls the JSON API: first-byte times of the
   stampede, when the last client had its whole file, the JSON API's p95
   during it and idle. The release is published with ``--piece-mib`` pieces,
   so a mirror that streams verified pieces (issue 51, item 3) can send the
   first piece before the whole file has arrived. With ``--rounds N`` each
   tree runs N stampedes, each on a new server with a cold cache, the trees
   taking turns round by round (``--stampede-only``); the JSON API's idle
   p95 of a round is measured on its server just before and just after its
   stampede, so both see the same load from other work on the machine, and
   each round's ratio is kept (``json_ratios``), with the JSON API's p95
   while the clients wait for the first piece and while bytes stream.
   ``MIRROR_BENCH_TRACE=FILE`` appends every poll and the CPU seconds of the
   server's threads to FILE.

    python bench/mirror_bench.py [--size-mib 16] [--before /work/main] [--out ...]
    python bench/mirror_bench.py --stampede-only --size-mib 64 --piece-mib 4 \
        --store-rate-mib 16 --rounds 4  # the stampede alone; merged into --out as "streaming"
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import make_release_dir  # noqa: E402
from registry.release import ModelRelease  # noqa: E402
from tests.release_util import ledger_row, summary  # noqa: E402
from tests.support.faultproxy import Action, FaultProxy  # noqa: E402
from tests.support.s3server import S3Server  # noqa: E402
from tests.web_util import serve  # noqa: E402

MIB = 1 << 20
W = "/registry/bench/resolve/1/model.safetensors"


def request(port: int, path: str, headers: dict[str, str] | None = None,
            first_byte: list[float] | None = None) -> tuple[int, int, float]:
    """(status, body bytes, seconds) of one GET on a fresh connection."""
    t = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        n = len(r.read(1))
        if first_byte is not None:
            first_byte.append(time.perf_counter() - t)
        while block := r.read(MIB):
            n += len(block)
        return r.status, n, time.perf_counter() - t
    finally:
        conn.close()


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def load(port: int, kind: str, clients: int, n: int, size: int) -> dict[str, Any]:
    def one(i: int) -> tuple[int, int, float]:
        if kind == "json":
            return request(port, "/api/v1/models")
        if kind == "small":
            return request(port, "/registry/bench/resolve/1/config.json")
        if kind == "range":
            a = random.Random(i).randrange(0, size - MIB)
            return request(port, W, {"Range": f"bytes={a}-{a + MIB - 1}"})
        return request(port, W)
    t = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        got = list(pool.map(one, range(n)))
    wall = time.perf_counter() - t
    bad = [g for g in got if g[0] not in (200, 206)]
    lat = [g[2] for g in got]
    return {"requests": n, "errors": len(bad), "rps": n / wall, "p50_s": pct(lat, 0.5),
            "p95_s": pct(lat, 0.95), "mib_s": sum(g[1] for g in got) / MIB / wall}


def _env(tree: Path, proxy: FaultProxy) -> dict[str, str]:
    """The environment of a server of ``tree`` (and the working folder set:
    ``python -m registry`` imports from it first)."""
    os.chdir(tree)
    # a slow store is slow, not down
    return {"AWS_ENDPOINT_URL": proxy.endpoint, "PYTHONPATH": str(tree),
            "REGISTRY_S3_READ_TIMEOUT": "300"}


def interleaved(trees: list[tuple[str, Path]], url: str, db: str, proxy: FaultProxy,
                tmp: Path, size: int, args: argparse.Namespace) -> dict[str, Any]:
    """``--stampede-only``: ``args.rounds`` rounds, each a cold stampede on
    every tree in turn, so the trees see the same load from other work."""
    rows: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in trees}
    for i in range(args.rounds):
        for label, tree in trees:
            rows[label].append(_stampede_once(url, db, proxy, tmp, size, args,
                                              f"{label}-{i}", _env(tree, proxy)))
    return {label: {"tree": str(tree), "stampede": _summary(rows[label])}
            for label, tree in trees}


def run_tree(tree: Path, url: str, db: str, proxy: FaultProxy, tmp: Path, size: int,
             args: argparse.Namespace, label: str) -> dict[str, Any]:
    env = _env(tree, proxy)
    out: dict[str, Any] = {"tree": str(tree)}
    counts = {"json": args.requests, "small": args.requests, "range": args.requests // 2,
              "full": 0}
    with serve(url, db, "--mirror-cache", str(tmp / f"mirror-{label}"), env=env) as base:
        port = int(base.rsplit(":", 1)[1])
        request(port, W)  # warm: the weights are in the mirror
        request(port, "/registry/bench/resolve/1/config.json")
        table: dict[str, Any] = {}
        for kind in ("json", "small", "range", "full"):
            for c in args.clients:
                n = counts[kind] or max(8, c)
                proxy.reset()
                row = load(port, kind, c, n, size)
                row["store_requests_per_request"] = len(list(proxy.log)) / n
                table[f"{kind}@{c}"] = row
                print(label, kind, c, json.dumps(row), flush=True)
        out["throughput"] = table
    out["stampede"] = stampede(url, db, proxy, tmp, size, args, label, env)
    return out


def _poll(port: int, n: int, stop: Any, go: Any, out: Any) -> None:
    """In its own process (its GIL is not the stampede clients'): once ``go``
    is set, ``(start, seconds)`` of each JSON API request (``start`` on the
    shared ``time.time()`` clock), ``n`` of them or until ``stop`` is set."""
    out.put("ready")
    go.wait()
    got: list[tuple[float, float]] = []
    while len(got) < n and not stop.is_set():
        t = time.time()
        got.append((t, request(port, "/api/v1/models")[2]))
    out.put(got)


def polled(port: int, n: int) -> tuple[Any, Any, Any, Any]:
    """Start :func:`_poll` in a new process, ready to go; returns (process,
    queue, go event, stop event)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    q, go, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    p = ctx.Process(target=_poll, args=(port, n, stop, go, q))
    p.start()
    assert q.get() == "ready"
    return p, q, go, stop


def idle_polls(port: int, n: int = 100) -> list[float]:
    """Seconds of ``n`` JSON API requests from another process, nothing else asked."""
    proc, q, go, _ = polled(port, n)
    go.set()
    got = q.get()
    proc.join()
    return [s for _, s in got]


def stampede(url: str, db: str, proxy: FaultProxy, tmp: Path, size: int,
             args: argparse.Namespace, label: str, env: dict[str, str]) -> dict[str, Any]:
    """``args.rounds`` cold stampedes, with a slow store and a JSON poller,
    each on a new server with a cold cache; the JSON API's idle p95 is
    measured on that server just before and just after its stampede (the
    file warm, nothing else asked), so idle and stampede see the same load
    from other work on the machine. One row per round (the last round's
    also at the top level, as before), and the rounds' ratios."""
    return _summary([_stampede_once(url, db, proxy, tmp, size, args, f"{label}-{i}", env)
                     for i in range(args.rounds)])


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [r["json_ratio"] for r in rows]
    return {**rows[-1], "rounds": rows, "json_ratios": ratios,
            "json_ratio_median": statistics.median(ratios),
            "json_ratio_max": max(ratios)}


def _cpu() -> dict[str, float]:
    """CPU seconds of this process, of its children (the servers, the
    poller) and of each of their threads, for MIRROR_BENCH_TRACE."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")

    def secs(stat: str) -> tuple[str, float]:
        f = stat.rsplit(")", 1)[1].split()
        return stat[stat.index("(") + 1:stat.rindex(")")], (int(f[11]) + int(f[12])) / tick

    pids = [os.getpid()]
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) \
                    == os.getpid():
                pids.append(int(d.name))
        except OSError:
            continue
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            who = "bench" if pid == os.getpid() else "serve" if " serve " in cmd else \
                "poller" if "multiprocessing" in cmd else f"child{pid}"
            out[who] = secs(Path(f"/proc/{pid}/stat").read_text())[1]
        except OSError:
            continue
        if who != "serve":
            continue
        for t in Path(f"/proc/{pid}/task").glob("*"):
            try:
                f = (t / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[f"{who}:{t.name}:user"] = int(f[11]) / tick
            out[f"{who}:{t.name}:sys"] = int(f[12]) / tick
    return out


def _stampede_once(url: str, db: str, proxy: FaultProxy, tmp: Path, size: int,
                   args: argparse.Namespace, label: str,
                   env: dict[str, str]) -> dict[str, Any]:
    with serve(url, db, "--mirror-cache", str(tmp / f"cold-{label}"), env=env) as base:
        port = int(base.rsplit(":", 1)[1])
        request(port, "/registry/bench/resolve/1/config.json")  # facts warm, weights cold
        load_before = os.getloadavg()[0]
        idle = idle_polls(port)
        proxy.reset()
        rate = args.store_rate_mib * MIB
        proxy.rules.append(lambda r: Action("delay", seconds=args.store_delay, rate=rate)
                           if r.op == "GetObject" and r.key.endswith("model.safetensors")
                           else None)
        first: list[float] = []
        cpu0 = _cpu() if os.environ.get("MIRROR_BENCH_TRACE") else {}
        poller, q, go, done = polled(port, 1 << 30)  # the JSON API, from another process
        t = time.perf_counter()
        t0 = time.time()
        with ThreadPoolExecutor(args.stampede) as pool:
            futs = [pool.submit(request, port, W, None, first) for _ in range(args.stampede)]
            time.sleep(0.2)
            go.set()
            res = [f.result() for f in futs]
        done.set()
        timed = q.get()
        poller.join()
        proxy.rules.clear()
        store_gets = sum(1 for r in proxy.log if r.op == "GetObject")
        cpu1 = _cpu() if cpu0 else {}
        idle_after = idle_polls(port)  # the same server, the file warm now
        during = [s for _, s in timed]
        if os.environ.get("MIRROR_BENCH_TRACE"):  # every poll, for a closer look
            with open(os.environ["MIRROR_BENCH_TRACE"], "a") as f:
                f.write(json.dumps({"label": label, "first": sorted(first), "idle": idle,
                                    "idle_after": idle_after,
                                    "cpu": {k: v - cpu0.get(k, 0) for k, v in cpu1.items()},
                                    "during": [(a - t0, s) for a, s in timed]}) + "\n")
        idle_before, idle = idle, idle + idle_after
        # the phases: waiting for the first verified piece, then bytes streaming
        streaming_from = t0 + min(first)
        waiting = [s for a, s in timed if a + s < streaming_from]
        streaming = [s for a, s in timed if a + s >= streaming_from]
        row = {
            "clients": args.stampede, "store_delay_s": args.store_delay,
            "store_rate_mib_s": args.store_rate_mib, "piece_mib": args.piece_mib,
            "load_avg_1m": load_before,
            "wall_s": time.perf_counter() - t,
            "ok": sum(1 for r in res if r[0] == 200 and r[1] == size),
            "first_byte_s": {"min": min(first), "p50": pct(first, 0.5), "max": max(first)},
            "last_body_done_s": max(r[2] for r in res),
            "json_idle_p95_s": pct(idle, 0.95), "json_during_p95_s": pct(during, 0.95),
            "json_idle_before_p95_s": pct(idle_before, 0.95),
            "json_idle_after_p95_s": pct(idle_after, 0.95),
            "json_ratio": pct(during, 0.95) / pct(idle, 0.95),
            "json_during_max_s": max(during) if during else None,
            "json_polls_during": len(during),
            "json_waiting_p95_s": pct(waiting, 0.95), "json_polls_waiting": len(waiting),
            "json_streaming_p95_s": pct(streaming, 0.95),
            "json_polls_streaming": len(streaming),
            "store_get_requests": store_gets}
        print(label, "stampede", json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=16)
    ap.add_argument("--clients", default="1,8,32,64")
    ap.add_argument("--stampede", type=int, default=48)
    ap.add_argument("--requests", type=int, default=200, help="per row (ranges: half)")
    ap.add_argument("--store-delay", type=float, default=2.0)
    ap.add_argument("--store-rate-mib", type=float, default=0.0,
                    help="MiB/s the store streams the weights at in the stampede (0: at once)")
    ap.add_argument("--piece-mib", type=int, default=0,
                    help="piece size of the release (0: the default, 64 MiB)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="cold stampedes per tree, each with its own idle p95")
    ap.add_argument("--stampede-only", action="store_true",
                    help="only the cold stampede; merged into --out under --key")
    ap.add_argument("--key", default="streaming",
                    help="where --stampede-only puts its run in --out (a list of runs when "
                         "the key already holds one)")
    ap.add_argument("--before", default="/work/main")
    ap.add_argument("--after", default=str(ROOT))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results-mirror.json"))
    args = ap.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    out: dict[str, Any] = {"size_mib": args.size_mib, "cpus": os.cpu_count(),
                           "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="mirror-bench-") as tmp_s:
        tmp = Path(tmp_s)
        src = tmp / "src"
        make_release_dir(src, args.size_mib * 4 // 3 + 1, safetensors=True)
        s3 = S3Server(serialize=False).start()
        proxy = FaultProxy(s3.endpoint).start()
        os.environ.update(s3.env())
        import boto3

        boto3.client("s3").create_bucket(Bucket="bench")
        url = "s3://bench/root"
        if args.piece_mib:
            os.environ["REGISTRY_PIECE_SIZE"] = str(args.piece_mib * MIB)
        ModelRelease(url).publish(src, "bench", "1", ledger=[ledger_row()],
                                  eval_summary=summary())
        size = (src / "model.safetensors").stat().st_size
        db = f"sqlite:///{tmp / 'i.db'}"
        # --before '': the after tree alone
        trees = [(label, Path(tree)) for label, tree in
                 (("before", args.before), ("after", args.after)) if tree]
        if args.stampede_only:
            out.update(interleaved(trees, url, db, proxy, tmp, size, args))
        for label, tree in trees if not args.stampede_only else ():
            out[label] = run_tree(tree, url, db, proxy, tmp, size, args, label)
        proxy.stop()
        s3.stop()
    out["load_after"] = os.getloadavg()[0]
    if args.stampede_only:  # kept beside the full run's table
        whole = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
        if isinstance(whole.get(args.key), list):
            whole[args.key].append(out)
        else:
            whole[args.key] = out
        Path(args.out).write_text(json.dumps(whole, indent=2) + "\n")
    else:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: {f: out[k]["stampede"][f] for f in
                          ("json_ratios", "json_ratio_median", "json_ratio_max")}
                      for k in ("before", "after") if k in out}, indent=2))


if __name__ == "__main__":
    main()

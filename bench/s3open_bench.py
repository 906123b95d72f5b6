"""CPU of opening an S3 store and sending its first request (issue 33 item 6).

Every S3 store a process opens used to parse botocore's S3 service model and
endpoint rules again (s3fs gives each filesystem a session of its own). The
registry's stores share one parsed copy (registry.store.s3session). Compared,
in alternating trials on one moto server started in this process:

- ours: ``open_store("s3://...")`` + ``exists()`` + ``close()``;
- peer: stock ``s3fs.S3FileSystem`` (a session of its own) + ``exists()``;
- floor: ``exists()`` on a store already open (the request alone).

CPU seconds of this process per open (moto's included: it serves in a thread
here), medians of ``--repeat`` trials of ``--opens`` opens each.

    python bench/s3open_bench.py [--opens 20] [--repeat 5] [--out FILE]
"""

from __future__ import annotations

import json
import logging
import os
import resource
import statistics
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import bench_args  # noqa: E402

import boto3  # noqa: E402
import s3fs  # noqa: E402

from registry.store import open_store  # noqa: E402
from tests.support.s3server import S3Server  # noqa: E402


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def per_open(fn, n: int) -> float:
    start = cpu()
    for _ in range(n):
        fn()
    return (cpu() - start) / n


def main() -> None:
    ap = bench_args(__doc__, "s3open", repeat=5)
    ap.add_argument("--opens", type=int, default=20)
    args = ap.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = S3Server(serialize=False).start()
    os.environ.update(server.env())
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/root"

    def ours() -> None:
        with open_store(url) as store:
            store.exists("absent")

    def peer() -> None:
        fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)
        fs.exists(f"{bucket}/root/absent")

    warm = open_store(url)

    def floor() -> None:
        warm.exists("absent")

    arms = {"ours": ours, "peer_s3fs": peer, "floor_request": floor}
    for fn in arms.values():  # warm-up, not counted
        fn()
    trials: dict[str, list[float]] = {k: [] for k in arms}
    for i in range(args.repeat):
        order = list(arms) if i % 2 == 0 else list(reversed(arms))
        for name in order:
            trials[name].append(per_open(arms[name], args.opens))
    med = {k: statistics.median(v) for k, v in trials.items()}
    result = {
        "what": "CPU seconds per S3 store open + first request (moto in-process)",
        "opens_per_trial": args.opens, "repeat": args.repeat,
        "median_cpu_s": med, "trials_cpu_s": trials,
        "ratio_ours_to_peer": med["ours"] / med["peer_s3fs"],
        "ratio_ours_to_floor": med["ours"] / med["floor_request"],
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: round(v * 1000, 1) for k, v in med.items()}), "ms CPU;",
          "ours/peer %.2f, ours/floor %.1f" % (result["ratio_ours_to_peer"],
                                                 result["ratio_ours_to_floor"]))
    warm.close()
    server.stop()


if __name__ == "__main__":
    main()

"""Push and pull through a real OCI registry (issue 45 item 7).

A ``--size-mib`` MiB model directory in ``--shards`` safetensors shards (the
4 GiB / 8-shard directory of bench/shards_bench.py by default) is published to a
local store, then, against Debian's ``docker-registry`` (CNCF distribution 2.8,
filesystem storage, on loopback):

* push: ``registry push`` (Python API: every blob streamed from the store, the
  signature-free release, a new repository each round so every byte moves)
  against ``skopeo copy oci:LAYOUT docker://...`` of the same artifact's OCI
  layout, and oras-py's ``push`` of the directory's files;
* pull: ``registry pull oci://...`` (cold cache; every byte checked against the
  manifest; default blob cache and fsync, and the one-write ``--no-blobs
  --no-fsync`` form) against ``skopeo copy docker://... oci:DIR`` and oras-py's
  ``pull``.

Arms alternate order between rounds; each starts from a synced disk and warmed
memory (bench.harness). Ratios are ours / peer, medians.

    python bench/oci_bench.py [--size-mib 4096] [--shards 8] [--repeat 2] [--out FILE]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import bench_args, MIB, prefault, timed  # noqa: E402
from bench.shards_bench import EVALS, LEDGER, make_sharded_dir  # noqa: E402

ORAS = r'''
import json, os, sys, oras.client
kind, host, target, path = sys.argv[1:5]
c = oras.client.OrasClient(hostname=host, insecure=True)
if kind == "push":
    os.chdir(path)
    files = sorted(str(p) for p in __import__("pathlib").Path(".").rglob("*") if p.is_file())
    c.push(files=files, target=target, disable_path_validation=True)
else:
    c.pull(target=target, outdir=path)
'''


#: where skopeo (run as root) keeps its blob-info cache
SKOPEO_CACHE = "/var/lib/containers/cache"


def _settle(nbytes: int) -> None:
    os.sync()
    prefault(nbytes * 5 // 4)


def _run(args: list[str]) -> None:
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{' '.join(args[:5])}: exit {p.returncode}: {p.stderr[-2000:]}")


def targets(med: dict[str, float], size: str) -> dict[str, dict[str, Any]]:
    """The rows bench/aggregate.py tabulates: ours, the peer, the ratio."""
    rows = {}
    for ours, label in (("push_ours", "push"), ("pull_ours", "pull (blob cache, fsync)"),
                        ("pull_ours_one_write", "pull --no-blobs --no-fsync")):
        side = "push" if ours.startswith("push") else "pull"
        for peer, peer_label in (("skopeo", "skopeo copy"), ("oras", "oras-py")):
            rows[f"{label}, {size}, vs {peer_label}"] = {
                "ours": med[ours], "peer": f"{peer_label} ({med[f'{side}_{peer}']:.3g} s)",
                "ratio": med[ours] / med[f"{side}_{peer}"], "target": "(reported)"}
    return rows


def main() -> None:
    ap = bench_args(__doc__, "oci", repeat=2)
    ap.add_argument("--size-mib", type=int, default=4096)
    ap.add_argument("--shards", type=int, default=8)
    args = ap.parse_args()

    from registry.oci.client import OciClient
    from registry.oci.pull import pull_oci
    from registry.oci.push import push
    from registry.oci.ref import parse_ref
    from registry.release import ModelRelease
    from registry.store import open_store
    from tests.support.ociregistry import Distribution

    skopeo = shutil.which("skopeo")
    if skopeo is None or shutil.which("docker-registry") is None:
        raise SystemExit("needs docker-registry and skopeo (apt-get install docker-registry "
                         "skopeo)")
    work = Path(tempfile.mkdtemp(prefix="oci-bench-", dir=os.environ.get("BENCH_TMP")))
    dist = Distribution().start()
    times: dict[str, list[float]] = {k: [] for k in (
        "push_ours", "push_skopeo", "push_oras", "pull_ours", "pull_ours_one_write",
        "pull_skopeo", "pull_oras")}
    try:
        src = work / "src"
        make_sharded_dir(src, args.size_mib, args.shards)
        store_url = str(work / "store")
        ModelRelease(store_url).publish(src, "bench", "1", ledger=LEDGER, eval_summary=EVALS)
        store = open_store(store_url)
        nbytes = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
        host = dist.host
        seed = parse_ref(f"oci://{host}/bench/seed")
        with OciClient(seed, insecure=True) as c:
            push(store, "bench", "1", seed, c)
        layout = work / "layout"
        _run([skopeo, "copy", "--src-tls-verify=false", "--preserve-digests",
              f"docker://{host}/bench/seed:1", f"oci:{layout}:1"])

        def fresh() -> str:
            return f"bench/r{uuid.uuid4().hex[:12]}"

        def push_ours() -> None:
            ref = parse_ref(f"oci://{host}/{fresh()}")
            with OciClient(ref, insecure=True) as c:
                push(store, "bench", "1", ref, c)

        def push_skopeo() -> None:
            # skopeo's blob-info cache remembers which repositories hold each blob
            # and mounts from them: forgotten (untimed, below), so every byte moves
            _run([skopeo, "copy", "--dest-tls-verify=false", "--preserve-digests",
                  f"oci:{layout}:1", f"docker://{host}/{fresh()}:1"])

        def push_oras() -> None:
            _run([sys.executable, "-c", ORAS, "push", host, f"{host}/{fresh()}:1", str(src)])

        def pull_ours(**kw: Any) -> None:
            ref = parse_ref(f"oci://{host}/bench/seed:1")
            with OciClient(ref, insecure=True) as c:
                pull_oci(c, ref, to=work / "out", cache=work / "cache", **kw)

        def pull_skopeo() -> None:
            _run([skopeo, "copy", "--src-tls-verify=false", "--preserve-digests",
                  f"docker://{host}/bench/seed:1", f"oci:{work / 'out'}:1"])

        def pull_oras() -> None:
            _run([sys.executable, "-c", ORAS, "pull", host, f"{host}/bench/seed:1",
                  str(work / "out")])

        arms = {"push_ours": push_ours, "push_skopeo": push_skopeo, "push_oras": push_oras,
                "pull_ours": pull_ours,
                "pull_ours_one_write": lambda: pull_ours(blobs=False, fsync=False),
                "pull_skopeo": pull_skopeo, "pull_oras": pull_oras}
        order = list(arms)
        for r in range(args.repeat):
            for name in (order if r % 2 == 0 else order[::-1]):
                shutil.rmtree(work / "out", ignore_errors=True)
                shutil.rmtree(work / "cache", ignore_errors=True)
                if name == "push_skopeo":
                    for cache in Path(SKOPEO_CACHE).glob("blob-info-cache-v1.*"):
                        cache.unlink()
                _settle(nbytes)
                times[name].append(timed(arms[name]))
                print(f"{name}: {times[name][-1]:.2f} s", file=sys.stderr)
    finally:
        dist.stop()
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    gib = nbytes / (1024 * MIB)
    results = {"size_mib": args.size_mib, "shards": args.shards, "repeat": args.repeat,
               "cores": os.cpu_count(), "seconds": med, "runs": times,
               "gib_per_s": {k: gib / v for k, v in med.items()},
               "ratios": {"push_vs_skopeo": med["push_ours"] / med["push_skopeo"],
                          "push_vs_oras": med["push_ours"] / med["push_oras"],
                          "pull_vs_skopeo": med["pull_ours"] / med["pull_skopeo"],
                          "pull_vs_oras": med["pull_ours"] / med["pull_oras"],
                          "pull_one_write_vs_skopeo":
                              med["pull_ours_one_write"] / med["pull_skopeo"],
                          "pull_one_write_vs_oras":
                              med["pull_ours_one_write"] / med["pull_oras"]}}
    results["targets"] = targets(med, f"{args.size_mib} MiB in {args.shards} shards")
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["seconds"] | results["ratios"], indent=2))


if __name__ == "__main__":
    main()

"""Commit and pull on the GCS and Azure emulators against gcsfs and adlfs (issue 49 item 6).

For each service, on its emulator started here (fake-gcs-server, Azurite; the
test suite's fixtures in tests/support):

commit
    ``commit_local_directory`` of a release directory of ``--size-mib`` MiB
    (every byte hashed, conditional creates, the read-back of every file's
    generation / ETag, MANIFEST.json) against the library's own
    ``put(src, dst, recursive=True)`` of the same files (no hashing, no
    conditions).
pull
    ``registry.pull.pull`` of that release (every byte verified; ``fsync=False``,
    as the peer does not fsync) against the library's ``get(src, dst,
    recursive=True)``.

Rounds alternate which side goes first; medians over ``--repeat`` rounds
after ``--warmup`` rounds (default 1) that are not counted. Each side commits
(puts) and pulls (gets) its copy, then deletes it from the emulator, so an
in-memory emulator holds at most one copy of the directory at a time (4 GiB
at ``--size-mib 4096``, not 2 x rounds x the size). The load average and the
memory available before the run are recorded.
The emulators run on this host, so the figures compare client-side costs on
one machine, not the services' bandwidth.

    python bench/cloud_bench.py [--size-mib 1024] [--repeat 3] [--warmup 1] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from bench.harness import MIB, make_release_dir, timed  # noqa: E402
from registry.protocol.commit import commit_local_directory  # noqa: E402
from registry.pull import pull  # noqa: E402
from registry.store import open_store  # noqa: E402


def _service(kind: str) -> tuple[Any, str, Any]:
    """(server, store URL, peer filesystem), the server started."""
    if kind == "gcs":
        import gcsfs.core

        from tests.support.fakegcs import FakeGCS

        server = FakeGCS().start()
        os.environ.update(server.env())
        server.create_bucket("bench")
        return server, "gs://bench/registry", gcsfs.core.GCSFileSystem(token="anon",
                                                                       skip_instance_cache=True)
    import adlfs

    from tests.support.azurite import Azurite

    server = Azurite().start()
    os.environ.update(server.env())
    server.create_container("bench")
    return server, "az://bench/registry", adlfs.AzureBlobFileSystem(
        connection_string=server.connection_string, skip_instance_cache=True)


def _available_gib() -> float | None:
    """MemAvailable of /proc/meminfo in GiB (None off Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def bench(kind: str, src: Path, tmp: Path, repeat: int, warmup: int = 1) -> dict[str, Any]:
    server, url, fs = _service(kind)
    root = url.split("://", 1)[1].split("/", 1)[0]
    try:
        store = open_store(url)
        samples: dict[str, list[float]] = {k: [] for k in ("commit", "put", "pull", "get")}
        for i in range(-warmup, repeat):
            version, peer = f"{i + 2}", f"{root}/peer-{uuid.uuid4().hex[:8]}"
            dest, target = tmp / f"{kind}-get", tmp / f"{kind}-pull"

            def commit() -> None:
                commit_local_directory(store, src, f"models/bench/{version}", kind="release",
                                       model_id="bench", version=version,
                                       source={"uri": str(src)})

            def put() -> None:
                fs.put(str(src), peer, recursive=True)

            def ours_pull() -> None:
                pull(store, "bench", version, to=target, cache=tmp / f"{kind}-cache-{i}",
                     fsync=False)

            def get() -> None:
                fs.get(peer, str(dest), recursive=True)

            def drop_ours() -> None:
                fs.rm(f"{url.split('://', 1)[1]}/models/bench/{version}", recursive=True)

            def drop_peer() -> None:
                fs.rm(peer, recursive=True)

            # each side writes, reads back and deletes its copy before the
            # other starts: one copy in the emulator's memory at a time
            sides = [(("commit", commit), ("pull", ours_pull), drop_ours),
                     (("put", put), ("get", get), drop_peer)]
            times = {}
            for (w, write), (r, read), drop in (sides if i % 2 else sides[::-1]):
                times[w] = timed(write)
                times[r] = timed(read)
                drop()
            for p in (dest, target, tmp / f"{kind}-cache-{i}"):
                shutil.rmtree(p, ignore_errors=True)
            if i >= 0:
                for name, t in times.items():
                    samples[name].append(t)
        med = {k: statistics.median(v) for k, v in samples.items()}
        total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
        return {"commit_seconds": med["commit"], "put_seconds": med["put"],
                "commit_ratio": med["commit"] / med["put"],
                "pull_seconds": med["pull"], "get_seconds": med["get"],
                "pull_ratio": med["pull"] / med["get"],
                "commit_mb_per_s": total / 1e6 / med["commit"],
                "pull_mb_per_s": total / 1e6 / med["pull"], "samples": samples}
    finally:
        server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="Rounds run first and not counted")
    ap.add_argument("--services", default="gcs,azure")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cloud-bench-"))
    try:
        src = tmp / "src"
        make_release_dir(src, args.size_mib)
        load_before, available = os.getloadavg(), _available_gib()
        results: dict[str, Any] = {}
        for kind in args.services.split(","):
            results[kind] = bench(kind, src, tmp, args.repeat, args.warmup)
            doc = {"size_mib": args.size_mib, "repeat": args.repeat, "warmup": args.warmup,
                   "cpus": os.cpu_count(), "mem_available_gib_before": available,
                   "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                   "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "results": results}
            if args.out:  # after each service: a long run stopped keeps what it measured
                args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"{args.size_mib} MiB, {args.repeat} rounds after {args.warmup} warm-up, "
              f"{os.cpu_count()} CPUs, load "
              f"{load_before[0]:.1f} -> {doc['loadavg_after'][0]:.1f}")
        print("| service | commit s | peer put s | ratio | pull s | peer get s | ratio |")
        print("|---|---|---|---|---|---|---|")
        for kind, r in results.items():
            print(f"| {kind} | {r['commit_seconds']:.2f} | {r['put_seconds']:.2f} | "
                  f"{r['commit_ratio']:.2f} | {r['pull_seconds']:.2f} | {r['get_seconds']:.2f} | "
                  f"{r['pull_ratio']:.2f} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

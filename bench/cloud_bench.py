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
one machine, not the services' bandwidth. Each phase also records the
emulator process's CPU seconds and peak resident memory (``emulator``).

``--gcs-backend filesystem`` runs fake-gcs-server with its objects in files
under ``--data-dir`` (the memory backend keeps every object in the server's
heap: at 4 GiB it outgrew this host). A guard thread watches MemAvailable:
under ``--min-available-gib`` it stops the emulator, the phase fails, and the
service is recorded under ``not_measured`` with what was seen.

``--shards N`` builds the directory as a sharded Llama-shaped model
(``bench.llama_dir.make_llama_dir``: N safetensors shards, the index and
config.json; the same files for both sides) instead of harness's
``make_release_dir`` (one weights file of 3/4 of the size). Why: model
directories in the field are sharded (Hugging Face writes shards of at most
5 GB), and fake-gcs-server holds an object being finished about three times
in memory (the upload buffer, a copy to store, a copy read back for the
answer), so its peak follows the largest file times the files in flight, not
the directory: one 3 GiB file needed over 10 GiB and the guard stopped it;
8 shards of about 516 MiB (4 in flight for the commit, all 8 for gcsfs's
``put``) peaked at 8.0 and 8.6 GiB under ``GOMEMLIMIT=8GiB``.

    python bench/cloud_bench.py [--size-mib 1024] [--repeat 3] [--warmup 1] [--out FILE]
        [--services gcs,azure] [--gcs-backend memory|filesystem] [--data-dir DIR]
        [--min-available-gib 4] [--shards N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from bench.harness import MIB, make_release_dir, timed  # noqa: E402
from bench.llama_dir import make_llama_dir  # noqa: E402
from registry.protocol.commit import commit_local_directory  # noqa: E402
from registry.pull import pull  # noqa: E402
from registry.store import open_store  # noqa: E402


def _service(kind: str, gcs_backend: str = "memory",
             data_dir: Path | None = None) -> tuple[Any, str, Any]:
    """(server, store URL, peer filesystem), the server started."""
    if kind == "gcs":
        import gcsfs.core

        from tests.support.fakegcs import FakeGCS

        server = FakeGCS(backend=gcs_backend, root=data_dir).start()
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


class Watch:
    """A thread sampling the emulator (CPU seconds, peak RSS) and MemAvailable
    every 0.5 s; under ``floor_gib`` available it stops the server (``tripped``
    says what it saw)."""

    def __init__(self, server: Any, floor_gib: float) -> None:
        self.server, self.floor = server, floor_gib
        self.pid = server._proc.pid
        self.peak, self.tripped, self.min_available = 0.0, "", float("inf")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> tuple[float, float]:
        """(CPU seconds, RSS GiB) of the emulator process (0, 0 once gone)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            pages = int(Path(f"/proc/{self.pid}/statm").read_text().split()[1])
        except (OSError, IndexError):
            return 0.0, 0.0
        return ((int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK"),
                pages * os.sysconf("SC_PAGE_SIZE") / 2**30)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.peak = max(self.peak, self.sample()[1])
            avail = _available_gib()
            if avail is not None:
                self.min_available = min(self.min_available, avail)
                if avail < self.floor and not self.tripped:
                    self.tripped = (f"MemAvailable {avail:.1f} GiB < {self.floor} GiB at "
                                    f"{time.strftime('%H:%M:%S', time.gmtime())} UTC, emulator "
                                    f"resident {self.peak:.1f} GiB; emulator stopped")
                    self.server.stop()

    def phase(self, fn: Any) -> tuple[float, dict[str, float]]:
        """Wall seconds of ``fn()`` and the emulator's CPU seconds and peak RSS meanwhile."""
        cpu0, self.peak = self.sample()[0], self.sample()[1]
        t = timed(fn)
        return t, {"emulator_cpu_s": round(self.sample()[0] - cpu0, 2),
                   "emulator_peak_rss_gib": round(self.peak, 2)}

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def bench(kind: str, src: Path, tmp: Path, repeat: int, warmup: int = 1, *,
          gcs_backend: str = "memory", data_dir: Path | None = None,
          floor_gib: float = 4.0) -> dict[str, Any]:
    server, url, fs = _service(kind, gcs_backend, data_dir)
    root = url.split("://", 1)[1].split("/", 1)[0]
    watch = Watch(server, floor_gib)
    emulator: dict[str, list[dict[str, float]]] = {}
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
                for name, fn in ((w, write), (r, read)):
                    try:
                        times[name], seen = watch.phase(fn)
                    except Exception:
                        if watch.tripped:  # what was measured before stays in the record
                            done = {k: {"seconds": t, "emulator": emulator.get(k)}
                                    for k, t in times.items()}
                            raise MemoryError(f"{kind} {name}: {watch.tripped}; measured "
                                              f"before: {json.dumps(done)}") from None
                        raise
                    if i >= 0:
                        emulator.setdefault(name, []).append(seen)
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
                "pull_mb_per_s": total / 1e6 / med["pull"], "samples": samples,
                "emulator": emulator, "min_mem_available_gib": round(watch.min_available, 2)}
    finally:
        watch.close()
        server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="Rounds run first and not counted")
    ap.add_argument("--services", default="gcs,azure")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--gcs-backend", choices=("memory", "filesystem"), default="memory",
                    help="fake-gcs-server's backend (filesystem: objects in files)")
    ap.add_argument("--data-dir", type=Path, help="Where the filesystem backend's folder goes")
    ap.add_argument("--min-available-gib", type=float, default=4.0,
                    help="Stop the emulator when MemAvailable drops under this")
    ap.add_argument("--shards", type=int, default=0,
                    help="Build a Llama-shaped directory of N safetensors shards "
                         "(bench/llama_dir.py) instead of one large weights file")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cloud-bench-"))
    try:
        src = tmp / "src"
        if args.shards:
            make_llama_dir(src, args.size_mib, args.shards)
        else:
            make_release_dir(src, args.size_mib)
        files = {str(p.relative_to(src)): p.stat().st_size
                 for p in sorted(src.rglob("*")) if p.is_file()}
        load_before, available = os.getloadavg(), _available_gib()
        results: dict[str, Any] = {}
        not_measured: dict[str, str] = {}
        for kind in args.services.split(","):
            try:
                results[kind] = bench(kind, src, tmp, args.repeat, args.warmup,
                                      gcs_backend=args.gcs_backend, data_dir=args.data_dir,
                                      floor_gib=args.min_available_gib)
            except MemoryError as e:
                not_measured[kind] = str(e)
            doc = {"size_mib": args.size_mib, "repeat": args.repeat, "warmup": args.warmup,
                   "shards": args.shards or None, "largest_file_bytes": max(files.values()),
                   "files": len(files), "total_bytes": sum(files.values()),
                   "cpus": os.cpu_count(), "mem_available_gib_before": available,
                   "gcs_backend": args.gcs_backend, "gomemlimit": os.environ.get("GOMEMLIMIT"),
                   "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                   "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "results": results, **({"not_measured": not_measured} if not_measured else {})}
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

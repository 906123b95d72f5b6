"""Merge ``bench/results-*.json`` into ``bench/results.json`` and a Markdown table
of ratios against the peers measured in the same run (``bench/results.md``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
Row = tuple[str, str, float | None, str, float | None, str]


def _rows_checkpoint(r: dict[str, Any]) -> Iterator[Row]:
    m = r["median_seconds"]
    yield ("checkpoint", "sync save (1 GiB + 2 GiB AdamW)", m["ours_sync"],
           "safetensors save_file + sha256", r["save_ratio_vs_save_file_plus_sha256"], "<= 0.8")
    yield ("checkpoint", "sync save", m["ours_sync"], "save_file + sha256 + sync",
           r["save_ratio_vs_save_file_plus_sha256_plus_sync"], "(durable peer)")
    if "disk_floor" in m:
        yield ("checkpoint", "sync save", m["ours_sync"], "raw write + fsync (disk floor)",
               r["save_ratio_vs_disk_floor"], "(floor)")
    yield ("checkpoint", "async save: caller blocked", m["async_blocked"], "sync save",
           r["async_blocked_fraction_of_sync"], "<= 0.10")
    yield ("checkpoint", "resume verification", m["verify"], "sha256sum",
           r["verify_ratio_vs_sha256sum"], "<= 1.1")


def _rows_release(r: dict[str, Any]) -> Iterator[Row]:
    for dtype in ("bf16", "int4"):
        d = r[dtype]
        yield ("release", f"{dtype} conversion (peak RSS {d['ours_peak_rss_mib']:.0f} MiB vs "
               f"{d['naive_peak_rss_mib']:.0f} MiB)", d["ours_seconds"],
               "load_file + astype + save_file + sha256", d["ratio"],
               "<= 0.8" if dtype == "bf16" else "(reported)")


def _rows_pull(r: dict[str, Any]) -> Iterator[Row]:
    local = r["local"]
    durable_peer = "cp -r && sync" if "peer_sync_seconds" in local else "cp -r"
    yield ("pull", "local, every byte verified and fsynced", local["ours_seconds"],
           durable_peer, local["ratio"], "<= 1.15")
    if "disk_floor_seconds" in local:
        yield ("pull", "local, every byte verified and fsynced", local["ours_seconds"],
               "raw write + fsync of the same bytes (disk floor)",
               local["ratio_vs_disk_floor"], "(floor)")
    if "ratio_paired" in local:
        yield ("pull", "local, verified and fsynced: median of per-round ratios",
               local["ours_seconds"], durable_peer, local["ratio_paired"], "<= 1.15")
        yield ("pull", "local, verified, --no-fsync: median of per-round ratios",
               local["no_fsync_seconds"], "cp -r", local["no_fsync_ratio_paired"], "<= 1.15")
    if "blobs_seconds" in local:
        yield ("pull", "local --blobs (two writes), verified and fsynced",
               local["blobs_seconds"], durable_peer, local["blobs_ratio"], "(reported)")
        yield ("pull", "local --blobs (two writes), verified, --no-fsync",
               local["blobs_no_fsync_seconds"], "cp -r", local["blobs_no_fsync_ratio"],
               "(reported)")
        yield ("pull", "local, REGISTRY_PULL_DIGEST=sha256, --no-fsync",
               local["sha256_no_fsync_seconds"], "cp -r", local["sha256_no_fsync_ratio"],
               "(reported)")
    if "no_blobs_seconds" in local:
        yield ("pull", "local --no-blobs (one write), verified and fsynced",
               local["no_blobs_seconds"], durable_peer, local["no_blobs_ratio"], "<= 1.15")
        yield ("pull", "local --no-blobs (one write), verified, --no-fsync",
               local["no_blobs_no_fsync_seconds"], "cp -r", local["no_blobs_no_fsync_ratio"],
               "<= 1.15")
    if "s3" in r:
        yield ("pull", "S3, every byte verified", r["s3"]["ours_seconds"], "s3fs get",
               r["s3"]["ratio"], "<= 1.0")
    for backend, peer, target in (("local", "cp -r", "<= 1.15"), ("s3", "s3fs get", "(reported)")):
        if backend in r and "no_fsync_seconds" in r[backend]:
            yield ("pull", f"{backend}, every byte verified, --no-fsync",
                   r[backend]["no_fsync_seconds"], peer, r[backend]["no_fsync_ratio"], target)
    if "verify_all_cores_seconds" in r:
        yield ("pull", f"every byte's piece checks on {r['cpus']} cores (verification floor)",
               r["verify_all_cores_seconds"], "cp -r",
               r["verify_all_cores_seconds"] / local["peer_seconds"], "(floor)")
    if "sha256_largest_seconds" in r:
        yield ("pull", "sha256 of the largest file on one core", r["sha256_largest_seconds"],
               "cp -r", r["sha256_largest_seconds"] / local["peer_seconds"], "(reported)")
    if "blake3_largest_seconds" in r:
        yield ("pull", "BLAKE3 of the largest file on one core", r["blake3_largest_seconds"],
               "cp -r", r["blake3_largest_seconds"] / local["peer_seconds"], "(reported)")
    for backend in ("local", "s3"):
        if backend in r:
            yield ("pull", f"warm re-pull ({backend}), s/GiB", r[backend]["warm_seconds_per_gib"],
                   "-", None, "<= 0.1 s/GiB")


def _rows_pieces(r: dict[str, Any]) -> Iterator[Row]:
    m = r["median_seconds"]
    load = f"{r['cpus']} CPUs, load {r['load_before'][0]:.1f}"
    yield ("pieces", f"commit with piece states (3 GiB; {load})", m["commit_pieces"],
           "commit without (today's)", r["commit_ratio_pieces_vs_today"], "<= 1.03")
    yield ("pieces", "commit CPU seconds with piece states", m["commit_pieces_cpu"],
           "today's", r["commit_cpu_ratio_pieces_vs_today"], "(reported)")
    if "commit_release" in m:
        yield ("pieces", "release commit, piece states + BLAKE3 (3 GiB)", m["commit_release"],
               "commit without (today's)", r["commit_ratio_release_vs_today"],
               "(reported: BLAKE3's cost on 2 cores)")
        yield ("pieces", "release commit CPU seconds, piece states + BLAKE3",
               m["commit_release_cpu"], "today's", r["commit_cpu_ratio_release_vs_today"],
               "(reported)")
    yield ("pieces", "resume verification (3 GiB checkpoint)", m["verify"], "sha256sum",
           r["resume_verify_ratio_vs_sha256sum"], "<= 0.6")
    yield ("pieces", f"piece checks on {r['cpus']} threads", m["verify_n"], "1 thread",
           m["verify_n"] / m["verify_1"], f"(speedup {r['piece_speedup_1_to_n']:.2f}x)")


def _rows_index(r: dict[str, Any]) -> Iterator[Row]:
    for backend, d in r.items():
        for q in ("query_passing", "query_source"):
            yield ("index", f"{backend} {q} p50 / p95 ms", d[q]["p50_ms"],
                   f"p95 {d[q]['p95_ms']} ms", None, "p50 <= 20, p95 <= 50")


def _rows_mlflow(r: dict[str, Any]) -> Iterator[Row]:
    for case, d in r.items():
        yield ("mlflow", f"{case} publish", d["publish"]["ours"], "log_artifacts + "
               "register_model", d["publish"]["ratio"], "(reported)")
        yield ("mlflow", f"{case} pull", d["download"]["ours"], "download_artifacts",
               d["download"]["ratio"], "(reported)")


def _rows_generic(name: str, r: Any) -> Iterator[Row]:
    targets = r.get("targets") if isinstance(r, dict) else None
    if isinstance(targets, dict):
        for key, t in targets.items():
            if isinstance(t, dict):
                yield (name, key, t.get("ours"), str(t.get("peer", "")), t.get("ratio")
                       if t.get("ratio") is not None else t.get("value"),
                       str(t.get("target", "")))


def _rows_shards(r: dict[str, Any]) -> Iterator[Row]:
    size = f"{r['size_mib']} MiB in {r['shards']} shards"
    for backend, peers in (("local", ("cp -r && sync", "cp -r && sync")),
                           ("s3", ("boto3 upload_file", "s3fs get"))):
        if backend in r:
            d = r[backend]
            yield ("shards", f"{backend} publish, {size}", d["publish_seconds"], peers[0],
                   d["publish_ratio"], "(reported)")
            yield ("shards", f"{backend} pull, {size}", d["pull_seconds"], peers[1],
                   d["pull_ratio"], "<= today's single-file pull ratio")
    b = r["bf16"]
    yield ("shards", f"--dtype bf16, {size} (peak RSS {b['ours_peak_rss_mib']:.0f} MiB vs "
           f"{b['naive_peak_rss_mib']:.0f} MiB)", b["ours_seconds"],
           "load_file + astype + save_file + sha256 per shard", b["ratio"],
           "peak RSS < 512 MiB")


def _rows_load(r: dict[str, Any]) -> Iterator[Row]:
    """registry load against the fastest unverified peer, per store (issue 43)."""
    level = f"{r['size_mib']} MiB in {r['shards']} shards, load {r['load_before'][0]:.0f}"
    for store in ("local", "s3"):
        d = r.get(store)
        if not d or "fastest_peer" not in d or "registry_load" not in d["ratios_to_fastest_peer"]:
            continue
        ours = d["arms"]["registry_load"]
        yield ("load", f"{store} registry load, to the last tensor ({level}; peak RSS "
               f"{ours['peak_rss_mib']:.0f} MiB)", ours["seconds"], d["fastest_peer"],
               d["ratios_to_fastest_peer"]["registry_load"], "<= 1.1")


def _rows_obs(name: str, r: dict[str, Any]) -> Iterator[Row]:
    """bench/obs_bench.py: each arm's cost against everything off."""
    code = "main's code (before)" if name.endswith("before") else "this tree"
    for arm, what in (("metrics", "metrics"), ("traced", "metrics + every request traced")):
        if arm in r.get("cost", {}):
            c = r["cost"][arm]
            yield ("obs", f"serve {what}, {code}: req/s (cost {c['throughput'] * 100:+.1f}%, "
                   f"p95 {c['p95'] * 100:+.1f}%, CPU/request {c['cpu_per_request'] * 100:+.1f}%)",
                   r[arm]["rps"], "everything off", r[arm]["rps"] / r["off"]["rps"],
                   "cost < 3%")


def _rows_cloud(r: dict[str, Any]) -> Iterator[Row]:
    """bench/cloud_bench.py: commit and pull against gcsfs / adlfs put and get."""
    peers = {"gcs": ("gcsfs put", "gcsfs get"), "azure": ("adlfs put", "adlfs get")}
    for kind, d in r["results"].items():
        size = f"{r['size_mib']} MiB"
        yield ("cloud", f"{kind} emulator commit, {size} (s)", d["commit_seconds"],
               peers[kind][0], d["commit_ratio"], "(reported)")
        yield ("cloud", f"{kind} emulator pull, {size} (s)", d["pull_seconds"],
               peers[kind][1], d["pull_ratio"], "(reported)")


EXTRACT = {"checkpoint": _rows_checkpoint, "load": _rows_load, "release": _rows_release,
           "pull": _rows_pull,
           "index": _rows_index, "mlflow": _rows_mlflow, "pieces": _rows_pieces,
           "shards": _rows_shards}


def main() -> int:
    merged: dict[str, Any] = {}
    rows: list[Row] = []
    for path in sorted(HERE.glob("results-*.json")):
        name = path.stem.removeprefix("results-")
        doc = json.loads(path.read_text())
        merged[name] = doc
        try:
            if name.startswith("obs"):
                rows += list(_rows_obs(name, doc))
            elif name.startswith("cloud"):
                rows += list(_rows_cloud(doc))
            else:
                rows += list(EXTRACT.get(name, lambda d, n=name: _rows_generic(n, d))(doc))
        except (KeyError, TypeError) as e:
            print(f"{path.name}: cannot tabulate ({e})", file=sys.stderr)
    (HERE / "results.json").write_text(json.dumps(merged, indent=2) + "\n")
    lines = ["| benchmark | measure | ours | peer | ratio | target |", "|---|---|---|---|---|---|"]
    for bench, measure, ours, peer, ratio, target in rows:
        o = f"{ours:.3g}" if isinstance(ours, (int, float)) else "-"
        q = f"{ratio:.2f}" if isinstance(ratio, (int, float)) else "-"
        lines.append(f"| {bench} | {measure} | {o} | {peer} | {q} | {target} |")
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

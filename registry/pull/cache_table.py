"""The text form of ``registry cache ls`` (also printed by the quickstart)."""

from __future__ import annotations

from registry.pull.cache_scan import CacheReport, Materialized
from registry.rules.words import count


def human(n: int) -> str:
    """Bytes as ``du -h`` says them (powers of 1024): ``512B``, ``1.5K``, ``2.0G``."""
    size = float(n)
    for unit in ("B", "K", "M", "G"):
        if size < 1024:
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{size:.1f}T"


def _dirs(materialized: tuple[Materialized, ...]) -> str:
    out = []
    for m in materialized:
        where = "cache" if m.inside_cache else m.path
        out.append(where if m.state == "placed" else f"{where} ({m.state})")
    return ", ".join(out) or "-"


def table(report: CacheReport, *, disk: bool = False) -> list[str]:
    """One line per cached version (newest pull first) under a header, then a total line.

    A directory inside the cache is shown as ``cache``; a ``--to`` directory
    by its path, with ``(replaced)`` or ``(missing)`` when it no longer holds
    the release. A version none of whose blobs is in the cache (pulled with
    one write per byte: from a local store, or ``--no-blobs``) says
    ``no blobs kept``. With ``disk``, a line before the total says the free
    space of the cache's filesystem (:func:`disk_line`)."""
    rows = [("MODEL", "VERSION", "SIZE", "SHARED", "LAST PULLED", "MATERIALIZED")]
    for v in report.versions:
        shared = (f"{count(v.shared_blobs, 'blob')} ({human(v.shared_bytes)})"
                  if v.shared_blobs else "-")
        missing = f", {count(v.missing_blobs, 'blob')} missing" if v.missing_blobs else ""
        if v.missing_blobs and not v.blobs:  # a one-write pull (a local store, --no-blobs)
            shared, missing = "no blobs kept", ""
        rows.append((v.model_id, v.version, human(v.size_on_disk), shared + missing,
                     v.last_pulled[:19].replace("T", " ") + "Z",
                     _dirs(v.materialized) + (" [pull in progress]" if v.in_use else "")))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5]
             for r in rows]
    t = report.to_dict()["totals"]
    if disk:
        lines.append(disk_line(report))
    lines.append(f"total: {count(t['models'], 'model')}, {count(t['versions'], 'version')}, "
                 f"{count(t['blobs'], 'blob')}, "
                 f"{human(t['size_on_disk'])} on disk ({human(t['blob_bytes'])} of blobs, "
                 f"{human(t['materialized_bytes'])} of directories in the cache); "
                 f"{t['unreferenced_blobs']} unreferenced blobs "
                 f"({human(t['unreferenced_bytes'])}, removed by `registry cache prune`)")
    if t["partial_bytes"]:
        lines.append(f"partial downloads: {count(t['partial_fills'], 'unfinished file')}, "
                     f"{human(t['partial_bytes'])} in tmp/ (fills running now or kept to be "
                     "resumed; a killed pull's are removed by `registry cache prune`)")
    return lines


def disk_line(report: CacheReport) -> str:
    """``disk: 120.0G free of 500.0G (the cache uses 80.5G)``."""
    if report.free_bytes is None or report.disk_bytes is None:
        return f"disk: free space unknown (the cache uses {human(report.size_on_disk)})"
    return (f"disk: {human(report.free_bytes)} free of {human(report.disk_bytes)} "
            f"(the cache uses {human(report.size_on_disk)})")


__all__ = ["disk_line", "human", "table"]

"""Versioned and object-locked buckets (issue 47 item 2).

On a bucket with versioning on (or suspended after it was on), a DELETE
only hides an object behind a delete marker and an overwrite keeps the old
bytes as a noncurrent version: what ``registry gc`` or ``release delete``
removed is still stored, billed, and readable by anyone who can list
versions. Object Lock (which requires versioning) may also refuse to delete
a version before its retention ends.

:func:`bucket_modes` detects both once per process and bucket (the probe's
cache, as registry.store.s3probe); :func:`purge_noncurrent` removes the
noncurrent versions and delete markers under a prefix when the operator
asks (``--purge-versions``). The current version of every object is never
touched; a version Object Lock keeps is named, not removed.
"""

from __future__ import annotations

import threading
from typing import Any

from registry.store.translate import s3_error_code

_lock = threading.Lock()
_modes: dict[tuple[str, str], dict[str, Any]] = {}


def bucket_modes(store: Any) -> dict[str, Any]:
    """``{"versioning": "Enabled" | "Suspended" | None, "object_lock": bool | None}``
    of the store's bucket (None: the server does not say: not implemented, or
    the credentials may not ask). Cached per endpoint and bucket for the life
    of the process; never raises."""
    key = (store.endpoint, store.bucket)
    with _lock:
        if key in _modes:
            return dict(_modes[key])
    versioning: str | None = None
    try:
        versioning = store.call("get_bucket_versioning").get("Status") or None
    except Exception:  # noqa: BLE001 - not implemented, not permitted: unknown
        versioning = None
    lock: bool | None = None
    try:
        conf = store.call("get_object_lock_configuration").get("ObjectLockConfiguration") or {}
        lock = conf.get("ObjectLockEnabled") == "Enabled"
    except Exception as exc:  # noqa: BLE001
        lock = False if s3_error_code(exc) in ("ObjectLockConfigurationNotFoundError",
                                               "NoSuchObjectLockConfiguration") else None
    found = {"versioning": versioning, "object_lock": lock}
    with _lock:
        _modes[key] = found
    return dict(found)


def describe(modes: dict[str, Any]) -> str | None:
    """One line for a versioned or locked bucket (None for a plain one)."""
    if not modes.get("versioning") and not modes.get("object_lock"):
        return None
    what = [f"versioning {modes['versioning'].lower()}"] if modes.get("versioning") else []
    if modes.get("object_lock"):
        what.append("object lock on")
    return (f"the bucket has {' and '.join(what)}: deleted and replaced objects stay as "
            "noncurrent versions (billed, readable by whoever may list versions); "
            "--purge-versions removes them")


def purge_noncurrent(store: Any, prefix: str, *, dry_run: bool = False
                     ) -> tuple[list[str], list[str]]:
    """Delete every noncurrent version and delete marker under ``prefix``
    (relative to the store; ``""``: the whole store).

    Returns:
        ``(removed, kept)``: ``"<key> (version <id>)"`` of each version removed
        (or that would be), and of each one the server refused to delete
        (Object Lock retention, legal hold), with the reason.

    Raises:
        StorageError: listing failed.
    """
    base = store._key(prefix)
    args: dict[str, Any] = {"Prefix": (base + "/") if base else ""}
    root = store._key("")
    removed: list[str] = []
    kept: list[str] = []
    while True:
        with store._translated(prefix or "/"):
            page = store.call("list_object_versions", **args)
        doomed = [v for v in page.get("Versions", []) if not v.get("IsLatest")]
        doomed += list(page.get("DeleteMarkers", []))
        for v in doomed:
            rel = v["Key"][len(root) + 1:] if root else v["Key"]
            name = f"{rel} (version {v['VersionId']})"
            if dry_run:
                removed.append(name)
                continue
            try:
                store.call("delete_object", Key=v["Key"], VersionId=v["VersionId"])
                removed.append(name)
            except Exception as exc:  # noqa: BLE001 - a locked version is named, not fatal
                code = s3_error_code(exc)
                if code in ("AccessDenied", "403", "InvalidRequest"):
                    kept.append(f"{name}: {code} (object lock retention or legal hold?)")
                    continue
                with store._translated(rel):
                    raise
        if not page.get("IsTruncated"):
            return removed, kept
        args["KeyMarker"] = page.get("NextKeyMarker")
        args["VersionIdMarker"] = page.get("NextVersionIdMarker")


__all__ = ["bucket_modes", "describe", "purge_noncurrent"]

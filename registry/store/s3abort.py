"""Unfinished multipart uploads of an S3 store: which ones nobody will complete,
aborted by the server's clock (``registry gc``; split from :mod:`registry.store.s3`,
whose ``S3Store.abort_stale_uploads`` is this)."""

from __future__ import annotations

import email.utils
import errno
import time
from typing import Any

from registry.store.translate import s3_error_code


def abort_stale_uploads(store: Any, older_than: float, *, dry_run: bool = False,
                        keep: Any = None, doomed: Any = None, warn: Any = None,
                        orphan: Any = None, orphan_after: float = 0.0) -> list[str]:
    """Abort the multipart uploads under ``store``'s prefix (an
    :class:`registry.store.s3.S3Store`) that nobody
    will complete: started more than ``older_than`` seconds ago by the
    server's clock (the listing's own time, not this host's), unless
    ``keep(key)`` spares them (a key under a live claim); or at once,
    whatever their age, when ``doomed(key)`` says their writer's claim is
    gone (an upload belongs to the claim of the directory its key lies
    in); or, when ``orphan(key)`` says no claim covers it at all (every
    writer claims its directory before its first upload), once its own
    age passes ``orphan_after`` seconds (issue 47: a writer killed with
    its server restarted leaves such uploads; no fixed hour). Returns the
    keys of the uploads aborted (or that would be).

    A server without ListMultipartUploads (s3rver; some gateways answer
    501 NotImplemented) is skipped: ``warn(message)`` is told so, naming
    the operation, and nothing is aborted.
    """
    base = store._key("")
    args: dict[str, Any] = {"Prefix": base + "/" if base else ""}
    now = time.time()
    out = []
    while True:
        try:
            page = store.call("list_multipart_uploads", **args)
        except Exception as exc:
            if not _unimplemented(exc):
                with store._translated("/"):
                    raise
            if warn is not None:
                warn(f"{store.where}: the server does not implement ListMultipartUploads "
                     f"({s3_error_code(exc) or type(exc).__name__}); unfinished multipart "
                     "uploads cannot be listed there, so none were aborted (use the "
                     "bucket's lifecycle rule AbortIncompleteMultipartUpload)")
            return out
        served = _served_at(page, now)
        for u in page.get("Uploads", []):
            key = u["Key"][len(args["Prefix"]):]
            age = served - u["Initiated"].timestamp()
            if not (doomed and doomed(key)) and not (
                    orphan and age >= orphan_after and orphan(key)):
                if age < older_than or (keep and keep(key)):
                    continue
            if not dry_run:
                with store._translated(key):
                    try:
                        store.call("abort_multipart_upload", Key=u["Key"],
                                  UploadId=u["UploadId"])
                    except Exception as exc:
                        if s3_error_code(exc) != "NoSuchUpload":
                            raise
            out.append(key)
        if not page.get("IsTruncated"):
            return out
        args["KeyMarker"] = page.get("NextKeyMarker")
        args["UploadIdMarker"] = page.get("NextUploadIdMarker")


def _unimplemented(exc: BaseException) -> bool:
    """The server does not implement the operation (501 NotImplemented, 405,
    or s3fs's ENOSYS translation of them)."""
    if isinstance(exc, NotImplementedError):
        return True
    if isinstance(exc, OSError) and exc.errno == errno.ENOSYS:
        return True
    return s3_error_code(exc) in ("NotImplemented", "501", "MethodNotAllowed", "405")


def _served_at(page: dict[str, Any], fallback: float) -> float:
    """The server's time of an answer (its ``Date`` header), so ages are
    compared on the server's clock alone; ``fallback`` when it sent none."""
    date = page.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if date:
        try:
            return email.utils.parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            pass
    return fallback

"""Proof that an S3-compatible server honours conditional writes (issue 13 item 1).

Commits, claims and pointer moves on S3 are only safe if the server refuses
``If-None-Match: *`` on an existing object and ``If-Match`` with a stale ETag
(HTTP 412). Some servers (older MinIO, some gateways, NAS firmware) accept
both headers and ignore them: two writers then both "win". Before the first
write that relies on a condition, :func:`require_conditional_writes` proves
it with a probe object under ``<prefix>/.registry-probe/``:

1. create it with ``If-None-Match: *``           -> must succeed;
2. create it again with ``If-None-Match: *``     -> must fail (412);
3. replace it with ``If-Match`` on a stale ETag  -> must fail (412);
4. replace it with ``If-Match`` on its ETag      -> must succeed;
5. delete it.

The answer is cached per endpoint and bucket for the life of the process.
On a server that fails, every conditional write raises
:class:`~registry.errors.ConditionalWritesUnsupportedError`, unless the
store was opened with ``single_writer=True`` (or
``REGISTRY_S3_SINGLE_WRITER=1``): the user accepts that nothing guards
against a second writer.
"""

from __future__ import annotations

import threading
import uuid
from typing import TYPE_CHECKING

from registry.errors import ConditionalWritesUnsupportedError
from registry.store.translate import s3_error_code

if TYPE_CHECKING:
    from registry.store.s3 import S3Store

#: the option that accepts the risk, named in the refusal.
OPT_OUT_ENV = "REGISTRY_S3_SINGLE_WRITER"

_lock = threading.Lock()
#: (endpoint, bucket) -> None when the server complies, else what it ignored.
_verdicts: dict[tuple[str, str], str | None] = {}


def forget() -> None:
    """Drop the cached answers (tests that change a server's behaviour)."""
    with _lock:
        _verdicts.clear()


def _refused(store: S3Store, method: str, **kw: object) -> bool:
    """True when the request failed with 412 (or 409, S3's concurrent-write
    answer); False when it succeeded. Other errors propagate."""
    try:
        store.call(method, **kw)
    except Exception as exc:  # noqa: BLE001 - classified right here
        if s3_error_code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict",
                                  "409") or isinstance(exc, FileExistsError):
            return True
        with store._translated(".registry-probe"):
            raise
    return False


def _probe(store: S3Store) -> str | None:
    key = store._key(f".registry-probe/{uuid.uuid4().hex}")
    with store._translated(".registry-probe"):
        store.call("put_object", Key=key, Body=b"1", IfNoneMatch="*")
    try:
        if not _refused(store, "put_object", Key=key, Body=b"2", IfNoneMatch="*"):
            return ("ignores If-None-Match (creating an existing object with "
                    "If-None-Match: * succeeded instead of failing with 412)")
        with store._translated(".registry-probe"):
            etag = store.call("head_object", Key=key)["ETag"]
        if not _refused(store, "put_object", Key=key, Body=b"3", IfMatch='"00000000000000000000000000000000"'):
            return ("ignores If-Match (a replace with a stale ETag succeeded instead of "
                    "failing with 412)")
        if _refused(store, "put_object", Key=key, Body=b"4", IfMatch=etag):
            return "refuses If-Match with the object's current ETag"
        return None
    finally:
        with store._translated(".registry-probe"):
            store.call("delete_object", Key=key)


def require_conditional_writes(store: S3Store) -> None:
    """Raise unless the store's server honours conditional writes (probed once
    per endpoint and bucket per process), or the store accepts the risk.

    Raises:
        ConditionalWritesUnsupportedError: the server ignores a condition.
        StorageError: the probe itself could not run (permissions, network).
    """
    if store.single_writer:
        return
    cache_key = (store.endpoint, store.bucket)
    with _lock:
        if cache_key in _verdicts:
            verdict = _verdicts[cache_key]
        else:
            verdict = _verdicts[cache_key] = _probe(store)
    if verdict is not None:
        raise ConditionalWritesUnsupportedError(
            f"{store.where}: the server {verdict}; commits, claims and pointer moves need "
            f"conditional writes. Use a compliant server, or accept the risk for a "
            f"single-writer setup with {OPT_OUT_ENV}=1 (open_store(..., single_writer=True))",
            key="")

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
4. replace it with ``If-Match`` on its ETag      -> must succeed; a server
   that refuses the quoted ETag S3 returns but accepts it unquoted (Ceph
   RGW 16) passes, and every ``If-Match`` to it is then sent unquoted
   (:func:`etag_as_sent`);
5. delete it.

What the probe does not prove: that a conditional CompleteMultipartUpload is
atomic. On SeaweedFS, LocalStack and Ceph RGW two racing completions with
``If-None-Match: *`` can both succeed (issue 34), so no guarantee of the
registry rests on it: the small conditional claim and marker objects decide,
and a writer reads back what it committed before its manifest points at it
(``registry.protocol.commit``).

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
from contextlib import AbstractContextManager
from typing import Any, Protocol

from registry.errors import ConditionalWritesUnsupportedError
from registry.store.translate import s3_error_code


class ProbedStore(Protocol):
    """What the probe needs of :class:`registry.store.s3.S3Store` (a protocol,
    so that the store imports the probe and not the other way round)."""

    single_writer: bool
    endpoint: str
    bucket: str
    where: str

    def call(self, method: str, **kw: Any) -> Any: ...

    def _key(self, path: str) -> str: ...

    def _translated(self, path: str) -> AbstractContextManager[Any]: ...

#: the option that accepts the risk, named in the refusal.
OPT_OUT_ENV = "REGISTRY_S3_SINGLE_WRITER"

_lock = threading.Lock()
#: (endpoint, bucket) -> None when the server complies, else what it ignored.
_verdicts: dict[tuple[str, str], str | None] = {}
#: (endpoint, bucket) -> True when the server wants ``If-Match`` ETags unquoted.
_unquoted: dict[tuple[str, str], bool] = {}


def forget() -> None:
    """Drop the cached answers (tests that change a server's behaviour)."""
    with _lock:
        _verdicts.clear()
        _unquoted.clear()


def _refused(store: ProbedStore, method: str, **kw: object) -> bool:
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


def _probe(store: ProbedStore) -> tuple[str | None, bool]:
    """(what the server ignores or None, whether it wants ETags unquoted)."""
    key = store._key(f".registry-probe/{uuid.uuid4().hex}")
    with store._translated(".registry-probe"):
        store.call("put_object", Key=key, Body=b"1", IfNoneMatch="*")
    try:
        if not _refused(store, "put_object", Key=key, Body=b"2", IfNoneMatch="*"):
            return ("ignores If-None-Match (creating an existing object with "
                    "If-None-Match: * succeeded instead of failing with 412)"), False
        with store._translated(".registry-probe"):
            etag = store.call("head_object", Key=key)["ETag"]
        if not _refused(store, "put_object", Key=key, Body=b"3", IfMatch='"00000000000000000000000000000000"'):
            return ("ignores If-Match (a replace with a stale ETag succeeded instead of "
                    "failing with 412)"), False
        if not _refused(store, "put_object", Key=key, Body=b"4", IfMatch=etag):
            return None, False
        with store._translated(".registry-probe"):
            etag = store.call("head_object", Key=key)["ETag"]
        if not _refused(store, "put_object", Key=key, Body=b"5", IfMatch=etag.strip('"')):
            return None, True
        return "refuses If-Match with the object's current ETag, quoted or not", False
    finally:
        with store._translated(".registry-probe"):
            store.call("delete_object", Key=key)


def _verdict(store: ProbedStore) -> str | None:
    """The probe's answer for the store's server (probed once per process).
    A single-writer store is probed too, for the ETag form alone: a probe
    that cannot run there (no condition support at all) leaves it quoted."""
    cache_key = (store.endpoint, store.bucket)
    with _lock:
        if cache_key not in _verdicts:
            try:
                _verdicts[cache_key], _unquoted[cache_key] = _probe(store)
            except Exception:
                if not store.single_writer:
                    raise
                _verdicts[cache_key], _unquoted[cache_key] = "could not be probed", False
        return _verdicts[cache_key]


def etag_as_sent(store: ProbedStore, etag: str) -> str:
    """``etag`` (as S3 returns it: quoted) in the form the store's server
    accepts in ``If-Match``: quoted, or unquoted where the probe found that
    the server refuses the quoted form (Ceph RGW 16)."""
    _verdict(store)
    with _lock:
        unquoted = _unquoted.get((store.endpoint, store.bucket), False)
    return etag.strip('"') if unquoted else etag


def require_conditional_writes(store: ProbedStore) -> None:
    """Raise unless the store's server honours conditional writes (probed once
    per endpoint and bucket per process), or the store accepts the risk.

    Raises:
        ConditionalWritesUnsupportedError: the server ignores a condition.
        StorageError: the probe itself could not run (permissions, network).
    """
    verdict = _verdict(store)
    if verdict is not None and not store.single_writer:
        raise ConditionalWritesUnsupportedError(
            f"{store.where}: the server {verdict}; commits, claims and pointer moves need "
            f"conditional writes. Use a compliant server, or accept the risk for a "
            f"single-writer setup with {OPT_OUT_ENV}=1 (open_store(..., single_writer=True))",
            key="")

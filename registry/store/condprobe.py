"""Proof that a GCS or Azure Blob service honours preconditions (issue 49 item 2).

The commit protocol on these services rests on the same two guarantees as on
S3 (:mod:`registry.store.s3probe`): a create-only write fails when an object
is there (GCS ``ifGenerationMatch=0``; Azure ``If-None-Match: *``), and a
replace conditioned on a version fails when the object changed since (GCS
``ifGenerationMatch=<generation>``; Azure ``If-Match: <ETag>``). Emulators
and gateways that accept those parameters and ignore them exist (the PyPI
``gcp-storage-emulator`` ignores ``ifGenerationMatch`` entirely;
fake-gcs-server ignores it on ``uploadType=media``, which is why the GCS
store never uses that upload type). Before the first write that relies on a
condition, :func:`require_preconditions` proves both with a probe object
under ``<prefix>/.registry-probe/``, through the very requests the store
sends:

1. create it, create-only                          -> must succeed;
2. create it again, create-only                    -> must be refused;
3. replace it conditioned on a stale version       -> must be refused;
4. replace it conditioned on its current version   -> must succeed;
5. create it again by the large-object path (a GCS resumable upload, an
   Azure block list commit), create-only           -> noted, not required;
6. delete it.

Step 5 is not a condition of acceptance, as a conditional
CompleteMultipartUpload is not on S3 (issue 34): no guarantee rests on it.
Every file of a directory is read back (its generation or ETag against the
one its writer was given) before the manifest is created, and only the small
conditional objects decide who commits (``registry.protocol.commit``). fake-gcs-server
ignores ``ifGenerationMatch`` on resumable uploads (its ``resumableUpload``
never reads it); where step 5 fails, an exclusive large write checks that
nothing is at its name before its last chunk (:func:`large_conditions`),
which narrows the window and is said to be no more than that.

The answer is cached per service endpoint and bucket (container) for the
life of the process. On a service that fails, every conditional write
raises :class:`~registry.errors.ConditionalWritesUnsupportedError` naming
what it ignored, unless the store was opened with ``single_writer=True`` (or
the service's ``REGISTRY_<SERVICE>_SINGLE_WRITER=1``).
"""

from __future__ import annotations

import os
import threading
import uuid
from typing import Any, Protocol

from registry.errors import (
    ConditionalWritesUnsupportedError,
    ObjectExistsError,
    ObjectNotFoundError,
    PointerConflictError,
)


class Refused(ObjectExistsError):
    """A conditional write the service refused (412, or Azure's 409
    BlobAlreadyExists), raised by a store's raw conditional primitives."""


class ProbedStore(Protocol):
    """What the probe needs of a GCS or Azure store."""

    single_writer: bool
    #: (endpoint, bucket or container): what one verdict covers.
    probe_id: tuple[str, str]
    where: str
    #: the store's option that accepts the risk (an environment variable).
    opt_out_env: str
    #: the names of the conditions as the service spells them, for messages:
    #: keys ``absent``, ``match``, ``large``.
    condition_names: dict[str, str]

    def put_if(self, key: str, data: bytes, *, token: str | None) -> str:
        """One conditional single-request write: create-only when ``token`` is
        None, else only while the object's version is ``token``. Returns the
        new version. Raises Refused."""

    def put_large_if_absent(self, key: str, data: bytes) -> None:
        """A create-only write by the large-object path. Raises Refused."""

    def version_of(self, key: str) -> str: ...

    def stale_version(self, current: str) -> str: ...

    def remove(self, key: str) -> None: ...


def single_writer(options: dict[str, Any], opt_out_env: str) -> bool:
    """Whether a store accepts a service that ignores conditional writes:
    ``single_writer=True`` in its storage ``options`` (popped from the dict,
    which the filesystem must not see) or ``opt_out_env`` set to anything but
    empty, ``0`` or ``false``."""
    return bool(options.pop("single_writer", False)) or os.environ.get(
        opt_out_env, "") not in ("", "0", "false")


_lock = threading.Lock()
_verdicts: dict[tuple[str, str], str | None] = {}
#: (endpoint, bucket) -> whether the large-object path honours create-only.
_large: dict[tuple[str, str], bool] = {}


def forget() -> None:
    """Drop the cached answers (tests that change a service's behaviour)."""
    with _lock:
        _verdicts.clear()
        _large.clear()


def _refused(attempt: object) -> bool:
    try:
        attempt()  # type: ignore[operator]
    except Refused:
        return True
    return False


def probe(store: ProbedStore) -> tuple[str | None, bool]:
    """Run the probe now (uncached): (None when the service complies, else
    what it ignored, in words; whether the large-object path honours
    create-only). Raises StorageError when it cannot run."""
    key = f".registry-probe/{uuid.uuid4().hex}"
    names = store.condition_names
    if _refused(lambda: store.put_if(key, b"1", token=None)):
        return f"refuses a create of a new object with {names['absent']}", False
    try:
        if not _refused(lambda: store.put_if(key, b"2", token=None)):
            return (f"ignores {names['absent']} (creating an existing object with it "
                    "succeeded instead of failing with 412)"), False
        current = store.version_of(key)
        stale = store.stale_version(current)
        if not _refused(lambda: store.put_if(key, b"3", token=stale)):
            return (f"ignores {names['match']} (a replace conditioned on a stale version "
                    "succeeded instead of failing with 412)"), False
        if _refused(lambda: store.put_if(key, b"4", token=current)):
            return f"refuses {names['match']} with the object's current version", False
        return None, _refused(lambda: store.put_large_if_absent(key, b"5"))
    finally:
        store.remove(key)


def _verdict(store: ProbedStore) -> str | None:
    with _lock:
        if store.probe_id not in _verdicts:
            try:
                _verdicts[store.probe_id], _large[store.probe_id] = probe(store)
            except Exception:
                if not store.single_writer:
                    raise
                _verdicts[store.probe_id], _large[store.probe_id] = "could not be probed", False
        return _verdicts[store.probe_id]


def large_conditions(store: ProbedStore) -> bool:
    """Whether the service honours create-only on the large-object path
    (probed with the rest; False where the probe found it ignored)."""
    _verdict(store)
    with _lock:
        return _large.get(store.probe_id, False)


def require_preconditions(store: ProbedStore) -> None:
    """Raise unless the store's service honours preconditions (probed once per
    endpoint and bucket per process), or the store accepts the risk.

    Raises:
        ConditionalWritesUnsupportedError: the service ignores a condition;
            the message names which.
        StorageError: the probe itself could not run (permissions, network).
    """
    verdict = _verdict(store)
    if verdict is not None and not store.single_writer:
        raise ConditionalWritesUnsupportedError(
            f"{store.where}: the service {verdict}; commits, claims and pointer moves need "
            "conditional writes. Use a compliant service, or accept the risk for a "
            f"single-writer setup with {store.opt_out_env}=1 (open_store(..., "
            "single_writer=True))", key="")


class TokenWrites:
    """The conditional writes of a GCS or Azure store, on its ``upload(key, data,
    token=..., write_token=...)`` (``token``: None for create-only, else the version
    the object must still have) and ``own_write(key, write_token)``."""

    upload: Any
    own_write: Any
    _translated: Any

    def _conditional(self, key: str, data: bytes, token: str | None) -> None:
        """A conditional upload; a refusal after a retried request is success when
        the object there carries this write's token (its first try landed)."""
        require_preconditions(self)  # type: ignore[arg-type]
        write_token = os.urandom(16).hex()
        try:
            with self._translated(key):
                self.upload(key, data, token=token, write_token=write_token)
        except ObjectExistsError:
            if not self.own_write(key, write_token):
                raise

    def swap(self, key: str, data: bytes, expected: str | None) -> None:
        try:
            self._conditional(key, data, expected)
        except (ObjectExistsError, ObjectNotFoundError):
            raise PointerConflictError(key, expected=expected, actual="(changed)") from None

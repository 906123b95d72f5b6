"""Tombstones: what is left of a deleted release (issue 32 item 2).

``registry release delete`` first creates, by conditional create, a tombstone
that never changes afterwards::

    ledger/tombstones/<model_id>/<version>.json
        {"schema": 1, "model_id", "version", "manifest_sha256", "sequence",
         "files", "bytes", "signed", "deleted_at", "reason", "actor"}

and only then deletes the release (its ``MANIFEST.json`` first). The tombstone
is the commit point of the delete: from the moment it exists the release is
deleted for every reader (pull, gate checks, ``index rebuild``), whatever
files are still being removed, and its version name is taken for good: a
publish of that version is refused (:func:`check_version_free`), as is an
alias of that name, so ``model_id@version`` can never mean other bytes than
the ones whose digest the tombstone keeps.
"""

from __future__ import annotations

from typing import Any

from registry.errors import ReleaseDeletedError, RegistryError, VersionExistsError
from registry.protocol.layout import TOMBSTONES, release_prefix, tombstone_key
from registry.lifecycle import records
from registry.store import Store


def read_tombstone(store: Store, model_id: str, version: str) -> dict[str, Any] | None:
    """The tombstone of ``model_id@version``, or None when it was never deleted.

    Raises:
        DocumentError: the tombstone is garbled.
    """
    return records.load(store, tombstone_key(model_id, version))


def is_deleted(store: Store, model_id: str, version: str) -> bool:
    """Whether ``model_id@version`` has a tombstone (garbled or not)."""
    return store.exists(tombstone_key(model_id, version))


def describe(doc: dict[str, Any]) -> str:
    """``deleted at <time> by <user>@<host>: <reason>``."""
    from registry.host.actor import describe as who, read_actor

    return (f"deleted at {doc.get('deleted_at')} by {who(read_actor(doc.get('actor')))}: "
            f"{doc.get('reason')}")


def deleted_error(store: Store, model_id: str, version: str,
                  doc: dict[str, Any] | None) -> ReleaseDeletedError:
    """The error a reader of a deleted release raises."""
    why = describe(doc) if doc is not None else "its tombstone cannot be read"
    return ReleaseDeletedError(
        f"{store.url_of(release_prefix(model_id, version))}: release {model_id}@{version} "
        f"was deleted ({why})", path=release_prefix(model_id, version), tombstone=doc)


def refuse_deleted(store: Store, model_id: str, version: str) -> None:
    """Raise ReleaseDeletedError when ``model_id@version`` has a tombstone."""
    if is_deleted(store, model_id, version):
        try:
            doc = read_tombstone(store, model_id, version)
        except RegistryError:
            doc = None
        raise deleted_error(store, model_id, version, doc)


def check_version_free(store: Store, model_id: str, version: str) -> None:
    """Raise VersionExistsError when ``version`` was a release of ``model_id``
    that was deleted: a version name is never reused.

    A publisher calls this after it found no ``MANIFEST.json`` at the
    version: a delete creates the tombstone before it removes the manifest,
    so one of the two checks sees the release or its tombstone.
    """
    key = tombstone_key(model_id, version)
    if store.exists(key):
        raise VersionExistsError(
            f"{store.url_of(release_prefix(model_id, version))}: version {version!r} was "
            f"deleted ({store.url_of(key)}); a version name is never reused, publish a new "
            "version", path=release_prefix(model_id, version))


def tombstones(store: Store, model_id: str) -> dict[str, dict[str, Any]]:
    """version -> tombstone of every deleted release of ``model_id`` (for
    ``index rebuild``); garbled ones are left out."""
    return records.per_version(store, TOMBSTONES, model_id,
                               lambda v: read_tombstone(store, model_id, v))

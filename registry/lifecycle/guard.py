"""What a reader of a release checks of its life before it serves it (issue 32).

:func:`refuse_retired` is called by :func:`registry.pull.pull` once the
version is resolved, before any byte is read: a deleted release (a tombstone,
even while its files are still being removed) is refused, and a yanked one
unless the caller asked for it (``allow_yanked``, ``--allow-yanked``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from registry.errors import DocumentError, RegistryError, ReleaseYankedError
from registry.lifecycle.tombstone import deleted_error, read_tombstone, refuse_deleted
from registry.lifecycle.yank import gate_of, yank_gate
from registry.store import Store


@dataclass(frozen=True, slots=True)
class Retired:
    """The tombstone and yank record of a release as one reader just read them
    (:func:`registry.trust.release.check_marks`): whether a tombstone exists, the
    yank record (None: none), or the error its parse raised."""

    deleted: bool
    record: dict[str, Any] | None
    garbled: DocumentError | None = None


def refuse_retired(store: Store, model_id: str, version: str, *,
                   allow_yanked: bool = False, seen: Retired | None = None) -> None:
    """Raise unless ``model_id@version`` may be served; ``seen``: the two
    records as the caller read them an instant ago (not read again).

    Raises:
        ReleaseDeletedError: it has a tombstone.
        ReleaseYankedError: it is yanked (or its yank record cannot be read)
            and not ``allow_yanked``.
    """
    if seen is None:
        refuse_deleted(store, model_id, version)
        if allow_yanked:
            return
        failed = yank_gate(store, model_id, version)
    else:
        if seen.deleted:
            try:
                doc = read_tombstone(store, model_id, version)
            except RegistryError:
                doc = None
            raise deleted_error(store, model_id, version, doc)
        if allow_yanked:
            return
        failed = gate_of(seen.record, seen.garbled)
    if failed:
        raise ReleaseYankedError(f"{model_id}@{version}: not pulled (a yanked release is "
                                 "pulled only with --allow-yanked)", failed)

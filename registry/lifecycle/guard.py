"""What a reader of a release checks of its life before it serves it (issue 32).

:func:`refuse_retired` is called by :func:`registry.pull.pull` once the
version is resolved, before any byte is read: a deleted release (a tombstone,
even while its files are still being removed) is refused, and a yanked one
unless the caller asked for it (``allow_yanked``, ``--allow-yanked``).
"""

from __future__ import annotations

from registry.errors import ReleaseYankedError
from registry.lifecycle.tombstone import refuse_deleted
from registry.lifecycle.yank import yank_gate
from registry.store import Store


def refuse_retired(store: Store, model_id: str, version: str, *,
                   allow_yanked: bool = False) -> None:
    """Raise unless ``model_id@version`` may be served.

    Raises:
        ReleaseDeletedError: it has a tombstone.
        ReleaseYankedError: it is yanked (or its yank record cannot be read)
            and not ``allow_yanked``.
    """
    refuse_deleted(store, model_id, version)
    if allow_yanked:
        return
    failed = yank_gate(store, model_id, version)
    if failed:
        raise ReleaseYankedError(f"{model_id}@{version}: not pulled (a yanked release is "
                                 "pulled only with --allow-yanked)", failed)

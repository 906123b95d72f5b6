"""The Registry facade's part for aliases: move, remove, and read an alias's history
(issue 32 item 4; DESIGN section 5).

Each move goes to the store first (:mod:`registry.refs.aliases`: the pointer and its
history record), then to the index, then to the event log; a failing index write
is an :class:`registry.api.IndexWriteWarning`, never an undone store write.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from registry.refs.alias_history import AliasMove, walk
from registry.refs.aliases import alias_event, check_alias_name, move_alias, undo_if_deleted
from registry.errors import GateFailedError, RegistryError
from registry.gating.gates import GateResult, passed
from registry.index.alias_moves import record_move
from registry.index.record import record_alias
from registry.lifecycle.tombstone import refuse_deleted
from registry.rules.names import check_name
from registry.store import Store


class AliasMixin:
    """``set_alias``, ``remove_alias`` and ``alias_log``; mixed into
    :class:`registry.api.Registry` (which provides ``store``, ``_record`` and
    ``gate_check``)."""

    store: Store
    _record: Callable[[str, Callable[[Session], Any]], None]
    gate_check: Callable[..., list[GateResult]]
    _resign: Callable[..., None]

    def set_alias(self, model_id: str, alias: str, version: str, *,
                  force: bool = False, sign_key: str | os.PathLike[str] | None = None
                  ) -> str | None:
        """Point ``alias`` at ``version`` (must pass the gates unless ``force``),
        recorded in the alias's history, the index and the event log.

        Raises:
            GateFailedError: the version fails a gate and ``force`` is False.
            InvalidNameError, NameTakenError: an alias shaped like a version, or
                named like one of the model's versions (see registry.refs.aliases).
            NotCommittedError, PointerConflictError, SignatureError: see
                :func:`registry.refs.aliases.move_alias` (a protected alias needs
                ``sign_key`` of a key its policy lists).
            EventNotRecordedError: the move and its index row stand; its event
                was not appended (``registry events repair``).
        """
        check_alias_name(self.store, model_id, alias)  # before the gates: a clear error
        from registry.refs.aliases import unknown_ref
        from registry.protocol.layout import release_prefix as _prefix
        from registry.protocol.manifest import MANIFEST as _MANIFEST
        from registry.store import join as _join

        if not self.store.exists(_join(_prefix(model_id, check_name(version, "version")),
                                       _MANIFEST)):
            refuse_deleted(self.store, model_id, version)
            raise unknown_ref(self.store, model_id, version, kind="version")
        try:
            results = self.gate_check(model_id, version)
        except RegistryError:
            # a file of the release vanished or changed length while its gates
            # were read (ObjectNotFoundError, IntegrityError): if a delete (which
            # writes the tombstone first) raced this move, that is the answer
            refuse_deleted(self.store, model_id, version)
            raise
        if not passed(results) and not force:
            raise GateFailedError(f"{model_id}@{version}", results)
        head, move = move_alias(self.store, model_id, alias, version, sign_key=sign_key)
        self._resign([model_id], sign_key, only_signed=True)
        undo = undo_if_deleted(self.store, model_id, alias, version, head, move,
                               sign_key=sign_key)
        if undo is not None:  # raced a delete of the release (registry.lifecycle.delete)
            self._record(f"alias {model_id}@{alias}", lambda s: (
                _index_move(s, model_id, alias, version, move),
                _index_move(s, model_id, alias, head.version, undo)))
        else:
            self._record(f"alias {model_id}@{alias}",
                         lambda s: _index_move(s, model_id, alias, version, move))
        if move is not None:
            alias_event(self.store, move)
        if undo is not None:
            alias_event(self.store, undo)
            refuse_deleted(self.store, model_id, version)
        return head.version

    def remove_alias(self, model_id: str, alias: str, *,
                     sign_key: str | os.PathLike[str] | None = None) -> str | None:
        """Remove ``alias`` (:func:`registry.refs.aliases.remove_alias`), then the index
        row, then the event; returns the version it held (None: its pointer was
        damaged, unreadable). Raises as :meth:`set_alias`."""
        check_name(alias, "alias")
        head, move = move_alias(self.store, model_id, alias, None, sign_key=sign_key)
        self._resign([model_id], sign_key, only_signed=True)
        self._record(f"alias {model_id}@{alias}",
                     lambda s: _index_move(s, model_id, alias, None, move))
        if move is not None:
            alias_event(self.store, move)
        return head.version

    def alias_log(self, model_id: str, alias: str) -> tuple[list[AliasMove], list[str]]:
        """The alias's moves newest first, read from the store, and a note for
        a broken link of its history (:func:`registry.refs.alias_history.walk`)."""
        broken: list[str] = []
        return list(walk(self.store, model_id, alias, broken=broken)), broken


def _index_move(s: Session, model_id: str, alias: str, version: str | None,
                move: AliasMove | None) -> None:
    record_alias(s, model_id, alias, version)
    if move is not None:
        record_move(s, move)

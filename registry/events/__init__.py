"""Events: what happened in the store, in order, for a serving fleet (issue 32 item 7).

:func:`append_event` is what every write calls after it committed;
:mod:`registry.events.log` is the log itself (``events/<seq>.json``),
:mod:`registry.events.deliver` the webhook delivery with its cursor. Event
names follow MLflow 3.3's webhooks where they match.


Rooms it may import (tests/test_house.py keeps this list): errors, host, rules, obs, store, protocol, formats, gating, lifecycle, refs, trust.
"""

from __future__ import annotations

from typing import Any

from registry.errors import EventNotRecordedError, RegistryError, StorageError
from registry.events.log import Event, iter_events, read_event
from registry.store import Store

MODEL_VERSION_CREATED = "model_version.created"
MODEL_VERSION_ALIAS_CREATED = "model_version_alias.created"
MODEL_VERSION_ALIAS_DELETED = "model_version_alias.deleted"
MODEL_VERSION_TAG_SET = "model_version_tag.set"
MODEL_VERSION_TAG_DELETED = "model_version_tag.deleted"
MODEL_VERSION_YANKED = "model_version.yanked"
MODEL_VERSION_UNYANKED = "model_version.unyanked"
MODEL_VERSION_DELETED = "model_version.deleted"
SOURCE_REVOKED = "source.revoked"
POLICY_CHANGED = "policy.changed"

#: every event name a write may append.
EVENT_NAMES = frozenset({
    MODEL_VERSION_CREATED, MODEL_VERSION_ALIAS_CREATED, MODEL_VERSION_ALIAS_DELETED,
    MODEL_VERSION_TAG_SET, MODEL_VERSION_TAG_DELETED, MODEL_VERSION_YANKED,
    MODEL_VERSION_UNYANKED, MODEL_VERSION_DELETED, SOURCE_REVOKED, POLICY_CHANGED,
})

__all__ = ["EVENT_NAMES", "Event", "append_event", "iter_events", "read_event"]


def append_event(store: Store, name: str, *, model_id: str | None = None,
                 version: str | None = None, data: dict[str, Any] | None = None,
                 actor: dict[str, Any] | None = None) -> str:
    """Append the event of a write that just committed; returns the event's id.

    Args:
        name: one of :data:`EVENT_NAMES`.
        model_id, version: what the write was about (None where it is not a
            release, e.g. ``source.revoked``).
        data: the event's details (JSON-serialisable): ``{"alias", "previous"}``
            for an alias move, ``{"reason"}`` for a yank...
        actor: who did it (:func:`registry.host.actor.current_actor`); None: this
            process's actor, unsigned.

    Raises:
        ValueError: ``name`` is not an event name (a programming error).
        EventNotRecordedError: the store refused the append; the write it
            records stands (exit 11, ``registry events repair`` appends it).

    Notes:
        One object, conditional create, numbered after every event already
        there (:func:`registry.events.log.append`): no event lost or
        duplicated under concurrent writers on any backend.
    """
    from registry.host.actor import current_actor
    from registry.events import log

    if name not in EVENT_NAMES:
        raise ValueError(f"unknown event name {name!r}")
    what = f"{model_id}@{version}" if model_id and version else (model_id or "the write")
    try:
        return log.append(store, name, model_id=model_id, version=version, data=data,
                          actor=actor if actor is not None else current_actor()).id
    except (StorageError, OSError, RegistryError) as e:
        raise EventNotRecordedError(what, name, e) from e

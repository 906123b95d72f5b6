"""Whether what an event claims is true in the store (issue 50 item 4).

The event log is written by the registry *and* readable and writable by any
store writer: an event file dropped into ``events/`` would otherwise be
delivered to webhook receivers under a valid HMAC (the deliverer signs
whatever it reads). :func:`claim_refuted` checks each event's claim against
the records it names before delivery; an event whose claim does not hold is
set aside (not delivered, named) and the delivery goes on.

==================================  =========================================
event                               must hold in the store
==================================  =========================================
``model_version.created``           the release is committed (its manifest
                                    exists) or was deleted (its tombstone)
``model_version.yanked/unyanked``   the yank record exists at a revision at
                                    least the event's ``data.revision``
``model_version.deleted``           the release's tombstone exists
``model_version_alias.*``           the alias history entry ``data.entry``
                                    exists, names this model and alias, and
                                    its ``seq`` and version match the event
``model_version_tag.*``             the release exists or was deleted
``source.revoked``                  the revocation record of
                                    ``data.source_id`` exists
``policy.changed``                  the model exists
==================================  =========================================
"""

from __future__ import annotations

import re

from registry.errors import RegistryError
from registry.events.log import Event
from registry.protocol.layout import model_root, release_prefix, revocation_key, tombstone_key, yank_key
from registry.protocol.manifest import MANIFEST
from registry.rules.names import check_model_id, check_name
from registry.store import Store, join


_ENTRY = re.compile(r"[0-9]{8,12}-[0-9a-f]{16}\.json")


def _release_known(store: Store, model_id: str, version: str) -> bool:
    return (store.exists(join(release_prefix(model_id, version), MANIFEST))
            or store.exists(tombstone_key(model_id, version)))


def claim_refuted(store: Store, event: Event) -> str | None:
    """Why ``event``'s claim does not hold in the store now (None: it holds).
    Never raises for the store's content: an unreadable record refutes."""
    from registry import events as ev

    try:
        return _check(store, event, ev)
    except (RegistryError, OSError, KeyError, TypeError, ValueError) as e:
        return f"its records cannot be read ({str(e).splitlines()[0] if str(e) else e!r})"


def _check(store: Store, event: Event, ev: object) -> str | None:
    name, data = event.name, event.data or {}
    m, v = event.model_id, event.version
    if name == ev.SOURCE_REVOKED:  # type: ignore[attr-defined]
        sid = check_name(str(data.get("source_id")), "source_id")
        return None if store.exists(revocation_key(sid)) else f"no revocation of {sid!r}"
    if m is None:
        return "it names no model"
    check_model_id(m)
    if name == ev.POLICY_CHANGED:  # type: ignore[attr-defined]
        return None if store.subdirs(model_root(m)) else f"no model {m!r}"
    if v is None:
        return "it names no version"
    check_name(v, "version")
    what = f"{m}@{v}"
    if name in (ev.MODEL_VERSION_CREATED, ev.MODEL_VERSION_TAG_SET,  # type: ignore[attr-defined]
                ev.MODEL_VERSION_TAG_DELETED):  # type: ignore[attr-defined]
        return None if _release_known(store, m, v) else f"no release {what}"
    if name == ev.MODEL_VERSION_DELETED:  # type: ignore[attr-defined]
        return None if store.exists(tombstone_key(m, v)) else f"{what} has no tombstone"
    if name in (ev.MODEL_VERSION_YANKED, ev.MODEL_VERSION_UNYANKED):  # type: ignore[attr-defined]
        from registry.lifecycle import records

        record = records.load(store, yank_key(m, v))
        if record is None:
            return f"{what} has no yank record"
        want = data.get("revision")
        have = record.get("revision")
        if isinstance(want, int) and not (isinstance(have, int) and have >= want):
            return f"the yank record of {what} is at revision {have}, not {want}"
        return None
    if name in (ev.MODEL_VERSION_ALIAS_CREATED,  # type: ignore[attr-defined]
                ev.MODEL_VERSION_ALIAS_DELETED):  # type: ignore[attr-defined]
        from registry.refs.alias_history import read_entry

        alias = check_name(str(data.get("alias")), "alias")
        if not _ENTRY.fullmatch(str(data.get("entry"))):
            return f"its entry name {str(data.get('entry'))[:80]!r} is not an entry's"
        move = read_entry(store, m, alias, str(data.get("entry")))
        if move.seq != data.get("seq"):
            return f"entry {data.get('entry')} of {m}@{alias} is move {move.seq}"
        if (move.new or move.old) != v:
            return f"entry {data.get('entry')} of {m}@{alias} moves to {move.new}, not {v}"
        return None
    return f"unknown event name {name!r}"


__all__ = ["claim_refuted"]

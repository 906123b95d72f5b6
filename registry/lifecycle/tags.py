"""Tags: mutable ``key=value`` facts beside an immutable release (issue 32 item 3).

One record per release, moved by compare-and-swap (``If-Match`` on S3, a lock
file locally: :meth:`registry.store.base.Store.swap`)::

    ledger/tags/<model_id>/<version>.json
        {"schema": 1, "model_id", "version", "tags": {"team": "nlp", ...},
         "updated_at", "actor"}

:func:`set_tags` and :func:`remove_tags` read the record, apply their change
to what they read and swap it in only if nobody changed it meanwhile; a lost
race re-reads and re-applies, so two writers tagging one release at once
both land (no lost update). Each key set or removed appends a
``model_version_tag.set`` / ``model_version_tag.deleted`` event.

Rules: a key matches ``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``; a value is at
most 256 characters of printable text (may be empty); at most 64 tags per
release. The release must be committed (tagging a deleted one is refused).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from registry.errors import UsageError
from registry.protocol.layout import TAGS, release_prefix, tags_key
from registry.lifecycle import records
from registry.lifecycle.tombstone import refuse_deleted
from registry.protocol.manifest import utc_now
from registry.rules.names import check_model_id, check_name
from registry.store import Store
from registry.protocol.verify import read_manifest

KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_VALUE = 256
MAX_TAGS = 64


def check_tag(key: object, value: object = "") -> tuple[str, str]:
    """``(key, value)`` if they follow the rules (module doc).

    Raises:
        UsageError: naming the key and the rule.
    """
    if not isinstance(key, str) or not KEY.fullmatch(key):
        raise UsageError(f"tag key {key!r}: must match {KEY.pattern}")
    if not isinstance(value, str):
        raise UsageError(f"tag {key}: the value must be text")
    if len(value) > MAX_VALUE:
        raise UsageError(f"tag {key}: the value is {len(value)} characters, at most {MAX_VALUE}")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs") for c in value):
        raise UsageError(f"tag {key}: the value must be printable text on one line")
    return key, value


def parse_assignments(items: Iterable[str]) -> dict[str, str]:
    """``["team=nlp", "stage=eval"]`` -> ``{"team": "nlp", "stage": "eval"}``.

    Raises:
        UsageError: an item without ``=``, a bad key or value, a key twice.
    """
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"tag {item!r}: expected KEY=VALUE")
        check_tag(key, value)
        if key in out:
            raise UsageError(f"tag {key}: given twice")
        out[key] = value
    return out


def _tags_of(doc: dict[str, Any] | None, where: str) -> dict[str, str]:
    if doc is None:
        return {}
    tags = doc.get("tags")
    if not isinstance(tags, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in tags.items()):
        from registry.errors import DocumentError

        raise DocumentError(where, "\"tags\" must be an object of strings")
    return dict(tags)


def _change(store: Store, model_id: str, version: str,
            apply: Any, actor: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """CAS loop: ``apply(current_tags) -> new_tags``; returns ``(before, after)``."""
    check_model_id(model_id)
    check_name(version, "version")
    refuse_deleted(store, model_id, version)
    read_manifest(store, release_prefix(model_id, version))  # a committed release
    key = tags_key(model_id, version)
    store.ensure_root()

    def change(doc: dict[str, Any] | None
               ) -> tuple[tuple[dict[str, str], dict[str, str]], dict[str, Any] | None]:
        before = _tags_of(doc, store.url_of(key))
        after = apply(dict(before))
        if after == before:
            return (before, after), None
        if len(after) > MAX_TAGS:
            raise UsageError(f"{model_id}@{version}: {len(after)} tags, at most {MAX_TAGS}")
        return (before, after), {
            "schema": records.RECORD_SCHEMA, "model_id": model_id, "version": version,
            "tags": dict(sorted(after.items())), "updated_at": utc_now(), "actor": actor}

    return records.swap_record(store, key, "the tags record", change)


def set_tags(store: Store, model_id: str, version: str, tags: Mapping[str, str], *,
             actor: dict[str, Any] | None = None) -> dict[str, str]:
    """Set ``tags`` on ``model_id@version`` (others kept); returns all its tags.

    Raises:
        UsageError: no tag given, a bad key or value, more than 64 tags.
        NotCommittedError, ReleaseDeletedError: no such release.
        DocumentError: the stored record is garbled.
        PointerConflictError: the record kept changing (64 tries).
        EventNotRecordedError: the tags are set, an event did not land.

    Notes:
        Atomic (one compare-and-swap of the record); durable on return.
    """
    if not tags:
        raise UsageError("give at least one KEY=VALUE")
    for k, v in tags.items():
        check_tag(k, v)
    who = records.actor_of(actor)
    before, after = _change(store, model_id, version, lambda cur: {**cur, **tags}, who)
    from registry.events import MODEL_VERSION_TAG_SET

    for k in sorted(tags):
        if before.get(k) != after.get(k):
            records.event(store, MODEL_VERSION_TAG_SET, model_id, version,
                          {"key": k, "value": after[k]}, who)
    return after


def remove_tags(store: Store, model_id: str, version: str, keys: Iterable[str], *,
                actor: dict[str, Any] | None = None) -> dict[str, str]:
    """Remove tags ``keys`` of ``model_id@version``; returns the tags left.

    Raises:
        UsageError: no key given, a bad key, or a key the release does not
            have (as the record is at the swap: nothing is removed then).
        Otherwise as :func:`set_tags`.
    """
    wanted = [check_tag(k)[0] for k in keys]
    if not wanted:
        raise UsageError("give at least one KEY")
    who = records.actor_of(actor)

    def apply(cur: dict[str, str]) -> dict[str, str]:
        missing = [k for k in wanted if k not in cur]
        if missing:
            raise UsageError(f"{model_id}@{version}: no tag {', '.join(missing)} "
                             f"(tags: {', '.join(sorted(cur)) or 'none'})")
        return {k: v for k, v in cur.items() if k not in wanted}

    before, after = _change(store, model_id, version, apply, who)
    from registry.events import MODEL_VERSION_TAG_DELETED

    for k in wanted:
        if k in before and k not in after:
            records.event(store, MODEL_VERSION_TAG_DELETED, model_id, version, {"key": k}, who)
    return after


def read_tags(store: Store, model_id: str, version: str) -> dict[str, str]:
    """The tags of ``model_id@version`` ({} when none).

    Raises:
        DocumentError: the record is garbled.
    """
    return read_tags_record(store, model_id, version)[0]


def read_tags_record(store: Store, model_id: str, version: str
                     ) -> tuple[dict[str, str], dict[str, Any]]:
    """The tags of ``model_id@version`` and their whole record (``{}`` when
    there is none): who set them last, when.

    Raises:
        DocumentError: the record is garbled.
    """
    key = tags_key(model_id, version)
    doc = records.load(store, key)
    return _tags_of(doc, store.url_of(key)), doc or {}


def tagged(store: Store, model_id: str) -> dict[str, dict[str, str]]:
    """version -> tags for every tagged release of ``model_id`` (for ``index
    rebuild``); garbled records and tags breaking the rules are left out."""
    def checked(version: str) -> dict[str, str] | None:
        tags = read_tags(store, model_id, version)
        for k, v in tags.items():
            check_tag(k, v)
        return tags or None
    return records.per_version(store, TAGS, model_id, checked)

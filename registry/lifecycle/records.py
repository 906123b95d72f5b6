"""The small JSON records of a release's life, and what every lifecycle write shares.

Yank records, tombstones and tag sets (issue 32 items 1-3) live in the store's
live ledger, beside the immutable releases (:mod:`registry.protocol.layout`)::

    ledger/yanks/<model_id>/<version>.json       {"schema": 1, "yanked": true, ...}
    ledger/tombstones/<model_id>/<version>.json  {"schema": 1, "manifest_sha256", ...}
    ledger/tags/<model_id>/<version>.json        {"schema": 1, "tags": {...}, ...}

Each is one object a reader takes whole (bounded by
:data:`registry.rules.limits.MAX_JSON_BYTES`). Mutable ones (yanks, tags) are moved by
compare-and-swap on the object (:meth:`registry.store.base.Store.swap`); a
tombstone is created once (conditional create) and never changes. Every write
records its actor (:func:`registry.host.actor.current_actor`) and appends its event
(:func:`registry.events.append_event`) after it committed.
"""

from __future__ import annotations

import random
import time
import unicodedata
from collections.abc import Callable
from typing import Any, TypeVar

from registry.rules import limits, numbers
from registry.errors import DocumentError, ObjectNotFoundError, PointerConflictError, \
    RegistryError, UsageError
from registry.rules.schemas import load_json
from registry.rules.names import check_name, model_key
from registry.store import Store, join

T = TypeVar("T")

#: version of the records' shape.
RECORD_SCHEMA = 1
#: longest reason (characters) a yank or delete records.
MAX_REASON = 1000
#: attempts of a compare-and-swap loop on one record before giving up.
MAX_ATTEMPTS = 64


def dump(doc: dict[str, Any]) -> bytes:
    """The stored bytes of a record (sorted keys, one line, a newline)."""
    return (numbers.dumps(doc, sort_keys=True, ensure_ascii=False) + "\n").encode()


def parse(raw: bytes, where: str) -> dict[str, Any]:
    """A record from its bytes.

    Raises:
        DocumentError: not JSON, or not an object with ``"schema": 1``.
    """
    doc = load_json(raw, path=where)
    if not isinstance(doc, dict) or doc.get("schema") != RECORD_SCHEMA:
        raise DocumentError(where, f"expected a JSON object with \"schema\": {RECORD_SCHEMA}")
    return doc


def load(store: Store, key: str) -> dict[str, Any] | None:
    """The record at ``key``, or None when there is none.

    Raises:
        DocumentError: the object is garbled or larger than the JSON cap.
    """
    try:
        raw = store.read_bytes(key, limit=limits.MAX_JSON_BYTES)
    except ObjectNotFoundError:
        return None
    return parse(raw, store.url_of(key))


def load_versioned(store: Store, key: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(record, token)`` for a compare-and-swap; ``(None, None)`` when absent.

    Raises:
        DocumentError: the object is garbled or larger than the JSON cap.
    """
    try:
        raw, token = store.read_versioned(key)
    except ObjectNotFoundError:
        return None, None
    if len(raw) > limits.MAX_JSON_BYTES:
        raise DocumentError(store.url_of(key), f"larger than the {limits.MAX_JSON_BYTES}-byte "
                                               "limit for a document read whole")
    return parse(raw, store.url_of(key)), token


def backoff(attempt: int) -> None:
    """Sleep a little, more after each lost compare-and-swap (jittered)."""
    time.sleep(min(0.2, 0.002 * 2 ** min(attempt, 7)) * random.uniform(0.5, 1.5))


def swap_record(store: Store, key: str, what: str,
                change: Callable[[dict[str, Any] | None], tuple[T, dict[str, Any] | None]]
                ) -> T:
    """Move the record at ``key`` by compare-and-swap: ``change(current)``
    (None: no record yet) returns ``(result, new record)``, or ``(result,
    None)`` to write nothing; a lost swap reads again and retries.

    Raises:
        PointerConflictError: ``what`` (e.g. "the yank record") kept changing
            (:data:`MAX_ATTEMPTS` tries).
    """
    for attempt in range(MAX_ATTEMPTS):
        current, token = load_versioned(store, key)
        result, new = change(current)
        if new is None:
            return result
        try:
            store.swap(key, dump(new), token)
            return result
        except PointerConflictError:
            backoff(attempt)
    raise PointerConflictError(store.url_of(key), expected=what,
                               actual=f"changed {MAX_ATTEMPTS} times")


def check_reason(reason: object, what: str) -> str:
    """The reason text of a yank or delete: stripped, non-empty, one line of
    at most :data:`MAX_REASON` printable characters.

    Raises:
        UsageError: empty, too long, or with a control character.
    """
    text = reason.strip() if isinstance(reason, str) else ""
    if not text:
        raise UsageError(f"{what} needs a reason (--reason REASON)")
    if len(text) > MAX_REASON:
        raise UsageError(f"{what}: the reason is {len(text)} characters, at most {MAX_REASON}")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text):
        raise UsageError(f"{what}: the reason must be one line of printable text")
    return text


def event(store: Store, name: str, model_id: str, version: str, data: dict[str, Any],
          actor: dict[str, Any]) -> str:
    """Append the event of a lifecycle write that committed; returns its id.

    Raises:
        EventNotRecordedError: the write stands, its event did not land.
    """
    from registry.events import append_event

    return append_event(store, name, model_id=model_id, version=version, data=data,
                        actor=actor)


def actor_of(actor: dict[str, Any] | None) -> dict[str, Any]:
    """``actor``, or this process's (:func:`registry.host.actor.current_actor`)."""
    from registry.host.actor import current_actor

    return dict(actor) if actor is not None else current_actor()


def per_version(store: Store, root: str, model_id: str,
                read: Callable[[str], T | None]) -> dict[str, T]:
    """version -> ``read(version)`` for every ``<root>/<model_id>/<version>.json``
    record (for ``index rebuild``): temporary files, folders, bad version names,
    records ``read`` refuses (any ``RegistryError``) and those it returns None
    for are left out.

    Raises:
        InvalidNameError: a bad ``model_id``.
        StorageError: the folder could not be listed.
    """
    out: dict[str, T] = {}
    for name, is_dir in store.list_dir(join(root, model_key(model_id))):
        version = name.removesuffix(".json")
        if is_dir or not name.endswith(".json") or ".tmp" in name:
            continue
        try:
            doc = read(check_name(version, "version"))
        except RegistryError:
            continue
        if doc is not None:
            out[version] = doc
    return out

"""The store's event log: ``events/<seq:012d>.json`` (issue 32 item 7).

Every write the registry commits (a release, an alias move, a yank, a
revocation, a policy change...) also appends one **event** object. Events are
numbered 1, 2, 3...: a writer lists ``events/``, takes the highest number plus
one and writes ``events/<n>.json`` by conditional create (``If-None-Match: *``
on S3, an exclusive hard link of a complete, fsynced temporary file locally).
A writer that loses the race for ``n`` lists again and tries the next number,
so under any number of concurrent writers:

* no event is lost: a create either wins its number or is retried;
* none is duplicated: the event's random ``id`` is in its bytes, so a retried
  request that finds its own bytes in place is recognised
  (:meth:`registry.store.base.Store.create`), never written twice;
* numbers have no holes and the order of numbers is the order of the
  creates: number ``n + 1`` is tried only by a writer that saw ``n`` listed,
  so a reader that has seen ``n`` will never later see a lower new number.
  A delivery cursor is therefore one number (registry.events.deliver).

A listing is one request per 1000 events on S3 per append; the log is for
registry writes (tens a day), not for data-plane traffic.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from registry.errors import DocumentError, ObjectExistsError, ObjectNotFoundError, StorageError
from registry.protocol.layout import EVENT_DIGITS, EVENTS, EVENTS_TMP_PREFIX, event_key
from registry.protocol.manifest import utc_now
from registry.rules.schemas import load_json, validate
from registry.store import Store

#: version of the event document's shape (schemas/event.schema.json).
EVENT_SCHEMA = 1
#: attempts at a number before an append gives up (each loss means another
#: writer appended: only a log under a storm of writers gets near it).
MAX_ATTEMPTS = 200
_NAME = re.compile(r"[0-9]{12,}\.json")


@dataclass(frozen=True, slots=True)
class Event:
    """One event as stored: its number, id, name, time (RFC 3339 UTC), model,
    version, data and actor (``None`` where the writer recorded none)."""

    seq: int
    id: str
    name: str
    time: str
    model_id: str | None
    version: str | None
    data: dict[str, Any]
    actor: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        """The stored document (schemas/event.schema.json)."""
        return {"schema_version": EVENT_SCHEMA, "id": self.id, "seq": self.seq,
                "name": self.name, "time": self.time, "model_id": self.model_id,
                "version": self.version, "data": self.data, "actor": self.actor}


#: the largest step from one event number to the next that readers and writers
#: accept: numbers have no holes, so a jump is a store writer's object (an event
#: numbered 10**30 would otherwise push every later append past every reader)
MAX_GAP = 1000


def split_numbers(names: list[str]) -> tuple[list[int], list[str]]:
    """``(numbers, quarantined)`` of the event object names ``names``: the
    numbers of ``<seq:012d>.json`` names, ascending, up to the first jump of
    more than :data:`MAX_GAP` from the one before (from 0 for the first); the
    names past it, or of more than 12 digits, are quarantined (issue 50 item 4:
    bounded sequence numbers)."""
    found = sorted((int(n[:-5]), n) for n in names if _NAME.fullmatch(n))
    numbers: list[int] = []
    quarantined: list[str] = []
    for seq, name in found:
        if len(name) != EVENT_DIGITS + 5 or seq - (numbers[-1] if numbers else 0) > MAX_GAP \
                or quarantined:
            quarantined.append(name)
        else:
            numbers.append(seq)
    return numbers, quarantined


def event_numbers(store: Store, *, quarantined: list[str] | None = None) -> list[int]:
    """The numbers of the events in the store, ascending (one listing); the
    object names out of bounds (:func:`split_numbers`) go to ``quarantined``
    when given, and are never read or numbered after.

    Raises:
        StorageError: the store could not be listed.
    """
    numbers, bad = split_numbers([name for name, is_dir in store.list_dir(EVENTS)
                                  if not is_dir])
    if quarantined is not None:
        quarantined.extend(bad)
    return numbers


def _create_whole(store: Store, key: str, data: bytes) -> None:
    """Conditional create that no reader sees half-written: a local file is
    written and fsynced under a temporary name, then hard-linked to ``key``
    (``link(2)`` fails if ``key`` exists)."""
    path = store.local_path(key)
    if path is None:
        store.create(key, data)
        return
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f"{EVENTS_TMP_PREFIX}{uuid.uuid4().hex}")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise ObjectExistsError(f"{key}: already exists", key=key) from None
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append(store: Store, name: str, *, model_id: str | None = None,
           version: str | None = None, data: dict[str, Any] | None = None,
           actor: dict[str, Any] | None = None) -> Event:
    """Append one event; returns it with the number it won.

    Raises:
        StorageError: the store refused the listing or the create, or the
            number kept being taken for MAX_ATTEMPTS attempts.

    Notes:
        Atomic: the event is wholly there or not at all. Durable on return.
    """
    event_id = uuid.uuid4().hex
    when = utc_now()
    store.ensure_root()
    for attempt in range(MAX_ATTEMPTS):
        numbers = event_numbers(store)
        seq = (numbers[-1] if numbers else 0) + 1
        event = Event(seq, event_id, name, when, model_id, version, dict(data or {}), actor)
        body = json.dumps(event.to_dict(), sort_keys=True, separators=(",", ":")).encode()
        try:
            _create_whole(store, event_key(seq), body)
            return event
        except ObjectExistsError:
            time.sleep(random.uniform(0, 0.002 * min(attempt + 1, 25)))
    raise StorageError(f"{store.url_of(EVENTS)}: no free event number after {MAX_ATTEMPTS} "
                       "attempts (other writers kept taking them)", key=EVENTS)


def parse_event(raw: bytes, *, where: str, seq: int) -> Event:
    """An event from its stored bytes.

    Raises:
        DocumentError: not JSON, breaking schemas/event.schema.json, or its
            ``seq`` is not the number its key says (a copied object).
    """
    doc = load_json(raw, path=where)
    validate(doc, "event", path=where)
    if doc["seq"] != seq:
        raise DocumentError(where, f"seq {doc['seq']} but the object is number {seq}")
    return Event(seq, doc["id"], doc["name"], doc["time"], doc["model_id"], doc["version"],
                 doc["data"], doc["actor"])


def read_event(store: Store, seq: int) -> Event:
    """The event numbered ``seq``.

    Raises:
        ObjectNotFoundError: no such event.
        DocumentError: see :func:`parse_event`; larger than
            ``limits.MAX_JSON_BYTES`` (nothing more is read).
    """
    from registry.rules import limits

    key = event_key(seq)  # an event is a JSON document: read at most its cap
    return parse_event(store.read_bytes(key, limit=limits.MAX_JSON_BYTES),
                       where=store.url_of(key), seq=seq)


def _time_of(store: Store, seq: int) -> str | None:
    try:
        return read_event(store, seq).time
    except (ObjectNotFoundError, DocumentError):
        return None


def select_events(store: Store, *, after: int = 0, when: str | None = None,
                  newest: int | None = None, damaged: list[str] | None = None
                  ) -> list[Event]:
    """The events above ``after`` and at or after the time ``when``, in order;
    with ``newest``, only the last ``newest`` of them. Costs one listing plus
    the events asked for (and, with ``when``, about log2(n) reads to find the
    first): never a read of the whole log (issue 50 item 5).

    An event's time is its writer's clock at append: the numbers' order is the
    log's order, times of concurrent writers may be a little out of it, so
    ``when`` is found by bisection on the numbers (an event within that
    skew of ``when`` may be left out or kept).

    Raises:
        as :func:`iter_events`.
    """
    import bisect

    numbers = [n for n in event_numbers(store) if n > after]
    if when is not None and numbers:
        lo = bisect.bisect_left(range(len(numbers)), True,
                                key=lambda i: (_time_of(store, numbers[i]) or "") >= when)
        numbers = numbers[lo:]
    if newest is not None:
        numbers = numbers[-newest:] if newest > 0 else []
    out = []
    for seq in numbers:
        try:
            event = read_event(store, seq)
        except ObjectNotFoundError:
            continue
        except DocumentError as e:
            if damaged is None:
                raise
            damaged.append(str(e))
            continue
        if when is None or event.time >= when:
            out.append(event)
    return out


def iter_events(store: Store, *, after: int = 0, damaged: list[str] | None = None
                ) -> Iterator[Event]:
    """The events numbered above ``after``, in order.

    Args:
        damaged: where to note events that cannot be read (a message each);
            None: raise instead.

    Raises:
        DocumentError: an event is damaged and ``damaged`` is None.
        StorageError: the store refused the listing or a read.
    """
    for seq in event_numbers(store):
        if seq <= after:
            continue
        try:
            yield read_event(store, seq)
        except ObjectNotFoundError:
            continue  # removed between the listing and the read
        except DocumentError as e:
            if damaged is None:
                raise
            damaged.append(str(e))

"""Release order: a per-model counter the commit moves (issue 31 item 2).

"Latest" must not depend on a publisher's clock: a release published from a
host an hour behind would sort as the oldest. Each model has a counter
object, moved by compare-and-swap (:meth:`Store.swap`: ``If-Match`` on S3, a
lock file locally)::

    models/<model_id>/.sequence        "<last sequence assigned>\\n"

A publisher takes the next number right before it writes the release's
commit marker, under its claim on the version, and records it in the
manifest's reserved string facts (``"metadata": {"sequence": "7"}``), so the
order is part of the immutable release and ``index rebuild`` recovers it.
Of two publishers racing, each gets its own number; a publish that fails
after taking one leaves a gap, never a duplicate. ``.sequence`` can never be
a version (names start with a letter or digit).

Releases committed before the counter existed carry no sequence: the index
numbers them ``1..k`` per model by ``(created_at, version)``, the order it
had (migration 0004 and ``index rebuild``), and the first counter of a model
starts after every version directory its folder lists.
"""

from __future__ import annotations

import random
import time

from registry.errors import DocumentError, ObjectNotFoundError, PointerConflictError
from registry.protocol.layout import model_root
from registry.protocol.manifest import Manifest
from registry.rules.numbers import INT_MAX
from registry.store import Store, join

COUNTER = ".sequence"
#: manifest ``metadata`` key holding the release's sequence (a decimal string)
FIELD = "sequence"
_TRIES = 64


def counter_key(model_id: str) -> str:
    return join(model_root(model_id), COUNTER)


def _parse(data: bytes, where: str) -> int:
    text = data.decode("ascii", "replace").strip()
    if not text.isdigit() or len(text) > 19 or int(text) >= INT_MAX:
        raise DocumentError(where, f"expected the last release sequence (a decimal number), "
                            f"found {text[:40]!r}; write the highest sequence of the model's "
                            "releases (`registry ls --json`) there")
    return int(text)


def _versions_listed(store: Store, model_id: str, publishing: str | None) -> int:
    return sum(1 for name, is_dir in store.list_dir(model_root(model_id))
               if is_dir and name not in ("refs", publishing) and ".tmp" not in name)


def next_sequence(store: Store, model_id: str, *, publishing: str | None = None) -> int:
    """Take the model's next release sequence (1, 2, ...), atomically.

    Args:
        publishing: the version being committed (on object stores its folder
            is already there; it does not count as an earlier release when
            the counter starts).

    Returns:
        A number no other caller of this function for ``model_id`` gets.

    Raises:
        DocumentError: the counter object is garbled (names it and the repair).
        PointerConflictError: the counter kept changing under ``_TRIES``
            attempts (that many publishers at once).
        StorageError: the store failed.
    """
    key = counter_key(model_id)
    for attempt in range(_TRIES):
        token: str | None
        try:
            data, token = store.read_versioned(key)
            current = _parse(data, store.url_of(key))
        except ObjectNotFoundError:
            token, current = None, _versions_listed(store, model_id, publishing)
        try:
            store.swap(key, f"{current + 1}\n".encode(), token)
            return current + 1
        except PointerConflictError:
            time.sleep(min(0.2, 0.002 * 2 ** min(attempt, 7)) * random.uniform(0.5, 1.5))
    raise PointerConflictError(store.url_of(key), expected="the release counter",
                               actual=f"changed {_TRIES} times while taking a number")


def sequence_of(manifest: Manifest) -> int | None:
    """The sequence a release's manifest records, or None (a release
    committed before the counter, or a value that is not a number)."""
    meta = manifest.meta.get("metadata")
    text = meta.get(FIELD) if isinstance(meta, dict) else None
    if isinstance(text, str) and text.isdigit() and len(text) <= 18:
        return int(text)
    return None

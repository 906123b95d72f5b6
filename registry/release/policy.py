"""Per-model gate policy: thresholds every release of a model must meet.

Stored in the store (the source of truth) as ``models/<model_id>/policy.json``::

    {"require": ["accuracy>=0.8", "toxicity/rate<=0.01"]}
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from registry import schemas
from registry.errors import DocumentError
from registry.gates import Threshold
from registry.names import check_name
from registry.store import Store, join


def policy_key(model_id: str) -> str:
    return join("models", check_name(model_id, "model_id"), "policy.json")


def thresholds(store: Store, model_id: str, *,
               extra: Iterable[Threshold | str] = ()) -> list[Threshold]:
    """The model's stored thresholds followed by ``extra`` (strings are parsed).

    Raises:
        DocumentError: policy.json or a threshold in it is malformed.
        UsageError: a threshold of ``extra`` does not parse.
    """
    key = policy_key(model_id)
    out = []
    try:
        doc = schemas.load_json(store.read_bytes(key), path=store.url_of(key))
    except FileNotFoundError:
        doc = {"require": []}
    items = doc.get("require") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise DocumentError(store.url_of(key), "expected {\"require\": [\"METRIC>=VALUE\", ...]}")
    for item in items:
        out.append(_parse(item, store.url_of(key)))
    # the caller's own thresholds are arguments, not the stored document: a bad
    # one is a usage error naming the text (exit 2), not a broken policy.json
    out += [t if isinstance(t, Threshold) else Threshold.parse(str(t)) for t in extra]
    return out


def _parse(item: Threshold | object, where: str) -> Threshold:
    if isinstance(item, Threshold):
        return item
    try:
        return Threshold.parse(str(item))
    except ValueError as e:
        raise DocumentError(where, str(e)) from None


def set_policy(store: Store, model_id: str, require: Iterable[str]) -> list[Threshold]:
    """Replace the model's thresholds; returns them parsed.

    Raises:
        UsageError: a threshold does not parse (it is an argument, not a document).
    """
    parsed = [r if isinstance(r, Threshold) else Threshold.parse(str(r)) for r in require]
    store.write_bytes(policy_key(model_id),
                      (json.dumps({"require": [str(t) for t in parsed]}, indent=2) + "\n").encode())
    return parsed

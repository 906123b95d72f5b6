"""Who did it: the actor a write records (issue 32 item 5).

Every write the registry makes on a user's behalf -- a release, an alias move,
a yank or delete record, a revocation, a policy change, an event -- carries an
**actor** document::

    {"user": "alice", "host": "build-7", "key": "3f9a...e1"}   # ACTOR_SCHEMA 1

``user`` is the OS account that ran the write (``$REGISTRY_ACTOR`` overrides it,
for CI jobs that run as a service account on behalf of a person); ``host`` is
:func:`socket.gethostname`; ``key`` is the sha256 fingerprint of the signing
key's public half (:func:`registry.keys.fingerprint_of`) when the write is
signed, else None.

An actor is a claim, not a proof: a store writer can put any name in an
unsigned record. Only ``key`` backed by a signature the reader verifies (a
protected alias's move, a signed release) is evidence.
"""

from __future__ import annotations

import getpass
import os
import socket
from typing import Any

#: version of the actor document's shape (a reader accepts any dict with these keys).
ACTOR_SCHEMA = 1
#: environment variable that names the user a write is recorded for.
ACTOR_ENV = "REGISTRY_ACTOR"
_MAX = 256


def _user() -> str:
    name = os.environ.get(ACTOR_ENV, "").strip()
    if name:
        return name[:_MAX]
    try:
        return getpass.getuser()[:_MAX]
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        return f"uid:{os.getuid()}" if hasattr(os, "getuid") else "unknown"


def current_actor(key_fingerprint: str | None = None) -> dict[str, Any]:
    """The actor of a write made now by this process.

    Args:
        key_fingerprint: the signing key's fingerprint (sha256 hex of its
            public key) when the write is signed.

    Returns:
        ``{"user": str, "host": str, "key": str | None}``.
    """
    return {"user": _user(), "host": socket.gethostname()[:_MAX] or "unknown",
            "key": key_fingerprint}


def read_actor(value: object) -> dict[str, Any] | None:
    """An actor document read from a stored record, or None when absent or not
    shaped like one (records written before actors were recorded)."""
    if not isinstance(value, dict):
        return None
    user, host, key = value.get("user"), value.get("host"), value.get("key")
    if not isinstance(user, str) or not isinstance(host, str):
        return None
    return {"user": user[:_MAX], "host": host[:_MAX],
            "key": key[:_MAX] if isinstance(key, str) else None}


def describe(actor: dict[str, Any] | None) -> str:
    """``alice@build-7`` (``alice@build-7 key 3f9a...``) for a listing; ``-`` for none."""
    if not actor:
        return "-"
    text = f"{actor.get('user')}@{actor.get('host')}"
    return f"{text} key {actor['key'][:16]}" if actor.get("key") else text

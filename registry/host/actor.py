"""Who did it: the actor a write records (issue 32 item 5).

Every write the registry makes on a user's behalf -- a release, an alias move,
a yank or delete record, a revocation, a policy change, an event -- carries an
**actor** document::

    {"user": "alice", "host": "build-7", "key": "3f9a...e1"}   # ACTOR_SCHEMA 1

``user`` is the OS account that ran the write (``$REGISTRY_ACTOR`` overrides it,
for CI jobs that run as a service account on behalf of a person); ``host`` is
:func:`socket.gethostname`; ``key`` is the sha256 fingerprint of the signing
key's public half (:func:`registry.trust.keys.fingerprint_of`) when the write is
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


#: keys of a release manifest's ``metadata`` (string facts) that hold its actor.
META_PREFIX = "actor."


def actor_metadata(actor: dict[str, Any]) -> dict[str, str]:
    """An actor as a manifest's ``metadata`` strings: ``actor.schema`` (``"1"``),
    ``actor.user``, ``actor.host`` and ``actor.key`` when signed. Manifests
    written before have none of them and read as having no actor."""
    out = {f"{META_PREFIX}schema": str(ACTOR_SCHEMA), f"{META_PREFIX}user": actor["user"],
           f"{META_PREFIX}host": actor["host"]}
    if actor.get("key"):
        out[f"{META_PREFIX}key"] = actor["key"]
    return out


def actor_of_metadata(metadata: object) -> dict[str, Any] | None:
    """The actor a manifest's ``metadata`` records, or None (an older manifest)."""
    if not isinstance(metadata, dict) or f"{META_PREFIX}user" not in metadata:
        return None
    return read_actor({"user": metadata.get(f"{META_PREFIX}user"),
                       "host": metadata.get(f"{META_PREFIX}host", ""),
                       "key": metadata.get(f"{META_PREFIX}key")})


def describe(actor: dict[str, Any] | None) -> str:
    """``alice@build-7`` (``alice@build-7 key 3f9a...``) for a listing; ``-`` for none."""
    if not actor:
        return "-"
    text = f"{actor.get('user')}@{actor.get('host')}"
    return f"{text} key {actor['key'][:16]}" if actor.get("key") else text

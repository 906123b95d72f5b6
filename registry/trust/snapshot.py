"""Signed snapshot and timestamp of a model's trust records (TUF's ideas, issue 50 item 3).

A store writer (bucket write access, no signing key) can delete or roll back
any record whose absence means "allowed", and can freeze the store at an old
state. TUF answers with two signed documents, kept here per model with the
registry's own EC keys (:mod:`registry.trust.envelope`; docs/decisions.md says
why python-tuf itself is not used):

* the **snapshot** ``ledger/snapshots/<m>/<n>.snapshot.json`` lists every
  trust-relevant record of the model with its version and sha256::

      {"signed": {"_type": "snapshot", "spec_version": 1, "model_id": "m",
                  "version": 3, "created": "...Z",
                  "records": {"ledger/yanks/m/2.json": {"version": 1, "sha256": "..."},
                              "ledger/tombstones/m/1.json": {...},
                              "models/m/refs/prod": {"version": 7, "sha256": "..."},
                              "ledger/revocations/<s>.json": {...},
                              "models/m/policy.json": {...}}},
       "signatures": [{"keyid": "<fingerprint>", "sig": "<base64>"}]}

  (``version``: a yank record's ``revision``, an alias move's ``seq``, 1 for
  the rest); each version of the snapshot is its own object;
* the **timestamp** ``ledger/snapshots/<m>/timestamp.json`` is short-lived
  (``expires``, default :data:`DEFAULT_EXPIRY` seconds) and names the current
  snapshot by version and sha256; ``registry snapshot refresh`` re-signs it
  (cron), ``registry snapshot sign`` makes a new snapshot and timestamp, and
  every command that changes a listed record (yank, unyank, alias set/rm,
  release delete, ledger revoke) does that itself when given ``--sign-key``.

The check on a reading host is :mod:`registry.trust.freshness`.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime, timedelta
from typing import Any

from registry.rules import limits
from registry.errors import DocumentError, ObjectNotFoundError, UsageError
from registry.protocol.layout import (
    REVOCATIONS,
    SNAPSHOTS,
    TOMBSTONES,
    YANKS,
    policy_key,
    refs_prefix,
    snapshot_key,
    timestamp_key,
)
from registry.rules.names import check_name
from registry.store import Store, join
from registry.trust import envelope

SPEC_VERSION = 1
#: seconds a timestamp is valid by default (TUF's reference default: one day)
DEFAULT_EXPIRY = 24 * 3600.0
#: tries to take the next snapshot version when another signer took it first
MAX_ATTEMPTS = 16


def sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _read(store: Store, key: str) -> bytes | None:
    try:
        return store.read_bytes(key, limit=limits.MAX_JSON_BYTES)
    except (ObjectNotFoundError, FileNotFoundError):
        return None


def _int_field(raw: bytes, name: str) -> int:
    try:
        value = json.loads(raw).get(name)
    except (ValueError, AttributeError, RecursionError):
        return 0
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _json_files(store: Store, prefix: str) -> list[str]:
    return [join(prefix, n) for n, d in store.list_dir(prefix) if not d and n.endswith(".json")]


def records(store: Store, model_id: str) -> dict[str, dict[str, Any]]:
    """Every trust-relevant record of ``model_id`` as the store holds it now:
    key -> ``{"version", "sha256"}`` (yank records, tombstones, alias
    pointers, the store's revocations, the model's policy.json: its key list).
    A garbled record is listed by its digest with version 0: what is listed is
    the bytes, whatever they say. Raises StorageError when a listing fails."""
    check_name(model_id, "model_id")
    out: dict[str, dict[str, Any]] = {}

    def add(key: str, version: str | None) -> None:
        raw = _read(store, key)
        if raw is not None:
            out[key] = {"version": _int_field(raw, version) if version else 1,
                        "sha256": sha256(raw)}

    for key in _json_files(store, join(YANKS, model_id)):
        add(key, "revision")
    for key in _json_files(store, join(TOMBSTONES, model_id)):
        add(key, None)
    for name, is_dir in store.list_dir(refs_prefix(model_id)):
        if not is_dir:
            add(join(refs_prefix(model_id), name), "seq")
    for key in _json_files(store, REVOCATIONS):
        add(key, None)
    add(policy_key(model_id), None)
    return out


def read_envelope(store: Store, key: str) -> tuple[bytes, dict[str, Any]] | None:
    """``(raw, document)`` of a signed document, None when absent.

    Raises:
        DocumentError: longer than the JSON cap, or not a JSON object.
    """
    raw = _read(store, key)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise DocumentError(store.url_of(key), "not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("signed"), dict):
        raise DocumentError(store.url_of(key), 'expected {"signed": {...}, "signatures": [...]}')
    return raw, doc


def _version_of(store: Store, key: str) -> int:
    try:
        got = read_envelope(store, key)
    except DocumentError:
        return 0
    if got is None:
        return 0
    v = got[1]["signed"].get("version")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def expiry(seconds: float) -> str:
    """The RFC 3339 UTC time ``seconds`` from now (whole seconds)."""
    when = datetime.now(UTC) + timedelta(seconds=seconds)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _timestamp(store: Store, model_id: str, snap_version: int, snap_raw: bytes,
               key_path: str | os.PathLike[str], expires_in: float) -> dict[str, Any]:
    if expires_in <= 0:
        raise UsageError(f"--expires-in: must be positive, not {expires_in:g} s")
    ts_version = _version_of(store, timestamp_key(model_id)) + 1
    signed = {"_type": "timestamp", "spec_version": SPEC_VERSION, "model_id": model_id,
              "version": ts_version, "expires": expiry(expires_in),
              "snapshot": {"version": snap_version, "sha256": sha256(snap_raw)}}
    store.write_bytes(timestamp_key(model_id), envelope.encode(envelope.sign(signed, key_path)))
    return signed


def sign_snapshot(store: Store, model_id: str, key_path: str | os.PathLike[str], *,
                  expires_in: float = DEFAULT_EXPIRY) -> dict[str, Any]:
    """Take a new snapshot of ``model_id``'s records (version one above the
    newest), sign it and a timestamp naming it, both with ``key_path``.

    Returns:
        ``{"model_id", "snapshot": version, "timestamp": version, "expires",
        "records": count, "key": fingerprint}``.

    Raises:
        DocumentError, SigningUnavailableError: the key (see
            :func:`registry.trust.keys.check_private_key`).
        StorageError: the store cannot be listed or written.

    Atomicity: the snapshot is created by conditional create under a new
    version (never replaced), then the timestamp is replaced: a reader sees
    the old timestamp and snapshot or the new ones.
    """
    from registry.errors import ObjectExistsError
    from registry.trust.keys import check_private_key

    fingerprint = check_private_key(key_path).fingerprint
    version = max(_named_snapshot(store, model_id), _newest(store, model_id)) + 1
    for _ in range(MAX_ATTEMPTS):
        signed = {"_type": "snapshot", "spec_version": SPEC_VERSION, "model_id": model_id,
                  "version": version, "created": expiry(0),
                  "records": records(store, model_id)}
        raw = envelope.encode(envelope.sign(signed, key_path))
        try:
            store.create(snapshot_key(model_id, version), raw)
            break
        except ObjectExistsError:
            version += 1  # another signer took it
    else:
        raise DocumentError(store.url_of(snapshot_key(model_id, version)),
                            f"no free snapshot version after {MAX_ATTEMPTS} tries")
    ts = _timestamp(store, model_id, version, raw, key_path, expires_in)
    return {"model_id": model_id, "snapshot": version, "timestamp": ts["version"],
            "expires": ts["expires"], "records": len(signed["records"]), "key": fingerprint}


def _named_snapshot(store: Store, model_id: str) -> int:
    try:
        got = read_envelope(store, timestamp_key(model_id))
    except DocumentError:
        return 0
    snap = got[1]["signed"].get("snapshot") if got else None
    v = snap.get("version") if isinstance(snap, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def _newest(store: Store, model_id: str) -> int:
    best = 0
    for name, is_dir in store.list_dir(join(SNAPSHOTS, model_id)):
        head = name.split(".", 1)[0]
        if not is_dir and name.endswith(".snapshot.json") and head.isdigit() and len(head) < 12:
            best = max(best, int(head))
    return best


def refresh_timestamp(store: Store, model_id: str, key_path: str | os.PathLike[str], *,
                      expires_in: float = DEFAULT_EXPIRY) -> dict[str, Any]:
    """Re-sign the timestamp of ``model_id``'s current snapshot with a new
    expiry (the snapshot is unchanged; what a cron job runs).

    Raises:
        ObjectNotFoundError: the model has no snapshot (``registry snapshot sign``).
        DocumentError: the timestamp or the snapshot it names is garbled.
    """
    from registry.trust.keys import check_private_key

    fingerprint = check_private_key(key_path).fingerprint
    version = _named_snapshot(store, model_id)
    got = read_envelope(store, snapshot_key(model_id, version)) if version else None
    if got is None:
        raise ObjectNotFoundError(f"{store.url_of(timestamp_key(model_id))}: {model_id} has no "
                                  "signed snapshot to refresh (registry snapshot sign "
                                  f"{model_id} --sign-key KEY)", key=timestamp_key(model_id))
    ts = _timestamp(store, model_id, version, got[0], key_path, expires_in)
    return {"model_id": model_id, "snapshot": version, "timestamp": ts["version"],
            "expires": ts["expires"], "key": fingerprint}


def signed_models(store: Store) -> list[str]:
    """The models that have a signed timestamp (``ledger/snapshots/<m>/``)."""
    from registry.protocol.layout import model_ids

    return model_ids([n for n, d in store.list_dir(SNAPSHOTS)
                      if d and store.exists(join(SNAPSHOTS, n, "timestamp.json"))])


def resign(store: Store, model_ids: list[str] | None,
           key_path: str | os.PathLike[str] | None) -> list[dict[str, Any]]:
    """After a change of records: a new snapshot of each model of
    ``model_ids`` (None: every model that has one, as after a revocation),
    when ``key_path`` is given; else nothing. Returns what
    :func:`sign_snapshot` returned for each."""
    if key_path is None:
        return []
    models = signed_models(store) if model_ids is None else model_ids
    return [sign_snapshot(store, m, key_path) for m in models]


__all__ = ["DEFAULT_EXPIRY", "SPEC_VERSION", "read_envelope", "records", "refresh_timestamp",
           "resign", "sign_snapshot", "signed_models"]

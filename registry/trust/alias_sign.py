"""Signed alias moves and protected aliases (issue 32 item 6).

A move is signed with the same EC keys as releases (:mod:`registry.trust.keys`):
ECDSA with SHA-256 over :func:`registry.refs.alias_history.signed_bytes` (the
entry with ``signature`` null: model, alias, seq, old, new, the new
version's manifest digest, time, actor, prev), stored in the entry as
``{"key": <fingerprint>, "value": <base64 DER signature>}``.

A model's policy (``models/<m>/policy.json``) may name **protected aliases**::

    "protected_aliases": {"prod": ["<fingerprint>", ...]}

``registry alias set``/``rm`` of a protected alias refuses without
``--sign-key`` of a listed key. That check runs on the writer's machine, so
it stops mistakes, not a store writer: the protection a store writer cannot
remove is on the serving host. A host pulling with trusted keys
(:mod:`registry.trust`) resolves an alias only if its current move is signed
by a key it trusts and has not revoked -- and, when the policy lists keys for
that alias, by one of those -- whatever the store's policy says now (a
store writer can rewrite policy.json and the alias's history, but cannot
sign).
"""

from __future__ import annotations

import base64
import os
from typing import Any

from registry.refs.alias_history import AliasMove, read_head, signed_bytes
from registry.errors import DocumentError, SignatureError
from registry.trust.keys import check_private_key, sign_bytes
from registry.protocol.layout import alias_key, policy_key
from registry.rules.schemas import load_json
from registry.store import Store
from registry.trust import Trust


def sign_move(doc: dict[str, Any], key_path: str | os.PathLike[str]) -> dict[str, str]:
    """The signature of the move ``doc`` by the private key at ``key_path``.

    Raises:
        DocumentError, SigningUnavailableError: see :func:`registry.trust.keys.check_private_key`.
    """
    fingerprint, value = sign_bytes(key_path, signed_bytes(doc))
    return {"key": fingerprint, "value": base64.b64encode(value).decode()}


def key_fingerprint(key_path: str | os.PathLike[str]) -> str:
    """The fingerprint of a signing key's public half (checked like :func:`sign_move`)."""
    return check_private_key(key_path).fingerprint


def verify_move(move: AliasMove, trust: Trust, *, allowed: list[str] | None = None,
                where: str) -> str:
    """Check that ``move`` is signed by a key of ``trust`` (not revoked, and in
    ``allowed`` when given); returns the key's fingerprint.

    Raises:
        SignatureError: unsigned, signed by another key, by a revoked key, or
            the signature does not verify (the entry was changed after signing).
    """
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    what = f"move {move.seq} of {move.doc['model_id']}@{move.doc['alias']}"
    sig = move.doc.get("signature")
    if not sig:
        raise SignatureError(where, f"{what} is not signed; this host trusts only moves "
                                    f"signed by {trust.describe()}")
    fp = sig["key"]
    if fp in trust.revoked:
        raise SignatureError(where, f"{what} is signed by key {fp[:16]}, revoked on this "
                                    f"host ({trust.revoked[fp]})", fingerprint=fp)
    if allowed is not None and fp not in allowed:
        raise SignatureError(where, f"{what} is signed by key {fp[:16]}, which the model's "
                                    "policy does not list for this alias", fingerprint=fp)
    key = next((k for k in trust.keys if k.fingerprint == fp), None)
    if key is None:
        raise SignatureError(where, f"{what} is signed by key {fp[:16]}, which this host "
                                    f"does not trust (it trusts {trust.describe()})",
                             fingerprint=fp)
    try:
        public = serialization.load_pem_public_key(key.pem)
        assert isinstance(public, ec.EllipticCurvePublicKey)
        public.verify(base64.b64decode(sig["value"], validate=True), signed_bytes(move.doc),
                      ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError) as e:
        raise SignatureError(where, f"{what}: the signature of key {fp[:16]} does not verify "
                                    f"(the entry was changed after it was signed){_why(e)}",
                             fingerprint=fp) from None
    return str(fp)


def _why(e: Exception) -> str:
    return f": {e}" if str(e) else ""


def protected_keys(policy_doc: object, alias: str, *, where: str) -> list[str] | None:
    """The fingerprints a policy document lists for ``alias`` (None: not protected).

    Raises:
        DocumentError: ``protected_aliases`` is not an object of lists of fingerprints.
    """
    if not isinstance(policy_doc, dict) or "protected_aliases" not in policy_doc:
        return None
    table = policy_doc["protected_aliases"]
    if not isinstance(table, dict) or not all(
            isinstance(v, list) and v and all(isinstance(f, str) for f in v)
            for v in table.values()):
        raise DocumentError(where, "protected_aliases: expected {alias: [key fingerprint, ...]}")
    keys = table.get(alias)
    return list(keys) if keys is not None else None


def trusted_alias_version(store: Store, model_id: str, alias: str, trust: Trust) -> str:
    """The version ``alias`` designates, for a host that trusts ``trust``: only if
    its current move is signed by a trusted, unrevoked key (one the model's
    policy lists for the alias, when it lists any) and names the digest of the
    release's manifest as it is now.

    Raises:
        SignatureError: the move is unsigned (or the pointer predates
            histories), signed by another key, tampered with, or the release's
            manifest is not the one the move was signed for.
        NotCommittedError: no such alias (or it was removed).
        PointerError, DocumentError: the pointer or policy.json is garbled.
    """
    from registry.errors import NotCommittedError
    from registry.protocol.layout import release_prefix
    from registry.protocol.verify import read_manifest

    key = alias_key(model_id, alias)
    where = store.url_of(key)
    head = read_head(store, model_id, alias)
    if head.version is None:
        raise NotCommittedError(f"{where}: {model_id} has no alias {alias!r}", path=key)
    if head.move is None:
        raise SignatureError(where, f"alias {alias!r} of {model_id} was set before moves were "
                                    "signed; this host trusts only signed moves (move it again "
                                    "with --sign-key)")
    policy = policy_key(model_id)
    try:
        doc = load_json(store.read_bytes(policy), path=store.url_of(policy))
    except FileNotFoundError:
        doc = None
    verify_move(head.move, trust, allowed=protected_keys(doc, alias, where=store.url_of(policy)),
                where=where)
    digest = read_manifest(store, release_prefix(model_id, head.version)).digest
    if digest != head.move.doc["manifest_sha256"]:
        raise SignatureError(where, f"move {head.move.seq} of {model_id}@{alias} was signed for "
                                    f"manifest {head.move.doc['manifest_sha256'][:16]}, but "
                                    f"{model_id}@{head.version}'s is {digest[:16]}")
    return head.version

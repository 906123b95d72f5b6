"""Per-model gate policy: thresholds every release of a model must meet.

Stored in the store (the source of truth) as ``models/<model_id>/policy.json``::

    {"require": ["accuracy>=0.8", "toxicity/rate<=0.01"],
     "signed_by": [{"name": "release.pub", "fingerprint": "<sha256 hex>",
                    "public_key": "-----BEGIN PUBLIC KEY-----..."},
                   {"name": "ca.crt", "fingerprint": "<sha256 hex of DER>",
                    "subject": "CN=Release CA", "certificate": "-----BEGIN CERTIFICATE-----..."}]}

``signed_by`` (optional) lists the keys and CA certificates one of which must
have signed every release (a key directly, a CA through a signing
certificate it issued): the ``signature`` gate, :mod:`registry.release.signature_gate`.
``protected_aliases`` (optional, ``{"prod": ["<fingerprint>", ...]}``) names
aliases whose moves must be signed by one of the listed keys
(:mod:`registry.trust.alias_sign`); ``actor`` says who wrote the policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from registry.rules import limits
from registry.rules import numbers
from registry.rules import schemas
from registry.host.actor import current_actor
from registry.errors import DocumentError
from registry.gating.gates import Threshold
from registry.trust.keys import PublicKey, fingerprint_of
from registry.protocol.layout import policy_key
from registry.store import Store

if TYPE_CHECKING:
    from registry.trust.certs import Certificate


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
        doc = schemas.load_json(store.read_bytes(key, limit=limits.MAX_JSON_BYTES), path=store.url_of(key))
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


def signed_by(store: Store, model_id: str) -> list[PublicKey | Certificate]:
    """The public keys and CA certificates the model's policy requires a
    signature by ([] for none).

    Raises:
        DocumentError: ``signed_by`` is malformed or a fingerprint does not
            match its key or certificate.
    """
    key = policy_key(model_id)
    where = store.url_of(key)
    try:
        doc = schemas.load_json(store.read_bytes(key, limit=limits.MAX_JSON_BYTES), path=where)
    except FileNotFoundError:
        return []
    items = doc.get("signed_by", []) if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise DocumentError(where, "signed_by: expected a list of keys")
    keys: list[PublicKey | Certificate] = []
    for item in items:
        if isinstance(item, dict) and "certificate" in item:
            keys.append(_ca(item, where))
            continue
        try:
            pem = str(item["public_key"]).encode()
            k = PublicKey(str(item.get("name") or "policy key"), pem, fingerprint_of(pem))
        except (TypeError, KeyError):
            raise DocumentError(where, "signed_by: each key needs public_key (PEM)") from None
        if item.get("fingerprint") not in (None, k.fingerprint):
            raise DocumentError(where, f"signed_by: fingerprint {item.get('fingerprint')} does "
                                       f"not match its public key ({k.fingerprint})")
        keys.append(k)
    return keys


def _ca(item: dict[str, Any], where: str) -> Certificate:
    from cryptography import x509

    from registry.trust.certs import describe

    try:
        cert = describe(x509.load_pem_x509_certificate(str(item["certificate"]).encode()),
                        str(item.get("name") or "policy CA"))
    except ValueError as e:
        raise DocumentError(where, f"signed_by: a certificate does not parse ({e})") from None
    if item.get("fingerprint") not in (None, cert.fingerprint):
        raise DocumentError(where, f"signed_by: fingerprint {item.get('fingerprint')} does "
                                   f"not match its certificate ({cert.fingerprint})")
    return cert


def _entry(k: PublicKey | Certificate) -> dict[str, str]:
    if isinstance(k, PublicKey):
        return {"name": k.name, "fingerprint": k.fingerprint, "public_key": k.pem.decode()}
    return {"name": k.name, "fingerprint": k.fingerprint, "subject": k.subject,
            "certificate": k.pem.decode()}


def forbids_code(store: Store, model_id: str) -> bool:
    """The model's policy says ``"forbid_code": true``: its releases may carry
    no pickle and no remote code (:mod:`registry.release.code`).

    Raises:
        DocumentError: policy.json is malformed, or ``forbid_code`` is not a boolean.
    """
    key = policy_key(model_id)
    try:
        doc = schemas.load_json(store.read_bytes(key, limit=limits.MAX_JSON_BYTES), path=store.url_of(key))
    except FileNotFoundError:
        return False
    value = doc.get("forbid_code", False) if isinstance(doc, dict) else False
    if not isinstance(value, bool):
        raise DocumentError(store.url_of(key), "forbid_code: expected true or false")
    return value


def set_policy(store: Store, model_id: str, require: Iterable[str],
               signed_by: Iterable[PublicKey | Certificate] = (), *,
               forbid_code: bool = False,
               protected_aliases: dict[str, list[str]] | None = None) -> list[Threshold]:
    """Replace the model's policy (thresholds, signing keys and CA
    certificates, ``forbid_code``, protected aliases: alias -> key
    fingerprints that must sign its moves, :mod:`registry.trust.alias_sign`);
    returns the thresholds parsed. The document records who wrote it
    (``actor``, :mod:`registry.host.actor`).

    Raises:
        UsageError: a threshold does not parse (it is an argument, not a document).
    """
    parsed = [r if isinstance(r, Threshold) else Threshold.parse(str(r)) for r in require]
    doc: dict[str, object] = {"require": [str(t) for t in parsed]}
    keys = [_entry(k) for k in signed_by]
    if keys:
        doc["signed_by"] = keys
    if forbid_code:
        doc["forbid_code"] = True
    if protected_aliases:
        doc["protected_aliases"] = {a: list(fps) for a, fps in sorted(protected_aliases.items())}
    doc["actor"] = current_actor()
    store.write_bytes(policy_key(model_id), (numbers.dumps(doc, indent=2) + "\n").encode())
    return parsed

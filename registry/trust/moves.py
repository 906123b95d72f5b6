"""What an alias history may say of its moves' signatures: verified, or only claimed.

A move's ``signature.key`` is what the entry *claims*; a store writer can
write any fingerprint there. :func:`alias_log` is ``log_document`` with each
move's ``signature_state`` decided by the trust function's own check
(:func:`registry.trust.alias_sign.verify_move`): ``"verified"`` only against keys
this host trusts, ``"claims key X, not verified"`` without trust,
``"refused: why"`` when the check fails, ``"unsigned"``. No door shows
"signed by" for a signature nobody verified (issue 50).
"""

from __future__ import annotations

from typing import Any

from registry.refs.alias_history import AliasMove, encode, log_document
from registry.errors import RegistryError
from registry.protocol.layout import alias_key
from registry.store import Store
from registry.trust import Trust


def signature_state(move: dict[str, Any], trust: Trust | None, *, where: str) -> str:
    """One line on ``move``'s signature (a move document, ``entry`` ignored)."""
    doc = {k: v for k, v in move.items() if k not in ("entry", "signature_state")}
    sig = doc.get("signature")
    if not sig:
        return "unsigned"
    claimed = str(sig.get("key", ""))[:16] if isinstance(sig, dict) else "?"
    if trust is None:
        return f"claims key {claimed}, not verified (this process has no trusted keys)"
    from registry.trust.alias_sign import verify_move

    try:
        fp = verify_move(AliasMove(encode(doc), doc), trust, where=where)
    except (RegistryError, KeyError, TypeError, ValueError) as e:
        return f"refused: {getattr(e, 'reason', e)}"
    return f"verified: key {fp[:16]}"


def alias_log(store: Store, model_id: str, alias: str, *, at: str | None = None,
              trust: Trust | None = None) -> dict[str, Any]:
    """:func:`registry.refs.alias_history.log_document` with ``signature_state`` on
    every move (and on ``move`` with ``at``). Raises as ``log_document``."""
    doc = log_document(store, model_id, alias, at=at)
    where = store.url_of(alias_key(model_id, alias))
    for m in doc["moves"]:
        m["signature_state"] = signature_state(m, trust, where=where)
    if doc.get("move"):
        doc["move"]["signature_state"] = signature_state(doc["move"], trust, where=where)
    return doc


__all__ = ["alias_log", "signature_state"]

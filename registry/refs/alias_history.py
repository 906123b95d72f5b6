"""Alias history: every move of an alias, append-only, in the store (issue 32 item 4).

A move (``alias set``, ``alias rm``) is one JSON document, schemas/alias-entry.schema.json::

    {"schema_version": 1, "model_id": "m", "alias": "prod", "seq": 7,
     "old": "3", "new": "4", "manifest_sha256": "<sha256 of 4's MANIFEST.json>",
     "time": "2026-12-01T14:03:00.000000Z", "actor": {"user", "host", "key"},
     "prev": "00000006-<digest>.json", "signature": null}

**The pointer carries its entry, and history is the chain.** The alias
pointer ``models/<m>/refs/<alias>`` holds exactly the bytes of the current
move (``new`` is null after ``alias rm``: the pointer stays, as a removal).
A move is two writes:

1. the entry is written to ``ledger/aliases/<m>/<alias>/<seq:08d>-<digest>.json``
   by conditional create (``digest``: first 16 hex digits of its sha256), with
   ``prev`` naming the entry the pointer held when it was read;
2. the pointer is compare-and-swapped from those bytes to the entry's bytes.

A crash between them leaves an entry that no pointer names (an orphan, never
in the chain, listed by nothing); a lost race likewise. A crash cannot leave a
move without its history: the pointer *is* the newest entry, and every entry
it reaches through ``prev`` was created before the pointer named it. History
is read by walking ``prev`` from the pointer; each link is checked (its
digest, its ``seq`` one below, its model and alias), and a broken link ends
the walk with a note, never a silent gap.

A pointer written before histories (``"<version>\\n"``) reads as a move with
no entry; the first move after it records it as ``old`` with ``prev`` null.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from registry.rules import limits
from registry.errors import DocumentError, InvalidNameError, ObjectNotFoundError, PointerError
from registry.protocol.layout import ALIAS_SEQ_DIGITS, alias_entry_key, alias_key, refs_prefix
from registry.rules.names import check_name
from registry.protocol.pointer import parse_pointer
from registry.rules.schemas import load_json, validate
from registry.store import Store

#: version of an alias entry's shape (schemas/alias-entry.schema.json).
ENTRY_SCHEMA = 1
#: links walked at most by one history read (a store writer cannot make it loop).
MAX_CHAIN = 100_000


def encode(doc: dict[str, Any]) -> bytes:
    """The stored bytes of an entry: canonical JSON (sorted keys, no spaces) and a newline."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def signed_bytes(doc: dict[str, Any]) -> bytes:
    """What a move's signature covers: the entry's bytes with ``signature`` null
    (so the model, alias, seq, old, new, manifest digest, time, actor and prev)."""
    return encode({**doc, "signature": None})


def entry_name(raw: bytes, seq: int) -> str:
    """The file name of the entry whose bytes are ``raw``: ``<seq:08d>-<digest16>.json``."""
    return f"{seq:0{ALIAS_SEQ_DIGITS}d}-{hashlib.sha256(raw).hexdigest()[:16]}.json"


@dataclass(frozen=True, slots=True)
class AliasMove:
    """One move as stored; ``raw`` its exact bytes, ``doc`` the parsed document."""

    raw: bytes
    doc: dict[str, Any] = field(hash=False)

    @property
    def seq(self) -> int:
        return int(self.doc["seq"])

    @property
    def new(self) -> str | None:
        return self.doc["new"]

    @property
    def old(self) -> str | None:
        return self.doc["old"]

    @property
    def time(self) -> str:
        return str(self.doc["time"])

    @property
    def name(self) -> str:
        """Its entry's file name in ``ledger/aliases/<m>/<alias>/``."""
        return entry_name(self.raw, self.seq)

    def to_dict(self) -> dict[str, Any]:
        """The document, plus ``entry`` (its file name), for listings and JSON output."""
        return {**self.doc, "entry": self.name}


@dataclass(frozen=True, slots=True)
class AliasHead:
    """What an alias pointer holds now.

    Attributes:
        version: the version it designates; None when absent or removed.
        move: the move it carries; None for a pointer written before
            histories (or no pointer).
        raw, token: its bytes and version token for a compare-and-swap
            (None, None: no pointer).
    """

    version: str | None
    move: AliasMove | None
    raw: bytes | None
    token: str | None

    @property
    def seq(self) -> int:
        return self.move.seq if self.move else 0


def parse_move(raw: bytes, *, where: str, model_id: str, alias: str) -> AliasMove:
    """An entry from its bytes, checked against the alias it is read for.

    Raises:
        DocumentError: not JSON, breaking the schema, or an entry of another
            model or alias (a copied object).
    """
    doc = load_json(raw, path=where)
    validate(doc, "alias-entry", path=where)
    if doc["model_id"] != model_id or doc["alias"] != alias:
        raise DocumentError(where, f"an entry of {doc['model_id']}@{doc['alias']}, not of "
                                   f"{model_id}@{alias}")
    return AliasMove(raw, doc)


def read_head(store: Store, model_id: str, alias: str) -> AliasHead:
    """The alias pointer now, in either format.

    Raises:
        PointerError: the pointer is garbled (neither an entry nor a version line).
    """
    key = alias_key(model_id, alias)
    where = store.url_of(key)
    try:
        if store.info(key).size > limits.MAX_POINTER_BYTES:
            raise PointerError(where, f"larger than {limits.MAX_POINTER_BYTES} bytes "
                                      "(registry.rules.limits)")
        raw, token = store.read_versioned(key)
    except ObjectNotFoundError:
        return AliasHead(None, None, None, None)
    if raw.lstrip()[:1] == b"{":
        try:
            move = parse_move(raw, where=where, model_id=model_id, alias=alias)
        except DocumentError as e:
            raise PointerError(where, f"garbled alias entry ({getattr(e, 'rule', e)})") from None
        if move.new is not None:  # the schema's pattern is not every rule of a name
            try:
                check_name(move.new, "version")
            except InvalidNameError as e:
                raise PointerError(where, f"garbled alias entry ({e})") from None
        return AliasHead(move.new, move, raw, token)
    value = parse_pointer(raw, path=where)
    try:
        check_name(value, "version")
    except InvalidNameError as e:
        raise PointerError(where, str(e)) from None
    return AliasHead(value, None, raw, token)


def read_entry(store: Store, model_id: str, alias: str, name: str) -> AliasMove:
    """The entry ``name`` of the alias's history, its digest checked.

    Raises:
        ObjectNotFoundError: no such entry.
        DocumentError: damaged, or its bytes do not match the digest in its name.
    """
    seq, _, rest = name.partition("-")
    key = alias_entry_key(model_id, alias, int(seq), rest.removesuffix(".json"))
    raw = store.read_bytes(key, limit=limits.MAX_POINTER_BYTES)
    where = store.url_of(key)
    move = parse_move(raw, where=where, model_id=model_id, alias=alias)
    if move.name != name:
        raise DocumentError(where, "its bytes do not match the digest in its name")
    return move


def walk(store: Store, model_id: str, alias: str, *,
         broken: list[str] | None = None) -> Iterator[AliasMove]:
    """The alias's moves, newest first: the pointer's, then ``prev`` to ``prev``.

    Args:
        broken: where a broken link is noted (one message) before the walk
            stops; None: raise instead.

    Raises:
        PointerError: the pointer is garbled.
        DocumentError, ObjectNotFoundError: a link is broken and ``broken`` is None.
    """
    head = read_head(store, model_id, alias)
    move = head.move
    for _ in range(MAX_CHAIN):
        if move is None:
            return
        yield move
        prev = move.doc["prev"]
        if prev is None:
            return
        try:
            older = read_entry(store, model_id, alias, prev)
            if older.seq != move.seq - 1:
                raise DocumentError(store.url_of(alias_entry_key(
                    model_id, alias, older.seq, prev[9:25])), f"seq {older.seq}, but the "
                    f"move after it is {move.seq}")
        except (DocumentError, ObjectNotFoundError, ValueError) as e:
            if broken is None:
                raise
            broken.append(f"history of {model_id}@{alias} broken below move {move.seq}: {e}")
            return
        move = older


def history_aliases(store: Store, model_id: str) -> list[str]:
    """The aliases of ``model_id`` with a pointer (live or removed), sorted.

    Raises:
        StorageError: the store could not be listed.
    """
    out = []
    for name, is_dir in store.list_dir(refs_prefix(model_id)):
        if is_dir or name.endswith((".lock", ".break")) or ".tmp" in name:
            continue
        try:
            out.append(check_name(name, "alias"))
        except InvalidNameError:
            continue
    return out


def version_at(moves: list[AliasMove], when: str) -> tuple[str | None, AliasMove | None]:
    """What the alias designated at ``when`` (RFC 3339 UTC, compared as text
    in the ``utc_now`` format) given its moves newest first, and the move
    that put it there; ``(None, None)`` before its first recorded move (what a
    pointer written before histories held, and since when, is not known)."""
    for move in moves:
        if move.time <= when:
            return move.new, move
    return None, None


def log_document(store: Store, model_id: str, alias: str, *, at: str | None = None
                 ) -> dict[str, Any]:
    """``registry alias log --json`` (and the web's): ``{"model_id", "alias",
    "moves": [entry + "entry", ...] newest first, "broken": [note, ...]}``, plus
    ``"at", "version", "move"`` when ``at`` (a time in the registry's format) is
    given. Raises PointerError for a garbled pointer."""
    broken: list[str] = []
    moves = list(walk(store, model_id, alias, broken=broken))
    doc: dict[str, Any] = {"model_id": model_id, "alias": alias,
                           "moves": [m.to_dict() for m in moves], "broken": broken}
    if at is not None:
        version, move = version_at(moves, at)
        doc.update(at=at, version=version, move=move.to_dict() if move else None)
    return doc

"""Aliases: mutable names for immutable releases (``models/<model_id>/refs/<alias>``).

An alias is a pointer holding a version and a newline. It is moved with
compare-and-swap against the value read just before, so two concurrent
``alias set`` calls never silently clobber each other: one gets
PointerConflictError. ``<model_id>@<alias>`` is accepted wherever
``<model_id>@<version>`` is.

Versions and aliases never share a name, so ``<model_id>@<name>`` means one
thing (MLflow reserves version-shaped alias names the same way):

* an alias name must not look like a version: it must not start with a digit,
  nor with ``v``/``V`` followed by a digit (``2``, ``1.0``, ``v3`` are refused;
  ``prod``, ``staging``, ``champion`` are fine): InvalidNameError;
* an alias cannot take the name of an existing version of its model, and a
  version cannot be published under the name of an existing alias:
  NameTakenError;
* an alias made before this rule that shares a version's name makes
  ``<model_id>@<name>`` ambiguous: refused (AmbiguousRefError), never
  silently resolved.
"""

from __future__ import annotations

import re

import os
import time
from typing import Any

from registry.host.actor import current_actor
from registry.refs.alias_history import ENTRY_SCHEMA, AliasHead, AliasMove, encode, read_head
from registry.trust.alias_sign import key_fingerprint, protected_keys, sign_move
from registry.errors import (
    AmbiguousRefError,
    InvalidNameError,
    NameTakenError,
    NotCommittedError,
    ObjectNotFoundError,
    PointerError,
    RegistryError,
    SignatureError,
    UnsafeEntryError,
)
from registry.events import (
    MODEL_VERSION_ALIAS_CREATED,
    MODEL_VERSION_ALIAS_DELETED,
    append_event,
)
from registry.protocol.layout import MODELS, TMP_MARK, alias_entry_key, alias_key, model_ids, \
    model_root, policy_key, refs_prefix, release_prefix
from registry.lifecycle.tombstone import is_deleted, refuse_deleted
from registry.protocol.manifest import MANIFEST, utc_now
from registry.rules.names import check_model_id, check_name
from registry.rules.schemas import load_json
from registry.store import Store, join
from registry.protocol.verify import is_committed, read_manifest


#: names that look like versions, reserved for versions: a digit first, or v + digit.
VERSION_SHAPED = re.compile(r"[vV]?[0-9]")


def check_alias_name(store: Store, model_id: str, alias: str) -> str:
    """Return ``alias`` if it may name a new alias of ``model_id``.

    Raises:
        InvalidNameError: a bad name, or one shaped like a version.
        NameTakenError: ``model_id`` has a version of that name.
    """
    check_name(alias, "alias")
    if VERSION_SHAPED.match(alias):
        raise InvalidNameError(
            f"alias {alias!r}: looks like a version (starts with a digit, or v and a "
            "digit); such names are reserved for versions: pick one like 'prod'", name=alias)
    if store.exists(join(release_prefix(model_id, alias), MANIFEST)):
        raise NameTakenError(f"{store.url_of(release_prefix(model_id, alias))}: a version "
                             f"named {alias!r} exists; an alias cannot take its name",
                             path=release_prefix(model_id, alias))
    if is_deleted(store, model_id, alias):
        raise NameTakenError(f"{store.url_of(release_prefix(model_id, alias))}: a deleted "
                             f"version was named {alias!r}; its name is never reused, not "
                             "even by an alias", path=release_prefix(model_id, alias))
    return alias


def check_version_name(store: Store, model_id: str, version: str) -> str:
    """Return ``version`` if no alias of ``model_id`` has that name.

    Raises:
        InvalidNameError: a bad name.
        NameTakenError: an alias of that name exists.
    """
    check_name(version, "version")
    key = alias_key(model_id, version)
    if store.exists(key):
        raise NameTakenError(f"{store.url_of(key)}: an alias named {version!r} exists; a "
                             "version cannot take its name (versions and aliases never "
                             "share one)", path=key)
    return version


def parse_ref(ref: str) -> tuple[str, str | None]:
    """Split ``model_id@version_or_alias``; the part after ``@`` may be absent;
    ``model_id`` is a name or ``<org>/<name>`` (:func:`registry.rules.names.check_model_id`).

    Raises:
        InvalidNameError: a part breaks the naming rule.
    """
    model_id, sep, rest = ref.partition("@")
    check_model_id(model_id)
    if sep and not rest:
        raise InvalidNameError(f"{ref!r}: nothing after '@'", name=ref)
    return model_id, (check_name(rest, "version or alias") if sep else None)


def resolve(store: Store, model_id: str, name: str, *, is_version: bool | None = None) -> str:
    """The version ``name`` designates: itself if such a version directory exists,
    else the version its alias points to; ``is_version``: whether its
    ``MANIFEST.json`` exists, as the caller just asked the store (not asked again).

    Raises:
        NotCommittedError: neither a version nor an alias of that name exists.
        AmbiguousRefError: both exist (an alias made before the naming rule).
        PointerError: the alias file is garbled.
    """
    key = alias_key(model_id, name)
    if is_version is None:
        is_version = store.exists(join(release_prefix(model_id, name), MANIFEST))
    if is_version:
        if store.exists(key):
            raise AmbiguousRefError(
                f"{model_id}@{name}: both a version and an alias are named {name!r} (the "
                f"alias predates the rule that they never share a name); remove "
                f"{store.url_of(key)} or use another alias", name=f"{model_id}@{name}")
        return name
    target = read_head(store, model_id, name).version
    if target is None:
        refuse_deleted(store, model_id, name)
        raise unknown_ref(store, model_id, name)
    return target


def unknown_ref(store: Store, model_id: str, name: str, *,
                kind: str = "ref") -> NotCommittedError:
    """The error for ``model_id@name`` that names no committed version nor
    alias, in the user's words (registry.rules.suggest): the model itself is unknown;
    or ``name`` is an incomplete version (a publish that never finished); or it
    is not one of the model's versions (``kind="version"``), aliases
    (``"alias"``) or either (``"ref"``), with the close matches and what exists.
    Listing errors only make the message shorter."""
    from registry.rules import suggest

    root = model_root(model_id)
    try:
        listed = [n for n in store.subdirs(root)
                  if n != "refs" and TMP_MARK not in n and not n.startswith(".")]
        aliases = [n for n, is_dir in store.list_dir(refs_prefix(model_id)) if not is_dir]
    except (RegistryError, OSError):
        listed, aliases = [], []
    if not listed and not aliases:
        try:
            models = model_ids(store.subdirs(MODELS))
        except (RegistryError, OSError):
            models = []
        return NotCommittedError(suggest.unknown_model(store.url, model_id, models), path=root)
    prefix = release_prefix(model_id, name)
    if name in listed and kind != "alias":
        return NotCommittedError(suggest.incomplete_version(store.url, model_id, name),
                                 path=prefix)
    versions = listed
    if len(listed) <= 4 * suggest.LISTED:  # only committed ones (a few HEADs, on an error path)
        try:
            versions = [v for v in listed
                        if store.exists(join(release_prefix(model_id, v), MANIFEST))]
        except (RegistryError, OSError):
            pass
    return NotCommittedError(suggest.unknown_name(store.url, model_id, name, versions, aliases,
                                                  kind=kind), path=prefix)


def _protection(store: Store, model_id: str, alias: str) -> list[str] | None:
    """The key fingerprints the model's policy lists for ``alias`` (None: unprotected)."""
    key = policy_key(model_id)
    try:
        raw = store.read_bytes(key)
    except ObjectNotFoundError:
        return None
    return protected_keys(load_json(raw, path=store.url_of(key)), alias,
                          where=store.url_of(key))


def move_alias(store: Store, model_id: str, alias: str, version: str | None, *,
               sign_key: str | os.PathLike[str] | None = None,
               actor: dict[str, Any] | None = None) -> tuple[AliasHead, AliasMove | None]:
    """Move ``alias`` to ``version`` (None: remove it), recording the move in its
    history (:mod:`registry.refs.alias_history`); returns the head it replaced and
    the move made (None when the alias already held ``version``).

    Args:
        sign_key: private key that signs the move (needed for a protected alias).
        actor: who moves it (default: :func:`registry.host.actor.current_actor`
            with the signing key's fingerprint).

    Raises:
        NotCommittedError: ``version`` is not a committed release, or there is
            no alias to remove.
        PointerConflictError: another writer moved the alias meanwhile.
        SignatureError: the policy protects the alias and ``sign_key`` is
            missing or not one of the keys it lists.
        DocumentError, SigningUnavailableError: policy.json or the key is unusable.

    Notes:
        Entry first (conditional create), then the pointer's compare-and-swap
        to the same bytes: a crash or a lost race leaves at most an entry no
        pointer names, never a move without history.
    """
    key = alias_key(model_id, alias)
    manifest_sha256 = None
    if version is not None:
        check_name(version, "version")
        prefix = release_prefix(model_id, version)
        if not is_committed(store, prefix):
            raise NotCommittedError(f"{store.url_of(prefix)}: no such committed release",
                                    path=prefix)
        manifest_sha256 = read_manifest(store, prefix).digest
    damaged = False
    try:
        head = read_head(store, model_id, alias)
    except PointerError:
        # garbled (or oversized): replaced, or removed, by the move; the
        # compare-and-swap still holds. Its version token costs one read,
        # bounded by MAX_READ_BYTES: an operator's mend, not every reader's.
        raw, token = store.read_versioned(key)
        head = AliasHead(None, None, raw, token)
        damaged = True
    if version is None and head.version is None and not damaged:
        raise unknown_ref(store, model_id, alias, kind="alias")
    if head.version == version and not damaged:
        return head, None
    allowed = _protection(store, model_id, alias)
    fingerprint = key_fingerprint(sign_key) if sign_key is not None else None
    if allowed is not None and fingerprint not in allowed:
        raise SignatureError(store.url_of(key), f"alias {alias!r} of {model_id} is protected "
                             "by its policy: sign the move with --sign-key of one of "
                             f"{', '.join(f[:16] for f in allowed)}", fingerprint=fingerprint)
    doc: dict[str, Any] = {
        "schema_version": ENTRY_SCHEMA, "model_id": model_id, "alias": alias,
        "seq": head.seq + 1, "old": head.version, "new": version,
        "manifest_sha256": manifest_sha256, "time": utc_now(),
        "actor": actor if actor is not None else current_actor(fingerprint),
        "prev": head.move.name if head.move else None, "signature": None}
    if sign_key is not None:
        doc["signature"] = sign_move(doc, sign_key)
    raw = encode(doc)
    move = AliasMove(raw, doc)
    entry = alias_entry_key(model_id, alias, move.seq, move.name[9:25])
    store.create(entry, raw)
    store.swap(key, raw, head.token)
    return head, move


def set_alias(store: Store, model_id: str, alias: str, version: str, *,
              sign_key: str | os.PathLike[str] | None = None) -> str | None:
    """Point ``alias`` at ``version`` (compare-and-swap, recorded in its history,
    and an event ``model_version_alias.created``); returns the previous version.

    The caller checks the gates first (``registry alias set`` refuses a failing
    version unless ``--force``).

    Raises:
        NotCommittedError: ``version`` is not a committed release.
        PointerConflictError: another writer moved the alias meanwhile.
        InvalidNameError: a bad model id, alias or version, or an alias
            shaped like a version.
        NameTakenError: a version of the model has the alias's name (or had:
            a deleted version's name is never reused).
        ReleaseDeletedError: ``version`` was deleted (or is being deleted:
            a move that raced a delete is undone, the undo recorded too).
        SignatureError: the alias is protected and the move is not signed by
            a key its policy lists (:func:`move_alias`).
        EventNotRecordedError: the move stands, its event was not appended.
    """
    check_alias_name(store, model_id, alias)
    check_name(version, "version")
    refuse_deleted(store, model_id, version)  # deleted, or a delete in progress
    head, move = move_alias(store, model_id, alias, version, sign_key=sign_key)
    undo = undo_if_deleted(store, model_id, alias, version, head, move, sign_key=sign_key)
    if move is not None:
        alias_event(store, move)
    if undo is not None:
        alias_event(store, undo)
        refuse_deleted(store, model_id, version)
    return head.version


#: seconds an alias move that met a delete's tombstone waits for the delete
#: to back off (its tombstone removed) or go on (the manifest removed).
DELETE_SETTLE_S = 5.0


def undo_if_deleted(store: Store, model_id: str, alias: str, version: str, head: AliasHead,
                    move: AliasMove | None, *,
                    sign_key: str | os.PathLike[str] | None = None) -> AliasMove | None:
    """After ``move`` pointed ``alias`` at ``version``: if a delete of
    ``version`` made its tombstone meanwhile (after the caller's check, before
    the move) and then goes on to remove the release, move the alias back to
    what ``head`` held (a move of its own in the history) and return that
    undo; if the delete backs off instead (it saw this move), keep the move
    and return None. Waits up to DELETE_SETTLE_S seconds for the delete to
    settle (a deleter that died after its tombstone: undone after it). With
    :mod:`registry.lifecycle.delete`, which looks at the aliases after its
    tombstone, no alias is left pointing at a deleted release."""
    if move is None or not is_deleted(store, model_id, version):
        return None
    # The delete looks at the aliases after its tombstone. It saw this move
    # (it removes its tombstone and refuses: the move stands) or it did not
    # (it removes the release, MANIFEST.json first: undo). Wait for which,
    # so that exactly one of the two wins; a deleter that died between its
    # tombstone and its look settles nothing, and after DELETE_SETTLE_S the
    # move is undone.
    manifest = join(release_prefix(model_id, version), MANIFEST)
    deadline = time.monotonic() + DELETE_SETTLE_S
    while time.monotonic() < deadline and store.exists(manifest):
        if not is_deleted(store, model_id, version):
            return None  # the delete backed off: the move stands
        time.sleep(0.02)
    return move_alias(store, model_id, alias, head.version, sign_key=sign_key)[1]


def remove_alias(store: Store, model_id: str, alias: str, *,
                 sign_key: str | os.PathLike[str] | None = None) -> str | None:
    """Remove ``alias`` (its pointer becomes a removal: the history goes on, and
    the name stays reserved against versions); returns the version it held
    (None: its pointer was damaged, unreadable: the removal replaces it).

    Raises:
        NotCommittedError: the model has no such alias.
        PointerConflictError, SignatureError, EventNotRecordedError: as
            :func:`set_alias`.
    """
    check_name(alias, "alias")
    head, move = move_alias(store, model_id, alias, None, sign_key=sign_key)
    if move is not None:
        alias_event(store, move)
    return head.version


def alias_event(store: Store, move: AliasMove, *, repaired: bool = False) -> str:
    """Append the event of ``move`` (``model_version_alias.created`` or
    ``.deleted``); returns its id. Raises EventNotRecordedError."""
    doc = move.doc
    name = MODEL_VERSION_ALIAS_CREATED if move.new is not None else MODEL_VERSION_ALIAS_DELETED
    return append_event(store, name, model_id=doc["model_id"], version=move.new or move.old,
                        data={"alias": doc["alias"], "previous": move.old, "seq": move.seq,
                              "entry": move.name, **({"repaired": True} if repaired else {})},
                        actor=doc["actor"])


def list_aliases(store: Store, model_id: str, *,
                 damaged: dict[str, str] | None = None) -> dict[str, str]:
    """alias -> version for every alias of the model.

    A garbled pointer (neither an alias entry nor a version line, or naming
    no valid version), a folder where a pointer goes, or a link or special
    file there (local disk: skipped by the listing, named in
    ``store.skipped``) is not an alias this can list: it is left out, and
    noted in ``damaged`` (alias -> one line naming the pointer and the rule)
    when given. A caller that decides by aliases (delete, retention) must
    not treat a damaged alias as absent: it may have pointed anywhere.
    Names that are not alias names (a stray file in ``refs/``) are skipped.

    Raises:
        StorageError: the store failed.
    """
    out = {}
    prefix = refs_prefix(model_id)
    entries = store.list_dir(prefix)
    if damaged is not None:  # skipped by a listing and not listed now (it may since be mended)
        listed = {name for name, _ in entries}
        damaged.update({a: why for a, why in _unlisted(store, prefix).items() if a not in listed})
    for name, is_dir in entries:
        if name.endswith((".lock", ".break", ".tmp")) or ".tmp-" in name:
            continue
        try:
            check_name(name, "alias")
        except InvalidNameError:
            continue
        if is_dir:
            if damaged is not None:
                where = store.url_of(join(prefix, name))
                damaged[name] = f"{where}: a folder, not an alias pointer"
            continue
        try:
            value = read_head(store, model_id, name).version
        except PointerError as e:
            if damaged is not None:
                damaged[name] = str(e)
            continue
        if value is not None:
            out[name] = value
    return out


def _unlisted(store: Store, prefix: str) -> dict[str, str]:
    """alias -> why, for the links and special files the store's listings
    skipped in ``prefix`` (:attr:`registry.store.base.Store.skipped`) that are
    still there (a long-lived store keeps what it skipped once)."""
    pattern = re.compile(re.escape(prefix) + r"/([A-Za-z0-9][A-Za-z0-9._-]*)(?![A-Za-z0-9._/-])")
    out = {}
    for why in store.skipped:
        for m in pattern.finditer(why):
            try:
                name = check_name(m.group(1), "alias")
                store.info(join(prefix, name))
                continue  # a plain object now: listed and read as one
            except (InvalidNameError, ObjectNotFoundError):
                continue  # not an alias name, or gone since
            except UnsafeEntryError:
                out[name] = why  # still a link or special file
    return out


def damaged_alias_note(model_id: str, damaged: dict[str, str]) -> str:
    """One line for aliases of ``model_id`` whose pointers cannot be read
    (``damaged`` from :func:`list_aliases`), and how to mend them."""
    names = ", ".join(sorted(damaged))
    first = damaged[min(damaged)]
    return (f"alias{'es' if len(damaged) > 1 else ''} {names} of {model_id} cannot be read "
            f"({first}); point {'them' if len(damaged) > 1 else 'it'} at a release again "
            "(`registry alias set`)")

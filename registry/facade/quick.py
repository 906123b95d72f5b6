"""``registry ls`` and ``registry show`` answered without SQLAlchemy, numpy or
the rest of :class:`registry.api.Registry` (issue 44 item 6): a command line
call pays for what it reads, not for the whole facade.

Each function answers what :meth:`registry.api.Registry.ls` /
:meth:`~registry.api.Registry.show` answer (the same rows and documents, so
every output stays byte-identical), in the common case only: a SQLite index
at the current schema read with ``sqlite3`` (:mod:`registry.index.lite`), and
no gate the store must decide (a policy listing signing keys or forbidding
code, a signed release). Anything else returns None and the caller asks the
Registry, which says it as it always has, errors included (an unknown model,
a release not in the index, an empty index: None here, worded there).
Postgres indexes always take the Registry (SQLAlchemy) path.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from registry.errors import RegistryError
from registry.index.lite import LiteIndex, open_lite
from registry.store import Store, open_store

#: the signature file of a release (registry.trust.model_sig.SIGNATURE, whose
#: module loads the signing code)
SIGNATURE = "model.sig"
#: a committed directory's manifest (registry.protocol.manifest.MANIFEST, whose
#: module loads the hashing code)
MANIFEST = "MANIFEST.json"


def _store_gated(store: Store, model_id: str) -> bool | None:
    """The model's policy has a gate only the store can decide (True), none
    (False), or cannot be read or is anything but plain (None: the Registry
    reads it with registry.release.policy, and quarantines or raises).

    No ``policy.json``, or one whose ``signed_by`` is absent or ``[]`` and
    whose ``forbid_code`` is absent or false, is False: what
    ``signed_by``/``forbids_code`` say of it, without loading the signing code
    they check keys with."""
    from registry.protocol.layout import policy_key
    from registry.rules import limits, schemas

    key = policy_key(model_id)
    try:
        raw = store.read_bytes(key, limit=limits.MAX_JSON_BYTES)
    except FileNotFoundError:
        return False
    except RegistryError:
        return None
    try:
        doc = schemas.load_json(raw, path=store.url_of(key))
    except RegistryError:
        return None
    if not isinstance(doc, dict):
        return None
    plain = doc.get("signed_by", []) == [] and doc.get("forbid_code", False) is False
    return False if plain else True


def ls(store_url: str | Store | None, db: str | None,
       model_id: str | None = None) -> list[dict[str, Any]] | None:
    """:meth:`registry.api.Registry.ls`, or None (see the module docstring)."""
    from registry.rules.names import check_model_id, check_name

    try:
        if model_id is not None:
            (check_name(model_id[:-1]) if model_id.endswith("/") else check_model_id(model_id))
    except RegistryError:
        return None
    lite = open_lite(db)
    if lite is None:
        return None
    try:
        return _ls(lite, store_url, model_id)
    except sqlite3.Error:  # locked past the timeout, damaged: the Registry words it
        return None
    finally:
        lite.close()


def _ls(lite: LiteIndex, store_url: str | Store | None,
        model_id: str | None) -> list[dict[str, Any]] | None:
    org = model_id[:-1] if model_id is not None and model_id.endswith("/") else None
    rows = lite.ls(None if org is not None else model_id)
    if not rows:
        return None
    store = store_url if isinstance(store_url, Store) else open_store(store_url)
    if model_id is None or org is not None:
        if org is not None:
            rows = [r for r in rows if r["model_id"].startswith(f"{org}/")]
        for r in rows:
            if r["newest_passing"] is not None and _store_gated(store, r["model_id"]) is not False:
                return None
        return rows or None
    return None if _store_gated(store, model_id) is not False else rows


def _version(store: Store, ref: str) -> str | None:
    """The version ``ref`` (``MODEL_ID@VERSION``) names when it is a committed
    version and no alias shares its name (what
    :func:`registry.refs.aliases.resolve` answers then); None for anything else
    (an alias, a bad or unknown ref: the Registry resolves or refuses it)."""
    from registry.protocol.layout import alias_key, release_prefix
    from registry.rules.names import check_model_id, check_name
    from registry.store import join

    model_id, sep, name = ref.partition("@")
    try:
        check_model_id(model_id)
        if not sep:
            return None
        check_name(name, "version or alias")
        manifest, alias = join(release_prefix(model_id, name), MANIFEST), alias_key(model_id, name)
        return name if store.exists(manifest) and not store.exists(alias) else None
    except RegistryError:
        return None


def show(store_url: str | Store | None, db: str | None, ref: str) -> dict[str, Any] | None:
    """:meth:`registry.api.Registry.resolve` then
    :meth:`~registry.api.Registry.show` of ``ref``, or None (see the module
    docstring). Raises what ``resolve`` raises, as the Registry would first."""
    store = store_url if isinstance(store_url, Store) else open_store(store_url)
    version = _version(store, ref)
    if version is None:
        return None
    model_id = ref.partition("@")[0]
    lite = open_lite(db)
    if lite is None:
        return None
    try:
        doc = lite.show(model_id, version)
    except sqlite3.Error:
        return None
    finally:
        lite.close()
    if doc is None:
        return None
    files = {f["path"]: f["sha256"] for f in doc["manifest"]}
    if SIGNATURE in files or _store_gated(store, model_id) is not False:
        return None
    from registry.formats.modeldir import other_weights
    from registry.protocol.layout import release_prefix
    from registry.release.code import code_files
    from registry.release.weights_summary import stored_summary
    from registry.rules import limits
    from registry.store import join

    doc["signature"] = None
    prefix = release_prefix(model_id, version)
    doc["code"] = code_files(
        files, lambda n: store.read_bytes(join(prefix, n), limit=limits.MAX_JSON_BYTES))
    doc["other_weights"] = other_weights(files)
    summary = stored_summary(store, model_id, version,
                             files={f["path"]: f["bytes"] for f in doc["manifest"]})
    doc["weights"], doc["weight_files"] = summary["groups"], summary["files"]
    doc["parameters"] = summary["parameters"]
    doc["config_dtype"] = summary["config_dtype"]
    return doc


__all__ = ["ls", "show"]

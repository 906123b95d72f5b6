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

from registry import limits
from registry.errors import (
    AmbiguousRefError,
    InvalidNameError,
    NameTakenError,
    NotCommittedError,
    PointerError,
)
from registry.layout import alias_key, model_root, refs_prefix, release_prefix
from registry.manifest import MANIFEST
from registry.names import check_name
from registry.pointer import move_pointer, read_pointer
from registry.store import Store, join
from registry.verify import is_committed


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
    """Split ``model_id@version_or_alias``; the part after ``@`` may be absent.

    Raises:
        InvalidNameError: a part breaks the naming rule.
    """
    model_id, sep, rest = ref.partition("@")
    check_name(model_id, "model_id")
    if sep and not rest:
        raise InvalidNameError(f"{ref!r}: nothing after '@'", name=ref)
    return model_id, (check_name(rest, "version or alias") if sep else None)


def resolve(store: Store, model_id: str, name: str) -> str:
    """The version ``name`` designates: itself if such a version directory exists,
    else the version its alias points to.

    Raises:
        NotCommittedError: neither a version nor an alias of that name exists.
        AmbiguousRefError: both exist (an alias made before the naming rule).
        PointerError: the alias file is garbled.
    """
    key = alias_key(model_id, name)
    if store.exists(join(release_prefix(model_id, name), MANIFEST)):
        if store.exists(key):
            raise AmbiguousRefError(
                f"{model_id}@{name}: both a version and an alias are named {name!r} (the "
                f"alias predates the rule that they never share a name); remove "
                f"{store.url_of(key)} or use another alias", name=f"{model_id}@{name}")
        return name
    target = read_pointer(store, key)
    if target is None:
        raise NotCommittedError(f"{store.url_of(model_root(model_id))}: no version or "
                                f"alias named {name!r}", path=release_prefix(model_id, name))
    try:
        return check_name(target, "version")
    except InvalidNameError as e:
        raise PointerError(store.url_of(key), str(e)) from None


def set_alias(store: Store, model_id: str, alias: str, version: str) -> str | None:
    """Point ``alias`` at ``version`` (compare-and-swap); returns the previous version.

    The caller checks the gates first (``registry alias set`` refuses a failing
    version unless ``--force``).

    Raises:
        NotCommittedError: ``version`` is not a committed release.
        PointerConflictError: another writer moved the alias meanwhile.
        InvalidNameError: a bad model id, alias or version, or an alias
            shaped like a version.
        NameTakenError: a version of the model has the alias's name.
    """
    key = alias_key(model_id, alias)
    check_alias_name(store, model_id, alias)
    check_name(version, "version")
    if not is_committed(store, release_prefix(model_id, version)):
        raise NotCommittedError(f"{store.url_of(release_prefix(model_id, version))}: "
                                "no such committed release", path=release_prefix(model_id, version))
    try:
        current = read_pointer(store, key)
    except PointerError:
        current = store.read_bytes(key, limit=limits.MAX_POINTER_BYTES).decode("utf-8", "replace").strip() or None
    move_pointer(store, key, version, expected=current, check_expected=True)
    return current


def list_aliases(store: Store, model_id: str) -> dict[str, str]:
    """alias -> version for every alias of the model (garbled ones are skipped)."""
    out = {}
    prefix = refs_prefix(model_id)
    for name, is_dir in store.list_dir(prefix):
        if is_dir or name.endswith((".lock", ".break", ".tmp")) or ".tmp-" in name:
            continue
        try:
            value = read_pointer(store, join(prefix, name))
        except PointerError:
            continue
        if value is not None:
            out[name] = value
    return out

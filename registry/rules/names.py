"""Naming rules for model ids, versions, run ids, aliases and source ids (DESIGN section 4).

A model id is a name or ``<org>/<name>`` (:func:`check_model_id`); its store
key segment is :func:`model_key` (``<org>@<name>``), read back by
:func:`model_from_key`.

A name matches ``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``, and is never ``.``, ``..``
or ``refs`` (which would collide with the ``refs/`` folder of aliases), never
contains ``.tmp`` and never ends in ``.claim`` or ``.lock`` (the commit
protocol's staging directories, claims and lock files).
"""

from __future__ import annotations

import re

from registry.errors import InvalidNameError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_RESERVED = {".", "..", "refs"}


def check_name(value: object, what: str = "name") -> str:
    """Return ``value`` if it is a valid name, else raise InvalidNameError.

    Args:
        value: the candidate name.
        what: what the name is for (``model_id``, ``version``...), for the message.

    Raises:
        InvalidNameError: not a string, empty, reserved, or outside the pattern.
    """
    if not isinstance(value, str) or not value:
        raise InvalidNameError(f"{what} {value!r}: must be a non-empty string", name=str(value))
    if value in _RESERVED:
        raise InvalidNameError(f"{what} {value!r}: reserved name", name=value)
    if ".." in value:
        raise InvalidNameError(f"{what} {value!r}: must not contain '..'", name=value)
    if ".tmp" in value or value.endswith(".claim") or value.endswith(".lock"):
        raise InvalidNameError(f"{what} {value!r}: '.tmp', '.claim' and '.lock' are reserved "
                               "for staging directories, claims and locks", name=value)
    if not NAME_RE.fullmatch(value):
        raise InvalidNameError(
            f"{what} {value!r}: must match [A-Za-z0-9][A-Za-z0-9._-]{{0,127}}", name=value)
    return value


#: the character that joins a namespaced id's two names in its store key
#: (``models/<org>@<name>/``): it never occurs in a name, so the key is never a
#: single-name model's folder, and the id's ``/`` never becomes a key level a
#: version could be mistaken for.
KEY_JOIN = "@"
_MAX_SLASHES = 1
#: characters of a whole id, ``/`` included: the index's ``models.model_id``
#: column (``String(128)``, which Postgres enforces), so no migration
_MAX_ID = 128


def check_model_id(value: object, what: str = "model_id") -> str:
    """Return ``value`` if it is a valid model id, else raise InvalidNameError.

    A model id is one name (``minilm``) or a namespaced id ``<org>/<name>``
    (``acme/tiny``, as on the Hugging Face Hub): each part follows the name
    rule (:func:`check_name`: case-sensitive, ``..``/``.``/``refs`` refused),
    at most one ``/``, no empty part (so no leading, trailing or doubled
    ``/``), at most 128 characters in all (as a single name).

    Raises:
        InvalidNameError: not a string, or a part breaks the rule; the message
            names the rule broken.
    """
    if not isinstance(value, str) or not value:
        raise InvalidNameError(f"{what} {value!r}: must be a non-empty string", name=str(value))
    if "/" not in value:
        return check_name(value, what)
    parts = value.split("/")
    if "" in parts:
        raise InvalidNameError(f"{what} {value!r}: an empty part around '/' (ids are NAME "
                               "or ORG/NAME)", name=value)
    if len(parts) > _MAX_SLASHES + 1:
        raise InvalidNameError(f"{what} {value!r}: at most one '/' (ORG/NAME)", name=value)
    if len(value) > _MAX_ID:
        raise InvalidNameError(f"{what} {value!r}: at most {_MAX_ID} characters in all "
                               "(ORG/NAME)", name=value)
    org, name = parts
    check_name(org, f"{what} {value!r}: org")
    check_name(name, f"{what} {value!r}: name")
    return value


def model_key(model_id: str) -> str:
    """The one key segment that holds ``model_id`` in a store: the id itself
    for a single name, ``<org>@<name>`` for ``<org>/<name>``.

    Raises:
        InvalidNameError: ``model_id`` breaks :func:`check_model_id`.
    """
    return check_model_id(model_id).replace("/", KEY_JOIN)


def model_from_key(segment: str) -> str:
    """The model id whose key segment is ``segment`` (the inverse of
    :func:`model_key`), for what a store listing returns.

    Raises:
        InvalidNameError: ``segment`` is no model's key.
    """
    if segment.count(KEY_JOIN) > 1:
        raise InvalidNameError(f"model folder {segment!r}: at most one {KEY_JOIN!r} "
                               f"(<org>{KEY_JOIN}<name>)", name=segment)
    if "/" in segment:
        raise InvalidNameError(f"model folder {segment!r}: one key level", name=segment)
    return check_model_id(segment.replace(KEY_JOIN, "/"), "model folder")

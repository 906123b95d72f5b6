"""Naming rules for model ids, versions, run ids, aliases and source ids (DESIGN section 4).

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

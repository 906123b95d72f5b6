"""Numbers JSON and the index can hold (issue 31 item 5).

Every number the registry reads (eval summaries, linear heads, ledgers,
trainer state, policy thresholds, CLI options) and every number it writes
must be:

- a float that is finite in IEEE 754 binary64 (``1e400`` parses to
  infinity; ``NaN`` and ``Infinity`` are not JSON at all), and
- an integer inside the index's ``BIGINT`` column, ``-2**63 .. 2**63 - 1``
  (``10**400`` is valid JSON, overflows every SQL integer and raises
  ``OverflowError`` when converted to a float).

A number outside these is refused where it enters, naming the file and the
field, before anything is written; what the registry writes is strict JSON
(``allow_nan=False``), so no reader of a release ever meets ``Infinity``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from registry.errors import DocumentError

__all__ = ["INT_MAX", "INT_MIN", "check_numbers", "dumps", "number_problem", "strict_float"]

INT_MIN, INT_MAX = -(2**63), 2**63 - 1


class _Bad(str):
    """A number the JSON parser met that no index column can hold (kept as its
    text until the document's walk names its field)."""


def number_problem(value: Any) -> str | None:
    """Why ``value`` cannot be stored, or None (not a number, or a good one)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, _Bad):
        return f"{str(value)[:40]} is not a finite 64-bit number"
    if isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            text = str(value) if abs(value) < 10**30 else f"an integer of {len(str(abs(value)))} digits"
            return f"{text} is outside the 64-bit integer range the index holds"
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    return None


def _field(parts: list[str | int]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(root)"


def find_bad_number(doc: Any) -> tuple[str, str] | None:
    """The first ``(field, problem)`` of a parsed document, or None."""
    stack: list[tuple[list[str | int], Any]] = [([], doc)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((where + [k], v) for k, v in reversed(list(value.items())))
        elif isinstance(value, (list, tuple)):
            stack.extend((where + [i], v) for i, v in reversed(list(enumerate(value))))
        elif (problem := number_problem(value)) is not None:
            return _field(where), problem
    return None


def check_numbers(doc: Any, *, path: str) -> None:
    """Refuse a document holding a number that is not finite or overflows
    the index (see the module docstring).

    Args:
        doc: a parsed JSON value, or the Python value a caller handed the API.
        path: the file or object key it came from (it starts the message).

    Raises:
        DocumentError: ``<path>: <field>: <number> is not a finite ...``.
    """
    bad = find_bad_number(doc)
    if bad is not None:
        raise DocumentError(path, f"{bad[0]}: {bad[1]}")


def parse_float(text: str) -> float | _Bad:
    """``json.loads``'s ``parse_float``: a float too large for binary64 is kept
    as its text for :func:`check_numbers` to name."""
    value = float(text)
    return value if math.isfinite(value) else _Bad(text)


def parse_int(text: str) -> int | _Bad:
    """``json.loads``'s ``parse_int``: an integer outside 64 bits is kept as
    its text (never converted: a 4,000-digit integer costs quadratic time)."""
    digits = text.lstrip("-")
    if len(digits) > 19:
        return _Bad(text if len(text) <= 40 else f"an integer of {len(digits)} digits")
    value = int(text)
    return value if INT_MIN <= value <= INT_MAX else _Bad(text)


def strict_float(value: float, *, what: str) -> float:
    """``value`` when finite; else ValueError naming ``what`` (a CLI option's
    or a setting's name: the caller maps it to its usage error)."""
    if not math.isfinite(value):
        raise ValueError(f"{what}: {value} is not a finite number")
    return value


def dumps(doc: Any, **kwargs: Any) -> str:
    """``json.dumps`` that never writes ``NaN``/``Infinity`` (``allow_nan=False``).

    Raises:
        ValueError: ``doc`` holds a non-finite float.
    """
    kwargs["allow_nan"] = False  # whatever a caller passed
    return json.dumps(doc, **kwargs)


def plain_copy(value: Any, *, path: str) -> Any:
    """A JSON-plain deep copy of a document a caller handed the API (tuples
    become lists), after :func:`check_numbers`.

    Raises:
        DocumentError: a number is not finite or overflows 64 bits (naming
            ``path`` and the field), or the value is not JSON (a set, bytes).
    """
    check_numbers(value, path=path)
    try:
        return json.loads(dumps(value))
    except (TypeError, ValueError) as e:
        raise DocumentError(path, f"not a JSON document: {e}") from None

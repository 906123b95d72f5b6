"""Words for counts in messages: ``1 file``, ``2 files`` (never ``1 files``)."""

from __future__ import annotations


def count(n: int, noun: str) -> str:
    """``n`` and ``noun`` (singular), the noun in the plural unless ``n`` is 1:
    ``count(1, "source") == "1 source"``, ``count(3, "entry") == "3 entries"``."""
    if n == 1:
        return f"{n} {noun}"
    plural = noun[:-1] + "ies" if noun.endswith("y") and noun[-2:-1] not in "aeiou" else noun + "s"
    return f"{n} {plural}"

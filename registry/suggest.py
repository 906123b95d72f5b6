"""Close matches for a name the user typed: "did you mean ...?" (issue 44 item 2)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, known: Iterable[str], *, most: int = 3) -> str:
    """``" (did you mean 'a' or 'b'?)"`` for the known names close to ``name``,
    or ``""`` when none is close (difflib's ratio of at least 0.6)."""
    close = difflib.get_close_matches(name, sorted(set(known)), n=most, cutoff=0.6)
    if not close:
        return ""
    shown = " or ".join(repr(c) for c in close)
    return f" (did you mean {shown}?)"


__all__ = ["did_you_mean"]

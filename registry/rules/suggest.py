"""What the user typed, said back in the user's words (issue 44 item 2).

An unknown model is not an unknown version, nor an unknown alias; each error
names which it is, offers the close matches ("did you mean ...?") and lists
what does exist (a few names, then a count). A version whose publish never
finished is "incomplete", never "not committed" or "no MANIFEST.json". Pure
strings: the listing is the caller's (registry.refs.aliases.unknown_ref).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

#: names listed in a message before "... (N in all)"
LISTED = 8


def did_you_mean(name: str, known: Iterable[str], *, most: int = 3) -> str:
    """``" (did you mean 'a' or 'b'?)"`` for the known names close to ``name``,
    or ``""`` when none is close (difflib's ratio of at least 0.6)."""
    close = difflib.get_close_matches(name, sorted(set(known)), n=most, cutoff=0.6)
    if not close:
        return ""
    shown = " or ".join(repr(c) for c in close)
    return f" (did you mean {shown}?)"


def _natural(name: str) -> tuple[object, ...]:
    """Sort key: ``2`` before ``10``, ``v1.9`` before ``v1.10``."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p)
                 for p in re.split(r"(\d+)", name) if p)


def listed(names: Iterable[str], what: str, *, most: int = LISTED) -> str:
    """``"versions: 1, 2, 3"`` (natural order; past ``most`` names, the newest
    ``most`` and ``"(40 in all)"``), or ``"no versions"``."""
    ordered = sorted(set(names), key=_natural)
    if not ordered:
        return f"no {what}"
    if len(ordered) <= most:
        return f"{what}: " + ", ".join(ordered)
    return f"{what}: ..., " + ", ".join(ordered[-most:]) + f" ({len(ordered)} in all)"


def looks_like_version(name: str) -> bool:
    """``7``, ``1.2``, ``v3``, ``2025-01-01``: read as a version, not an alias."""
    return bool(re.match(r"^[vV]?\d", name))


def unknown_model(where: str, model_id: str, models: Iterable[str]) -> str:
    """``./artifacts: no model named 'minlm' (did you mean 'minilm'?)``."""
    return f"{where}: no model named {model_id!r}{did_you_mean(model_id, models)}"


def unknown_name(where: str, model_id: str, name: str, versions: Iterable[str],
                 aliases: Iterable[str], *, kind: str = "ref") -> str:
    """The model exists, ``name`` is not one of its versions (``kind``
    ``"version"``) or aliases (``"alias"``), or of either (``"ref"``: a
    version-like name is said to be a version):
    ``model 'minilm' has no version '7' (versions: 1, 2, 3)``."""
    versions, aliases = list(versions), list(aliases)
    if kind == "ref" and looks_like_version(name) and name not in aliases:
        kind = "version"
    if kind == "version":
        return (f"{where}: model {model_id!r} has no version {name!r}"
                f"{did_you_mean(name, versions)} ({listed(versions, 'versions')})")
    if kind == "alias":
        return (f"{where}: model {model_id!r} has no alias {name!r}"
                f"{did_you_mean(name, aliases)} ({listed(aliases, 'aliases')})")
    return (f"{where}: model {model_id!r} has no version or alias named {name!r}"
            f"{did_you_mean(name, [*versions, *aliases])} ({listed(versions, 'versions')}; "
            f"{listed(aliases, 'aliases')})")


def incomplete_version(where: str, model_id: str, version: str) -> str:
    """A version folder without a manifest, in the user's words."""
    return (f"{where}: version {version!r} of model {model_id!r} is incomplete: its publish "
            "did not finish (or is still running), so it cannot be used; publish it again "
            "(a new version) or let `registry gc` remove what is left")


__all__ = ["did_you_mean", "incomplete_version", "listed", "looks_like_version", "missing_step",
           "unknown_model", "unknown_name"]


def missing_step(where: str, run: str, step: int, committed: Iterable[int],
                 started: Iterable[int], runs: Iterable[str] | None) -> str:
    """``release create`` of a step that cannot be released, in the user's
    words: an unknown run (``runs``: the store's runs, None when the run
    exists), a step whose save never finished (in ``started``, not in
    ``committed``), or no such step (the committed steps listed)."""
    if runs is not None:
        return f"{where}: no run named {run!r}{did_you_mean(run, runs)}"
    if step in set(started) and step not in set(committed):
        return (f"{where}: checkpoint step {step} of run {run!r} is incomplete: its save did "
                "not finish (or is still running), so it cannot be released")
    return (f"{where}: run {run!r} has no checkpoint step {step} "
            f"({listed(map(str, committed), 'steps')})")

"""Pointer files: ``LATEST``, ``refs/<alias>``, LoongSage's tracker file.

A pointer is one small object holding a name and a newline (``step-000500\\n``).
It is moved with the store's compare-and-swap, so two writers never silently
clobber each other: a lost race re-reads and retries (or, for pointers that
only move forward, stops when the other writer is already further).

The seed's step 4 ("write LATEST.tmp, fsync, rename it to LATEST, fsync the
ckpt/ directory") is how :class:`~registry.store.local.LocalStore` performs
the swap; on S3 the swap is one PUT with ``If-Match``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from registry.rules import limits
from registry.errors import (
    ObjectNotFoundError,
    PointerConflictError,
    PointerError,
    PointerRegressionError,
)
from registry.store import Store

#: attempts of a compare-and-swap loop before giving up on a hot pointer.
MAX_ATTEMPTS = 64


def read_pointer(store: Store, key: str, *, pattern: re.Pattern[str] | None = None,
                 strip: bool = False) -> str | None:
    """The value a pointer holds, or None when it does not exist.

    Args:
        pattern: the value must match it entirely (``step-\\d{6,}``).
        strip: accept surrounding whitespace (the LoongSage tracker); else
            exactly one trailing newline is allowed.

    Raises:
        PointerError: empty, not UTF-8, several lines, a ``/`` or ``..`` (it
            would point outside its folder), or not matching ``pattern``.
    """
    try:
        raw = store.read_bytes(key, limit=limits.MAX_POINTER_BYTES)
    except ObjectNotFoundError:
        return None
    return parse_pointer(raw, path=store.url_of(key), pattern=pattern, strip=strip)


def parse_pointer(raw: bytes, *, path: str, pattern: re.Pattern[str] | None = None,
                  strip: bool = False) -> str:
    """Validate pointer bytes; see :func:`read_pointer`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PointerError(path, "not UTF-8 text") from None
    value = text.strip() if strip else text.removesuffix("\n")
    if not value:
        raise PointerError(path, "empty")
    if "\n" in value or "\r" in value or "\x00" in value:
        raise PointerError(path, f"garbled: expected one line, got {text[:60]!r}")
    if "/" in value or "\\" in value or value in (".", ".."):
        raise PointerError(path, f"{value!r} points outside its folder")
    if pattern is not None and not pattern.fullmatch(value):
        raise PointerError(path, f"garbled: {value[:60]!r} does not match {pattern.pattern}")
    return value


def move_pointer(store: Store, key: str, value: str, *,
                 order: Callable[[str], int] | None = None,
                 expected: str | None = None, check_expected: bool = False) -> str | None:
    """Point ``key`` at ``value`` with compare-and-swap; returns the previous value.

    Args:
        order: makes the pointer forward-only: a move to a value whose order is
            lower than the current one raises PointerRegressionError (a move to
            an equal one is a no-op). A lost race is retried after re-reading.
        expected, check_expected: when ``check_expected``, move only if the
            pointer still holds ``expected`` (None: does not exist) and raise
            PointerConflictError otherwise -- an alias update that must not
            clobber a concurrent one.

    Raises:
        PointerRegressionError: ``order`` given and the pointer is further on.
        PointerConflictError: ``check_expected`` and the value differs, or the
            pointer kept changing for MAX_ATTEMPTS attempts.

    Notes:
        Atomic on every backend: a lock file + rename locally, ``If-Match`` /
        ``If-None-Match`` PUTs on S3. Durable on return.
    """
    data = (value + "\n").encode()
    store.ensure_root()  # a writer may be the first to use a new local store
    for _ in range(MAX_ATTEMPTS):
        try:
            raw, token = store.read_versioned(key)
            current: str | None = raw.decode("utf-8", "replace").strip() or None
        except ObjectNotFoundError:
            current, token = None, None
        if check_expected and current != expected:
            raise PointerConflictError(store.url_of(key), expected=expected, actual=current)
        if current == value:
            return current
        if order is not None and current is not None:
            try:
                behind = order(current) > order(value)
            except ValueError:  # garbled current value: replace it
                behind = False
            if behind:
                raise PointerRegressionError(store.url_of(key), expected=value, actual=current)
        try:
            store.swap(key, data, token)
            return current
        except PointerConflictError:
            if check_expected:
                raise
    raise PointerConflictError(store.url_of(key), expected=value, actual="(still changing)")

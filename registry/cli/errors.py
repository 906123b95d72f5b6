"""The one table mapping registry errors to exit codes, and the error boundary.

Every command runs inside :func:`error_boundary`: a ``RegistryError`` becomes one
line on stderr (``error: <message>``) and the exit code of its class in
:data:`EXIT_CODES` (most specific class wins); anything else is a bug and keeps
its traceback. ``--debug`` or ``REGISTRY_DEBUG=1`` shows the traceback always.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import typer

from registry import errors as E

EXIT_OK = 0
EXIT_FAILED = 1  # the check ran and the answer is "no" (verify, gate check)
EXIT_USAGE = 2  # typer/click usage errors

#: class -> exit code; looked up along the MRO, so subclasses inherit.
EXIT_CODES: dict[type[E.RegistryError], int] = {
    E.RegistryError: 1,
    E.IntegrityError: 1,
    E.NotCommittedError: 3,  # nothing committed there: not found, for a reader
    E.InvalidNameError: 2,
    E.UsageError: 2,
    E.ObjectNotFoundError: 3,
    E.NoValidCheckpointError: 3,
    E.CommitConflictError: 4,
    E.ObjectExistsError: 4,
    E.PointerConflictError: 4,
    E.DocumentError: 5,
    E.PointerError: 5,
    E.StorageError: 6,
    E.InvalidStoreURLError: 2,
    E.StoragePermissionError: 6,
    E.InsufficientSpaceError: 6,
    E.CheckpointError: 7,
    E.GateFailedError: 1,
    E.IndexDatabaseError: 8,
    E.IndexOutOfDateError: 9,
}


def exit_code_for(exc: E.RegistryError) -> int:
    """The exit code of ``exc``: the entry of its most specific class."""
    for cls in type(exc).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]  # type: ignore[index]
    return 1


def debug_enabled() -> bool:
    return os.environ.get("REGISTRY_DEBUG", "") not in ("", "0", "false")


@contextmanager
def error_boundary() -> Iterator[None]:
    """Turn registry errors into one line + exit code (traceback with --debug)."""
    try:
        yield
    except E.RegistryError as exc:
        if debug_enabled():
            traceback.print_exc()
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"error: {first_line}", file=sys.stderr)
        raise typer.Exit(exit_code_for(exc)) from None

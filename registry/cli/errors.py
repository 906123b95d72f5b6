"""The one table mapping registry errors to exit codes, and the error boundary.

Every command runs inside :func:`error_boundary`: a ``RegistryError`` becomes one
line on stderr (``error: <message>``), or with ``--json`` one JSON document
(``schemas/cli-error.schema.json``), and the exit code of its class in
:data:`EXIT_CODES` (most specific class wins). Errors of the environment that
reach the CLI without a registry class -- an ``OSError`` (read-only file
system, permission, full disk) or a database driver error -- are user errors
too and get exit 6 and 8. Anything else is a bug and keeps its traceback.
``--debug`` or ``REGISTRY_DEBUG=1`` shows the traceback always.
"""

from __future__ import annotations

import errno
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from registry.rules import numbers
from registry import errors as E
from registry.cli.output import echo, shown
from registry.host.redact import redact

EXIT_OK = 0
EXIT_FAILED = 1  # the check ran and the answer is "no" (verify, gate check)
EXIT_USAGE = 2  # typer/click usage errors
EXIT_STORAGE = 6
EXIT_INDEX = 8
#: the store write is committed, but the index could not record it
EXIT_NOT_INDEXED = 10
#: the store write is committed, but its event could not be appended to events/
EXIT_NOT_RECORDED = 11

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
    E.UnsafeEntryError: 6,  # a link, special file or mount inside a root
    E.StoragePermissionError: 6,
    E.InsufficientSpaceError: 6,
    E.CheckpointError: 7,
    E.GateFailedError: 1,
    E.UnknownModelError: 3,
    E.IndexDatabaseError: 8,
    E.IndexOutOfDateError: 9,
    E.EventNotRecordedError: EXIT_NOT_RECORDED,
}


def exit_code_for(exc: E.RegistryError) -> int:
    """The exit code of ``exc``: the entry of its most specific class."""
    for cls in type(exc).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]  # type: ignore[index]
    return 1


def debug_enabled() -> bool:
    return os.environ.get("REGISTRY_DEBUG", "") not in ("", "0", "false")


def _path_of(exc: BaseException) -> str | None:
    for attr in ("path", "key", "where", "filename", "name"):
        value = getattr(exc, attr, None)
        if value:
            return str(value)
    return None


def error_document(cls: str, code: int, message: str, path: str | None,
                   **extra: Any) -> dict[str, Any]:
    """The ``--json`` error document (``schemas/cli-error.schema.json``)."""
    return {"error": {"class": cls, "exit_code": code, "message": message, "path": path,
                      **extra}}


def _exit(code: int) -> NoReturn:
    """End the command with ``code``: typer's Exit, which its callers (the
    Typer app, registry.cli.reads) turn into the exit status; typer loads only
    on this path (a read command that succeeds never imports it)."""
    import typer

    raise typer.Exit(code)


def fail(message: str, code: int, *, as_json: bool, cls: str = "CheckFailed",
         path: str | None = None, **extra: Any) -> NoReturn:
    """Report an outcome that is not a success and exit with ``code``: one
    ``error:`` line on stderr, or with ``--json`` one error document there."""
    from registry.cli.observe import failed
    from registry.obs.logs import json_logs

    failed(cls, code)
    if json_logs():  # --log-format json: the same document, one line with ts and level
        from registry.obs.logs import emit

        emit("error", "error", **error_document(cls, code, message, path, **extra))
        _exit(code)
    if as_json:
        echo(numbers.dumps(error_document(cls, code, message, path, **extra),
                              sort_keys=True, default=str), err=True)
    else:
        echo(f"error: {message}", err=True)
    _exit(code)


def at_least(option: str, value: int | None, minimum: int) -> None:
    """Raise UsageError (exit 2, one line naming the option) when ``value`` is
    below ``minimum``; None (not given) passes."""
    if value is not None and value < minimum:
        raise E.UsageError(f"{option} {value}: must be at least {minimum}")


def _one_line(text: str, fallback: str) -> str:
    """An error's first line (split at line feeds only: a ``\\r`` in a file
    name must not cut the message short), control characters escaped."""
    return shown(text.strip().split("\n")[0]) if text.strip() else fallback


def _os_message(exc: OSError) -> str:
    from registry.store.translate import READ_ONLY

    reason = (READ_ONLY if exc.errno == errno.EROFS
              else exc.strerror or str(exc) or type(exc).__name__)
    if exc.filename is not None and exc.filename2 is not None:
        return f"{exc.filename} -> {exc.filename2}: {reason}"
    if exc.filename is not None:
        return f"{exc.filename}: {reason}"
    return reason


def _is_database_error(exc: BaseException) -> bool:
    """A SQLAlchemy or DB-API driver error (sqlite3, psycopg), without importing them."""
    return any(c.__module__.split(".")[0] in ("sqlalchemy", "sqlite3", "psycopg")
               for c in type(exc).__mro__)


@contextmanager
def index_writes() -> Iterator[None]:
    """Silence the API's IndexWriteWarning (a raw warning with file:line):
    :func:`report_not_indexed` says it in one line instead."""
    from registry.api import IndexWriteWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IndexWriteWarning)
        yield


def report_not_indexed(index_errors: list[str], *, store: str | None, db: str | None,
                       as_json: bool) -> None:
    """The contract of a write whose index update failed: the store is the
    truth, so the store write stands and its output was printed; then one line
    says what was not indexed and the command that repairs it, and the exit
    code is :data:`EXIT_NOT_INDEXED` (10)."""
    if not index_errors:
        return
    fix = redact(" ".join(["registry index rebuild", *(["--store", store] if store else []),
                           *(["--db", db] if db else [])]))
    message = index_errors[0].replace("`registry index rebuild`", f"`{fix}`")
    if len(index_errors) > 1:
        message += f" (and {len(index_errors) - 1} more index writes failed)"
    fail(message, EXIT_NOT_INDEXED, as_json=as_json, cls="IndexNotUpdated")


def _print_traceback() -> None:
    import traceback  # --debug only: it loads textwrap and more for every command

    traceback.print_exc()


@contextmanager
def error_boundary(as_json: bool = False) -> Iterator[None]:
    """Turn registry errors (and the environment's OSError / database errors)
    into one line or one JSON document on stderr plus the exit code of
    :data:`EXIT_CODES`; tracebacks only with --debug."""
    try:
        yield
    except E.RegistryError as exc:
        if debug_enabled():
            _print_traceback()
        extra = {}
        if isinstance(exc, E.GateFailedError):
            extra["gates"] = [r.to_dict() for r in getattr(exc, "results", ())]
        fail(_one_line(str(exc), type(exc).__name__), exit_code_for(exc), as_json=as_json,
             cls=type(exc).__name__, path=_path_of(exc), **extra)
    except OSError as exc:  # not a RegistryError: the host refused (EROFS, EACCES, ...)
        if debug_enabled():
            _print_traceback()
        fail(_one_line(_os_message(exc), type(exc).__name__), EXIT_STORAGE, as_json=as_json,
             cls=type(exc).__name__, path=_path_of(exc))
    except Exception as exc:
        if not _is_database_error(exc):
            raise  # a bug: keep the traceback
        if debug_enabled():
            _print_traceback()
        orig = getattr(exc, "orig", None) or exc
        fail(_one_line(f"index database: {orig}", type(exc).__name__), EXIT_INDEX,
             as_json=as_json, cls=type(exc).__name__)
